//! ElastiCache IAM authentication (`VALKEY_AUTH=iam`): each connection signs in as `VALKEY_USER`
//! with a token signed from the process's AWS credentials, so the cache has no password here.
//!
//! The token ([`token`]) is a SigV4 presigned `GET` (service `elasticache`, expiring in 900 s) of
//! `https://<cache>/?Action=connect&User=<user>`, plus `&ResourceType=ServerlessCache` for a
//! serverless cache, without its `https://`. `aws-sigv4` signs it; only the query is assembled
//! here, in botocore's order, so it matches the AWS documentation's signer byte for byte.
//!
//! [`IamSigner`] is redis-rs's [`StreamingCredentialsProvider`]: every new connection (each node
//! connection of a cluster client too) signs in with its first token and re-`AUTH`s with a new one
//! every [`RENEW_EVERY`]. A timer of our own would reach one node of a cluster only.
//!
//! Expiring credentials are held until they would expire within a token's life; if the freshest
//! expire within [`LEAST_LEFT`], nothing is signed. A token that cannot be signed fails the
//! connection attempt like a refused one; a renewal that cannot is logged, and the connection keeps
//! its session.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::BehaviorVersion;
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
// The SDK's error printer, with each error's sources (any SDK crate re-exports it).
use aws_sdk_secretsmanager::error::DisplayErrorContext;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use futures_util::Stream;
use redis::auth::{BasicAuth, StreamingCredentialsProvider};
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::sync::OnceCell;

use crate::config::IamConfig;

/// How long a token is good for: ElastiCache's 15 minutes.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);
/// How often a live connection signs in again: well inside a token's life.
pub const RENEW_EVERY: Duration = Duration::from_secs(600);
/// The least time the freshest credentials must have left to sign with.
pub const LEAST_LEFT: Duration = Duration::from_secs(60);

/// What a token names and where it is good: [`token`]'s inputs besides credentials and time.
#[derive(Debug, Clone, Copy)]
pub struct TokenFor<'a> {
    pub user: &'a str,
    pub cache: &'a str,
    pub serverless: bool,
    pub region: &'a str,
}

