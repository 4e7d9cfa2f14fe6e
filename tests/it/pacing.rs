//! Pacing against parallel clients (issue: "a parallel client is slowed as
//! much as a patient one"), on a real Valkey (standalone and cluster) and the
//! in-memory store: a burst is spread out one delay apart, `QUOTA_PACING=off`
//! gives the seed's fixed delays, and the backlog cap refuses what would wait
//! too long without counting it or queueing anything.

use quota_gate_testkit as common;

use std::sync::Arc;

use common::cluster::{ValkeyCluster, cluster_gate};
use common::*;
use quota_gate::gate::Gate;
use quota_gate::io::queue::ScanQueue;
use quota_gate::io::store::QuotaStore;
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::rules::unix::{UnixMillis, UnixSecs};
use serde_json::Value;

const IP: &str = "198.51.100.77";

/// [`SEED_DELAYS`], nothing slept, a store timeout for a loaded machine; and `extra`.
fn vars(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let burst = [
        ("QUOTA_DELAY_MODE", "defer"),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ];
    with_vars(&with_vars(SEED_DELAYS, &burst), extra)
}

/// Sends `n` scans from one address at once; returns each answer's status and body.
async fn burst<S: QuotaStore, Q: ScanQueue>(gate: Gate<S, Q>, n: usize) -> Vec<(u16, Value)> {
    statuses_and_bodies(&all_at_once(&Arc::new(gate), (0..n).map(|_| scan_from(IP))).await)
}

/// The answers' delays, sorted.
fn sorted_delays(answers: &[(u16, Value)]) -> Vec<u64> {
    let mut delays: Vec<u64> = answers
        .iter()
        .map(|(_, b)| b["delayMs"].as_u64().unwrap())
        .collect();
    delays.sort_unstable();
    delays
}

/// The jobs' `notBefore` instants of the over-quota scans, sorted, and the
/// earliest `receivedAt` of all.
fn schedule(jobs: &[Value]) -> (Vec<i64>, i64) {
    let mut slots: Vec<i64> = jobs
        .iter()
        .filter(|j| j["tier"] != "within")
        .map(|j| unix_ms(j["notBefore"].as_str().unwrap()))
        .collect();
    slots.sort_unstable();
    let start = jobs
        .iter()
        .map(|j| unix_ms(j["receivedAt"].as_str().unwrap()))
        .min()
        .unwrap();
    (slots, start)
}

/// 12 at once: all 202, one job each; the 10 over quota start at least 1 s
/// apart, the last at least 3×1 s + 7×3 s after the burst.
fn assert_paced(answers: &[(u16, Value)], jobs: &[Value]) {
    assert!(answers.iter().all(|(s, _)| *s == 202), "{answers:?}");
    assert_eq!(jobs.len(), 12, "one job per 202");
    let (slots, start) = schedule(jobs);
    assert_eq!(slots.len(), 10);
    for pair in slots.windows(2) {
        assert!(pair[1] - pair[0] >= 1000, "one delay apart: {slots:?}");
    }
    assert!(slots[9] - start >= 3 * 1000 + 7 * 3000, "{slots:?}");
    let delays = sorted_delays(answers);
    // Each answer's delay is its job's: what X-Stella-Quota-Delay-Ms says.
    assert_eq!(delays.iter().filter(|d| **d == 0).count(), 2);
    // Unpaced it would be 3 s; the exact line is checked on the slots above.
    assert!(delays[11] >= 18_000, "{delays:?}");
}

#[tokio::test]
async fn burst_is_paced_in_memory() {
    let jobs = RecordingQueue::default();
    let answers = burst(gate(&vars(&[]), MemoryStore::default(), jobs.clone()), 12).await;
    assert_paced(&answers, &jobs.json());
}

#[tokio::test]
async fn burst_is_paced_on_valkey() {
    let server = ValkeyServer::start();
    let answers = burst(valkey_gate(&server, &vars(&[])), 12).await;
    assert_paced(&answers, &stream_jobs(&server, "jobs").await);
    // The slot key shares the subject's tag and the counter's expiry.
    let mut c = server.client().await;
    let keys: Vec<String> = redis::AsyncCommands::keys(&mut c, "quota:ip:*:slot")
        .await
        .unwrap();
    assert_eq!(keys.len(), 1);
    let counter = keys[0].trim_end_matches(":slot");
    let (slot_expiry, counter_expiry): (i64, i64) = redis::pipe()
        .cmd("EXPIRETIME")
        .arg(&keys[0])
        .cmd("EXPIRETIME")
        .arg(counter)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(slot_expiry, counter_expiry);
}

#[tokio::test]
async fn burst_is_paced_on_a_cluster() {
    let cluster = ValkeyCluster::start();
    let answers = burst(cluster_gate(&cluster, &vars(&[])), 12).await;
    assert_paced(&answers, &cluster.stream_jobs("jobs").await);
}

/// `QUOTA_PACING=off`: the seed's fixed delays, whatever the parallelism.
#[tokio::test]
async fn pacing_off_gives_fixed_delays() {
    let server = ValkeyServer::start();
    let off = vars(&[("QUOTA_PACING", "off")]);
    let delays = sorted_delays(&burst(valkey_gate(&server, &off), 12).await);
    assert_eq!(
        delays,
        [
            0, 0, 1000, 1000, 1000, 3000, 3000, 3000, 3000, 3000, 3000, 3000
        ]
    );
    let memory = burst(gate(&off, MemoryStore::default(), Discard), 12).await;
    assert_eq!(sorted_delays(&memory), delays);
}

