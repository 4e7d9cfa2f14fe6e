//! The `scanId` markers that make each scan run once: before a hand-off an attempt claims the
//! scan's marker with a lease; on success it is kept as `done` for [`DONE_TTL_SECS`], on failure
//! released. With Valkey it is a key under the stream's hash tag (`{<stream>}:run:<scanId>`);
//! without, the markers live in the process.
//!
//! With `VALKEY_WAIT_REPLICAS=N` a claim or a done marker counts only once `WAIT N` confirms it, so
//! a failover never reuses an attempt number (the fencing token a scanner may check) or reruns a
//! finished scan.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use super::error::ConsumeError;
use super::schedule::{self, Marker, MarkerClaim};
use super::sync::lock;
use crate::io::connection::Valkey;
use crate::rules::hash_tag::tagged;
use crate::rules::unix::UnixMillis;

/// How long a done marker (and a scan's attempt counter) is kept: as long as the gate keeps a keyed
/// request's record, after which a retry is a new scan anyway.
pub const DONE_TTL_SECS: i64 = crate::io::store::IDEMPOTENCY_TTL_SECS;

/// Done markers an in-process store keeps before forgetting the oldest.
const LOCAL_DONE: usize = 100_000;

/// A finished scan's marker value; `claim.lua` compares the same word.
pub const DONE: &str = "done";

const CLAIM: &str = include_str!("claim.lua");
const RELEASE: &str = include_str!("release.lua");

/// One claim of a scan's marker by attempt `token`: new (`mine` 0) or renewing `mine`, for `lease`,
/// at `now` (in-process only). A new attempt of a gone stream `entry` is [`MarkerClaim::Gone`].
#[derive(Debug, Clone, Copy)]
pub struct MarkerAsk<'a> {
    pub scan: Uuid,
    pub entry: Option<(&'a str, &'a str)>,
    pub token: &'a str,
    pub mine: u64,
    pub lease: Duration,
    pub now: UnixMillis,
}

/// The markers as the worker uses them; [`Markers`] keeps them in Valkey or in the process.
pub trait MarkerStore: Send + Sync + 'static {
    /// Claims a scan's marker as `ask` says.
    fn claim(
        &self,
        ask: MarkerAsk<'_>,
    ) -> impl Future<Output = Result<MarkerClaim, ConsumeError>> + Send;

    /// Keeps `scan`'s marker as done.
    fn done(&self, scan: Uuid) -> impl Future<Output = Result<(), ConsumeError>> + Send;

    /// Releases `scan`'s marker if the attempt `token` still holds it.
    fn release(
        &self,
        scan: Uuid,
        token: &str,
    ) -> impl Future<Output = Result<(), ConsumeError>> + Send;
}

/// A claim's answer, relied on only if the replicas hold it ([`ConsumeError::NotReplicated`]):
/// a new or renewed claim, and a done marker (a job is acked on it, and a failover to a replica
/// without it would leave the job unrun).
pub fn durable_claim(
    claim: MarkerClaim,
    mine: u64,
    durable: bool,
) -> Result<MarkerClaim, ConsumeError> {
    match claim {
        MarkerClaim::Claimed(_) if mine > 0 && crate::bug!(RenewalsOnThePrimaryOnly) => Ok(claim),
        MarkerClaim::Claimed(_) if !durable => {
            Err(ConsumeError::NotReplicated("the attempt's claim"))
        }
        MarkerClaim::Done if !durable => Err(ConsumeError::NotReplicated("the done marker")),
        claim => Ok(claim),
    }
}

/// A done marker, relied on (acked after) only if the replicas hold it.
pub fn durable_done(durable: bool) -> Result<(), ConsumeError> {
    durable_claim(MarkerClaim::Done, 0, durable).map(drop)
}

/// Marker tokens, one per attempt, unique across processes: the consumer's name, a random id per
/// process (a restarted consumer must not take its predecessor's live marker) and a count.
pub struct Tokens {
    prefix: String,
    issued: AtomicU64,
}

impl Tokens {
    pub fn new(consumer: String) -> Self {
        Self {
            prefix: format!("{consumer}:{}", uuid::Uuid::now_v7().simple()),
            issued: AtomicU64::new(0),
        }
    }

    pub fn next(&self) -> String {
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.prefix)
    }
}

/// Where markers live.
#[derive(Clone)]
pub enum Markers {
    Valkey {
        valkey: Valkey,
        tag: String,
        /// `VALKEY_WAIT_REPLICAS`: replicas a claim and a done marker must reach (0: none).
        wait: u32,
    },
    Local(Arc<Mutex<Local>>),
}

/// In-process markers.
#[derive(Default)]
pub struct Local {
    markers: HashMap<Uuid, (Marker, u64)>,
    done: VecDeque<Uuid>,
}

impl Markers {
    /// Markers in Valkey, beside `key` (a stream key, or `sqs:<name>`); claims and done markers
    /// wait until `wait` replicas hold them (`WAIT`).
    pub fn valkey(valkey: Valkey, key: &str, wait: u32) -> Self {
        Self::Valkey {
            valkey,
            tag: tagged(key),
            wait,
        }
    }

    /// Markers in this process only.
    pub fn local() -> Self {
        Self::local_after([])
    }

    /// In-process markers for a replay: each given scan's next attempt is numbered after the given.
    pub fn local_after(attempts: impl IntoIterator<Item = (Uuid, u64)>) -> Self {
        let markers = attempts
            .into_iter()
            .map(|(scan, n)| (scan, (Marker::Free, n)))
            .collect();
        Self::Local(Arc::new(Mutex::new(Local {
            markers,
            ..Local::default()
        })))
    }

