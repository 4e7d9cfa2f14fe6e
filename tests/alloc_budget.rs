//! A binary of its own: its counting global allocator counts every allocation of the process.
//!
//! The gate's heap allocations per within-quota `POST /scan`, in process:
//! the real `Gate::handle` over the in-memory store, the stdout spool's
//! line writer (into a sink) and the EMF meter, so the response JSON, the
//! job JSON and the EMF line are all counted. A counting global allocator
//! (every thread: the spool's writer thread too) measures a steady state of
//! one caller's scans.
//!
//! The same for the size of a request's future, which `serve` moves into a
//! task of its own per scan.
//!
//! The budget is what the code needed when this test was written, plus a
//! little room; it can only go down. A change that needs more allocations
//! per request must say why here.

use quota_gate_testkit as common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use quota_gate::io::queue::spool::Spool;
use quota_gate::io::store::memory::MemoryStore;

/// Counts every allocation (and reallocation) of the process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations per within-quota scan, at most. With the default network
/// level an IPv4 scan is counted at its /24 too (its digest, its counter,
/// slot and grant keys, the levels the identity, the attempt and the count's
/// answer carry, and the 202's list of where each level stands); keys,
/// headers and JSON buffers are built at their size at once, and the job
/// takes the request body rather than a copy. One of room for a
/// dependency's update. A change that needs more must say why here.
const BUDGET: u64 = 46;

/// Requests measured after the warm-up.
const MEASURED: u64 = 500;

/// Held by each test here: the counter is the whole process's, so another
/// test building a gate meanwhile would count in the measurement.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A within-quota scan allocates no more than [`BUDGET`] times, averaged
/// over a steady run of one caller's scans.
#[tokio::test(flavor = "current_thread")]
async fn within_quota_scan_stays_in_its_allocation_budget() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let vars = [("QUOTA_ANON", "1000000")];
    let emf = Capture::default();
    let gate = metered_gate(
        &vars,
        MemoryStore::default(),
        Spool::new(Box::new(std::io::sink())),
        emf.meter(),
    );
    for _ in 0..50 {
        let answer = gate.handle(scan_from("198.51.100.7")).await;
        assert_eq!(answer.status(), 202);
    }
    let requests: Vec<_> = (0..MEASURED).map(|_| scan_from("198.51.100.7")).collect();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for request in requests {
        let answer = gate.handle(request).await;
        assert_eq!(answer.status(), 202);
        drop(answer);
    }
    let per_request = (ALLOCATIONS.load(Ordering::Relaxed) - before) / MEASURED;
    eprintln!("allocations per within-quota scan: {per_request} (budget {BUDGET})");
    docs_say(&format!("within-quota scan (at most {BUDGET})"));
    assert!(
        per_request <= BUDGET,
        "{per_request} allocations per scan, over the budget of {BUDGET}"
    );
}

/// The most bytes the future of one request through `serve`'s gate (the
/// store and queue `serve` builds, [`AnyStore`] and [`AnyQueue`]) may take,
/// in this (debug) build, with a little room. `serve` moves that future
/// whole into a task of its own per scan, so its size is copied on every
/// request: the rare paths (`GET /quota`, exempt scans, repeats, store
/// failures, pacing, settlements) and SQS's send are boxed to keep them out
/// of it (twice the size before they were). A change that needs more must
/// say why here.
const FUTURE_BUDGET: usize = 4_640;

/// A request's future stays within [`FUTURE_BUDGET`].
#[tokio::test(flavor = "current_thread")]
async fn request_future_stays_in_its_size_budget() {
    let _alone = ONE_AT_A_TIME.lock().await;
    use quota_gate::gate::{Gate, GateRequest};
    use quota_gate::io::meter::Meter;
    use quota_gate::io::queue::AnyQueue;
    use quota_gate::io::store::AnyStore;

    let gate: Gate<AnyStore, AnyQueue> = Gate::from_config(config(&[]), Meter::new("t", None))
        .await
        .expect("the default configuration builds");
    let future = gate.handle(GateRequest::default());
    let size = std::mem::size_of_val(&future);
    drop(future);
    eprintln!("bytes of a request's future: {size} (budget {FUTURE_BUDGET})");
    docs_say(&format!("request's future (at most {FUTURE_BUDGET} bytes)"));
    assert!(
        size <= FUTURE_BUDGET,
        "a request's future takes {size} bytes, over the budget of {FUTURE_BUDGET}"
    );
}

/// docs/benchmarks.md gives the budget: `phrase`, with its line breaks
/// taken as spaces. The budget, not today's figure, which a compiler or a
/// dependency may move by a byte; the test prints that.
fn docs_say(phrase: &str) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md"))
            .expect("docs/benchmarks.md is readable");
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(phrase),
        "docs/benchmarks.md should say \"{phrase}\""
    );
}
