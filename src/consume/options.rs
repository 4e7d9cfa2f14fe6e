//! `quota-gate consume`'s command line, read into what the consumer is built from; every bad
//! combination is refused before anything starts.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use super::handoff::{Handoff, scanner_env};
use super::schedule::RetryPolicy;
use crate::config::QueueTarget;

/// `quota-gate consume` options.
#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    /// Jobs' source: `-` (stdin), `valkey-stream:<key>` or an SQS URL. Default: SCAN_QUEUE_URL.
    #[arg(long)]
    pub from: Option<String>,
    /// The over lane's SQS queue. Default: SCAN_QUEUE_OVER_URL, when reading the gate's own queue.
    #[arg(long)]
    pub from_over: Option<String>,
    /// The scanner command (`sh -c`, in its own process group): job JSON on stdin, SCAN_ID,
    /// SCAN_ATTEMPT, IMAGE and the job's trace in its environment; exit 0 = done. Of the consumer's
    /// environment it gets only PATH, HOME, LANG, LC_ALL, TMPDIR, TZ and --scanner-env.
    #[arg(long, required_unless_present = "post", conflicts_with = "post")]
    pub exec: Option<String>,
    /// A consumer variable to pass on to the --exec scanner (repeatable, or comma-separated).
    #[arg(
        long,
        value_name = "NAME",
        value_delimiter = ',',
        value_parser = env_name,
        conflicts_with = "post"
    )]
    pub scanner_env: Vec<String>,
    /// The scanner URL (http:// or https://) the job JSON is POSTed to; 2xx = done.
    #[arg(long)]
    pub post: Option<String>,
    /// PEM file of the only CA certificates an https:// --post scanner is checked against.
    #[arg(long, requires = "post")]
    pub post_ca: Option<PathBuf>,
    /// Hand-offs running at once.
    #[arg(long, default_value = "4")]
    pub concurrency: NonZeroUsize,
    /// While both lanes wait for a slot, every Nth start goes to an over-quota job.
    #[arg(long, default_value = "4")]
    pub over_every: NonZeroU32,
    /// Jobs read and not yet finished (held or running), at most; on a stream, per lane.
    #[arg(long, default_value = "1024")]
    pub max_held: NonZeroUsize,
    /// The stream's consumer group.
    #[arg(long, default_value = "quota-gate")]
    pub group: String,
    /// This consumer's name in the group. Default: `<host>-<pid>`.
    #[arg(long)]
    pub consumer: Option<String>,
    /// How long a job stays with a consumer that stopped renewing it (at least 1 s).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// Failed hand-offs before a job is dead-lettered (`<stream>:dead`).
    #[arg(long, default_value = "5")]
    pub max_attempts: NonZeroU32,
    /// The wait after the first failure, doubled after each (at most 5 min).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff: Duration,
    /// How long one scan may run; then its scanner is killed and the attempt failed.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub scan_timeout: Duration,
    /// How long running hand-offs may take to finish after SIGTERM.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// With `--from -`: journal every job read here (fsync'd) and replay unfinished ones at start.
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// Serve Prometheus text at GET /metrics on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Answer GET /healthz (alive) and GET /readyz (its Valkey answers) on this address.
    #[arg(long)]
    pub health_listen: Option<SocketAddr>,
    /// No EMF metric lines on stdout.
    #[arg(long)]
    pub no_emf: bool,
}

const BACKOFF_CAP: Duration = Duration::from_secs(300);

impl ConsumeArgs {
    /// `--from`, else the gate's own queue; a `--journal` only with the spool.
    pub fn source(&self, queue: &QueueTarget) -> Result<QueueTarget, String> {
        let target = resolve(self.from.as_deref(), queue)?;
        if self.journal.is_some() && target != QueueTarget::Spool {
            return Err("--journal is for --from - (the spool) only".into());
        }
        if self.from_over.is_some() && !matches!(target, QueueTarget::Sqs(_)) {
            return Err("--from-over is for an SQS queue only (a stream has its lanes)".into());
        }
        Ok(target)
    }

