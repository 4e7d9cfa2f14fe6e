//! `quota-gate consume` as the tests run it: a real process, a scanner
//! script that records what it did, jobs written straight to a stream.
//!
//! The scanner appends `start <unix ms> <scanId> <consumer> <attempt>` to
//! a log when it starts, and `end …` when it finishes. Its work (`sleep
//! $SLEEP`, or `$HANG` seconds for an image named `hang`), when it has
//! any, runs in a background subshell it waits for, so a consumer that killed only the
//! `sh` it started would leave the subshell to write `end`: only a kill of
//! the whole process group stops it. A start that finds another live
//! attempt of the same `scanId` writes `overlap …` first (a pid file per
//! scan, checked in `/proc`, where a killed scanner not yet reaped is a zombie). Times come from `date` with
//! `LD_PRELOAD` unset, so a consumer under libfaketime does not fake them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use quota_gate::io::queue::stream::lane_key;
use quota_gate::rules::job::Lane;

use crate::{KillOnDrop, ValkeyServer, bin};

/// The scanner script.
const SCANNER: &str = r#"#!/bin/sh
# The wall clock in ms, outside libfaketime where a test runs the consumer under it.
now() { if [ -n "$LD_PRELOAD" ]; then env -u LD_PRELOAD date +%s%3N; else date +%s%3N; fi; }
pidfile="$RUNS/$SCAN_ID"
# Alive: a process that is not a zombie (killed, not yet reaped).
if [ -f "$pidfile" ] && state=$(cut -d' ' -f3 "/proc/$(cat "$pidfile")/stat" 2>/dev/null) \
   && [ "$state" != Z ]; then
  echo "overlap $(now) $SCAN_ID $TAG $SCAN_ATTEMPT" >> "$LOG"
fi
echo $$ > "$pidfile"
echo "start $(now) $SCAN_ID $TAG $SCAN_ATTEMPT" >> "$LOG"
work="${SLEEP:-0}"
if [ -e "$LOG.quick" ]; then work=0; fi
if [ "$IMAGE" = hang ]; then work="${HANG:-3600}"; fi
if [ "$work" = 0 ]; then
  echo "end $(now) $SCAN_ID $TAG $SCAN_ATTEMPT $IMAGE" >> "$LOG"
  exit
fi
( sleep "$work"; echo "end $(now) $SCAN_ID $TAG $SCAN_ATTEMPT $IMAGE" >> "$LOG" ) &
wait $!
"#;

/// The variables the scanner script reads beside the job's, for
/// `--scanner-env` (a scanner gets no other of the consumer's).
pub const SCANNER_VARS: &str = "LOG,RUNS,TAG,SLEEP,HANG";

/// A scratch folder with the scanner script and its log.
pub struct Scanner {
    pub dir: tempfile::TempDir,
}

