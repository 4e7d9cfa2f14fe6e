//! What the request path works on: the request as a front end hands it
//! over ([`GateRequest`]), one identified request ([`Attempt`]), and the
//! scan that goes ahead ([`Scan`]), with the job and the 202 built from it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use crate::job::RequestBody;
use bytes::Bytes;
use http::{HeaderMap, Method};
use tokio::time::Instant;
use uuid::Uuid;

use crate::check::ShadowVerdict;
use crate::config::{DelayMode, Policy, ResetPolicy};
use crate::decide::{Decision, Limits, decide};
use crate::delay::{self, DelayPlan};
use crate::identity::Identity;
use crate::job::JobTier;
use crate::level::{LevelName, most_severe};
use crate::meter::{End, Exit, Metered};
use crate::queue::{ENQUEUE_TIMEOUT, ScanJob};
use crate::respond::{self, Accepted, LevelStanding, Standing};
use crate::settle::{Metering, Resumed};
use crate::store::{Claim, Count, Lane, PaceLane, Peek, QuotaKey, Tally, period_end};
use crate::unix::{UnixMillis, UnixSecs, duration_ms};

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

/// One identified scan request, as the steps after identification see it.
pub(super) struct Attempt {
    pub identity: Identity,
    pub key: QuotaKey,
    pub limits: Limits,
    /// The keys of the levels above the subject, counted with it, and
    /// each level's name and limits, in the same order (the store's
    /// answers come in it too).
    pub level_keys: Vec<QuotaKey>,
    pub level_rules: Vec<(LevelName, Limits)>,
    /// A keyed request's claim on its record.
    pub claim: Option<Claim>,
    /// The one clock reading.
    pub now_ms: UnixMillis,
    /// The expiry a new counter gets.
    pub period_end: UnixSecs,
    /// `QUOTA_RESET`, for the reset an uncounted scan's answer reports.
    pub reset: ResetPolicy,
    /// The answer's deadline: min(Lambda's remaining time, gateway timeout).
    pub ceiling: Duration,
    /// Lambda's remaining time at arrival, if in Lambda.
    pub remaining: Option<Duration>,
    pub started: Instant,
}

