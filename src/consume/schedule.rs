//! The consumer's rules, pure: when a job may start, what a `scanId` marker allows, and what
//! follows a hand-off. The current time is an argument; the async code only carries out the answer.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::rules::unix::UnixMillis;

/// SQS's longest visibility timeout (12 h).
pub const MAX_VISIBILITY_SECS: u64 = 43_200;

/// A job's `notBefore` against a moment by the queue's clock, named so the two cannot be swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub not_before: UnixMillis,
    pub now: UnixMillis,
}

impl Due {
    /// How long the job must still be held: zero once `notBefore` has come.
    pub fn hold(self) -> Duration {
        let ms = self.not_before.get().saturating_sub(self.now.get());
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }

    /// How late a start at `now` is, in ms past `notBefore` (never negative after [`Due::hold`]).
    pub fn lateness_ms(self) -> i64 {
        self.now.get().saturating_sub(self.not_before.get())
    }
}

/// How a not-yet-due SQS message is held: invisible for its whole seconds (rounded down, so it
/// returns before `notBefore`), at most 12 h; `None` under a second (held in memory).
pub fn sqs_visibility(wait: Duration) -> Option<i32> {
    let secs = wait.as_secs().min(MAX_VISIBILITY_SECS);
    (secs > 0).then(|| i32::try_from(secs).unwrap_or(i32::MAX))
}

/// Retries and dead-lettering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Failed hand-offs before the job is dead-lettered.
    pub max_attempts: NonZeroU32,
    /// The wait after the first failure; doubled after each further one.
    pub base: Duration,
    /// The longest wait between attempts.
    pub cap: Duration,
}

impl RetryPolicy {
    /// The wait after the `failures`-th failure (1-based): `base · 2^(failures−1)`, at most `cap`.
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.base.saturating_mul(1 << doublings).min(self.cap)
    }
}

/// Why a running scan was stopped by the consumer (not by the scanner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// It ran past `--scan-timeout`: a failed attempt, retried with backoff.
    #[error("scan timeout")]
    Timeout,
    /// Its marker was lost (another attempt's, done, or not renewed for ¾ of a lease).
    #[error("lease lost")]
    LeaseLost,
    /// `SIGTERM`'s grace period ended.
    #[error("shutdown grace over")]
    Shutdown,
}

/// How one hand-off ended, as the rule after it sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOff {
    /// The scanner took the job (exit 0, 2xx).
    Took,
    /// It did not (non-zero exit, non-2xx, no answer).
    Refused,
    /// The consumer stopped it.
    Stopped(Stop),
}

/// What the worker does after a hand-off: `Release…` frees the marker until done (the scanner is
/// gone, so the next attempt need not wait out the lease); `ReleaseIfMine…` tries once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Keep the marker as done (renewing until that is recorded), then ack: a crash between the two
    /// leaves an entry the next consumer acks without running.
    MarkDoneThenAck,
    /// The lease was lost, no failure of the job's: release the marker once in case this attempt's
    /// token still holds it, and come back after the wait as a new attempt.
    ReleaseIfMineThenLater(Duration),
    /// The shutdown grace ended: release, and give the job back.
    ReleaseThenGiveBack,
    /// The `failures`-th failed attempt (refused, or timed out): release, retry after `after`.
    ReleaseThenRetry { failures: u32, after: Duration },
    /// The failed attempt that reached `--max-attempts`: release, then dead-letter the job.
    ReleaseThenDeadLetter { failures: u32 },
}

/// What follows a hand-off that ended as `ended` after `failures` failures. A failure counts
/// against `--max-attempts`; a lost lease or a shutdown does not (the scan was taken away).
pub fn after_hand_off(
    ended: HandOff,
    failures: u32,
    policy: &RetryPolicy,
    lease: Duration,
) -> Next {
    match ended {
        HandOff::Took => Next::MarkDoneThenAck,
        HandOff::Stopped(Stop::LeaseLost) => Next::ReleaseIfMineThenLater(come_back(lease)),
        HandOff::Stopped(Stop::Shutdown) => Next::ReleaseThenGiveBack,
        HandOff::Refused | HandOff::Stopped(Stop::Timeout) => {
            let failures = failures.saturating_add(1);
            if failures >= policy.max_attempts.get() {
                return Next::ReleaseThenDeadLetter { failures };
            }
            let after = policy.backoff(failures);
            Next::ReleaseThenRetry { failures, after }
        }
    }
}

