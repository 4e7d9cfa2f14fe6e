//! `quota-gate serve` as a child process, and raw HTTP/1.1 against it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, wait_for_port};

/// Sends one raw HTTP/1.1 request and returns the whole response text.
pub fn http(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// `POST /scan` with `body`, closing the connection after the answer.
pub fn post_scan(body: &str) -> String {
    format!(
        "POST /scan HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// `GET` (or another bodiless method) of `path`, closing the connection after.
pub fn request(method: &str, path: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
}

/// `quota-gate serve` with nothing configured but `vars`, on a free port,
/// listening; stdout and stderr are piped for the test to read (a test that
/// never reads them has a stuck reader).
pub fn spawn_serve(vars: &[(&str, &str)]) -> (Child, SocketAddr) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_quota-gate"))
        .arg("serve")
        .env_clear()
        .env("QUOTA_LISTEN", format!("127.0.0.1:{port}"))
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
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
