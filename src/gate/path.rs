//! The request path, top to bottom: validate, identify, count, decide, pace, sleep, queue, answer,
//! sending what the rules decide, in order, on one connection. The rare paths are awaited through
//! `Box::pin`: `serve` moves a request's whole future into a task, so everything inlined is copied
//! on every scan (`tests/alloc_budget.rs` holds its size).

use std::future::Future;

use bytes::Bytes;
use http::{Method, Response};
use tokio::time::{Instant, timeout};
use tracing::Instrument;
use uuid::Uuid;

use super::attempt::{Attempt, GateRequest};
use super::trace::step;
use super::wiring::Gate;
use crate::gate::error::GateError;
use crate::gate::validate::validate;
use crate::io::meter::{Exit, Metered, Outcome};
use crate::io::queue::{Once, ScanJob, ScanQueue, SendError};
use crate::io::store::{
    Claim, Claimed, CountArgs, CountFailed, QuotaStore, Record, TakeOver, Tally,
};
use crate::rules::delay::DelayPlan;
use crate::rules::job::RequestBody;
use crate::rules::record;
use crate::rules::settle::{self, Repeat, Scan, on_repeat, on_take_over};
use crate::rules::unix::UnixMillis;

/// A request's answer and its [`Exit`] (none if refused before the store or not a counted scan).
type Answer = (Result<Response<Bytes>, GateError>, Option<Exit>);

type Finished = (Result<Response<Bytes>, GateError>, Exit);

