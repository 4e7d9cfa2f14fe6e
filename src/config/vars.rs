//! The table of environment variables: one row per setting, read by the
//! parser (defaults and ranges), by docs/configuration.md's table (a test
//! checks it is [`super::table::markdown_table`]'s output) and by the
//! template test (which variables `template.yaml` must set).
//!
//! Each row is a `const` handle ([`Var`]) and [`VARIABLES`] is built from
//! those handles, so the parser names a variable by its handle, never by a
//! string: a misspelt name, or a variable read as the wrong kind (a word
//! as a number), does not compile. A handle's kind ([`Whole`], [`Flag`],
//! [`Word`], [`Text`], [`Optional`]) says how it is read and, for a number,
//! carries its range. To add a variable: one row in the table (its doc
//! comment is the table's meaning), one read in the group of settings that
//! uses it (a test checks the parser reads every row).

use std::marker::PhantomData;

use crate::rules::modes::{DelayMode, FailMode, Mode, OnEviction, Pacing, ResetPolicy, ValkeyAuth};

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
    /// By the long-running commands, `quota-gate serve` and `consume`, not
    /// in Lambda: `template.yaml` leaves it out.
    LongRunning,
    /// Everywhere, but names a local file, which a Lambda zip would have to
    /// ship: `template.yaml` leaves it out.
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
    /// A secret: it may be given as a reference to a secret store
    /// ([`super::secret_ref`]), which the front ends read at start, and its
    /// value is never printed.
    pub secret: bool,
}

/// A typed handle on one row: `K` says how the parser reads the variable.
#[derive(Debug, Clone, Copy)]
pub struct Var<K> {
    pub row: Variable,
    pub kind: K,
}

/// A whole number in `min..=max` (both ends included).
#[derive(Debug, Clone, Copy)]
pub struct Whole {
    pub min: u64,
    pub max: u64,
}

/// `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
#[derive(Debug, Clone, Copy)]
pub struct Flag;

/// One of the words of the setting `T` (its `FromStr` names them).
#[derive(Debug, Clone, Copy)]
pub struct Word<T>(PhantomData<fn() -> T>);

/// Text with a default, parsed (if at all) by its reader.
#[derive(Debug, Clone, Copy)]
pub struct Text;

/// Text that may be absent: unset means something of its own.
#[derive(Debug, Clone, Copy)]
pub struct Optional;

impl<K> Var<K> {
    /// The variable's name, as errors and the docs spell it.
    pub const fn name(&self) -> &'static str {
        self.row.name
    }
}

impl<K: Copy> Var<K> {
    /// The same row, read only where `applies` says.
    const fn applies(self, applies: Applies) -> Self {
        Var {
            row: Variable {
                applies,
                ..self.row
            },
            kind: self.kind,
        }
    }

    /// The same row, marked a secret (see [`Variable::secret`]).
    const fn secret(self) -> Self {
        Var {
            row: Variable {
                secret: true,
                ..self.row
            },
            kind: self.kind,
        }
    }
}

const fn row(
    name: &'static str,
    default: DefaultValue,
    range: Option<(u64, u64)>,
    meaning: &'static str,
) -> Variable {
    Variable {
        name,
        default,
        range,
        // A doc comment's lines each start with a space.
        meaning: meaning.trim_ascii(),
        applies: Applies::Everywhere,
        secret: false,
    }
}

const fn number(
    name: &'static str,
    default: &'static str,
    min: u64,
    max: u64,
    meaning: &'static str,
) -> Var<Whole> {
    Var {
        row: row(name, Value(default), Some((min, max)), meaning),
        kind: Whole { min, max },
    }
}

const fn flag(name: &'static str, default: &'static str, meaning: &'static str) -> Var<Flag> {
    Var {
        row: row(name, Value(default), None, meaning),
        kind: Flag,
    }
}

const fn word<T>(name: &'static str, default: &'static str, meaning: &'static str) -> Var<Word<T>> {
    Var {
        row: row(name, Value(default), None, meaning),
        kind: Word(PhantomData),
    }
}

