//! A minimal HTTP/1.1 keep-alive client for loopback load: one connection
//! per in-flight request, a pre-built request written as is, the response
//! read by `Content-Length`. Hand-rolled rather than a full client so the
//! generator's own CPU, which competes with the server's on 2 cores, stays
//! as small as possible.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `POST /scan` with a valid body, optionally with a bearer token.
pub fn scan_request(token: Option<&str>) -> Vec<u8> {
    let body = br#"{"image":"registry.example.com/team/app:1.4.2"}"#;
    let mut r = format!(
        "POST /scan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(t) = token {
        r.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    r.push_str("\r\n");
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// `GET <path>`.
pub fn get_request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").into_bytes()
}

/// The status and whole length of the first response in `buf`, once complete.
pub fn parse_response(buf: &[u8]) -> Result<Option<(u16, usize)>, String> {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|e| e.to_string())?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let mut length = 0usize;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().map_err(|_| "bad content-length")?;
            }
        }
    }
    let total = head_end + 4 + length;
    Ok((buf.len() >= total).then_some((status, total)))
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
        self.stream
            .write_all(request)
            .await
            .map_err(|e| e.to_string())?;
        loop {
            if let Some((status, total)) = parse_response(&self.buf)? {
                self.buf.drain(..total);
                return Ok(status);
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

/// One request on a fresh blocking connection (for the start-up probe).
pub fn once(addr: SocketAddr, request: &[u8], timeout: Duration) -> Result<u16, String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(request).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((status, _)) = parse_response(&buf)? {
            return Ok(status);
        }
        let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
