//! A real `moto` server (SQS, CloudWatch) on a free port, killed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, root, wait_for_port};

/// `moto_server` from `.tools/venv` (installed by `scripts/test`), or `$MOTO_SERVER`.
pub fn moto_server_bin() -> PathBuf {
    std::env::var_os("MOTO_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/venv/bin/moto_server"))
}

pub struct MotoServer {
    pub port: u16,
    child: Child,
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
                .unwrap_or_else(|e| panic!("cannot start {bin:?} (run scripts/test once to install it): {e}"));
            let mut server = Self { port, child };
            if wait_for_port(server.addr(), Duration::from_secs(30)) {
                return server;
            }
            let _ = server.child.kill();
        }
        panic!("moto_server did not start");
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
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
            .credentials_provider(aws_sdk_sqs::config::Credentials::new("testing", "testing", None, None, "test"))
            .load()
            .await
    }

    /// Stops the server (for outage tests).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        self.stop();
    }
}
