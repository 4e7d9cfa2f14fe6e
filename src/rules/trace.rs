//! Trace context: the W3C `traceparent`/`tracestate` pair and the X-Ray header, read, checked and
//! written as one [`TraceContext`] carried from the request to the job and the scanner. A
//! `tracestate` is kept only whole, beside a valid `traceparent`; anything malformed is ignored,
//! never an error. The gate records no spans but its logs, so it forwards the parent id as given.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The W3C header names (HTTP) and the names they take elsewhere.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
/// The X-Ray header (HTTP), as API Gateway, an ALB and `lambda_http` set it.
pub const XRAY_HEADER: &str = "x-amzn-trace-id";
/// The environment variables a scanner reads (OpenTelemetry's environment carriers, X-Ray SDKs).
pub const TRACEPARENT_ENV: &str = "TRACEPARENT";
pub const TRACESTATE_ENV: &str = "TRACESTATE";
pub const XRAY_ENV: &str = "_X_AMZN_TRACE_ID";

/// The most `tracestate` members carried (the spec's own limit).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;
/// The most `tracestate` bytes carried: the 512 the spec asks every vendor to propagate.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A trace id: 16 bytes, not all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

/// A span (parent) id: 8 bytes, not all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId([u8; 8]);

/// A checked `tracestate`, members separated by `,` without spaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceState(Box<str>);

/// One trace's context, as a request brings it and a job carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: TraceId,
    /// The span the next hop is a child of.
    pub parent_id: SpanId,
    /// Whether the caller may have recorded it (W3C flag 01, X-Ray `Sampled=1`).
    pub sampled: bool,
    pub state: Option<TraceState>,
}

/// ASCII text of at most `N` bytes, written on the stack.
#[derive(Clone, Copy)]
pub struct Text<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Text<N> {
    fn new() -> Self {
        Self {
            buf: [0; N],
            len: 0,
        }
    }

    /// The text with `s` appended.
    fn push(mut self, s: &[u8]) -> Self {
        let end = (self.len + s.len()).min(N);
        self.buf[self.len..end].copy_from_slice(&s[..end - self.len]);
        self.len = end;
        self
    }

    /// The text with `bytes` appended as lowercase hex digits.
    fn hex(self, bytes: &[u8]) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        bytes.iter().fold(self, |t, b| {
            t.push(&[DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]])
        })
    }

    /// The text (only ASCII is ever pushed).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl<const N: usize> fmt::Display for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `M` bytes `text` spells in hex digits (lowercase only, if so asked).
