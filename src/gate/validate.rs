//! Step 1: is this a scan request at all? Every field but `image` passes through to the job
//! untouched; a request that fails here is never counted.

use http::{HeaderMap, Method, header};
use serde_json::value::RawValue;

use crate::gate::error::GateError;
use crate::rules::job::{Image, RequestBody};

pub const MAX_BODY_BYTES: usize = 64 * 1024;
pub const MAX_IMAGE_BYTES: usize = 1024;

/// Whether `path` is `route`, or `/<stage>` and `route`: the one rule for a stage in the path.
pub fn is_route(path: &str, route: &str) -> bool {
    match path.strip_suffix(route) {
        Some("") => true,
        Some(prefix) => prefix.starts_with('/') && !prefix[1..].contains('/') && prefix.len() > 1,
        None => false,
    }
}

/// Checks route, method, media type and body, in that order.
pub fn validate(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<RequestBody, GateError> {
    // The scan route: `/scan`, or `/<stage>/scan` (`/scan/` is 404).
    if !is_route(path, "/scan") {
        return Err(GateError::NotFound);
    }
    if method != Method::POST {
        return Err(GateError::MethodNotAllowed);
    }
    if !is_json(headers) {
        return Err(GateError::UnsupportedMediaType);
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(GateError::PayloadTooLarge);
    }
    parse_body(body)
}

fn is_json(headers: &HeaderMap) -> bool {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let essence = value
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default();
    let essence = essence.trim().to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Parses and checks the body (the size was checked by the caller): the whole JSON object, passed
/// through to the job as the client wrote it.
pub fn parse_body(body: &[u8]) -> Result<RequestBody, GateError> {
    fn bad(code: &'static str, detail: impl Into<String>) -> Result<RequestBody, GateError> {
        Err(GateError::bad_request(code, detail))
    }
    if body.is_empty() {
        return bad("empty_body", "the body must be a JSON object");
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return bad("invalid_utf8", "the body is not valid UTF-8");
    };
    let invalid_json = |e: serde_json::Error| {
        GateError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    };
    // Checked as JSON but not converted: the job carries the client's text.
    let raw: &RawValue = serde_json::from_str(text).map_err(invalid_json)?;
    if !raw.get().starts_with('{') {
        return bad("not_an_object", "the body must be a JSON object");
    }
    match RequestBody::image_of(raw.get()).map_err(invalid_json)? {
        Image::Missing => bad("missing_image", "the body needs a string field `image`"),
        Image::Text(s) if s.trim().is_empty() => bad("empty_image", "`image` must not be empty"),
        Image::Text(s) if s.len() > MAX_IMAGE_BYTES => bad(
            "image_too_long",
            format!(
                "`image` is {} bytes; at most {MAX_IMAGE_BYTES} are accepted",
                s.len()
            ),
        ),
        // A NUL no consumer can pass on; CR, LF and ESC would reach the
        // scanner's `IMAGE` and its logs as the client sent them.
        Image::Text(s) if s.chars().any(char::is_control) => bad(
            "image_control_character",
            "`image` must not contain control characters",
        ),
        Image::Text(_) => Ok(RequestBody::new(raw)),
        Image::NotAString => bad("invalid_image", "`image` must be a string"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn json_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h
    }

    fn code(r: Result<RequestBody, GateError>) -> String {
        match r {
            Ok(_) => "ok".into(),
            Err(e) => format!("{} {}", e.status().as_u16(), e.code()),
        }
    }

    /// Each bad route, method, media type and size gets its own status and code.
    #[test]
    fn catalogue() {
        let h = json_headers();
        let post = Method::POST;
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        for (method, path, headers, body, want) in [
            (&post, "/scan", &h, &br#"{"image":"alpine:3"}"#[..], "ok"),
            (
                &post,
                "/prod/scan",
                &h,
                &br#"{"image":"alpine:3","x":1}"#[..],
                "ok",
            ),
            (&post, "/scan/", &h, &b"{}"[..], "404 not_found"),
            (&post, "/prod/scan/", &h, &b"{}"[..], "404 not_found"),
            (&post, "/", &h, &b"{}"[..], "404 not_found"),
            (&post, "/a/b/scan", &h, &b"{}"[..], "404 not_found"),
            (&post, "/scans", &h, &b"{}"[..], "404 not_found"),
            (
                &Method::GET,
                "/scan",
                &h,
                &b""[..],
                "405 method_not_allowed",
            ),
            (
                &post,
                "/scan",
                &HeaderMap::new(),
                &b"{}"[..],
                "415 unsupported_media_type",
            ),
            (&post, "/scan", &h, &big[..], "413 payload_too_large"),
        ] {
            assert_eq!(
                code(validate(method, path, headers, body)),
                want,
                "{method} {path}"
            );
        }
    }

    /// Each kind of bad body (to `POST /scan`, as JSON) gets its own status and code.
    #[test]
    fn catalogue_of_bodies() {
        let long = format!(r#"{{"image":"{}"}}"#, "a".repeat(1025));
        for (body, want) in [
            (&b""[..], "400 empty_body"),
            (&b"\xff\xfe"[..], "400 invalid_utf8"),
            (&b"{\"image\":"[..], "400 invalid_json"),
            (&b"[1,2]"[..], "400 not_an_object"),
            (&b"{}"[..], "400 missing_image"),
            (&br#"{"image":"  "}"#[..], "400 empty_image"),
            (&br#"{"image":7}"#[..], "400 invalid_image"),
            (&br#"{"image":null}"#[..], "400 invalid_image"),
            (long.as_bytes(), "400 image_too_long"),
            (
                &br#"{"image":"a\u0000b"}"#[..],
                "400 image_control_character",
            ),
            (
                &br#"{"image":"a:1\r\nX: y"}"#[..],
                "400 image_control_character",
            ),
            (
                &br#"{"image":"\u001b[31ma"}"#[..],
                "400 image_control_character",
            ),
            (
                &br#"{"image":"a\u0085"}"#[..],
                "400 image_control_character",
            ),
        ] {
            let answer = validate(&Method::POST, "/scan", &json_headers(), body);
            assert_eq!(code(answer), want, "{}", String::from_utf8_lossy(body));
        }
    }

    /// Structured-syntax JSON media types and parameters are accepted; others are not.
    #[test]
    fn media_types() {
        for (ct, ok) in [
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/vnd.stella.scan+json", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            assert_eq!(is_json(&h), ok, "{ct}");
        }
    }

    /// Fields other than `image` pass through untouched: order, number
    /// spellings and escapes as sent; only whitespace between tokens goes.
    #[test]
    fn passthrough() {
        let r = parse_body(br#"{"image":"alpine:3","policy":{"severity":"high"}}"#).unwrap();
        assert_eq!(r.image().unwrap(), "alpine:3");
        assert_eq!(
            r.get(),
            r#"{"image":"alpine:3","policy":{"severity":"high"}}"#
        );
        let sent = concat!(
            " {\"z\": 1.0, \"image\" :\"alp\\u0069ne:3\",\n",
            "\t\"n\": 12345678901234567890123, \"neg\": -0, \"e\": 1e400,\r\n",
            " \"s\": \"two  spaces, \\\" a quote\\n\", \"a\": [ 1 , {} ], \"z\": 2 } ",
        );
        let r = parse_body(sent.as_bytes()).unwrap();
        assert_eq!(r.image().unwrap(), "alpine:3");
        assert_eq!(
            r.get(),
            concat!(
                r#"{"z":1.0,"image":"alp\u0069ne:3","n":12345678901234567890123,"neg":-0,"#,
                r#""e":1e400,"s":"two  spaces, \" a quote\n","a":[1,{}],"z":2}"#,
            )
        );
    }

    /// `image` given twice is refused, not resolved by a guess.
    #[test]
    fn repeated_image() {
        let answer = parse_body(br#"{"image":"a:1","image":"b:2"}"#);
        assert_eq!(code(answer), "400 invalid_json");
    }
}
