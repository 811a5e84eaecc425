//! The client's types: what every binding shows its users.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
/// The default and the longest instruction timeout: the engine's, the one definition every
/// surface uses.
pub use evervm_engine::network::{NetworkMode, NetworkPolicy};
pub use evervm_engine::{DEFAULT_TIMEOUT, MAX_TIMEOUT};
pub use evervm_engine::{InstallReport, InstalledPackage, SatisfiedPackage};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Tags: string keys and values, set when a machine is created.
pub type Tags = BTreeMap<String, String>;

/// Parses a tag written `KEY=VALUE` (the CLI's `--tag`), checking the key by the engine's rule.
pub fn parse_tag(text: &str) -> Result<(String, String)> {
    Ok(evervm_engine::parse_tag(text)?)
}

/// Options for a new machine.
#[derive(Debug, Clone, Default)]
pub struct CreateMachineOptions {
    pub tags: Tags,
    /// Memory limit in MiB (the server's default when `None`).
    pub memory_mb: Option<u32>,
    /// The image profile: `data` (numpy, pandas, matplotlib, requests, ...) or `minimal`; the
    /// server's default (`data`, unless it was set otherwise) when `None`.
    pub image: Option<String>,
    /// When the machine's state is saved to disk: `idle` (default: at swap-out, checkpoints and
    /// engine stop) or `instruction` (also after every instruction, before its result is
    /// reported; costs a snapshot and a restore per instruction).
    pub durability: Option<String>,
    /// Environment variables the machine's interpreter has (`os.environ`, inherited by its
    /// subprocesses), kept across swap, restart and fork; shown by `info`.
    pub env: BTreeMap<String, String>,
    /// Environment variables whose values are never shown (`info` and lists give their names
    /// only, logs neither).
    pub secret_env: SecretEnv,
    /// The machine is deleted this long after its creation (give this or `expires_at`).
    pub ttl: Option<Duration>,
    /// The machine is deleted at this time (a server is sent the seconds until it).
    pub expires_at: Option<DateTime<Utc>>,
    /// What the machine may reach over the network: `none` (loopback only), `public` (public
    /// addresses) or `allow` (listed names and address blocks); the server's default (`none`
    /// unless it was set otherwise) when `None`.
    pub network: Option<NetworkPolicy>,
    /// How many undo points the machine keeps: its whole state after each of its latest
    /// `history` instructions (and before its first), to `rewind` or `undo` to. The server's
    /// default (0: none, unless it was set otherwise) when `None`; gVisor only.
    pub history: Option<u32>,
}

/// How a machine's current (or last) interpreter began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct InterpreterInfo {
    /// `booted` (a fresh interpreter), `restored` (from the machine's snapshot) or
    /// `restarted_after_crash` (after its sandbox ended abnormally: from its snapshot, or fresh
    /// when it had none).
    #[cfg_attr(feature = "server", schemars(example = &"restored"))]
    pub began: String,
    pub started_at: DateTime<Utc>,
    /// When the snapshot it came from was written; null when it began fresh.
    pub snapshot_at: Option<DateTime<Utc>>,
}

/// One page of a machine list, newest first.
#[derive(Debug, Clone)]
pub struct MachinePage {
    pub machines: Vec<MachineInfo>,
    /// Where the next page starts (pass it back as the cursor); `None` after the last page.
    pub next_cursor: Option<String>,
}

/// Environment variables whose values are secrets: `Debug` shows their names only.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretEnv(pub BTreeMap<String, String>);

impl std::fmt::Debug for SecretEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Options for one instruction.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Interrupted with `KeyboardInterrupt` after this long (default [`DEFAULT_TIMEOUT`], 15 s).
    pub timeout: Duration,
    /// Interrupt whatever runs or waits on the machine first.
    pub interrupt: bool,
    /// How the code runs: a REPL line (the default) or a Jupyter cell (IPython's shell).
    pub dialect: Dialect,
    /// Which of the machine's interpreters runs it: a context's id from
    /// [`crate::Machine::create_context`] (none: the machine's own).
    pub context: Option<String>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            interrupt: false,
            dialect: Dialect::Python,
            context: None,
        }
    }
}

