//! The consumer's rules, pure: when a job may start, what a `scanId` marker
//! allows, and what follows a hand-off. No clock, no client: the current
//! time is an argument, and the async code only carries out the answer.

use std::num::NonZeroU32;
use std::time::Duration;

/// SQS's longest visibility timeout (12 h).
pub const MAX_VISIBILITY_SECS: u64 = 43_200;

/// How long a job must still be held: zero once `not_before_ms` has come.
pub fn hold(not_before_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(not_before_ms.saturating_sub(now_ms)).unwrap_or(0))
}

/// How late a start is (start − `notBefore`, ms); negative would be early,
/// which [`hold`] rules out.
pub fn lateness_ms(start_ms: i64, not_before_ms: i64) -> i64 {
    start_ms.saturating_sub(not_before_ms)
}

/// How a not-yet-due SQS message is held: by its visibility timeout for
/// whole seconds (rounded down, so it comes back before `notBefore`, never
/// after), the last fraction of a second in memory. `None`: less than a
/// second to go, hold it in memory. Capped at SQS's 12 h; a longer hold
/// takes several rounds.
pub fn sqs_visibility(wait: Duration) -> Option<i32> {
    let secs = wait.as_secs().min(MAX_VISIBILITY_SECS);
    // At most 43 200, so the conversion cannot fail.
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

/// How one hand-off ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanResult {
    /// The scanner took the job (exit 0, 2xx).
    Done,
    /// It did not (non-zero exit, non-2xx, no answer).
    Failed,
}

/// What follows a hand-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterScan {
    /// Keep the marker as done, then acknowledge (ack / delete) the job.
    Ack,
    /// Release the marker and try again after this wait.
    RetryAfter(Duration),
    /// Release the marker and move the job to the dead-letter stream (SQS:
    /// leave it to the queue's redrive policy).
    DeadLetter,
}

/// The rule after a hand-off, `failures` counting this one if it failed.
/// (Not the gate's [`crate::settle`]: that one puts a failed request right.)
pub fn after_scan(result: ScanResult, failures: u32, policy: &RetryPolicy) -> AfterScan {
    match result {
        ScanResult::Done => AfterScan::Ack,
        ScanResult::Failed if failures >= policy.max_attempts.get() => AfterScan::DeadLetter,
        ScanResult::Failed => AfterScan::RetryAfter(policy.backoff(failures)),
    }
}

/// A `scanId` marker: what a consumer knows about one scan. Beside it a
/// counter of attempts (the fencing token a scanner sees as `SCAN_ATTEMPT`)
/// outlives each lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// Nobody runs it, nobody ran it.
    Free,
    /// One attempt runs it, under `token`, until its lease ends.
    Held { token: String, until_ms: i64 },
    /// It ran to success: never again.
    Done,
}

/// The answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerClaim {
    /// This attempt may run the scan, as attempt number `.0` (a renewal
    /// keeps the number).
    Claimed(u64),
    /// It already ran: acknowledge without running.
    Done,
    /// Another attempt holds a live lease, or (for a renewal) claimed the
    /// scan since this one last held it: come back later / stop.
    Busy,
}

/// Claims `marker` for `token` at `now_ms` for `lease_ms`. `attempts` is
/// the scan's attempt counter; `mine` is the attempt number this claim
/// renews (0: a new attempt). A new attempt takes the next number (a claim
/// that landed unanswered and is sent again keeps it: same token). A
/// renewal holds only if no other attempt was numbered since, even if its
/// lease ran out meanwhile: a consumer that was paused past its lease finds
/// out here. The Valkey script (`claim.lua`) applies the same rule, with
/// key expiry as the lease. Returns the marker, the counter and the answer.
pub fn claim(
    marker: &Marker,
    attempts: u64,
    token: &str,
    mine: u64,
    now_ms: i64,
    lease_ms: i64,
) -> (Marker, u64, MarkerClaim) {
    let live_holder = match marker {
        Marker::Done => return (Marker::Done, attempts, MarkerClaim::Done),
        Marker::Held { token: t, until_ms } if *until_ms > now_ms => Some(t.as_str()),
        _ => None,
    };
    if live_holder.is_some_and(|t| t != token) || (mine > 0 && mine != attempts) {
        return (marker.clone(), attempts, MarkerClaim::Busy);
    }
    let number = if mine > 0 || live_holder == Some(token) {
        attempts
    } else {
        attempts + 1
    };
    let held = Marker::Held {
        token: token.to_owned(),
        until_ms: now_ms.saturating_add(lease_ms),
    };
    (held, number, MarkerClaim::Claimed(number))
}

