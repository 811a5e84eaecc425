//! End-to-end suites, one test binary. Every suite runs on every backend `backends()` lists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod bucket;
mod chunks;
mod client;
mod contexts;
mod environment;
mod faults;
mod files;
mod forever;
mod gvisor;
mod history;
mod isolation;
mod network;
mod nodes;
mod packages;
mod rich;
mod sdk;

/// An engine's settings on `home` with the gVisor backend and no idle swap (tests that want one
/// set it).
fn gvisor_config(home: &std::path::Path) -> evervm::engine::EngineConfig {
    let mut config = evervm::engine::EngineConfig::new(home);
    config.backend = evervm::engine::BackendChoice::parse("gvisor");
    config.idle_swap = None;
    config
}

/// An engine on `home` with gVisor (see [`gvisor_config`]) and an in-process client of it, as
/// account `local`.
async fn open_gvisor(home: &std::path::Path) -> (evervm::engine::Engine, evervm::Client) {
    let engine = evervm::engine::Engine::open(gvisor_config(home))
        .await
        .unwrap();
    let account = engine.ensure_account("local").await.unwrap();
    let client = evervm::Client::from_engine(engine.clone(), account);
    (engine, client)
}

/// An engine with `config` on the current runsc (it saves machines in place, and writes its
/// snapshots uncompressed for the engine to chunk: history and the chunk store need both), and
/// an in-process client of it as account `local`; `None`, with the reason printed, elsewhere.
async fn engine_saving_in_place(
    config: evervm::engine::EngineConfig,
) -> Option<(evervm::engine::Engine, evervm::Client)> {
    if !evervm_tests::backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return None;
    }
    let engine = evervm::engine::Engine::open(config).await.unwrap();
    if !engine.saves_in_place() {
        eprintln!(
            "skipping: {} cannot save a machine in place (an older runsc)",
            engine.backend_description()
        );
        engine.shutdown().await;
        return None;
    }
    let account = engine.ensure_account("local").await.unwrap();
    let client = evervm::Client::from_engine(engine.clone(), account);
    Some((engine, client))
}

/// A new machine on `client` with `image` (the default one when `None`).
async fn new_machine(client: &evervm::Client, image: Option<&str>) -> evervm::Machine {
    client
        .create_machine(evervm::CreateMachineOptions {
            image: image.map(str::to_owned),
            ..evervm::CreateMachineOptions::default()
        })
        .await
        .unwrap()
}

/// The `repr` of what `code` evaluates to (empty for none); fails the test on an error.
async fn value(machine: &evervm::Machine, code: &str) -> String {
    let run = machine.exec(code).await.unwrap();
    match (run.result.value, run.result.error) {
        (Some(value), None) => value,
        (None, None) => String::new(),
        (_, Some(error)) => panic!("{code:?} failed: {error}"),
    }
}