/// A timeout given in seconds as a float (what the bindings take): rounded up to whole seconds
/// (the wire carries whole seconds), at least 1 s and at most [`MAX_TIMEOUT`]. Not a number,
/// infinite, zero, negative or longer than that is `InvalidInput`.
pub fn timeout_from_secs(secs: f64) -> Result<Duration> {
    let max = MAX_TIMEOUT.as_secs();
    if !(secs.is_finite() && secs > 0.0 && secs.ceil() <= max as f64) {
        return Err(Error::invalid(format!(
            "timeout must be a number of seconds from 1 to {max} ({} h), not {secs}",
            max / 3600
        )));
    }
    Ok(Duration::from_secs(secs.ceil().max(1.0) as u64))
}

/// What is known about a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub tags: Tags,
    /// True while the machine's sandbox is in memory.
    pub running: bool,
    pub has_pending_instruction: bool,
    /// The following are known only from an evervm server (or in-process).
    pub memory_mb: Option<u32>,
    /// The image profile (`minimal`, `data`).
    pub image: Option<String>,
    pub backend: Option<String>,
    /// `resident`, `swapped`, `damaged` or `stopped`.
    pub state: Option<String>,
    pub instruction_count: Option<i64>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// Bytes of the machine's snapshot and checkpoints on disk.
    pub disk_bytes: Option<u64>,
    /// Memory its sandbox holds now (0 when not resident).
    pub resident_bytes: Option<u64>,
    /// `idle` or `instruction`.
    pub durability: Option<String>,
    /// How many undo points it keeps (0: none).
    pub history: Option<u32>,
    /// The machine it was forked from; `None` when it was created (or the server does not say).
    pub parent: Option<String>,
    /// The seq of the parent's last instruction the fork holds (-1: none).
    pub forked_at: Option<i64>,
    /// Its environment variables that are not secret.
    pub env: BTreeMap<String, String>,
    /// The names of its secret environment variables.
    pub secret_env: Vec<String>,
    /// When the machine is deleted; `None`: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// How its current interpreter (or its last, when it is not resident) began; `None` before
    /// its first start under the current engine, and from servers that do not say.
    pub interpreter: Option<InterpreterInfo>,
    /// What it may reach over the network; `None` from servers that do not say.
    pub network: Option<NetworkPolicy>,
}

/// A named, kept snapshot of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "server",
    derive(schemars::JsonSchema),
    schemars(rename = "Checkpoint")
)]
pub struct CheckpointInfo {
    #[cfg_attr(feature = "server", schemars(example = &"cp-20250101-120000-000"))]
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The machine's instruction count when it was taken; a rollback marks the instructions
    /// from this seq on as rolled back.
    pub instruction_count: i64,
    /// Bytes of the checkpoint's files on disk; files it shares with the snapshot or other
    /// checkpoints (hard links) count in full here.
    pub disk_bytes: u64,
}

/// What a path in a machine names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    /// A device, a FIFO or a socket.
    Other,
}

impl FileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Directory => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
    }
}

/// A file or directory in a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct FileInfo {
    /// Its absolute path in the machine (symlinks on the way resolved).
    #[cfg_attr(feature = "server", schemars(example = &"/home/user/data.csv"))]
    pub path: String,
    /// The last component of the path.
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits, as a number (`420` is `0o644`).
    pub mode: u32,
    pub modified_at: Option<DateTime<Utc>>,
    /// Where a symlink leads, resolved to the end: in a stat's answer when the path asked for is
    /// a symlink (the other fields then describe its target), in a listing for an entry of type
    /// `symlink` (which describes the link itself). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// A directory's entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct FileList {
    /// The directory itself.
    pub directory: FileInfo,
    /// By name; symlinks are listed as themselves, not followed.
    pub entries: Vec<FileInfo>,
    /// True when the directory holds more entries than a listing returns (10,000).
    pub truncated: bool,
}

/// How a file is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteFileOptions {
    /// Permission bits (`0o600`); those of the file replaced, or `0o644`, when `None`.
    pub mode: Option<u32>,
    /// Make missing parent directories.
    pub make_parents: bool,
}

/// File data on its way in or out of a machine, in pieces.
pub type ByteStream = futures::stream::BoxStream<'static, Result<bytes::Bytes>>;

/// A file being read: what it is, then its bytes. The stream ends in an error, never silently
/// short, when the file cannot be read whole.
pub struct FileRead {
    pub info: FileInfo,
    pub data: ByteStream,
}

impl std::fmt::Debug for FileRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRead")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Which stream a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// One line of output, without its newline; `seq` counts from 0 per instruction across streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub seq: i64,
    pub stream: OutputStream,
    pub data: String,
}

/// Why an instruction failed: the engine's type, the one definition.
pub use evervm_engine::FailureCause;