impl Attempt {
    /// Everything the later steps need to know about one identified scan
    /// request, read at `now_ms`.
    pub fn new(
        identity: Identity,
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
            scan_id: crate::clock::uuid_v7(now_ms),
            fingerprint: crate::idempotency::fingerprint(&request.body),
            received_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(ceiling),
        });
        let (level_keys, level_rules) = level_lines(&identity, policy);
        Self {
            level_keys,
            level_rules,
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
        }
    }

    /// How a counted scan is metered: decided at its subject and at each
    /// level that answered ([`most_severe`]); the levels' counts go with it.
    pub fn metering(&self, tally: Tally) -> (Metering, Vec<Lane>) {
        let count = tally.subject;
        let subject = decide(count.used, &self.limits.with_grant(count.grant));
        let levels = self.level_decisions(&tally.levels);
        let (level, decision) = most_severe(subject, levels.map(|(name, d, _)| (name, d)));
        let metering = Metering::Counted {
            count,
            decision,
            level,
        };
        (metering, tally.levels)
    }

    /// Each counted level's name, decision and count.
    pub fn level_decisions<'a>(
        &'a self,
        lanes: &'a [Lane],
    ) -> impl Iterator<Item = (LevelName, Decision, Count)> + 'a {
        self.level_rules
            .iter()
            .zip(self.level_decisions_all(lanes))
            .filter_map(|((name, _), decided)| decided.map(|(d, c)| (*name, d, c)))
    }

    /// The lines a counted scan waits in above its subject: each counted
    /// level's, with its own tier delay (none: within its limit).
    pub fn pace_lanes<'a>(&'a self, lanes: &'a [Lane]) -> Vec<PaceLane<'a>> {
        self.level_keys
            .iter()
            .zip(self.level_decisions_all(lanes))
            .filter_map(|(key, decided)| {
                let (decision, count) = decided?;
                Some(PaceLane {
                    key,
                    delay_ms: duration_ms(decision.delay),
                    reset_at: count.reset_at,
                })
            })
            .collect()
    }

    /// Each level's decision and count, `None` where its count failed.
    fn level_decisions_all<'a>(
        &'a self,
        lanes: &'a [Lane],
    ) -> impl Iterator<Item = Option<(Decision, Count)>> + 'a {
        self.level_rules
            .iter()
            .zip(lanes)
            .map(|((_, limits), lane)| match lane {
                Lane::Counted(c) => Some((decide(c.used, &limits.with_grant(c.grant)), *c)),
                Lane::Failed { .. } => None,
            })
    }

    /// The levels of a scan whose count failed: each shares its fate.
    pub fn failed_lanes(&self, may_land: bool) -> Vec<Lane> {
        vec![Lane::Failed { may_land }; self.level_keys.len()]
    }

    /// How a fresh scan's `delay` is spent: what fits the budget left now
    /// is slept, the rest deferred.
    pub fn plan(&self, delay: Duration, policy: &Policy) -> DelayPlan {
        let remaining = self
            .remaining
            .map(|r| r.saturating_sub(self.started.elapsed()));
        let budget = delay::budget(remaining, policy.gateway_timeout, policy.delay_margin);
        delay::plan(delay, policy.delay_mode, budget)
    }

    /// The longest the first attempt of this key may sleep: what a 409
    /// waits for.
    pub fn sleep_cap(&self, policy: &Policy) -> Duration {
        match policy.delay_mode {
            DelayMode::Defer => Duration::ZERO,
            DelayMode::Sleep => {
                delay::budget(self.remaining, policy.gateway_timeout, policy.delay_margin)
            }
        }
    }

    /// The clock reading's second.
    pub fn now(&self) -> UnixSecs {
        self.now_ms.secs()
    }

    /// The claim's scanId (nil for an unkeyed scan, whose refunds name none).
    pub fn scan_id(&self) -> Uuid {
        self.claim.as_ref().map_or(Uuid::nil(), |c| c.scan_id)
    }

    pub fn keyed(&self) -> bool {
        self.claim.is_some()
    }

    /// The lease a claim or a take-over holds: until the answer's deadline.
    pub fn lease_until_ms(&self) -> UnixMillis {
        self.now_ms.saturating_add(self.ceiling)
    }

    /// How long an enqueue may take: at most [`ENQUEUE_TIMEOUT`], and never
    /// past the answer's deadline: a job queued after the client saw a
    /// gateway timeout would be retried and counted twice.
    pub fn enqueue_within(&self) -> Duration {
        enqueue_within(self.started, self.ceiling)
    }

    /// The meter's record of this request.
    pub fn exit(&self, metered: Metered, end: End) -> Exit {
        Exit {
            scope: self.identity.scope,
            metered,
            end,
            at: self.now_ms,
        }
    }
}

/// The scan that goes ahead: a fresh one, or one a retry took over.
pub(super) struct Scan {
    /// Every job of a keyed scan carries its record's scanId.
    pub scan_id: Uuid,
    pub metering: Metering,
    /// What each level above the subject counted (in the attempt's order).
    pub lanes: Vec<Lane>,
    /// When the scan arrived (the first attempt's, when resumed).
    pub received_ms: UnixMillis,
    /// Taken over from an earlier attempt, with its plan: nothing is slept
    /// again, and the delay is not paced again.
    pub resumed: Option<DelayPlan>,
}

impl Scan {
    /// This request's scan: a keyed one under its claim's scanId.
    pub fn fresh(attempt: &Attempt, metering: Metering, lanes: Vec<Lane>) -> Self {
        Self {
            scan_id: attempt
                .claim
                .as_ref()
                .map_or_else(|| crate::clock::uuid_v7(attempt.now_ms), |c| c.scan_id),
            metering,
            lanes,
            received_ms: attempt.now_ms,
            resumed: None,
        }
    }

    /// The scan an abandoned attempt left (see [`crate::settle::resume`]).
    /// Its levels were counted (or not) by the first attempt, and are
    /// not counted again.
    pub fn resumed(resumed: Resumed) -> Self {
        Self {
            scan_id: resumed.scan_id,
            metering: resumed.metering,
            lanes: Vec::new(),
            received_ms: resumed.received_ms,
            resumed: Some(resumed.plan),
        }
    }

    /// What the meter is told of it: a fresh scan that is not counted is
    /// one whose count failed; a resumed one was counted, if at all, by its
    /// first attempt.
    pub fn metered(&self, delay: Duration, shadow: bool) -> Metered {
        match &self.metering {
            Metering::Counted {
                decision, level, ..
            } => Metered::Counted {
                tier: decision.tier,
                reminder: decision.reminder,
                delay,
                shadow,
                level: *level,
            },
            Metering::Unmetered | Metering::Unknown { .. } if self.resumed.is_none() => {
                Metered::StoreFailed
            }
            Metering::Unmetered | Metering::Unknown { .. } => Metered::Uncounted,
        }
    }

