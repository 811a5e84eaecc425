//! Sandboxes: where a machine's interpreter runs. Every backend hands out the same thing, a
//! running agent reachable over a byte channel, so nothing above this trait knows how a machine
//! is isolated.

pub mod gvisor;
pub mod process;

use async_trait::async_trait;

use crate::error::Result;
use crate::guest::connection::{ChannelReader, ChannelWriter};
use crate::guest::image::Profile;

/// What a backend needs to start a sandbox. Sandboxes are not tied to a machine when they start
/// (a pool starts them ahead of time), so they have ids of their own.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Unique among this engine's sandboxes: `[A-Za-z0-9_-]`.
    pub id: String,
    pub memory_mb: u32,
    /// The image the sandbox runs (backends without images ignore it).
    pub profile: Profile,
    /// An exact image (a restore needs the one its snapshot was taken on); the newest image of
    /// the profile when `None`.
    pub image_id: Option<String>,
    /// The network of the machine the sandbox is for; none (only loopback) when `None`.
    pub network: Option<SandboxNetwork>,
}

/// A sandbox's network: whose it is (for logs) and what it may reach.
#[derive(Debug, Clone)]
pub struct SandboxNetwork {
    pub machine: String,
    pub policy: crate::network::NetworkPolicy,
}

/// What a backend can do beyond running an agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The whole sandbox, memory included, can be saved to disk and restored.
    pub snapshots: bool,
    /// New sandboxes can be saved and left running ([`Sandbox::checkpoint_in_place`]).
    pub save_in_place: bool,
    /// Sandboxes can be given a network ([`SandboxSpec::network`]).
    pub network: bool,
}

/// How hard a backend works to make a snapshot small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    /// While a swap-out waits.
    Fast,
    /// In the background, for a machine idle for long.
    Small,
}

/// A kind of sandbox (process, gVisor, ...).
#[async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// Short name shown in machine info (`process`, `gvisor`).
    fn name(&self) -> &'static str;

    fn capabilities(&self) -> Capabilities;

    /// The directories in a sandbox that callers' file operations may touch (the agent resolves
    /// every path under them); none: the machine's home only.
    fn file_roots(&self) -> &'static [&'static str] {
        &[]
    }

    /// Starts a sandbox running the agent.
    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>>;

    /// The backend and its exact version, for logs and machine info. Snapshots record it and
    /// are restored only by the same.
    fn describe(&self) -> String {
        self.name().to_owned()
    }

    /// The exact image new sandboxes of `profile` run, for backends with images.
    async fn current_image(&self, profile: Profile) -> Result<Option<String>> {
        let _ = profile;
        Ok(None)
    }

    /// Whether this backend can restore a snapshot written by `runtime` (a [`Self::describe`]
    /// of this or an earlier engine).
    fn restorable(&self, runtime: &str) -> bool {
        runtime == self.describe()
    }

    /// Brings back a sandbox saved by [`Sandbox::checkpoint`] into `dir` by `runtime`.
    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &std::path::Path,
        runtime: &str,
    ) -> Result<Box<dyn Sandbox>> {
        let _ = (spec, dir, runtime);
        Err(crate::error::Error::unsupported(format!(
            "the {} backend cannot restore snapshots",
            self.name()
        )))
    }

    /// Whether the snapshot in `dir` holds files [`Self::compress_snapshot`] would compress.
    fn compressible(&self, dir: &std::path::Path) -> bool {
        let _ = dir;
        false
    }

    /// Compresses the snapshot files in `dir` (a copy being built, never a committed
    /// snapshot), in a form [`Self::restore`] reads.
    fn compress_snapshot(&self, dir: &std::path::Path, effort: Effort) -> Result<()> {
        let _ = (dir, effort);
        Ok(())
    }

    /// Releases what the backend keeps beside its sandboxes (at engine shutdown).
    async fn shutdown(&self) {}
}

/// One running sandbox.
#[async_trait]
pub trait Sandbox: Send {
    /// The channel to the agent. Returns `None` once taken.
    fn take_channel(&mut self) -> Option<(ChannelReader, ChannelWriter)>;

    /// Stops the sandbox and everything in it, waits until it is gone, and removes what it kept
    /// on the host.
    async fn kill(&mut self) -> Result<()>;

    /// Stops what runs in the sandbox at once (its processes killed, its memory given back)
    /// without waiting; [`Self::kill`] later removes the rest. By default nothing happens
    /// before `kill`.
    fn stop_now(&mut self) {}

    /// If the sandbox has ended, why (exit status, signal).
    fn exit_reason(&mut self) -> Option<ExitReason>;

    /// Saves the whole sandbox, memory and files, into `dir` and stops it.
    async fn checkpoint(&mut self, dir: &std::path::Path) -> Result<()> {
        let _ = dir;
        Err(crate::error::Error::unsupported(
            "this backend cannot snapshot a machine (the gVisor backend can)",
        ))
    }

    /// Whether [`Sandbox::checkpoint_in_place`] works for this sandbox.
    fn can_checkpoint_in_place(&self) -> bool {
        false
    }

    /// Saves the whole sandbox into `dir` like [`Sandbox::checkpoint`], and leaves it running
    /// (it pauses for the save).
    async fn checkpoint_in_place(&mut self, dir: &std::path::Path) -> Result<()> {
        let _ = dir;
        Err(crate::error::Error::unsupported(
            "this sandbox cannot be saved and left running",
        ))
    }

    /// The exact image the sandbox runs, if it runs one.
    fn image_id(&self) -> Option<String> {
        None
    }

    /// What a checkpoint of this sandbox records as its runtime (the backend's description, or
    /// that of the older runtime that restored it).
    fn runtime(&self) -> Option<String> {
        None
    }

    /// The host process at the root of the sandbox.
    fn pid(&self) -> Option<u32>;

    /// The host processes whose trees hold the sandbox's memory.
    fn memory_roots(&self) -> Vec<u32> {
        self.pid().into_iter().collect()
    }
}

/// Why a sandbox ended, in words that say what it most likely means (each backend knows what
/// its statuses mean: nothing above it reads meaning back out of the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitReason {
    pub text: String,
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Memory process trees hold: the sum of each process's proportional set size (shared pages
/// divided among their sharers), from `/proc/<pid>/smaps_rollup`. 0 when the trees are gone.
pub fn process_tree_pss(roots: &[u32]) -> u64 {
    let mut total = 0;
    let mut pending = roots.to_vec();
    let mut seen = std::collections::HashSet::new();
    while let Some(pid) = pending.pop() {
        if !seen.insert(pid) || seen.len() > 4096 {
            continue;
        }
        if let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
            total += rollup
                .lines()
                .find_map(|line| line.strip_prefix("Pss:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map_or(0, |kb| kb * 1024);
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                pending.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    total
}

/// Enlarges a pipe's buffer (to 1 MiB where the host allows), so that a burst of output crosses
/// in few wake-ups. Best effort: the default size only costs speed.
pub(crate) fn widen_pipe(fd: &impl std::os::fd::AsRawFd) {
    // SAFETY: F_SETPIPE_SZ takes an int and touches no memory of ours; an fd that is not a pipe
    // (or a size over the host's limit) only makes the call fail.
    let _ = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
}
