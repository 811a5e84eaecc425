//! evervm: Python REPLs that never die.
//!
//! [`Client`] is the one API every surface uses (CLI, Python, Node, Swift), over two transports:
//! a remote evervm (or ForeverVM-compatible) server over HTTP and WebSocket, or the engine
//! in-process (feature `local`). [`protocol`] has the wire types; [`server`] (feature `server`)
//! exposes an engine over that wire.

pub mod client;
mod convert;
mod error;
#[cfg(any(test, fuzzing))]
pub mod fuzz_targets;
pub mod protocol;
#[cfg(feature = "server")]
pub mod server;
mod types;

#[cfg(feature = "local")]
pub use client::LocalOptions;
pub use client::{Client, EventStream, Machine, Session};
pub use error::{Error, ErrorKind, Result};
pub use types::*;

#[cfg(feature = "local")]
pub use evervm_engine as engine;
