//! The scan job the gate queues and a consumer reads. Its JSON is a versioned contract
//! (`docs/job.schema.json`): removing or retyping a field raises `version`, adding one does not,
//! and a job without `version` has version 1's shape. `scope` and `tier` are closed sets: anything
//! else is refused when read.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::rules::decide::Tier;
use crate::rules::scope::Scope;
use crate::rules::settle::Charge;
use crate::rules::trace::{self, TraceContext};

/// The contract version this build writes and reads.
pub const JOB_VERSION: u32 = 1;

words! {
    /// The tier a job was decided in, as its lowercase name; `unmetered`: accepted uncounted (the
    /// store did not answer), `exempt`: never counted, delayed or paced.
    #[derive(Hash, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    JobTier {
        Within = "within",
        Soft = "soft",
        Hard = "hard",
        Unmetered = "unmetered",
        Exempt = "exempt",
    }

    /// Which line a job waits in at the scanner: within quota, which starts first, or over it.
    #[derive(Hash, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    Lane {
        Within = "within",
        Over = "over",
    }
}

impl From<Tier> for JobTier {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Within => Self::Within,
            Tier::Soft => Self::Soft,
            Tier::Hard => Self::Hard,
        }
    }
}

impl From<Charge> for JobTier {
    fn from(charge: Charge) -> Self {
        match charge {
            Charge::Counted { decision, .. } => decision.tier.into(),
            Charge::Unmetered | Charge::Unknown { .. } => Self::Unmetered,
        }
    }
}

/// One accepted scan, as the scanner backend receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScanJob {
    #[serde(default = "first_version")]
    pub version: u32,
    /// UUID v7: time-ordered, so queues and logs sort by arrival.
    pub scan_id: Uuid,
    pub received_at: String,
    pub scope: Scope,
    /// The subject's keyed digest (never the IP or token itself).
    pub digest: String,
    /// The decision tier, in shadow mode too (where the job is not delayed).
    pub tier: JobTier,
    pub limit: u32,
    /// The subject's count including this scan (0 when `unmetered` or `exempt`).
    pub count: u64,
    pub delay_ms: u64,
    /// The part of the delay not slept in the handler, held back on the job.
    pub deferred_ms: u64,
    /// The scan must not start before this instant (RFC 3339, UTC).
    pub not_before: String,
    /// `not_before` in unix milliseconds, computed by [`ScanJob::from_json`].
    #[serde(skip)]
    pub not_before_ms: i64,
    pub request: RequestBody,
    /// The trace the scan continues; an invalid `traceparent` is read as absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "trace::lenient"
    )]
    pub trace: Option<TraceContext>,
    /// The line it waits in at the scanner; when absent, [`ScanJob::lane`] derives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<Lane>,
    /// A keyed digest of the line that paced an over-quota job; one tenant's jobs share a turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl Lane {
    /// Over quota only where the gate delayed it (a shadow-mode verdict delays nothing).
    pub fn of(tier: JobTier, delay_ms: u64) -> Self {
        match tier {
            JobTier::Soft | JobTier::Hard if delay_ms > 0 => Self::Over,
            _ => Self::Within,
        }
    }
}

/// A request's JSON body as the client sent it, byte for byte, but without whitespace between
/// tokens, so a job stays one spool line. Always an object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestBody(Box<RawValue>);

impl RequestBody {
    /// `raw`, one JSON value, with its insignificant whitespace left out.
    pub fn new(raw: &RawValue) -> Self {
        let text = raw.get();
        if !text.bytes().any(is_json_space) {
            return Self(raw.to_owned());
        }
        let mut out = String::with_capacity(text.len());
        let (mut in_string, mut escaped) = (false, false);
        for c in text.chars() {
            if in_string {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => in_string = false,
                    _ => {}
                }
            } else if c == '"' {
                in_string = true;
            } else if c.is_ascii() && is_json_space(c as u8) {
                continue;
            }
            out.push(c);
        }
        // Whitespace between tokens carries no meaning: still the same JSON.
        Self(RawValue::from_string(out).expect("valid JSON without its whitespace"))
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The object `text`'s `image` member; an error if `text` is no object or repeats `image`.
    pub fn image_of(text: &str) -> Result<Image, serde_json::Error> {
        #[derive(Deserialize)]
        struct Probe<'a> {
            // `null` is an `image` that is not a string, not a missing one.
            #[serde(borrow, default, deserialize_with = "present")]
            image: Option<&'a RawValue>,
        }
        fn present<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<&'de RawValue>, D::Error> {
            <&RawValue>::deserialize(d).map(Some)
        }
        let probe: Probe<'_> = serde_json::from_str(text)?;
        Ok(match probe.image {
            None => Image::Missing,
            Some(raw) => serde_json::from_str(raw.get()).map_or(Image::NotAString, Image::Text),
        })
    }

    /// The image to scan, when `image` is a string.
    pub fn image(&self) -> Option<String> {
        match Self::image_of(self.get()) {
            Ok(Image::Text(image)) => Some(image),
            _ => None,
        }
    }
}

/// A request body's `image` member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    Missing,
    NotAString,
    Text(String),
}

