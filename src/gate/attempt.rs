//! The request as a front end hands it over, and one identified request ([`Attempt`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::{DelayMode, Policy, ResetPolicy};
use crate::gate::identity::{Identity, Origin};
use crate::io::meter::{Exit, Metered, Outcome};
use crate::io::queue::ENQUEUE_TIMEOUT;
use crate::io::store::{Claim, LevelCount, PaceLane, QuotaKey, Tally, period_end};
use crate::rules::decide::{Limits, decide};
use crate::rules::delay::{self, DelayPlan, SleepAsk, SleepLease};
use crate::rules::level::{Level, LevelName, most_severe};
use crate::rules::settle::Charge;
use crate::rules::trace::{TraceContext, TraceId};
use crate::rules::unix::{UnixMillis, UnixSecs, duration_ms};

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
    /// Trace context given outside the headers (Lambda's X-Ray context); it wins over any header.
    pub trace: Option<TraceContext>,
    /// The platform's id of the request (Lambda's), logged beside its trace.
    pub request_id: Option<String>,
}

/// One identified scan request, as the steps after identification see it.
pub(super) struct Attempt {
    pub identity: Identity,
    pub key: QuotaKey,
    pub limits: Limits,
    /// The levels above the subject, counted with it, in the order the store is asked and answers.
    pub levels: Vec<Level>,
    pub claim: Option<Claim>,
    /// The one clock reading.
    pub now_ms: UnixMillis,
    /// The expiry a new counter gets.
    pub period_end: UnixSecs,
    /// `QUOTA_RESET`, for the reset an uncounted scan's answer reports.
    pub reset: ResetPolicy,
    /// The answer's deadline: min(Lambda's remaining time, gateway timeout).
    pub ceiling: Duration,
    pub remaining: Option<Duration>,
    pub started: Instant,
    /// The request's trace: its job carries it, its EMF line its id.
    pub trace: Option<TraceContext>,
}

impl GateRequest {
    /// What the platform says of the request besides its headers.
    pub fn origin(&self) -> Origin<'_> {
        Origin {
            peer: self.peer,
            gateway_claims: self.gateway_claims.as_ref(),
        }
    }

    /// The id of the request's trace, once the gate has given it one.
    pub fn trace_id(&self) -> Option<TraceId> {
        self.trace.as_ref().map(|t| t.trace_id)
    }
}

impl Attempt {
    pub fn new(
        mut identity: Identity,
        idempotency_key: Option<&str>,
        request: &GateRequest,
        policy: &Policy,
        now_ms: UnixMillis,
        started: Instant,
    ) -> Self {
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let ceiling = delay::ceiling(request.remaining, policy.gateway_timeout);
        let claim = idempotency_key.map(|k| Claim {
            record: key.idempotency(k),
            scan_id: crate::io::clock::uuid_v7(now_ms),
            fingerprint: crate::gate::idempotency::fingerprint(&request.body),
            received_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(ceiling),
        });
        Self {
            levels: std::mem::take(&mut identity.levels),
            period_end: period_end(policy.reset, now_ms.secs()),
            reset: policy.reset,
            limits: policy.limits(identity.limit),
            identity,
            key,
            claim,
            now_ms,
            ceiling,
            remaining: request.remaining,
            started,
            trace: request.trace.clone(),
        }
    }

    /// How a counted scan is metered: the most severe decision of its subject and answered levels.
    pub fn charge(&mut self, tally: Tally) -> Charge {
        self.counted(tally.levels);
        let count = tally.subject;
        let subject = decide(count.used, &self.limits.with_grant(count.grant));
        let levels = self.levels.iter();
        let decided = levels.filter_map(|l| Some((l.name, l.counted()?.0)));
        let (level, decision) = most_severe(subject, decided);
        Charge::Counted {
            count,
            decision,
            level,
        }
    }

    /// Records what the count did at each level, in the order the store was asked.
    pub fn counted(&mut self, counts: Vec<LevelCount>) {
        for (level, count) in self.levels.iter_mut().zip(counts) {
            level.count = Some(count);
        }
    }

