//! The [`Gate`] and the backends [`Config`] names, built once per process (or per `serve` worker);
//! nothing here is on the request path.

use std::future::Future;
use std::sync::Arc;

use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::refused::Refused;
use crate::config::{Config, ConfigError, Mode, QueueTarget, vars};
use crate::gate::identity::Identifier;
use crate::io::clock::Clock;
use crate::io::connection::Valkey;
use crate::io::meter::Meter;
use crate::io::queue::spool::Spool;
use crate::io::queue::stream::StreamQueue;
use crate::io::queue::{AnyQueue, ScanQueue, SendError};
use crate::io::store::memory::MemoryStore;
use crate::io::store::valkey::ValkeyStore;
use crate::io::store::{AnyStore, QuotaStore};
use crate::rules::breaker::Breaker;

pub struct Gate<S, Q> {
    pub(super) config: Config,
    pub(super) identifier: Identifier,
    pub(super) store: S,
    pub(super) queue: Q,
    pub(super) meter: Meter,
    /// Skips the store after repeated failures.
    pub(super) breaker: Breaker,
    pub(super) clock: Clock,
    /// Subjects and levels the store refused, until their `Retry-After`.
    pub(super) refused: Refused,
    /// Cancelled when the process stops ([`Gate::wake_sleepers`]).
    pub(super) wake: CancellationToken,
}

/// What the gates of one process share: the in-memory counters and the AWS configuration.
#[derive(Clone, Default)]
pub struct Shared {
    memory: MemoryStore,
    sdk: Arc<tokio::sync::OnceCell<aws_config::SdkConfig>>,
}

impl Gate<AnyStore, AnyQueue> {
    /// Builds the store and queue `config` names. Nothing connects yet.
    pub async fn from_config(config: Config, meter: Meter) -> Result<Self, ConfigError> {
        Self::from_config_sharing(config, meter, &Shared::default()).await
    }

    /// Like [`from_config`](Self::from_config), for several gates of one process sharing `shared`.
    pub async fn from_config_sharing(
        config: Config,
        meter: Meter,
        shared: &Shared,
    ) -> Result<Self, ConfigError> {
        let valkey = Valkey::from_config(&config)?;
        let wait = config.store.valkey.as_ref().map_or(0, |c| c.wait_replicas);
        let store = match &valkey {
            Some(v) => AnyStore::Valkey(ValkeyStore::new(v.clone()).with_wait(wait)),
            None => AnyStore::Memory(shared.memory.clone()),
        };
        let queue = match (&config.queue, &valkey) {
            (QueueTarget::Spool, _) => AnyQueue::Spool(Spool::default()),
            (QueueTarget::ValkeyStream(key), Some(v)) => {
                AnyQueue::Stream(StreamQueue::new(v.clone(), key).with_wait(wait))
            }
            (QueueTarget::ValkeyStream(_), None) => {
                return Err(ConfigError::new(
                    vars::SCAN_QUEUE_URL.name,
                    "valkey-stream: needs VALKEY_URL",
                ));
            }
            (QueueTarget::Sqs(url), _) => {
                // Resolved once per process (region, credentials, AWS_ENDPOINT_URL) and reused.
                let sdk = shared
                    .sdk
                    .get_or_init(
                        || aws_config::load_defaults(aws_config::BehaviorVersion::latest()),
                    )
                    .await;
                let queue = crate::io::queue::sqs::SqsQueue::new(sdk, url);
                AnyQueue::Sqs(queue.with_over_lane(config.queue_over.clone()))
            }
        };
        Self::new(config, store, queue, meter)
    }
}

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    pub fn new(config: Config, store: S, queue: Q, meter: Meter) -> Result<Self, ConfigError> {
        Ok(Self {
            identifier: Identifier::new(&config)?,
            breaker: Breaker::new(
                config.store.breaker_failures,
                config.store.breaker_cool_down,
            ),
            config,
            store,
            queue,
            meter,
            clock: Clock::System,
            refused: Refused::default(),
            wake: CancellationToken::new(),
        })
    }

    /// Reads time from `clock` (tests pass one that follows paused Tokio time).
    #[cfg(feature = "testing")]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    #[cfg(feature = "testing")]
    pub fn identifier(&self) -> &Identifier {
        &self.identifier
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    #[cfg(feature = "testing")]
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    #[cfg(feature = "testing")]
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Ends every sleep of this gate, now and from now on, so a stopping `serve` need not wait out
    /// a delay: each woken scan is queued at once with the rest of its delay on its job.
    pub fn wake_sleepers(&self) {
        self.wake.cancel();
    }

    /// Starts the store's connection in the background, so the first request finds it connected.
    pub fn warm_up(&self) {
        self.store.warm_up();
    }

    /// Whether decisions are only reported, not carried out (`QUOTA_MODE=shadow`).
    pub(super) fn shadow(&self) -> bool {
        self.config.policy.mode == Mode::Shadow
    }

    /// One store call, skipped while the breaker is open; bounded at twice the store timeout unless
    /// the store bounds its own wait (keeping the abandoned command in flight).
    pub(super) async fn bounded<T, E: From<SendError>>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        if !self.breaker.admit(Instant::now().into_std()) {
            return Err(SendError::Skipped.into());
        }
        let result = if self.store.bounds_itself() {
            call.await
        } else {
            timeout(self.config.store.timeout * 2, call)
                .await
                .unwrap_or(Err(SendError::Unanswered.into()))
        };
        self.breaker
            .record(result.is_ok(), Instant::now().into_std());
        result
    }
}
