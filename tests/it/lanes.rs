//! Within quota means at once, also at the scanner: one consumer
//! (`--concurrency 1`) behind a flood of addresses, each with one scan within
//! quota and several over it (paced 1 s apart onto their `notBefore`), on a
//! Valkey stream and on SQS (moto) with the over lane's queue. Once the
//! flood's own within-quota scans ran, the over-quota backlog is long, and
//! within-quota scans of fresh addresses sent 3 s apart each start within the
//! idle dwell and one scan of their 202 (first come, first served, the same
//! scans started 22–89 s late). A modest tenant's over-quota scan takes its turn
//! within a round of the noisy tenants, not behind their backlog. Then the
//! scanner turns quick and the consumer drains the rest: every job ran once,
//! none before its `notBefore`. Clients act as real ones: a non-2xx answer
//! is retried. And when within-quota work alone saturates the consumer,
//! the over lane still gets its share (one start in `--over-every`), its
//! tenants in turn.
//!
//! The scenarios run one at a time: a flood of thousands of scans loads a
//! 2-core machine enough to crowd another scenario's dwells and the flood
//! tests of `serve` running beside it. A dwell's bound keeps a quarter
//! second of slack for a loaded machine, and a round is counted in starts,
//! not timed.

use quota_gate_testkit as common;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::consumer::*;
use common::moto::MotoServer;
use common::*;
use futures_util::StreamExt;
use quota_gate::gate::Gate;
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::sqs::SqsQueue;
use quota_gate::io::store::valkey::ValkeyStore;
use serde_json::{Value, json};

/// One scenario at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The gate's settings in every scenario: one scan a day within quota, the
/// next 100 over it 1 s apart, deferred onto the queue.
const GATE: &[(&str, &str)] = &[
    ("QUOTA_ANON", "1"),
    ("QUOTA_NETWORKS", "off"),
    ("QUOTA_SOFT_WINDOW", "100"),
    ("QUOTA_SOFT_DELAY_MS", "1000"),
    ("QUOTA_DELAY_MODE", "defer"),
    // A flood of thousands in one test process must not fail open: every
    // scan is counted, so the lanes are the gate's verdicts.
    ("QUOTA_STORE_TIMEOUT_MS", "5000"),
];

/// A scan's 202: when it came (unix ms), its id, its body.
type Answer = (i64, String, Value);

/// How loud the flood is.
struct Flood {
    /// Noisy addresses.
    noisy: usize,
    /// Scans from each noisy address: one within quota, the rest over it.
    scans: usize,
    /// How long the scanner takes per scan.
    scan: Duration,
    /// Whether the modest tenant's over-quota scan is held to a round of
    /// the noisy tenants (on a stream), or only to starting ahead of their
    /// backlog (on SQS, where moto answers the consumer's hundreds of
    /// visibility renewals slowly enough to delay its reads).
    modest_in_a_round: bool,
}

impl Flood {
    fn scan_ms(&self) -> i64 {
        self.scan.as_millis() as i64
    }
}

