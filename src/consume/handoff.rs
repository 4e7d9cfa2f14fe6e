//! Handing a due job to the scanner: a command (`--exec`) or an HTTP
//! endpoint (`--post`).
//!
//! `--exec <command>` runs `sh -c <command>` with the job's JSON on standard
//! input and `SCAN_ID` and `IMAGE` in the environment; its standard output
//! and error are the consumer's. Exit status 0 means done. `--post <url>`
//! sends the job JSON in a `POST` (`content-type: application/json`) over
//! plain HTTP/1.1, for a scanner beside the consumer; any 2xx means done.
//! A hand-off that outlives the consumer's grace period on shutdown is
//! stopped (the command is killed), and counts as not done.

use std::process::Stdio;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::AsyncWriteExt;

use super::source::Delivery;

/// The scanner.
#[derive(Debug, Clone)]
pub enum Handoff {
    Exec(String),
    Post(http::Uri),
}

impl Handoff {
    /// `--post`'s URL, which must be `http://host[:port]/path`.
    pub fn post(url: &str) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("--post {url}: {e}"))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(format!(
                "--post {url}: expected an http://host[:port]/path URL"
            ));
        }
        Ok(Self::Post(uri))
    }

    /// Runs the hand-off; `Err` says why the job is not done.
    pub async fn run(&self, d: &Delivery) -> Result<(), String> {
        match self {
            Self::Exec(command) => exec(command, d).await,
            Self::Post(uri) => post(uri, d).await,
        }
    }
}

async fn exec(command: &str, d: &Delivery) -> Result<(), String> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("SCAN_ID", d.job.scan_id.to_string())
        .env("IMAGE", d.job.image().unwrap_or_default())
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run the scanner: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A scanner that does not read its input closes the pipe early;
        // that is its business, its exit status decides.
        let _ = stdin.write_all(d.json.as_bytes()).await;
        let _ = stdin.write_all(b"\n").await;
    }
    let status = child
        .wait()
        .await
        .map_err(|e| format!("scanner lost: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("scanner exited with {status}"))
    }
}

async fn post(uri: &http::Uri, d: &Delivery) -> Result<(), String> {
    let host = uri.host().unwrap_or_default();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot reach the scanner: {e}"))?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("scanner handshake: {e}"))?;
    let connection = tokio::spawn(connection);
    let authority = uri.authority().map_or(host, |a| a.as_str());
    let request = http::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-scan-id", d.job.scan_id.to_string())
        .body(Full::new(Bytes::from(d.json.clone())))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("scanner did not answer: {e}"))?;
    let status = response.status();
    // Read the answer to its end, so the connection closes cleanly.
    let _ = response.into_body().collect().await;
    connection.abort();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("scanner answered {status}"))
    }
}