/// Rich results: the engine's types, the one definition.
pub use evervm_engine::{RichKind, RichResult};

/// The exception an instruction raised, as data: the engine's type, the one definition.
pub use evervm_engine::ExceptionInfo;

/// What a rewind did, a machine's history, and one instruction in it.
pub use evervm_engine::{HistoryEntry, MachineHistory, Rewound};

/// One of a machine's interpreters (a code context): `default`, or one made by
/// [`crate::Machine::create_context`].
pub use evervm_engine::{ContextInfo, DEFAULT_CONTEXT};
/// A machine's family tree of forks, with checkpoints and what rewinds took back.
pub use evervm_engine::{Lineage, LineageCheckpoint, LineageNode, TakenBack};

/// How an instruction's code runs: the engine's type, the one definition.
pub use evervm_engine::Dialect;

/// How an instruction ended: a value (the `repr` of the last expression, `None` for statements)
/// or an error text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResult {
    pub value: Option<String>,
    pub error: Option<String>,
    /// Set with `error`. Servers other than evervm don't say, and then it is guessed from the
    /// text (`Timed out`) or taken as an exception.
    pub cause: Option<FailureCause>,
    /// Set with `error` when the code raised an exception (from evervm; other servers don't
    /// say): its class's name, qualified name and module, and its message, taken from the
    /// exception object. `error` holds the traceback.
    pub exception: Option<ExceptionInfo>,
    /// ForeverVM's rich output: `{"png": "<base64>"}` for the last matplotlib figure.
    pub data: Option<serde_json::Value>,
    /// The rich results, in order: those shown during the instruction (`display(obj)`,
    /// `plt.show()`), then the last expression's value when it has more than text, then the
    /// figures left open. Empty from servers that don't send them.
    pub results: Vec<RichResult>,
    pub runtime_ms: u64,
    /// True when the instruction printed more than the server keeps per instruction: the rest
    /// of its output was dropped (the output ends with a line saying so).
    pub output_truncated: bool,
    /// For machines with `durability = instruction`: whether the state after the instruction
    /// is on disk (`None` for other machines, and from servers that don't say).
    pub saved: Option<bool>,
}

impl ExecResult {
    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }

    pub fn timed_out(&self) -> bool {
        self.cause == Some(FailureCause::Timeout)
    }
}

/// An event of a running instruction: output lines and rich results shown, in order, then
/// exactly one result (whose `results` repeat those shown).
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    Output(OutputChunk),
    Display(RichResult),
    Result(ExecResult),
}

/// An instruction that was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// Its number on the machine, from 0.
    pub seq: i64,
    /// True if accepting it interrupted other instructions.
    pub interrupted: bool,
}

/// A whole instruction's output and result, collected.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub seq: i64,
    pub output: Vec<OutputChunk>,
    pub result: ExecResult,
}

impl Execution {
    fn joined(&self, stream: OutputStream) -> String {
        let mut text = String::new();
        for chunk in self.output.iter().filter(|c| c.stream == stream) {
            text.push_str(&chunk.data);
            text.push('\n');
        }
        text
    }

    /// Everything printed to stdout, one line per chunk.
    pub fn stdout(&self) -> String {
        self.joined(OutputStream::Stdout)
    }

    pub fn stderr(&self) -> String {
        self.joined(OutputStream::Stderr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_timeout_is_the_engines() {
        assert_eq!(
            ExecOptions::default().timeout,
            evervm_engine::DEFAULT_TIMEOUT
        );
        assert_eq!(
            i64::from(crate::protocol::DEFAULT_TIMEOUT_SECONDS),
            evervm_engine::DEFAULT_TIMEOUT.as_secs() as i64
        );
    }

    #[test]
    fn timeouts_in_seconds_are_checked_and_rounded_up() {
        assert_eq!(timeout_from_secs(0.2).unwrap(), Duration::from_secs(1));
        assert_eq!(timeout_from_secs(1.5).unwrap(), Duration::from_secs(2));
        assert_eq!(timeout_from_secs(15.0).unwrap(), Duration::from_secs(15));
        let max = MAX_TIMEOUT.as_secs_f64();
        assert_eq!(timeout_from_secs(max).unwrap(), MAX_TIMEOUT);
        for bad in [
            0.0,
            -0.0,
            -1.0,
            max + 0.5,
            1e20,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ] {
            let err = timeout_from_secs(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidInput, "{bad}");
            assert!(err.message().contains("timeout"), "{err}");
        }
    }
}
