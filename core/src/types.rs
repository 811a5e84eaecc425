//! The client's types: what every binding shows its users.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Tags: string keys and values, set when a machine is created.
pub type Tags = BTreeMap<String, String>;

/// Options for a new machine.
#[derive(Debug, Clone, Default)]
pub struct CreateMachineOptions {
    pub tags: Tags,
    /// Memory limit in MiB (the server's default when `None`).
    pub memory_mb: Option<u32>,
    /// The image profile: `minimal` (default) or `data` (numpy, pandas, matplotlib).
    pub image: Option<String>,
    /// When the machine's state is saved to disk: `idle` (default: at swap-out, checkpoints and
    /// engine stop) or `instruction` (also after every instruction, before its result is
    /// reported; costs a snapshot and a restore per instruction).
    pub durability: Option<String>,
}

/// Options for one instruction.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Interrupted with `KeyboardInterrupt` after this long (default 15 s).
    pub timeout: Duration,
    /// Interrupt whatever runs or waits on the machine first.
    pub interrupt: bool,
}

impl Default for ExecOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(15),
            interrupt: false,
        }
    }
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

/// Why an instruction failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailureCause {
    /// The code raised; `error` is the traceback.
    Exception,
    /// It ran past its timeout.
    Timeout,
    /// It was interrupted (or cancelled before it started).
    Interrupted,
    /// The machine's sandbox died.
    MachineCrashed,
}

impl FailureCause {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCause::Exception => "exception",
            FailureCause::Timeout => "timeout",
            FailureCause::Interrupted => "interrupted",
            FailureCause::MachineCrashed => "machine_crashed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "exception" => Some(FailureCause::Exception),
            "timeout" => Some(FailureCause::Timeout),
            "interrupted" => Some(FailureCause::Interrupted),
            "machine_crashed" => Some(FailureCause::MachineCrashed),
            _ => None,
        }
    }
}

/// How an instruction ended: a value (the `repr` of the last expression, `None` for statements)
/// or an error text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResult {
    pub value: Option<String>,
    pub error: Option<String>,
    /// Set with `error`. Servers other than evervm don't say, and then it is guessed from the
    /// text (`Timed out`) or taken as an exception.
    pub cause: Option<FailureCause>,
    /// Rich output such as `{"png": "<base64>"}`.
    pub data: Option<serde_json::Value>,
    pub runtime_ms: u64,
}

impl ExecResult {
    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }

    pub fn timed_out(&self) -> bool {
        self.cause == Some(FailureCause::Timeout)
    }
}

/// An event of a running instruction: output lines in order, then exactly one result.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    Output(OutputChunk),
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