    fn keys(tag: &str, scan: Uuid) -> (String, String) {
        (format!("{tag}:run:{scan}"), format!("{tag}:attempt:{scan}"))
    }
}

impl MarkerStore for Markers {
    async fn claim(&self, ask: MarkerAsk<'_>) -> Result<MarkerClaim, ConsumeError> {
        let MarkerAsk { scan, mine, .. } = ask;
        match self {
            Self::Valkey { valkey, tag, wait } => {
                let (marker, attempts) = Self::keys(tag, scan);
                let mut keys = vec![marker.as_str(), attempts.as_str()];
                keys.extend(ask.entry.map(|(stream, _)| stream));
                let mut cmd = crate::io::store::valkey::eval(CLAIM, &keys);
                cmd.arg(ask.token)
                    .arg(crate::rules::unix::duration_ms(ask.lease))
                    .arg(mine)
                    .arg(DONE_TTL_SECS);
                if let Some((_, id)) = ask.entry {
                    cmd.arg(id);
                }
                let (answer, durable): (i64, bool) =
                    valkey.send_replicated(cmd, *wait, valkey.timeout()).await?;
                let claim = match answer {
                    n if n > 0 => MarkerClaim::Claimed(n.unsigned_abs()),
                    0 => MarkerClaim::Done,
                    -2 => MarkerClaim::Gone,
                    _ => MarkerClaim::Busy,
                };
                durable_claim(claim, mine, durable)
            }
            Self::Local(local) => {
                let mut local = lock(local);
                let (marker, attempts) = local.markers.entry(scan).or_insert((Marker::Free, 0));
                let (next, number, answer) =
                    schedule::claim(marker, *attempts, ask.token, mine, ask.now, ask.lease);
                (*marker, *attempts) = (next, number);
                Ok(answer)
            }
        }
    }

    async fn done(&self, scan: Uuid) -> Result<(), ConsumeError> {
        match self {
            Self::Valkey { valkey, tag, wait } => {
                let (marker, _) = Self::keys(tag, scan);
                let mut cmd = redis::cmd("SET");
                cmd.arg(marker).arg(DONE).arg("EX").arg(DONE_TTL_SECS);
                let ((), durable) = valkey.send_replicated(cmd, *wait, valkey.timeout()).await?;
                durable_done(durable)
            }
            Self::Local(local) => {
                let mut local = lock(local);
                local.markers.entry(scan).or_insert((Marker::Free, 0)).0 = Marker::Done;
                local.done.push_back(scan);
                while local.done.len() > LOCAL_DONE
                    && let Some(old) = local.done.pop_front()
                {
                    local.markers.remove(&old);
                }
                Ok(())
            }
        }
    }

    async fn release(&self, scan: Uuid, token: &str) -> Result<(), ConsumeError> {
        match self {
            Self::Valkey { valkey, tag, .. } => {
                let (marker, _) = Self::keys(tag, scan);
                let mut cmd = crate::io::store::valkey::eval(RELEASE, &[&marker]);
                cmd.arg(token).arg(DONE_TTL_SECS);
                valkey.send::<i64>(cmd, valkey.timeout()).await?;
                Ok(())
            }
            Self::Local(local) => {
                let mut local = lock(local);
                if let Some((marker, _)) = local.markers.get_mut(&scan) {
                    *marker = schedule::release(marker, token);
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In process: claimed once, busy for another attempt, numbered per attempt, done for everyone after success.
    #[tokio::test]
    async fn local_markers() {
        let m = Markers::local();
        let scan = Uuid::now_v7();
        let lease = Duration::from_secs(5);
        let claim = |token: &'static str, mine| {
            m.claim(MarkerAsk {
                scan,
                entry: None,
                token,
                mine,
                lease,
                now: UnixMillis(0),
            })
        };
        assert!(matches!(claim("a", 0).await, Ok(MarkerClaim::Claimed(1))));
        assert!(matches!(claim("b", 0).await, Ok(MarkerClaim::Busy)));
        m.release(scan, "a").await.unwrap();
        assert!(matches!(claim("b", 0).await, Ok(MarkerClaim::Claimed(2))));
        assert!(matches!(claim("b", 2).await, Ok(MarkerClaim::Claimed(2))));
        m.done(scan).await.unwrap();
        assert!(matches!(claim("c", 0).await, Ok(MarkerClaim::Done)));
    }

    /// A scan seeded as having run attempt 3 is claimed as attempt 4.
    #[tokio::test]
    async fn local_after_numbers_on() {
        let scan = Uuid::now_v7();
        let m = Markers::local_after([(scan, 3)]);
        let claim = m
            .claim(MarkerAsk {
                scan,
                entry: None,
                token: "a",
                mine: 0,
                lease: Duration::from_secs(5),
                now: UnixMillis(0),
            })
            .await;
        assert!(matches!(claim, Ok(MarkerClaim::Claimed(4))));
    }

    /// The scripts spell the marker's values alike: [`DONE`], `free` (a
    /// released marker) and `orphan:` (one kept out a lease more,
    /// [`Marker::Orphaned`]); every quoted word that is not a command, an
    /// option or a number is one of them.
    #[test]
    fn scripts_spell_the_values() {
        let values = [DONE, "free", "orphan:"];
        for (name, script) in [("claim.lua", CLAIM), ("release.lua", RELEASE)] {
            for word in crate::io::connection::quoted_words(script) {
                let command = word.chars().all(|c| c.is_ascii_uppercase());
                let number = word.parse::<u64>().is_ok();
                assert!(
                    command || number || values.contains(&word),
                    "{name}: '{word}' is not one of {values:?}"
                );
            }
        }
        let words = crate::io::connection::quoted_words(CLAIM);
        assert!(values.iter().all(|v| words.contains(v)), "{CLAIM}");
    }
}