/// One line of the scanner's log.
#[derive(Debug, Clone)]
pub struct Line {
    pub what: String,
    pub at_ms: i64,
    pub scan_id: String,
    pub tag: String,
    pub attempt: u64,
    /// The job's image (on `end` lines).
    pub image: String,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("scan.sh"), SCANNER).unwrap();
        std::fs::create_dir(dir.path().join("runs")).unwrap();
        Self { dir }
    }

    pub fn exec(&self) -> String {
        format!("sh {}", self.dir.path().join("scan.sh").display())
    }

    pub fn log(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    pub fn lines(&self) -> Vec<Line> {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some(Line {
                    what: f.next()?.into(),
                    at_ms: f.next()?.parse().ok()?,
                    scan_id: f.next()?.into(),
                    tag: f.next().unwrap_or("").into(),
                    attempt: f.next().and_then(|a| a.parse().ok()).unwrap_or(0),
                    image: f.next().unwrap_or("").into(),
                })
            })
            .collect()
    }

    /// The lines that say `what`.
    pub fn of(&self, what: &str) -> Vec<Line> {
        self.lines()
            .into_iter()
            .filter(|l| l.what == what)
            .collect()
    }

    pub fn ends(&self) -> Vec<Line> {
        self.of("end")
    }

    /// Waits until `n` scans have ended, then a little more (a duplicate
    /// would show up in that time), and returns the lines.
    pub fn wait_for_ends(&self, n: usize, within: Duration) -> Vec<Line> {
        self.wait_for("end", n, within);
        std::thread::sleep(Duration::from_millis(1500));
        self.lines()
    }

    /// [`assert_once_on_time`] on this scanner's log, with the consumers'
    /// own logs in the failure message.
    pub fn assert_once_on_time(&self, expected: &HashMap<String, i64>, overlap_allowed: bool) {
        let lines = self.lines();
        if let Err(e) = once_on_time(&lines, expected, overlap_allowed) {
            panic!("{e}\n{lines:#?}\n{}", self.all_errors());
        }
    }

    /// From now on, every scan this scanner starts takes no time (`$SLEEP`
    /// ignored): a test that measured a busy scanner drains the rest.
    pub fn quick(&self) {
        let mut quick = self.log().into_os_string();
        quick.push(".quick");
        std::fs::write(quick, "").unwrap();
    }

    /// Waits until `n` lines say `what`.
    pub fn wait_for(&self, what: &str, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.of(what).len() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} '{what}' lines: {:?}\n{}",
                self.of(what).len(),
                self.lines(),
                self.all_errors()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until consumer `tag` has logged `text`.
    pub fn wait_for_log(&self, tag: &str, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.errors_of(tag).contains(text) {
            assert!(
                Instant::now() < deadline,
                "consumer {tag} never logged {text:?}\n{}",
                self.all_errors()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What consumer `tag` logged (for failure messages).
    pub fn errors_of(&self, tag: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{tag}.err"))).unwrap_or_default()
    }

    /// Every consumer's log, for failure messages.
    pub fn all_errors(&self) -> String {
        let mut out = String::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(tag) = name.strip_suffix(".err") {
                out += &format!("--- consumer {tag}\n{}\n", self.errors_of(tag));
            }
        }
        out
    }

    /// `quota-gate consume` with `args` (and `--exec` this scanner, unless
    /// `args` name one), the variables `vars` (and PATH), its scanners' log
    /// going here, tagged `tag`; an `--exec` scanner is given the script's
    /// variables ([`SCANNER_VARS`]).
    pub fn consume(
        &self,
        tag: &str,
        args: &[&str],
        vars: &[(&str, &str)],
        stdin: Stdio,
    ) -> KillOnDrop {
        let errors = std::fs::File::create(self.dir.path().join(format!("{tag}.err"))).unwrap();
        let own_scanner = args.iter().any(|a| *a == "--exec" || *a == "--post");
        let exec = self.exec();
        let mut default_exec = if own_scanner {
            vec![]
        } else {
            vec!["--exec", exec.as_str()]
        };
        if !args.contains(&"--post") {
            default_exec.extend(["--scanner-env", SCANNER_VARS]);
        }
        let child = Command::new(bin("quota-gate"))
            .arg("consume")
            .args(default_exec)
            .arg("--no-emf")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("LOG", self.log())
            .env("RUNS", self.dir.path().join("runs"))
            .env("TAG", tag)
            .env("RUST_LOG", "info")
            .envs(vars.iter().copied())
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(errors)
            .spawn()
            .unwrap();
        KillOnDrop::new(child)
    }
}

/// What the scanner's log says about the jobs `expected` (scanId →
/// notBefore ms), checked against the consumer's promises: each ends
/// exactly once, none starts before its notBefore, no two attempts of one
/// scan run at once (unless `overlap_allowed`), nothing else ran.
pub fn assert_once_on_time(lines: &[Line], expected: &HashMap<String, i64>, overlap_allowed: bool) {
    if let Err(e) = once_on_time(lines, expected, overlap_allowed) {
        panic!("{e}\n{lines:#?}");
    }
}

/// [`assert_once_on_time`]'s check, saying what broke.
pub fn once_on_time(
    lines: &[Line],
    expected: &HashMap<String, i64>,
    overlap_allowed: bool,
) -> Result<(), String> {
    let mut ends: HashMap<&str, usize> = HashMap::new();
    for l in lines {
        let Some(not_before) = expected.get(&l.scan_id) else {
            return Err(format!("a scan nobody queued ran: {l:?}"));
        };
        match l.what.as_str() {
            "start" if l.at_ms < *not_before => {
                return Err(format!(
                    "{} started {} ms early",
                    l.scan_id,
                    not_before - l.at_ms
                ));
            }
            "end" => *ends.entry(&l.scan_id).or_default() += 1,
            "overlap" if !overlap_allowed => return Err(format!("two attempts at once: {l:?}")),
            _ => {}
        }
    }
    for id in expected.keys() {
        let n = ends.get(id.as_str()).copied().unwrap_or(0);
        if n != 1 {
            return Err(format!("{id} ended {n} times"));
        }
    }
    Ok(())
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A job as the gate writes it, due at `not_before_ms`, for `image`.
pub fn job_for(image: &str, not_before_ms: i64) -> Value {
    let at = |ms: i64| {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    json!({"version": 1, "scanId": uuid::Uuid::now_v7(), "receivedAt": at(now_ms()),
        "scope": "ip", "digest": "d", "tier": "soft", "limit": 1, "count": 2,
        "delayMs": 0, "deferredMs": 0, "notBefore": at(not_before_ms),
        "request": {"image": image}})
}

/// A job due at `not_before_ms`.
pub fn job(not_before_ms: i64) -> Value {
    job_for("alpine:3.20", not_before_ms)
}

/// `XADD key * job <json> scanId <id>`, as the gate does.
pub async fn xadd(valkey: &ValkeyServer, key: &str, job: &Value) {
    let id = job["scanId"].as_str().unwrap().to_owned();
    let mut cmd = redis::cmd("XADD");
    cmd.arg(key).arg("*").arg("job").arg(job.to_string());
    let _: String = valkey.query(cmd.arg("scanId").arg(id)).await;
}

/// Queues `jobs` and returns scanId → notBefore for [`assert_once_on_time`].
pub async fn queue_all(valkey: &ValkeyServer, key: &str, jobs: &[Value]) -> HashMap<String, i64> {
    for j in jobs {
        xadd(valkey, key, j).await;
    }
    not_befores(jobs)
}

/// scanId → notBefore (unix ms) of `jobs` (or of the gate's 202 bodies,
/// which name both too).
pub fn not_befores(jobs: &[Value]) -> HashMap<String, i64> {
    jobs.iter()
        .map(|j| {
            (
                j["scanId"].as_str().unwrap().to_owned(),
                crate::unix_ms(j["notBefore"].as_str().unwrap()),
            )
        })
        .collect()
}

/// `XLEN` of both lanes of the queue `key`.
pub async fn xlen(valkey: &ValkeyServer, key: &str) -> i64 {
    let mut n = 0;
    for lane in [Lane::Within, Lane::Over] {
        let len: i64 = valkey
            .query(redis::cmd("XLEN").arg(lane_key(key, lane)))
            .await;
        n += len;
    }
    n
}

/// Entries read by the group and not acknowledged, in both lanes of the
/// queue `key` (a lane's stream the consumer never created counts none).
pub async fn pending(valkey: &ValkeyServer, key: &str) -> i64 {
    let mut n = 0;
    for lane in [Lane::Within, Lane::Over] {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(lane_key(key, lane)).arg("quota-gate");
        let summary: redis::RedisResult<redis::Value> =
            cmd.query_async(&mut valkey.client().await).await;
        if let Ok(redis::Value::Array(v)) = summary
            && let Some(redis::Value::Int(held)) = v.first()
        {
            n += held;
        }
    }
    n
}

/// A Valkey server with the stream `jobs`, and a scanner: what most
/// consumer tests start from.
pub struct StreamRig {
    pub valkey: ValkeyServer,
    pub scanner: Scanner,
    vars: Vec<(String, String)>,
}

impl StreamRig {
    /// A fresh `valkey-server` and scanner.
    pub fn start() -> Self {
        Self::on(ValkeyServer::start())
    }

    /// `valkey` and a fresh scanner.
    pub fn on(valkey: ValkeyServer) -> Self {
        let vars = stream_vars(&valkey);
        Self {
            valkey,
            scanner: Scanner::new(),
            vars,
        }
    }

    /// [`stream_vars`], then `extra`.
    pub fn vars<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut vars = refs(&self.vars);
        vars.extend_from_slice(extra);
        vars
    }

    /// A consumer of the stream (stdin closed) with `args` and the variables
    /// `extra`, tagged `tag`, running this rig's scanner.
    pub fn consume(&self, tag: &str, args: &[&str], extra: &[(&str, &str)]) -> KillOnDrop {
        self.scanner
            .consume(tag, args, &self.vars(extra), Stdio::null())
    }

    /// [`Self::consume`] under libfaketime, its clock set by `faketime`
    /// (`FAKETIME…` variables; `FAKETIME_DONT_RESET` is given), and its
    /// shared memory removed with it ([`UnderFaketime`]).
    pub fn consume_under_faketime(
        &self,
        tag: &str,
        args: &[&str],
        faketime: &[(&str, &str)],
    ) -> UnderFaketime {
        let lib = libfaketime();
        let lib = lib.to_string_lossy();
        let mut vars = vec![("LD_PRELOAD", &*lib), ("FAKETIME_DONT_RESET", "1")];
        vars.extend_from_slice(faketime);
        UnderFaketime(self.consume(tag, args, &vars))
    }

    /// [`queue_all`] on the stream.
    pub async fn queue(&self, jobs: &[Value]) -> HashMap<String, i64> {
        queue_all(&self.valkey, "jobs", jobs).await
    }

    /// [`pending`] on the stream.
    pub async fn pending(&self) -> i64 {
        pending(&self.valkey, "jobs").await
    }
}

/// `VALKEY_URL` and `SCAN_QUEUE_URL=valkey-stream:jobs`.
pub fn stream_vars(valkey: &ValkeyServer) -> Vec<(String, String)> {
    vec![
        ("VALKEY_URL".into(), valkey.url()),
        ("SCAN_QUEUE_URL".into(), "valkey-stream:jobs".into()),
    ]
}

/// Borrowed pairs of owned ones.
pub fn refs(vars: &[(String, String)]) -> Vec<(&str, &str)> {
    vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `.tools/lib/libfaketime.so.1`, as `scripts/tools` installs it.
pub fn libfaketime() -> PathBuf {
    let lib = crate::root().join(".tools/lib/libfaketime.so.1");
    assert!(
        lib.exists(),
        "{} missing: run scripts/tools (scripts/test does)",
        lib.display()
    );
    lib
}

/// The shared memory libfaketime makes for a process it is preloaded into
/// (a semaphore and a segment under `/dev/shm`, named by that process's
/// pid), and shares with its children through `FAKETIME_SHARED`. The
/// process removes them when it exits, not when it is killed.
pub fn faketime_shm(pid: u32) -> [PathBuf; 2] {
    let shm = PathBuf::from("/dev/shm");
    [
        shm.join(format!("faketime_shm_{pid}")),
        shm.join(format!("sem.faketime_sem_{pid}")),
    ]
}

/// A process under libfaketime: killed on drop, like any ([`KillOnDrop`]),
/// and then rid of the shared memory libfaketime made for it
/// ([`faketime_shm`]). Its children do not make their own: they inherit
/// its `FAKETIME_SHARED`.
pub struct UnderFaketime(pub KillOnDrop);

impl Drop for UnderFaketime {
    fn drop(&mut self) {
        let pid = self.0.id();
        self.0.kill_now();
        for file in faketime_shm(pid) {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Sends `signal` (`TERM`, `KILL`, `STOP`, `CONT`) to process `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid} failed");
    if signal == "STOP" {
        wait_stopped(pid);
    }
}

/// Returns once every thread of `pid` is stopped: kill(2) only queues a
/// `SIGSTOP`, and a thread running on another core can still answer a
/// request before it takes it.
fn wait_stopped(pid: u32) {
    // Gone counts as stopped (nothing left to answer); any other error of
    // reading /proc does not.
    let gone = |e: std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let thread_stopped = |task: std::io::Result<std::fs::DirEntry>| {
        let Ok(task) = task else { return false };
        match std::fs::read_to_string(task.path().join("stat")) {
            // The state follows the command's closing parenthesis.
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with(['T', 't'])),
            Err(e) => gone(e),
        }
    };
    let stopped = || match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(mut tasks) => tasks.all(thread_stopped),
        Err(e) => gone(e),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !stopped() {
        assert!(Instant::now() < deadline, "{pid} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}
