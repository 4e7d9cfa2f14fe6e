//! The request path, step by step, behind one call: [`Gate::handle`].
//!
//! The gate is generic over its [`QuotaStore`] and [`ScanQueue`], so the same
//! handler runs against Valkey, the in-memory store, a stream or the spool,
//! in production and in tests alike.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::time::{Instant, timeout};
use uuid::Uuid;

use crate::breaker::Breaker;
use crate::config::{Config, ConfigError, FailMode, QueueTarget};
use crate::decide::{Decision, Tier, decide};
use crate::delay::{self, DelayPlan};
use crate::error::GateError;
use crate::identity::{Identifier, Identity, Origin};
use crate::meter::{Meter, Outcome};
use crate::queue::spool::Spool;
use crate::queue::stream::StreamQueue;
use crate::queue::{AnyQueue, QueueError, ScanJob, ScanQueue};
use crate::respond::Accepted;
use crate::store::memory::MemoryStore;
use crate::store::valkey::ValkeyStore;
use crate::store::{AnyStore, Count, QuotaKey, QuotaStore, StoreError};
use crate::valkey::Valkey;

/// The longest an enqueue may take before the scan is refunded and refused
/// (less when the gateway or Lambda deadline is nearer).
pub const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(5);

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
}

impl Gate<AnyStore, AnyQueue> {
    /// Builds the store and queue `config` names. Nothing connects yet.
    pub async fn from_config(
        config: Config,
        secret: &[u8],
        meter: Meter,
    ) -> Result<Self, ConfigError> {
        let valkey = Valkey::from_config(&config)?;
        let store = match &valkey {
            Some(v) => AnyStore::Valkey(ValkeyStore::new(v.clone())),
            None => AnyStore::Memory(MemoryStore::default()),
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
                // Once per cold start: region, credentials and AWS_ENDPOINT_URL
                // are resolved here, and every invocation reuses the client.
                let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
                AnyQueue::Sqs(crate::queue::sqs::SqsQueue::new(&sdk, url))
            }
        };
        Self::new(config, secret, store, queue, meter)
    }
}

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    pub fn new(
        config: Config,
        secret: &[u8],
        store: S,
        queue: Q,
        meter: Meter,
    ) -> Result<Self, ConfigError> {
        let identifier = Identifier::new(&config, secret)?;
        let breaker = Breaker::new(config.breaker_failures, config.breaker_cool_down);
        Ok(Self {
            breaker,
            config,
            identifier,
            store,
            queue,
            meter,
        })
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

    /// Runs the whole request path and answers. Never panics on any input.
    pub async fn handle(&self, request: GateRequest) -> Response<Bytes> {
        match self.process(request).await {
            Ok(accepted) => accepted.to_response(),
            Err(e) => {
                if e.status().is_server_error() {
                    tracing::warn!(error = %e, code = e.code(), "scan refused");
                }
                e.to_response()
            }
        }
    }

    async fn process(&self, request: GateRequest) -> Result<Accepted, GateError> {
        let started = Instant::now();
        let received_at = OffsetDateTime::now_utc();
        // 1–3: validate, identify, hash.
        let scan = crate::validate::validate(
            &request.method,
            &request.path,
            &request.headers,
            &request.body,
        )?;
        let origin = Origin {
            peer: request.peer,
            gateway_claims: request.gateway_claims.as_ref(),
        };
        let identity = self.identifier.identify(&request.headers, &origin)?;
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let limits = self.config.limits(identity.limit);

        // 4–5: count and decide.
        let counted = self.count(&key).await;
        let mut outcome = Outcome {
            scope: identity.scope,
            tier: None,
            reminder: false,
            delay: Duration::ZERO,
            store_error: counted.is_err(),
            enqueue_error: false,
        };
        let (count, decision) = match counted {
            Ok(count) => (Some(count), decide(count.used, &limits)),
            Err(e) => {
                // An open breaker is one outage, already logged when it opened.
                if matches!(e, StoreError::CircuitOpen) {
                    tracing::debug!(scope = %identity.scope, "quota store skipped: breaker open");
                } else {
                    tracing::warn!(error = %e, scope = %identity.scope, "quota store failed");
                }
                if self.config.fail_mode == FailMode::Closed {
                    self.meter.record(&outcome);
                    return Err(GateError::StoreUnavailable);
                }
                let open = Decision {
                    tier: Tier::Within,
                    delay: Duration::ZERO,
                    remaining: u64::from(limits.limit.get()),
                    reminder: false,
                };
                (None, open)
            }
        };
        if count.is_some() {
            outcome.tier = Some(decision.tier);
            outcome.reminder = decision.reminder;
            outcome.delay = decision.delay;
        }

        // 6: delay within the platform's limits.
        let remaining = request
            .remaining
            .map(|r| r.saturating_sub(started.elapsed()));
        let ceiling = delay::ceiling(remaining, self.config.gateway_timeout);
        let budget = delay::budget(
            remaining,
            self.config.gateway_timeout,
            self.config.delay_margin,
        );
        let plan = delay::plan(decision.delay, self.config.delay_mode, budget);
        if !plan.sleep.is_zero() {
            tokio::time::sleep(plan.sleep).await;
        }

        // 7: forward; a failed enqueue takes its count back. The enqueue, too,
        // must end before the gateway gives up on us: a job queued after the
        // client saw a gateway timeout would be retried and counted twice.
        let job = self.job(&identity, &scan.body, count, &decision, plan, received_at);
        let enqueue_within =
            ENQUEUE_TIMEOUT.min((started + ceiling).saturating_duration_since(Instant::now()));
        if let Err(e) = self.enqueue(&job, enqueue_within).await {
            tracing::warn!(error = %e, scope = %identity.scope, "enqueue failed; refunding");
            if count.is_some() {
                self.refund(&key).await;
            }
            outcome.enqueue_error = true;
            self.meter.record(&outcome);
            return Err(GateError::QueueFailed);
        }

        // 8–9: answer and meter.
        self.meter.record(&outcome);
        let (reset_at, seconds_to_reset) = match count {
            Some(c) => (c.reset_at, c.seconds_to_reset()),
            None => next_utc_midnight(received_at),
        };
        Ok(Accepted {
            scan_id: job.scan_id,
            scope: identity.scope,
            limit: limits.limit.get(),
            used: count.map(|c| c.used),
            remaining: decision.remaining,
            reset_at,
            seconds_to_reset,
            plan,
            token: identity.token,
            reminder: decision.reminder,
        })
    }

    /// One bounded store call, skipped while the breaker is open.
    async fn count(&self, key: &QuotaKey) -> Result<Count, StoreError> {
        if !self.breaker.admit() {
            return Err(StoreError::CircuitOpen);
        }
        let counted = timeout(
            self.config.store_timeout,
            self.store.count(key, self.config.reset),
        )
        .await
        .unwrap_or(Err(StoreError::Timeout));
        self.breaker.record(counted.is_ok());
        counted
    }

    /// Takes back a count after a failed enqueue, bounded like every store
    /// call. A refund that fails leaves the subject one scan short for the
    /// day; the client got a 503 either way, so it is logged, not retried.
    async fn refund(&self, key: &QuotaKey) {
        let refunded = timeout(self.config.store_timeout, self.store.refund(key))
            .await
            .unwrap_or(Err(StoreError::Timeout));
        self.breaker.record(refunded.is_ok());
        if let Err(e) = refunded {
            tracing::warn!(error = %e, "refund failed");
        }
    }

    async fn enqueue(&self, job: &ScanJob, within: Duration) -> Result<(), QueueError> {
        timeout(within, self.queue.enqueue(job))
            .await
            .unwrap_or(Err(QueueError::Timeout))
    }

    fn job(
        &self,
        identity: &Identity,
        body: &serde_json::Map<String, serde_json::Value>,
        count: Option<Count>,
        decision: &Decision,
        plan: DelayPlan,
        received_at: OffsetDateTime,
    ) -> ScanJob {
        let fmt = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_default();
        ScanJob {
            scan_id: Uuid::now_v7(),
            received_at: fmt(received_at),
            scope: identity.scope.as_str(),
            digest: identity.digest.to_string(),
            tier: decision.tier.as_str(),
            limit: identity.limit.get(),
            count: count.map_or(0, |c| c.used),
            delay_ms: plan.total.as_millis() as u64,
            deferred_ms: plan.deferred.as_millis() as u64,
            not_before: fmt(received_at + plan.total),
            request: body.clone(),
        }
    }
}

/// The next 00:00 UTC and the seconds to it, by this machine's clock (used
/// only when the store, whose clock is authoritative, did not answer).
fn next_utc_midnight(now: OffsetDateTime) -> (i64, u64) {
    let secs = now.unix_timestamp();
    let midnight = secs - secs.rem_euclid(86_400) + 86_400;
    (midnight, (midnight - secs) as u64)
}
