//! A real `moto` server (SQS, CloudWatch) on a free port, killed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::client::{http, request};
use crate::{KillOnDrop, free_port, loopback, root, wait_for_port};

/// `moto_server` from `.tools/venv` (installed by `scripts/test`), or `$MOTO_SERVER`.
pub fn moto_server_bin() -> PathBuf {
    std::env::var_os("MOTO_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/venv/bin/moto_server"))
}

pub struct MotoServer {
    pub port: u16,
    child: KillOnDrop,
}

impl MotoServer {
    pub fn start() -> Self {
        for _ in 0..5 {
            let port = free_port();
            let bin = moto_server_bin();
            let child = Command::new(&bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start {bin:?} (run scripts/test once to install it): {e}")
                });
            let server = Self {
                port,
                child: KillOnDrop::new(child),
            };
            if wait_for_port(server.addr(), Duration::from_secs(30)) {
                return server;
            }
        }
        panic!("moto_server did not start");
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The endpoint to give the AWS SDK (`AWS_ENDPOINT_URL`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// An SDK configuration pointed at this server with dummy credentials,
    /// built without touching the process environment.
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(self.endpoint())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "testing", "testing", None, None, "test",
            ))
            .load()
            .await
    }

    /// moto's own view of its state (`GET /moto-api/data.json`): every model
    /// instance with its attributes, including what the SQS API never returns
    /// (a message's `delayed_until` and `sent_timestamp`, hence its `DelaySeconds`).
    pub fn model_data(&self) -> serde_json::Value {
        let response = http(self.addr(), &request("GET", "/moto-api/data.json"));
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.") && head.contains(" 200 "),
            "{head}"
        );
        serde_json::from_str(body).unwrap()
    }

    /// Every SQS message moto has created, in send order (deleted ones stay
    /// listed: moto tracks instances, not queue contents).
    pub fn sqs_messages(&self) -> Vec<serde_json::Value> {
        let data = self.model_data();
        let mut messages = data["sqs"]["Message"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages.sort_by_key(|m| m["sent_timestamp"].as_u64().unwrap_or(0));
        messages
    }

    /// Creates an SQS queue named `name` and returns its URL.
    pub async fn create_queue(&self, name: &str) -> String {
        let sqs = aws_sdk_sqs::Client::new(&self.sdk_config().await);
        let created = sqs.create_queue().queue_name(name).send().await.unwrap();
        created.queue_url.unwrap()
    }

    /// Stops the server (for outage tests).
    pub fn stop(&mut self) {
        self.child.kill_now();
    }
}
