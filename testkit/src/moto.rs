//! A real `moto` server (SQS, CloudWatch, Secrets Manager, Parameter Store,
//! IAM) on a free port, killed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::client::{http, request};
use crate::{KillOnDrop, free_port, loopback, root, wait_for_listener};

/// `moto_server` from `.tools/venv` (installed by `scripts/test`), or `$MOTO_SERVER`.
pub fn moto_server_bin() -> PathBuf {
    std::env::var_os("MOTO_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/venv/bin/moto_server"))
}

pub struct MotoServer {
    pub port: u16,
    child: KillOnDrop,
}

impl MotoServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// The same with `env` set for the server, e.g.
    /// `INITIAL_NO_AUTH_ACTION_COUNT`: moto then checks every request's
    /// signature and IAM permissions after that many unchecked ones.
    pub fn start_with(env: &[(&str, &str)]) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let bin = moto_server_bin();
            let child = Command::new(&bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start {bin:?} (run scripts/test once to install it): {e}")
                });
            let mut child = KillOnDrop::new(child);
            if wait_for_listener(&mut child, loopback(port), Duration::from_secs(30)) {
                return Self { port, child };
            }
        }
        panic!("moto_server did not start");
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The endpoint to give the AWS SDK (`AWS_ENDPOINT_URL`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment that points a child process's AWS SDK at this
    /// server, with dummy credentials and no instance metadata.
    pub fn process_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }

    /// An SDK configuration pointed at this server with dummy credentials,
    /// built without touching the process environment.
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        self.sdk_config_as("testing", "testing").await
    }

    /// The same, signed with the access key `key_id` / `secret_key`.
    pub async fn sdk_config_as(&self, key_id: &str, secret_key: &str) -> aws_config::SdkConfig {
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(self.endpoint())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                key_id, secret_key, None, None, "test",
            ))
            .load()
            .await
    }

    /// Creates a Secrets Manager secret holding `value`; returns its ARN.
    pub async fn create_secret(&self, name: &str, value: &str) -> String {
        let client = aws_sdk_secretsmanager::Client::new(&self.sdk_config().await);
        let created = client
            .create_secret()
            .name(name)
            .secret_string(value)
            .send()
            .await
            .unwrap();
        created.arn.unwrap()
    }

    /// Deletes the secret `id` (scheduled, as AWS does: it can no longer be read).
    pub async fn delete_secret(&self, id: &str) {
        let client = aws_sdk_secretsmanager::Client::new(&self.sdk_config().await);
        client.delete_secret().secret_id(id).send().await.unwrap();
    }

    /// Puts a Parameter Store parameter, a `SecureString` or a plain `String`.
    pub async fn put_parameter(&self, name: &str, value: &str, secure: bool) {
        use aws_sdk_ssm::types::ParameterType;
        let client = aws_sdk_ssm::Client::new(&self.sdk_config().await);
        let kind = if secure {
            ParameterType::SecureString
        } else {
            ParameterType::String
        };
        let put = client.put_parameter().name(name).value(value).r#type(kind);
        put.send().await.unwrap();
    }

    /// Creates the IAM user `name`, with no policy, and an access key for it:
    /// `(key id, secret key)`. Two IAM requests (moto's query API).
    pub fn iam_user(&self, name: &str) -> (String, String) {
        let iam = |body: String| {
            let auth = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/iam/aws4_request, \
                        SignedHeaders=host, Signature=0";
            let headers = [
                ("Authorization", auth),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ];
            http(
                self.addr(),
                &crate::client::build("POST", "/", &headers, &body),
            )
        };
        let created = iam(format!(
            "Action=CreateUser&UserName={name}&Version=2010-05-08"
        ));
        assert!(created.contains("<UserName>"), "{created}");
        let key = iam(format!(
            "Action=CreateAccessKey&UserName={name}&Version=2010-05-08"
        ));
        let field = |tag: &str| {
            let start = key.find(&format!("<{tag}>")).expect(tag) + tag.len() + 2;
            let end = key[start..].find('<').unwrap() + start;
            key[start..end].to_owned()
        };
        (field("AccessKeyId"), field("SecretAccessKey"))
    }

    /// moto's own view of its state (`GET /moto-api/data.json`): every model
    /// instance with its attributes, including what the SQS API never returns
    /// (a message's `delayed_until` and `sent_timestamp`, hence its `DelaySeconds`).
    pub fn model_data(&self) -> serde_json::Value {
        let response = http(self.addr(), &request("GET", "/moto-api/data.json"));
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.") && head.contains(" 200 "),
            "{head}"
        );
        serde_json::from_str(body).unwrap()
    }

    /// Every SQS message moto has created, in send order (deleted ones stay
    /// listed: moto tracks instances, not queue contents).
    pub fn sqs_messages(&self) -> Vec<serde_json::Value> {
        let data = self.model_data();
        let mut messages = data["sqs"]["Message"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages.sort_by_key(|m| m["sent_timestamp"].as_u64().unwrap_or(0));
        messages
    }

    /// Creates an SQS queue named `name` and returns its URL.
    pub async fn create_queue(&self, name: &str) -> String {
        let sqs = aws_sdk_sqs::Client::new(&self.sdk_config().await);
        let created = sqs.create_queue().queue_name(name).send().await.unwrap();
        created.queue_url.unwrap()
    }

    /// Stops the server (for outage tests).
    pub fn stop(&mut self) {
        self.child.kill_now();
    }
}
