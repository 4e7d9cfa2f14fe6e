//! `--post`: the job handed to a scanner over HTTP/1.1 (`http://` or `https://`). An `https://`
//! scanner's certificate is checked by rustls against the platform's CA certificates, or against
//! `--post-ca`'s alone, so a private CA is trusted for nothing else.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::{ConfigBuilderExt, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::source::Delivery;
use crate::rules::trace::{TRACEPARENT, TRACESTATE, TraceContext, XRAY_HEADER};

/// `--post`'s scanner: its URL and the client that reaches it, built once.
#[derive(Clone, Debug)]
pub struct Post {
    uri: http::Uri,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Post {
    /// `--post`'s URL (`http://` or `https://host[:port]/path`) and `--post-ca`'s file, if any.
    pub fn new(url: &str, ca: Option<&Path>) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("--post {url}: {e}"))?;
        let (Some(scheme @ ("http" | "https")), Some(_)) = (uri.scheme_str(), uri.host()) else {
            return Err(format!(
                "--post {url}: expected an http:// or https://host[:port]/path URL"
            ));
        };
        let https = scheme == "https";
        if ca.is_some() && !https {
            return Err("--post-ca is for an https:// --post".into());
        }
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(https, ca)?)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { uri, client })
    }

    /// POSTs `d`'s job as attempt `attempt`; `Ok` on a 2xx.
    pub async fn send<H>(&self, d: &Delivery<H>, attempt: u64) -> Result<(), String> {
        let request = http::Request::post(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("x-scan-id", d.job.scan_id.to_string())
            .header("x-scan-attempt", attempt.to_string());
        let request = trace_headers(request, d.job.trace.as_ref())
            .body(Full::new(Bytes::from(d.json.clone())))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("scanner did not answer: {}", causes(&e)))?;
        let status = response.status();
        // Read the answer to its end, so the connection can carry the next.
        let _ = response.into_body().collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("scanner answered {status}"))
        }
    }
}

/// rustls on aws-lc-rs, trusting `ca`'s certificates, else the platform's (none for plain HTTP).
fn tls_config(https: bool, ca: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("--post: {e}"))?;
    let builder = match (https, ca) {
        (true, Some(path)) => builder.with_root_certificates(roots_of(path)?),
        (true, None) => builder.with_native_roots().map_err(|e| {
            format!("--post: no CA certificates on this platform ({e}); give --post-ca")
        })?,
        (false, _) => builder.with_root_certificates(rustls::RootCertStore::empty()),
    };
    Ok(builder.with_no_client_auth())
}

/// The CA certificates of the PEM file at `path`; one unreadable or holding none stops the start.
fn roots_of(path: &Path) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let bad = |e: &dyn std::fmt::Display| format!("--post-ca {}: {e}", path.display());
    let pem = std::fs::read(path).map_err(|e| bad(&e))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
    }
    if roots.is_empty() {
        return Err(bad(&"holds no PEM certificate"));
    }
    Ok(roots)
}

/// The job's trace as the request's `traceparent`, `tracestate` and `x-amzn-trace-id` headers.
fn trace_headers(
    mut request: http::request::Builder,
    trace: Option<&TraceContext>,
) -> http::request::Builder {
    if let Some(trace) = trace {
        request = request
            .header(TRACEPARENT, trace.traceparent().as_str())
            .header(XRAY_HEADER, trace.xray_header().as_str());
        if let Some(state) = trace.tracestate() {
            request = request.header(TRACESTATE, state);
        }
    }
    request
}

/// An error and its causes in one line: the client's own says only "client error (Connect)".
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let chain = std::iter::successors(Some(e), |e| e.source());
    chain
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
