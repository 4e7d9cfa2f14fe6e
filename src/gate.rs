//! The request path, step by step, behind one call: [`Gate::handle`].
//!
//! The gate is generic over its [`QuotaStore`] and [`ScanQueue`], so the same
//! handler runs against Valkey, the in-memory store, a stream or the spool,
//! in production and in tests alike.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use tokio::time::{Instant, timeout};
use uuid::Uuid;

use crate::breaker::Breaker;
use crate::clock::Clock;
use crate::config::{Config, ConfigError, FailMode, Pacing, QueueTarget};
use crate::decide::{Decision, decide};
use crate::delay::{self, DelayPlan};
use crate::error::{GateError, Queued};
use crate::identity::{Identifier, Identity, Origin};
use crate::meter::{Meter, Outcome};
use crate::queue::spool::Spool;
use crate::queue::stream::StreamQueue;
use crate::queue::{AnyQueue, QueueError, ScanJob, ScanQueue};
use crate::respond::{self, Accepted};
use crate::store::memory::MemoryStore;
use crate::store::valkey::ValkeyStore;
use crate::store::{
    AnyStore, Claim, Claimed, Count, CountArgs, PaceArgs, Paced, QuotaKey, QuotaStore, Record,
    Refund, StoreError, period_end,
};
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
            Some(v) => AnyStore::Valkey(ValkeyStore::new(v.clone())),
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

    /// Runs the whole request path and answers. Never panics on any input.
    pub async fn handle(&self, request: GateRequest) -> Response<Bytes> {
        match self.process(request).await {
            Ok(response) => response,
            Err(e) => {
                if e.status().is_server_error() {
                    tracing::warn!(error = %e, code = e.code(), "scan refused");
                }
                e.to_response()
            }
        }
    }

    async fn process(&self, request: GateRequest) -> Result<Response<Bytes>, GateError> {
        let started = Instant::now();
        // The one clock reading of this request.
        let now_ms = self.clock.now_ms();
        let now = now_ms.div_euclid(1000);
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
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let limits = self.config.policy.limits(identity.limit);
        let remaining = request.remaining;
        let ceiling = delay::ceiling(remaining, self.config.policy.gateway_timeout);
        let scan_id = Uuid::now_v7();
        let claim = idempotency_key.map(|k| Claim {
            record: key.idempotency(k),
            scan_id: scan_id.to_string(),
            fingerprint: crate::idempotency::fingerprint(&request.body),
            received_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(millis_i64(ceiling)),
        });

        // 4: count (a keyed scan claims its record in the same step).
        let count_args = CountArgs {
            key: &key,
            period_end: period_end(self.config.policy.reset, now),
            now,
        };
        let counted = match &claim {
            None => self.bounded(self.store.count(count_args)).await,
            Some(claim) => match self
                .bounded(self.store.count_keyed(count_args, claim))
                .await
            {
                Ok(Claimed::New(count)) => Ok(count),
                Ok(Claimed::Existing(record)) => {
                    let subject = Subject {
                        identity: &identity,
                        key: &key,
                        limits: &limits,
                    };
                    return self
                        .resume(subject, &scan.body, claim, record, now_ms, started, ceiling)
                        .await;
                }
                Err(e) => Err(e),
            },
        };
        let mut outcome = Outcome::new(identity.scope);
        // 5: decide.
        let metering = match counted {
            Ok(count) => Metering::Counted {
                count,
                decision: decide(count.used, &limits),
            },
            Err(e) => {
                outcome.store_error = true;
                // An open breaker is one outage, already logged when it opened.
                if matches!(e, StoreError::CircuitOpen) {
                    tracing::debug!(scope = %identity.scope, "quota store skipped: breaker open");
                } else {
                    tracing::warn!(error = %e, scope = %identity.scope, "quota store failed");
                }
                if self.config.store.fail_mode == FailMode::Closed {
                    if matches!(e, StoreError::Timeout) {
                        // The count may still land when the store wakes up:
                        // take it back behind it, so "not counted" stays true.
                        let record = claim
                            .as_ref()
                            .map(|c| (c.record.as_str(), c.scan_id.as_str()));
                        self.refund(&key, count_args.period_end, record).await;
                    }
                    self.meter.record(&outcome);
                    return Err(GateError::StoreUnavailable);
                }
                outcome.unmetered = true;
                Metering::Unmetered {
                    count_may_land: matches!(e, StoreError::Timeout),
                }
            }
        };

        // 6: pace, then spend the delay within the platform's limits.
        let delay = match &metering {
            Metering::Counted { count, decision } if !decision.delay.is_zero() => {
                let paced = self
                    .pace(&key, claim.as_ref(), now_ms, decision.delay, count.reset_at)
                    .await;
                match paced {
                    Ok(delay) => delay,
                    Err(retry_after) => {
                        outcome.backlog_refused = true;
                        self.meter.record(&outcome);
                        return Err(GateError::BacklogFull { retry_after });
                    }
                }
            }
            _ => Duration::ZERO,
        };
        if let Metering::Counted { decision, .. } = &metering {
            outcome.tier = Some(decision.tier);
            outcome.reminder = decision.reminder;
            outcome.delay = delay;
        }
        let remaining = remaining.map(|r| r.saturating_sub(started.elapsed()));
        let budget = delay::budget(
            remaining,
            self.config.policy.gateway_timeout,
            self.config.policy.delay_margin,
        );
        let plan = delay::plan(delay, self.config.policy.delay_mode, budget);
        if !plan.sleep.is_zero() {
            tokio::time::sleep(plan.sleep).await;
        }

        // 7: forward, within the answer's deadline.
        let job = self.job(&identity, &scan.body, scan_id, &metering, plan, now_ms);
        let within = enqueue_within(started, ceiling);
        if let Err(e) = self.enqueue(&job, claim.is_some(), within).await {
            outcome.enqueue_error = true;
            self.meter.record(&outcome);
            return Err(self
                .enqueue_failed(e, &key, &metering, claim.as_ref(), count_args.period_end)
                .await);
        }

        // 8–9: answer, save the answer for a keyed retry, and meter.
        self.meter.record(&outcome);
        let accepted = self.accepted(&identity, &limits, &metering, &job, plan, now);
        let response = accepted.to_response();
        if let Some(claim) = &claim {
            self.save(claim, &response).await;
        }
        Ok(response)
    }

    /// Answers a key seen before: replay, mismatch, in progress, or finish
    /// the job an earlier attempt left unsettled.
    #[allow(clippy::too_many_arguments)]
    async fn resume(
        &self,
        subject: Subject<'_>,
        body: &serde_json::Map<String, serde_json::Value>,
        claim: &Claim,
        record: Record,
        now_ms: i64,
        started: Instant,
        ceiling: Duration,
    ) -> Result<Response<Bytes>, GateError> {
        if record.fingerprint != claim.fingerprint {
            return Err(GateError::IdempotencyMismatch);
        }
        if record.is_done() {
            if let Some(response) = record.response.as_deref().and_then(respond::replay) {
                return Ok(response);
            }
        }
        if now_ms < record.lease_until_ms {
            let wait = (record.lease_until_ms - now_ms).div_euclid(1000) + 1;
            return Err(GateError::IdempotencyInProgress {
                retry_after: u64::try_from(wait).unwrap_or(1),
            });
        }
        // The attempt that wrote the record gave up without knowing whether
        // its job landed (or died). Take over its lease, so only one retry
        // re-queues, and queue the same job once more: the stream adds it at
        // most once per scanId; SQS consumers deduplicate on it.
        let lease = now_ms.saturating_add(millis_i64(ceiling));
        let taken = self
            .bounded(
                self.store
                    .take_over(&claim.record, record.lease_until_ms, lease),
            )
            .await;
        if !matches!(taken, Ok(true)) {
            return Err(GateError::IdempotencyInProgress { retry_after: 1 });
        }
        let metering = if record.count == 0 {
            Metering::Unmetered {
                count_may_land: false,
            }
        } else {
            Metering::Counted {
                count: Count {
                    used: record.count,
                    reset_at: record.reset_at,
                    now: now_ms.div_euclid(1000),
                },
                decision: decide(record.count, subject.limits),
            }
        };
        let delay = match (&metering, record.delay_ms) {
            (Metering::Counted { .. }, Some(ms)) => Duration::from_millis(ms),
            (Metering::Counted { decision, .. }, None) => decision.delay,
            (Metering::Unmetered { .. }, _) => Duration::ZERO,
        };
        // Nothing is slept again: what is left of the delay holds the job back.
        let owed = record
            .received_ms
            .saturating_add(millis_i64(delay))
            .saturating_sub(now_ms);
        let plan = DelayPlan {
            total: delay,
            sleep: Duration::ZERO,
            deferred: Duration::from_millis(u64::try_from(owed).unwrap_or(0)).min(delay),
        };
        let scan_id = record.scan_id.parse().unwrap_or_else(|_| Uuid::now_v7());
        let job = self.job(
            subject.identity,
            body,
            scan_id,
            &metering,
            plan,
            record.received_ms,
        );
        let within = enqueue_within(started, ceiling);
        if let Err(e) = self.enqueue(&job, true, within).await {
            let period = period_end(self.config.policy.reset, now_ms.div_euclid(1000));
            return Err(self
                .enqueue_failed(e, subject.key, &metering, Some(claim), period)
                .await);
        }
        let accepted = self.accepted(
            subject.identity,
            subject.limits,
            &metering,
            &job,
            plan,
            now_ms.div_euclid(1000),
        );
        let response = accepted.to_response();
        self.save(claim, &response).await;
        Ok(response)
    }

    /// One pacing step; the delay the scan gets, or `Err(retry_after_secs)`
    /// when it would exceed the backlog cap. With pacing off, or when the
    /// store fails here, the tier's fixed delay.
    async fn pace(
        &self,
        key: &QuotaKey,
        claim: Option<&Claim>,
        now_ms: i64,
        tier_delay: Duration,
        reset_at: i64,
    ) -> Result<Duration, u64> {
        if self.config.policy.pacing == Pacing::Off {
            return Ok(tier_delay);
        }
        let args = PaceArgs {
            key,
            record: claim.map(|c| c.record.as_str()),
            arrival_ms: now_ms,
            delay_ms: u64::try_from(tier_delay.as_millis()).unwrap_or(u64::MAX),
            max_backlog_ms: u64::try_from(self.config.policy.max_backlog.as_millis())
                .unwrap_or(u64::MAX),
            reset_at,
        };
        match self.bounded(self.store.pace(args)).await {
            Ok(Paced::Slot { delay_ms }) => Ok(Duration::from_millis(delay_ms)),
            Ok(Paced::Full { retry_after_ms }) => {
                // Refused, so not counted: take the count (and a keyed
                // scan's record) back, bounded to the counter that counted it.
                let record = claim.map(|c| (c.record.as_str(), c.scan_id.as_str()));
                self.refund(key, reset_at, record).await;
                Err(retry_after_ms.div_ceil(1000).max(1))
            }
            Err(e) => {
                // Counted already: slow it by its tier at least.
                tracing::warn!(error = %e, "pacing failed; using the tier's delay");
                Ok(tier_delay)
            }
        }
    }

    /// One store call, bounded by the store timeout and skipped while the
    /// breaker is open.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.breaker.admit() {
            return Err(StoreError::CircuitOpen);
        }
        let result = timeout(self.config.store.timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        self.breaker.record(result.is_ok());
        result
    }

    /// Takes back a count (of its own period only) and a keyed scan's
    /// record. Sent on the same connection after the count, so even when
    /// the count is stuck in a stalled store, the refund runs after it. A
    /// refund that fails leaves the subject one scan short for the day; the
    /// client got a 503 either way, so it is logged, not retried.
    async fn refund(&self, key: &QuotaKey, period_end: i64, record: Option<(&str, &str)>) {
        let refund = Refund {
            key,
            period_end,
            record,
        };
        let refunded = timeout(self.config.store.timeout, self.store.refund(refund))
            .await
            .unwrap_or(Err(StoreError::Timeout));
        if let Err(e) = refunded {
            tracing::warn!(error = %e, "refund failed");
        }
    }

    async fn enqueue(
        &self,
        job: &ScanJob,
        keyed: bool,
        within: Duration,
    ) -> Result<(), QueueError> {
        let enqueue = async {
            if keyed {
                self.queue.enqueue_once(job).await
            } else {
                self.queue.enqueue(job).await
            }
        };
        timeout(within, enqueue)
            .await
            .unwrap_or(Err(QueueError::Timeout))
    }

    /// After a failed enqueue: the 503, with the count and record put right.
    /// A known failure refunds. A timeout may still land: a keyed scan keeps
    /// its count and record, and frees its lease so the retry settles it; an
    /// unkeyed one is refunded (after the job, if the job is stuck in the
    /// same stalled Valkey), so a late job runs uncounted rather than a
    /// missing one being charged.
    async fn enqueue_failed(
        &self,
        e: QueueError,
        key: &QuotaKey,
        metering: &Metering,
        claim: Option<&Claim>,
        period_end: i64,
    ) -> GateError {
        tracing::warn!(error = %e, "enqueue failed");
        let unknown = matches!(e, QueueError::Timeout);
        match (unknown, claim) {
            (true, Some(claim)) => {
                let released =
                    timeout(self.config.store.timeout, self.store.release(&claim.record)).await;
                if !matches!(released, Ok(Ok(()))) {
                    tracing::warn!(
                        "could not release an idempotency lease; the retry waits for it"
                    );
                }
            }
            _ => {
                let period = match metering {
                    Metering::Counted { count, .. } => Some(count.reset_at),
                    Metering::Unmetered {
                        count_may_land: true,
                    } => Some(period_end),
                    Metering::Unmetered {
                        count_may_land: false,
                    } => None,
                };
                if let Some(period) = period {
                    let record = claim.map(|c| (c.record.as_str(), c.scan_id.as_str()));
                    self.refund(key, period, record).await;
                }
            }
        }
        GateError::QueueFailed {
            queued: if unknown { Queued::Unknown } else { Queued::No },
        }
    }

    /// Saves a keyed scan's answer, for its repeats. If this fails, a
    /// repeat finds the record pending and queues the same job again once
    /// its lease is over (which the stream deduplicates).
    /// The fingerprint and scanId are written too: when the claim itself
    /// never landed (the store stalled, the scan was accepted unmetered), this
    /// is the whole record.
    async fn save(&self, claim: &Claim, response: &Response<Bytes>) {
        let fields = [
            ("state", "done".to_owned()),
            ("fp", claim.fingerprint.clone()),
            ("response", respond::save(response)),
        ];
        let saved = timeout(
            self.config.store.timeout,
            self.store.update_record(&claim.record, &fields),
        )
        .await;
        if !matches!(saved, Ok(Ok(()))) {
            tracing::warn!("could not save an idempotent answer");
        }
    }

    fn accepted(
        &self,
        identity: &Identity,
        limits: &crate::decide::Limits,
        metering: &Metering,
        job: &ScanJob,
        plan: DelayPlan,
        now: i64,
    ) -> Accepted {
        let (used, remaining, reminder, reset_at, seconds_to_reset) = match metering {
            Metering::Counted { count, decision } => (
                Some(count.used),
                decision.remaining,
                decision.reminder,
                count.reset_at,
                count.seconds_to_reset(),
            ),
            Metering::Unmetered { .. } => {
                let (reset_at, secs) = next_utc_midnight(now);
                (None, u64::from(limits.limit.get()), false, reset_at, secs)
            }
        };
        Accepted {
            scan_id: job.scan_id,
            scope: identity.scope,
            limit: limits.limit.get(),
            used,
            remaining,
            reset_at,
            seconds_to_reset,
            plan,
            not_before_ms: job.not_before_ms,
            token: identity.token,
            reminder,
        }
    }

    fn job(
        &self,
        identity: &Identity,
        body: &serde_json::Map<String, serde_json::Value>,
        scan_id: Uuid,
        metering: &Metering,
        plan: DelayPlan,
        received_ms: i64,
    ) -> ScanJob {
        let not_before_ms = received_ms.saturating_add(millis_i64(plan.total));
        ScanJob {
            version: crate::job::JOB_VERSION,
            scan_id,
            received_at: respond::rfc3339_ms(received_ms),
            scope: identity.scope.as_str(),
            digest: identity.digest.to_string(),
            tier: metering.tier(),
            limit: identity.limit.get(),
            count: metering.used(),
            delay_ms: u64::try_from(plan.total.as_millis()).unwrap_or(u64::MAX),
            deferred_ms: u64::try_from(plan.deferred.as_millis()).unwrap_or(u64::MAX),
            not_before: respond::rfc3339_ms(not_before_ms),
            not_before_ms,
            request: body.clone(),
        }
    }
}

