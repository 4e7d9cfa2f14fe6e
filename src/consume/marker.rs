//! The `scanId` markers that make each scan run once.
//!
//! Before a hand-off, an attempt claims the scan's marker with a lease
//! (renewed while the scanner runs); on success the marker is kept as
//! `done` for [`DONE_TTL_SECS`], on failure released. Any consumer that
//! meets the same `scanId` later (a redelivery, a reclaimed entry, a job
//! queued twice) sees `done` and acknowledges without running it.
//!
//! With Valkey the marker is a key beside the stream, under its hash tag
//! (`{<stream>}:run:<scanId>`, or `<stream>:run:<scanId>` when the key has
//! a tag of its own), so it works on a cluster; an SQS consumer with
//! `VALKEY_URL` set uses `{sqs:<queue name>}:run:<scanId>`. Without Valkey
//! (SQS alone, or the spool) the markers live in the process: a scan runs
//! once per consumer process, and two processes reading one SQS queue
//! without Valkey may both run a message SQS delivers twice.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use super::schedule::{self, Claim, Marker};
use crate::connection::Valkey;

/// How long a done marker is kept: as long as the gate keeps a keyed
/// request's record, after which a retry is a new scan anyway.
pub const DONE_TTL_SECS: i64 = crate::store::IDEMPOTENCY_TTL_SECS;

/// Done markers an in-process store keeps before forgetting the oldest.
const LOCAL_DONE: usize = 100_000;

const CLAIM: &str = include_str!("claim.lua");
const RELEASE: &str = include_str!("release.lua");

/// Where markers live.
#[derive(Clone)]
pub enum Markers {
    Valkey { valkey: Valkey, prefix: String },
    Local(Arc<Mutex<Local>>),
}

/// In-process markers.
#[derive(Default)]
pub struct Local {
    markers: HashMap<Uuid, Marker>,
    done: VecDeque<Uuid>,
}

/// `{key}` unless `key` carries a non-empty hash tag already.
pub fn tagged(key: &str) -> String {
    let has_tag = key
        .find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0);
    if has_tag {
        key.to_owned()
    } else {
        format!("{{{key}}}")
    }
}

impl Markers {
    /// Markers in Valkey, beside `key` (a stream key, or `sqs:<name>`).
    pub fn valkey(valkey: Valkey, key: &str) -> Self {
        Self::Valkey {
            valkey,
            prefix: format!("{}:run:", tagged(key)),
        }
    }

    /// Markers in this process only.
    pub fn local() -> Self {
        Self::Local(Arc::default())
    }

    /// Claims (or renews) `scan`'s marker for the attempt `token`.
    pub async fn claim(&self, scan: Uuid, token: &str, lease: Duration) -> Result<Claim, String> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        match self {
            Self::Valkey { valkey, prefix } => {
                let answer: i64 = run(valkey, CLAIM, &format!("{prefix}{scan}"), |c| {
                    c.arg(token).arg(lease_ms);
                })
                .await?;
                Ok(match answer {
                    1 => Claim::Claimed,
                    0 => Claim::Done,
                    _ => Claim::Busy,
                })
            }
            Self::Local(local) => {
                let mut local = local.lock().map_err(|e| e.to_string())?;
                let current = local.markers.get(&scan).cloned().unwrap_or(Marker::Free);
                let (next, answer) = schedule::claim(&current, token, super::now_ms(), lease_ms);
                local.markers.insert(scan, next);
                Ok(answer)
            }
        }
    }

    /// Keeps `scan`'s marker as done.
    pub async fn done(&self, scan: Uuid) -> Result<(), String> {
        match self {
            Self::Valkey { valkey, prefix } => {
                let mut conn = valkey.connection().await.map_err(|e| e.to_string())?;
                redis::cmd("SET")
                    .arg(format!("{prefix}{scan}"))
                    .arg("done")
                    .arg("EX")
                    .arg(DONE_TTL_SECS)
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| e.to_string())
            }
            Self::Local(local) => {
                let mut local = local.lock().map_err(|e| e.to_string())?;
                local.markers.insert(scan, Marker::Done);
                local.done.push_back(scan);
                while local.done.len() > LOCAL_DONE {
                    if let Some(old) = local.done.pop_front() {
                        local.markers.remove(&old);
                    }
                }
                Ok(())
            }
        }
    }

    /// Releases `scan`'s marker if the attempt `token` still holds it.
    pub async fn release(&self, scan: Uuid, token: &str) -> Result<(), String> {
        match self {
            Self::Valkey { valkey, prefix } => {
                let _: i64 = run(valkey, RELEASE, &format!("{prefix}{scan}"), |c| {
                    c.arg(token);
                })
                .await?;
                Ok(())
            }
            Self::Local(local) => {
                let mut local = local.lock().map_err(|e| e.to_string())?;
                if let Some(current) = local.markers.get(&scan) {
                    let next = schedule::release(current, token);
                    local.markers.insert(scan, next);
                }
                Ok(())
            }
        }
    }
}

/// One single-key script on `key`, with `args` added.
async fn run<T: redis::FromRedisValue>(
    valkey: &Valkey,
    script: &str,
    key: &str,
    args: impl FnOnce(&mut redis::Cmd),
) -> Result<T, String> {
    let mut conn = valkey.connection().await.map_err(|e| e.to_string())?;
    let mut cmd = crate::store::valkey::eval(script, &[key]);
    args(&mut cmd);
    cmd.query_async(&mut conn).await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marker keys share the stream's slot: a plain key becomes the tag.
    #[test]
    fn tags() {
        assert_eq!(tagged("jobs"), "{jobs}");
        assert_eq!(tagged("jobs{scan}"), "jobs{scan}");
        assert_eq!(tagged("jobs{}"), "{jobs{}}");
    }

    /// In process: claimed once, busy for another attempt, done for everyone after success.
    #[tokio::test]
    async fn local_markers() {
        let m = Markers::local();
        let scan = Uuid::now_v7();
        let lease = Duration::from_secs(5);
        assert_eq!(m.claim(scan, "a", lease).await, Ok(Claim::Claimed));
        assert_eq!(m.claim(scan, "b", lease).await, Ok(Claim::Busy));
        m.release(scan, "a").await.unwrap();
        assert_eq!(m.claim(scan, "b", lease).await, Ok(Claim::Claimed));
        m.done(scan).await.unwrap();
        assert_eq!(m.claim(scan, "c", lease).await, Ok(Claim::Done));
    }
}
