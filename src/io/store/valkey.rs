//! The Valkey quota store. A count is plain commands in one pipelined round trip (a script would
//! cost Valkey far more per scan); scripts (sent whole with [`crate::io::connection::eval`]) run
//! only where a decision must be atomic and the request is off the hot path anyway: a keyed claim,
//! a pacing step, a refund, freeing or taking over a record's lease, and a sleep lease. Every key
//! of a subject shares its hash tag, so each call is single-slot in a cluster. Operator commands
//! live in [`crate::front::ops::valkey_admin`].

use redis::Value;
use uuid::Uuid;

use crate::rules::delay::{LoneSleepAsk, SleepLease};
use crate::rules::unix::UnixSecs;

use super::commands::{
    GrantHeld, PACE, REFUND, count_of, in_subject_period, level_commands, level_width, pace_script,
    paced, peek_commands, peek_of, refund_script, sleep_lease_of, spread_excess, subject_commands,
    take_sleep_lease_script, tally, unexpected,
};
use super::quota_store::{
    CountArgs, CountFailed, PaceArgs, PaceLane, QuotaStore, RecordUpdate, Refund, SendError,
    TakeOver,
};
use crate::io::clock::rfc3339;
use crate::io::connection::{Request, Valkey};
use crate::rules::count::{NoAnswer, Peek, Tally};
use crate::rules::key::{IDEMPOTENCY_TTL_SECS, QuotaKey};
use crate::rules::pace::Paced;
use crate::rules::record::{Claim, Claimed, Record};

mod cluster;

const CLAIM: &str = include_str!("claim.lua");
const RELEASE: &str = include_str!("release.lua");
const TAKE_OVER: &str = include_str!("take_over.lua");

/// Every script that reads or writes an idempotency record, for the test of their field names.
pub const RECORD_SCRIPTS: [(&str, &str); 5] = [
    ("claim.lua", CLAIM),
    ("pace.lua", PACE),
    ("refund.lua", REFUND),
    ("release.lua", RELEASE),
    ("take_over.lua", TAKE_OVER),
];

/// Re-exported for the operator tools and the consumer's markers.
pub(crate) use crate::io::connection::eval;

#[derive(Clone)]
pub struct ValkeyStore {
    valkey: Valkey,
    /// `VALKEY_WAIT_REPLICAS` (0: off).
    wait_replicas: u32,
}

fn text(v: &Value) -> &str {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).unwrap_or_default(),
        Value::SimpleString(s) => s,
        _ => "",
    }
}

impl ValkeyStore {
    pub fn new(valkey: Valkey) -> Self {
        Self {
            valkey,
            wait_replicas: 0,
        }
    }

    /// A keyed claim waits (`WAIT`) for `replicas` replicas; one short in time has an unknown fate.
    pub fn with_wait(mut self, replicas: u32) -> Self {
        self.wait_replicas = replicas;
        self
    }

    pub fn valkey(&self) -> &Valkey {
        &self.valkey
    }

    /// Sends one request of the request path, bounded by the store timeout.
    async fn send<T: redis::FromRedisValue>(
        &self,
        request: impl Into<Request>,
    ) -> Result<T, SendError> {
        self.valkey.send(request, self.valkey.timeout()).await
    }

