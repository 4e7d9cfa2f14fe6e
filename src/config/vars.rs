//! The environment variables, one row each: the one source of the parser's defaults and ranges and
//! of docs/configuration.md's table, where a row's doc comment is its meaning. Each row is read by
//! the group field that `#[serde(rename)]`s to its name (a test checks both ways).

/// The longest delay or timeout: 24 h, in milliseconds.
pub const MAX_MILLIS: u64 = 86_400_000;
/// The largest daily ceiling, window or failure count: 2^32 − 1.
pub const MAX_LIMIT: u64 = u32::MAX as u64;

/// What an unset variable means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
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
    /// By `serve` and `consume`, not in Lambda: `template.yaml` leaves it out.
    LongRunning,
    /// A local file, which a Lambda zip would have to ship: `template.yaml` leaves it out.
    LocalFile,
    /// By the logger, not by [`super::Config`].
    Logging,
}

/// One environment variable: a row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    pub name: &'static str,
    pub default: DefaultValue,
    /// For a whole number: the accepted range, both ends included.
    pub range: Option<(u64, u64)>,
    pub meaning: &'static str,
    pub applies: Applies,
    /// A secret: it may be given as a reference to a secret store ([`super::secret_ref`]).
    pub secret: bool,
}

impl Variable {
    const fn applies(self, applies: Applies) -> Self {
        Self { applies, ..self }
    }

    const fn secret(self) -> Self {
        Self {
            secret: true,
            ..self
        }
    }
}

/// A row read everywhere, neither a number nor a secret; the macro fills in name and meaning.
const fn row(default: DefaultValue, range: Option<(u64, u64)>) -> Variable {
    Variable {
        name: "",
        default,
        range,
        meaning: "",
        applies: Applies::Everywhere,
        secret: false,
    }
}

const fn value(default: &'static str) -> Variable {
    row(DefaultValue::Value(default), None)
}

const fn number(default: &'static str, min: u64, max: u64) -> Variable {
    row(DefaultValue::Value(default), Some((min, max)))
}

const fn unset(words: &'static str) -> Variable {
    row(DefaultValue::Unset(words), None)
}