/// From `since` (unix ms) to the start of `id`.
async fn dwell(scanner: &Scanner, since: i64, id: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(line) = scanner.of("start").iter().find(|l| l.scan_id == id) {
            return line.at_ms - since;
        }
        let errors = scanner.all_errors();
        assert!(Instant::now() < deadline, "{id} never started\n{errors}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The flood, the within-quota scans and the modest tenant, through `scan`
/// (a 202 from an address), the scanner busy with one consumer; checks the
/// dwells and returns every job's `notBefore` by scanId.
async fn busy_scanner<F, Fut>(scanner: &Scanner, flood: &Flood, scan: F) -> HashMap<String, i64>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Answer>,
{
    let mut answers = Vec::new();
    let (at, id, body) = scan("192.0.2.250".into()).await;
    let idle = dwell(scanner, at, &id).await;
    answers.push(body);
    let scans = flood.scans;
    let noise = (0..flood.noisy).flat_map(|a| (0..scans).map(move |_| noisy_address(a)));
    // 100 in flight at once: as many clients as a small fleet of Lambda
    // environments answers together.
    let flooded: Vec<Answer> = futures_util::stream::iter(noise.map(&scan))
        .buffer_unordered(100)
        .collect()
        .await;
    // The flood's own within-quota scans go first.
    for (at, id, body) in flooded {
        if body["delayMs"] == 0 {
            dwell(scanner, at, &id).await;
        }
        answers.push(body);
    }
    // A modest tenant: within quota, then one scan over it, due in 1 s.
    answers.push(scan("203.0.113.1".into()).await.2);
    let (at, modest, body) = scan("203.0.113.1".into()).await;
    assert_eq!(body["delayMs"], 1000, "{body}");
    answers.push(body);
    let backlog = Instant::now() + Duration::from_secs(1);
    let mut within = Vec::new();
    for i in 0..4 {
        tokio::time::sleep_until((backlog + Duration::from_secs(3 * i)).into()).await;
        let (at, id, body) = scan(format!("192.0.2.{i}")).await;
        within.push(dwell(scanner, at, &id).await);
        answers.push(body);
    }
    let due = at + 1000;
    let modest_late = dwell(scanner, due, &modest).await;
    // Its round: the scans that started between its due time and its own
    // start, counted, not timed, so a loaded machine's slower scans do not
    // move the bound.
    let waiting = due..due + modest_late;
    let ahead = scanner
        .of("start")
        .iter()
        .filter(|l| waiting.contains(&l.at_ms))
        .count();
    println!(
        "{} noisy addresses, {} ms a scan: idle dwell {idle} ms; within-quota dwell {within:?} ms; \
         modest over-quota wait {modest_late} ms, {ahead} scans started ahead of it",
        flood.noisy,
        flood.scan_ms()
    );
    // The goal, the idle dwell and one scan, with some slack for a loaded
    // test machine.
    let bound = idle + flood.scan_ms() + 250;
    assert!(
        within.iter().all(|d| *d <= bound),
        "within-quota dwell {within:?} ms, idle {idle} ms, bound {bound} ms"
    );
    // A round: one scan of each noisy tenant and the four within-quota
    // scans (the modest one starts last in it); and a few seated late on a
    // loaded machine, each job being claimed before it waits. Behind the
    // backlog would be more than one more round.
    let round = flood.noisy + 4;
    if flood.modest_in_a_round {
        assert!(
            ahead <= round + 4,
            "{ahead} scans started ahead of the modest over-quota scan, a round is {round}"
        );
    }
    // Not behind the noisy backlog: most of it had not started yet.
    let expected = not_befores(&answers);
    let started = scanner.of("start").len();
    assert!(
        started < expected.len() / 2,
        "the modest over-quota scan started after {started} of {} scans",
        expected.len()
    );
    expected
}

fn noisy_address(a: usize) -> String {
    format!("198.18.{}.{}", a / 200, a % 200 + 1)
}

/// The scanner turns quick and the consumer, joined by `drainer` (a second
/// one, four scans at a time), drains what is left; then every job ran once,
/// none before its `notBefore`. A job behind a `"queued": "unknown"` answer
/// (`unknown` of them) may have landed under an id no client kept, its
/// retry given a new one: such a job runs at most once. The drain's bound
/// only stops a hung run: on moto under load, jobs whose visibility
/// renewals came late return a visibility timeout (30 s) later, a few times
/// over.
fn drained_once_on_time(
    scanner: &Scanner,
    expected: &HashMap<String, i64>,
    unknown: &AtomicUsize,
    drainer: impl FnOnce(&[&str]) -> KillOnDrop,
) {
    scanner.quick();
    let _drainer = drainer(&["--concurrency", "4"]);
    scanner.wait_for("end", expected.len(), Duration::from_secs(300));
    // A stray job's end counts there too: wait for every queued job's.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ended = || {
        scanner
            .of("end")
            .iter()
            .filter(|l| expected.contains_key(&l.scan_id))
            .count()
    };
    while ended() < expected.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (known, stray): (Vec<Line>, Vec<Line>) =
        (scanner.lines().into_iter()).partition(|l| expected.contains_key(&l.scan_id));
    let stray_ids: BTreeSet<&str> = stray.iter().map(|l| l.scan_id.as_str()).collect();
    let unknown = unknown.load(Ordering::Relaxed);
    assert!(
        stray_ids.len() <= unknown,
        "{unknown} answers said unknown: {stray:#?}"
    );
    for id in stray_ids {
        let ends = stray.iter().filter(|l| l.scan_id == id && l.what == "end");
        assert!(ends.count() <= 1, "{id} ran twice: {stray:#?}");
    }
    if let Err(e) = once_on_time(&known, expected, false) {
        panic!("{e}\n{known:#?}\n{}", scanner.all_errors());
    }
}

/// A 202's parts, retried as a real client would while the answer is not
/// a 2xx (a flood can outrun a queue's timeout); each `"queued": "unknown"`
/// answer counted in `unknown`.
async fn answered<S, Q>(gate: &Gate<S, Q>, ip: &str, unknown: &AtomicUsize) -> Answer
where
    S: quota_gate::io::store::quota_store::QuotaStore,
    Q: quota_gate::io::queue::ScanQueue,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = gate.handle(scan_from(ip)).await;
        let body = json(&answer);
        if answer.status().is_success() {
            let id = body["scanId"].as_str().unwrap_or_else(|| panic!("{body}"));
            return (now_ms(), id.to_owned(), body);
        }
        if body["queued"] == "unknown" {
            unknown.fetch_add(1, Ordering::Relaxed);
        }
        assert!(Instant::now() < deadline, "{}: {body}", answer.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn on_a_stream(flood: Flood) {
    let rig = StreamRig::start();
    let gate = valkey_gate(&rig.valkey, GATE);
    let sleep = format!("{}", flood.scan.as_secs_f64());
    // The over lane's whole backlog fits the room: tenants take turns
    // among the jobs read (docs/guarantees.md).
    let held = (flood.noisy * flood.scans + 64).max(1024).to_string();
    let held = ["--max-held", &held];
    let one = [&held[..], &["--concurrency", "1"]].concat();
    let _consumer = rig.consume("a", &one, &[("SLEEP", &sleep)]);
    let unknown = AtomicUsize::new(0);
    let expected = busy_scanner(&rig.scanner, &flood, |ip| {
        let (gate, unknown) = (&gate, &unknown);
        async move { answered(gate, &ip, unknown).await }
    })
    .await;
    drained_once_on_time(&rig.scanner, &expected, &unknown, |more| {
        rig.consume("b", &[&held[..], more].concat(), &[])
    });
}

/// On a Valkey stream: 40 noisy addresses at 0.2 s a scan (600 scans), then
/// four times the tenants (160 noisy addresses, six scans each: a backlog of
/// 800, five times a round) at 50 ms a scan; then on SQS. One scenario after
/// the other, in one test: a test waiting for the lock would hold a test
/// thread idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn within_quota_starts_at_once_at_a_busy_scanner() {
    let _one = ONE_AT_A_TIME.lock().await;
    for (noisy, scans, scan_ms) in [(40, 15, 200), (160, 6, 50)] {
        on_a_stream(Flood {
            noisy,
            scans,
            scan: Duration::from_millis(scan_ms),
            modest_in_a_round: true,
        })
        .await;
    }
    on_sqs(Flood {
        noisy: 40,
        scans: 8,
        scan: Duration::from_millis(200),
        modest_in_a_round: false,
    })
    .await;
}

/// On SQS: the scan queue and the over lane's (`SCAN_QUEUE_OVER_URL`, each
/// over-quota message in its tenant's group), read by one consumer
/// (`--from`, `--from-over`).
async fn on_sqs(flood: Flood) {
    let moto = MotoServer::start();
    let valkey = ValkeyServer::start();
    let within_url = moto.create_queue("scans").await;
    let over_url = moto.create_queue("scans-over").await;
    let url = valkey.url();
    let mut vars = vec![
        ("VALKEY_URL", url.as_str()),
        ("SCAN_QUEUE_URL", within_url.as_str()),
        ("SCAN_QUEUE_OVER_URL", over_url.as_str()),
    ];
    vars.extend_from_slice(GATE);
    let config = config(&vars);
    let queue = SqsQueue::new(&moto.sdk_config().await, &within_url)
        .with_over_lane(config.queue_over.clone());
    let store = ValkeyStore::new(Valkey::new(&url, false, config.store.timeout).unwrap());
    let gate = Gate::new(config, store, queue, Meter::new("test", None)).unwrap();
    let aws = moto.process_env();
    let sleep = format!("{}", flood.scan.as_secs_f64());
    let mut env: Vec<(&str, &str)> = aws.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend([("VALKEY_URL", url.as_str()), ("SLEEP", &sleep)]);
    let scanner = Scanner::new();
    let args = ["--from", &within_url, "--from-over", &over_url];
    let one = [&args[..], &["--concurrency", "1"]].concat();
    let _consumer = scanner.consume("a", &one, &env, std::process::Stdio::null());
    let unknown = AtomicUsize::new(0);
    let expected = busy_scanner(&scanner, &flood, |ip| {
        let (gate, unknown) = (&gate, &unknown);
        async move { answered(gate, &ip, unknown).await }
    })
    .await;
    drained_once_on_time(&scanner, &expected, &unknown, |more| {
        let args = [&args[..], more].concat();
        scanner.consume("b", &args, &env, std::process::Stdio::null())
    });
}

/// Within-quota work alone saturates the consumer (40 due within-quota jobs,
/// one slot), and 20 over-quota jobs of 5 tenants are due too: the over lane
/// gets one start in `--over-every` (4) while both wait, its tenants in turn.
#[tokio::test(flavor = "multi_thread")]
async fn the_over_lane_keeps_its_share_when_within_quota_work_saturates() {
    let _one = ONE_AT_A_TIME.lock().await;
    let rig = StreamRig::start();
    let due = now_ms();
    let within: Vec<Value> = (0..40).map(|_| job(due)).collect();
    let over: Vec<Value> = (0..20)
        .map(|i| {
            let mut j = job(due);
            j["lane"] = json!("over");
            j["delayMs"] = json!(1000);
            j["tenant"] = json!(format!("t{}", i % 5));
            j
        })
        .collect();
    queue_all(&rig.valkey, "jobs", &within).await;
    let mut tenants = HashMap::new();
    for j in &over {
        xadd(&rig.valkey, "{jobs}:over", j).await;
        let id = j["scanId"].as_str().unwrap().to_owned();
        tenants.insert(id, j["tenant"].as_str().unwrap().to_owned());
    }
    let args = ["--concurrency", "1", "--over-every", "4"];
    let _consumer = rig.consume("a", &args, &[("SLEEP", "0.02")]);
    let lines = rig.scanner.wait_for_ends(60, Duration::from_secs(60));
    let starts: Vec<&str> = lines
        .iter()
        .filter(|l| l.what == "start")
        .map(|l| l.scan_id.as_str())
        .collect();
    assert_eq!(starts.len(), 60, "{lines:?}");
    // While both lanes waited: up to the last within-quota start.
    let last_within = starts
        .iter()
        .rposition(|id| !tenants.contains_key(*id))
        .unwrap();
    let both: Vec<&str> = starts[..=last_within].to_vec();
    let over_starts: Vec<&str> = both
        .iter()
        .filter_map(|id| tenants.get(*id).map(String::as_str))
        .collect();
    let share = over_starts.len() as f64 / both.len() as f64;
    println!(
        "over lane: {} of the {} starts while both lanes waited ({:.0} %)",
        over_starts.len(),
        both.len(),
        share * 100.0
    );
    // One in four, less the first start (taken before all was read).
    assert!(over_starts.len() + 1 >= both.len() / 4, "{starts:?}");
    // Tenants in turn among the jobs waiting for a slot: each job is
    // claimed before it waits, so a loaded machine may seat the first few
    // late; from the first round of all five tenants on, any five
    // over-quota starts in a row are five tenants.
    let five_tenants = |five: &[&str]| five.iter().collect::<BTreeSet<_>>().len() == 5;
    let first_round = over_starts.windows(5).position(five_tenants);
    let first_round = first_round.unwrap_or_else(|| panic!("never a round: {over_starts:?}"));
    for five in over_starts[first_round..].windows(5) {
        assert!(five_tenants(five), "{over_starts:?}");
    }
}
