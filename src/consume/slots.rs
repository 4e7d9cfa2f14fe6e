//! The run slots (`--concurrency`): which due job starts next when the scanner is busy. A
//! within-quota scan is promised "at once", so due jobs do not start first come, first served:
//! within-quota jobs go first; over-quota jobs wait in one line per tenant, served round-robin; and
//! while both lanes wait without a break, every `--over-every`-th start goes to the over lane.
//! [`next_lane`] is the rule; [`RunSlots`] hands a freed slot straight to the waiter it picks.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::sync::lock;
use crate::rules::job::Lane;

/// Which lane the next free slot goes to: `None` when nobody waits. `since_over` counts the starts
/// given to the within lane since the over lane's last, while both lanes waited without a break.
pub fn next_lane(
    within_waiting: bool,
    over_waiting: bool,
    since_over: u32,
    over_every: u32,
) -> Option<Lane> {
    match (within_waiting, over_waiting) {
        (true, true) if since_over + 1 >= over_every => Some(Lane::Over),
        (true, _) => Some(Lane::Within),
        (false, true) => Some(Lane::Over),
        (false, false) => None,
    }
}

type Waiter = oneshot::Sender<Slot>;

#[derive(Default)]
struct State {
    free: usize,
    within: VecDeque<Waiter>,
    /// One line per tenant, in the order they are served.
    over: VecDeque<(String, VecDeque<Waiter>)>,
    since_over: u32,
}

impl State {
    /// The next waiter by [`next_lane`], taken out of its line.
    fn next(&mut self, over_every: u32) -> Option<Waiter> {
        let lane = next_lane(
            !self.within.is_empty(),
            !self.over.is_empty(),
            self.since_over,
            over_every,
        )?;
        match lane {
            Lane::Within => {
                let waiter = self.within.pop_front();
                // The share is owed only while the within line never empties: a within-quota job
                // that finds it empty starts next.
                let both_wait = !self.within.is_empty() && !self.over.is_empty();
                self.since_over = if both_wait { self.since_over + 1 } else { 0 };
                waiter
            }
            Lane::Over => {
                self.since_over = 0;
                let (tenant, mut line) = self.over.pop_front()?;
                let waiter = line.pop_front();
                // The tenant goes to the back of the round, if it still waits.
                if !line.is_empty() {
                    self.over.push_back((tenant, line));
                }
                waiter
            }
        }
    }

    fn wait(&mut self, lane: Lane, tenant: &str, waiter: Waiter) {
        match lane {
            Lane::Within => self.within.push_back(waiter),
            Lane::Over => match self.over.iter_mut().find(|(t, _)| t == tenant) {
                Some((_, line)) => line.push_back(waiter),
                None => self.over.push_back((tenant.to_owned(), [waiter].into())),
            },
        }
    }

    fn waiting(&self) -> bool {
        !self.within.is_empty() || !self.over.is_empty()
    }
}

/// `--concurrency` slots, handed out by the rule above.
pub struct RunSlots {
    state: Mutex<State>,
    over_every: u32,
}