    /// The scanner `--exec` or `--post` names, once `--lease` is checked.
    pub fn handoff(&self) -> Result<Handoff, String> {
        if self.lease < Duration::from_secs(1) {
            return Err("--lease must be at least 1s".into());
        }
        match (&self.exec, &self.post) {
            (Some(command), None) => Ok(Handoff::Exec {
                command: command.clone(),
                env: scanner_env(&self.scanner_env),
            }),
            (None, Some(url)) => Handoff::post(url, self.post_ca.as_deref()),
            _ => Err("give one of --exec or --post".into()),
        }
    }

    /// `--from-over`, else the gate's own (`SCAN_QUEUE_OVER_URL`) if `--from` names no other queue.
    pub fn over_lane(&self, config: &crate::Config) -> Result<Option<String>, String> {
        match &self.from_over {
            Some(url) => match QueueTarget::from_url(url) {
                Ok(QueueTarget::Sqs(url)) => Ok(Some(url)),
                _ => Err(format!("--from-over {url}: expected an SQS queue URL")),
            },
            None if self.from.is_none() => Ok(config.queue_over.clone()),
            None => Ok(None),
        }
    }

    /// `--consumer`, else `<host>-<pid>`.
    pub fn consumer_name(&self) -> String {
        self.consumer.clone().unwrap_or_else(default_consumer)
    }

    /// `--max-attempts` and `--backoff`, the wait capped at `BACKOFF_CAP`.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts,
            base: self.backoff,
            cap: BACKOFF_CAP,
        }
    }
}

/// What `--from` names, else the gate's own queue.
fn resolve(from: Option<&str>, queue: &QueueTarget) -> Result<QueueTarget, String> {
    match from {
        None => Ok(queue.clone()),
        Some("-") => Ok(QueueTarget::Spool),
        Some(s) => QueueTarget::from_url(s).map_err(|e| format!("--from {s}: {e}, or -")),
    }
}

/// A `--scanner-env` name: one a variable can have.
fn env_name(name: &str) -> Result<String, String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return Err("not a variable's name (empty, or holds '=' or NUL)".into());
    }
    Ok(name.to_owned())
}

/// `<host>-<pid>`: unique among live consumers, readable in `XINFO CONSUMERS`.
fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "consumer".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--from` overrides the gate's queue; without it the consumer reads where the gate writes.
    #[test]
    fn sources() {
        let sqs = "https://sqs.us-east-1.amazonaws.com/1/scans";
        let stream = QueueTarget::ValkeyStream("jobs".into());
        assert_eq!(resolve(None, &QueueTarget::Spool), Ok(QueueTarget::Spool));
        assert_eq!(
            resolve(None, &stream),
            Ok(QueueTarget::ValkeyStream("jobs".into()))
        );
        assert_eq!(resolve(Some("-"), &stream), Ok(QueueTarget::Spool));
        assert_eq!(
            resolve(Some(sqs), &stream),
            Ok(QueueTarget::Sqs(sqs.into()))
        );
        assert_eq!(
            resolve(Some("valkey-stream:a{b}"), &QueueTarget::Spool),
            Ok(QueueTarget::ValkeyStream("a{b}".into()))
        );
        assert!(resolve(Some("valkey-stream:"), &stream).is_err());
        assert!(resolve(Some("ftp://x"), &stream).is_err());
    }

    #[derive(Debug, clap::Parser)]
    struct Consume {
        #[command(flatten)]
        args: ConsumeArgs,
    }

    fn parse(args: &[&str]) -> Result<ConsumeArgs, clap::Error> {
        let all = ["consume", "--exec", "true"].iter().chain(args);
        <Consume as clap::Parser>::try_parse_from(all).map(|c| c.args)
    }

    /// `--scanner-env` is repeatable and takes lists; a name no variable can
    /// have is a usage error that names the flag, and it is for `--exec` only.
    #[test]
    fn scanner_env_names() {
        let args = parse(&["--scanner-env", "A", "--scanner-env", "B,C_1"]).unwrap();
        assert_eq!(args.scanner_env, ["A", "B", "C_1"]);
        assert!(parse(&[]).unwrap().scanner_env.is_empty());
        for bad in ["", "A=B", "A,,B", "A\0B"] {
            let e = parse(&["--scanner-env", bad]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
            assert!(e.to_string().contains("--scanner-env"), "{e}");
            assert_eq!(e.exit_code(), 2);
        }
        let post = ["consume", "--post", "http://x/", "--scanner-env", "A"];
        assert!(<Consume as clap::Parser>::try_parse_from(post).is_err());
    }
}
