//! The operator subcommands' arguments and runners. Results go to stdout; warnings and progress
//! go to stderr.

use std::io::IsTerminal;

use clap::Args;
use serde::Serialize;
use time::OffsetDateTime;

use super::change;
use super::network;
use super::progress::Progress;
use super::subject::{self, SubjectArg};
use super::{OpsError, purge, stats, valkey_store};
use crate::config::Config;

/// Which client: exactly one of `--ip`, `--token` or `--account`; or,
/// with `--network`, one level above the subjects.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct SubjectArgs {
    /// The client's source address, as the gateway saw it (normalised as the handler does).
    #[arg(long, value_name = "ADDR")]
    pub ip: Option<String>,
    /// A JWT (verified with the configured keys) or a bare token id; `-` reads it from stdin,
    /// which keeps it out of the shell history.
    #[arg(long, value_name = "JWT|TID")]
    pub token: Option<String>,
    /// An account, as the QUOTA_JWT_ACCOUNT_CLAIM claim names it: the one counter all its
    /// tokens share.
    #[arg(long, value_name = "ACCOUNT")]
    pub account: Option<String>,
    /// One network level: a CIDR of a configured length of QUOTA_NETWORKS (`203.0.113.0/24`,
    /// `2001:db8:1::/48`), or `tid:<CIDR>` for its token holders' level (QUOTA_TOKEN_NETWORKS).
    #[arg(long, value_name = "CIDR")]
    pub network: Option<String>,
}

impl SubjectArgs {
    /// The client named; clap lets exactly one of the group through, and `--network` is taken
    /// before this.
    fn into_arg(self) -> Result<SubjectArg, OpsError> {
        match (self.ip, self.token, self.account) {
            (Some(ip), ..) => Ok(SubjectArg::Ip(ip)),
            (_, Some(t), _) if t == "-" => std::io::read_to_string(std::io::stdin())
                .map(SubjectArg::Token)
                .map_err(|e| OpsError::Usage(format!("--token -: cannot read stdin: {e}"))),
            (_, Some(t), _) => Ok(SubjectArg::Token(t)),
            (_, _, Some(account)) => Ok(SubjectArg::Account(account)),
            _ => Err(OpsError::Usage("give --ip, --token or --account".into())),
        }
    }
}

/// `inspect` and `reset`: one client or level.
#[derive(Debug, Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub subject: SubjectArgs,
    /// Print JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GrantArgs {
    #[command(flatten)]
    pub subject: SubjectArgs,
    /// Extra scans for the current period, 1 to 1000000 (replaces an earlier grant).
    #[arg(
        long,
        value_name = "N",
        required_unless_present = "revoke",
        conflicts_with = "revoke"
    )]
    pub scans: Option<u64>,
    /// Take the subject's grant back.
    #[arg(long)]
    pub revoke: bool,
    /// Print JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Only count the quota:* keys.
    #[arg(long)]
    pub dry_run: bool,
    /// Really remove them (always required, except with --dry-run).
    #[arg(long)]
    pub yes: bool,
    /// Print JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The window to read, ending now: a number and s, m, h or d.
    #[arg(long, default_value = "24h", value_name = "DURATION", value_parser = stats::parse_since)]
    pub since: std::time::Duration,
    /// Print JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

fn print<T: Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce(&T) -> String,
) -> Result<(), OpsError> {
    if json {
        let line = serde_json::to_string_pretty(value)
            .map_err(|e| OpsError::Usage(format!("cannot encode JSON: {e}")))?;
        println!("{line}");
    } else {
        print!("{}", text(value));
    }
    Ok(())
}

/// `quota-gate inspect`.
pub async fn inspect(args: ClientArgs, config: &Config) -> Result<(), OpsError> {
    if let Some(cidr) = &args.subject.network {
        let report = network::inspect_network(config, cidr).await?;
        return print(args.json, &report, super::level_report::LevelReport::render);
    }
    let arg = args.subject.into_arg()?;
    let subject = subject::resolve(config, &arg)?;
    let levels = match &arg {
        SubjectArg::Ip(raw) => network::of_ip(config, raw)?,
        SubjectArg::Token(_) | SubjectArg::Account(_) => Vec::new(),
    };
    let store = valkey_store(config)?;
    let mut report = subject::inspect(&store, config, &subject).await?;
    report.levels = network::inspect(&store, config, &levels).await?;
    print(args.json, &report, subject::Inspection::render)
}

/// `quota-gate reset`.
pub async fn reset(args: ClientArgs, config: &Config) -> Result<(), OpsError> {
    if let Some(cidr) = &args.subject.network {
        let removal = network::reset(config, cidr).await?;
        return print(args.json, &removal, network::render_removal);
    }
    let subject = subject::resolve(config, &args.subject.into_arg()?)?;
    let store = valkey_store(config)?;
    let removal = change::reset(&store, &subject).await?;
    print(args.json, &removal, change::Removal::render)
}

/// `quota-gate grant`.
pub async fn grant(args: GrantArgs, config: &Config) -> Result<(), OpsError> {
    let scans = args.scans.map_or(Ok(0), change::check_scans)?;
    if let Some(cidr) = &args.subject.network {
        let granted = network::grant(config, cidr, scans).await?;
        return print(args.json, &granted, change::Granted::render);
    }
    let subject = subject::resolve(config, &args.subject.into_arg()?)?;
    let store = valkey_store(config)?;
    let granted = change::grant(&store, &subject, scans, config.policy.reset).await?;
    print(args.json, &granted, change::Granted::render)
}

/// `quota-gate purge`.
pub async fn purge(args: PurgeArgs, config: &Config) -> Result<(), OpsError> {
    purge::check_consent(args.dry_run, args.yes, std::io::stdin().is_terminal())?;
    let store = valkey_store(config)?;
    let verb = if args.dry_run { "found" } else { "removed" };
    let report = purge::purge(store, args.dry_run, Some(Progress::stderr(verb))).await?;
    print(args.json, &report, purge::PurgeReport::render)
}

/// `quota-gate stats`, with the AWS configuration from the environment.
pub async fn stats(args: StatsArgs, config: &Config) -> Result<(), OpsError> {
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    stats::preflight(&sdk).await?;
    let client = aws_sdk_cloudwatch::Client::new(&sdk);
    let namespace = &config.metrics_namespace;
    let report = stats::stats(&client, namespace, args.since, OffsetDateTime::now_utc()).await?;
    print(args.json, &report, stats::Stats::render)
}