/// A row: its doc comment (the meaning), name and maker. Doc lines start with a space: the trim.
macro_rules! variables {
    ($(
        $(#[doc = $meaning:literal])+
        $name:ident = $make:ident($($arg:expr),*) $(.$modify:ident($($how:expr)?))*;
    )+) => {
        $(
            $(#[doc = $meaning])+
            pub const $name: Variable = Variable {
                name: stringify!($name),
                meaning: concat!($($meaning),+).trim_ascii(),
                ..$make($($arg),*)
            } $(.$modify($($how)?))*;
        )+

        /// Every variable, in the table's order.
        pub const VARIABLES: &[Variable] = &[$($name),+];
    };
}

variables! {
    /// daily ceiling per anonymous source (IP, or IPv6 /64)
    QUOTA_ANON = number("33", 1, MAX_LIMIT);
    /// daily ceiling per token id; a valid token's numeric `tier` claim overrides it
    QUOTA_TOKEN = number("333", 1, MAX_LIMIT);
    /// scans used from which the response carries a reminder
    QUOTA_WARN_AT = number("200", 1, MAX_LIMIT);
    /// over-quota scans that get the soft delay
    QUOTA_SOFT_WINDOW = number("30", 0, MAX_LIMIT);
    /// delay for scans L+1 … L+W
    QUOTA_SOFT_DELAY_MS = number("5000", 0, MAX_MILLIS);
    /// delay beyond the soft window
    QUOTA_HARD_DELAY_MS = number("60000", 0, MAX_MILLIS);
    /// `utc-day`: reset at 00:00 UTC; `rolling`: 24 h after the first scan
    QUOTA_RESET = value("utc-day");
    /// `enforce`: over-quota scans are delayed and paced; `shadow`: everything is counted, decided
    /// and metered, but no scan waits or takes a pacing slot, and each answer says what enforcement
    /// would have done ([Rolling out](operations.md#rolling-out))
    QUOTA_MODE = value("enforce");
    /// budgets above the subject: an anonymous scan is also counted, delayed and paced at each
    /// network that encloses its address, like one client ([Budgets above the
    /// subject](guide.md#budgets-above-the-subject)); comma-separated `v4/<len>=<limit>` and
    /// `v6/<len>=<limit>` (a level shorter than the subject's /32 or `QUOTA_IPV6_PREFIX`, at most 3
    /// per family), the limit a number of scans per period or `<k>x` (k × `QUOTA_ANON`); `off`: none.
    /// Unset, a default level not shorter than the subject is left out
    QUOTA_NETWORKS = value("v4/24=8x,v6/56=2x,v6/48=8x");
    /// the same for token holders: a token holder's scan is also counted, delayed and paced at each
    /// network that encloses its source address, on counters apart from the anonymous ones
    /// ([Tokens share their network](guide.md#tokens-share-their-network)); the grammar of
    /// `QUOTA_NETWORKS`, the limit a number or `<k>x` (k × `QUOTA_TOKEN`); `off`: none
    QUOTA_TOKEN_NETWORKS = value("v4/24=10x,v6/48=10x");
    /// anonymous scans per period for all anonymous subjects together; beyond it they start at
    /// most one per `QUOTA_ANON_GLOBAL_INTERVAL_MS` across the fleet (0: off)
    QUOTA_ANON_GLOBAL = number("0", 0, MAX_LIMIT);
    /// the interval between anonymous scans beyond `QUOTA_ANON_GLOBAL`
    QUOTA_ANON_GLOBAL_INTERVAL_MS = number("1000", 1, MAX_MILLIS);
    /// HMAC key for digests, ≥ 16 bytes (use 32 random bytes). **Required in Lambda**; `serve` and
    /// the operator commands fall back to a built-in development secret and warn
    QUOTA_HASH_SECRET = unset("—").secret();
    /// IPv6 sources are counted per prefix of this length
    QUOTA_IPV6_PREFIX = number("64", 1, 128);
    /// comma-separated CIDRs; only when the direct peer is one of them is `X-Forwarded-For` read
    /// (right-most untrusted entry)
    QUOTA_TRUSTED_PROXIES = unset("empty");
    /// comma-separated CIDRs (IPv4 and IPv6) whose scans are never counted, delayed or paced (tier
    /// `exempt`); matched against the client address after `QUOTA_TRUSTED_PROXIES`; a trusted
    /// proxy's own address is never exempt (the start warns when an exempt network covers a
    /// trusted proxy)
    QUOTA_EXEMPT_NETWORKS = unset("empty");
    /// `redis://`, `rediss://` (TLS), `valkey://` or `valkeys://`
    VALKEY_URL = unset("unset → in-memory").secret();
    /// cluster mode (ElastiCache Serverless)
    VALKEY_CLUSTER = value("false");
    /// replicas a write must reach (`WAIT`) before it is relied on: a keyed scan's claim, a job
    /// added to a stream on this Valkey, a consumer's attempt, its lease renewals and its done
    /// marker (0: off, and a failover with replication lag may queue the lag's keyed scans twice,
    /// lose its stream jobs, run its finished scans again and repeat its attempt numbers: the
    /// measured table in [Running in production](production.md#failover); standalone Valkey only)
    VALKEY_WAIT_REPLICAS = number("0", 0, 5);
    /// PEM file of CA certificates trusted for `rediss://` (a private CA; ElastiCache needs none);
    /// read at start
    VALKEY_TLS_CA = unset("unset → platform roots").applies(Applies::LocalFile);
    /// `password`: whatever `VALKEY_URL` carries; `iam`: ElastiCache IAM authentication, a token
    /// signed with the process's AWS credentials for each connection and renewed on live ones (needs
    /// a TLS `VALKEY_URL` without credentials, `VALKEY_USER` and `VALKEY_CACHE_NAME`; [IAM
    /// authentication](production.md#iam-authentication))
    VALKEY_AUTH = value("password");
    /// with `VALKEY_AUTH=iam`: the ElastiCache user id (an IAM-enabled user's name is its id)
    VALKEY_USER = unset("—");
    /// with `VALKEY_AUTH=iam`: the cache (serverless cache or replication group) the token names
    VALKEY_CACHE_NAME = unset("—");
    /// with `VALKEY_AUTH=iam`: the cache is ElastiCache Serverless (the token says so)
    VALKEY_CACHE_SERVERLESS = value("false");
    /// bound on every Valkey call
    QUOTA_STORE_TIMEOUT_MS = number("100", 1, MAX_MILLIS);
    /// `open`: accept unmetered, mark `X-Stella-Quota: unavailable`; `closed`: 503 + `Retry-After`
    QUOTA_FAIL_MODE = value("open");
    /// consecutive store failures that open the circuit breaker (0: off)
    QUOTA_BREAKER_FAILURES = number("5", 0, MAX_LIMIT);
    /// how long an open breaker skips the store before one probe
    QUOTA_BREAKER_COOLDOWN_MS = number("1000", 0, MAX_MILLIS);
    /// `warn`: a store whose `maxmemory-policy` can evict the gate's keys (anything but
    /// `noeviction`) is named at start in an error-level line and in `stella_quota_store_evicting`;
    /// `refuse`: such a start (serve, Lambda, consume) exits non-zero instead ([Eviction and
    /// memory](production.md#eviction-and-memory))
    QUOTA_STORE_EVICTION = value("warn");
    /// how often `serve` and `consume` read the store's `evicted_keys` into
    /// `stella_quota_store_evicted_keys_total`, and its `maxmemory-policy` again
    QUOTA_STORE_STATS_INTERVAL_MS = number("60000", 100, MAX_MILLIS).applies(Applies::LongRunning);
    /// `sleep` (seed behaviour, capped by the budget) or `defer`
    QUOTA_DELAY_MODE = value("sleep");
    /// requests asleep at once across every gate process (each holds a Lambda environment); a
    /// scan that finds them all taken sleeps nothing and defers its whole delay onto its job
    /// (0: none sleeps, as `defer`)
    QUOTA_MAX_ASLEEP = number("100", 0, MAX_LIMIT);
    /// the gateway's integration timeout
    QUOTA_GATEWAY_TIMEOUT_MS = number("29000", 1, MAX_MILLIS);
    /// kept free below the gateway and Lambda deadlines
    QUOTA_DELAY_MARGIN_MS = number("1000", 0, MAX_MILLIS);
    /// `on`: a subject's over-quota scans start one delay apart ([Delays](guide.md#delays)); `off`: the
    /// seed's fixed per-request delays
    QUOTA_PACING = value("on");
    /// the longest paced delay a scan may get; beyond it 503 `backlog_full` + `Retry-After`, not
    /// counted
    QUOTA_MAX_BACKLOG_MS = number("900000", 0, MAX_MILLIS);
    /// an SQS queue URL, or `valkey-stream:<key>` (XADD on the quota Valkey, over-quota jobs to
    /// `{<key>}:over`; needs `VALKEY_URL`)
    SCAN_QUEUE_URL = unset("unset → stdout spool");
    /// with an SQS `SCAN_QUEUE_URL`: the SQS queue of over-quota jobs, so a consumer always
    /// reaches a due within-quota job ([The consumer](consumer.md))
    SCAN_QUEUE_OVER_URL = unset("unset → the over lane shares SCAN_QUEUE_URL");
    /// PEM text or path: RSA (RS256), P-256 (ES256) or Ed25519 (EdDSA) public key
    QUOTA_JWT_PUBLIC_KEY = unset("—");
    /// JWKS JSON or path; keys picked by `kid` (rotation); a token without `kid` is tried on the keys of its algorithm
    QUOTA_JWT_JWKS = unset("—");
    /// required `iss`
    QUOTA_JWT_ISSUER = value("stella-ops.org");
    /// required `aud`
    QUOTA_JWT_AUDIENCE = unset("unset → not checked");
    /// use the claims an API Gateway JWT authorizer verified (`tid`, `tier`)
    QUOTA_TRUST_GATEWAY_CLAIMS = value("false");
    /// a claim name (e.g. `quota_exempt`): a verified token whose claim of that name is `true` is
    /// exempt, like `QUOTA_EXEMPT_NETWORKS`
    QUOTA_EXEMPT_CLAIM = unset("unset → none");
    /// a claim name (e.g. `sub`) whose value names the account: all tokens of one account share one
    /// counter; a token without it (or with an empty or non-string value) is counted by its `tid`.
    /// Never a claim that is the same for every holder ([One account, one
    /// budget](guide.md#one-account-one-budget))
    QUOTA_JWT_ACCOUNT_CLAIM = unset("unset → per `tid`");
    /// CloudWatch namespace of the EMF lines
    QUOTA_METRICS_NAMESPACE = value("StellaOps/Quota");
    /// address of `quota-gate serve`
    QUOTA_LISTEN = value("127.0.0.1:9000").applies(Applies::Serve);
    /// connections `quota-gate serve` keeps open at once; past it a new one takes the slot of the
    /// one that has waited longest for a request (closing it), or waits in the listen backlog until
    /// one closes. Keep it below the open-file limit (`ulimit -n`)
    QUOTA_MAX_CONNECTIONS = number("1024", 1, 1_000_000).applies(Applies::Serve);
    /// `quota-gate serve`'s workers, each a single-threaded runtime with its own Valkey connection
    /// accepting on the one socket; 0: one per CPU
    QUOTA_SERVE_WORKERS = number("0", 0, 256).applies(Applies::Serve);
    /// `quota-gate serve`'s EMF lines on stdout (about 0.9 KB a request); `off` where nothing
    /// reads stdout into CloudWatch (`/metrics` is unchanged; Lambda always writes them, `consume`
    /// has `--no-emf`)
    QUOTA_EMF = value("on").applies(Applies::Serve);
    /// the most `quota-gate serve` takes from `SIGTERM` to its exit: a scan asleep is woken at
    /// once and answered with the rest of its delay on its job ([Stopping](operations.md#stopping));
    /// keep it below the supervisor's grace (Docker's 10 s)
    QUOTA_DRAIN_TIMEOUT_MS = number("8000", 1000, MAX_MILLIS).applies(Applies::Serve);
    /// log filter (the AWS SDK's own lines only from `error` unless named); Lambda's
    /// `AWS_LAMBDA_LOG_LEVEL` (the function's `ApplicationLogLevel`) comes first. Logs go to
    /// stderr and never contain an IP, token or digest
    RUST_LOG = value("info").applies(Applies::Logging);
    /// `text` or `json` (one object a line) for `quota-gate`'s logs; Lambda follows the function's
    /// `LogFormat` (`JSON` in the template) instead
    QUOTA_LOG_FORMAT = value("text").applies(Applies::Logging);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// No two rows share a name, so a name finds one row.
    #[test]
    fn names_are_unique() {
        let mut seen = BTreeSet::new();
        for v in VARIABLES {
            assert!(seen.insert(v.name), "{} is in the table twice", v.name);
        }
    }
}
