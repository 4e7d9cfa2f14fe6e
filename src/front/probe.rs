//! `quota-gate probe <URL>`: one `GET` of a plain `http://` URL, exit 0 on a 2xx answer within
//! [`PROBE_TIMEOUT`], else 1 (never 2, which Docker reserves). The image's `HEALTHCHECK` (it has no
//! curl); it reads no configuration and starts no logger, to cost next to nothing.

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};

/// The whole probe, connect to last byte: a gate that takes this long to say it is ready is not.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `quota-gate probe` options.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The URL to GET: http://host:port/path (loopback use; no TLS).
    pub url: String,
}

/// Runs the probe: one line on stdout (the status) or stderr (why not).
pub fn run(args: &ProbeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quota-gate probe: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let answer = runtime
        .block_on(async { tokio::time::timeout(PROBE_TIMEOUT, get(&args.url)).await })
        .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")));
    let why = match answer {
        Ok(status) if status.is_success() => {
            println!("{}: {status}", args.url);
            return ExitCode::SUCCESS;
        }
        Ok(status) => status.to_string(),
        Err(why) => why,
    };
    eprintln!("quota-gate probe: {}: {why}", args.url);
    ExitCode::FAILURE
}

/// The status of a `GET` of `url`, its body read to the end.
async fn get(url: &str) -> Result<http::StatusCode, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let (Some("http"), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return Err("expected an http://host:port/path URL".into());
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::net::TcpStream::connect((host, uri.port_u16().unwrap_or(80)))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    let connection = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(connection));
    let authority = uri.authority().map_or(host, |a| a.as_str());
    let request = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(http::header::HOST, authority)
        .header(http::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = response.status();
    let _ = response.into_body().collect().await;
    drop(connection);
    Ok(status)
}
