//! The AWS Lambda entry point: the gate, or with `QUOTA_ROLE=consume` the consumer. A configuration
//! error is reported to the Runtime API as the init error, so the invocation shows its cause.

use std::process::ExitCode;
use std::sync::Arc;

use quota_gate::Config;
use quota_gate::front::lambda::{CONFIG_ERROR_TYPE, report_init_error};
use quota_gate::front::lambda_consumer::{self, Consumer, Role};
use quota_gate::gate::Gate;
use quota_gate::io::meter::Meter;

/// mimalloc, as in `quota-gate`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One thread: a sandbox serves one invocation at a time, and the Valkey connection's task on the
/// sending thread lets a command a closed connection refused be sent again safely.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // The runtime's span puts the request id on every line logged during an invocation.
    quota_gate::init_tracing(quota_gate::LogFormat::lambda());
    let served = match Role::from_lookup(|k| std::env::var(k).ok()) {
        Ok(Role::Gate) => match start().await {
            Ok(gate) => quota_gate::front::lambda::run(Arc::new(gate)).await,
            Err(message) => return init_failed(&message).await,
        },
        Ok(Role::Consume) => match Consumer::from_env().await {
            Ok(consumer) => lambda_consumer::run(Arc::new(consumer)).await,
            Err(message) => return init_failed(&message).await,
        },
        Err(message) => return init_failed(&message).await,
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quota-gate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Says why the cold start failed, on stderr and as the function's init error.
async fn init_failed(message: &str) -> ExitCode {
    eprintln!("quota-gate: configuration error: {message}");
    if let Ok(api) = std::env::var("AWS_LAMBDA_RUNTIME_API")
        && let Err(e) = report_init_error(&api, CONFIG_ERROR_TYPE, message).await
    {
        eprintln!("quota-gate: could not report the init error to {api}: {e}");
    }
    ExitCode::from(2)
}

/// The gate of this cold start, or why there is none (naming the variable).
async fn start()
-> Result<Gate<quota_gate::io::store::AnyStore, quota_gate::io::queue::AnyQueue>, String> {
    // References to secret stores are read here, once per cold start.
    let config = quota_gate::io::secrets::config_from_env()
        .await
        .and_then(Config::require_hash_secret)
        .map_err(|e| e.to_string())?;
    let meter = Meter::stdout(config.metrics_namespace.clone()).with_levels(&config.policy.levels);
    let gate = Gate::from_config(config, meter)
        .await
        .map_err(|e| e.to_string())?;
    // Connect during the cold start, not in the first request.
    gate.warm_up();
    quota_gate::front::lambda::check_store(&gate).await?;
    Ok(gate)
}
