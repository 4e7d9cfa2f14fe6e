//! `stats`: what the gate metered, read back from CloudWatch. Each query uses one period spanning
//! the whole window, so percentiles need no merging; the delay's SampleCount counts the scans.

use std::time::Duration;

use aws_sdk_cloudwatch::Client;
use aws_sdk_cloudwatch::primitives::DateTime;
use aws_sdk_cloudwatch::types::{Dimension, Metric, MetricDataQuery, MetricStat};
use serde::Serialize;
use time::OffsetDateTime;

use super::OpsError;
use crate::io::clock::rfc3339;
use crate::io::meter::{DELAY_MS, ENQUEUE_ERRORS, HARD_HITS, REMINDERS, SOFT_HITS, STORE_ERRORS};
use crate::rules::scope::Scope;

/// The longest window: CloudWatch keeps hourly data for 455 days.
const MAX_WINDOW: Duration = Duration::from_secs(455 * crate::rules::unix::DAY_SECS.unsigned_abs());

/// How long the credential chain may look before `stats` says there are no credentials.
const CREDENTIALS_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks that the AWS SDK has a region and credentials, for one short sentence instead of the
/// SDK's error chain.
pub async fn preflight(sdk: &aws_config::SdkConfig) -> Result<(), OpsError> {
    use aws_sdk_cloudwatch::config::ProvideCredentials;
    if sdk.region().is_none() {
        return Err(OpsError::Usage(
            "stats reads CloudWatch and needs an AWS region: set AWS_REGION \
             (or AWS_PROFILE with a region in ~/.aws/config)"
                .into(),
        ));
    }
    let no_credentials = || {
        OpsError::Usage(
            "stats reads CloudWatch and needs AWS credentials: set AWS_PROFILE, or \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (cloudwatch:GetMetricData)"
                .into(),
        )
    };
    let provider = sdk.credentials_provider().ok_or_else(no_credentials)?;
    match tokio::time::timeout(CREDENTIALS_TIMEOUT, provider.provide_credentials()).await {
        Ok(Ok(_)) => Ok(()),
        _ => Err(no_credentials()),
    }
}

/// Parses `--since` with `humantime` (`24h`, `7d`, `1h 30m`) while the command line is read, so a
/// bad window is a usage error (exit 2).
pub fn parse_since(raw: &str) -> Result<Duration, String> {
    let window = humantime::parse_duration(raw.trim())
        .map_err(|e| format!("expected a duration like 24h, 90m or 7d ({e}); got {raw:?}"))?;
    if window < Duration::from_secs(60) || window > MAX_WINDOW {
        return Err(format!(
            "between 1m and 455d (CloudWatch's periods and retention); got {raw:?}"
        ));
    }
    Ok(window)
}

/// One scope's figures over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopeStats {
    pub scope: &'static str,
    /// Scans with a quota decision.
    pub scans: u64,
    pub soft_hits: u64,
    pub hard_hits: u64,
    pub reminders: u64,
    pub store_errors: u64,
    pub enqueue_errors: u64,
    /// `None` when no delay was recorded or the backend computes no percentiles.
    pub p95_delay_ms: Option<f64>,
}

/// The `stats` report (also its `--json` form).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub namespace: String,
    pub start: String,
    pub end: String,
    pub scopes: Vec<ScopeStats>,
    /// Why the p95 figures are missing.
    pub p95_error: Option<String>,
}

/// What each query asks for, in the order of [`ScopeStats`]'s fields.
const QUERIES: [(&str, &str); 7] = [
    (DELAY_MS, "SampleCount"),
    (SOFT_HITS, "Sum"),
    (HARD_HITS, "Sum"),
    (REMINDERS, "Sum"),
    (STORE_ERRORS, "Sum"),
    (ENQUEUE_ERRORS, "Sum"),
    (DELAY_MS, "p95"),
];

/// Reads the window `[end - since, end)` of `namespace`.
pub async fn stats(
    client: &Client,
    namespace: &str,
    since: Duration,
    end: OffsetDateTime,
) -> Result<Stats, OpsError> {
    // A period must be a multiple of 60 s.
    let period = since.as_secs().div_ceil(60).max(1) * 60;
    let period =
        i32::try_from(period).map_err(|_| OpsError::Usage("--since: window too long".into()))?;
    let end_secs = end.unix_timestamp();
    let start_secs = end_secs - i64::from(period);
    let (counts, percentiles) = queries(namespace, period);
    let mut values: Vec<Vec<f64>> = vec![Vec::new(); SCOPES.len() * QUERIES.len()];
    let window = (start_secs, end_secs);
    fetch(client, window, counts, &mut values).await?;
    // Asked apart, so an endpoint without extended statistics still gives the counts.
    let p95_error = fetch(client, window, percentiles, &mut values)
        .await
        .err()
        .map(|e| e.to_string());
    Ok(Stats {
        namespace: namespace.to_owned(),
        start: rfc3339(start_secs),
        end: rfc3339(end_secs),
        scopes: scope_stats(&values),
        p95_error,
    })
}

/// The scopes reported, in the order of the query slots.
const SCOPES: [Scope; 2] = [Scope::Ip, Scope::Tid];

