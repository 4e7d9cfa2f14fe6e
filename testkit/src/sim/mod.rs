//! A deterministic simulation of the request path: the real [`Gate::handle`]
//! over a simulated store and queue ([`store`], [`queue`]) whose every
//! command gets a seeded fate on the wire ([`wire`]), with clients that
//! retry, disconnect and scan beside each other, several workers, and a
//! restart at a random moment, all on a current-thread runtime with Tokio
//! time paused. After each schedule the guarantees are checked
//! ([`check`]). The same seed replays the same schedule.
//!
//! `tests/it/sim.rs` runs it; the README's "Simulation" section lists what is
//! checked.

pub mod check;
pub mod queue;
pub mod store;
pub mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};
use quota_gate::bugs::{self, Bug};
use quota_gate::config::Config;
use quota_gate::front::serve::detach;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::clock::Clock;
use quota_gate::io::meter::Meter;
use quota_gate::io::store::memory::MemoryStore;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use check::{Answer, Group, World};
use queue::{Jobs, SimQueue};
use store::{Ledger, SimStore};
use wire::{Conn, Faults, Rng};

/// 2026-11-30T10:00:00Z: every schedule starts here, far from a reset.
pub const T0_MS: i64 = 1_796_032_800_000;

/// The longest a request may take, and so what a restart's drain waits.
const DRAIN: Duration = Duration::from_secs(120);

/// The clients' addresses: subjects that share networks. Three in one
/// IPv4 /24 and one in another; IPv6 /64s, two in one /56, a third in
/// another /56 of the same /48, and one in another /48.
pub const ADDRESSES: &[&str] = &[
    "198.51.100.1",
    "198.51.100.2",
    "198.51.100.3",
    "203.0.113.9",
    "2001:db8:1:100::1",
    "2001:db8:1:101::1",
    "2001:db8:1:200::1",
    "2001:db8:2::1",
];

/// `QUOTA_NETWORKS`, with limits small enough that the levels matter.
const NETWORKS: &[&str] = &[
    "v4/24=2,v6/56=2,v6/48=3",
    "v4/24=1x,v6/56=1x,v6/48=2x",
    "v4/24=3,v6/48=4",
];

/// One schedule's settings, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Plan {
    pub vars: Vec<(&'static str, String)>,
    pub workers: usize,
    /// The queue is a stream on the store's own connection.
    pub shared_conn: bool,
    pub fault_percent: u64,
    pub faults_until: Duration,
    /// A stopped server: from, for how long.
    pub stall: Option<(Duration, Duration)>,
    pub restart_at: Option<Duration>,
    pub groups: Vec<GroupPlan>,
}

/// `QUOTA_TOKEN_NETWORKS`, small enough that token holders sharing a
/// network are held back by it.
const TOKEN_NETWORKS: &[&str] = &["v4/24=2,v6/48=3", "v4/24=1x,v6/48=2x", "off"];

/// One scan a client wants: its attempts (one, unless keyed).
#[derive(Debug, Clone)]
pub struct GroupPlan {
    pub keyed: bool,
    /// Sent with a token (`tid` `sim-<group>`, as the gateway's verified
    /// claims): counted as a token holder, at its network's token levels.
    pub token: bool,
    pub ip: &'static str,
    pub attempts: Vec<AttemptPlan>,
}

#[derive(Debug, Clone, Copy)]
pub struct AttemptPlan {
    pub at: Duration,
    pub worker: usize,
    /// The client leaves after this long, without its answer.
    pub leaves_after: Option<Duration>,
}

impl Plan {
    pub fn draw(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let r = &mut rng;
        let mut vars: Vec<(&'static str, String)> = vec![
            ("QUOTA_ANON", r.pick(&["1", "2", "3"]).into()),
            ("QUOTA_SOFT_WINDOW", "2".into()),
            ("QUOTA_SOFT_DELAY_MS", "5000".into()),
            ("QUOTA_HARD_DELAY_MS", r.pick(&["20000", "60000"]).into()),
            ("QUOTA_DELAY_MODE", r.pick(&["sleep", "defer"]).into()),
            ("QUOTA_PACING", r.pick(&["on", "off"]).into()),
            ("QUOTA_MAX_BACKLOG_MS", r.pick(&["30000", "600000"]).into()),
            ("QUOTA_STORE_TIMEOUT_MS", "100".into()),
            ("QUOTA_BREAKER_FAILURES", r.pick(&["0", "3"]).into()),
        ];
        if r.chance(25) {
            vars.push(("QUOTA_FAIL_MODE", "closed".into()));
        }
        // Small network limits, so a level, not only the subject, decides.
        vars.push(("QUOTA_NETWORKS", r.pick(NETWORKS).into()));
        // Token holders, drawn apart so every seed's schedule is otherwise
        // what it was before they were.
        let t = &mut Rng::new(seed.rotate_left(17) ^ 0x70_6b_65_6e);
        vars.push(("QUOTA_TRUST_GATEWAY_CLAIMS", "true".into()));
        vars.push(("QUOTA_TOKEN", t.pick(&["1", "2", "3"]).into()));
        vars.push(("QUOTA_TOKEN_NETWORKS", t.pick(TOKEN_NETWORKS).into()));
        let workers = 1 + r.below(3) as usize;
        let faults_until = r.ms(0, 20_000);
        let mut groups = Vec::new();
        for _ in 0..2 + r.below(7) {
            let keyed = r.chance(65);
            let ip = r.pick(ADDRESSES);
            let mut at = r.ms(0, 5_000);
            let mut attempts = Vec::new();
            let tries = if keyed { 1 + r.below(4) } else { 1 };
            for _ in 0..tries {
                attempts.push(attempt(r, at, workers));
                at += r.ms(0, 40_000);
            }
            // A client that keeps at it comes back once the faults are over.
            if keyed && r.chance(50) {
                let last = faults_until + Duration::from_secs(40) + r.ms(0, 20_000);
                attempts.push(attempt(r, last.max(at), workers));
            }
            groups.push(GroupPlan {
                keyed,
                token: t.chance(35),
                ip,
                attempts,
            });
        }
        let restart_at = r.chance(40).then(|| r.ms(0, 40_000));
        let stall = r.chance(40).then(|| (r.ms(0, 10_000), r.ms(200, 15_000)));
        Self {
            vars,
            workers,
            shared_conn: r.chance(50),
            fault_percent: r.pick(&[10, 30, 60]),
            faults_until,
            stall,
            restart_at,
            groups,
        }
    }
}

