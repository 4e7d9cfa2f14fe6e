//! The request path, step by step, behind one call: [`Gate::handle`].
//!
//! The gate is generic over its [`QuotaStore`] and [`ScanQueue`], so the same
//! handler runs against Valkey, the in-memory store, a stream or the spool,
//! in production and in tests alike. It is the I/O driver only: what a scan
//! gets is decided by [`crate::decide`], and what a failure or a repeated
//! `Idempotency-Key` leads to by the pure rules of [`crate::settle`]; the
//! gate sends what they say, in order, on one connection.
//!
//! Two requests take a shorter path (`quota.rs`): `GET /quota`, one read of
//! the subject's keys and no count, and an exempt caller's scan, queued at
//! once and never counted. In shadow mode (`QUOTA_MODE=shadow`) a scan goes
//! the whole way, but its delay is reported, not given (`run.rs`).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use serde_json::{Map, Value};
use tokio::time::{Instant, timeout};
use uuid::Uuid;

use crate::breaker::Breaker;
use crate::clock::Clock;
use crate::config::{Config, ConfigError, QueueTarget};
use crate::connection::Valkey;
use crate::decide::{Limits, decide};
use crate::delay;
use crate::error::GateError;
use crate::identity::{Identifier, Identity, Origin};
use crate::meter::{Meter, Outcome};
use crate::queue::spool::Spool;
use crate::queue::stream::StreamQueue;
use crate::queue::{AnyQueue, ScanQueue};
use crate::respond;
use crate::settle::{
    AfterStoreFailure, Failure, Metering, Repeat, Settlement, after_store_failure, on_repeat,
    settle,
};
use crate::store::memory::MemoryStore;
use crate::store::valkey::ValkeyStore;
use crate::store::{
    AnyStore, Claim, Claimed, CountArgs, QuotaKey, QuotaStore, Record, RecordField, RecordState,
    Refund, StoreError, period_end,
};
use run::Scan;

mod quota;
mod run;

pub use crate::queue::ENQUEUE_TIMEOUT;

/// One HTTP request, as either front end hands it over.
#[derive(Debug, Clone, Default)]
pub struct GateRequest {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The direct peer (gateway `sourceIp` or socket peer), already parsed.
    pub peer: Option<IpAddr>,
    /// Claims verified by an API Gateway JWT authorizer, if any.
    pub gateway_claims: Option<HashMap<String, String>>,
    /// Time left before the Lambda deadline, when running in Lambda.
    pub remaining: Option<Duration>,
}

/// The quota gate.
pub struct Gate<S, Q> {
    config: Config,
    identifier: Identifier,
    store: S,
    queue: Q,
    meter: Meter,
    /// Skips the store after repeated failures (see [`crate::breaker`]).
    breaker: Breaker,
    clock: Clock,
}