/// Every query for every scope, by slot: the counts, and the percentiles.
fn queries(namespace: &str, period: i32) -> (Vec<MetricDataQuery>, Vec<MetricDataQuery>) {
    let (percentiles, counts): (Vec<usize>, Vec<usize>) = (0..SCOPES.len() * QUERIES.len())
        .partition(|slot| QUERIES[slot % QUERIES.len()].1.starts_with('p'));
    let build = |slots: Vec<usize>| slots.into_iter().map(|slot| query(namespace, period, slot));
    (build(counts).collect(), build(percentiles).collect())
}

fn scope_stats(values: &[Vec<f64>]) -> Vec<ScopeStats> {
    let sum = |slot: usize| -> u64 { values[slot].iter().sum::<f64>().round() as u64 };
    SCOPES
        .iter()
        .enumerate()
        .map(|(s, scope)| {
            let base = s * QUERIES.len();
            ScopeStats {
                scope: scope.as_str(),
                scans: sum(base),
                soft_hits: sum(base + 1),
                hard_hits: sum(base + 2),
                reminders: sum(base + 3),
                store_errors: sum(base + 4),
                enqueue_errors: sum(base + 5),
                // Should the window straddle two periods, the larger p95 is the honest bound.
                p95_delay_ms: values[base + 6].iter().copied().reduce(f64::max),
            }
        })
        .collect()
}

/// Runs `queries` over the `(start, end)` window (unix seconds) and appends each result's values
/// to its slot.
async fn fetch(
    client: &Client,
    (start, end): (i64, i64),
    queries: Vec<MetricDataQuery>,
    values: &mut [Vec<f64>],
) -> Result<(), OpsError> {
    let mut pages = client
        .get_metric_data()
        .start_time(DateTime::from_secs(start))
        .end_time(DateTime::from_secs(end))
        .set_metric_data_queries(Some(queries))
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| {
            OpsError::CloudWatch(aws_sdk_cloudwatch::error::DisplayErrorContext(e).to_string())
        })?;
        for result in page.metric_data_results() {
            let slot = result.id().and_then(query_index);
            if let Some(v) = slot.and_then(|slot| values.get_mut(slot)) {
                v.extend_from_slice(result.values());
            }
        }
    }
    Ok(())
}

/// `q<slot>`: CloudWatch wants an id with a lowercase first letter.
fn query_id(slot: usize) -> String {
    format!("q{slot}")
}

fn query_index(id: &str) -> Option<usize> {
    id.strip_prefix('q')?.parse().ok()
}

/// The query of `slot`: of scope `slot / QUERIES.len()`, asking query `slot % QUERIES.len()`.
fn query(namespace: &str, period: i32, slot: usize) -> MetricDataQuery {
    let (scope, (metric, stat)) = (SCOPES[slot / QUERIES.len()], QUERIES[slot % QUERIES.len()]);
    let dimension = Dimension::builder()
        .name("Scope")
        .value(scope.as_str())
        .build();
    let metric = Metric::builder()
        .namespace(namespace)
        .metric_name(metric)
        .dimensions(dimension)
        .build();
    let stat = MetricStat::builder()
        .metric(metric)
        .period(period)
        .stat(stat)
        .build();
    MetricDataQuery::builder()
        .id(query_id(slot))
        .metric_stat(stat)
        .return_data(true)
        .build()
}

impl Stats {
    /// The human form: one row per scope.
    pub fn render(&self) -> String {
        let mut out = format!("{} from {} to {}\n", self.namespace, self.start, self.end);
        out.push_str(&row([
            "scope",
            "scans",
            "soft hits",
            "hard hits",
            "reminders",
            "store errors",
            "enqueue errors",
            "p95 delay",
        ]));
        for s in &self.scopes {
            let p95 = s.p95_delay_ms.map(|v| format!("{v:.0} ms"));
            out.push_str(&row([
                s.scope.to_owned(),
                s.scans.to_string(),
                s.soft_hits.to_string(),
                s.hard_hits.to_string(),
                s.reminders.to_string(),
                s.store_errors.to_string(),
                s.enqueue_errors.to_string(),
                p95.unwrap_or_else(|| "-".to_owned()),
            ]));
        }
        if let Some(e) = &self.p95_error {
            out.push_str(&format!("p95 delay unavailable: {e}\n"));
        }
        out
    }
}

/// One row of the table, in its columns.
fn row<T: std::fmt::Display>([a, b, c, d, e, f, g, h]: [T; 8]) -> String {
    format!("{a:<5} {b:>9} {c:>9} {d:>9} {e:>9} {f:>12} {g:>14} {h:>12}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows parse as humantime durations, within CloudWatch's bounds.
    #[test]
    fn since() {
        assert_eq!(parse_since("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_since("90m").unwrap(), Duration::from_secs(5_400));
        assert_eq!(parse_since("7d").unwrap(), Duration::from_secs(604_800));
        assert_eq!(parse_since("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_since("24 hours").unwrap(),
            Duration::from_secs(86_400)
        );
        assert_eq!(parse_since("1h 30m").unwrap(), Duration::from_secs(5_400));
        for bad in ["", "24", "h", "-1h", "30s", "500d", "99999999999999999999d"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    /// Query ids round-trip to their slot.
    #[test]
    fn ids() {
        for slot in 0..SCOPES.len() * QUERIES.len() {
            assert_eq!(query_index(&query_id(slot)), Some(slot));
        }
        assert_eq!(query_index("x1"), None);
    }
}