/// What step 4's round trip found: a new count, or the record of a repeated key.
enum Counted<'a> {
    New(Tally),
    Existing(Record, &'a Claim),
}

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    /// Runs the request path; never panics, and meters once every request that reached the store.
    pub fn handle(&self, mut request: GateRequest) -> impl Future<Output = Response<Bytes>> + '_ {
        // The one clock reading of this request.
        let now_ms = self.clock.now();
        let trace = super::trace::resolve(request.trace.take(), &request.headers, now_ms);
        let span = tracing::info_span!(
            "request",
            traceId = %trace.trace_id,
            requestId = request.request_id.as_deref()
        );
        request.trace = Some(trace);
        let answer = async move {
            let (result, exit) = self.process(request, now_ms).await;
            if let Some(exit) = &exit {
                self.meter.record(exit);
            }
            result.unwrap_or_else(|e| {
                if e.is_our_failure() {
                    tracing::warn!(error = %e, code = e.code(), "scan refused");
                }
                e.to_response()
            })
        };
        answer.instrument(span)
    }

    async fn process(&self, request: GateRequest, now_ms: UnixMillis) -> Answer {
        let started = Instant::now();
        if crate::gate::quota_view::is_quota_path(&request.path) {
            if request.method != Method::GET && request.method != Method::HEAD {
                return (Err(GateError::QuotaMethodNotAllowed), None);
            }
            return (Box::pin(self.check(&request, now_ms)).await, None);
        }
        // 1–3: validate, identify, hash.
        let admit = || -> Result<_, GateError> {
            let headers = &request.headers;
            let body = validate(&request.method, &request.path, headers, &request.body)?;
            let idempotency_key = crate::gate::idempotency::key(headers)?;
            let identity = self.identifier.identify(headers, &request.origin())?;
            Ok((identity, body, idempotency_key))
        };
        let (identity, body, idempotency_key) = match admit() {
            Ok(admitted) => admitted,
            Err(e) => return (Err(e), None),
        };
        if identity.account_missing {
            let event = crate::io::meter::Event::NoAccount;
            self.meter
                .record_event(identity.scope, event, now_ms, request.trace_id());
        }
        if identity.exempt {
            let answer = self.exempt(identity, body, &request, now_ms, started);
            return (Box::pin(answer).await, None);
        }
        let policy = &self.config.policy;
        let mut attempt =
            Attempt::new(identity, idempotency_key, &request, policy, now_ms, started);
        let (result, exit) = self.scan(&mut attempt, body).await;
        (result, Some(exit))
    }

    /// Steps 4–5: count and decide, then answer a repeat, settle a failure or run the scan.
    async fn scan(&self, attempt: &mut Attempt, body: RequestBody) -> Finished {
        if let Some(refused) = self.known_refused(attempt).await {
            let exit = attempt.exit(Metered::Uncounted, Outcome::BacklogFull);
            return (Err(refused), exit);
        }
        let charge = match self.count(attempt).await {
            Ok(Counted::New(tally)) => attempt.charge(tally),
            Ok(Counted::Existing(record, claim)) => {
                return Box::pin(self.repeat(attempt, claim, body, record)).await;
            }
            // Settled at every level already: nothing is left at a level.
            Err(e) => match Box::pin(self.store_failed(attempt, e)).await {
                Ok(charge) => charge,
                Err(e) => {
                    let exit = attempt.exit(Metered::StoreFailed, Outcome::StoreUnavailable);
                    return (Err(e), exit);
                }
            },
        };
        self.run(attempt, body, Scan::fresh(attempt, charge)).await
    }

    /// The refusal of a scan known refused; `None`: ask the store (a keyed scan's record answers).
    pub(super) async fn known_refused(&self, attempt: &Attempt) -> Option<GateError> {
        let until = self.refused.until(attempt.keys(), attempt.now_ms)?;
        if let Some(claim) = &attempt.claim {
            let exists = self.store.has_record(&claim.record, attempt.now());
            if Box::pin(self.bounded(exists)).await.unwrap_or(false) {
                return None;
            }
        }
        let retry_after_ms = u64::try_from(until.get() - attempt.now_ms.get()).unwrap_or(0);
        Some(GateError::backlog_full(retry_after_ms, None))
    }

    /// Step 4's one round trip; a keyed scan claims its record with it.
    async fn count<'a>(&self, attempt: &'a Attempt) -> Result<Counted<'a>, CountFailed> {
        let args = CountArgs {
            key: &attempt.key,
            levels: &attempt.levels,
            period_end: attempt.period_end,
            now: attempt.now(),
            reset: self.config.policy.reset,
        };
        let count = async {
            match &attempt.claim {
                None => self.bounded(self.store.count(args)).await.map(Counted::New),
                Some(claim) => Ok(
                    match self.bounded(self.store.count_keyed(args, claim)).await? {
                        Claimed::New(count) => Counted::New(count),
                        Claimed::Existing(record) => Counted::Existing(record, claim),
                    },
                ),
            }
        };
        count.instrument(step!("count", attempt.trace_id())).await
    }

    /// Answers a repeated key by [`on_repeat`]; a retry that takes over an abandoned scan runs it.
    async fn repeat(
        &self,
        attempt: &Attempt,
        claim: &Claim,
        body: RequestBody,
        record: Record,
    ) -> Finished {
        let exit = attempt.exit(Metered::Uncounted, Outcome::Repeat);
        let result = match on_repeat(
            &record,
            claim,
            attempt.now_ms,
            attempt.sleep_cap(&self.config.policy),
        ) {
            Repeat::TakeOver => match self.take_over(attempt, claim, &record).await {
                None => {
                    return self
                        .run(attempt, body, self.resume(attempt, &record).await)
                        .await;
                }
                Some(retry_after) => Err(GateError::IdempotencyInProgress { retry_after }),
            },
            // A saved answer that cannot be read: refused, as the store's.
            Repeat::Replay(saved) => {
                crate::gate::respond::replay(&saved).ok_or(GateError::StoreUnavailable)
            }
            Repeat::Mismatch => Err(GateError::IdempotencyMismatch),
            Repeat::InProgress { retry_after } => {
                Err(GateError::IdempotencyInProgress { retry_after })
            }
        };
        (result, exit)
    }

    /// Takes over an abandoned attempt's lease; `None`: taken, else when the retry may come back.
    async fn take_over(&self, attempt: &Attempt, claim: &Claim, record: &Record) -> Option<u64> {
        let taken = self
            .bounded(self.store.take_over(TakeOver {
                record: &claim.record,
                expected_until_ms: record.lease_until_ms,
                lease_until_ms: attempt.lease_until_ms(),
                now: attempt.now(),
            }))
            .await;
        on_take_over(taken.ok())
    }

    /// The scan a take-over goes on with; the grant, which the record does not keep, is read again.
    async fn resume(&self, attempt: &Attempt, record: &Record) -> Scan {
        let grant = self
            .bounded(self.store.peek(&attempt.key, attempt.now()))
            .await
            .map_or(0, |p| p.grant);
        let mut scan = settle::resume(record, attempt.limits, grant, attempt.now_ms, self.shadow());
        if crate::bug!(TakeOverUnderFreshId) {
            scan.scan_id = Uuid::now_v7();
        }
        scan
    }

    /// Steps 6–8: pace, sleep, queue, answer, and save the answer for a keyed retry.
    async fn run(&self, attempt: &Attempt, body: RequestBody, scan: Scan) -> Finished {
        let (plan, sleep_lease) = match scan.resumed {
            Some(plan) => (plan, None),
            None => match self.delay_of(attempt, &scan).await {
                Ok((delay, sleep_lease)) => (
                    attempt.plan(delay, &self.config.policy, sleep_lease),
                    sleep_lease,
                ),
                Err(e) => {
                    let exit = attempt.exit(Metered::Uncounted, Outcome::BacklogFull);
                    return (Err(e), exit);
                }
            },
        };
        let exit = |metered, outcome| Exit {
            sleep_lease,
            ..attempt.exit(metered, outcome)
        };
        let metered = scan.metered(plan.total, self.shadow());
        let plan = self.sleep(attempt, plan).await;
        // 7: forward, within the answer's deadline.
        let mut job = scan.job(attempt, body, plan);
        match self.enqueue(attempt, &scan, &job).await {
            Ok(landed) => job.scan_id = landed,
            Err(e) => {
                tracing::warn!(error = %e, "enqueue failed");
                let failure = settle::queue_failure(
                    matches!(e, SendError::Unanswered),
                    scan.resumed.is_some(),
                );
                Box::pin(self.apply(attempt, &scan, failure)).await;
                return (
                    Err(GateError::queue_failed(failure)),
                    exit(metered, Outcome::QueueUnavailable),
                );
            }
        }
        // 8: answer, and save it for a keyed retry.
        let response = scan
            .accepted(attempt, &job, plan, self.shadow())
            .to_response();
        if let Some(claim) = &attempt.claim {
            // Not past the deadline: an unanswered save still lands, and a retry after the lease
            // takes the scan over under the same scanId.
            let save = self.save(claim, job.scan_id, &response, attempt.now());
            let _ = tokio::time::timeout_at(attempt.deadline(), Box::pin(save)).await;
        }
        (Ok(response), exit(metered, Outcome::answered(metered)))
    }

    /// Step 6's sleep, cut short when the process stops (the rest of the delay goes onto the job).
    async fn sleep(&self, attempt: &Attempt, plan: DelayPlan) -> DelayPlan {
        if plan.sleep.is_zero() {
            return plan;
        }
        let sleep = async {
            // From the arrival: never past the deadline or sleep lease, however slow the store.
            tokio::select! {
                () = tokio::time::sleep_until(attempt.started + plan.sleep) => plan,
                () = self.wake.cancelled() => plan.cut_short(attempt.started.elapsed()),
            }
        };
        sleep.instrument(step!("sleep", attempt.trace_id())).await
    }

    /// Step 7: the `scanId` the job is queued under. A keyed scan's job is queued once per record,
    /// so if an earlier attempt's job landed (its claim lost in a failover) the answer names it.
    async fn enqueue(
        &self,
        attempt: &Attempt,
        scan: &Scan,
        job: &ScanJob,
    ) -> Result<Uuid, SendError> {
        let enqueue = async {
            let Some(claim) = &attempt.claim else {
                return self.queue.enqueue(job).await.map(|()| job.scan_id);
            };
            let once = Once {
                record: &claim.record,
                expires_at: record::expires_at(scan.received_ms),
            };
            let landed = self.queue.enqueue_once(job, once).await?;
            if landed != job.scan_id {
                tracing::info!(
                    scan_id = %landed,
                    "a keyed scan's job was queued by an earlier attempt: answered with its scanId"
                );
            }
            Ok(landed)
        };
        timeout(attempt.enqueue_within(), enqueue)
            .instrument(step!("enqueue", attempt.trace_id()))
            .await
            .unwrap_or(Err(SendError::Unanswered))
    }
}
