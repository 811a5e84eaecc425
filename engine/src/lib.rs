//! The evervm engine: persistent Python machines, each in its own sandbox, with their
//! instructions, output and results kept in a store.
//!
//! Everything is reached through [`Engine`]; nothing here knows about HTTP or any binding.
//!
//! Without the `runtime` feature (on by default) this crate is only evervm's domain rules: names,
//! limits, error kinds and the types of machines, instructions and files, which every transport
//! checks. The remote-only client builds on that on any platform (the Swift package does).

pub mod audit;
#[cfg(feature = "runtime")]
pub mod bucket;
pub mod certificates;
#[cfg(feature = "runtime")]
pub mod chunks;
#[cfg(feature = "runtime")]
pub mod doctor;
#[cfg(feature = "runtime")]
mod engine;
mod error;
pub mod files;
#[cfg(feature = "runtime")]
pub mod fsutil;
#[cfg(all(feature = "runtime", any(test, fuzzing)))]
pub mod fuzz_targets;
#[cfg(feature = "runtime")]
pub mod guest;
#[cfg(feature = "runtime")]
mod machine;
#[cfg(feature = "runtime")]
mod metrics;
pub mod network;
pub mod packages;
#[cfg(feature = "runtime")]
mod pool;
#[cfg(feature = "runtime")]
pub mod sandbox;
#[cfg(feature = "runtime")]
pub mod secrets;
#[cfg(feature = "runtime")]
pub mod snapshot;
#[cfg(feature = "runtime")]
pub mod store;
#[cfg(feature = "runtime")]
mod sync;
mod types;

#[cfg(feature = "runtime")]
pub use engine::{
    AuditCode, AuditSettings, BackendChoice, Engine, EngineConfig, Hook, Hooks,
    LINE_OVERHEAD_BYTES, Limits, MAX_HISTORY_LIST, NodeSettings, create_token_in_home,
    create_token_in_store, list_tokens_in_home, list_tokens_in_store, parse_memory_list,
    read_audit_in_store, reseal_secrets_in_store, revoke_token_in_home, revoke_token_in_store,
};
pub use error::{Error, ErrorKind, Result};
pub use files::{ByteStream, FileInfo, FileKind, FileList, FileRead, WriteFileOptions};
#[cfg(feature = "runtime")]
pub use guest::processes::{ProcessEnd, ProcessOutput, ProcessState, ProcessStream};
#[cfg(feature = "runtime")]
pub use guest::tunnels::{MAX_TUNNELS as MAX_PORT_CONNECTIONS, PortStream};
#[cfg(feature = "runtime")]
pub use machine::processes::{
    MAX_PROCESS_INPUT_BYTES, Process, ProcessSpec, ProcessUpdate, TerminalSize,
};
pub use packages::{InstallReport, InstalledPackage, SatisfiedPackage};
pub use types::*;
