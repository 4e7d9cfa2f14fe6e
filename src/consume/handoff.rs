//! Handing a due job to the scanner. `--exec` runs `sh -c <command>` under a
//! [`guard`](super::guard), the job's JSON on standard input, `SCAN_ID`, `SCAN_ATTEMPT`, `IMAGE`
//! and its trace in an otherwise bare environment (it handles untrusted images: [`scanner_env`]);
//! exit 0 means done. `--post` POSTs the job JSON; any 2xx means done. A stopped `--exec` returns
//! once no process of the attempt runs; a stopped or unanswered `--post` may have landed, and the
//! scanner gets the same `scanId` again with a higher attempt number.

use std::ffi::OsString;
use std::future::Future;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process, kill_process_group};
use tokio::io::AsyncWriteExt;

use super::post::Post;
use super::schedule::{HandOff, Stop};
use super::source::Delivery;
use crate::rules::trace::{TRACEPARENT_ENV, TRACESTATE_ENV, TraceContext, XRAY_ENV};

/// The scanner.
#[derive(Debug, Clone)]
pub enum Handoff {
    /// `sh -c command`, its environment `env` (see [`scanner_env`]) and the job's.
    Exec {
        command: String,
        env: Vec<(OsString, OsString)>,
    },
    /// Boxed: the client is large, and built once.
    Post(Box<Post>),
}

impl Handoff {
    /// `--post`'s scanner: see [`Post::new`].
    pub fn post(url: &str, ca: Option<&Path>) -> Result<Self, String> {
        Post::new(url, ca).map(|post| Self::Post(Box::new(post)))
    }
}

/// The consumer's variables every `--exec` scanner gets, if set: what a shell and its tools need.
pub const SCANNER_ENV: [&str; 6] = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ"];

/// The variables an `--exec` scanner starts from: [`SCANNER_ENV`] and `named`, those set.
pub fn scanner_env(named: &[String]) -> Vec<(OsString, OsString)> {
    let names = SCANNER_ENV
        .into_iter()
        .chain(named.iter().map(String::as_str));
    names
        .filter_map(|name| Some((name.into(), std::env::var_os(name)?)))
        .collect()
}

/// How a hand-off ended without the scanner taking the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ended {
    /// The scanner said no (non-zero exit, non-2xx), or could not be reached.
    #[error("{0}")]
    Failed(String),
    /// The consumer stopped it; for `--exec` the scanner is gone.
    #[error("stopped: {0}")]
    Stopped(Stop),
}

/// One attempt at a delivery: what a scanner is handed.
#[derive(Debug)]
pub struct Attempt<'a, H> {
    pub delivery: &'a Delivery<H>,
    /// Its number (`SCAN_ATTEMPT`, `x-scan-attempt`), from the `scanId` marker.
    pub number: u64,
}

/// What stops a running hand-off: a future that ends with the reason.
pub trait StopSignal: Future<Output = Stop> + Send {}

impl<F: Future<Output = Stop> + Send> StopSignal for F {}

/// Runs one attempt of a job; the worker is generic over it so it is tested without processes.
pub trait Scanner: Send + Sync + 'static {
    /// Hands `attempt` over, until done, failed, or `stop` ends.
    fn run<H: Sync>(
        &self,
        attempt: Attempt<'_, H>,
        stop: impl StopSignal,
    ) -> impl Future<Output = Result<(), Ended>> + Send;
}

impl Scanner for Handoff {
    async fn run<H: Sync>(&self, a: Attempt<'_, H>, stop: impl StopSignal) -> Result<(), Ended> {
        match self {
            Self::Exec { command, env } => exec(command, env, a.delivery, a.number, stop).await,
            Self::Post(target) => tokio::select! {
                done = target.send(a.delivery, a.number) => done.map_err(Ended::Failed),
                why = stop => Err(Ended::Stopped(why)),
            },
        }
    }
}

/// How long a stopped guard may take to reap the scanner's descendants before it is killed.
const GUARD_STOP: Duration = Duration::from_secs(5);

/// A running guard, told to stop when dropped; cleared once waited for, as its pid may be reused.
struct Guard(Option<Pid>);

impl Guard {
    fn stop(&self) {
        if let Some(pid) = self.0 {
            // ESRCH: it is gone already.
            let _ = kill_process(pid, Signal::TERM);
        }
    }

    /// Stops the guard and waits for it; one not gone within [`GUARD_STOP`] has its group killed.
    async fn stop_and_wait(&mut self, child: &mut tokio::process::Child) {
        self.stop();
        let waited = tokio::time::timeout(GUARD_STOP, child.wait()).await;
        if waited.is_err() {
            if let Some(pid) = self.0 {
                let _ = kill_process_group(pid, Signal::KILL);
            }
            let _ = child.wait().await;
        }
        self.0 = None;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn exec<H>(
    command: &str,
    env: &[(OsString, OsString)],
    d: &Delivery<H>,
    attempt: u64,
    stop: impl Future<Output = Stop>,
) -> Result<(), Ended> {
    let exe = std::env::current_exe()
        .map_err(|e| Ended::Failed(format!("cannot find quota-gate's own binary: {e}")))?;
    let parent = std::process::id().to_string();
    let mut child = tokio::process::Command::new(exe);
    child
        .args([super::guard::COMMAND, "--parent", &parent, "--", command])
        // The job's variables after the allowed ones: the job's win.
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("SCAN_ID", d.job.scan_id.to_string())
        .env("SCAN_ATTEMPT", attempt.to_string())
        .env("IMAGE", d.job.image().unwrap_or_default())
        .stdin(Stdio::piped())
        .process_group(0);
    trace_env(&mut child, d.job.trace.as_ref());
    let mut child = child
        .spawn()
        .map_err(|e| Ended::Failed(format!("cannot run the scanner: {e}")))?;
    let mut guard = Guard(super::guard::pid_of(&child));
    let stdin = child.stdin.take();
    let scan = async {
        if let Some(mut stdin) = stdin {
            // A scanner may close its input early; its exit status decides.
            let _ = stdin.write_all(d.json.as_bytes()).await;
            let _ = stdin.write_all(b"\n").await;
        }
        child.wait().await
    };
    let status = tokio::select! {
        biased;
        status = scan => status,
        why = stop => {
            guard.stop_and_wait(&mut child).await;
            return Err(Ended::Stopped(why));
        }
    };
    // The guard has exited, after the scanner and all it started.
    guard.0 = None;
    match status {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(Ended::Failed(format!("scanner exited with {status}"))),
        Err(e) => Err(Ended::Failed(format!("scanner lost: {e}"))),
    }
}

/// The job's trace in the scanner's environment; without one, the consumer's own is removed.
fn trace_env(command: &mut tokio::process::Command, trace: Option<&TraceContext>) {
    for name in [TRACEPARENT_ENV, TRACESTATE_ENV, XRAY_ENV] {
        command.env_remove(name);
    }
    let Some(trace) = trace else { return };
    command
        .env(TRACEPARENT_ENV, trace.traceparent().as_str())
        .env(XRAY_ENV, trace.xray_header().as_str());
    if let Some(state) = trace.tracestate() {
        command.env(TRACESTATE_ENV, state);
    }
}

/// How a hand-off ended, as [`schedule::after_hand_off`] takes it.
pub(super) fn hand_off_of(ended: &Result<(), Ended>) -> HandOff {
    match ended {
        Ok(()) => HandOff::Took,
        Err(Ended::Failed(_)) => HandOff::Refused,
        Err(Ended::Stopped(stop)) => HandOff::Stopped(*stop),
    }
}
