//! The request path against a local 3-primary Valkey cluster
//! (`VALKEY_CLUSTER=true`): tiers, TTLs, exact counts under concurrency, and
//! a purge that visits every primary.

use quota_gate_testkit as common;

use common::cluster::{ValkeyCluster, cluster_gate};
use common::*;
use redis::AsyncCommands;

/// Tiers in cluster mode: 1–3 no delay, 4–5 soft, 6+ hard, one job per 202.
#[tokio::test]
async fn tiers_against_a_cluster() {
    let cluster = ValkeyCluster::start();
    // The subject's tiers alone: with the default levels its 202s would
    // also list the /24's policy (tests/it/levels_client.rs covers that).
    let vars = with_vars(TIERS, &[("QUOTA_NETWORKS", "off")]);
    assert_tiers(&cluster_gate(&cluster, &vars)).await;
    assert_eq!(cluster.stream_jobs("jobs").await.len(), 8);
}

/// utc-day and rolling TTLs hold on a cluster, for subjects spread over every primary.
#[tokio::test]
async fn ttls_against_a_cluster() {
    let cluster = ValkeyCluster::start();
    let day = cluster_gate(&cluster, &[]);
    let rolling = cluster_gate(&cluster, &[("QUOTA_RESET", "rolling")]);
    // Thirty subjects land on all three primaries with near certainty (3 × (2/3)^30 ≈ 1e-5).
    for i in 0..30 {
        let r = day.handle(scan_from(&format!("198.51.100.{i}"))).await;
        assert_eq!(r.status(), 202);
    }
    let r = rolling.handle(scan_from("192.0.2.200")).await;
    assert_eq!(r.status(), 202);
    assert_eq!(cluster.nodes_holding("quota:*"), 3, "keys on every primary");

    let mut c = cluster.client().await;
    let (server_now, _): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let to_midnight = 86_400 - server_now.rem_euclid(86_400);
    let keys = cluster.keys("quota:*");
    // A counter and a first-seen key per subject, and a counter per /24
    // (the default network level): 198.51.100.0/24 and 192.0.2.0/24.
    assert_eq!(keys.len(), 64, "counter and first-seen key per subject");
    let mut long = 0;
    for key in &keys {
        let ttl: i64 = c.ttl(key).await.unwrap();
        assert!(ttl > 0 && ttl <= 86_400, "{key}: ttl {ttl}");
        if ttl > to_midnight + 2 {
            long += 1;
        }
    }
    // Only the rolling subject's three keys (its /24's counter too)
    // outlive midnight (unless it is nearly midnight).
    assert!(long <= 3, "{long} keys expire after midnight");
}

/// 400 concurrent scans from one subject through eight cluster clients count 1…400 exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_counts_are_exact_on_a_cluster() {
    let cluster = ValkeyCluster::start();
    assert_400_concurrent_scans_count_exactly(|vars| cluster_gate(&cluster, vars)).await;
    assert_eq!(cluster.stream_jobs("jobs").await.len(), 400);
}

/// Purge in cluster mode removes every quota:* key on every primary and keeps every other key.
#[tokio::test]
async fn purge_visits_every_primary() {
    let cluster = ValkeyCluster::start();
    let gate = cluster_gate(&cluster, &[]);
    for i in 0..40 {
        assert_eq!(
            gate.handle(scan_from(&format!("203.0.113.{i}")))
                .await
                .status(),
            202
        );
    }
    let mut c = cluster.client().await;
    for i in 0..20 {
        let _: () = c.set(format!("keep:{i}"), "x").await.unwrap();
    }
    assert_eq!(cluster.nodes_holding("quota:*"), 3);
    // Two per subject, and the counter of their /24.
    assert_eq!(cluster.keys("quota:*").len(), 81);

    let store = gate.store();
    assert_eq!(
        store.purge(true, None).await.unwrap(),
        81,
        "a dry run counts"
    );
    assert_eq!(cluster.keys("quota:*").len(), 81, "and removes nothing");
    assert_eq!(store.purge(false, None).await.unwrap(), 81);
    assert!(cluster.keys("quota:*").is_empty());
    assert_eq!(cluster.keys("keep:*").len(), 20);
    assert_eq!(
        cluster.stream_jobs("jobs").await.len(),
        40,
        "the queue is kept"
    );
    // Counting resumes afterwards from 1.
    let body = json(&gate.handle(scan_from("203.0.113.1")).await);
    assert_eq!(body["quota"]["used"], 1);
}
