//! evervm: Python REPLs that never die.
//!
//! [`Client`] is the one API every surface uses (CLI, Python, Node, Swift), over two transports:
//! a remote evervm (or ForeverVM-compatible) server over HTTP and WebSocket, or the engine
//! in-process (feature `local`). [`protocol`] has the wire types; [`server`] (feature `server`)
//! exposes an engine over that wire; [`admin`] (feature `local`) makes tokens and images in a
//! home.

#[cfg(feature = "local")]
pub mod admin;
pub mod client;
mod convert;
mod error;
#[cfg(any(test, fuzzing))]
pub mod fuzz_targets;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod protocol;
#[cfg(feature = "server")]
pub mod server;
pub mod tool;
mod types;

#[cfg(feature = "local")]
pub use client::LocalOptions;
pub use client::{CA_FILE_ENV, Client, EventStream, Machine, Session, Trust};
pub use error::{Error, ErrorKind, Result};
pub use types::*;

/// The engine itself, for evervm's own tests and benchmarks (feature `internals`). Not an API:
/// every surface goes through [`Client`], [`server`] and [`admin`].
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use evervm_engine as engine;

#[cfg(test)]
mod one_version {
    use std::path::Path;

    fn read(relative: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(relative);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Every package evervm ships says the workspace's version: the crates inherit it, the
    /// Python wheel takes it from Cargo (maturin), the npm package and its lock file state it
    /// (the platform packages are checked against it when packed), the CLI, the API and MCP
    /// report this crate's.
    #[test]
    fn every_package_has_the_workspace_version() {
        let version = env!("CARGO_PKG_VERSION");
        for member in [
            "engine",
            "core",
            "cli",
            "tests",
            "examples",
            "bindings-python",
            "bindings-node",
            "bindings-swift",
        ] {
            let manifest = read(&format!("{member}/Cargo.toml"));
            assert!(
                manifest
                    .lines()
                    .any(|l| l.trim() == "version.workspace = true"),
                "{member}/Cargo.toml does not take the workspace's version"
            );
        }
        let pyproject = read("bindings-python/pyproject.toml");
        assert!(pyproject.contains("dynamic = [\"version\"]"), "{pyproject}");
        assert!(
            !pyproject
                .lines()
                .any(|l| l.trim_start().starts_with("version =")),
            "the Python package states a version of its own"
        );
        let package: serde_json::Value =
            serde_json::from_str(&read("bindings-node/package.json")).unwrap();
        assert_eq!(package["version"], version, "bindings-node/package.json");
        let lock: serde_json::Value =
            serde_json::from_str(&read("bindings-node/package-lock.json")).unwrap();
        assert_eq!(lock["version"], version, "bindings-node/package-lock.json");
        assert_eq!(
            lock["packages"][""]["version"], version,
            "package-lock.json's root"
        );
    }
}
