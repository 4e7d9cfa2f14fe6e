//! The worker's scheduling with paused Tokio time, an in-memory source and
//! a scanner that only sleeps: no server, no process.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::Mutex;

use super::*;
use crate::consume::handoff::StopSignal;
use crate::consume::marker::MarkerStore;
use crate::consume::schedule::MarkerClaim;
use crate::io::clock::Clock;
use crate::rules::job::ScanJob;

/// An in-memory queue that records what the worker did with each job.
#[derive(Default)]
struct Fake {
    queued: Mutex<VecDeque<Delivery<u32>>>,
    log: Mutex<Vec<String>>,
}

impl Fake {
    fn log(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }

    fn count(&self, prefix: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }
}

impl JobSource for Arc<Fake> {
    type Handle = u32;

    fn name(&self) -> &'static str {
        "fake"
    }

    async fn next(&self, _max: usize) -> Result<Option<Vec<Delivery<u32>>>, ConsumeError> {
        Ok(self.queued.lock().unwrap().pop_front().map(|d| vec![d]))
    }

    async fn ack(&self, d: &Delivery<u32>) -> Result<(), ConsumeError> {
        self.log(format!("ack {}", d.handle));
        Ok(())
    }

    async fn extend(&self, d: &Delivery<u32>) -> Result<(), ConsumeError> {
        self.log(format!("extend {}", d.handle));
        Ok(())
    }

    async fn dead_letter(&self, d: &Delivery<u32>, why: GivenUp<'_>) -> Result<(), ConsumeError> {
        self.log(format!("dead {} {}", d.handle, why.failures));
        Ok(())
    }

    async fn give_back(&self, d: &Delivery<u32>, _wait: Duration) {
        self.log(format!("give back {}", d.handle));
    }
}

/// A scanner that takes `secs[handle]` seconds (forever if missing) and
/// logs its starts, ends and stops with the time they happened.
struct Sleeper {
    secs: Vec<u64>,
    log: Arc<Fake>,
    clock: Arc<QueueClock>,
}

impl Scanner for Sleeper {
    async fn run<H: Sync>(&self, a: Attempt<'_, H>, stop: impl StopSignal) -> Result<(), Ended> {
        let (d, attempt) = (a.delivery, a.number);
        let h: u32 = d.job.image().unwrap_or_default().parse().unwrap_or(0);
        self.log
            .log(format!("start {h} {attempt} {}", self.clock.now().get()));
        let secs = self.secs.get(h as usize).copied().unwrap_or(u64::MAX / 4);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(secs)) => {
                self.log.log(format!("end {h} {}", self.clock.now().get()));
                Ok(())
            }
            why = stop => {
                self.log.log(format!("stopped {h} {why}"));
                Err(Ended::Stopped(why))
            }
        }
    }
}

/// A job due at `not_before_ms` whose image names the scanner's handle `h`.
fn job(h: u32, not_before_ms: i64) -> ScanJob {
    let at = crate::gate::respond::rfc3339_ms;
    let json = serde_json::json!({"version": 1, "scanId": uuid::Uuid::now_v7(),
        "receivedAt": at(not_before_ms), "scope": "ip", "digest": "d", "tier": "soft",
        "limit": 1, "count": 2, "delayMs": 0, "deferredMs": 0, "notBefore": at(not_before_ms),
        "request": {"image": h.to_string()}});
    ScanJob::from_json(&json.to_string()).unwrap()
}

struct Setup<M: MarkerStore = Markers> {
    fake: Arc<Fake>,
    worker: Arc<Worker<Arc<Fake>, Sleeper, M>>,
    clock: Arc<QueueClock>,
    stop: watch::Sender<bool>,
    kill: watch::Sender<bool>,
}

/// A worker with one run slot, a 4 s lease, a 10 s scan timeout and 2 attempts.
fn setup(secs: Vec<u64>) -> Setup {
    setup_with(secs, Markers::local())
}

fn setup_with<M: MarkerStore>(secs: Vec<u64>, markers: M) -> Setup<M> {
    let fake = Arc::new(Fake::default());
    let clock = QueueClock::local(Clock::tokio());
    let (stop, stopping) = watch::channel(false);
    let (kill, killing) = watch::channel(false);
    let worker = Arc::new(Worker {
        source: fake.clone(),
        markers,
        scanner: Sleeper {
            secs,
            log: fake.clone(),
            clock: clock.clone(),
        },
        run_slots: crate::consume::slots::RunSlots::new(1, 4),
        policy: RetryPolicy {
            max_attempts: NonZeroU32::new(2).unwrap(),
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        },
        lease: Duration::from_secs(4),
        scan_timeout: Duration::from_secs(10),
        meter: ConsumeMeter::new("Test", "fake", false),
        clock: clock.clone(),
        stopping,
        killing,
        tokens: Tokens::new("c".into()),
    });
    Setup {
        fake,
        worker,
        clock,
        stop,
        kill,
    }
}

impl<M: MarkerStore> Setup<M> {
    fn spawn(&self, handle: u32, not_before_ms: i64) -> tokio::task::JoinHandle<()> {
        let d = Delivery {
            job: job(handle, not_before_ms),
            json: String::new(),
            handle,
        };
        let worker = self.worker.clone();
        tokio::spawn(async move { worker.process(d).await })
    }

    fn lines(&self) -> Vec<String> {
        self.fake.log.lock().unwrap().clone()
    }