/// What the gates of one process share: the in-memory counters (used when
/// no Valkey is configured) and the AWS configuration, resolved once.
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

    /// Like [`from_config`](Self::from_config), for one of several gates in
    /// a process (`serve`'s workers): they share what `shared` holds. A
    /// Valkey connection and an SQS client are each gate's own.
    pub async fn from_config_sharing(
        config: Config,
        meter: Meter,
        shared: &Shared,
    ) -> Result<Self, ConfigError> {
        let valkey = Valkey::from_config(&config)?;
        let store = match &valkey {
            Some(v) => {
                let wait = config.store.valkey.as_ref().map_or(0, |c| c.wait_replicas);
                AnyStore::Valkey(ValkeyStore::new(v.clone()).with_wait(wait))
            }
            None => AnyStore::Memory(shared.memory.clone()),
        };
        let queue = match (&config.queue, &valkey) {
            (QueueTarget::Spool, _) => AnyQueue::Spool(Spool::default()),
            (QueueTarget::ValkeyStream(key), Some(v)) => {
                AnyQueue::Stream(StreamQueue::new(v.clone(), key))
            }
            (QueueTarget::ValkeyStream(_), None) => {
                return Err(ConfigError::new(
                    "SCAN_QUEUE_URL",
                    "valkey-stream: needs VALKEY_URL",
                ));
            }
            (QueueTarget::Sqs(url), _) => {
                // Once per process: region, credentials and AWS_ENDPOINT_URL
                // are resolved here, and every invocation reuses them.
                let sdk = shared
                    .sdk
                    .get_or_init(
                        || aws_config::load_defaults(aws_config::BehaviorVersion::latest()),
                    )
                    .await;
                AnyQueue::Sqs(crate::queue::sqs::SqsQueue::new(sdk, url))
            }
        };
        Self::new(config, store, queue, meter)
    }
}

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    pub fn new(config: Config, store: S, queue: Q, meter: Meter) -> Result<Self, ConfigError> {
        let identifier = Identifier::new(&config)?;
        let breaker = Breaker::new(
            config.store.breaker_failures,
            config.store.breaker_cool_down,
        );
        Ok(Self {
            breaker,
            config,
            identifier,
            store,
            queue,
            meter,
            clock: Clock::System,
        })
    }

    /// Reads time from `clock` (tests pass one that follows paused Tokio time).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn identifier(&self) -> &Identifier {
        &self.identifier
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn queue(&self) -> &Q {
        &self.queue
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Starts the store's connection in the background on the current
    /// runtime (the stream queue shares it), so the first request finds it
    /// connected.
    pub fn warm_up(&self) {
        self.store.warm_up();
    }

    /// Runs the whole request path and answers. Never panics on any input.
    /// Every request that reached the store is metered once, whatever its exit.
    pub async fn handle(&self, request: GateRequest) -> Response<Bytes> {
        let mut outcome = None;
        let result = self.process(request, &mut outcome).await;
        if let Some(outcome) = &outcome {
            self.meter.record(outcome);
        }
        match result {
            Ok(response) => response,
            Err(e) => {
                if e.status().is_server_error() {
                    tracing::warn!(error = %e, code = e.code(), "scan refused");
                }
                e.to_response()
            }
        }
    }

    async fn process(
        &self,
        request: GateRequest,
        outcome: &mut Option<Outcome>,
    ) -> Result<Response<Bytes>, GateError> {
        let started = Instant::now();
        // The one clock reading of this request.
        let now_ms = self.clock.now_ms();
        if crate::check::is_quota_path(&request.path) {
            if request.method != Method::GET && request.method != Method::HEAD {
                return Err(GateError::QuotaMethodNotAllowed);
            }
            return self.check(&request, now_ms).await;
        }
        // 1–3: validate, identify, hash.
        let scan = crate::validate::validate(
            &request.method,
            &request.path,
            &request.headers,
            &request.body,
        )?;
        let idempotency_key = crate::idempotency::key(&request.headers)?;
        let origin = Origin {
            peer: request.peer,
            gateway_claims: request.gateway_claims.as_ref(),
        };
        let identity = self.identifier.identify(&request.headers, &origin)?;
        if identity.exempt {
            return self
                .exempt(identity, scan.body, &request, now_ms, started)
                .await;
        }
        let attempt = self.attempt(identity, idempotency_key, &request, now_ms, started);
        let outcome = outcome.insert(Outcome::new(attempt.identity.scope));
        // 4–5: count (a keyed scan claims its record in the same step), decide.
        let metering = match self.count(&attempt).await {
            Ok(Claimed::New(count)) => Metering::Counted {
                count,
                decision: decide(count.used, &attempt.limits.with_grant(count.grant)),
            },
            Ok(Claimed::Existing(record)) => {
                return self.repeat(&attempt, &scan.body, record, outcome).await;
            }
            Err(e) => self.store_failed(&attempt, e, outcome).await?,
        };
        let fresh = Scan::fresh(&attempt, metering);
        self.run(&attempt, &scan.body, fresh, outcome).await
    }

    /// Everything the later steps need to know about this request.
    fn attempt(
        &self,
        identity: Identity,
        idempotency_key: Option<&str>,
        request: &GateRequest,
        now_ms: i64,
        started: Instant,
    ) -> Attempt {
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let limits = self.config.policy.limits(identity.limit);
        let ceiling = delay::ceiling(request.remaining, self.config.policy.gateway_timeout);
        let claim = idempotency_key.map(|k| Claim {
            record: key.idempotency(k),
            scan_id: Uuid::now_v7(),
            fingerprint: crate::idempotency::fingerprint(&request.body),
            received_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(millis_i64(ceiling)),
        });
        Attempt {
            period_end: period_end(self.config.policy.reset, now_ms.div_euclid(1000)),
            identity,
            key,
            limits,
            claim,
            now_ms,
            ceiling,
            remaining: request.remaining,
            started,
        }
    }

    /// Step 4: one round trip; a keyed scan claims its record with it.
    async fn count(&self, attempt: &Attempt) -> Result<Claimed, StoreError> {
        let args = CountArgs {
            key: &attempt.key,
            period_end: attempt.period_end,
            now: attempt.now(),
        };
        match &attempt.claim {
            None => self.bounded(self.store.count(args)).await.map(Claimed::New),
            Some(claim) => self.bounded(self.store.count_keyed(args, claim)).await,
        }
    }

    /// The count failed: settle what it may leave behind, then refuse, or
    /// go on unmetered (fail open).
    async fn store_failed(
        &self,
        attempt: &Attempt,
        e: StoreError,
        outcome: &mut Outcome,
    ) -> Result<Metering, GateError> {
        outcome.store_error = true;
        let scope = attempt.identity.scope;
        // An open breaker is one outage, already logged when it opened.
        if matches!(e, StoreError::CircuitOpen) {
            tracing::debug!(%scope, "quota store skipped: breaker open");
        } else {
            tracing::warn!(error = %e, %scope, "quota store failed");
        }
        let metering = if e.may_land() {
            Metering::Unknown {
                period_end: attempt.period_end,
            }
        } else {
            Metering::Unmetered
        };
        let mode = self.config.store.fail_mode;
        let keyed = attempt.claim.is_some();
        let settlement = settle(&metering, keyed, Failure::Store { mode });
        self.apply(attempt, attempt.scan_id(), settlement).await;
        let mut answer = after_store_failure(&metering, keyed, mode);
        if crate::bugs::on(crate::bugs::Bug::UnknownCountQueuedUnmetered)
            && answer == AfterStoreFailure::Unsettled
        {
            answer = AfterStoreFailure::Unmetered;
        }
        match answer {
            AfterStoreFailure::Refuse => Err(GateError::StoreUnavailable),
            AfterStoreFailure::Unsettled => Err(GateError::StoreUnsettled),
            AfterStoreFailure::Unmetered => {
                outcome.unmetered = true;
                if let Some(claim) = &attempt.claim {
                    // The claim never landed: the record is written now, with
                    // this scan's identity, so a retry re-queues this job.
                    let fields = claim.uncounted();
                    let written = self
                        .bounded(
                            self.store
                                .update_record(&claim.record, &fields, attempt.now()),
                        )
                        .await;
                    if let Err(e) = written {
                        tracing::debug!(error = %e, "could not record an unmetered keyed scan");
                    }
                }
                Ok(Metering::Unmetered)
            }
        }
    }

    /// Answers a key seen before, by [`on_repeat`]'s rule.
    async fn repeat(
        &self,
        attempt: &Attempt,
        body: &Map<String, Value>,
        record: Record,
        outcome: &mut Outcome,
    ) -> Result<Response<Bytes>, GateError> {
        let Some(claim) = &attempt.claim else {
            return Err(GateError::StoreUnavailable);
        };
        match on_repeat(&record, claim, attempt.now_ms, self.sleep_cap(attempt)) {
            Repeat::Replay(saved) => respond::replay(&saved).ok_or(GateError::StoreUnavailable),
            Repeat::Mismatch => Err(GateError::IdempotencyMismatch),
            Repeat::InProgress { retry_after } => {
                Err(GateError::IdempotencyInProgress { retry_after })
            }
            Repeat::TakeOver => {
                // Only one retry may finish an abandoned attempt.
                let lease = attempt.now_ms.saturating_add(millis_i64(attempt.ceiling));
                let taken = self
                    .bounded(self.store.take_over(
                        &claim.record,
                        record.lease_until_ms,
                        lease,
                        attempt.now(),
                    ))
                    .await;
                if !matches!(taken, Ok(true)) {
                    return Err(GateError::IdempotencyInProgress { retry_after: 1 });
                }
                // The record keeps the count, not the grant: read it (a
                // rare path; without an answer, no grant).
                let grant = self
                    .bounded(self.store.peek(&attempt.key, attempt.now()))
                    .await
                    .map_or(0, |p| p.grant);
                let resumed = Scan::resumed(&record, attempt, grant);
                self.run(attempt, body, resumed, outcome).await
            }
        }
    }

    /// One store call of the request path, skipped while the breaker is
    /// open. The store bounds its own wait (and keeps a command it gave up
    /// on in flight); the bound here only backs it up.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.breaker.admit() {
            return Err(StoreError::CircuitOpen);
        }
        let result = timeout(self.config.store.timeout * 2, call)
            .await
            .unwrap_or(Err(StoreError::Unanswered));
        self.breaker.record(result.is_ok());
        result
    }

    /// Carries out a [`Settlement`], behind everything sent before it on
    /// the same connection. A refund that fails leaves the subject one scan
    /// short for the day (logged, not retried: the client got a 503 either
    /// way); a release that fails makes the retry wait out the lease.
    async fn apply(&self, attempt: &Attempt, scan_id: Uuid, settlement: Settlement) {
        let done = match settlement {
            Settlement::Nothing => return,
            Settlement::Refund { period_end } => {
                let refund = Refund {
                    key: &attempt.key,
                    period_end,
                    record: attempt.claim.as_ref().map(|c| (c.record.as_str(), scan_id)),
                    now: attempt.now(),
                };
                self.store.refund(refund).await
            }
            Settlement::Release => match &attempt.claim {
                Some(claim) => {
                    self.store
                        .release(&claim.record, scan_id, attempt.now())
                        .await
                }
                None => return,
            },
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, ?settlement, "could not settle a failed scan");
        }
    }

    /// Saves a keyed scan's answer, for its repeats: the state, the scanId,
    /// the fingerprint and the answer, which are the whole record when the
    /// claim never landed. If this fails, a repeat finds the record pending
    /// and queues the same job again once its lease is over (which the
    /// stream deduplicates).
    async fn save(&self, claim: &Claim, scan_id: Uuid, response: &Response<Bytes>, now: i64) {
        let fields = [
            (RecordField::State, RecordState::Done.name().to_owned()),
            (RecordField::ScanId, scan_id.to_string()),
            (RecordField::Fingerprint, claim.fingerprint.clone()),
            (RecordField::Response, respond::save(response)),
        ];
        if let Err(e) = self.store.update_record(&claim.record, &fields, now).await {
            tracing::warn!(error = %e, "could not save an idempotent answer");
        }
    }
}

/// One request, as the steps after identification see it.
struct Attempt {
    identity: Identity,
    key: QuotaKey,
    limits: Limits,
    /// A keyed request's claim on its record.
    claim: Option<Claim>,
    /// The one clock reading, unix ms.
    now_ms: i64,
    /// The expiry a new counter gets (unix s).
    period_end: i64,
    /// The answer's deadline: min(Lambda's remaining time, gateway timeout).
    ceiling: Duration,
    /// Lambda's remaining time at arrival, if in Lambda.
    remaining: Option<Duration>,
    started: Instant,
}

impl Attempt {
    /// Unix seconds.
    fn now(&self) -> i64 {
        self.now_ms.div_euclid(1000)
    }

    /// The claim's scanId (nil for an unkeyed scan, whose refunds name none).
    fn scan_id(&self) -> Uuid {
        self.claim.as_ref().map_or(Uuid::nil(), |c| c.scan_id)
    }
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The next 00:00 UTC and the seconds to it (used only when the store, which
/// holds the counter's real expiry, did not answer).
fn next_utc_midnight(secs: i64) -> (i64, u64) {
    let midnight = secs - secs.rem_euclid(86_400) + 86_400;
    (midnight, (midnight - secs) as u64)
}