impl PartialEq for RequestBody {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

fn is_json_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn first_version() -> u32 {
    1
}

/// Why bytes are not a job this build can run.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("not a scan job: {0}")]
    Json(#[from] serde_json::Error),
    #[error("job version {0} is newer than this consumer understands ({JOB_VERSION})")]
    Version(u32),
    #[error("notBefore is not an RFC 3339 instant: {0}")]
    NotBefore(String),
    #[error("request is not a JSON object")]
    Request,
}

impl ScanJob {
    /// [`not_before_ms`](Self::not_before_ms) as an instant.
    pub fn not_before_at(&self) -> crate::rules::unix::UnixMillis {
        crate::rules::unix::UnixMillis(self.not_before_ms)
    }

    /// The deferral as a `Duration`.
    pub fn deferred(&self) -> Duration {
        Duration::from_millis(self.deferred_ms)
    }

    /// The job in `json`, with [`not_before_ms`](Self::not_before_ms) filled in.
    pub fn from_json(json: &str) -> Result<Self, JobError> {
        let mut job: Self = serde_json::from_str(json)?;
        if job.version > JOB_VERSION {
            return Err(JobError::Version(job.version));
        }
        if !job.request.get().starts_with('{') {
            return Err(JobError::Request);
        }
        let at = time::OffsetDateTime::parse(
            &job.not_before,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|e| JobError::NotBefore(e.to_string()))?;
        job.not_before_ms = i64::try_from(at.unix_timestamp_nanos() / 1_000_000)
            .map_err(|e| JobError::NotBefore(e.to_string()))?;
        Ok(job)
    }

    /// The image to scan (`request.image`), when it is a string.
    pub fn image(&self) -> Option<String> {
        self.request.image()
    }

    /// The line it waits in at the scanner.
    pub fn lane(&self) -> Lane {
        self.lane
            .unwrap_or_else(|| Lane::of(self.tier, self.delay_ms))
    }

    /// Whose turn it takes in the over lane: its tenant, else its subject.
    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or(&self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> ScanJob {
        ScanJob {
            version: JOB_VERSION,
            scan_id: Uuid::now_v7(),
            received_at: "2026-11-30T12:00:00.000Z".into(),
            scope: Scope::Tid,
            digest: "d".into(),
            tier: JobTier::Hard,
            limit: 33,
            count: 70,
            delay_ms: 60_000,
            deferred_ms: 32_000,
            not_before: "2026-11-30T12:01:00.250Z".into(),
            not_before_ms: 1_796_040_060_250,
            request: serde_json::from_str(r#"{"image":"alpine:3.20"}"#).unwrap(),
            trace: TraceContext::from_w3c(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Some("a=1"),
            ),
            lane: Some(Lane::Over),
            tenant: Some("quota:net:{t}".into()),
        }
    }

    /// What the gate writes, a consumer reads back as the same job.
    #[test]
    fn round_trip() {
        let job = job();
        let json = serde_json::to_string(&job).unwrap();
        assert!(json.contains("\"version\":1"), "{json}");
        assert_eq!(ScanJob::from_json(&json).unwrap(), job);
        assert_eq!(job.image().as_deref(), Some("alpine:3.20"));
    }

    /// Scopes and tiers are written as the words of the schema.
    #[test]
    fn wire_words() {
        for (scope, word) in [(Scope::Ip, "ip"), (Scope::Tid, "tid")] {
            assert_eq!(serde_json::to_value(scope).unwrap(), word);
        }
        for (tier, word) in [
            (JobTier::Within, "within"),
            (JobTier::Soft, "soft"),
            (JobTier::Hard, "hard"),
            (JobTier::Unmetered, "unmetered"),
            (JobTier::Exempt, "exempt"),
        ] {
            assert_eq!(serde_json::to_value(tier).unwrap(), word);
            assert_eq!(tier.to_string(), word);
        }
    }

    /// Unknown scopes or tiers, newer versions and bad instants are refused.
    #[test]
    fn refuses_what_it_cannot_honour() {
        let base = serde_json::to_value(job()).unwrap();
        let with = |field: &str, value: serde_json::Value| {
            let mut v = base.clone();
            v[field] = value;
            ScanJob::from_json(&v.to_string())
        };
        assert!(with("scope", "cookie".into()).is_err());
        assert!(with("tier", "gold".into()).is_err());
        assert!(matches!(
            with("version", 2.into()),
            Err(JobError::Version(2))
        ));
        assert!(matches!(
            with("notBefore", "soon".into()),
            Err(JobError::NotBefore(_))
        ));
        let mut old = base.clone();
        old.as_object_mut().unwrap().remove("version");
        assert_eq!(ScanJob::from_json(&old.to_string()).unwrap().version, 1);
    }

    /// A job written before lanes read its lane from its tier and delay
    /// (a shadow-mode verdict, never delayed, is within), and its subject
    /// as its tenant.
    #[test]
    fn lanes_of_older_jobs() {
        let mut old = serde_json::to_value(job()).unwrap();
        let fields = old.as_object_mut().unwrap();
        fields.remove("lane");
        fields.remove("tenant");
        let job = ScanJob::from_json(&old.to_string()).unwrap();
        assert_eq!((job.lane(), job.tenant()), (Lane::Over, "d"));
        assert_eq!(Lane::of(JobTier::Soft, 0), Lane::Within);
        assert_eq!(Lane::of(JobTier::Within, 0), Lane::Within);
        assert_eq!(Lane::of(JobTier::Exempt, 0), Lane::Within);
        assert_eq!(Lane::of(JobTier::Hard, 1), Lane::Over);
    }
}
