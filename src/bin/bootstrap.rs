//! The AWS Lambda entry point: read the configuration, build the clients
//! once per cold start, and serve invocations.

use std::sync::Arc;

use quota_gate::meter::Meter;
use quota_gate::{Config, Gate};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    quota_gate::init_tracing();
    let config = Config::from_env()?;
    let secret = config.hash_secret.clone().ok_or(
        "QUOTA_HASH_SECRET: required in Lambda (32 random bytes, e.g. from Secrets Manager)",
    )?;
    let meter = Meter::stdout(config.metrics_namespace.clone());
    let gate = Gate::from_config(config, secret.as_bytes(), meter).await?;
    quota_gate::lambda::run(Arc::new(gate)).await
}
