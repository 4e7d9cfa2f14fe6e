//! The two requests that never touch a counter: `GET /quota` (one read, nothing spent) and an
//! exempt scan (queued at once, uncounted, unpaced).

use bytes::Bytes;
use http::Response;
use tokio::time::Instant;
use tracing::Instrument;

use super::attempt::{GateRequest, enqueue_within};
use super::scan::{Held, scan_job};
use super::trace::step;
use super::wiring::Gate;
use crate::gate::error::GateError;
use crate::gate::identity::Identity;
use crate::gate::quota_view::{NextScanRules, QuotaView, exempt_response, next_scan};
use crate::gate::respond::{self, LevelStanding, Standing};
use crate::io::meter::Event;
use crate::io::queue::{ScanQueue, SendError};
use crate::io::store::{QuotaKey, QuotaStore};
use crate::rules::count::Peek;
use crate::rules::delay::{self, DelayPlan};
use crate::rules::job::{JobTier, RequestBody};
use crate::rules::level::Level;
use crate::rules::settle;
use crate::rules::unix::UnixMillis;

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    /// `GET /quota`: the caller and what its next scan would get, from one read. With the store
    /// down: 503 and `Retry-After`, never a guess.
    pub(super) async fn check(
        &self,
        request: &GateRequest,
        now_ms: UnixMillis,
    ) -> Result<Response<Bytes>, GateError> {
        let mut identity = self
            .identifier
            .identify(&request.headers, &request.origin())?;
        self.meter
            .record_event(identity.scope, Event::Check, now_ms, request.trace_id());
        if identity.exempt {
            let standing = self.standing(&identity, now_ms).await;
            return Ok(exempt_response(identity.token, &standing));
        }
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let levels = std::mem::take(&mut identity.levels);
        let (peek, levels) = self.read(&key, levels, now_ms).await?;
        let policy = &self.config.policy;
        let limits = policy.limits(identity.limit);
        let rules = NextScanRules {
            mode: policy.mode,
            pacing: policy.pacing,
            max_backlog: policy.max_backlog,
        };
        let now = now_ms.secs();
        let standings = levels
            .iter()
            .map(|(l, peek)| LevelStanding::of(l, peek, policy.reset, now))
            .collect();
        let next = next_scan(&peek, limits, &levels, rules, now_ms);
        if next.backlog_full_retry_after.is_none() {
            // The store says the next scan goes ahead: so does this gate.
            let level_keys = levels.iter().map(|(l, _)| &l.key);
            self.refused.forget(std::iter::once(&key).chain(level_keys));
        }
        let view = QuotaView {
            scope: identity.scope,
            used: peek.used,
            standing: Standing::of(Some(&peek), limits, policy.reset, now),
            levels: standings,
            next,
            token: identity.token,
        };
        Ok(view.to_response())
    }

    /// The subject's counter and each level's above it, in one request; a failure is a 503.
    async fn read(
        &self,
        key: &QuotaKey,
        levels: Vec<Level>,
        now_ms: UnixMillis,
    ) -> Result<(Peek, Vec<(Level, Peek)>), GateError> {
        let now = now_ms.secs();
        let peeks = if levels.is_empty() {
            self.bounded(self.store.peek(key, now))
                .await
                .map(|p| vec![p])
        } else {
            let level_keys = levels.iter().map(|l| l.key.clone());
            let keys: Vec<QuotaKey> = std::iter::once(key.clone()).chain(level_keys).collect();
            self.bounded(self.store.peek_levels(&keys, now)).await
        };
        let mut peeks = peeks
            .map_err(|e| {
                tracing::warn!(error = %e, "quota store failed on GET /quota");
                GateError::QuotaUnavailable
            })?
            .into_iter();
        let peek = peeks.next().unwrap_or_default();
        Ok((peek, levels.into_iter().zip(peeks).collect()))
    }

    /// An exempt scan, queued at once with tier `exempt`. Nothing is recorded for it, so an
    /// `Idempotency-Key` does not deduplicate it.
    pub(super) async fn exempt(
        &self,
        identity: Identity,
        body: RequestBody,
        request: &GateRequest,
        now_ms: UnixMillis,
        started: Instant,
    ) -> Result<Response<Bytes>, GateError> {
        let held = Held {
            scan_id: crate::io::clock::uuid_v7(now_ms),
            received_ms: now_ms,
            plan: DelayPlan::default(),
        };
        let job = scan_job(
            &identity,
            held,
            JobTier::Exempt,
            0,
            (body, request.trace.clone()),
        );
        let enqueue = self.queue.enqueue(&job);
        let enqueue = enqueue.instrument(step!("enqueue", request.trace_id()));
        let ceiling = delay::ceiling(request.remaining, self.config.policy.gateway_timeout);
        let within = enqueue_within(started, ceiling);
        // The read for the headers runs beside the enqueue, so it adds no wait of its own.
        let enqueue = tokio::time::timeout(within, enqueue);
        let (queued, standing) = tokio::join!(enqueue, self.standing(&identity, now_ms));
        if let Err(e) = queued.unwrap_or(Err(SendError::Unanswered)) {
            tracing::warn!(error = %e, "enqueue failed (exempt scan)");
            let timed_out = matches!(e, SendError::Unanswered);
            return Err(GateError::queue_failed(settle::queue_failure(
                timed_out, false,
            )));
        }
        self.meter
            .record_event(identity.scope, Event::Exempt, now_ms, request.trace_id());
        Ok(respond::exempt(
            job.scan_id,
            now_ms.get(),
            identity.token,
            &standing,
        ))
    }

    /// Where an exempt caller's own quota stands (without the store: the whole limit, unavailable).
    async fn standing(&self, identity: &Identity, now_ms: UnixMillis) -> Standing {
        let key = QuotaKey::new(identity.scope, &identity.digest);
        let now = now_ms.secs();
        let peek = self.bounded(self.store.peek(&key, now)).await.ok();
        let limits = self.config.policy.limits(identity.limit);
        Standing::of(peek.as_ref(), limits, self.config.policy.reset, now)
    }
}
