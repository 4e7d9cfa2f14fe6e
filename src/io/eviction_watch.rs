//! The quota Valkey's memory, watched off the request path: the driver of
//! the [`crate::rules::eviction`] rule, which `serve`, the Lambda's init and
//! `consume` each call at start.
//!
//! [`check_at_start`] reads every primary's `maxmemory-policy`
//! ([`Valkey::eviction_policies`]), judges it ([`eviction::reading`]),
//! names an evicting one in one error-level line (what breaks, how to fix
//! it) and in the `stella_quota_store_evicting` gauge, and refuses the
//! start when `QUOTA_STORE_EVICTION=refuse`. A store that does not answer
//! does not stop the start: a warning, and the fail mode answers for it.
//!
//! [`start`] then watches, every `QUOTA_STORE_STATS_INTERVAL_MS`: it reads
//! `evicted_keys` into `stella_quota_store_evicted_keys_total`, and the
//! policy again, so a change (a `CONFIG SET`, a new parameter group) sets
//! the gauge and is said in one line, and a store that was down at start
//! and comes up evicting is refused then, under `refuse`
//! ([`until_refused`]). `serve` and `consume` run it; Lambda leaves it out:
//! a frozen environment cannot read on a schedule, and every environment
//! would count the same store-wide evictions again; the cache's own
//! `Evictions` alarm covers it (`template.yaml`).
//!
//! Neither sends anything on the request path: each is an `INFO` or two
//! on the shared connection, at start or once an interval.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::task::AbortOnDropHandle;

use crate::config::{StoreConfig, vars};
use crate::io::clock::wall_ms;
use crate::io::connection::Valkey;
use crate::io::meter::store::StoreMeter;
use crate::rules::eviction::{self, Reading, evicted_since};

/// The least time the start gives the store: a first connection (a TLS
/// handshake to a cluster) and then `INFO`.
const START_WITHIN: Duration = Duration::from_secs(2);

/// Reads and judges the store's eviction policy, says and meters it, and
/// refuses the start (an error naming `QUOTA_STORE_EVICTION` and the
/// policy) when the policy can evict and `store.on_eviction` says refuse.
pub async fn check_at_start(
    valkey: &Valkey,
    store: &StoreConfig,
    meter: &StoreMeter,
) -> Result<(), String> {
    read_policy(valkey, store, meter, None).await.map(|_| ())
}

/// One reading of the policy after `last` (whether the last reading found
/// the store evicting; `None`: none yet), said and metered as
/// [`eviction::reading`] says: the reading's finding, or the refusal.
async fn read_policy(
    valkey: &Valkey,
    store: &StoreConfig,
    meter: &StoreMeter,
    last: Option<bool>,
) -> Result<Option<bool>, String> {
    let nodes = match valkey
        .eviction_policies(store.timeout.max(START_WITHIN))
        .await
    {
        Ok(nodes) => nodes,
        Err(e) if last.is_none() => {
            tracing::warn!(
                error = %e,
                "cannot read the quota Valkey's maxmemory-policy; running anyway \
                 (QUOTA_FAIL_MODE answers while the store does not)"
            );
            return Ok(last);
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the quota Valkey's maxmemory-policy");
            return Ok(last);
        }
    };
    match eviction::reading(last, &nodes, store.on_eviction) {
        Reading::Unchanged => Ok(last),
        Reading::Safe => {
            meter.evicting(false, wall_ms());
            if last == Some(true) {
                tracing::info!("the quota Valkey's maxmemory-policy is noeviction now");
            }
            Ok(Some(false))
        }
        Reading::Evicting(finding) => {
            meter.evicting(true, wall_ms());
            tracing::error!(maxmemory_policy = %finding.policies, "{}", finding.message());
            Ok(Some(true))
        }
        Reading::Refuse(finding) => {
            meter.evicting(true, wall_ms());
            Err(format!(
                "{}=refuse: {}",
                vars::QUOTA_STORE_EVICTION.name(),
                finding.message()
            ))
        }
    }
}

/// The watch [`start`] runs: until dropped, or until it refuses the store,
/// ending with the reason.
pub struct Watch(AbortOnDropHandle<String>);

/// [`check_at_start`], then the watch: what `serve` and `consume` run at
/// start.
pub async fn start(
    valkey: &Valkey,
    store: &StoreConfig,
    meter: StoreMeter,
) -> Result<Watch, String> {
    let last = read_policy(valkey, store, &meter, None).await?;
    Ok(watch(valkey.clone(), store.clone(), meter, last))
}

/// Every `store.stats_interval` (the first reading at once, the base):
/// the keys evicted since, metered, and the policy, read again. A reading
/// that fails is skipped: the next one counts what it missed.
fn watch(valkey: Valkey, store: StoreConfig, meter: StoreMeter, last: Option<bool>) -> Watch {
    let within = store.timeout.max(START_WITHIN);
    Watch(AbortOnDropHandle::new(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(store.stats_interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (mut evicted, mut evicting) = (None, last);
        loop {
            ticks.tick().await;
            match valkey.evicted_keys(within).await {
                Ok(now) => {
                    meter.evicted(evicted_since(evicted, now), wall_ms());
                    evicted = Some(now);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the quota Valkey's evicted_keys")
                }
            }
            match read_policy(&valkey, &store, &meter, evicting).await {
                Ok(now) => evicting = now,
                Err(refused) => return refused,
            }
        }
    })))
}

/// Why a [`Watch`] refused the store, once it has.
#[derive(Debug, Clone, Default)]
pub struct Refusal(Arc<OnceLock<String>>);

impl Refusal {
    /// `result`, unless the store was refused: then the refusal.
    pub fn or(&self, result: Result<(), String>) -> Result<(), String> {
        match self.0.get() {
            Some(why) => Err(why.clone()),
            None => result,
        }
    }
}

/// `shutdown`, or `watch` refusing the store (said at error level, and
/// kept in the [`Refusal`]): what a process that watches runs until. The
/// watch lives as long as the returned future.
pub fn until_refused(
    watch: Option<Watch>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (impl Future<Output = ()> + Send + 'static, Refusal) {
    let refusal = Refusal::default();
    let kept = refusal.clone();
    let stop = async move {
        let Some(Watch(mut task)) = watch else {
            return shutdown.await;
        };
        tokio::select! {
            () = shutdown => {}
            refused = &mut task => {
                let why = refused.unwrap_or_else(|e| format!("the eviction watch ended: {e}"));
                tracing::error!("{why}; stopping");
                let _ = kept.0.set(why);
            }
        }
    };
    (stop, refusal)
}
