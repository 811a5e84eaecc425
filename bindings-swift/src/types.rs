//! The records and enums Swift sees, each a conversion of `evervm`'s own type (uniffi's derives
//! cannot go on another crate's types), and the error enum.

use std::collections::HashMap;
use std::time::SystemTime;

use chrono::{DateTime, Utc};

/// A failure, one case per kind of error evervm has, each with its message.
#[derive(Debug, thiserror::Error, uniffi::Error)]
pub enum EvervmError {
    /// The machine, instruction, checkpoint or file does not exist (or is not the caller's).
    #[error("{message}")]
    NotFound { message: String },
    /// The request itself was wrong (bad tags, code too large, a bad timeout).
    #[error("{message}")]
    InvalidInput { message: String },
    /// The token is missing, malformed or unknown.
    #[error("{message}")]
    Unauthorized { message: String },
    /// Not available on this server or backend (forks on the process backend, say).
    #[error("{message}")]
    Unsupported { message: String },
    /// The machine's sandbox died.
    #[error("{message}")]
    MachineCrashed { message: String },
    /// In the way of something else (a name taken, a machine being deleted).
    #[error("{message}")]
    Conflict { message: String },
    /// Over a limit of the server (machines, memory, instruction rate).
    #[error("{message}")]
    LimitExceeded { message: String },
    /// More than a size limit (a file, code).
    #[error("{message}")]
    TooLarge { message: String },
    /// A path the machine's user may not touch.
    #[error("{message}")]
    PermissionDenied { message: String },
    /// The server could not be reached, or the connection broke.
    #[error("{message}")]
    Transport { message: String },
    /// A fault in evervm itself.
    #[error("{message}")]
    Internal { message: String },
    /// The caller cancelled: the instruction was interrupted (the machine keeps its state).
    #[error("{message}")]
    Cancelled { message: String },
}

impl From<evervm::Error> for EvervmError {
    fn from(e: evervm::Error) -> Self {
        use evervm::ErrorKind as K;
        let message = e.message().to_owned();
        match e.kind() {
            K::NotFound => Self::NotFound { message },
            K::InvalidInput => Self::InvalidInput { message },
            K::Unauthorized => Self::Unauthorized { message },
            K::Unsupported => Self::Unsupported { message },
            K::MachineCrashed => Self::MachineCrashed { message },
            K::Conflict => Self::Conflict { message },
            K::LimitExceeded => Self::LimitExceeded { message },
            K::TooLarge => Self::TooLarge { message },
            K::PermissionDenied => Self::PermissionDenied { message },
            K::Transport => Self::Transport { message },
            K::Internal => Self::Internal { message },
        }
    }
}

impl EvervmError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidInput {
            message: message.into(),
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, EvervmError>;

fn time(t: DateTime<Utc>) -> SystemTime {
    t.into()
}

/// What a machine is and how it is.
#[derive(Debug, Clone, uniffi::Record)]
pub struct MachineInfo {
    pub name: String,
    pub created_at: SystemTime,
    pub tags: HashMap<String, String>,
    /// True while its sandbox is in memory.
    pub running: bool,
    pub has_pending_instruction: bool,
    pub memory_mb: Option<u32>,
    /// The image (`data`, `minimal`).
    pub image: Option<String>,
    /// `resident`, `swapped`, `damaged` or `stopped`.
    pub state: Option<String>,
    pub instruction_count: Option<i64>,
    pub last_used_at: Option<SystemTime>,
    pub last_error: Option<String>,
    /// Bytes of its snapshot and checkpoints on disk.
    pub disk_bytes: Option<u64>,
    /// `idle` or `instruction`.
    pub durability: Option<String>,
    /// How many undo points it keeps (0: none).
    pub history: Option<u32>,
    /// The machine it was forked from; nil when it was created.
    pub parent: Option<String>,
    /// The seq of the parent's last instruction the fork holds (-1: none).
    pub forked_at: Option<i64>,
    /// Its environment variables that are not secret.
    pub env: HashMap<String, String>,
    /// The names of its secret environment variables.
    pub secret_env: Vec<String>,
    /// When it is deleted; nil: never.
    pub expires_at: Option<SystemTime>,
    /// What it may reach: `none`, `public` or `allow` (see `networkAllow`).
    pub network: Option<String>,
    /// The names and blocks it may reach when `network` is `allow`.
    pub network_allow: Vec<String>,
}

impl From<evervm::MachineInfo> for MachineInfo {
    fn from(m: evervm::MachineInfo) -> Self {
        let (network, network_allow) = evervm::NetworkPolicy::mode_and_rules(m.network.as_ref());
        Self {
            name: m.name,
            created_at: time(m.created_at),
            tags: m.tags.into_iter().collect(),
            running: m.running,
            has_pending_instruction: m.has_pending_instruction,
            memory_mb: m.memory_mb,
            image: m.image,
            state: m.state,
            instruction_count: m.instruction_count,
            last_used_at: m.last_used_at.map(time),
            last_error: m.last_error,
            disk_bytes: m.disk_bytes,
            durability: m.durability,
            history: m.history,
            parent: m.parent,
            forked_at: m.forked_at,
            env: m.env.into_iter().collect(),
            secret_env: m.secret_env,
            expires_at: m.expires_at.map(time),
            network,
            network_allow,
        }
    }
}

/// A package `install` put into the machine.
#[derive(Debug, Clone, uniffi::Record)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
    /// The wheel's file name.
    pub wheel: String,
    /// The wheel's sha256, as checked.
    pub sha256: String,
    /// The wheel's size in bytes.
    pub bytes: u64,
}

