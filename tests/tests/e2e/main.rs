//! End-to-end suites, one test binary. Every suite runs on every backend `backends()` lists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod client;
mod environment;
mod faults;
mod files;
mod forever;
mod gvisor;
mod isolation;
mod sdk;

/// An engine's settings on `home` with the gVisor backend and no idle swap (tests that want one
/// set it).
fn gvisor_config(home: &std::path::Path) -> evervm::engine::EngineConfig {
    let mut config = evervm::engine::EngineConfig::new(home);
    config.backend = evervm::engine::BackendChoice::parse("gvisor");
    config.idle_swap = None;
    config
}