impl Plan {
    /// The gate's configuration.
    pub fn config(&self) -> Config {
        let vars: Vec<_> = self.vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        crate::config(&vars)
    }
}

/// One meter for every schedule: building one renders its EMF directives.
fn meter() -> Meter {
    static METER: std::sync::OnceLock<Meter> = std::sync::OnceLock::new();
    METER.get_or_init(|| Meter::new("sim", None)).clone()
}

fn attempt(r: &mut Rng, at: Duration, workers: usize) -> AttemptPlan {
    AttemptPlan {
        at,
        worker: r.below(workers as u64) as usize,
        leaves_after: r.chance(25).then(|| r.ms(0, 35_000)),
    }
}

/// How a schedule ended, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub requests: usize,
    pub jobs: usize,
}

type SimGate = Gate<SimStore, SimQueue>;

/// One running `serve` process: its workers' gates and its scans in flight.
struct Process {
    gates: Vec<Arc<SimGate>>,
    /// Per gate: whether its store answered since the faults ended.
    answering: Vec<Arc<AtomicBool>>,
    scans: TaskTracker,
}

/// What every process shares: the store's state, the queue, the answers.
struct Shared {
    memory: MemoryStore,
    ledger: Arc<Mutex<Ledger>>,
    jobs: Arc<Mutex<Jobs>>,
    answers: Arc<Mutex<Vec<Answer>>>,
    faults: Arc<Faults>,
    conns: Mutex<Vec<Arc<Conn>>>,
    clock: Clock,
    config: Config,
}

impl Shared {
    fn process(&self, workers: usize, shared_conn: bool) -> Process {
        let config = &self.config;
        let timeout = config.store.timeout;
        let answering: Vec<_> = (0..workers).map(|_| Arc::default()).collect();
        let gates = answering
            .iter()
            .map(|answering| {
                let conn = Arc::new(Conn::default());
                let queue_conn = if shared_conn {
                    conn.clone()
                } else {
                    Arc::new(Conn::default())
                };
                let mut conns = self.conns.lock().unwrap();
                conns.push(conn.clone());
                conns.push(queue_conn.clone());
                let store = SimStore {
                    memory: self.memory.clone(),
                    ledger: self.ledger.clone(),
                    conn,
                    faults: self.faults.clone(),
                    timeout,
                    answering: Arc::clone(answering),
                };
                let queue = SimQueue {
                    jobs: self.jobs.clone(),
                    conn: queue_conn,
                    faults: self.faults.clone(),
                };
                let gate = Gate::new(config.clone(), store, queue, meter())
                    .expect("valid gate")
                    .with_clock(self.clock);
                Arc::new(gate)
            })
            .collect();
        Process {
            gates,
            answering,
            scans: TaskTracker::new(),
        }
    }
}

thread_local! {
    /// Panics on this thread (the schedule's runtime runs every task here).
    static PANICS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts panics per thread, then reports them as before.
fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            previous(info);
        }));
    });
}

