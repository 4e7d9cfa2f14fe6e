//! Watches the quota Valkey's eviction policy off the request path ([`crate::rules::eviction`]):
//! [`check_at_start`] refuses the start under `QUOTA_STORE_EVICTION=refuse`, and [`start`] also
//! watches every `QUOTA_STORE_STATS_INTERVAL_MS`. A store that does not answer only warns (the fail
//! mode answers for it). Lambda does not watch: a frozen environment cannot read on a schedule, and
//! every environment would count the same store-wide evictions (the `Evictions` alarm covers it).

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

/// The least time the start gives the store: a first connection (a TLS handshake) and `INFO`.
const START_WITHIN: Duration = Duration::from_secs(2);

/// Reads, says and meters the store's eviction policy; errs when it can evict under `refuse`.
pub async fn check_at_start(
    valkey: &Valkey,
    store: &StoreConfig,
    meter: &StoreMeter,
) -> Result<(), String> {
    read_policy(valkey, store, meter, None).await.map(|_| ())
}

/// One policy reading after `last` (whether the last found the store evicting; `None`: none yet).
async fn read_policy(
    valkey: &Valkey,
    store: &StoreConfig,
    meter: &StoreMeter,
    last: Option<bool>,
) -> Result<Option<bool>, String> {
    let within = store.timeout.max(START_WITHIN);
    let nodes = match valkey.eviction_policies(within).await {
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
    let evicting = match eviction::reading(last, &nodes, store.on_eviction) {
        Reading::Unchanged => return Ok(last),
        Reading::Safe if last == Some(true) => {
            tracing::info!("the quota Valkey's maxmemory-policy is noeviction now");
            false
        }
        Reading::Safe => false,
        Reading::Evicting(finding) => {
            tracing::error!(maxmemory_policy = %finding.policies, "{}", finding.message());
            true
        }
        Reading::Refuse(finding) => {
            meter.evicting(true, wall_ms());
            let refuse = vars::QUOTA_STORE_EVICTION.name;
            return Err(format!("{refuse}=refuse: {}", finding.message()));
        }
    };
    meter.evicting(evicting, wall_ms());
    Ok(Some(evicting))
}

/// The running watch: it ends only by refusing the store, with the reason.
pub struct Watch(AbortOnDropHandle<String>);

/// [`check_at_start`], then the watch.
pub async fn start(
    valkey: &Valkey,
    store: &StoreConfig,
    meter: StoreMeter,
) -> Result<Watch, String> {
    let last = read_policy(valkey, store, &meter, None).await?;
    // Every `store.stats_interval`, from now: evicted keys metered and the policy read again. A
    // failed reading is skipped; the next one counts what it missed.
    let (valkey, store) = (valkey.clone(), store.clone());
    let within = store.timeout.max(START_WITHIN);
    Ok(Watch(AbortOnDropHandle::new(tokio::spawn(async move {
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
    }))))
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

/// Runs until `shutdown`, or until `watch` refuses the store (kept in the [`Refusal`]); the watch
/// lives as long as the returned future.
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
