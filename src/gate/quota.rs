//! The two requests that never touch a counter: `GET /quota` (read in one
//! round trip, nothing spent; the answer is built by [`crate::check`]) and
//! an exempt scan (queued at once, uncounted, unpaced).

use bytes::Bytes;
use http::Response;
use tokio::time::Instant;

use super::attempt::{GateRequest, enqueue_within};
use super::wiring::Gate;
use crate::check::{NextScanRules, QuotaView, exempt_response, next_scan};
use crate::config::ResetPolicy;
use crate::decide::Limits;
use crate::delay;
use crate::error::{GateError, Queued};
use crate::identity::{Identity, Origin};
use crate::job::RequestBody;
use crate::meter::Event;
use crate::queue::{QueueError, ScanJob, ScanQueue};
use crate::respond;
use crate::store::{Peek, QuotaKey, QuotaStore, period_end};
use crate::unix::{UnixMillis, UnixSecs};

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    /// `GET /quota`: the caller, identified as for `POST /scan`, and what
    /// its next scan would get. One read; nothing counted or queued. With
    /// the store down: 503 and `Retry-After`, never a guess.
    pub(super) async fn check(
        &self,
        request: &GateRequest,
        now_ms: UnixMillis,
    ) -> Result<Response<Bytes>, GateError> {
        let origin = Origin {
            peer: request.peer,
            gateway_claims: request.gateway_claims.as_ref(),
        };
        let identity = self.identifier.identify(&request.headers, &origin)?;
        self.meter
            .record_event(identity.scope, Event::Check, now_ms);
        if identity.exempt {
            return Ok(exempt_response(identity.token));
        }
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let now = now_ms.secs();
        let peek = self
            .bounded(self.store.peek(&key, now))
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "quota store failed on GET /quota");
                GateError::QuotaUnavailable
            })?;
        let policy = &self.config.policy;
        let limits = policy.limits(identity.limit);
        let rules = NextScanRules {
            mode: policy.mode,
            pacing: policy.pacing,
            max_backlog: policy.max_backlog,
        };
        let standing = standing_of(Some(&peek), limits, policy.reset, now);
        let view = QuotaView {
            scope: identity.scope,
            limit: standing.limit,
            used: peek.used,
            reset_at: UnixSecs(standing.reset_at),
            seconds_to_reset: standing.seconds_to_reset,
            next: next_scan(&peek, limits, rules, now_ms),
            token: identity.token,
        };
        Ok(view.to_response())
    }

    /// An exempt scan: never counted, delayed or paced; queued at once with
    /// tier `exempt`. Nothing is recorded for it, so an `Idempotency-Key`
    /// does not deduplicate it.
    pub(super) async fn exempt(
        &self,
        identity: Identity,
        body: RequestBody,
        request: &GateRequest,
        now_ms: UnixMillis,
        started: Instant,
    ) -> Result<Response<Bytes>, GateError> {
        let scan_id = crate::clock::uuid_v7(now_ms);
        let received = respond::rfc3339_ms(now_ms.get());
        let job = ScanJob {
            version: crate::job::JOB_VERSION,
            scan_id,
            received_at: received.clone(),
            scope: identity.scope,
            digest: identity.digest.to_string(),
            tier: crate::job::JobTier::Exempt,
            limit: identity.limit.get(),
            count: 0,
            delay_ms: 0,
            deferred_ms: 0,
            not_before: received,
            not_before_ms: now_ms.get(),
            request: body,
        };
        let ceiling = delay::ceiling(request.remaining, self.config.policy.gateway_timeout);
        let within = enqueue_within(started, ceiling);
        // The read for the headers goes beside the enqueue, so it adds no
        // wait of its own (the store's timeout is far below the enqueue's).
        let enqueue = tokio::time::timeout(within, self.queue.enqueue(&job));
        let (queued, standing) = tokio::join!(enqueue, self.standing(&identity, now_ms));
        if let Err(e) = queued.unwrap_or(Err(QueueError::Timeout)) {
            tracing::warn!(error = %e, "enqueue failed (exempt scan)");
            let queued = match e {
                QueueError::Timeout => Queued::Unknown,
                QueueError::Backend(_) => Queued::No,
            };
            return Err(GateError::QueueFailed { queued });
        }
        self.meter
            .record_event(identity.scope, Event::Exempt, now_ms);
        Ok(respond::exempt(
            scan_id,
            now_ms.get(),
            identity.token,
            &standing,
        ))
    }

    /// Where an exempt caller's own quota stands, for the headers every 202
    /// carries: one read, as `GET /quota` makes. Without the store, the
    /// whole limit until the period's end, marked unavailable: the scan is
    /// queued already and does not depend on it.
    async fn standing(&self, identity: &Identity, now_ms: UnixMillis) -> respond::Standing {
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let now = now_ms.secs();
        let peek = self.bounded(self.store.peek(&key, now)).await.ok();
        let limits = self.config.policy.limits(identity.limit);
        standing_of(peek.as_ref(), limits, self.config.policy.reset, now)
    }
}

/// Where a subject's quota stands, read as `peek` at `now` (`None`: the
/// store did not answer): its limit with any grant, what is left, and when
/// the period ends: the counter's expiry, or, with no counter yet, where a
/// new counter's would.
fn standing_of(
    peek: Option<&Peek>,
    limits: Limits,
    reset: ResetPolicy,
    now: UnixSecs,
) -> respond::Standing {
    let (limit, used, reset_at) = match peek {
        Some(p) => (limits.with_grant(p.grant).limit.get(), p.used, p.reset_at),
        None => (limits.limit.get(), 0, None),
    };
    let reset_at = reset_at.unwrap_or_else(|| period_end(reset, now));
    respond::Standing {
        limit,
        remaining: u64::from(limit).saturating_sub(used),
        reset_at: reset_at.get(),
        seconds_to_reset: u64::try_from(reset_at.get() - now.get()).unwrap_or(0),
        unavailable: peek.is_none(),
    }
}
