//! The queue's clock: `notBefore` is timed against it, not the consumer's.
//!
//! The gate writes `notBefore` by its own clock; a consumer whose clock runs
//! ahead would start scans early by as much. With Valkey (a stream source,
//! or SQS with `VALKEY_URL` for its markers) the consumer reads the server's
//! `TIME` at start and every [`SYNC_EVERY`], keeps the offset from its own
//! clock (the server's reading taken as late in the round trip as it can
//! have been, so jobs are never started early by the error), and
//! times every job by local time plus that offset. The offset is metered
//! (`stella_consumer_clock_skew_ms`) and logged as a warning past
//! [`SKEW_WARN_MS`]. Without Valkey (SQS
//! alone, the spool) the local clock is the only one: keep it synchronised
//! (NTP) with the gate's.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use super::error::ConsumeError;
use super::schedule::{SKEW_WARN_MS, clock_offset_ms};
use crate::clock::Clock;
use crate::connection::Valkey;

/// How often the offset is measured again.
pub const SYNC_EVERY: Duration = Duration::from_secs(30);

/// Local time corrected to the queue's.
pub struct QueueClock {
    local: Clock,
    offset_ms: AtomicI64,
    server: Option<Valkey>,
}

impl QueueClock {
    /// The local clock alone.
    pub fn local(local: Clock) -> Arc<Self> {
        Arc::new(Self {
            local,
            offset_ms: AtomicI64::new(0),
            server: None,
        })
    }

    /// Local time corrected by `server`'s `TIME`.
    pub fn of_valkey(local: Clock, server: Valkey) -> Arc<Self> {
        Arc::new(Self {
            local,
            offset_ms: AtomicI64::new(0),
            server: Some(server),
        })
    }

    /// Unix milliseconds by the queue's clock.
    pub fn now_ms(&self) -> i64 {
        self.local
            .now_ms()
            .saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    /// The current offset (ms added to local time).
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Measures the offset once; `Ok(None)` without a server.
    pub async fn sync(&self) -> Result<Option<i64>, ConsumeError> {
        let Some(server) = &self.server else {
            return Ok(None);
        };
        let sent = self.local.now_ms();
        let time: Vec<i64> = server.send(redis::cmd("TIME"), server.timeout()).await?;
        let answered = self.local.now_ms();
        let [secs, micros] = time[..] else {
            return Err(ConsumeError::Setup(format!("TIME answered {time:?}")));
        };
        let offset = clock_offset_ms(sent, secs * 1000 + micros / 1000, answered);
        self.offset_ms.store(offset, Ordering::Relaxed);
        metrics::gauge!(super::meter::CLOCK_SKEW_MS).set(offset as f64);
        if offset.abs() > SKEW_WARN_MS {
            tracing::warn!(
                skew_ms = -offset,
                "this machine's clock is off from Valkey's: jobs are timed by Valkey's"
            );
        }
        Ok(Some(offset))
    }

    /// Measures the offset every [`SYNC_EVERY`] until the task is dropped.
    pub async fn keep_in_sync(self: Arc<Self>) {
        loop {
            tokio::time::sleep(SYNC_EVERY).await;
            if let Err(e) = self.sync().await {
                tracing::debug!(error = %e, "cannot read Valkey's clock; keeping the last offset");
            }
        }
    }
}
