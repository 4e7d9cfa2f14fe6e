use std::time::Duration;
use quota_gate::valkey::Valkey;
use quota_gate_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dbg() {
    let _ = tracing_subscriber::fmt().with_env_filter("quota_gate=debug").try_init();
    let port = free_port();
    let v = Valkey::new(&format!("redis://127.0.0.1:{port}"), false, Duration::from_millis(100)).unwrap();
    for i in 0..5 {
        let r: Result<String, _> = v.send(redis::cmd("PING"), Duration::from_millis(100)).await;
        eprintln!("{i} {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _s = ValkeyServer::start_on(port, &[]);
    for i in 0..10 {
        let r: Result<String, _> = v.send(redis::cmd("PING"), Duration::from_millis(100)).await;
        eprintln!("up {i} {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