    /// The time in `start {h} …` / `end {h} …` lines for handle `h`.
    fn at(&self, what: &str, h: u32) -> Option<i64> {
        self.lines().iter().find_map(|l| {
            let rest = l.strip_prefix(&format!("{what} {h} "))?;
            rest.split_whitespace().last()?.parse().ok()
        })
    }
}

/// A held job starts at its notBefore, not before, and is acked once after its end.
#[tokio::test(start_paused = true)]
async fn held_job_starts_at_not_before() {
    let s = setup(vec![1]);
    let due = s.clock.now().get() + 5_000;
    s.spawn(0, due).await.unwrap();
    let start = s.at("start", 0).unwrap();
    assert!(start >= due && start < due + 50, "{:?}", s.lines());
    assert_eq!(s.fake.count("ack 0"), 1);
    // Held 5 s with a 4 s lease: renewed while held.
    assert!(s.fake.count("extend 0") >= 4, "{:?}", s.lines());
}

/// A hung scanner is stopped at the scan timeout and counts as a failed
/// attempt: retried after the backoff with a higher attempt number, then
/// dead-lettered.
#[tokio::test(start_paused = true)]
async fn hung_scanner_times_out_then_dead_letters() {
    let s = setup(vec![]);
    s.spawn(0, 0).await.unwrap();
    let lines = s.lines();
    assert_eq!(s.fake.count("stopped 0 scan timeout"), 2, "{lines:?}");
    assert!(
        lines.iter().any(|l| l.starts_with("start 0 1 ")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("start 0 2 ")),
        "{lines:?}"
    );
    assert_eq!(s.fake.count("dead 0 2"), 1, "{lines:?}");
    assert_eq!(s.fake.count("ack 0"), 0, "{lines:?}");
}

/// A due job waiting behind a busy run slot is not renewed, so another
/// consumer may take it over; it runs here once the slot frees.
#[tokio::test(start_paused = true)]
async fn due_job_behind_a_busy_slot_is_not_renewed() {
    // The second scan takes no time, so nothing renews it while it runs.
    let s = setup(vec![9, 0]);
    let first = s.spawn(0, 0);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = s.spawn(1, 0);
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(s.fake.count("extend 1"), 0, "{:?}", s.lines());
    assert!(s.fake.count("extend 0") >= 8, "{:?}", s.lines());
    assert!(s.at("start", 1).unwrap() >= s.at("end", 0).unwrap());
}

/// A running scan whose marker another attempt finished is stopped at its
/// next renewal, and its delivery acked as a duplicate, not run again.
#[tokio::test(start_paused = true)]
async fn lost_marker_stops_the_scan() {
    let s = setup(vec![30]);
    let d = Delivery {
        job: job(0, 0),
        json: String::new(),
        handle: 0,
    };
    let scan = d.job.scan_id;
    let worker = s.worker.clone();
    let task = tokio::spawn(async move { worker.process(d).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.worker.markers.done(scan).await.unwrap();
    task.await.unwrap();
    let lines = s.lines();
    assert_eq!(s.fake.count("stopped 0 lease lost"), 1, "{lines:?}");
    assert_eq!(s.fake.count("start 0"), 1, "{lines:?}");
    assert_eq!(s.fake.count("ack 0"), 1, "{lines:?}");
}

/// On stop, a held job is given back at once and a running scan runs on
/// until the grace period ends; then it is stopped and given back.
#[tokio::test(start_paused = true)]
async fn stop_gives_back_held_and_kill_stops_running() {
    let s = setup(vec![60]);
    let running = s.spawn(0, 0);
    let held = s.spawn(1, s.clock.now().get() + 60_000);
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.stop.send(true).unwrap();
    held.await.unwrap();
    assert_eq!(s.fake.count("give back 1"), 1, "{:?}", s.lines());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.fake.count("stopped 0"), 0, "{:?}", s.lines());
    s.kill.send(true).unwrap();
    running.await.unwrap();
    assert_eq!(s.fake.count("stopped 0 shutdown"), 1, "{:?}", s.lines());
    assert_eq!(s.fake.count("give back 0"), 1, "{:?}", s.lines());
    assert_eq!(s.fake.count("ack"), 0, "{:?}", s.lines());
}

/// In-process markers whose renewals (claims of a running attempt) stall
/// for an hour and then fail, as a call to a Valkey that stopped answering.
struct StalledRenewals(Markers);

impl MarkerStore for StalledRenewals {
    async fn claim(&self, ask: MarkerAsk<'_>) -> Result<MarkerClaim, ConsumeError> {
        if ask.mine > 0 {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            return Err(ConsumeError::Setup("stalled".into()));
        }
        self.0.claim(ask).await
    }

    async fn done(&self, scan: uuid::Uuid) -> Result<(), ConsumeError> {
        self.0.done(scan).await
    }

    async fn release(&self, scan: uuid::Uuid, token: &str) -> Result<(), ConsumeError> {
        self.0.release(scan, token).await
    }
}

/// A running scan whose renewal stalls is stopped once ¾ of a lease has
/// passed since its last renewal known to hold, not when the stalled call
/// gives up (found by the consumer simulator: with calls that wait out
/// their timeout, the stop came after the marker had expired).
#[tokio::test(start_paused = true)]
async fn stalled_renewal_stops_the_scan_in_time() {
    let s = setup_with(vec![30], StalledRenewals(Markers::local()));
    let task = s.spawn(0, 0);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let lines = s.lines();
    // Started at 0, never renewed: stopped at 3 s (¾ of the 4 s lease).
    let stopped = lines.iter().position(|l| l == "stopped 0 lease lost");
    assert!(stopped.is_some(), "{lines:?}");
    task.abort();
}