/// Releases `token`'s hold after a failure; anyone else's stays.
pub fn release(marker: &Marker, token: &str) -> Marker {
    match marker {
        Marker::Held { token: t, .. } if t == token => Marker::Free,
        other => other.clone(),
    }
}

/// What a consumer does about a marker it could not claim.
pub fn on_claim(claim: MarkerClaim, lease: Duration) -> Step {
    match claim {
        MarkerClaim::Claimed(attempt) => Step::Run(attempt),
        MarkerClaim::Done => Step::AckDuplicate,
        // The holder's lease ends within one lease; by then it has either
        // finished (done) or died (free).
        MarkerClaim::Busy => Step::Later(lease / 2),
    }
}

/// The step a claim leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Run(u64),
    AckDuplicate,
    Later(Duration),
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

/// Whether a running scan must be stopped, after `renewal`, when the last
/// renewal known to have held was *sent* `since_held` ago. The marker
/// expires one lease after that renewal landed, and it landed after it was
/// sent, so a scan stopped once ¾ of a lease has passed without a held
/// renewal is stopped before anyone else can claim it (the last quarter is
/// the margin for the kill and for clock drift). Only a consumer that was
/// itself paused longer than that can overlap another attempt, and it stops
/// at once when it wakes.
pub fn must_stop(renewal: Renewal, since_held: Duration, lease: Duration) -> bool {
    match renewal {
        Renewal::Lost => true,
        Renewal::Held => false,
        Renewal::Unknown => since_held >= lease.saturating_mul(3) / 4,
    }
}

/// The queue clock's offset from the local one (ms to add to local time),
/// from one reading of the server's clock taken between `sent_ms` and
/// `answered_ms` (local). The server read its clock somewhere in that round
/// trip; taking the end of it gives the smallest offset the reading allows,
/// so the queue time it yields is never ahead of the server's, and a job
/// timed by it never starts early (at worst one round trip late).
pub fn clock_offset_ms(sent_ms: i64, server_ms: i64, answered_ms: i64) -> i64 {
    debug_assert!(sent_ms <= answered_ms);
    server_ms.saturating_sub(answered_ms)
}

