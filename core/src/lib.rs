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
pub use client::{Client, EventStream, Machine, Session};
pub use error::{Error, ErrorKind, Result};
pub use types::*;

/// The engine itself, for evervm's own tests and benchmarks (feature `internals`). Not an API:
/// every surface goes through [`Client`], [`server`] and [`admin`].
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use evervm_engine as engine;