/// A requirement the machine already satisfied.
#[derive(Debug, Clone, uniffi::Record)]
pub struct SatisfiedPackage {
    pub name: String,
    pub version: String,
}

/// What `install` did.
#[derive(Debug, Clone, uniffi::Record)]
pub struct InstallReport {
    /// What was put into the machine, dependencies included.
    pub installed: Vec<InstalledPackage>,
    /// What the machine had already.
    pub satisfied: Vec<SatisfiedPackage>,
}

impl From<evervm::InstallReport> for InstallReport {
    fn from(report: evervm::InstallReport) -> Self {
        Self {
            installed: report
                .installed
                .into_iter()
                .map(|p| InstalledPackage {
                    name: p.name,
                    version: p.version,
                    wheel: p.wheel,
                    sha256: p.sha256,
                    bytes: p.bytes,
                })
                .collect(),
            satisfied: report
                .satisfied
                .into_iter()
                .map(|p| SatisfiedPackage {
                    name: p.name,
                    version: p.version,
                })
                .collect(),
        }
    }
}

/// Where a line of output went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// One line an instruction printed (without its newline).
#[derive(Debug, Clone, uniffi::Record)]
pub struct OutputChunk {
    pub seq: i64,
    pub stream: OutputStream,
    pub data: String,
}

impl From<evervm::OutputChunk> for OutputChunk {
    fn from(c: evervm::OutputChunk) -> Self {
        Self {
            seq: c.seq,
            stream: match c.stream {
                evervm::OutputStream::Stdout => OutputStream::Stdout,
                evervm::OutputStream::Stderr => OutputStream::Stderr,
            },
            data: c.data,
        }
    }
}

/// How a rich result came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum RichKind {
    /// Shown with `display(obj)`.
    Display,
    /// A matplotlib figure.
    Figure,
    /// The last expression's value, when it has more than text (a DataFrame's HTML).
    Value,
}

/// A rich result: a MIME bundle, as Jupyter's display protocol has it.
#[derive(Debug, Clone, uniffi::Record)]
pub struct RichResult {
    pub kind: RichKind,
    /// `text/plain`.
    pub text: Option<String>,
    /// `text/html`.
    pub html: Option<String>,
    /// `image/png`, decoded.
    pub png: Option<Vec<u8>>,
    /// The whole bundle as JSON: MIME type to representation (base64 for images).
    pub bundle_json: String,
}

impl From<evervm::RichResult> for RichResult {
    fn from(r: evervm::RichResult) -> Self {
        Self {
            kind: match r.kind {
                evervm::RichKind::Display => RichKind::Display,
                evervm::RichKind::Figure => RichKind::Figure,
                evervm::RichKind::Value => RichKind::Value,
            },
            text: r.text().map(str::to_owned),
            html: r.html().map(str::to_owned),
            png: r.png(),
            bundle_json: serde_json::Value::Object(r.data).to_string(),
        }
    }
}

/// The exception an instruction raised, as data taken from the exception object.
#[derive(Debug, Clone, uniffi::Record)]
pub struct ExceptionInfo {
    /// The class's `__name__`: `ZeroDivisionError`.
    pub name: String,
    /// The class's `__qualname__`: `run.<locals>.FinalAnswer` for a class defined in a function.
    pub qualname: String,
    /// The class's `__module__`: `builtins`, `json.decoder`, `__main__`.
    pub module: String,
    /// `str(exc)`.
    pub value: String,
}

impl From<evervm::ExceptionInfo> for ExceptionInfo {
    fn from(e: evervm::ExceptionInfo) -> Self {
        Self {
            name: e.name,
            qualname: e.qualname,
            module: e.module,
            value: e.value,
        }
    }
}

