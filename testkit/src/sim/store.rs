//! The simulated quota store: the in-memory store's semantics, each command
//! given a seeded fate on the wire, and a ledger of what each command
//! that landed did to the counter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quota_gate::io::connection::not_connected;
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::io::store::{
    Claim, Claimed, CountArgs, CountFailed, PaceArgs, Paced, QuotaKey, QuotaStore, RecordUpdate,
    Refund, SendError, TakeOver, Tally,
};
use quota_gate::rules::delay::{LoneSleepAsk, SleepLease};
use quota_gate::rules::level::Level;
use quota_gate::rules::unix::{UnixMillis, UnixSecs};
use uuid::Uuid;

use super::wire::{Answer, Conn, Fate, Faults, Land, ready};

/// A claim that landed and counted.
#[derive(Debug, Clone)]
pub struct Landed {
    pub record: String,
    pub scan_id: Uuid,
    pub used: u64,
    pub received_ms: UnixMillis,
}

/// What the ledger notes of a command that never runs.
enum Kind {
    /// A count, unkeyed (`keyed: false`) or a claim's, with the counter
    /// keys of the levels it carries.
    Count {
        keyed: bool,
        levels: Vec<String>,
    },
    /// A refund of a counter (of a record's claim, or unkeyed: `None`),
    /// with the counter keys of the levels it takes back from too.
    Refund {
        record: Option<String>,
        key: String,
        levels: Vec<String>,
    },
    Other,
}

/// Whether `counter` is a level's (a network's, or the anonymous budget's).
pub fn is_level(counter: &str) -> bool {
    counter.starts_with("quota:net:")
}

/// What landed, as the checks need it.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Counter changes by idempotency record (`None`: unkeyed).
    pub net: HashMap<Option<String>, i64>,
    /// Refunds sent that will never land, by record.
    pub lost_refunds: HashMap<Option<String>, i64>,
    /// Unkeyed counts sent and never run (their connection died with
    /// them): the refund behind each may take back a count it did not add.
    pub counts_lost: i64,
    /// Claims that landed and counted.
    pub claims: Vec<Landed>,
    /// Each record's body fingerprint, from the claims sent.
    pub fingerprints: HashMap<String, String>,
    /// Every subject's counter key.
    pub counters: Vec<QuotaKey>,
    /// Counter changes by counter key, the subjects' and the levels'.
    pub by_key: HashMap<String, i64>,
    /// Level refunds sent that will never land, by the level's counter key.
    pub level_refunds_lost: HashMap<String, i64>,
    /// Counts (keyed or not) sent and never run, by each level's counter
    /// key they carried: the level refund behind each may take back a count
    /// it did not add.
    pub level_counts_lost: HashMap<String, i64>,
}

/// The store one gate sees: its own connection, the shared state.
pub struct SimStore {
    pub memory: MemoryStore,
    pub ledger: Arc<Mutex<Ledger>>,
    pub conn: Arc<Conn>,
    pub faults: Arc<Faults>,
    pub timeout: Duration,
    /// Set once the store answers this gate's count after the faults are over.
    pub answering: Arc<AtomicBool>,
}

impl SimStore {
    /// Sends one command: `op` is its effect on the shared state, run when
    /// (and if) it lands; `kind` says what the ledger notes of its loss.
    async fn call<T, F>(&self, name: &str, op: F, kind: Kind) -> Result<T, SendError>
    where
        T: Send + 'static,
        F: FnOnce(&MemoryStore, &Mutex<Ledger>) -> T + Send + 'static,
    {
        let fate = self.faults.draw(self.timeout);
        if super::tracing() {
            eprintln!(
                "{:>8?} conn {:p} {name} {fate:?}",
                tokio::time::Instant::now() - self.faults.start(),
                Arc::as_ptr(&self.conn),
            );
        }
        let lost = matches!(
            fate,
            Fate::NotSent(_) | Fate::Refused | Fate::Unanswered(Land::Never)
        );
        match (kind, fate) {
            (
                Kind::Refund {
                    record,
                    key,
                    levels,
                },
                _,
            ) if lost => {
                let mut ledger = self.ledger.lock().unwrap();
                for level in levels {
                    *ledger.level_refunds_lost.entry(level).or_default() += 1;
                }
                if is_level(&key) {
                    *ledger.level_refunds_lost.entry(key).or_default() += 1;
                } else {
                    *ledger.lost_refunds.entry(record).or_default() += 1;
                }
            }
            (Kind::Count { keyed, levels }, Fate::Unanswered(Land::Never)) => {
                let mut ledger = self.ledger.lock().unwrap();
                if !keyed {
                    ledger.counts_lost += 1;
                }
                for level in levels {
                    *ledger.level_counts_lost.entry(level).or_default() += 1;
                }
            }
            _ => {}
        }
        let (memory, ledger) = (self.memory.clone(), self.ledger.clone());
        match fate {
            Fate::NotSent(after) => {
                tokio::time::sleep(after).await;
                Err(not_connected("sim: no connection".into()))
            }
            Fate::Refused => {
                self.conn.write(None, None);
                Err(SendError::Refused("sim: refused".into()))
            }
            Fate::Answered(after) => {
                let answering = self.answering.clone();
                // A count is what the breaker's probe sends: once one is
                // answered, the breaker (if open) closes.
                let over =
                    name.starts_with("count") && self.faults.over(tokio::time::Instant::now());
                let answer = Answer::new();
                let slot = answer.sender();
                let effect = Box::new(move || {
                    *slot.lock().unwrap() = Some(op(&memory, &ledger));
                });
                self.conn.write(Some(effect), None);
                tokio::time::sleep(after).await;
                if over {
                    answering.store(true, Ordering::Relaxed);
                }
                answer
                    .take()
                    .ok_or_else(|| SendError::Refused("sim: lost answer".into()))
            }
            Fate::Unanswered(land) => {
                let effect = Box::new(move || {
                    op(&memory, &ledger);
                });
                self.conn.write(Some(effect), Some(land));
                tokio::time::sleep(self.timeout).await;
                Err(SendError::Unanswered)
            }
        }
    }
}