    /// A keyed count: the claim's script, and in a cluster the levels after it.
    async fn claim(&self, args: CountArgs<'_>, claim: &Claim) -> Result<Claimed, SendError> {
        let key = args.key;
        // Standalone the claim's script counts the levels (one fate); a cluster's live elsewhere.
        let in_claim = if self.valkey.is_cluster() {
            &[][..]
        } else {
            args.levels
        };
        let mut keys = vec![
            key.counter.as_str(),
            &key.first_seen,
            &claim.record,
            &key.grant,
        ];
        keys.extend(in_claim.iter().map(|l| l.key.counter.as_str()));
        let mut cmd = eval(CLAIM, &keys);
        cmd.arg(args.period_end.get())
            .arg(rfc3339(args.now.get()))
            .arg(claim.scan_id.to_string())
            .arg(&claim.fingerprint)
            .arg(claim.received_ms.get())
            .arg(claim.lease_until_ms.get())
            .arg(IDEMPOTENCY_TTL_SECS);
        let reply: Vec<Value> = self.send(cmd).await?;
        match reply.as_slice() {
            [Value::Int(0), Value::Array(fields)] => {
                let pairs = fields.chunks_exact(2).map(|p| (text(&p[0]), text(&p[1])));
                Ok(Claimed::Existing(Record::from_pairs(pairs)?))
            }
            [Value::Int(0), ..] | [] => Err(unexpected("claim")),
            counts => {
                // The script reads each level's expiry: two replies a level.
                let mut tally = tally(counts, &args, 2)?;
                if self.wait_replicas > 0 {
                    // `WAIT` for the claim to reach the replicas, on its connection (so behind it).
                    let wait =
                        crate::io::connection::wait(self.wait_replicas, self.valkey.timeout());
                    if self.send::<u32>(wait).await? < self.wait_replicas {
                        return Err(SendError::Unanswered);
                    }
                }
                if in_claim.is_empty() && !args.levels.is_empty() {
                    // Cluster: the levels are counted once the claim is new.
                    tally.levels = self.count_levels(&args).await;
                    in_subject_period(&mut tally.levels, &tally.subject, &args);
                }
                Ok(Claimed::New(tally))
            }
        }
    }

    /// The sleep lease `args` asks for, asked after a cluster's pacing step: none if it cannot be
    /// had; the slot stands.
    async fn sleep_lease_after(&self, args: &PaceArgs<'_>, delay_ms: u64) -> Option<SleepLease> {
        let lone = LoneSleepAsk {
            ask: args.sleep_ask?,
            arrival: args.arrival_ms,
            wait_ms: delay_ms,
        };
        self.take_sleep_lease(lone)
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "no sleep lease: the scan sleeps nothing"))
            .ok()
    }

    /// Reads one counter, changing nothing.
    async fn read(&self, key: &QuotaKey, held: GrantHeld) -> Result<Peek, SendError> {
        let mut pipe = redis::pipe();
        peek_commands(&mut pipe, key);
        peek_of(&self.send::<Vec<Value>>(pipe).await?, held)
    }
}

impl QuotaStore for ValkeyStore {
    fn warm_up(&self) {
        self.valkey.warm_up();
    }

    async fn ready(&self, within: std::time::Duration) -> Result<(), SendError> {
        self.valkey.ping(within).await
    }

    async fn count(&self, args: CountArgs<'_>) -> Result<Tally, CountFailed> {
        let mut pipe = redis::Pipeline::with_capacity(6 + 3 * args.levels.len());
        subject_commands(&mut pipe, &args);
        if args.levels.is_empty() || !self.valkey.is_cluster() {
            // Standalone: every level rides the subject's round trip, one fate.
            for level in args.levels {
                level_commands(&mut pipe, &level.key, &args);
            }
            let reply: Vec<Value> = self.send(pipe).await?;
            return Ok(tally(&reply, &args, level_width(args.reset))?);
        }
        // Cluster: a request per level's slot, all sent at once; a failing level does not fail the
        // scan, and a failing subject says what each level did.
        let (subject, mut levels) =
            futures_util::join!(self.send::<Vec<Value>>(pipe), self.count_levels(&args));
        match subject.and_then(|reply| count_of(&reply, args.now)) {
            Ok(subject) => {
                in_subject_period(&mut levels, &subject, &args);
                Ok(Tally { subject, levels })
            }
            Err(error) => Err(CountFailed {
                error,
                levels: Some(levels),
            }),
        }
    }

    async fn peek(&self, key: &QuotaKey, _now: UnixSecs) -> Result<Peek, SendError> {
        self.read(key, GrantHeld::Beside).await
    }

