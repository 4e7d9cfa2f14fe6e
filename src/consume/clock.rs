//! The queue's clock: `notBefore` is timed against it, not the consumer's.
//!
//! With Valkey, the server's `TIME`, read at start and every [`SYNC_EVERY`], is kept as an anchor
//! on the monotonic clock, taken as the answer arrived: the queue's time is never ahead of the
//! server's, and a step of the wall clock changes nothing. Without Valkey, keep the local clock
//! synchronised (NTP) with the gate's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::error::ConsumeError;
use super::schedule::{Reading, SKEW_WARN_MS};
use super::sync::lock;
use crate::io::clock::Clock;
use crate::io::connection::Valkey;
use crate::rules::unix::UnixMillis;

/// How often the offset is measured again.
pub const SYNC_EVERY: Duration = Duration::from_secs(30);

/// Local time corrected to the queue's.
pub struct QueueClock {
    local: Clock,
    /// The last measurement of the server's clock; `None` before the first: the local clock alone.
    anchor: Mutex<Option<Anchor>>,
    server: Option<Valkey>,
}

/// The server's time at a monotonic instant: a lower bound of it.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    queue: UnixMillis,
    at: Instant,
    /// The round trip it was measured in: how far below the server's time it may be.
    error_ms: i64,
}

impl Anchor {
    fn at(&self, now: Instant) -> UnixMillis {
        self.queue
            .saturating_add(now.saturating_duration_since(self.at))
    }
}

impl QueueClock {
    /// The local clock alone.
    pub fn local(local: Clock) -> Arc<Self> {
        Self::new(local, None)
    }

    /// Time by `server`'s `TIME` once measured ([`QueueClock::sync`]); before, or without a server,
    /// by `local`.
    pub fn new(local: Clock, server: Option<Valkey>) -> Arc<Self> {
        Arc::new(Self {
            local,
            anchor: Mutex::new(None),
            server,
        })
    }

    pub fn now(&self) -> UnixMillis {
        match *lock(&self.anchor) {
            Some(anchor) => anchor.at(Instant::now()),
            None => UnixMillis(self.local.now_ms()),
        }
    }

    /// Measures the server's clock (if there is a server) and anchors to it.
    pub async fn sync(&self) -> Result<(), ConsumeError> {
        let Some(server) = &self.server else {
            return Ok(());
        };
        let sent = Instant::now();
        let sent_ms = UnixMillis(self.local.now_ms());
        let time: Vec<i64> = server.send(redis::cmd("TIME"), server.timeout()).await?;
        let answered = Instant::now();
        let answered_ms = UnixMillis(self.local.now_ms());
        let [secs, micros] = time[..] else {
            return Err(ConsumeError::Setup(format!("TIME answered {time:?}")));
        };
        let reading = UnixMillis(secs * 1000 + micros / 1000);
        let measured = Anchor {
            queue: reading,
            at: answered,
            error_ms: i64::try_from((answered - sent).as_millis()).unwrap_or(i64::MAX),
        };
        let last = lock(&self.anchor).replace(measured);
        if let Some(last) = last {
            let moved = reading.get() - last.at(answered).get();
            if moved.abs() > last.error_ms + measured.error_ms + 1 {
                tracing::warn!(
                    moved_ms = moved,
                    "Valkey's clock moved against this machine's monotonic clock: jobs are timed by the new reading"
                );
            }
        }
        // The wall clock may have stepped back within the round trip.
        let offset = Reading {
            sent: sent_ms.min(answered_ms),
            server: reading,
            answered: answered_ms,
        }
        .offset_ms();
        metrics::gauge!(super::meter::CLOCK_SKEW_MS).set(offset as f64);
        if offset.abs() > SKEW_WARN_MS {
            tracing::warn!(
                skew_ms = -offset,
                "this machine's clock is off from Valkey's: jobs are timed by Valkey's"
            );
        }
        Ok(())
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