/// How an instruction ended, with everything it printed.
#[derive(Debug, Clone, uniffi::Record)]
pub struct ExecResult {
    /// Its number on the machine, from 0.
    pub seq: i64,
    /// The `repr` of the last expression (nil for statements, `None` and errors).
    pub value: Option<String>,
    /// The traceback or reason, when it failed.
    pub error: Option<String>,
    /// The exception the code raised, as data (nil when it raised none); `error` holds its
    /// traceback.
    pub exception: Option<ExceptionInfo>,
    /// True when it ran out of time (the machine's state is kept).
    pub timed_out: bool,
    /// Every line printed, in order.
    pub output: Vec<OutputChunk>,
    /// What went to stdout, a line per line.
    pub stdout: String,
    pub stderr: String,
    /// Rich results, in order: displayed, then the value's, then figures left open.
    pub results: Vec<RichResult>,
    /// The last figure as PNG (ForeverVM's `data.png`).
    pub png: Option<Vec<u8>>,
    pub runtime_ms: u64,
}

impl From<evervm::Execution> for ExecResult {
    fn from(run: evervm::Execution) -> Self {
        let stdout = run.stdout();
        let stderr = run.stderr();
        let result = run.result;
        let timed_out = result.timed_out();
        // The last figure; from a server without rich results, ForeverVM's `data.png`.
        let png = result
            .results
            .iter()
            .rev()
            .find_map(evervm::RichResult::png)
            .or_else(|| {
                use base64::Engine as _;
                let encoded = result.data.as_ref()?.get("png")?.as_str()?;
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .ok()
            });
        Self {
            seq: run.seq,
            value: result.value,
            error: result.error,
            exception: result.exception.map(Into::into),
            timed_out,
            output: run.output.into_iter().map(Into::into).collect(),
            stdout,
            stderr,
            results: result.results.into_iter().map(Into::into).collect(),
            png,
            runtime_ms: result.runtime_ms,
        }
    }
}

/// What a stream gives: output as it comes, rich results as they are shown, then the result.
#[derive(Debug, Clone, uniffi::Enum)]
pub enum ExecEvent {
    Output { chunk: OutputChunk },
    Rich { result: RichResult },
    Finished { result: ExecResult },
}

/// A named, kept snapshot of a machine.
#[derive(Debug, Clone, uniffi::Record)]
pub struct Checkpoint {
    pub name: String,
    pub created_at: SystemTime,
    /// The machine's instruction count when it was taken.
    pub instruction_count: i64,
    pub disk_bytes: u64,
}

impl From<evervm::CheckpointInfo> for Checkpoint {
    fn from(c: evervm::CheckpointInfo) -> Self {
        Self {
            name: c.name,
            created_at: time(c.created_at),
            instruction_count: c.instruction_count,
            disk_bytes: c.disk_bytes,
        }
    }
}

/// One of a machine's interpreters (a code context): `default`, or one made by
/// `createContext`, with globals and a working directory of its own, sharing the machine's
/// files, packages and environment.
#[derive(Debug, Clone, uniffi::Record)]
pub struct Context {
    /// `default`, or the id the machine gave it (pass it as `exec`'s `context`).
    pub id: String,
    /// The working directory it was made with.
    pub cwd: String,
    /// Its interpreter's process id in the machine; nil while it is not running (it starts
    /// again with its next instruction, its variables gone).
    pub pid: Option<u32>,
}

impl From<evervm::ContextInfo> for Context {
    fn from(c: evervm::ContextInfo) -> Self {
        Self {
            id: c.id,
            cwd: c.cwd,
            pid: c.pid,
        }
    }
}

/// What a rewind (`rewind`, `undo`) did.
#[derive(Debug, Clone, uniffi::Record)]
pub struct Rewound {
    /// The undo point the machine is at now: the state after instruction `to` (-1: before its
    /// first instruction).
    pub to: i64,
    /// How many instructions it marked rewound.
    pub rewound: i64,
}

impl From<evervm::Rewound> for Rewound {
    fn from(r: evervm::Rewound) -> Self {
        Self {
            to: r.to,
            rewound: r.rewound,
        }
    }
}

/// One instruction in a machine's history.
#[derive(Debug, Clone, uniffi::Record)]
pub struct HistoryEntry {
    pub seq: i64,
    pub code: String,
    /// Its value (the `repr` of its last expression), shortened; nil for none.
    pub value: Option<String>,
    /// Its error's last line (`ZeroDivisionError: division by zero`), shortened.
    pub error: Option<String>,
    /// False while it runs or waits.
    pub finished: bool,
    /// Taken back by a rewind or a rollback (it stays in the history).
    pub rewound: bool,
    /// Whether an undo point for the state after it is kept (`rewind` to its seq).
    pub undo_point: bool,
}

impl From<evervm::HistoryEntry> for HistoryEntry {
    fn from(e: evervm::HistoryEntry) -> Self {
        Self {
            seq: e.seq,
            code: e.code,
            value: e.value,
            error: e.error,
            finished: e.finished,
            rewound: e.rewound,
            undo_point: e.undo_point,
        }
    }
}