/// Runs schedule `seed` (with `bug` switched on, if any) and checks it.
pub fn run(seed: u64, bug: Option<Bug>) -> Result<Stats, String> {
    count_panics();
    PANICS.with(|p| p.set(0));
    bugs::set(bug);
    let plan = Plan::draw(seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let result = runtime.block_on(schedule(seed, plan));
    drop(runtime);
    bugs::set(None);
    match PANICS.with(|p| p.get()) {
        0 => result,
        n => Err(format!("{n} panics (see above)")),
    }
}

async fn schedule(seed: u64, plan: Plan) -> Result<Stats, String> {
    let start = Instant::now();
    let shared = Arc::new(Shared {
        memory: MemoryStore::default(),
        ledger: Arc::default(),
        jobs: Arc::default(),
        answers: Arc::default(),
        faults: Arc::new(Faults::new(
            seed.wrapping_mul(31).wrapping_add(7),
            plan.fault_percent,
            start + plan.faults_until,
            plan.stall
                .map(|(from, long)| (start + from, start + from + long)),
        )),
        conns: Mutex::default(),
        clock: Clock::Tokio {
            wall_ms: T0_MS,
            at: start,
        },
        config: plan.config(),
    });
    let (workers, shared_conn) = (plan.workers, plan.shared_conn);
    let current = Arc::new(Mutex::new(Arc::new(shared.process(workers, shared_conn))));
    let processes = Arc::new(Mutex::new(vec![current.lock().unwrap().clone()]));
    if let Some(at) = plan.restart_at {
        let (shared, current, processes) = (shared.clone(), current.clone(), processes.clone());
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            let fresh = Arc::new(shared.process(workers, shared_conn));
            processes.lock().unwrap().push(fresh.clone());
            let old = std::mem::replace(&mut *current.lock().unwrap(), fresh);
            old.scans.close();
        });
    }
    let mut clients = Vec::new();
    for (g, group) in plan.groups.iter().enumerate() {
        for (a, attempt) in group.attempts.iter().enumerate() {
            let request = request(g, group);
            let (shared, current) = (shared.clone(), current.clone());
            let attempt = *attempt;
            clients.push(tokio::spawn(async move {
                tokio::time::sleep(attempt.at).await;
                let process = current.lock().unwrap().clone();
                let worker = attempt.worker % process.gates.len();
                let gate = process.gates[worker].clone();
                let answering = process.answering[worker].load(Ordering::Relaxed);
                let answers = shared.answers.clone();
                let at_ms = shared.clock.now_ms();
                let wait = detach(&process.scans, async move {
                    let response = gate.handle(request).await;
                    answers
                        .lock()
                        .unwrap()
                        .push(Answer::new(g, a, at_ms, answering, &response));
                    response
                });
                match attempt.leaves_after {
                    Some(after) => {
                        let _ = tokio::time::timeout(after, wait).await;
                    }
                    None => {
                        let _ = wait.await;
                    }
                }
            }));
        }
    }
    for client in clients {
        client
            .await
            .map_err(|e| format!("a client task failed: {e}"))?;
    }
    let all: Vec<_> = processes.lock().unwrap().clone();
    for process in all {
        process.scans.close();
        if tokio::time::timeout(DRAIN, process.scans.wait())
            .await
            .is_err()
        {
            return Err("scans still running after the drain".into());
        }
    }
    // Every late command that will land has landed.
    tokio::time::sleep(Duration::from_secs(600)).await;
    for conn in shared.conns.lock().unwrap().iter() {
        conn.land_all();
    }
    let world = World {
        config: shared.config.clone(),
        groups: plan
            .groups
            .iter()
            .enumerate()
            .map(|(g, p)| Group {
                keyed: p.keyed,
                token: p.token,
                ip: p.ip,
                body: body(g),
                first_ms: T0_MS + p.attempts[0].at.as_millis() as i64,
            })
            .collect(),
        answers: std::mem::take(&mut *shared.answers.lock().unwrap()),
        jobs: std::mem::take(&mut shared.jobs.lock().unwrap().landed),
        ledger: std::mem::take(&mut *shared.ledger.lock().unwrap()),
        faults_over_ms: T0_MS + faults_over(&plan).as_millis() as i64,
    };
    let stats = Stats {
        requests: world.answers.len(),
        jobs: world.jobs.len(),
    };
    world.check()?;
    Ok(stats)
}

/// Whether `SIM_TRACE` asks for every command's fate on stderr.
pub fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SIM_TRACE").is_some())
}

/// When every command is answered again.
fn faults_over(plan: &Plan) -> Duration {
    let stall_end = plan
        .stall
        .map_or(Duration::ZERO, |(from, long)| from + long);
    plan.faults_until.max(stall_end)
}

/// Group `g`'s body: its own image, so each job names its scan.
pub fn body(g: usize) -> String {
    format!(r#"{{"image":"registry.example.com/sim/app:{g}"}}"#)
}

fn request(g: usize, group: &GroupPlan) -> GateRequest {
    let mut r = crate::scan_from(group.ip);
    r.body = Bytes::from(body(g));
    if group.token {
        let tid = ("tid".to_owned(), format!("sim-{g}"));
        r.gateway_claims = Some(std::collections::HashMap::from([tid]));
    }
    if group.keyed {
        r.headers.insert(
            "idempotency-key",
            HeaderValue::from_str(&format!("key-{g}")).expect("a valid key"),
        );
    }
    r
}

/// Keeps what the checks need of a response.
pub fn answer_of(response: &Response<Bytes>) -> (u16, serde_json::Value, bool, bool) {
    let body = serde_json::from_slice(response.body()).unwrap_or_default();
    let unmetered = response
        .headers()
        .get("x-stella-quota")
        .is_some_and(|v| v == "unavailable");
    let replayed = response.headers().contains_key("idempotent-replayed");
    (response.status().as_u16(), body, unmetered, replayed)
}