/// How long an enqueue may take: at most [`ENQUEUE_TIMEOUT`], and never past
/// the answer's deadline (`started + ceiling`): a job queued after the client
/// saw a gateway timeout would be retried and counted twice.
fn enqueue_within(started: Instant, ceiling: Duration) -> Duration {
    ENQUEUE_TIMEOUT.min((started + ceiling).saturating_duration_since(Instant::now()))
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How a scan was metered: counted, with the decision on its count, or
/// accepted uncounted because the store did not answer (fail open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metering {
    Counted {
        count: Count,
        decision: Decision,
    },
    Unmetered {
        /// The count timed out: it was sent and may still land.
        count_may_land: bool,
    },
}

impl Metering {
    /// The job's and the logs' tier: `within`, `soft`, `hard` or `unmetered`.
    pub fn tier(&self) -> &'static str {
        match self {
            Self::Counted { decision, .. } => decision.tier.as_str(),
            Self::Unmetered { .. } => "unmetered",
        }
    }

    /// The count, 0 when unmetered.
    pub fn used(&self) -> u64 {
        match self {
            Self::Counted { count, .. } => count.used,
            Self::Unmetered { .. } => 0,
        }
    }
}

/// The subject of one request, as the later steps need it.
#[derive(Clone, Copy)]
struct Subject<'a> {
    identity: &'a Identity,
    key: &'a QuotaKey,
    limits: &'a crate::decide::Limits,
}

/// The next 00:00 UTC and the seconds to it (used only when the store, which
/// holds the counter's real expiry, did not answer).
fn next_utc_midnight(secs: i64) -> (i64, u64) {
    let midnight = secs - secs.rem_euclid(86_400) + 86_400;
    (midnight, (midnight - secs) as u64)
}
