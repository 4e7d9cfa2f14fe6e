//! The job and 202 built from the scan that goes ahead ([`Scan`]), and the one construction of a
//! job ([`scan_job`]), which exempt scans share.

use uuid::Uuid;

use super::attempt::Attempt;
use crate::gate::identity::Identity;
use crate::gate::quota_view::ShadowVerdict;
use crate::gate::respond::{self, Accepted, LevelStanding, Standing};
use crate::io::queue::ScanJob;
use crate::io::store::Peek;
use crate::rules::delay::DelayPlan;
use crate::rules::job::{JobTier, Lane, RequestBody};
use crate::rules::settle::{Charge, Scan};
use crate::rules::trace::TraceContext;
use crate::rules::unix::{UnixMillis, duration_ms};

/// The gate's side of a [`Scan`]: its job and its 202.
impl Scan {
    /// This request's scan: a keyed one under its claim's scanId.
    pub(super) fn fresh(attempt: &Attempt, charge: Charge) -> Self {
        Self {
            scan_id: attempt
                .claim
                .as_ref()
                .map_or_else(|| crate::io::clock::uuid_v7(attempt.now_ms), |c| c.scan_id),
            charge,
            received_ms: attempt.now_ms,
            resumed: None,
        }
    }

    /// The job to queue, held back until `received + plan.total`. Over quota, its tenant is the
    /// line of the level that delayed it, so one network's backlog takes its turn as one.
    pub(super) fn job(&self, attempt: &Attempt, body: RequestBody, plan: DelayPlan) -> ScanJob {
        let held = Held {
            scan_id: self.scan_id,
            received_ms: self.received_ms,
            plan,
        };
        let mut job = scan_job(
            &attempt.identity,
            held,
            self.charge.into(),
            self.charge.used(),
            (body, attempt.trace.clone()),
        );
        if let (Some(Lane::Over), Charge::Counted { level, .. }) = (job.lane, self.charge) {
            job.tenant = Some(attempt.key_of(level).counter.clone());
        }
        job
    }

    /// The 202 for its queued `job`; uncounted, it reports the whole limit until the period's end.
    pub(super) fn accepted(
        &self,
        attempt: &Attempt,
        job: &ScanJob,
        plan: DelayPlan,
        shadow: bool,
    ) -> Accepted {
        let (used, peek, reminder, verdict, level) = match &self.charge {
            // A grant raises the ceiling the answer reports, as it did the tier's.
            Charge::Counted {
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
            Charge::Unmetered | Charge::Unknown { .. } => (None, None, false, None, None),
        };
        // Each level counted with it, where it stands after this scan.
        let levels = attempt.levels.iter().filter_map(|level| {
            let peek = Peek::from(level.counted()?.1);
            Some(LevelStanding::of(
                level,
                &peek,
                attempt.reset,
                attempt.now(),
            ))
        });
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
            levels: levels.collect(),
        }
    }
}

/// When a job may start: its scan's id and arrival, and the delay that holds it back.
pub(super) struct Held {
    pub scan_id: Uuid,
    pub received_ms: UnixMillis,
    pub plan: DelayPlan,
}

/// The one construction of a job, counted, unmetered or exempt.
pub(super) fn scan_job(
    identity: &Identity,
    held: Held,
    tier: JobTier,
    count: u64,
    (body, trace): (RequestBody, Option<TraceContext>),
) -> ScanJob {
    let not_before_ms = held.received_ms.saturating_add(held.plan.total).get();
    ScanJob {
        version: crate::rules::job::JOB_VERSION,
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
        trace,
        lane: Some(Lane::of(tier, duration_ms(held.plan.total))),
        tenant: None,
    }
}