    async fn peek_levels(&self, keys: &[QuotaKey], _now: UnixSecs) -> Result<Vec<Peek>, SendError> {
        if self.valkey.is_cluster() {
            let reads = keys.iter().map(|key| self.read(key, GrantHeld::InCounter));
            return futures_util::future::try_join_all(reads).await;
        }
        let mut pipe = redis::pipe();
        for key in keys {
            peek_commands(&mut pipe, key);
        }
        let reply: Vec<Value> = self.send(pipe).await?;
        reply
            .chunks_exact(4)
            .map(|r| peek_of(r, GrantHeld::InCounter))
            .collect()
    }

    async fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> Result<Claimed, CountFailed> {
        // In a cluster the levels are counted only once the claim is new (and replicated, with
        // `VALKEY_WAIT_REPLICAS`): a failed claim sent nothing at any level.
        let never_sent = |error: SendError| match self.valkey.is_cluster() {
            true => CountFailed {
                error,
                levels: Some(vec![Err(NoAnswer { may_land: false }); args.levels.len()]),
            },
            false => CountFailed::from(error),
        };
        self.claim(args, claim).await.map_err(never_sent)
    }

    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, SendError> {
        let levels: Vec<PaceLane<'_>> = args
            .levels
            .iter()
            .filter(|l| l.delay_ms > 0)
            .copied()
            .collect();
        let cluster = self.valkey.is_cluster();
        if cluster && !levels.is_empty() {
            return self.pace_in_cluster(&args, &levels).await;
        }
        let lanes: Vec<PaceLane<'_>> = std::iter::once(args.subject()).chain(levels).collect();
        // In a cluster the sleep leases live in a slot of their own: asked after.
        let step = PaceArgs {
            sleep_ask: args.sleep_ask.filter(|_| !cluster),
            ..args
        };
        let reply: Vec<i64> = self.send(pace_script(&lanes, &step)).await?;
        let mut answer = paced(&reply);
        match &mut answer {
            Paced::Full { levels_ms, .. } => {
                *levels_ms = spread_excess(args.levels, std::mem::take(levels_ms));
            }
            Paced::Slot {
                delay_ms,
                sleep_lease,
            } if cluster => {
                *sleep_lease = self.sleep_lease_after(&args, *delay_ms).await;
            }
            Paced::Slot { .. } => {}
        }
        Ok(answer)
    }

    async fn take_sleep_lease(&self, lone: LoneSleepAsk) -> Result<SleepLease, SendError> {
        let reply: Vec<i64> = self.send(take_sleep_lease_script(&lone)).await?;
        sleep_lease_of(&reply)
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), SendError> {
        if refund.levels.is_empty() || !self.valkey.is_cluster() {
            return self.send(refund_script(&refund, refund.levels)).await;
        }
        self.refund_in_cluster(&refund).await
    }

    async fn has_record(&self, record: &str, _now: UnixSecs) -> Result<bool, SendError> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(record);
        self.send(cmd).await
    }

    async fn release(&self, record: &str, scan_id: Uuid, _now: UnixSecs) -> Result<(), SendError> {
        let mut cmd = eval(RELEASE, &[record]);
        cmd.arg(scan_id.to_string());
        self.send(cmd).await
    }

    async fn update_record(&self, update: RecordUpdate<'_>) -> Result<(), SendError> {
        let RecordUpdate { record, fields, .. } = update;
        let mut pipe = redis::pipe();
        pipe.cmd("HSET").arg(record);
        for (field, value) in fields {
            pipe.arg(field.as_str()).arg(value);
        }
        pipe.ignore()
            .cmd("EXPIRE")
            .arg(record)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg("NX")
            .ignore();
        self.send(pipe).await
    }

    async fn take_over(&self, args: TakeOver<'_>) -> Result<bool, SendError> {
        let mut cmd = eval(TAKE_OVER, &[args.record]);
        cmd.arg(args.expected_until_ms.get())
            .arg(args.lease_until_ms.get());
        let taken: i64 = self.send(cmd).await?;
        Ok(taken == 1)
    }
}
