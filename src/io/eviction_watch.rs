//! The quota Valkey's memory, watched off the request path: the driver of
//! the [`crate::rules::eviction`] rule, which `serve`, the Lambda's init and
//! `consume` each call at start.
//!
//! [`check_at_start`] reads every primary's `maxmemory-policy`
//! ([`Valkey::eviction_policies`]), judges it ([`eviction::at_start`]),
//! names an evicting one in one error-level line (what breaks, how to fix
//! it) and in the `stella_quota_store_evicting` gauge, and refuses the
//! start when `QUOTA_STORE_EVICTION=refuse`. A store that does not answer
//! does not stop the start: a warning, and the fail mode answers for it.
//!
//! [`watch_evictions`] then reads `evicted_keys` every
//! `QUOTA_STORE_STATS_INTERVAL_MS` into
//! `stella_quota_store_evicted_keys_total`, in a task its owner stops by
//! dropping its handle (`serve` and `consume`). Lambda leaves it out: a
//! frozen environment cannot read on a schedule, and every environment
//! would count the same store-wide evictions again; the cache's own
//! `Evictions` alarm covers it (`template.yaml`).
//!
//! Neither sends anything on the request path: each is one `INFO` on the
//! shared connection, at start or once an interval.

use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::task::AbortOnDropHandle;

use crate::config::{StoreConfig, vars};
use crate::io::clock::wall_ms;
use crate::io::connection::Valkey;
use crate::io::meter::store::StoreMeter;
use crate::rules::eviction::{self, AtStart, evicted_since};

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
    let nodes = match valkey
        .eviction_policies(store.timeout.max(START_WITHIN))
        .await
    {
        Ok(nodes) => nodes,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot read the quota Valkey's maxmemory-policy; starting anyway \
                 (QUOTA_FAIL_MODE answers while the store does not)"
            );
            return Ok(());
        }
    };
    match eviction::at_start(&nodes, store.on_eviction) {
        AtStart::Safe => {
            meter.evicting(false, wall_ms());
            Ok(())
        }
        AtStart::Warn(finding) => {
            meter.evicting(true, wall_ms());
            tracing::error!(maxmemory_policy = %finding.policies, "{}", finding.message());
            Ok(())
        }
        AtStart::Refuse(finding) => {
            meter.evicting(true, wall_ms());
            Err(format!(
                "{}=refuse: {}",
                vars::QUOTA_STORE_EVICTION.name(),
                finding.message()
            ))
        }
    }
}

/// [`check_at_start`], then [`watch_evictions`]: what `serve` and `consume`
/// run at start. The watch runs until the handle is dropped.
pub async fn start(
    valkey: &Valkey,
    store: &StoreConfig,
    meter: StoreMeter,
) -> Result<AbortOnDropHandle<()>, String> {
    check_at_start(valkey, store, &meter).await?;
    Ok(watch_evictions(valkey.clone(), store, meter))
}

/// Reads the store's evicted keys every `store.stats_interval`, the first
/// reading at once (the base), and meters each increase; until the handle
/// is dropped. A reading that fails is skipped: the next one counts what
/// it missed.
pub fn watch_evictions(
    valkey: Valkey,
    store: &StoreConfig,
    meter: StoreMeter,
) -> AbortOnDropHandle<()> {
    let (interval, within) = (store.stats_interval, store.timeout.max(START_WITHIN));
    AbortOnDropHandle::new(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last = None;
        loop {
            ticks.tick().await;
            match valkey.evicted_keys(within).await {
                Ok(now) => {
                    meter.evicted(evicted_since(last, now), wall_ms());
                    last = Some(now);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the quota Valkey's evicted_keys")
                }
            }
        }
    }))
}