fn hex<const M: usize>(text: &[u8], lowercase_only: bool) -> Option<[u8; M]> {
    if lowercase_only && text.iter().any(u8::is_ascii_uppercase) {
        return None;
    }
    let mut out = [0u8; M];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

impl TraceId {
    /// The id of `bytes`, unless they are all zero.
    pub fn new(bytes: [u8; 16]) -> Option<Self> {
        (bytes != [0; 16]).then_some(Self(bytes))
    }

    /// 32 lowercase hex digits: the W3C form, and the logs' and EMF's `traceId`.
    pub fn hex(&self) -> Text<32> {
        Text::new().hex(&self.0)
    }

    /// The X-Ray form: `1-<first 8 digits>-<last 24>`.
    pub fn xray(&self) -> Text<35> {
        let t = Text::new().push(b"1-").hex(&self.0[..4]);
        t.push(b"-").hex(&self.0[4..])
    }

    /// An X-Ray root (`1-5759e988-bd862e3fe1be46a994272793`, either case).
    pub fn from_xray(root: &str) -> Option<Self> {
        let rest = root.strip_prefix("1-")?.as_bytes();
        if rest.len() != 33 || rest[8] != b'-' {
            return None;
        }
        let mut bytes = [0u8; 16];
        hex::decode_to_slice(&rest[..8], &mut bytes[..4]).ok()?;
        hex::decode_to_slice(&rest[9..], &mut bytes[4..]).ok()?;
        Self::new(bytes)
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hex().as_str())
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl SpanId {
    /// The id of `bytes`, unless they are all zero.
    pub fn new(bytes: [u8; 8]) -> Option<Self> {
        (bytes != [0; 8]).then_some(Self(bytes))
    }

    /// 16 lowercase hex digits.
    pub fn hex(&self) -> Text<16> {
        Text::new().hex(&self.0)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({})", self.hex())
    }
}

impl TraceState {
    /// `raw` (the header values joined by `,`) if well formed and in bounds; blanks left out.
    pub fn parse(raw: &str) -> Option<Self> {
        if raw.len() > MAX_TRACESTATE_BYTES {
            return None;
        }
        let members: Vec<&str> = raw
            .split(',')
            .map(|m| m.trim_matches([' ', '\t']))
            .filter(|m| !m.is_empty())
            .collect();
        if members.is_empty() || members.len() > MAX_TRACESTATE_MEMBERS {
            return None;
        }
        let mut keys = Vec::with_capacity(members.len());
        for member in &members {
            let (key, value) = member.split_once('=')?;
            if !valid_key(key) || !valid_value(value) || keys.contains(&key) {
                return None;
            }
            keys.push(key);
        }
        Some(Self(members.join(",").into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A list member's key: `simple-key` or `tenant@system`.
fn valid_key(key: &str) -> bool {
    // One part: 1 to `most` of `a-z0-9_-*/`, its first as `first` allows.
    let part = |s: &str, most: usize, first: fn(&u8) -> bool| {
        let b = s.as_bytes();
        let rest = |c: &u8| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/');
        (1..=most).contains(&b.len()) && first(&b[0]) && b.iter().all(rest)
    };
    match key.split_once('@') {
        None => part(key, 256, u8::is_ascii_lowercase),
        Some((tenant, system)) => {
            let lower_or_digit = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            part(tenant, 241, lower_or_digit) && part(system, 14, u8::is_ascii_lowercase)
        }
    }
}

/// A list member's value: 1 to 256 printable characters but `,` and `=`, not ending in a space.
fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    (1..=256).contains(&b.len())
        && b.iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

impl TraceContext {
    /// A W3C `traceparent` and the joined `tracestate` values; a bad `tracestate` alone is dropped.
    pub fn from_w3c(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let b = traceparent.trim_matches([' ', '\t']).as_bytes();
        if b.len() < 55 {
            return None;
        }
        let version: [u8; 1] = hex(&b[..2], true)?;
        let fits = match version[0] {
            0xff => false,
            0 => b.len() == 55,
            _ => b.len() == 55 || b[55] == b'-',
        };
        if !fits || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let flags: [u8; 1] = hex(&b[53..55], true)?;
        Some(Self {
            trace_id: TraceId::new(hex(&b[3..35], true)?)?,
            parent_id: SpanId::new(hex(&b[36..52], true)?)?,
            sampled: flags[0] & 1 == 1,
            state: tracestate.and_then(TraceState::parse),
        })
    }

    /// An X-Ray header, `Root` required; without a `Parent` (ALBs send none) it takes `parent`.
    pub fn from_xray(header: &str, parent: SpanId) -> Option<Self> {
        let (mut root, mut parent_id, mut sampled) = (None, None, false);
        for field in header.split(';') {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            match key.trim() {
                "Root" => root = Some(TraceId::from_xray(value.trim())?),
                "Parent" => parent_id = Some(SpanId::new(hex(value.trim().as_bytes(), false)?)?),
                "Sampled" => sampled = value.trim() == "1",
                _ => {}
            }
        }
        Some(Self {
            trace_id: root?,
            parent_id: parent_id.unwrap_or(parent),
            sampled,
            state: None,
        })
    }

    /// A trace of the gate's own, sampled (its logs record it); X-Ray wants `unix_secs` first.
    pub fn start(unix_secs: u32, random: [u8; 20]) -> Self {
        let mut trace = [0u8; 16];
        trace[..4].copy_from_slice(&unix_secs.to_be_bytes());
        trace[4..].copy_from_slice(&random[..12]);
        let mut span = [0u8; 8];
        span.copy_from_slice(&random[12..]);
        span[7] |= (span == [0; 8]) as u8;
        Self {
            trace_id: TraceId(trace),
            parent_id: SpanId(span),
            sampled: true,
            state: None,
        }
    }

    /// The `traceparent` to send on: version 00, and only the sampled flag.
    pub fn traceparent(&self) -> Text<55> {
        let t = Text::new().push(b"00-").hex(&self.trace_id.0);
        let t = t.push(b"-").hex(&self.parent_id.0);
        t.push(if self.sampled { b"-01" } else { b"-00" })
    }

    /// The X-Ray header to send on (SQS's `AWSTraceHeader`, `_X_AMZN_TRACE_ID`).
    pub fn xray_header(&self) -> Text<74> {
        let t = Text::new()
            .push(b"Root=")
            .push(self.trace_id.xray().as_str().as_bytes());
        let t = t.push(b";Parent=").hex(&self.parent_id.0);
        t.push(b";Sampled=")
            .push(if self.sampled { b"1" } else { b"0" })
    }

    /// The `tracestate` to send on, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_ref().map(TraceState::as_str)
    }
}

impl Serialize for TraceContext {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("Trace", 1 + usize::from(self.state.is_some()))?;
        out.serialize_field(TRACEPARENT, self.traceparent().as_str())?;
        if let Some(state) = self.tracestate() {
            out.serialize_field(TRACESTATE, state)?;
        }
        out.end()
    }
}

impl<'de> Deserialize<'de> for TraceContext {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            traceparent: String,
            tracestate: Option<String>,
        }
        let wire = Wire::deserialize(d)?;
        Self::from_w3c(&wire.traceparent, wire.tracestate.as_deref())
            .ok_or_else(|| serde::de::Error::custom("not a W3C traceparent"))
    }
}

/// A job's `trace`, read leniently: one that is no trace context is absent, not a refused job.
pub fn lenient<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TraceContext>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// The spec's example reads, and writes back unchanged.
    #[test]
    fn traceparent_round_trip() {
        let t =
            TraceContext::from_w3c(TP, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(t.sampled);
        assert_eq!(t.traceparent().as_str(), TP);
        assert_eq!(
            t.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
    }

    /// Malformed headers are refused: wrong length, case, separators, zero
    /// ids, version ff, a version-00 header with a tail.
    #[test]
    fn traceparent_malformed() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for b in bad {
            assert!(TraceContext::from_w3c(b, None).is_none(), "{b}");
        }
        // A later version may carry more, after a dash; it is sent on as 00.
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-xyz";
        let t = TraceContext::from_w3c(v1, None).unwrap();
        assert_eq!(t.traceparent().as_str(), TP);
        assert!(TraceContext::from_w3c(&v1.replace("-xyz", "xyz"), None).is_none());
    }

    /// A tracestate too long, too many members, with a bad or repeated key
    /// is dropped whole; the traceparent stays.
    #[test]
    fn tracestate_bounds() {
        let long = format!("a={}", "x".repeat(MAX_TRACESTATE_BYTES));
        let many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        for bad in [
            long.as_str(),
            &many,
            "A=1",
            "a=1,a=2",
            "a",
            "a=b=c",
            "a=1 ,=2",
        ] {
            let t = TraceContext::from_w3c(TP, Some(bad)).unwrap();
            assert_eq!(t.state, None, "{bad}");
        }
        let fine = (0..32)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(" , ");
        let t = TraceContext::from_w3c(TP, Some(&fine)).unwrap();
        assert_eq!(t.tracestate().unwrap().split(',').count(), 32);
        assert!(TraceState::parse("t@sys=1,,b=x y").is_some());
    }

    /// X-Ray and W3C ids map by AWS's rule, both ways.
    #[test]
    fn xray_mapping() {
        let spare = SpanId::new([9; 8]).unwrap();
        let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let t = TraceContext::from_xray(header, spare).unwrap();
        assert_eq!(t.trace_id.to_string(), "5759e988bd862e3fe1be46a994272793");
        assert_eq!(
            t.traceparent().as_str(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
        );
        assert_eq!(t.xray_header().as_str(), header);
        // An ALB's: no parent, a Self field, another order.
        let alb =
            "Self=1-67891234-12456789abcdef012345678;Root=1-67891233-abcdef012345678912345678";
        let t = TraceContext::from_xray(alb, spare).unwrap();
        assert_eq!(t.parent_id, spare);
        assert!(!t.sampled);
        let w3c = TraceContext::from_w3c(TP, None).unwrap();
        assert_eq!(
            w3c.xray_header().as_str(),
            "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"
        );
        for bad in [
            "",
            "Root=1-5759e988",
            "Parent=53995c3f42cd8ad8",
            "Root=2-5759e988-bd862e3fe1be46a994272793",
        ] {
            assert!(TraceContext::from_xray(bad, spare).is_none(), "{bad}");
        }
    }

    /// A started trace puts its second first, and its ids are never zero.
    #[test]
    fn started() {
        let t = TraceContext::start(0x5759_e988, [0; 20]);
        assert!(t.trace_id.xray().as_str().starts_with("1-5759e988-"));
        assert_eq!(t.parent_id.hex().as_str(), "0000000000000001");
        assert!(t.sampled);
    }

    /// The job's member round-trips; a foreign one is read as none.
    #[test]
    fn job_member() {
        let t = TraceContext::from_w3c(TP, Some("a=1")).unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            format!(r#"{{"traceparent":"{TP}","tracestate":"a=1"}}"#)
        );
        assert_eq!(serde_json::from_str::<TraceContext>(&json).unwrap(), t);
        let read = |j: &str| lenient(&mut serde_json::Deserializer::from_str(j)).unwrap();
        assert_eq!(read(&json), Some(t));
        assert_eq!(read(r#"{"traceparent":"junk"}"#), None);
        assert_eq!(read("7"), None);
        assert_eq!(read("null"), None);
    }
}