/// With a 10 s cap, part of the burst is refused with 503 backlog_full and
/// Retry-After ≥ 1: the count equals the 202s, one job per 202, no accepted
/// scan delayed past the cap, and the refusals counted nowhere.
async fn assert_capped<S: QuotaStore, Q: ScanQueue>(
    gate: Gate<S, Q>,
    jobs: impl AsyncFnOnce() -> Vec<Value>,
    count: impl AsyncFnOnce() -> u64,
) {
    let answers = all_at_once(&Arc::new(gate), (0..12).map(|_| scan_from(IP))).await;
    let (mut accepted, mut refused) = (0u64, 0u64);
    for r in answers {
        match r.status().as_u16() {
            202 => {
                accepted += 1;
                assert!(json(&r)["delayMs"].as_u64().unwrap() <= 10_000);
            }
            503 => {
                refused += 1;
                assert_eq!(json(&r)["error"], "backlog_full");
                assert!(retry_after(&r) >= 1);
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(refused > 0, "the cap refused part of the burst");
    assert_eq!(jobs().await.len() as u64, accepted, "one job per 202");
    assert_eq!(count().await, accepted, "refusals are not counted");
}

#[tokio::test]
async fn backlog_cap_on_valkey() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &vars(&[("QUOTA_MAX_BACKLOG_MS", "10000")]));
    assert_capped(
        gate,
        async || stream_jobs(&server, "jobs").await,
        async || {
            let mut c = server.client().await;
            let keys: Vec<String> = redis::AsyncCommands::keys(&mut c, "quota:ip:{*}")
                .await
                .unwrap();
            redis::AsyncCommands::get(&mut c, &keys[0]).await.unwrap()
        },
    )
    .await;
}

#[tokio::test]
async fn backlog_cap_in_memory() {
    let jobs = RecordingQueue::default();
    let store = MemoryStore::default();
    let gate = gate(
        &vars(&[("QUOTA_MAX_BACKLOG_MS", "10000")]),
        store.clone(),
        jobs.clone(),
    );
    let key = quota_gate::io::store::QuotaKey::new(
        quota_gate::rules::scope::Scope::Ip,
        &gate.identifier().ip_digest(IP.parse().unwrap()),
    );
    assert_capped(
        gate,
        async || jobs.json(),
        async || store.used(&key, UnixSecs(now())).unwrap(),
    )
    .await;
}

/// A tier delay longer than the cap: the first such scan is served (nothing
/// is queued ahead of it), the next is refused until the line moves.
#[tokio::test]
async fn a_delay_longer_than_the_cap_is_served_one_at_a_time() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(
        &server,
        &[
            ("QUOTA_ANON", "1"),
            ("QUOTA_SOFT_WINDOW", "0"),
            ("QUOTA_HARD_DELAY_MS", "20000"),
            ("QUOTA_MAX_BACKLOG_MS", "10000"),
            ("QUOTA_DELAY_MODE", "defer"),
        ],
    );
    let answers: Vec<(u16, u64)> = one_at_a_time(&gate, (0..3).map(|_| scan_from(IP)))
        .await
        .iter()
        .map(|r| {
            (
                r.status().as_u16(),
                json(r)["delayMs"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(answers, [(202, 0), (202, 20_000), (503, 0)]);
}

/// `pace.lua` on a real Valkey and the pure `pace::next_start` agree on every
/// input: the same slot, the same delay, the same refusal and wait.
#[test]
fn pace_script_matches_the_pure_rule() {
    use proptest::prelude::*;
    use quota_gate::io::connection::Valkey;
    use quota_gate::io::store::valkey::ValkeyStore;
    use quota_gate::io::store::{PaceArgs, Paced, QuotaKey};
    use quota_gate::rules::digest::Hasher;
    use quota_gate::rules::pace::next_start;
    use quota_gate::rules::scope::Scope;

    let server = ValkeyServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let valkey = Valkey::new(&server.url(), false, std::time::Duration::from_secs(2)).unwrap();
    let store = ValkeyStore::new(valkey);
    let key = QuotaKey::new(
        Scope::Ip,
        &Hasher::new(b"0123456789abcdef").digest(Scope::Ip, IP),
    );
    let now_ms = 1_796_032_800_000i64;
    let config = ProptestConfig::with_cases(200);
    proptest!(config, |(previous in 0i64..2_000_000, ahead in 0i64..2_000_000,
                        delay in 0u64..1_000_000, cap in 0u64..2_000_000)| {
        let arrival = now_ms + ahead;
        let previous = if previous == 0 { 0 } else { now_ms + previous };
        let reply = rt.block_on(async {
            let mut c = server.client().await;
            let _: () = redis::cmd("SET").arg(&key.slot).arg(previous)
                .query_async(&mut c).await.unwrap();
            let args = PaceArgs {
                key: &key,
                levels: &[],
                record: None,
                arrival_ms: UnixMillis(arrival),
                delay_ms: delay,
                max_backlog_ms: cap,
                reset_at: UnixSecs(0),
                sleep_ask: None,
            };
            let paced = store.pace(args).await.unwrap();
            let slot: i64 = redis::cmd("GET").arg(&key.slot).query_async(&mut c).await.unwrap();
            (paced, slot)
        });
        match next_start([(UnixMillis(previous), delay)], UnixMillis(arrival), cap).map(UnixMillis::get) {
            Ok(slot) => {
                let wait = u64::try_from(slot - arrival).unwrap();
                prop_assert_eq!(reply, (Paced::Slot { delay_ms: wait, sleep_lease: None }, slot));
            }
            Err(retry_after_ms) => {
                let levels_ms = Vec::new();
                prop_assert_eq!(reply, (Paced::Full { retry_after_ms, levels_ms }, previous));
            }
        }
    });
}