/// The wait before trying a scan another attempt may hold: by its lease's end it is done or free.
pub fn come_back(lease: Duration) -> Duration {
    lease / 2
}

/// A `scanId` marker. Beside it, a counter of attempts (the fencing token a scanner sees as
/// `SCAN_ATTEMPT`) outlives each lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// Nobody runs it, nobody ran it.
    Free,
    /// One attempt runs it under `token` until `until`. Past `until` and never released, its
    /// attempt may still be alive: a failover can lose a live attempt's renewals and done marker.
    Held { token: String, until: UnixMillis },
    /// The last attempt's lease ran out unreleased and a new attempt came: kept out until `until`
    /// (one more lease) while the last attempt may still renew or mark the scan done.
    Orphaned { until: UnixMillis },
    /// It ran to success: never again.
    Done,
}

/// The answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerClaim {
    /// This attempt may run the scan as attempt number `.0` (a renewal keeps the number).
    Claimed(u64),
    /// It already ran: acknowledge without running.
    Done,
    /// Another attempt holds a live lease or (for a renewal) claimed it since: later, or stop.
    Busy,
    /// The job is no longer in its queue (a stream entry a failover lost): not run.
    Gone,
}

/// Claims `marker` for `token` at `now` for `lease`, given the scan's `attempts` counter; `mine` is
/// the attempt renewed (0: a new one, which takes the next number unless its token already holds
/// it). A renewal holds only if no attempt was numbered since. A lease run out unreleased keeps a
/// new attempt out one more lease ([`Marker::Orphaned`]). `claim.lua` applies the same rule.
pub fn claim(
    marker: &Marker,
    attempts: u64,
    token: &str,
    mine: u64,
    now: UnixMillis,
    lease: Duration,
) -> (Marker, u64, MarkerClaim) {
    let live_holder = match marker {
        Marker::Done => return (Marker::Done, attempts, MarkerClaim::Done),
        Marker::Held { token: t, until } if *until > now => Some(t.as_str()),
        _ => None,
    };
    let kept_out = matches!(marker, Marker::Orphaned { until } if *until > now);
    if live_holder.is_some_and(|t| t != token)
        || (mine > 0 && mine != attempts)
        || (mine == 0 && kept_out)
    {
        return (marker.clone(), attempts, MarkerClaim::Busy);
    }
    let run_out = matches!(marker, Marker::Held { .. }) && live_holder.is_none();
    let until = now.saturating_add(lease);
    if mine == 0 && run_out && !crate::bug!(OrphanClaimedAtOnce) {
        return (Marker::Orphaned { until }, attempts, MarkerClaim::Busy);
    }
    let new_attempt = mine == 0 && live_holder != Some(token);
    let number = if new_attempt { attempts + 1 } else { attempts };
    let token = token.to_owned();
    let held = Marker::Held { token, until };
    (held, number, MarkerClaim::Claimed(number))
}

/// Releases `token`'s hold after a failure; anyone else's stays.
pub fn release(marker: &Marker, token: &str) -> Marker {
    match marker {
        Marker::Held { token: t, .. } if t == token => Marker::Free,
        other => other.clone(),
    }
}

/// How one renewal of a running scan's marker went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Still this attempt's.
    Held,
    /// Done, or another attempt claimed it: this one is no longer the scan's.
    Lost,
    /// No answer (Valkey unreachable, stalled): the lease runs on.
    Unknown,
}

/// A running scan's lease, and how long since the last renewal known to have held was *sent*.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    pub since_held: Duration,
    pub lease: Duration,
}