/// The counter of `key` at `now`, 0 when there is none.
fn used(memory: &MemoryStore, key: &QuotaKey, now: UnixSecs) -> i64 {
    memory.used(key, now).unwrap_or(0) as i64
}

/// Notes a change of `delta` that landed on `counter`: by record for a
/// subject's counter, and by counter key for every one.
fn note(ledger: &Mutex<Ledger>, counter: &str, record: Option<String>, delta: i64) {
    if super::tracing() {
        eprintln!("  landed: {delta:+} on {counter} ({record:?})");
    }
    if delta != 0 {
        let mut ledger = ledger.lock().unwrap();
        *ledger.by_key.entry(counter.to_owned()).or_default() += delta;
        if !is_level(counter) {
            *ledger.net.entry(record).or_default() += delta;
        }
    }
}

/// Notes what a count that landed did: +1 at its subject, and at each
/// level it counted at.
fn note_count(
    ledger: &Mutex<Ledger>,
    key: &QuotaKey,
    record: Option<String>,
    tally: &Tally,
    levels: &[Level],
) {
    note(ledger, &key.counter, record, 1);
    for (level, count) in levels.iter().zip(&tally.levels) {
        if count.is_ok() {
            note(ledger, &level.key.counter, None, 1);
        }
    }
}

fn level_counters(levels: &[Level]) -> Vec<String> {
    levels.iter().map(|l| l.key.counter.clone()).collect()
}

impl QuotaStore for SimStore {
    /// A simulated call may wait as long as its schedule says: the gate
    /// bounds it.
    fn bounds_itself(&self) -> bool {
        false
    }

    /// Read as the in-memory store reads, at once (the simulated schedules
    /// send no `GET /quota`).
    async fn peek(
        &self,
        key: &QuotaKey,
        now: UnixSecs,
    ) -> Result<quota_gate::io::store::Peek, SendError> {
        self.memory.peek(key, now).await
    }

    async fn count(&self, args: CountArgs<'_>) -> Result<Tally, CountFailed> {
        let (key, period_end, now, reset) =
            (args.key.clone(), args.period_end, args.now, args.reset);
        let levels = args.levels.to_vec();
        let kind = Kind::Count {
            keyed: false,
            levels: level_counters(&levels),
        };
        self.remember(&key);
        self.call(
            "count",
            move |m, l| {
                let args = CountArgs {
                    key: &key,
                    levels: &levels,
                    period_end,
                    now,
                    reset,
                };
                let count = ready(m.count(args)).expect("memory store");
                note_count(l, &key, None, &count, &levels);
                count
            },
            kind,
        )
        .await
        .map_err(CountFailed::from)
    }