/// A held slot; it goes to the next waiter when dropped.
pub struct Slot(Arc<RunSlots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl RunSlots {
    /// `slots` slots, the over lane's share one start in `over_every` (at least 1).
    pub fn new(slots: usize, over_every: u32) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: slots,
                ..State::default()
            }),
            over_every: over_every.max(1),
        })
    }

    /// A slot for a due job of `lane` and `tenant`: at once if one is free and nobody waits, else
    /// when the rule picks it. Dropping the future leaves the line.
    pub async fn acquire(self: &Arc<Self>, lane: Lane, tenant: &str) -> Slot {
        let handed = {
            let mut state = lock(&self.state);
            if state.free > 0 && !state.waiting() {
                state.free -= 1;
                return Slot(self.clone());
            }
            let (tx, rx) = oneshot::channel();
            state.wait(lane, tenant, tx);
            rx
        };
        match handed.await {
            Ok(slot) => slot,
            // Never: a waiter is only dropped once it has been sent to.
            Err(_) => std::future::pending().await,
        }
    }

    /// A slot given back: to the next waiter the rule picks, or free.
    fn release(self: &Arc<Self>) {
        loop {
            let mut state = lock(&self.state);
            let Some(waiter) = state.next(self.over_every) else {
                state.free += 1;
                return;
            };
            drop(state);
            match waiter.send(Slot(self.clone())) {
                Ok(()) => return,
                // Its job stopped waiting: on to the next, without `Drop` releasing it twice.
                Err(slot) => std::mem::forget(slot),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The rule's table: within first; the over lane's share every
    /// `over_every`-th start while both wait; alone, each lane goes.
    #[test]
    fn the_rule() {
        assert_eq!(next_lane(false, false, 0, 4), None);
        assert_eq!(next_lane(true, false, 9, 4), Some(Lane::Within));
        assert_eq!(next_lane(false, true, 0, 4), Some(Lane::Over));
        assert_eq!(next_lane(true, true, 0, 4), Some(Lane::Within));
        assert_eq!(next_lane(true, true, 2, 4), Some(Lane::Within));
        assert_eq!(next_lane(true, true, 3, 4), Some(Lane::Over));
        assert_eq!(next_lane(true, true, 0, 1), Some(Lane::Over));
    }

    /// With one slot held, waiters start in the rule's order: the
    /// within-quota job that came last before the over-quota ones that came
    /// first, tenants in turn (a, b, a, c), and a within job every time the
    /// share allows.
    #[tokio::test(start_paused = true)]
    async fn order_of_starts() {
        let slots = RunSlots::new(1, 3);
        let held = slots.acquire(Lane::Within, "-").await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        let arrivals = [
            (Lane::Over, "a", "a1"),
            (Lane::Over, "a", "a2"),
            (Lane::Over, "a", "a3"),
            (Lane::Over, "b", "b1"),
            (Lane::Over, "c", "c1"),
            (Lane::Within, "-", "w1"),
            (Lane::Within, "-", "w2"),
            (Lane::Within, "-", "w3"),
        ];
        for (lane, tenant, name) in arrivals {
            let (slots, tx) = (slots.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = slots.acquire(lane, tenant).await;
                tx.send(name).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
            tokio::task::yield_now().await;
        }
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        let mut order = Vec::new();
        while let Ok(name) = rx.try_recv() {
            order.push(name);
        }
        assert_eq!(
            order,
            ["w1", "w2", "a1", "w3", "b1", "c1", "a2", "a3"],
            "within first, the over lane's share every third start, tenants in turn"
        );
    }

    /// A waiter that gives up (its job stopped) does not take a slot with
    /// it: the slot goes on to the next, and comes back free.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_takes_no_slot() {
        let slots = RunSlots::new(1, 4);
        let held = slots.acquire(Lane::Within, "-").await;
        let gone = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire(Lane::Over, "a").await })
        };
        tokio::task::yield_now().await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(1), slots.acquire(Lane::Over, "b"));
        assert!(again.await.is_ok(), "the slot came back free");
    }
    use proptest::test_runner::TestCaseError;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Event {
        Arrive,
        Start,
        Release,
    }

    /// One drawn arrival: over quota or not, its tenant, when it arrives,
    /// how long its scan takes (ms).
    type Arrival = (bool, u8, u64, u64);

    /// Runs `arrivals` through one slot (paused time); per start, in
    /// order: (its index, the indexes waiting when the slot was handed).
    fn run(arrivals: &[Arrival], over_every: u32) -> Vec<(usize, Vec<usize>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let slots = RunSlots::new(1, over_every);
            // Each task's arrival, start and release, in one sequence.
            let log = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for (i, &(over, tenant, at, scan)) in arrivals.iter().enumerate() {
                let (slots, log) = (slots.clone(), log.clone());
                let lane = if over { Lane::Over } else { Lane::Within };
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(at)).await;
                    log.lock().unwrap().push((i, Event::Arrive));
                    let slot = slots.acquire(lane, &tenant.to_string()).await;
                    log.lock().unwrap().push((i, Event::Start));
                    tokio::time::sleep(Duration::from_millis(scan)).await;
                    // Logged before the drop, which hands the slot on.
                    log.lock().unwrap().push((i, Event::Release));
                    drop(slot);
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            // A start was handed at the last release before it, unless its
            // own arrival came after that release (it found the slot free):
            // what waited is what had arrived by then and not yet started.
            let log = log.lock().unwrap();
            let mut starts = Vec::new();
            for (n, &(i, event)) in log.iter().enumerate() {
                if event != Event::Start {
                    continue;
                }
                let arrived = log.iter().position(|&e| e == (i, Event::Arrive)).unwrap();
                let handed = log[..n].iter().rposition(|e| e.1 == Event::Release);
                let at = match handed {
                    Some(r) if r > arrived => r,
                    _ => n,
                };
                let started: Vec<usize> = log[..n]
                    .iter()
                    .filter(|e| e.1 == Event::Start)
                    .map(|e| e.0)
                    .collect();
                let waiting = log[..at]
                    .iter()
                    .filter(|e| e.1 == Event::Arrive && !started.contains(&e.0))
                    .map(|e| e.0)
                    .collect();
                starts.push((i, waiting));
            }
            starts
        })
    }

    /// The order rules over the starts of `arrivals` (see the property below).
    fn order_holds(arrivals: &[Arrival], over_every: u32) -> Result<(), TestCaseError> {
        let starts = run(arrivals, over_every);
        proptest::prop_assert_eq!(starts.len(), arrivals.len());
        let over = |i: usize| arrivals[i].0;
        let mut within_since_over = 0u32;
        // Per tenant, its last start: (position, over-quota tenants waiting then).
        let mut last_turn: std::collections::HashMap<u8, (usize, Vec<u8>)> = Default::default();
        let mut turns: Vec<Option<u8>> = Vec::new();
        for (n, (i, waiting)) in starts.iter().enumerate() {
            let others: Vec<usize> = waiting.iter().copied().filter(|w| w != i).collect();
            if !over(*i) {
                within_since_over += 1;
                turns.push(None);
                continue;
            }
            if others.iter().any(|w| !over(*w)) {
                proptest::prop_assert!(
                    within_since_over + 1 >= over_every,
                    "an over-quota start after {} within-quota ones: {:?}",
                    within_since_over,
                    starts
                );
            }
            within_since_over = 0;
            let tenant = arrivals[*i].1;
            let waiting_tenants: Vec<u8> = others
                .iter()
                .filter(|w| over(**w))
                .map(|w| arrivals[*w].1)
                .filter(|t| *t != tenant)
                .collect();
            if let Some((at, before)) = last_turn.get(&tenant) {
                // A tenant waiting then and now had its turn in between.
                for t in before.iter().filter(|t| waiting_tenants.contains(t)) {
                    proptest::prop_assert!(
                        turns[*at..].contains(&Some(*t)),
                        "tenant {} again before {} had its turn: {:?}",
                        tenant,
                        t,
                        starts
                    );
                }
            }
            last_turn.insert(tenant, (n, waiting_tenants));
            turns.push(Some(tenant));
        }
        Ok(())
    }

    /// A release and an arrival in the same millisecond: the slot was
    /// handed before the within-quota job arrived.
    #[test]
    fn a_tie_between_a_release_and_an_arrival() {
        let arrivals = [(true, 0, 0, 11), (true, 0, 0, 1), (false, 0, 11, 1)];
        order_holds(&arrivals, 2).unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Drawn arrivals of both lanes and four tenants through one slot:
        /// an over-quota job starts while a within-quota one waits only
        /// once `over_every - 1` within-quota ones started since the over
        /// lane's last start; and a tenant starts again only after every
        /// tenant that waited then and still waits took its turn.
        #[test]
        fn drawn_arrivals_keep_the_order(
            arrivals in proptest::collection::vec(
                (proptest::bool::ANY, 0u8..4, 0u64..200, 1u64..30), 1..40),
            over_every in 1u32..5,
        ) {
            order_holds(&arrivals, over_every)?;
        }
    }
}