/// A machine's history: its latest instructions and which of them can be rewound to.
#[derive(Debug, Clone, uniffi::Record)]
pub struct MachineHistory {
    /// How many undo points the machine keeps (0: none).
    pub keeps: u32,
    /// Whether the state before its first instruction is kept (an undo of that instruction).
    pub initial_point: bool,
    /// Oldest first.
    pub instructions: Vec<HistoryEntry>,
}

impl From<evervm::MachineHistory> for MachineHistory {
    fn from(h: evervm::MachineHistory) -> Self {
        Self {
            keeps: h.keeps,
            initial_point: h.initial_point,
            instructions: h.instructions.into_iter().map(Into::into).collect(),
        }
    }
}

/// A checkpoint in a lineage: its name and the instruction count when it was taken.
#[derive(Debug, Clone, uniffi::Record)]
pub struct LineageCheckpoint {
    pub name: String,
    pub instruction_count: i64,
}

/// Consecutive instructions taken back by one rewind or rollback.
#[derive(Debug, Clone, uniffi::Record)]
pub struct TakenBack {
    /// The first and last seq taken back.
    pub first: i64,
    pub last: i64,
    /// What took them back: `rewind to N` or a checkpoint's name.
    pub by: String,
}

/// One machine in a lineage.
#[derive(Debug, Clone, uniffi::Record)]
pub struct LineageNode {
    pub name: String,
    pub created_at: SystemTime,
    /// The machine it was forked from; nil for the root. A parent deleted since is named here
    /// but not in the tree.
    pub parent: Option<String>,
    /// The parent's last instruction the fork holds (-1: none).
    pub forked_at: Option<i64>,
    pub instruction_count: i64,
    /// Its checkpoints, with the instruction count when each was taken.
    pub checkpoints: Vec<LineageCheckpoint>,
    /// The runs of its instructions that a rewind or rollback took back.
    pub taken_back: Vec<TakenBack>,
}

impl From<evervm::LineageNode> for LineageNode {
    fn from(m: evervm::LineageNode) -> Self {
        Self {
            name: m.name,
            created_at: time(m.created_at),
            parent: m.parent,
            forked_at: m.forked_at,
            instruction_count: m.instruction_count,
            checkpoints: m
                .checkpoints
                .into_iter()
                .map(|c| LineageCheckpoint {
                    name: c.name,
                    instruction_count: c.instruction_count,
                })
                .collect(),
            taken_back: m
                .taken_back
                .into_iter()
                .map(|t| TakenBack {
                    first: t.first,
                    last: t.last,
                    by: t.by,
                })
                .collect(),
        }
    }
}

/// A machine's family tree of forks: its oldest ancestor still there and every machine forked
/// from it since.
#[derive(Debug, Clone, uniffi::Record)]
pub struct Lineage {
    /// The oldest ancestor (the machine itself when it was not forked).
    pub root: String,
    /// Every machine of the tree, parents before their children.
    pub machines: Vec<LineageNode>,
}

impl From<evervm::Lineage> for Lineage {
    fn from(l: evervm::Lineage) -> Self {
        Self {
            root: l.root,
            machines: l.machines.into_iter().map(Into::into).collect(),
        }
    }
}

/// What a path in a machine names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// A file or directory in a machine.
#[derive(Debug, Clone, uniffi::Record)]
pub struct FileInfo {
    /// Its absolute path in the machine.
    pub path: String,
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`0o644` is 420).
    pub mode: u32,
    pub modified_at: Option<SystemTime>,
    /// Where a symlink leads, resolved: for `stat` of a path that is one, and for a listing's
    /// entries of kind `symlink`.
    pub symlink_target: Option<String>,
}

impl From<evervm::FileInfo> for FileInfo {
    fn from(f: evervm::FileInfo) -> Self {
        Self {
            path: f.path,
            name: f.name,
            kind: match f.kind {
                evervm::FileKind::File => FileKind::File,
                evervm::FileKind::Directory => FileKind::Directory,
                evervm::FileKind::Symlink => FileKind::Symlink,
                evervm::FileKind::Other => FileKind::Other,
            },
            size: f.size,
            mode: f.mode,
            modified_at: f.modified_at.map(time),
            symlink_target: f.symlink_target,
        }
    }
}

/// A directory's entries.
#[derive(Debug, Clone, uniffi::Record)]
pub struct FileList {
    pub directory: FileInfo,
    pub entries: Vec<FileInfo>,
    /// True when it holds more than a listing returns.
    pub truncated: bool,
}

impl From<evervm::FileList> for FileList {
    fn from(l: evervm::FileList) -> Self {
        Self {
            directory: l.directory.into(),
            entries: l.entries.into_iter().map(Into::into).collect(),
            truncated: l.truncated,
        }
    }
}
