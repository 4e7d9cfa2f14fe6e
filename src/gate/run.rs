//! Steps 6–8 for a scan that may go ahead, fresh or taken over: pace,
//! sleep, queue, answer, save the answer; and the job and the 202 built
//! from what is known of the scan.

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use serde_json::{Map, Value};
use tokio::time::{Instant, timeout};
use uuid::Uuid;

use super::{Attempt, ENQUEUE_TIMEOUT, Gate, millis_i64, next_utc_midnight};
use crate::bugs::{self, Bug};
use crate::check::ShadowVerdict;
use crate::config::{DelayMode, Mode, Pacing};
use crate::decide::decide;
use crate::delay::{self, DelayPlan};
use crate::error::{GateError, Queued};
use crate::identity::Identity;
use crate::meter::Outcome;
use crate::queue::{QueueError, ScanJob, ScanQueue};
use crate::respond::{self, Accepted};
use crate::settle::{Failure, Metering, Settlement, settle};
use crate::store::{Count, PaceArgs, Paced, QuotaStore, Record};

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    /// Steps 6–8 for a scan that may go ahead: pace, sleep, queue, answer,
    /// and save the answer for a keyed retry.
    pub(super) async fn run(
        &self,
        attempt: &Attempt,
        body: &Map<String, Value>,
        scan: Scan,
        outcome: &mut Outcome,
    ) -> Result<Response<Bytes>, GateError> {
        let delay = self.delay_of(attempt, &scan, outcome).await?;
        if let Metering::Counted { decision, .. } = &scan.metering {
            outcome.tier = Some(decision.tier);
            outcome.reminder = decision.reminder;
            outcome.delay = delay;
            outcome.shadow = self.shadow();
        }
        let plan = self.plan(attempt, &scan, delay);
        if !plan.sleep.is_zero() {
            tokio::time::sleep(plan.sleep).await;
        }
        // 7: forward, within the answer's deadline.
        let job = self.job(&attempt.identity, body, &scan, plan);
        let within = enqueue_within(attempt.started, attempt.ceiling);
        if let Err(e) = self.enqueue(&job, attempt.claim.is_some(), within).await {
            tracing::warn!(error = %e, "enqueue failed");
            outcome.enqueue_error = true;
            let (failure, queued) = match e {
                QueueError::Timeout => (Failure::QueueUnknown, Queued::Unknown),
                // A taken-over scan's earlier attempt may have queued it
                // (its queue did not answer): not known, so nothing refunded.
                QueueError::Backend(_) if scan.resumed => (Failure::QueueUnknown, Queued::Unknown),
                QueueError::Backend(_) => (Failure::NotQueued, Queued::No),
            };
            let mut settlement = settle(&scan.metering, attempt.claim.is_some(), failure);
            if bugs::on(Bug::RefundOfUnsentCount) && scan.metering == Metering::Unmetered {
                settlement = Settlement::Refund {
                    period_end: i64::MAX,
                };
            }
            self.apply(attempt, scan.scan_id, settlement).await;
            return Err(GateError::QueueFailed { queued });
        }
        // 8: answer, and save the answer for a keyed retry.
        let response = self
            .accepted(attempt, &scan.metering, &job, plan)
            .to_response();
        if let Some(claim) = &attempt.claim {
            self.save(claim, scan.scan_id, &response, attempt.now())
                .await;
        }
        Ok(response)
    }

    /// Step 6: the delay a scan owes, paced; a scan past the backlog cap is
    /// refused (and its count taken back).
    async fn delay_of(
        &self,
        attempt: &Attempt,
        scan: &Scan,
        outcome: &mut Outcome,
    ) -> Result<Duration, GateError> {
        let Metering::Counted { count, decision } = &scan.metering else {
            return Ok(Duration::ZERO);
        };
        // Shadow mode: decided and metered, but nobody waits and no pacing
        // slot is taken, so switching to enforce inherits no backlog.
        if self.shadow() {
            return Ok(Duration::ZERO);
        }
        if let Some(paced) = scan.paced {
            return Ok(paced);
        }
        if decision.delay.is_zero() {
            return Ok(Duration::ZERO);
        }
        // A taken-over scan whose first attempt was never paced may have its
        // job queued already (the queue did not answer): refusing it now
        // would refund a count whose job runs. It takes its tier's delay,
        // as that attempt did when pacing failed.
        if scan.resumed {
            return Ok(decision.delay);
        }
        match self
            .pace(attempt, scan, decision.delay, count.reset_at)
            .await
        {
            Ok(delay) => Ok(delay),
            Err(retry_after_ms) => {
                outcome.backlog_refused = true;
                outcome.tier = None;
                let settlement = settle(
                    &scan.metering,
                    attempt.claim.is_some(),
                    Failure::BacklogFull,
                );
                self.apply(attempt, scan.scan_id, settlement).await;
                // Never past the counter's reset: from then the scan is within quota.
                Err(GateError::backlog_full(
                    retry_after_ms.div_ceil(1000),
                    count.seconds_to_reset(),
                ))
            }
        }
    }

    /// One pacing step: the delay the scan gets, or `Err(retry_after_ms)`
    /// when it would exceed the backlog cap. With pacing off, or when the
    /// store fails here, the tier's fixed delay (the scan is counted, so it
    /// is slowed by its tier at least).
    async fn pace(
        &self,
        attempt: &Attempt,
        scan: &Scan,
        tier_delay: Duration,
        reset_at: i64,
    ) -> Result<Duration, u64> {
        if self.config.policy.pacing == Pacing::Off {
            return Ok(tier_delay);
        }
        let args = PaceArgs {
            key: &attempt.key,
            record: attempt.claim.as_ref().map(|c| c.record.as_str()),
            arrival_ms: scan.received_ms,
            delay_ms: u64::try_from(tier_delay.as_millis()).unwrap_or(u64::MAX),
            max_backlog_ms: u64::try_from(self.config.policy.max_backlog.as_millis())
                .unwrap_or(u64::MAX),
            reset_at,
        };
        match self.bounded(self.store.pace(args)).await {
            Ok(Paced::Slot { delay_ms }) => Ok(Duration::from_millis(delay_ms)),
            Ok(Paced::Full { retry_after_ms }) => Err(retry_after_ms),
            Err(e) => {
                tracing::warn!(error = %e, "pacing failed; using the tier's delay");
                Ok(tier_delay)
            }
        }
    }

    /// How the delay is spent: a fresh scan sleeps what fits the budget and
    /// defers the rest; a resumed one sleeps nothing again, and what is left
    /// of its delay holds its job back.
    fn plan(&self, attempt: &Attempt, scan: &Scan, delay: Duration) -> DelayPlan {
        if scan.resumed {
            let owed = scan
                .received_ms
                .saturating_add(millis_i64(delay))
                .saturating_sub(attempt.now_ms);
            return DelayPlan {
                total: delay,
                sleep: Duration::ZERO,
                deferred: Duration::from_millis(u64::try_from(owed).unwrap_or(0)).min(delay),
            };
        }
        let remaining = attempt
            .remaining
            .map(|r| r.saturating_sub(attempt.started.elapsed()));
        let budget = delay::budget(
            remaining,
            self.config.policy.gateway_timeout,
            self.config.policy.delay_margin,
        );
        delay::plan(delay, self.config.policy.delay_mode, budget)
    }

    /// Whether decisions are only reported, not carried out (`QUOTA_MODE=shadow`).
    pub(super) fn shadow(&self) -> bool {
        self.config.policy.mode == Mode::Shadow
    }

    /// The longest the first attempt of a key may sleep: what a 409 waits for.
    pub(super) fn sleep_cap(&self, attempt: &Attempt) -> Duration {
        match self.config.policy.delay_mode {
            DelayMode::Defer => Duration::ZERO,
            DelayMode::Sleep => delay::budget(
                attempt.remaining,
                self.config.policy.gateway_timeout,
                self.config.policy.delay_margin,
            ),
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

    fn accepted(
        &self,
        attempt: &Attempt,
        metering: &Metering,
        job: &ScanJob,
        plan: DelayPlan,
    ) -> Accepted {
        let limits = &attempt.limits;
        // A grant raises the ceiling the answer reports, as it did the tier's.
        let limit = match metering {
            Metering::Counted { count, .. } => limits.with_grant(count.grant).limit,
            Metering::Unmetered | Metering::Unknown { .. } => limits.limit,
        };
        let (used, remaining, reminder, reset_at, seconds_to_reset) = match metering {
            Metering::Counted { count, decision } => (
                Some(count.used),
                decision.remaining,
                decision.reminder,
                count.reset_at,
                count.seconds_to_reset(),
            ),
            Metering::Unmetered | Metering::Unknown { .. } => {
                let (reset_at, secs) = next_utc_midnight(attempt.now());
                (None, u64::from(limit.get()), false, reset_at, secs)
            }
        };
        Accepted {
            scan_id: job.scan_id,
            scope: attempt.identity.scope,
            limit: limit.get(),
            used,
            remaining,
            reset_at,
            seconds_to_reset,
            plan,
            not_before_ms: job.not_before_ms,
            token: attempt.identity.token,
            reminder,
            shadow: match metering {
                Metering::Counted { decision, .. } if self.shadow() => {
                    Some(ShadowVerdict::new(decision.tier, decision.delay))
                }
                _ => None,
            },
        }
    }

    fn job(
        &self,
        identity: &Identity,
        body: &Map<String, Value>,
        scan: &Scan,
        plan: DelayPlan,
    ) -> ScanJob {
        let not_before_ms = scan.received_ms.saturating_add(millis_i64(plan.total));
        ScanJob {
            version: crate::job::JOB_VERSION,
            scan_id: scan.scan_id,
            received_at: respond::rfc3339_ms(scan.received_ms),
            scope: identity.scope,
            digest: identity.digest.to_string(),
            tier: scan.metering.into(),
            limit: identity.limit.get(),
            count: scan.metering.used(),
            delay_ms: u64::try_from(plan.total.as_millis()).unwrap_or(u64::MAX),
            deferred_ms: u64::try_from(plan.deferred.as_millis()).unwrap_or(u64::MAX),
            not_before: respond::rfc3339_ms(not_before_ms),
            not_before_ms,
            request: body.clone(),
        }
    }
}

/// The scan that goes ahead: a fresh one, or one a retry took over.
pub(super) struct Scan {
    /// Every job of a keyed scan carries its record's scanId.
    scan_id: Uuid,
    metering: Metering,
    /// Unix ms when the scan arrived (the first attempt's, when resumed).
    received_ms: i64,
    /// The delay pacing gave it already (a resumed scan's record has it).
    paced: Option<Duration>,
    /// Taken over from an earlier attempt: nothing is slept again.
    resumed: bool,
}

impl Scan {
    /// This request's scan: a keyed one under its claim's scanId.
    pub(super) fn fresh(attempt: &Attempt, metering: Metering) -> Self {
        Self {
            scan_id: attempt
                .claim
                .as_ref()
                .map_or_else(Uuid::now_v7, |c| c.scan_id),
            metering,
            received_ms: attempt.now_ms,
            paced: None,
            resumed: false,
        }
    }

    /// The scan an abandoned attempt left: its identity, its count (0: not
    /// counted) and its delay, once pacing decided it.
    /// `grant` is the subject's grant now (the record does not keep it).
    pub(super) fn resumed(record: &Record, attempt: &Attempt, grant: u64) -> Self {
        let metering = if record.count == 0 {
            Metering::Unmetered
        } else {
            Metering::Counted {
                count: Count {
                    used: record.count,
                    reset_at: record.reset_at,
                    now: attempt.now(),
                    grant,
                },
                decision: decide(record.count, &attempt.limits.with_grant(grant)),
            }
        };
        let scan_id = if bugs::on(Bug::TakeOverUnderFreshId) {
            Uuid::now_v7()
        } else {
            record.scan_id
        };
        Self {
            scan_id,
            metering,
            received_ms: record.received_ms,
            paced: record.delay_ms.map(Duration::from_millis),
            resumed: true,
        }
    }
}

/// How long an enqueue may take: at most [`ENQUEUE_TIMEOUT`], and never past
/// the answer's deadline (`started + ceiling`): a job queued after the client
/// saw a gateway timeout would be retried and counted twice.
pub(super) fn enqueue_within(started: Instant, ceiling: Duration) -> Duration {
    ENQUEUE_TIMEOUT.min((started + ceiling).saturating_duration_since(Instant::now()))
}
