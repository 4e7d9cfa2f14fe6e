//! The `scanId` markers' rule, twice: `claim.lua` and `release.lua` on a
//! real Valkey answer every step as the pure rule (`schedule::claim`, the
//! in-process markers) does, with real time for the leases; above all the
//! one-more-lease wait after a lease ran out unreleased, which lets a live
//! attempt whose marker a failover lost come back and finish.

use quota_gate_testkit as common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::ValkeyServer;
use quota_gate::consume::error::ConsumeError;
use quota_gate::consume::marker::{MarkerAsk, MarkerStore, Markers};
use quota_gate::consume::schedule::MarkerClaim::{self, Busy, Claimed, Done};
use quota_gate::io::connection::Valkey;
use quota_gate::rules::unix::UnixMillis;
use uuid::Uuid;

const LEASE: Duration = Duration::from_millis(300);
/// Past a lease, with room for a loaded machine's scheduling.
const PAST_LEASE: Duration = Duration::from_millis(450);

fn now() -> UnixMillis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    UnixMillis(i64::try_from(ms).unwrap())
}

/// Both stores' answers to one claim, which must agree.
async fn claim(stores: &[Markers; 2], scan: Uuid, token: &str, mine: u64) -> MarkerClaim {
    let at = now();
    let ask = MarkerAsk {
        scan,
        entry: None,
        token,
        mine,
        lease: LEASE,
        now: at,
    };
    let valkey = stores[0].claim(ask).await.unwrap();
    let local = stores[1].claim(ask).await.unwrap();
    assert_eq!(
        valkey, local,
        "{token} renewing {mine}: Valkey against the rule"
    );
    valkey
}

#[tokio::test]
async fn valkey_markers_follow_the_rule() {
    let server = ValkeyServer::start();
    let valkey = Valkey::new(&server.url(), false, Duration::from_secs(2)).unwrap();
    let stores = [Markers::valkey(valkey, "jobs", 0), Markers::local()];
    let scan = Uuid::now_v7();
    let sleep = || tokio::time::sleep(PAST_LEASE);
    assert_eq!(claim(&stores, scan, "a", 0).await, Claimed(1));
    assert_eq!(claim(&stores, scan, "b", 0).await, Busy);
    // a's lease runs out unreleased: b waits one more lease, in which a
    // (alive, its renewals lost) takes its marker back.
    sleep().await;
    assert_eq!(claim(&stores, scan, "b", 0).await, Busy);
    assert_eq!(claim(&stores, scan, "a", 1).await, Claimed(1));
    assert_eq!(claim(&stores, scan, "b", 0).await, Busy);
    // Out again, and a never comes back: c gets in a lease after it asked.
    sleep().await;
    assert_eq!(claim(&stores, scan, "c", 0).await, Busy);
    assert_eq!(claim(&stores, scan, "c", 0).await, Busy);
    sleep().await;
    assert_eq!(claim(&stores, scan, "c", 0).await, Claimed(2));
    assert_eq!(
        claim(&stores, scan, "a", 1).await,
        Busy,
        "a was numbered over"
    );
    // A released marker is free at once.
    for store in &stores {
        store.release(scan, "c").await.unwrap();
    }
    assert_eq!(claim(&stores, scan, "b", 0).await, Claimed(3));
    for store in &stores {
        store.done(scan).await.unwrap();
    }
    assert_eq!(claim(&stores, scan, "d", 0).await, Done);
    assert_eq!(claim(&stores, scan, "b", 3).await, Done);
}

/// A new attempt of a stream's job runs only while the job's entry is in
/// the stream: an entry a failover lost (here: never added) is gone, and
/// not run from a consumer's hands; a done marker still says done, and a
/// renewal of a running attempt is not checked.
#[tokio::test]
async fn a_job_whose_entry_is_gone_is_not_run() {
    let server = ValkeyServer::start();
    let valkey = Valkey::new(&server.url(), false, Duration::from_secs(2)).unwrap();
    let markers = Markers::valkey(valkey, "jobs", 0);
    let mut c = server.client().await;
    let entry: String = redis::cmd("XADD")
        .arg("jobs")
        .arg("*")
        .arg("job")
        .arg("{}")
        .query_async(&mut c)
        .await
        .unwrap();
    let (kept, lost) = (Uuid::now_v7(), Uuid::now_v7());
    let claim = |scan, entry: &str, mine| {
        let entry = entry.to_owned();
        let markers = &markers;
        async move {
            let ask = MarkerAsk {
                scan,
                entry: Some(("jobs", &entry)),
                token: "a",
                mine,
                lease: LEASE,
                now: now(),
            };
            markers.claim(ask).await.unwrap()
        }
    };
    assert_eq!(claim(kept, &entry, 0).await, Claimed(1));
    assert_eq!(claim(lost, "1-1", 0).await, MarkerClaim::Gone);
    assert_eq!(
        claim(kept, "1-1", 1).await,
        Claimed(1),
        "a renewal is not checked"
    );
    markers.done(kept).await.unwrap();
    assert_eq!(claim(kept, "1-1", 0).await, Done);
}

/// With `VALKEY_WAIT_REPLICAS`, a job is acked on a done marker only once
/// the replicas hold it: one read from the primary while the replica's link
/// is frozen is not relied on (a failover to that replica would lose it and
/// leave the job unrun), and it is once the replica has caught up.
#[tokio::test]
async fn a_done_marker_counts_only_once_replicated() {
    let primary = ValkeyServer::start();
    let replica = ValkeyServer::replica_of(primary.addr()).await;
    let markers = |wait| {
        let valkey = Valkey::new(&primary.url(), false, Duration::from_millis(500)).unwrap();
        Markers::valkey(valkey, "jobs", wait)
    };
    let (writer, reader) = (markers(0), markers(1));
    let ask = |scan| MarkerAsk {
        scan,
        entry: None,
        token: "b",
        mine: 0,
        lease: LEASE,
        now: now(),
    };
    let (earlier, scan) = (Uuid::now_v7(), Uuid::now_v7());
    assert_eq!(reader.claim(ask(earlier)).await.unwrap(), Claimed(1));
    replica.signal("STOP");
    writer.done(scan).await.unwrap();
    let e = reader.claim(ask(scan)).await.unwrap_err();
    assert!(matches!(e, ConsumeError::NotReplicated(_)), "{e:?}");
    replica.signal("CONT");
    assert_eq!(reader.claim(ask(scan)).await.unwrap(), Done);
}
