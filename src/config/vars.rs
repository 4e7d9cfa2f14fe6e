//! The table of environment variables: one row per setting, read by the
//! parser (defaults and ranges), by the README's configuration table (a test
//! checks it is [`markdown_table`]'s output) and by the template test (which
//! variables `template.yaml` must set).

/// The longest delay or timeout: 24 h, in milliseconds.
pub const MAX_MILLIS: u64 = 86_400_000;
/// The largest daily ceiling, window or failure count: 2^32 − 1.
pub const MAX_LIMIT: u64 = u32::MAX as u64;
/// The most connections `QUOTA_MAX_CONNECTIONS` may allow.
pub const MAX_CONNECTIONS: u64 = 1_000_000;
/// The most workers `QUOTA_SERVE_WORKERS` may ask for.
pub const MAX_WORKERS: u64 = 256;

/// What an unset variable means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// It takes this value.
    Value(&'static str),
    /// It is absent; the words say what that means.
    Unset(&'static str),
}

/// Where a variable is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// Everywhere: `template.yaml` sets it for the Lambda function.
    Everywhere,
    /// Only by `quota-gate serve` (the local server).
    Serve,
    /// Everywhere, but names a local file, which a Lambda zip would have to
    /// ship: `template.yaml` leaves it out.
    LocalFile,
    /// By the logger, not by [`super::Config`].
    Logging,
}

/// One environment variable.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    pub name: &'static str,
    pub default: DefaultValue,
    /// For a whole number: the accepted range, both ends included.
    pub range: Option<(u64, u64)>,
    pub meaning: &'static str,
    pub applies: Applies,
}

const fn var(name: &'static str, default: DefaultValue, meaning: &'static str) -> Variable {
    Variable {
        name,
        default,
        range: None,
        meaning,
        applies: Applies::Everywhere,
    }
}

const fn number(
    name: &'static str,
    default: &'static str,
    min: u64,
    max: u64,
    meaning: &'static str,
) -> Variable {
    Variable {
        range: Some((min, max)),
        ..var(name, Value(default), meaning)
    }
}

use DefaultValue::{Unset, Value};