const fn text(name: &'static str, default: &'static str, meaning: &'static str) -> Var<Text> {
    Var {
        row: row(name, Value(default), None, meaning),
        kind: Text,
    }
}

const fn optional(name: &'static str, unset: &'static str, meaning: &'static str) -> Var<Optional> {
    Var {
        row: row(name, Unset(unset), None, meaning),
        kind: Optional,
    }
}

use DefaultValue::{Unset, Value};

/// The table: a row is the variable's meaning (its doc comment, which the
/// configuration table shows), its handle's type, and the handle's maker with the
/// default (and range). The name is the handle's; [`VARIABLES`] lists the
/// rows in order.
macro_rules! variables {
    ($(
        $(#[doc = $meaning:literal])+
        $name:ident: $ty:ty = $make:ident($($arg:expr),*) $(.$modify:ident($($how:expr)?))*;
    )+) => {
        $(
            $(#[doc = $meaning])+
            pub const $name: $ty =
                $make(stringify!($name), $($arg,)* concat!($($meaning),+)) $(.$modify($($how)?))*;
        )+

        /// Every variable, in the table's order.
        pub const VARIABLES: &[Variable] = &[$($name.row),+];
    };
}

variables! {
    /// daily ceiling per anonymous source (IP, or IPv6 /64)
    QUOTA_ANON: Var<Whole> = number("33", 1, MAX_LIMIT);
    /// daily ceiling per token id; a valid token's numeric `tier` claim overrides it
    QUOTA_TOKEN: Var<Whole> = number("333", 1, MAX_LIMIT);
    /// scans used from which the response carries a reminder
    QUOTA_WARN_AT: Var<Whole> = number("200", 1, MAX_LIMIT);
    /// over-quota scans that get the soft delay
    QUOTA_SOFT_WINDOW: Var<Whole> = number("30", 0, MAX_LIMIT);
    /// delay for scans L+1 … L+W
    QUOTA_SOFT_DELAY_MS: Var<Whole> = number("5000", 0, MAX_MILLIS);
    /// delay beyond the soft window
    QUOTA_HARD_DELAY_MS: Var<Whole> = number("60000", 0, MAX_MILLIS);
    /// `utc-day`: reset at 00:00 UTC; `rolling`: 24 h after the first scan
    QUOTA_RESET: Var<Word<ResetPolicy>> = word("utc-day");
    /// `enforce`: over-quota scans are delayed and paced; `shadow`: everything is counted, decided
    /// and metered, but no scan waits or takes a pacing slot, and each answer says what enforcement
    /// would have done ([Rolling out](operations.md#rolling-out))
    QUOTA_MODE: Var<Word<Mode>> = word("enforce");
    /// budgets above the subject: an anonymous scan is also counted, delayed and paced at each
    /// network that encloses its address, like one client ([Budgets above the
    /// subject](guide.md#budgets-above-the-subject)); comma-separated `v4/<len>=<limit>` and
    /// `v6/<len>=<limit>` (a level shorter than the subject's /32 or `QUOTA_IPV6_PREFIX`, at most 3
    /// per family), the limit a number of scans per period or `<k>x` (k × `QUOTA_ANON`); `off`: none.
    /// Unset, a default level not shorter than the subject is left out
    QUOTA_NETWORKS: Var<Text> = text("v4/24=8x,v6/56=2x,v6/48=8x");
    /// the same for token holders: a token holder's scan is also counted, delayed and paced at each
    /// network that encloses its source address, on counters apart from the anonymous ones
    /// ([Tokens share their network](guide.md#tokens-share-their-network)); the grammar of
    /// `QUOTA_NETWORKS`, the limit a number or `<k>x` (k × `QUOTA_TOKEN`); `off`: none
    QUOTA_TOKEN_NETWORKS: Var<Text> = text("v4/24=10x,v6/48=10x");
    /// anonymous scans per period for all anonymous subjects together; beyond it they start at
    /// most one per `QUOTA_ANON_GLOBAL_INTERVAL_MS` across the fleet (0: off)
    QUOTA_ANON_GLOBAL: Var<Whole> = number("0", 0, MAX_LIMIT);
    /// the interval between anonymous scans beyond `QUOTA_ANON_GLOBAL`
    QUOTA_ANON_GLOBAL_INTERVAL_MS: Var<Whole> = number("1000", 1, MAX_MILLIS);
    /// HMAC key for digests, ≥ 16 bytes (use 32 random bytes). **Required in Lambda**; `serve` and
    /// the operator commands fall back to a built-in development secret and warn
    QUOTA_HASH_SECRET: Var<Optional> = optional("—").secret();
    /// IPv6 sources are counted per prefix of this length
    QUOTA_IPV6_PREFIX: Var<Whole> = number("64", 1, 128);
    /// comma-separated CIDRs; only when the direct peer is one of them is `X-Forwarded-For` read
    /// (right-most untrusted entry)
    QUOTA_TRUSTED_PROXIES: Var<Optional> = optional("empty");
    /// comma-separated CIDRs (IPv4 and IPv6) whose scans are never counted, delayed or paced (tier
    /// `exempt`); matched against the client address after `QUOTA_TRUSTED_PROXIES`; a trusted
    /// proxy's own address is never exempt (the start warns when an exempt network covers a
    /// trusted proxy)
    QUOTA_EXEMPT_NETWORKS: Var<Optional> = optional("empty");
    /// `redis://`, `rediss://` (TLS), `valkey://` or `valkeys://`
    VALKEY_URL: Var<Optional> = optional("unset → in-memory").secret();
    /// cluster mode (ElastiCache Serverless)
    VALKEY_CLUSTER: Var<Flag> = flag("false");
    /// replicas a write must reach (`WAIT`) before it is relied on: a keyed scan's claim, a job
    /// added to a stream on this Valkey, a consumer's attempt, its lease renewals and its done
    /// marker (0: off, and a failover with replication lag may queue the lag's keyed scans twice,
    /// lose its stream jobs, run its finished scans again and repeat its attempt numbers: the
    /// measured table in [Running in production](production.md#failover); standalone Valkey only)
    VALKEY_WAIT_REPLICAS: Var<Whole> = number("0", 0, 5);
    /// PEM file of CA certificates trusted for `rediss://` (a private CA; ElastiCache needs none);
    /// read at start
    VALKEY_TLS_CA: Var<Optional> = optional("unset → platform roots").applies(Applies::LocalFile);
    /// `password`: whatever `VALKEY_URL` carries; `iam`: ElastiCache IAM authentication, a token
    /// signed with the process's AWS credentials for each connection and renewed on live ones (needs
    /// a TLS `VALKEY_URL` without credentials, `VALKEY_USER` and `VALKEY_CACHE_NAME`; [IAM
    /// authentication](production.md#iam-authentication))
    VALKEY_AUTH: Var<Word<ValkeyAuth>> = word("password");
    /// with `VALKEY_AUTH=iam`: the ElastiCache user id (an IAM-enabled user's name is its id)
    VALKEY_USER: Var<Optional> = optional("—");
    /// with `VALKEY_AUTH=iam`: the cache (serverless cache or replication group) the token names
    VALKEY_CACHE_NAME: Var<Optional> = optional("—");
    /// with `VALKEY_AUTH=iam`: the cache is ElastiCache Serverless (the token says so)
    VALKEY_CACHE_SERVERLESS: Var<Flag> = flag("false");
    /// bound on every Valkey call
    QUOTA_STORE_TIMEOUT_MS: Var<Whole> = number("100", 1, MAX_MILLIS);
    /// `open`: accept unmetered, mark `X-Stella-Quota: unavailable`; `closed`: 503 + `Retry-After`
    QUOTA_FAIL_MODE: Var<Word<FailMode>> = word("open");
    /// consecutive store failures that open the circuit breaker (0: off)
    QUOTA_BREAKER_FAILURES: Var<Whole> = number("5", 0, MAX_LIMIT);
    /// how long an open breaker skips the store before one probe
    QUOTA_BREAKER_COOLDOWN_MS: Var<Whole> = number("1000", 0, MAX_MILLIS);
    /// `warn`: a store whose `maxmemory-policy` can evict the gate's keys (anything but
    /// `noeviction`) is named at start in an error-level line and in `stella_quota_store_evicting`;
    /// `refuse`: such a start (serve, Lambda, consume) exits non-zero instead ([Eviction and
    /// memory](production.md#eviction-and-memory))
    QUOTA_STORE_EVICTION: Var<Word<OnEviction>> = word("warn");
    /// how often `serve` and `consume` read the store's `evicted_keys` into
    /// `stella_quota_store_evicted_keys_total`, and its `maxmemory-policy` again
    QUOTA_STORE_STATS_INTERVAL_MS: Var<Whole> =
        number("60000", 100, MAX_MILLIS).applies(Applies::LongRunning);
    /// `sleep` (seed behaviour, capped by the budget) or `defer`
    QUOTA_DELAY_MODE: Var<Word<DelayMode>> = word("sleep");
    /// requests asleep at once across every gate process (each holds a Lambda environment); a
    /// scan that finds them all taken sleeps nothing and defers its whole delay onto its job
    /// (0: none sleeps, as `defer`)
    QUOTA_MAX_ASLEEP: Var<Whole> = number("100", 0, MAX_LIMIT);
    /// the gateway's integration timeout
    QUOTA_GATEWAY_TIMEOUT_MS: Var<Whole> = number("29000", 1, MAX_MILLIS);
    /// kept free below the gateway and Lambda deadlines
    QUOTA_DELAY_MARGIN_MS: Var<Whole> = number("1000", 0, MAX_MILLIS);
    /// `on`: a subject's over-quota scans start one delay apart ([Delays](guide.md#delays)); `off`: the
    /// seed's fixed per-request delays
    QUOTA_PACING: Var<Word<Pacing>> = word("on");
    /// the longest paced delay a scan may get; beyond it 503 `backlog_full` + `Retry-After`, not
    /// counted
    QUOTA_MAX_BACKLOG_MS: Var<Whole> = number("900000", 0, MAX_MILLIS);
    /// an SQS queue URL, or `valkey-stream:<key>` (XADD on the quota Valkey, over-quota jobs to
    /// `{<key>}:over`; needs `VALKEY_URL`)
    SCAN_QUEUE_URL: Var<Optional> = optional("unset → stdout spool");
    /// with an SQS `SCAN_QUEUE_URL`: the SQS queue of over-quota jobs, so a consumer always
    /// reaches a due within-quota job ([The consumer](consumer.md))
    SCAN_QUEUE_OVER_URL: Var<Optional> = optional("unset → the over lane shares SCAN_QUEUE_URL");
    /// PEM text or path: RSA (RS256), P-256 (ES256) or Ed25519 (EdDSA) public key
    QUOTA_JWT_PUBLIC_KEY: Var<Optional> = optional("—");
    /// JWKS JSON or path; keys picked by `kid` (rotation); a token without `kid` is tried on the keys of its algorithm
    QUOTA_JWT_JWKS: Var<Optional> = optional("—");
    /// required `iss`
    QUOTA_JWT_ISSUER: Var<Text> = text("stella-ops.org");
    /// required `aud`
    QUOTA_JWT_AUDIENCE: Var<Optional> = optional("unset → not checked");
    /// use the claims an API Gateway JWT authorizer verified (`tid`, `tier`)
    QUOTA_TRUST_GATEWAY_CLAIMS: Var<Flag> = flag("false");
    /// a claim name (e.g. `quota_exempt`): a verified token whose claim of that name is `true` is
    /// exempt, like `QUOTA_EXEMPT_NETWORKS`
    QUOTA_EXEMPT_CLAIM: Var<Optional> = optional("unset → none");
    /// a claim name (e.g. `sub`) whose value names the account: all tokens of one account share one
    /// counter; a token without it (or with an empty or non-string value) is counted by its `tid`.
    /// Never a claim that is the same for every holder ([One account, one
    /// budget](guide.md#one-account-one-budget))
    QUOTA_JWT_ACCOUNT_CLAIM: Var<Optional> = optional("unset → per `tid`");
    /// CloudWatch namespace of the EMF lines
    QUOTA_METRICS_NAMESPACE: Var<Text> = text("StellaOps/Quota");
    /// address of `quota-gate serve`
    QUOTA_LISTEN: Var<Text> = text("127.0.0.1:9000").applies(Applies::Serve);
    /// connections `quota-gate serve` keeps open at once; past it a new one takes the slot of the
    /// one that has waited longest for a request (closing it), or waits in the listen backlog until
    /// one closes. Keep it below the open-file limit (`ulimit -n`)
    QUOTA_MAX_CONNECTIONS: Var<Whole> = number("1024", 1, MAX_CONNECTIONS).applies(Applies::Serve);
    /// `quota-gate serve`'s workers, each a single-threaded runtime with its own Valkey connection
    /// accepting on the one socket; 0: one per CPU
    QUOTA_SERVE_WORKERS: Var<Whole> = number("0", 0, MAX_WORKERS).applies(Applies::Serve);
    /// `quota-gate serve`'s EMF lines on stdout (about 0.9 KB a request); `off` where nothing
    /// reads stdout into CloudWatch (`/metrics` is unchanged; Lambda always writes them, `consume`
    /// has `--no-emf`)
    QUOTA_EMF: Var<Flag> = flag("on").applies(Applies::Serve);
    /// the most `quota-gate serve` takes from `SIGTERM` to its exit: a scan asleep is woken at
    /// once and answered with the rest of its delay on its job ([Stopping](operations.md#stopping));
    /// keep it below the supervisor's grace (Docker's 10 s)
    QUOTA_DRAIN_TIMEOUT_MS: Var<Whole> =
        number("8000", 1000, MAX_MILLIS).applies(Applies::Serve);
    // Read by the logger (`tracing`'s `EnvFilter`), not by [`super::Config`].
    /// log filter (the AWS SDK's own lines only from `error` unless named); Lambda's
    /// `AWS_LAMBDA_LOG_LEVEL` (the function's `ApplicationLogLevel`) comes first. Logs go to
    /// stderr and never contain an IP, token or digest
    RUST_LOG: Var<Text> = text("info").applies(Applies::Logging);
    // Read by the logger ([`crate::LogFormat`]), not by [`super::Config`].
    /// `text` or `json` (one object a line) for `quota-gate`'s logs; Lambda follows the function's
    /// `LogFormat` (`JSON` in the template) instead
    QUOTA_LOG_FORMAT: Var<Text> = text("text").applies(Applies::Logging);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    /// No two rows share a name, so a name finds one row.
    #[test]
    fn names_are_unique() {
        let mut seen = BTreeSet::new();
        for v in VARIABLES {
            assert!(seen.insert(v.name), "{} is in the table twice", v.name);
        }
    }

    /// The parser asks for exactly the table's rows (less the logger's): no
    /// row that no handle reads, and no handle read that is not in the table.
    #[test]
    fn every_row_is_read_through_a_handle() {
        let asked = RefCell::new(BTreeSet::new());
        super::super::Config::from_lookup(|name| {
            asked.borrow_mut().insert(name.to_owned());
            None
        })
        .unwrap();
        let rows: BTreeSet<String> = VARIABLES
            .iter()
            .filter(|v| v.applies != Applies::Logging)
            .map(|v| v.name.to_owned())
            .collect();
        let asked = asked.into_inner();
        let unread: Vec<_> = rows.difference(&asked).collect();
        let outside: Vec<_> = asked.difference(&rows).collect();
        assert!(unread.is_empty(), "rows no handle reads: {unread:?}");
        assert!(outside.is_empty(), "read but not in the table: {outside:?}");
    }

    /// A handle's range and its row's range are the same numbers.
    #[test]
    fn number_handles_carry_their_rows_range() {
        for var in [QUOTA_ANON, QUOTA_IPV6_PREFIX, QUOTA_SERVE_WORKERS] {
            assert_eq!(var.row.range, Some((var.kind.min, var.kind.max)));
        }
    }
}