    /// The lines a counted scan waits in above its subject: each level over its limit.
    pub fn pace_lanes(&self) -> Vec<PaceLane<'_>> {
        self.levels
            .iter()
            .filter_map(|level| {
                let (delay_ms, reset_at) = level.line()?;
                Some(PaceLane {
                    key: &level.key,
                    delay_ms,
                    reset_at,
                })
            })
            .collect()
    }

    /// How a fresh scan's `delay` is spent: what fits the sleep budget in the handler if the scan
    /// took a sleep lease, the rest deferred. Both count from the arrival, not from the store's
    /// answers.
    pub fn plan(
        &self,
        delay: Duration,
        policy: &Policy,
        sleep_lease: Option<SleepLease>,
    ) -> DelayPlan {
        let cap = match sleep_lease {
            Some(SleepLease { taken: true, .. }) => self.sleep_budget(policy),
            _ => Duration::ZERO,
        };
        delay::plan(delay, policy.delay_mode, cap)
    }

    /// What may be served in the handler from the arrival: the ceiling less the margin, or less the
    /// store's round trips so far if longer; nothing in `defer` mode. Whole ms, as the answer says.
    fn sleep_budget(&self, policy: &Policy) -> Duration {
        let margin = policy.delay_margin.max(self.started.elapsed());
        Duration::from_millis(duration_ms(self.sleep_within(policy, margin)))
    }

    /// What the handler may sleep, keeping `margin` (nothing in `defer` mode).
    fn sleep_within(&self, policy: &Policy, margin: Duration) -> Duration {
        match policy.delay_mode {
            DelayMode::Defer => Duration::ZERO,
            DelayMode::Sleep => delay::budget(self.remaining, policy.gateway_timeout, margin),
        }
    }

    /// The sleep lease a scan owing a delay asks for; none where it would not sleep (`defer`, no
    /// budget left, `QUOTA_MAX_ASLEEP=0`). Its lease lasts the budget, counted from the arrival.
    pub fn sleep_ask(&self, policy: &Policy, scan_id: Uuid) -> Option<SleepAsk> {
        let budget = self.sleep_budget(policy);
        let left = budget.saturating_sub(self.started.elapsed());
        (policy.max_asleep > 0 && !left.is_zero()).then(|| SleepAsk {
            id: scan_id,
            budget_ms: duration_ms(budget),
            max_asleep: policy.max_asleep,
        })
    }

    /// The key of the line `level` names: the subject's, or a level's.
    pub fn key_of(&self, level: LevelName) -> &QuotaKey {
        self.levels
            .iter()
            .find(|l| l.name == level)
            .map_or(&self.key, |l| &l.key)
    }

    /// The subject's key and its levels': what a remembered refusal is looked up by.
    pub fn keys(&self) -> impl Iterator<Item = &QuotaKey> {
        std::iter::once(&self.key).chain(self.levels.iter().map(|l| &l.key))
    }

    /// The longest the first attempt of this key may sleep: what a 409 waits for.
    pub fn sleep_cap(&self, policy: &Policy) -> Duration {
        self.sleep_within(policy, policy.delay_margin)
    }

    pub fn now(&self) -> UnixSecs {
        self.now_ms.secs()
    }

    pub fn keyed(&self) -> bool {
        self.claim.is_some()
    }

    /// The lease a claim or a take-over holds: until the answer's deadline.
    pub fn lease_until_ms(&self) -> UnixMillis {
        self.now_ms.saturating_add(self.ceiling)
    }

    /// The answer's deadline (arrival plus ceiling); nothing the request path awaits runs past it.
    pub fn deadline(&self) -> Instant {
        self.started + self.ceiling
    }

    /// How long an enqueue may take; never past the answer's deadline, since a job queued after
    /// the client saw a gateway timeout would be retried and counted twice.
    pub fn enqueue_within(&self) -> Duration {
        enqueue_within(self.started, self.ceiling)
    }

    /// The meter's record of this request.
    pub fn exit(&self, metered: Metered, outcome: Outcome) -> Exit {
        Exit {
            scope: self.identity.scope,
            outcome,
            metered,
            at: self.now_ms,
            sleep_lease: None,
            trace: self.trace_id(),
        }
    }

    pub fn trace_id(&self) -> Option<TraceId> {
        self.trace.as_ref().map(|t| t.trace_id)
    }
}

/// How long an enqueue may take: at most [`ENQUEUE_TIMEOUT`], never past `started + ceiling`.
pub(super) fn enqueue_within(started: Instant, ceiling: Duration) -> Duration {
    ENQUEUE_TIMEOUT.min((started + ceiling).saturating_duration_since(Instant::now()))
}
