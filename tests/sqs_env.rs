//! The production wiring: `Gate::from_config` with an SQS `SCAN_QUEUE_URL`
//! builds its client from the process environment, `AWS_ENDPOINT_URL`
//! included, exactly as the Lambda's cold start does.
//!
//! A binary of its own, with a single test, because it sets process
//! environment variables: no other test may run beside it.

use quota_gate_testkit as common;

use common::moto::MotoServer;
use common::*;
use quota_gate::gate::Gate;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::AnyQueue;

/// From the environment alone (AWS_ENDPOINT_URL, region, keys), the cold-start path sends each 202's job to the SQS queue.
#[test]
fn from_config_respects_aws_endpoint_url() {
    let moto = MotoServer::start();
    // SAFETY: this binary's only test, and no thread has been started yet
    // that could read the environment concurrently.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::remove_var("AWS_PROFILE");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = moto.create_queue("scans").await;
        let gate = Gate::from_config(
            config(&[("SCAN_QUEUE_URL", &url)]),
            Meter::new("test", None),
        )
        .await
        .unwrap();
        assert!(matches!(gate.queue(), AnyQueue::Sqs(q) if q.url() == url));
        for _ in 0..2 {
            assert_eq!(gate.handle(scan_from("203.0.113.7")).await.status(), 202);
        }
        let messages = moto.sqs_messages();
        assert_eq!(
            messages.len(),
            2,
            "one message per 202, through AWS_ENDPOINT_URL"
        );
    });
}