    async fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> Result<Claimed, CountFailed> {
        let (key, period_end, now, reset) =
            (args.key.clone(), args.period_end, args.now, args.reset);
        let levels = args.levels.to_vec();
        let kind = Kind::Count {
            keyed: true,
            levels: level_counters(&levels),
        };
        let claim = claim.clone();
        self.remember(&key);
        self.ledger
            .lock()
            .unwrap()
            .fingerprints
            .insert(claim.record.clone(), claim.fingerprint.clone());
        self.call(
            "count_keyed",
            move |m, l| {
                let args = CountArgs {
                    key: &key,
                    levels: &levels,
                    period_end,
                    now,
                    reset,
                };
                let claimed = ready(m.count_keyed(args, &claim)).expect("memory store");
                if let Claimed::New(count) = &claimed {
                    note_count(l, &key, Some(claim.record.clone()), count, &levels);
                    l.lock().unwrap().claims.push(Landed {
                        record: claim.record.clone(),
                        scan_id: claim.scan_id,
                        used: count.subject.used,
                        received_ms: claim.received_ms,
                    });
                }
                claimed
            },
            kind,
        )
        .await
        .map_err(CountFailed::from)
    }

    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, SendError> {
        let step = crate::OwnedPace::new(&args);
        self.call(
            "pace",
            move |m, _| ready(m.pace(step.args(&step.lanes()))).expect("memory store"),
            Kind::Other,
        )
        .await
    }

    async fn has_record(&self, record: &str, now: UnixSecs) -> Result<bool, SendError> {
        let record = record.to_owned();
        self.call(
            "has_record",
            move |m, _| ready(m.has_record(&record, now)).expect("memory store"),
            Kind::Other,
        )
        .await
    }

    async fn take_sleep_lease(&self, lone: LoneSleepAsk) -> Result<SleepLease, SendError> {
        self.call(
            "take_sleep_lease",
            move |m, _| ready(m.take_sleep_lease(lone)).expect("memory store"),
            Kind::Other,
        )
        .await
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), SendError> {
        let key = refund.key.clone();
        let levels: Vec<(QuotaKey, UnixSecs)> = refund
            .levels
            .iter()
            .map(|(k, p)| ((*k).clone(), *p))
            .collect();
        let record = refund.record.map(|(r, id)| (r.to_owned(), id));
        let (period_end, now) = (refund.period_end, refund.now);
        let kind = Kind::Refund {
            record: record.as_ref().map(|(r, _)| r.clone()),
            key: key.counter.clone(),
            levels: levels.iter().map(|(k, _)| k.counter.clone()).collect(),
        };
        self.call(
            "refund",
            move |m, l| {
                let before = used(m, &key, now);
                let level_before: Vec<i64> = levels.iter().map(|(k, _)| used(m, k, now)).collect();
                let lent: Vec<(&QuotaKey, UnixSecs)> =
                    levels.iter().map(|(k, p)| (k, *p)).collect();
                let refund = Refund {
                    key: &key,
                    period_end,
                    levels: &lent,
                    record: record.as_ref().map(|(r, id)| (r.as_str(), *id)),
                    now,
                };
                ready(m.refund(refund)).expect("memory store");
                if super::tracing() {
                    eprintln!(
                        "  refund of {} at {}: {before} -> {}",
                        period_end.get(),
                        now.get(),
                        used(m, &key, now)
                    );
                }
                let delta = used(m, &key, now) - before;
                note(l, &key.counter, record.map(|(r, _)| r), delta);
                for ((level, _), before) in levels.iter().zip(level_before) {
                    note(l, &level.counter, None, used(m, level, now) - before);
                }
            },
            kind,
        )
        .await
    }

    async fn release(&self, record: &str, scan_id: Uuid, now: UnixSecs) -> Result<(), SendError> {
        let record = record.to_owned();
        self.call(
            "release",
            move |m, _| ready(m.release(&record, scan_id, now)).expect("memory store"),
            Kind::Other,
        )
        .await
    }

    async fn update_record(&self, update: RecordUpdate<'_>) -> Result<(), SendError> {
        let (record, fields, now) = (update.record.to_owned(), update.fields.to_vec(), update.now);
        self.call(
            "update_record",
            move |m, _| {
                let update = RecordUpdate {
                    record: &record,
                    fields: &fields,
                    now,
                };
                ready(m.update_record(update)).expect("memory store")
            },
            Kind::Other,
        )
        .await
    }

    async fn take_over(&self, args: TakeOver<'_>) -> Result<bool, SendError> {
        let record = args.record.to_owned();
        let (expected_until_ms, lease_until_ms, now) =
            (args.expected_until_ms, args.lease_until_ms, args.now);
        self.call(
            "take_over",
            move |m, _| {
                let args = TakeOver {
                    record: &record,
                    expected_until_ms,
                    lease_until_ms,
                    now,
                };
                ready(m.take_over(args)).expect("memory store")
            },
            Kind::Other,
        )
        .await
    }
}

impl SimStore {
    fn remember(&self, key: &QuotaKey) {
        let mut ledger = self.ledger.lock().unwrap();
        if !ledger.counters.contains(key) {
            ledger.counters.push(key.clone());
        }
    }
}
