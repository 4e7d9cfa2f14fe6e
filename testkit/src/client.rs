//! The one HTTP/1.1 client of the tests and the bench: a request is built as
//! text and written as is, and the response is read up to its
//! `Content-Length`. Blocking one-shot exchanges ([`send`], [`http()`]) serve
//! the tests and the bench's probes; keep-alive [`Connection`]s serve the
//! bench's load generator. Requests are written as bytes and responses
//! parsed with `httparse` (hyper's own parser) rather than through a full
//! client: tests see the exact response text, and the generator's own CPU,
//! which competes with the server's on 2 cores, stays as small as possible.
//!
//! Tests that need malformed or unfinished requests (slow headers, a stalled
//! body, a connection held open) use raw sockets instead.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::SCAN_BODY;

/// A request: the request line, `Host`, `headers`, and `body` with its
/// `Content-Length` (none for a bodiless `GET` or `HEAD`).
pub fn build(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (name, value) in headers {
        r.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r
}

/// `POST /scan` with a valid body, optionally with a bearer token; the
/// connection stays open.
pub fn scan_request(token: Option<&str>) -> String {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend(auth.as_deref().map(|a| ("Authorization", a)));
    build("POST", "/scan", &headers, SCAN_BODY)
}

/// `GET <path>`; the connection stays open.
pub fn get_request(path: &str) -> String {
    build("GET", path, &[], "")
}

/// `POST /scan` with `body`, closing the connection after the answer.
pub fn post_scan(body: &str) -> String {
    let headers = [
        ("Content-Type", "application/json"),
        ("Connection", "close"),
    ];
    build("POST", "/scan", &headers, body)
}

/// `GET` (or another bodiless method) of `path`, closing the connection after.
pub fn request(method: &str, path: &str) -> String {
    build(method, path, &[("Connection", "close")], "")
}

/// The head of a response: its status and where its body lies in the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub body: Range<usize>,
}

/// The head of the first response in `buf`, once the whole head is there
/// (the body may still be on its way: compare `buf.len()` with `body.end`).
pub fn parse_response(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf).map_err(|e| e.to_string())? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let status = response.code.ok_or("no status code")?;
    let length = match response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
    {
        Some(h) => std::str::from_utf8(h.value)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .ok_or("bad content-length")?,
        None => 0,
    };
    Ok(Some(Head {
        status,
        body: head_len..head_len + length,
    }))
}

/// The head of the first response in `buf` once it is complete; a response
/// to `HEAD` has no body whatever its `Content-Length` says.
fn complete(buf: &[u8], head_request: bool) -> Result<Option<Head>, String> {
    Ok(parse_response(buf)?
        .map(|mut head| {
            if head_request {
                head.body.end = head.body.start;
            }
            head
        })
        .filter(|head| buf.len() >= head.body.end))
}

/// Sends `request` on a fresh connection and reads one response; returns
/// its status and its whole text (head and body).
pub fn send(addr: SocketAddr, request: &[u8], timeout: Duration) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(request).map_err(|e| e.to_string())?;
    let head_request = request.starts_with(b"HEAD ");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head) = complete(&buf, head_request)? {
            buf.truncate(head.body.end);
            let text = String::from_utf8(buf).map_err(|e| e.to_string())?;
            return Ok((head.status, text));
        }
        let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "connection closed after {:?}",
                String::from_utf8_lossy(&buf)
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One request on a fresh connection; its response's status.
pub fn once(addr: SocketAddr, request: &[u8], timeout: Duration) -> Result<u16, String> {
    send(addr, request, timeout).map(|(status, _)| status)
}

/// One request on a fresh connection; the whole response text. Panics if
/// there is no complete answer within 30 s.
pub fn http(addr: SocketAddr, request: &str) -> String {
    send(addr, request.as_bytes(), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{request:?}: {e}"))
        .1
}

/// One keep-alive connection.
pub struct Connection {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Connection {
    pub async fn open(addr: SocketAddr) -> std::io::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Sends `request` and returns the response's status.
    pub async fn send(&mut self, request: &[u8]) -> Result<u16, String> {
        let head = self.round_trip(request).await?;
        self.buf.drain(..head.body.end);
        Ok(head.status)
    }

    /// Sends `request` and returns the response's status and body.
    pub async fn exchange(&mut self, request: &[u8]) -> Result<(u16, String), String> {
        let head = self.round_trip(request).await?;
        let body = String::from_utf8_lossy(&self.buf[head.body.clone()]).into_owned();
        self.buf.drain(..head.body.end);
        Ok((head.status, body))
    }

    /// Writes `request` and reads until its response is complete in `buf`.
    async fn round_trip(&mut self, request: &[u8]) -> Result<Head, String> {
        self.stream
            .write_all(request)
            .await
            .map_err(|e| e.to_string())?;
        loop {
            if let Some(head) = complete(&self.buf, false)? {
                return Ok(head);
            }
            let mut chunk = [0u8; 4096];
            let n = self
                .stream
                .read(&mut chunk)
                .await
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