impl Silence {
    /// Whether the scan must stop after `renewal`. The marker expires a lease after the last held
    /// renewal landed, later than it was sent, so stopping ¾ of a lease after that send beats any
    /// other claim (the last quarter is the margin for the kill and clock drift).
    pub fn must_stop(self, renewal: Renewal) -> bool {
        match renewal {
            Renewal::Lost => true,
            Renewal::Held => false,
            Renewal::Unknown => self.since_held >= Self::allowed(self.lease),
        }
    }

    /// The longest a running scan may go without a renewal known to hold: ¾ of its lease.
    pub fn allowed(lease: Duration) -> Duration {
        lease.saturating_mul(3) / 4
    }
}

/// One reading of the server's clock, taken between `sent` and `answered` by the local one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub sent: UnixMillis,
    pub server: UnixMillis,
    pub answered: UnixMillis,
}

impl Reading {
    /// The queue clock's offset from the local one (ms to add), taking the reading at the end of
    /// the round trip: the smallest offset, so no job timed by it starts early.
    pub fn offset_ms(self) -> i64 {
        debug_assert!(self.sent <= self.answered);
        self.server.get().saturating_sub(self.answered.get())
    }
}

/// The skew past which the consumer warns (it times jobs by the queue's clock all the same).
pub const SKEW_WARN_MS: i64 = 1_000;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy(max: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: NonZeroU32::new(max).unwrap(),
            base: Duration::from_millis(200),
            cap: Duration::from_secs(30),
        }
    }

    /// Every way a hand-off ends, after failures below, one short of, at
    /// and over the limit, under a policy of one attempt and of three: a
    /// success is marked then acked whatever came before; a lost lease and
    /// a shutdown count no failure; a refusal and a timeout count one, and
    /// are retried with a growing wait until the one that reaches the limit
    /// is dead-lettered.
    #[test]
    fn after_hand_off_table() {
        use HandOff::{Refused, Stopped, Took};
        use Next::*;
        let lease = Duration::from_secs(8);
        let ms = Duration::from_millis;
        let retry = |failures, after| ReleaseThenRetry { failures, after };
        let dead = |failures| ReleaseThenDeadLetter { failures };
        #[rustfmt::skip]
        let table: &[(HandOff, u32, u32, Next)] = &[
            // ended, failures before, --max-attempts, next
            (Took, 0, 1, MarkDoneThenAck),
            (Took, 0, 3, MarkDoneThenAck),
            (Took, 2, 3, MarkDoneThenAck),
            (Took, 5, 3, MarkDoneThenAck),
            (Refused, 0, 1, dead(1)),
            (Refused, 0, 3, retry(1, ms(200))),
            (Refused, 1, 3, retry(2, ms(400))),
            (Refused, 2, 3, dead(3)),
            (Refused, 5, 3, dead(6)),
            (Refused, u32::MAX, 3, dead(u32::MAX)),
            (Stopped(Stop::Timeout), 0, 1, dead(1)),
            (Stopped(Stop::Timeout), 0, 3, retry(1, ms(200))),
            (Stopped(Stop::Timeout), 1, 3, retry(2, ms(400))),
            (Stopped(Stop::Timeout), 2, 3, dead(3)),
            (Stopped(Stop::Timeout), 5, 3, dead(6)),
            (Stopped(Stop::LeaseLost), 0, 1, ReleaseIfMineThenLater(lease / 2)),
            (Stopped(Stop::LeaseLost), 0, 3, ReleaseIfMineThenLater(lease / 2)),
            (Stopped(Stop::LeaseLost), 2, 3, ReleaseIfMineThenLater(lease / 2)),
            (Stopped(Stop::LeaseLost), 5, 3, ReleaseIfMineThenLater(lease / 2)),
            (Stopped(Stop::Shutdown), 0, 1, ReleaseThenGiveBack),
            (Stopped(Stop::Shutdown), 0, 3, ReleaseThenGiveBack),
            (Stopped(Stop::Shutdown), 2, 3, ReleaseThenGiveBack),
            (Stopped(Stop::Shutdown), 5, 3, ReleaseThenGiveBack),
        ];
        for &(ended, failures, max, next) in table {
            let got = after_hand_off(ended, failures, &policy(max), lease);
            assert_eq!(
                got, next,
                "{ended:?} after {failures} failures, limit {max}"
            );
        }
        let all = [
            Took,
            Refused,
            Stopped(Stop::Timeout),
            Stopped(Stop::LeaseLost),
            Stopped(Stop::Shutdown),
        ];
        for ended in all {
            assert!(
                table.iter().any(|row| row.0 == ended),
                "{ended:?} not in the table"
            );
        }
        assert_eq!(policy(40).backoff(30), Duration::from_secs(30));
    }

    /// Each marker state against each claimant: done stays done, a live
    /// lease keeps others out, an expired one or the holder's own token
    /// gets in; a new attempt is numbered, a renewal keeps its number and
    /// fails once another attempt was numbered.
    #[test]
    fn claim_table() {
        let at = UnixMillis;
        let lease = Duration::from_millis(10);
        let held = Marker::Held {
            token: "a".into(),
            until: at(100),
        };
        let answer = |m: &Marker, attempts, token, mine, now| {
            claim(m, attempts, token, mine, at(now), lease).2
        };
        assert_eq!(answer(&Marker::Free, 0, "a", 0, 0), MarkerClaim::Claimed(1));
        assert_eq!(answer(&Marker::Done, 3, "a", 0, 0), MarkerClaim::Done);
        assert_eq!(answer(&held, 1, "a", 1, 50), MarkerClaim::Claimed(1));
        assert_eq!(answer(&held, 1, "a", 0, 50), MarkerClaim::Claimed(1));
        assert_eq!(answer(&held, 1, "b", 0, 50), MarkerClaim::Busy);
        // Lease over, unreleased: a new attempt waits one more lease, in
        // which the last attempt may still renew; then it gets in.
        let (orphaned, _, busy) = claim(&held, 1, "b", 0, at(100), lease);
        assert_eq!(
            (busy, &orphaned),
            (MarkerClaim::Busy, &Marker::Orphaned { until: at(110) })
        );
        assert_eq!(answer(&orphaned, 1, "c", 0, 105), MarkerClaim::Busy);
        assert_eq!(answer(&orphaned, 1, "a", 1, 105), MarkerClaim::Claimed(1));
        assert_eq!(answer(&orphaned, 1, "b", 0, 110), MarkerClaim::Claimed(2));
        assert_eq!(release(&orphaned, "a"), orphaned);
        // Lease over, nobody else came: the renewal still holds.
        assert_eq!(answer(&held, 1, "a", 1, 500), MarkerClaim::Claimed(1));
        // Another attempt was numbered meanwhile (and released): lost.
        assert_eq!(answer(&Marker::Free, 2, "a", 1, 500), MarkerClaim::Busy);
        assert_eq!(release(&held, "b"), held);
        assert_eq!(release(&held, "a"), Marker::Free);
        assert_eq!(release(&Marker::Done, "a"), Marker::Done);
        assert_eq!(come_back(Duration::from_secs(4)), Duration::from_secs(2));
    }

    /// A running scan stops when its marker is lost, or when ¾ of a lease
    /// passed with no renewal known to hold; never while renewals hold.
    #[test]
    fn stop_table() {
        let lease = Duration::from_secs(8);
        let after = |secs| Silence {
            since_held: Duration::from_secs(secs),
            lease,
        };
        assert!(after(0).must_stop(Renewal::Lost));
        assert!(!after(60).must_stop(Renewal::Held));
        assert!(!after(5).must_stop(Renewal::Unknown));
        assert!(after(6).must_stop(Renewal::Unknown));
    }

    /// The offset takes the server's reading as late in the round trip as
    /// it can have been, so the queue time is never ahead of the server's.
    #[test]
    fn offsets() {
        let offset = |sent, server, answered| {
            let at = UnixMillis;
            Reading {
                sent: at(sent),
                server: at(server),
                answered: at(answered),
            }
            .offset_ms()
        };
        assert_eq!(offset(1_000, 1_000, 1_000), 0);
        assert_eq!(offset(1_000, 21_010, 1_020), 19_990);
        assert_eq!(offset(21_000, 1_005, 21_010), -20_005);
    }

    /// One attempt's action on a marker.
    #[derive(Debug, Clone)]
    enum Act {
        /// Attempt `n` claims; if it gets the claim it runs, and then
        /// either succeeds (done) or fails (release).
        Try { n: u8, succeeds: bool },
        /// Time passes.
        Wait(u16),
    }

    fn act() -> impl Strategy<Value = Act> {
        prop_oneof![
            (0u8..6, any::<bool>()).prop_map(|(n, succeeds)| Act::Try { n, succeeds }),
            (0u16..500).prop_map(Act::Wait),
        ]
    }

    proptest! {
        /// A job is never started before its notBefore, and a due job is never held.
        #[test]
        fn never_early(not_before in -1_000_000i64..1_000_000, now in -1_000_000i64..1_000_000) {
            let due = Due { not_before: UnixMillis(not_before), now: UnixMillis(now) };
            let start = now + i64::try_from(due.hold().as_millis()).unwrap();
            prop_assert!(start >= not_before);
            let started = Due { now: UnixMillis(start), ..due };
            prop_assert!(started.lateness_ms() >= 0);
            if not_before <= now {
                prop_assert_eq!(due.hold(), Duration::ZERO);
            } else {
                prop_assert_eq!(start, not_before);
            }
        }

        /// Visibility never brings a message back after its notBefore, nor
        /// a second or more before it (unless capped at 12 h).
        #[test]
        fn visibility_is_never_late(ms in 0u64..100_000_000) {
            let wait = Duration::from_millis(ms);
            match sqs_visibility(wait) {
                None => prop_assert!(wait < Duration::from_secs(1)),
                Some(secs) => {
                    let back = Duration::from_secs(u64::try_from(secs).unwrap());
                    prop_assert!(back <= wait);
                    prop_assert!(wait - back < Duration::from_secs(1) || secs == 43_200);
                }
            }
        }

        /// Backoff grows with every failure and never passes its cap.
        #[test]
        fn backoff_grows_to_cap(f in 1u32..100) {
            let p = policy(5);
            prop_assert!(p.backoff(f) <= p.cap);
            prop_assert!(p.backoff(f + 1) >= p.backoff(f));
        }

        /// Whatever attempts claim, run, fail and wait in whatever order,
        /// the scan runs to success at most once, never two runs overlap
        /// within a lease, and after a success nobody runs it again.
        #[test]
        fn runs_once(acts in proptest::collection::vec(act(), 1..60)) {
            let lease = Duration::from_millis(100);
            let (mut marker, mut attempts, mut now, mut successes) = (Marker::Free, 0, 0i64, 0);
            let mut numbers = Vec::new();
            for a in acts {
                match a {
                    Act::Wait(ms) => now += i64::from(ms),
                    Act::Try { n, succeeds } => {
                        let token = format!("t{n}");
                        let (next, count, answer) = claim(&marker, attempts, &token, 0, UnixMillis(now), lease);
                        if let MarkerClaim::Claimed(number) = answer {
                            prop_assert!(!matches!(&marker, Marker::Held { token: t, until }
                                if *t != token && until.get() > now), "claimed over a live lease");
                            prop_assert!(marker != Marker::Done);
                            numbers.push(number);
                            if succeeds {
                                successes += 1;
                                marker = Marker::Done;
                            } else {
                                marker = release(&next, &token);
                            }
                        } else {
                            marker = next;
                        }
                        attempts = count;
                    }
                }
            }
            prop_assert!(successes <= 1);
            // Attempt numbers never go down: a scanner can refuse a stale one.
            prop_assert!(numbers.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