/// The skew past which the consumer warns (it times jobs by the queue's
/// clock all the same).
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

    /// Every result and failure count, against the policy: ack on success,
    /// retry with a growing wait, dead-letter at the limit.
    #[test]
    fn after_scan_table() {
        let p = policy(3);
        let ms = Duration::from_millis;
        assert_eq!(after_scan(ScanResult::Done, 0, &p), AfterScan::Ack);
        assert_eq!(after_scan(ScanResult::Done, 2, &p), AfterScan::Ack);
        assert_eq!(
            after_scan(ScanResult::Failed, 1, &p),
            AfterScan::RetryAfter(ms(200))
        );
        assert_eq!(
            after_scan(ScanResult::Failed, 2, &p),
            AfterScan::RetryAfter(ms(400))
        );
        assert_eq!(after_scan(ScanResult::Failed, 3, &p), AfterScan::DeadLetter);
        assert_eq!(after_scan(ScanResult::Failed, 9, &p), AfterScan::DeadLetter);
        assert_eq!(policy(40).backoff(30), Duration::from_secs(30));
    }

    /// Each marker state against each claimant: done stays done, a live
    /// lease keeps others out, an expired one or the holder's own token
    /// gets in; a new attempt is numbered, a renewal keeps its number and
    /// fails once another attempt was numbered.
    #[test]
    fn claim_table() {
        let held = Marker::Held {
            token: "a".into(),
            until_ms: 100,
        };
        assert_eq!(
            claim(&Marker::Free, 0, "a", 0, 0, 10).2,
            MarkerClaim::Claimed(1)
        );
        assert_eq!(claim(&Marker::Done, 3, "a", 0, 0, 10).2, MarkerClaim::Done);
        assert_eq!(claim(&held, 1, "a", 1, 50, 10).2, MarkerClaim::Claimed(1));
        assert_eq!(claim(&held, 1, "a", 0, 50, 10).2, MarkerClaim::Claimed(1));
        assert_eq!(claim(&held, 1, "b", 0, 50, 10).2, MarkerClaim::Busy);
        assert_eq!(claim(&held, 1, "b", 0, 100, 10).2, MarkerClaim::Claimed(2));
        // Lease over, nobody else came: the renewal still holds.
        assert_eq!(claim(&held, 1, "a", 1, 500, 10).2, MarkerClaim::Claimed(1));
        // Another attempt was numbered meanwhile (and released): lost.
        assert_eq!(
            claim(&Marker::Free, 2, "a", 1, 500, 10).2,
            MarkerClaim::Busy
        );
        assert_eq!(release(&held, "b"), held);
        assert_eq!(release(&held, "a"), Marker::Free);
        assert_eq!(release(&Marker::Done, "a"), Marker::Done);
        let lease = Duration::from_secs(4);
        assert_eq!(on_claim(MarkerClaim::Claimed(2), lease), Step::Run(2));
        assert_eq!(on_claim(MarkerClaim::Done, lease), Step::AckDuplicate);
        assert_eq!(on_claim(MarkerClaim::Busy, lease), Step::Later(lease / 2));
    }

    /// A running scan stops when its marker is lost, or when ¾ of a lease
    /// passed with no renewal known to hold; never while renewals hold.
    #[test]
    fn stop_table() {
        let lease = Duration::from_secs(8);
        let s = Duration::from_secs;
        assert!(must_stop(Renewal::Lost, s(0), lease));
        assert!(!must_stop(Renewal::Held, s(60), lease));
        assert!(!must_stop(Renewal::Unknown, s(5), lease));
        assert!(must_stop(Renewal::Unknown, s(6), lease));
    }

    /// The offset takes the server's reading as late in the round trip as
    /// it can have been, so the queue time is never ahead of the server's.
    #[test]
    fn offsets() {
        assert_eq!(clock_offset_ms(1_000, 1_000, 1_000), 0);
        assert_eq!(clock_offset_ms(1_000, 21_010, 1_020), 19_990);
        assert_eq!(clock_offset_ms(21_000, 1_005, 21_010), -20_005);
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
            let start = now + i64::try_from(hold(not_before, now).as_millis()).unwrap();
            prop_assert!(start >= not_before);
            prop_assert!(lateness_ms(start, not_before) >= 0);
            if not_before <= now {
                prop_assert_eq!(hold(not_before, now), Duration::ZERO);
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
            let lease = 100;
            let (mut marker, mut attempts, mut now, mut successes) = (Marker::Free, 0, 0i64, 0);
            let mut numbers = Vec::new();
            for a in acts {
                match a {
                    Act::Wait(ms) => now += i64::from(ms),
                    Act::Try { n, succeeds } => {
                        let token = format!("t{n}");
                        let (next, count, answer) = claim(&marker, attempts, &token, 0, now, lease);
                        if let MarkerClaim::Claimed(number) = answer {
                            prop_assert!(!matches!(&marker, Marker::Held { token: t, until_ms }
                                if *t != token && *until_ms > now), "claimed over a live lease");
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
