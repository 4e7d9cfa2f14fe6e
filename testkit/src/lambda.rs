//! The real Lambda runtime emulator, `cargo lambda watch --only-lambda-apis`
//! (needs `cargo-lambda` on `PATH`): the runtime API a `bootstrap` polls,
//! and what `cargo lambda invoke` sends sample events to.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::{KillOnDrop, free_port, loopback, root, wait_for_listener};

/// The emulator on a free loopback port, stopped when dropped.
pub struct Emulator {
    pub port: u16,
    process: KillOnDrop,
}

/// `cargo lambda` run from the repository root.
fn cargo_lambda() -> Command {
    let mut command = Command::new("cargo-lambda");
    command.arg("lambda").current_dir(root());
    command
}

impl Emulator {
    /// Starts it and waits until it listens.
    pub fn start() -> Self {
        let port = free_port();
        let mut process = KillOnDrop::new(
            cargo_lambda()
                .args([
                    "watch",
                    "--only-lambda-apis",
                    "--invoke-address",
                    "127.0.0.1",
                ])
                .args(["--invoke-port", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("cargo-lambda on PATH"),
        );
        assert!(
            wait_for_listener(&mut process, loopback(port), Duration::from_secs(60)),
            "the emulator did not listen"
        );
        Self { port, process }
    }

    /// The runtime API's address, as `AWS_LAMBDA_RUNTIME_API` names it to a
    /// `bootstrap`.
    pub fn runtime_api(&self) -> String {
        format!("http://127.0.0.1:{}/.rt", self.port)
    }

    /// `cargo lambda invoke` with `event` (a path under the repository root).
    pub fn invoke(&self, event: &str) -> Output {
        cargo_lambda()
            .args(["invoke", "_", "--invoke-address", "127.0.0.1"])
            .args(["--invoke-port", &self.port.to_string()])
            .args(["--data-file", event])
            .output()
            .unwrap()
    }

    /// Stops it now.
    pub fn stop(&mut self) {
        self.process.kill_now();
    }
}