/// The IAM token for `request`, signed with `credentials` as of `at`.
pub fn token(
    request: TokenFor<'_>,
    credentials: &Credentials,
    at: SystemTime,
) -> Result<String, String> {
    let mut query = format!("Action=connect&User={}", encode(request.user));
    if request.serverless {
        query.push_str("&ResourceType=ServerlessCache");
    }
    let cache = request.cache;
    let url = format!("https://{cache}/?{query}");
    let signable = SignableRequest::new("GET", &url, std::iter::empty(), SignableBody::Bytes(&[]))
        .map_err(|e| e.to_string())?;
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(TOKEN_LIFETIME);
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(request.region)
        .name("elasticache")
        .time(at)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let (instructions, signature) = sign(signable, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    // botocore's order: the signing parameters (the session token last), then the signature.
    for (name, value) in instructions.params() {
        if *name != "X-Amz-Signature" {
            query.push_str(&format!("&{name}={}", encode(value)));
        }
    }
    Ok(format!("{cache}/?{query}&X-Amz-Signature={signature}"))
}

/// RFC 3986 percent-encoding of a query value, as SigV4 writes it: all but unreserved characters.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether credentials expiring at `expiry` (`None`: never) are still good `span` after `now`.
pub fn lasts(expiry: Option<SystemTime>, now: SystemTime, span: Duration) -> bool {
    expiry.is_none_or(|at| at > now + span)
}

/// The time a token is signed as of.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Signs one Valkey handle's tokens: the credentials provider its connections subscribe to.
#[derive(Clone)]
pub struct IamSigner {
    inner: Arc<Signer>,
}

struct Signer {
    iam: IamConfig,
    /// The SDK's credentials chain and region, loaded at the first token.
    aws: OnceCell<Aws>,
    /// Credentials with an expiry, kept while they outlast a token.
    held: Mutex<Option<Credentials>>,
    clock: Clock,
    renew_every: Duration,
    /// The last renewal failure reported, so each is one line.
    reported: Mutex<Option<String>>,
}

struct Aws {
    credentials: SharedCredentialsProvider,
    region: String,
}

impl IamSigner {
    /// Tokens for `iam` from the process's AWS credentials, loaded at the first sign-in.
    pub fn new(iam: IamConfig) -> Self {
        Self::assemble(iam, OnceCell::new(), Arc::new(SystemTime::now), RENEW_EVERY)
    }

    /// Tokens from `credentials` in `region`, as of `clock`, renewed every `renew_every`.
    #[cfg(feature = "testing")]
    pub fn for_tests(
        iam: IamConfig,
        credentials: SharedCredentialsProvider,
        region: &str,
        clock: Clock,
        renew_every: Duration,
    ) -> Self {
        let aws = Aws {
            credentials,
            region: region.to_owned(),
        };
        Self::assemble(iam, OnceCell::new_with(Some(aws)), clock, renew_every)
    }

    fn assemble(iam: IamConfig, aws: OnceCell<Aws>, clock: Clock, renew_every: Duration) -> Self {
        Self {
            inner: Arc::new(Signer {
                iam,
                aws,
                held: Mutex::new(None),
                clock,
                renew_every,
                reported: Mutex::new(None),
            }),
        }
    }

    pub fn iam(&self) -> &IamConfig {
        &self.inner.iam
    }

    /// A token signed now, or why there is none.
    pub async fn sign(&self) -> Result<String, String> {
        let aws = self.inner.aws.get_or_try_init(load_aws).await?;
        let now = (self.inner.clock)();
        let credentials = self.credentials(aws, now).await?;
        let iam = &self.inner.iam;
        let request = TokenFor {
            user: &iam.user,
            cache: &iam.cache,
            serverless: iam.serverless,
            region: &aws.region,
        };
        token(request, &credentials, now)
    }

    /// Credentials good for a whole token from `now`: the held ones, else fresh ones.
    async fn credentials(&self, aws: &Aws, now: SystemTime) -> Result<Credentials, String> {
        let held = self.inner.held.lock().ok().and_then(|held| held.clone());
        if let Some(held) = held.filter(|c| lasts(c.expiry(), now, TOKEN_LIFETIME)) {
            return Ok(held);
        }
        let fresh = aws
            .credentials
            .provide_credentials()
            .await
            .map_err(|e| format!("no AWS credentials: {}", DisplayErrorContext(e)))?;
        if !lasts(fresh.expiry(), now, LEAST_LEFT) {
            return Err(
                "the AWS credentials expire within a minute and none fresher are given".into(),
            );
        }
        if fresh.expiry().is_some()
            && let Ok(mut held) = self.inner.held.lock()
        {
            *held = Some(fresh.clone());
        }
        Ok(fresh)
    }

    /// The user and a token, as a connection signs in with them.
    async fn sign_in(&self) -> RedisResult<BasicAuth> {
        let token = self.sign().await.map_err(|why| {
            let what = "cannot sign an ElastiCache IAM token";
            RedisError::from((ErrorKind::AuthenticationFailed, what, why))
        })?;
        Ok(BasicAuth::new(self.inner.iam.user.clone(), token))
    }

    /// Logs a failed renewal once (until one succeeds).
    fn renewed(&self, outcome: &RedisResult<BasicAuth>) {
        let Ok(mut reported) = self.inner.reported.lock() else {
            return;
        };
        let why = outcome.as_ref().err().map(ToString::to_string);
        if why.is_some() && *reported != why {
            let iam = &self.inner.iam;
            tracing::error!(
                user = %iam.user,
                cache = %iam.cache,
                error = why.as_deref().unwrap_or_default(),
                "cannot renew the ElastiCache IAM sign-in of live connections; they keep their session"
            );
        }
        *reported = why;
    }
}

/// The process's AWS credentials chain and region, as the SDK clients find them.
async fn load_aws() -> Result<Aws, String> {
    let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;
    let credentials = sdk
        .credentials_provider()
        .ok_or("no AWS credentials provider is configured")?;
    let region = sdk
        .region()
        .ok_or("no AWS region (set AWS_REGION)")?
        .to_string();
    Ok(Aws {
        credentials,
        region,
    })
}

impl StreamingCredentialsProvider for IamSigner {
    /// A token at once (signing in), then a new one every renewal interval (signing in again).
    fn subscribe(&self) -> Pin<Box<dyn Stream<Item = RedisResult<BasicAuth>> + Send + 'static>> {
        let signer = self.clone();
        Box::pin(futures_util::stream::unfold(false, move |renewing| {
            let signer = signer.clone();
            async move {
                if renewing {
                    tokio::time::sleep(signer.inner.renew_every).await;
                }
                let outcome = signer.sign_in().await;
                if renewing {
                    signer.renewed(&outcome);
                }
                Some((outcome, true))
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::future;
    use std::sync::atomic::{AtomicU64, Ordering};

    const T0: u64 = 1_796_083_200;

    /// A credentials chain whose n-th answer is key `AKIDn`, expiring
    /// `lifetime[n]` seconds after `T0` (the last lifetime repeats).
    #[derive(Debug)]
    struct Chain {
        asked: Arc<AtomicU64>,
        lifetimes: Vec<u64>,
    }

    impl ProvideCredentials for Chain {
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            let n = self.asked.fetch_add(1, Ordering::SeqCst) as usize;
            let life = self.lifetimes[n.min(self.lifetimes.len() - 1)];
            let expiry = SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + life);
            let key = format!("AKID{n}");
            future::ProvideCredentials::ready(Ok(Credentials::new(
                key,
                "secret",
                None,
                Some(expiry),
                "test",
            )))
        }
    }

    fn signer(lifetimes: Vec<u64>, now: Arc<AtomicU64>) -> (IamSigner, Arc<AtomicU64>) {
        let asked = Arc::new(AtomicU64::new(0));
        let chain = Chain {
            asked: asked.clone(),
            lifetimes,
        };
        let aws = Aws {
            credentials: SharedCredentialsProvider::new(chain),
            region: "us-east-1".into(),
        };
        let iam = IamConfig {
            user: "gate".into(),
            cache: "quota".into(),
            serverless: true,
        };
        let clock: Clock = Arc::new(move || {
            SystemTime::UNIX_EPOCH + Duration::from_secs(now.load(Ordering::SeqCst))
        });
        (
            IamSigner::assemble(iam, OnceCell::new_with(Some(aws)), clock, RENEW_EVERY),
            asked,
        )
    }

    /// Credentials are kept while they outlast a token, and asked for again
    /// once they would expire within one: the token then carries the new key.
    #[tokio::test]
    async fn credentials_are_renewed_before_they_outlive_no_token() {
        let now = Arc::new(AtomicU64::new(T0));
        let (signer, asked) = signer(vec![3600, 7200], now.clone());
        assert!(signer.sign().await.unwrap().contains("AKID0"));
        now.store(T0 + 2699, Ordering::SeqCst); // just over a token's life left
        assert!(signer.sign().await.unwrap().contains("AKID0"));
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        now.store(T0 + 2700, Ordering::SeqCst); // no more than a token's life left
        assert!(signer.sign().await.unwrap().contains("AKID1"));
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }

    /// When the freshest credentials expire within a minute, nothing is
    /// signed; with more left (but less than a token's life) they are used.
    #[tokio::test]
    async fn credentials_about_to_expire_sign_nothing() {
        let now = Arc::new(AtomicU64::new(T0));
        let (signer, _) = signer(vec![60], now.clone());
        let why = signer.sign().await.unwrap_err();
        assert!(why.contains("expire within a minute"), "{why}");
        let (signer, _) = super::tests::signer(vec![120], now);
        assert!(signer.sign().await.is_ok());
    }

    /// A subscription yields a token at once, then one per renewal interval.
    #[tokio::test(start_paused = true)]
    async fn a_subscription_renews_on_its_interval() {
        use futures_util::StreamExt;
        let now = Arc::new(AtomicU64::new(T0));
        let (signer, _) = signer(vec![86_400], now);
        let mut stream = signer.subscribe();
        let start = tokio::time::Instant::now();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.username(), "gate");
        assert!(
            first
                .password()
                .starts_with("quota/?Action=connect&User=gate")
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        stream.next().await.unwrap().unwrap();
        assert_eq!(start.elapsed(), RENEW_EVERY);
    }
}
