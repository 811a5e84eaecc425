//! What the engine's test binaries share: a process-backend engine on a temporary home, and
//! machines that run code.
#![allow(dead_code, clippy::unwrap_used)]

use evervm_engine::{
    Account, CreateMachine, Engine, EngineConfig, ExecEvent, ExecRequest, ExecResult,
};
use futures::StreamExt;

/// Settings for a process-backend engine on `dir`, without a pool.
pub fn config(dir: &tempfile::TempDir) -> EngineConfig {
    let mut config = EngineConfig::new(dir.path());
    config.backend = evervm_engine::BackendChoice::parse("process");
    config.pool_size = 0;
    config
}

/// A new machine of `account`; its name.
pub async fn new_machine(engine: &Engine, account: &Account) -> String {
    engine
        .create_machine(account, CreateMachine::default())
        .await
        .unwrap()
        .name
        .to_string()
}

/// Runs `request` and collects its output and result.
pub async fn events(
    engine: &Engine,
    account: &Account,
    name: &str,
    request: ExecRequest,
) -> Vec<ExecEvent> {
    let seq = engine.exec(account, name, request).await.unwrap().seq;
    engine
        .events(account, name, seq)
        .await
        .unwrap()
        .collect()
        .await
}

/// Runs `code` and waits for its result.
pub async fn run(engine: &Engine, account: &Account, name: &str, code: &str) -> ExecResult {
    let seq = engine
        .exec(account, name, ExecRequest::new(code))
        .await
        .unwrap()
        .seq;
    engine.result(account, name, seq).await.unwrap()
}
