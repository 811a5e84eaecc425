//! The evervm engine: persistent Python machines, each in its own sandbox, with their
//! instructions, output and results kept in a store.
//!
//! Everything is reached through [`Engine`]; nothing here knows about HTTP or any binding.

mod engine;
mod error;
pub mod files;
pub mod fsutil;
#[cfg(any(test, fuzzing))]
pub mod fuzz_targets;
pub mod guest;
mod machine;
mod metrics;
mod pool;
pub mod sandbox;
pub mod snapshot;
pub mod store;
mod sync;
mod types;

pub use engine::{
    BackendChoice, Engine, EngineConfig, Hook, Hooks, LINE_OVERHEAD_BYTES, Limits,
    create_token_in_home, list_tokens_in_home, parse_memory_list, revoke_token_in_home,
};
pub use error::{Error, ErrorKind, Result};
pub use files::{ByteStream, FileInfo, FileKind, FileList, FileRead, WriteFileOptions};
pub use types::*;