/// Every variable, in the README's order.
pub const VARIABLES: &[Variable] = &[
    number(
        "QUOTA_ANON",
        "33",
        1,
        MAX_LIMIT,
        "daily ceiling per anonymous source (IP, or IPv6 /64)",
    ),
    number(
        "QUOTA_TOKEN",
        "333",
        1,
        MAX_LIMIT,
        "daily ceiling per token id; a valid token's numeric `tier` claim overrides it",
    ),
    number(
        "QUOTA_WARN_AT",
        "200",
        1,
        MAX_LIMIT,
        "scans used from which the response carries a reminder",
    ),
    number(
        "QUOTA_SOFT_WINDOW",
        "30",
        0,
        MAX_LIMIT,
        "over-quota scans that get the soft delay",
    ),
    number(
        "QUOTA_SOFT_DELAY_MS",
        "5000",
        0,
        MAX_MILLIS,
        "delay for scans L+1 … L+W",
    ),
    number(
        "QUOTA_HARD_DELAY_MS",
        "60000",
        0,
        MAX_MILLIS,
        "delay beyond the soft window",
    ),
    var(
        "QUOTA_RESET",
        Value("utc-day"),
        "`utc-day`: reset at 00:00 UTC; `rolling`: 24 h after the first scan",
    ),
    var(
        "QUOTA_HASH_SECRET",
        Unset("—"),
        "HMAC key for digests, ≥ 16 bytes (use 32 random bytes). **Required in Lambda**; `serve` \
         and the operator commands fall back to a built-in development secret and warn",
    ),
    number(
        "QUOTA_IPV6_PREFIX",
        "64",
        1,
        128,
        "IPv6 sources are counted per prefix of this length",
    ),
    var(
        "QUOTA_TRUSTED_PROXIES",
        Unset("empty"),
        "comma-separated CIDRs; only when the direct peer is one of them is `X-Forwarded-For` \
         read (right-most untrusted entry)",
    ),
    var(
        "VALKEY_URL",
        Unset("unset → in-memory"),
        "`redis://`, `rediss://` (TLS), `valkey://` or `valkeys://`",
    ),
    var(
        "VALKEY_CLUSTER",
        Value("false"),
        "cluster mode (ElastiCache Serverless)",
    ),
    Variable {
        applies: Applies::LocalFile,
        ..var(
            "VALKEY_TLS_CA",
            Unset("unset → platform roots"),
            "PEM file of CA certificates trusted for `rediss://` (a private CA; ElastiCache \
             needs none); read at start",
        )
    },
    number(
        "QUOTA_STORE_TIMEOUT_MS",
        "100",
        1,
        MAX_MILLIS,
        "bound on every Valkey call",
    ),
    var(
        "QUOTA_FAIL_MODE",
        Value("open"),
        "`open`: accept unmetered, mark `X-Stella-Quota: unavailable`; `closed`: 503 + \
         `Retry-After`",
    ),
    number(
        "QUOTA_BREAKER_FAILURES",
        "5",
        0,
        MAX_LIMIT,
        "consecutive store failures that open the circuit breaker (0: off)",
    ),
    number(
        "QUOTA_BREAKER_COOLDOWN_MS",
        "1000",
        0,
        MAX_MILLIS,
        "how long an open breaker skips the store before one probe",
    ),
    var(
        "QUOTA_DELAY_MODE",
        Value("sleep"),
        "`sleep` (seed behaviour, capped by the budget) or `defer`",
    ),
    number(
        "QUOTA_GATEWAY_TIMEOUT_MS",
        "29000",
        1,
        MAX_MILLIS,
        "the gateway's integration timeout",
    ),
    number(
        "QUOTA_DELAY_MARGIN_MS",
        "1000",
        0,
        MAX_MILLIS,
        "kept free below the gateway and Lambda deadlines",
    ),
    var(
        "QUOTA_PACING",
        Value("on"),
        "`on`: a subject's over-quota scans start one delay apart ([Delays](#delays)); `off`: \
         the seed's fixed per-request delays",
    ),
    number(
        "QUOTA_MAX_BACKLOG_MS",
        "900000",
        0,
        MAX_MILLIS,
        "the longest paced delay a scan may get; beyond it 503 `backlog_full` + `Retry-After`, \
         not counted",
    ),
    var(
        "SCAN_QUEUE_URL",
        Unset("unset → stdout spool"),
        "an SQS queue URL, or `valkey-stream:<key>` (XADD on the quota Valkey; needs `VALKEY_URL`)",
    ),
    var(
        "QUOTA_JWT_PUBLIC_KEY",
        Unset("—"),
        "PEM text or path: RSA (RS256), P-256 (ES256) or Ed25519 (EdDSA) public key",
    ),
    var(
        "QUOTA_JWT_JWKS",
        Unset("—"),
        "JWKS JSON or path; keys picked by `kid` (rotation)",
    ),
    var(
        "QUOTA_JWT_ISSUER",
        Value("stella-ops.org"),
        "required `iss`",
    ),
    var(
        "QUOTA_JWT_AUDIENCE",
        Unset("unset → not checked"),
        "required `aud`",
    ),
    var(
        "QUOTA_TRUST_GATEWAY_CLAIMS",
        Value("false"),
        "use the claims an API Gateway JWT authorizer verified (`tid`, `tier`)",
    ),
    var(
        "QUOTA_METRICS_NAMESPACE",
        Value("StellaOps/Quota"),
        "CloudWatch namespace of the EMF lines",
    ),
    Variable {
        applies: Applies::Serve,
        ..var(
            "QUOTA_LISTEN",
            Value("127.0.0.1:9000"),
            "address of `quota-gate serve`",
        )
    },
    Variable {
        applies: Applies::Serve,
        ..number(
            "QUOTA_MAX_CONNECTIONS",
            "1024",
            1,
            MAX_CONNECTIONS,
            "connections `quota-gate serve` keeps open at once; more wait in the listen backlog \
             until one closes. Keep it below the open-file limit (`ulimit -n`)",
        )
    },
    Variable {
        applies: Applies::Serve,
        ..number(
            "QUOTA_SERVE_WORKERS",
            "0",
            0,
            MAX_WORKERS,
            "`quota-gate serve`'s workers, each a single-threaded runtime with its own Valkey \
             connection accepting on the one socket; 0: one per CPU",
        )
    },
    Variable {
        applies: Applies::Logging,
        ..var(
            "RUST_LOG",
            Value("info"),
            "log filter; logs go to stderr and never contain an IP, token or digest",
        )
    },
    Variable {
        applies: Applies::Logging,
        ..var(
            "QUOTA_LOG_FORMAT",
            Value("text"),
            "`text` or `json` (one object a line) for `quota-gate`'s logs; Lambda follows the \
             function's `LogFormat` (`JSON` in the template) instead",
        )
    },
];

/// The row of `name`. Every name the parser reads is in the table: a name
/// that is not is a bug, caught by every test that builds a configuration.
pub fn variable(name: &str) -> &'static Variable {
    VARIABLES
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("{name} is not in config::vars::VARIABLES"))
}

/// A number as the README writes it: `86400000 (24 h)` for the longest millis.
fn bound(n: u64) -> String {
    if n == MAX_MILLIS {
        format!("{n} (24 h)")
    } else {
        n.to_string()
    }
}

/// The README's configuration table: `| variable | default | meaning |`.
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | default | meaning |\n|---|---|---|\n");
    for v in VARIABLES {
        let default = match v.default {
            Value(word) if word.parse::<u64>().is_ok() => word.to_owned(),
            Value(word) => format!("`{word}`"),
            Unset(words) => words.to_owned(),
        };
        let range = v
            .range
            .map(|(min, max)| format!("; {} … {}", bound(min), bound(max)))
            .unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | {default} | {}{range} |\n",
            v.name, v.meaning
        ));
    }
    out
}