    /// The job to queue, carrying the scan's `body`, held back until
    /// `received + plan.total`.
    pub fn job(&self, identity: &Identity, body: RequestBody, plan: DelayPlan) -> ScanJob {
        let held = Held {
            scan_id: self.scan_id,
            received_ms: self.received_ms,
            plan,
        };
        scan_job(
            identity,
            held,
            self.metering.into(),
            self.metering.used(),
            body,
        )
    }

    /// The 202 for its queued `job`. Uncounted, it reports the whole limit
    /// until the period's end, as an exempt scan's does without the store.
    pub fn accepted(
        &self,
        attempt: &Attempt,
        job: &ScanJob,
        plan: DelayPlan,
        shadow: bool,
    ) -> Accepted {
        let (used, peek, reminder, verdict, level) = match &self.metering {
            // A grant raises the ceiling the answer reports, as it did the tier's.
            Metering::Counted {
                count,
                decision,
                level,
            } => (
                Some(count.used),
                Some(Peek::from(*count)),
                decision.reminder,
                shadow.then(|| ShadowVerdict::new(decision.tier, decision.delay)),
                Some(*level),
            ),
            Metering::Unmetered | Metering::Unknown { .. } => (None, None, false, None, None),
        };
        // Each level counted with it, where it stands after this scan.
        let levels = attempt
            .level_rules
            .iter()
            .zip(&self.lanes)
            .filter_map(|((name, limits), lane)| match lane {
                Lane::Counted(c) => Some(LevelStanding {
                    name: *name,
                    used: c.used,
                    standing: Standing::of(
                        Some(&Peek::from(*c)),
                        *limits,
                        attempt.reset,
                        attempt.now(),
                    ),
                }),
                Lane::Failed { .. } => None,
            })
            .collect();
        Accepted {
            scan_id: job.scan_id,
            scope: attempt.identity.scope,
            used,
            standing: Standing::of(peek.as_ref(), attempt.limits, attempt.reset, attempt.now()),
            plan,
            not_before_ms: job.not_before_ms,
            token: attempt.identity.token,
            reminder,
            shadow: verdict,
            level,
            levels,
        }
    }
}

/// The levels above an identified subject: each one's key, and its name
/// and limits, in the same order (a scan counts them, `GET /quota` reads
/// them).
pub(super) fn level_lines(
    identity: &Identity,
    policy: &Policy,
) -> (Vec<QuotaKey>, Vec<(LevelName, Limits)>) {
    let keys = identity
        .levels
        .iter()
        .map(|l| QuotaKey::level(&l.digest))
        .collect();
    let rules = identity
        .levels
        .iter()
        .map(|l| {
            let base = policy.limits(l.limit);
            (l.name, policy.levels.limits(l.name, l.limit, base))
        })
        .collect();
    (keys, rules)
}

/// When a job may start: its scan's id and arrival, and the delay that
/// holds it back.
pub(super) struct Held {
    pub scan_id: Uuid,
    pub received_ms: UnixMillis,
    pub plan: DelayPlan,
}

/// The one construction of a job (counted, unmetered or exempt): the
/// subject's, with its `tier` and `count`, held as `held` says, carrying
/// the scan's `body`.
pub(super) fn scan_job(
    identity: &Identity,
    held: Held,
    tier: JobTier,
    count: u64,
    body: RequestBody,
) -> ScanJob {
    let not_before_ms = held.received_ms.saturating_add(held.plan.total).get();
    ScanJob {
        version: crate::job::JOB_VERSION,
        scan_id: held.scan_id,
        received_at: respond::rfc3339_ms(held.received_ms.get()),
        scope: identity.scope,
        digest: identity.digest.to_string(),
        tier,
        limit: identity.limit.get(),
        count,
        delay_ms: duration_ms(held.plan.total),
        deferred_ms: duration_ms(held.plan.deferred),
        not_before: respond::rfc3339_ms(not_before_ms),
        not_before_ms,
        request: body,
    }
}

/// How long an enqueue may take: at most [`ENQUEUE_TIMEOUT`], and never
/// past `started + ceiling`, the answer's deadline.
pub(super) fn enqueue_within(started: Instant, ceiling: Duration) -> Duration {
    ENQUEUE_TIMEOUT.min((started + ceiling).saturating_duration_since(Instant::now()))
}
