//! `quota-gate serve` as a child process, killed on drop.

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{KillOnDrop, bin, free_port, loopback, wait_for_port};

/// `quota-gate serve` with nothing configured but `vars`, on a free port,
/// listening; stdout and stderr are piped for the test to read (a test that
/// never reads them has a stuck reader).
pub fn spawn_serve(vars: &[(&str, &str)]) -> (KillOnDrop, SocketAddr) {
    spawn(Command::new(bin("quota-gate")).arg("serve"), vars)
}

/// The same under `ulimit -n open_files`.
pub fn spawn_serve_with_open_files(
    open_files: u32,
    vars: &[(&str, &str)],
) -> (KillOnDrop, SocketAddr) {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -n {open_files} && exec \"$0\" serve"))
        .arg(bin("quota-gate"));
    spawn(&mut command, vars)
}

fn spawn(command: &mut Command, vars: &[(&str, &str)]) -> (KillOnDrop, SocketAddr) {
    let addr = loopback(free_port());
    let child = command
        .env_clear()
        .env("QUOTA_LISTEN", addr.to_string())
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child = KillOnDrop::new(child);
    assert!(
        wait_for_port(addr, Duration::from_secs(10)),
        "serve did not listen"
    );
    (child, addr)
}

/// Everything `child` wrote to its (piped) stderr, once it has closed it.
pub fn stderr_of(child: &mut Child) -> String {
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}
