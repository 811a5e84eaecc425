//! Sandboxes: where a machine's interpreter runs. Every backend hands out the same thing, a
//! running agent reachable over a byte channel, so nothing above this trait knows how a machine
//! is isolated.

pub mod process;

use std::path::PathBuf;

use async_trait::async_trait;

use crate::error::Result;
use crate::guest::connection::{ChannelReader, ChannelWriter};
use crate::types::MachineName;

/// What a backend needs to start a machine's sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub machine: MachineName,
    pub memory_mb: u32,
}

/// What a backend can do beyond running an agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The whole sandbox, memory included, can be saved to disk and restored.
    pub snapshots: bool,
}

/// A kind of sandbox (process, gVisor, ...).
#[async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// Short name shown in machine info (`process`, `gvisor`).
    fn name(&self) -> &'static str;

    fn capabilities(&self) -> Capabilities;

    /// Starts a sandbox running the agent for this machine.
    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>>;

    /// Removes everything the backend keeps for a machine (working directory, bundle). Called
    /// when a machine is deleted, after its sandbox was killed.
    async fn remove(&self, machine: &MachineName) -> Result<()>;
}

/// One running sandbox.
#[async_trait]
pub trait Sandbox: Send {
    /// The channel to the agent. Returns `None` once taken.
    fn take_channel(&mut self) -> Option<(ChannelReader, ChannelWriter)>;

    /// Stops the sandbox and everything in it, and waits until it is gone.
    async fn kill(&mut self) -> Result<()>;

    /// If the sandbox has ended, why (exit status, signal).
    fn exit_reason(&mut self) -> Option<String>;

    /// Where the sandbox keeps its private files on the host, if anywhere.
    fn work_dir(&self) -> Option<PathBuf> {
        None
    }
}
