//! What calls take and return, as plain JS objects (camelCase): conversions of the client's types.

use std::collections::HashMap;

use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Bytes and counts as JS numbers (exact below 2^53).
fn number(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `Client.local()`'s options.
#[napi(object)]
#[derive(Default)]
pub struct LocalOptions {
    /// The engine's home (default: `$EVERVM_HOME` or `~/.local/share/evervm`).
    pub home: Option<String>,
    /// The sandbox backend: `auto` (default), `gvisor` or `process`.
    pub backend: Option<String>,
    /// The account machines belong to (default `local`).
    pub account: Option<String>,
    /// Ready sandboxes to keep (default: the engine's, `EVERVM_POOL_SIZE` or 2).
    pub pool_size: Option<u32>,
}

/// A new machine's options.
#[napi(object)]
#[derive(Default)]
pub struct CreateMachineOptions {
    pub tags: Option<HashMap<String, String>>,
    /// Its memory limit in MiB (the server's default when absent).
    pub memory_mb: Option<u32>,
    /// `data` (numpy, pandas, matplotlib, requests, ...; the default) or `minimal`.
    pub image: Option<String>,
    /// `idle` (default: saved at swap-out) or `instruction` (saved after every instruction).
    pub durability: Option<String>,
    /// How many undo points it keeps, to `undo` or `rewind` to (the server's default, 0, when
    /// absent); gVisor only.
    pub history: Option<u32>,
    /// Environment variables its interpreter starts with.
    pub env: Option<HashMap<String, String>>,
    /// Environment variables whose values `info` and lists never show.
    pub secret_env: Option<HashMap<String, String>>,
    /// Deleted this many seconds after its creation.
    pub ttl_seconds: Option<f64>,
    /// What it may reach: `'none'` (the server's default unless it says otherwise), `'public'`,
    /// or a list of names (`*.` wildcards) and IPv4 blocks, within the server's maximum.
    #[napi(ts_type = "'none' | 'public' | string[]")]
    pub network: Option<napi::Either<String, Vec<String>>>,
}

/// One instruction's options.
#[napi(object)]
#[derive(Default)]
pub struct ExecOptions {
    /// Seconds before it is interrupted (default 15).
    pub timeout_seconds: Option<f64>,
    /// Interrupt what runs or waits on the machine first.
    pub interrupt: Option<bool>,
    /// How the code runs: `'python'` (a REPL line, the default), `'jupyter'` (a Jupyter cell,
    /// IPython's shell) or `'e2b'` (a Jupyter cell with E2B's formatters).
    #[napi(ts_type = "'python' | 'jupyter' | 'e2b'")]
    pub dialect: Option<String>,
    /// Which of the machine's interpreters runs it: a context's `id` from `createContext`
    /// (absent: the machine's own, `default`). An unknown id ends the instruction with the
    /// exception `ContextNotFound`.
    pub context: Option<String>,
}

/// A file write's options.
#[napi(object)]
#[derive(Default)]
pub struct WriteOptions {
    /// Permission bits (`0o600`); those of the file replaced, or `0o644`.
    pub mode: Option<u32>,
    /// Make missing parent directories.
    pub parents: Option<bool>,
}

/// One line of output, without its newline.
#[napi(object)]
pub struct OutputChunk {
    /// Always `"output"`.
    #[napi(js_name = "type", ts_type = "'output'")]
    pub event: String,
    /// Its number within the instruction, from 0 (rich results shown take numbers too).
    pub seq: i64,
    /// `"stdout"` or `"stderr"`.
    #[napi(ts_type = "'stdout' | 'stderr'")]
    pub stream: String,
    pub data: String,
}

impl From<evervm::OutputChunk> for OutputChunk {
    fn from(c: evervm::OutputChunk) -> Self {
        Self {
            event: "output".into(),
            seq: c.seq,
            stream: c.stream.as_str().into(),
            data: c.data,
        }
    }
}

/// A rich result (Jupyter's display protocol): a MIME bundle.
#[napi(object)]
pub struct RichResult {
    /// Always `"rich"`.
    #[napi(js_name = "type", ts_type = "'rich'")]
    pub event: String,
    /// `display` (shown by `display(obj)`), `figure` (a matplotlib figure) or `value` (the last
    /// expression's value).
    #[napi(ts_type = "'display' | 'figure' | 'value'")]
    pub kind: String,
    /// MIME type to representation: text, base64 for images, JSON values for JSON types.
    pub data: serde_json::Map<String, serde_json::Value>,
    /// `text/plain`.
    pub text: Option<String>,
    /// `text/html` (a pandas DataFrame's table, say).
    pub html: Option<String>,
    /// `image/png`, decoded.
    pub png: Option<Buffer>,
}

impl From<evervm::RichResult> for RichResult {
    fn from(r: evervm::RichResult) -> Self {
        Self {
            event: "rich".into(),
            kind: r.kind.as_str().into(),
            text: r.text().map(str::to_owned),
            html: r.html().map(str::to_owned),
            png: r.png().map(Buffer::from),
            data: r.data,
        }
    }
}

/// ForeverVM's rich output: the last figure.
#[napi(object)]
pub struct ExecData {
    /// The PNG, decoded.
    pub png: Option<Buffer>,
}

/// The exception an instruction raised, as data taken from the exception object.
#[napi(object)]
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
#[napi(object)]
pub struct ExecResult {
    /// Always `"result"`.
    #[napi(js_name = "type", ts_type = "'result'")]
    pub event: String,
    /// Its number on the machine, from 0.
    pub seq: i64,
    /// The `repr` of the last expression (absent for statements, `None` values and errors).
    pub value: Option<String>,
    /// The traceback or reason when it failed.
    pub error: Option<String>,
    /// Why it failed: `exception`, `timeout`, `interrupted`, `machine_crashed`,
    /// `limit_exceeded`, `machine_deleted`.
    pub cause: Option<String>,
    /// The exception the code raised, as data (absent when it raised none); `error` holds its
    /// traceback.
    pub exception: Option<ExceptionInfo>,
    /// The last matplotlib figure (ForeverVM's `data`).
    pub data: Option<ExecData>,
    /// The rich results, in order: those shown during the instruction, the value's when it has
    /// more than text, then the figures left open.
    pub results: Vec<RichResult>,
    pub output: Vec<OutputChunk>,
    /// Everything printed to stdout, one line per chunk.
    pub stdout: String,
    pub stderr: String,
    pub runtime_ms: i64,
    pub timed_out: bool,
    /// True when it ended without an error.
    pub ok: bool,
    /// It printed more than the server keeps per instruction; the rest was dropped.
    pub output_truncated: bool,
    /// For machines with `durability: 'instruction'`: whether the state after it is on disk.
    pub saved: Option<bool>,
}

impl From<evervm::Execution> for ExecResult {
    fn from(run: evervm::Execution) -> Self {
        let stdout = run.stdout();
        let stderr = run.stderr();
        let result = run.result;
        let png = result
            .data
            .as_ref()
            .and_then(|d| d.get("png")?.as_str())
            .and_then(|b64| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.decode(b64).ok()
            });
        Self {
            event: "result".into(),
            seq: run.seq,
            timed_out: result.timed_out(),
            ok: !result.is_error(),
            value: result.value,
            error: result.error,
            cause: result.cause.map(|c| c.as_str().to_owned()),
            exception: result.exception.map(ExceptionInfo::from),
            data: result.data.map(|_| ExecData {
                png: png.map(Buffer::from),
            }),
            results: result.results.into_iter().map(RichResult::from).collect(),
            output: run.output.into_iter().map(OutputChunk::from).collect(),
            stdout,
            stderr,
            runtime_ms: number(result.runtime_ms),
            output_truncated: result.output_truncated,
            saved: result.saved,
        }
    }
}

/// What is known about a machine.
#[napi(object)]
pub struct MachineInfo {
    pub name: String,
    /// ISO 8601, UTC.
    pub created_at: String,
    pub tags: HashMap<String, String>,
    /// True while its sandbox is in memory.
    pub running: bool,
    pub has_pending_instruction: bool,
    pub memory_mb: Option<u32>,
    pub image: Option<String>,
    pub backend: Option<String>,
    /// `resident`, `swapped`, `damaged` or `stopped`.
    pub state: Option<String>,
    pub instruction_count: Option<i64>,
    pub last_used_at: Option<String>,
    pub last_error: Option<String>,
    pub disk_bytes: Option<i64>,
    pub resident_bytes: Option<i64>,
    pub durability: Option<String>,
    /// How many undo points it keeps (0: none).
    pub history: Option<u32>,
    /// The machine it was forked from; absent when it was created.
    pub parent: Option<String>,
    /// The seq of the parent's last instruction the fork holds (-1: none).
    pub forked_at: Option<i64>,
    /// Its environment variables that are not secret.
    pub env: HashMap<String, String>,
    /// The names of its secret environment variables (never their values).
    pub secret_env: Vec<String>,
    /// When it is deleted; absent: never.
    pub expires_at: Option<String>,
    /// How its current interpreter began: `booted`, `restored`, `restarted_after_crash`.
    pub interpreter: Option<String>,
    pub interpreter_started_at: Option<String>,
    /// When the snapshot it came from was written.
    pub interpreter_snapshot_at: Option<String>,
    /// What it may reach: `none`, `public` or `allow` (see `networkAllow`).
    #[napi(ts_type = "'none' | 'public' | 'allow'")]
    pub network: Option<String>,
    /// The names and blocks it may reach when `network` is `allow`.
    pub network_allow: Vec<String>,
}

/// A package `install` put into the machine.
#[napi(object)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
    /// The wheel's file name.
    pub wheel: String,
    /// The wheel's sha256, as checked.
    pub sha256: String,
    /// The wheel's size in bytes.
    pub bytes: i64,
}

/// A requirement the machine already satisfied.
#[napi(object)]
pub struct SatisfiedPackage {
    pub name: String,
    pub version: String,
}

/// What `install` did.
#[napi(object)]
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
                    bytes: number(p.bytes),
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

impl From<evervm::MachineInfo> for MachineInfo {
    fn from(m: evervm::MachineInfo) -> Self {
        let (network, network_allow) = evervm::NetworkPolicy::mode_and_rules(m.network.as_ref());
        let interpreter = m.interpreter;
        Self {
            name: m.name,
            created_at: time(m.created_at),
            tags: m.tags.into_iter().collect(),
            running: m.running,
            has_pending_instruction: m.has_pending_instruction,
            memory_mb: m.memory_mb,
            image: m.image,
            backend: m.backend,
            state: m.state,
            instruction_count: m.instruction_count,
            last_used_at: m.last_used_at.map(time),
            last_error: m.last_error,
            disk_bytes: m.disk_bytes.map(number),
            resident_bytes: m.resident_bytes.map(number),
            durability: m.durability,
            history: m.history,
            parent: m.parent,
            forked_at: m.forked_at,
            env: m.env.into_iter().collect(),
            secret_env: m.secret_env,
            expires_at: m.expires_at.map(time),
            interpreter: interpreter.as_ref().map(|i| i.began.clone()),
            interpreter_started_at: interpreter.as_ref().map(|i| time(i.started_at)),
            interpreter_snapshot_at: interpreter.and_then(|i| i.snapshot_at).map(time),
            network,
            network_allow,
        }
    }
}

/// A named, kept snapshot of a machine.
#[napi(object)]
pub struct Checkpoint {
    pub name: String,
    pub created_at: String,
    /// The machine's instruction count when it was taken.
    pub instruction_count: i64,
    pub disk_bytes: i64,
}

impl From<evervm::CheckpointInfo> for Checkpoint {
    fn from(c: evervm::CheckpointInfo) -> Self {
        Self {
            name: c.name,
            created_at: time(c.created_at),
            instruction_count: c.instruction_count,
            disk_bytes: number(c.disk_bytes),
        }
    }
}

/// One of a machine's interpreters (a code context): `default`, or one made by
/// `createContext`, with globals and a working directory of its own, sharing the machine's
/// files, packages and environment.
#[napi(object)]
pub struct Context {
    /// `default`, or the id the machine gave it (pass it as `exec`'s `context`).
    pub id: String,
    /// The working directory it was made with.
    pub cwd: String,
    /// Its interpreter's process id in the machine; absent while it is not running (it starts
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
#[napi(object)]
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
#[napi(object)]
pub struct HistoryEntry {
    pub seq: i64,
    pub code: String,
    /// Its value (the `repr` of its last expression), shortened; absent for none.
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
#[napi(object)]
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
#[napi(object)]
pub struct LineageCheckpoint {
    pub name: String,
    pub instruction_count: i64,
}

/// Consecutive instructions taken back by one rewind or rollback.
#[napi(object)]
pub struct TakenBack {
    /// The first and last seq taken back.
    pub first: i64,
    pub last: i64,
    /// What took them back: `rewind to N` or a checkpoint's name.
    pub by: String,
}

/// One machine in a lineage.
#[napi(object)]
pub struct LineageNode {
    pub name: String,
    /// ISO 8601, UTC.
    pub created_at: String,
    /// The machine it was forked from; absent for the root. A parent deleted since is named
    /// here but not in the tree.
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
#[napi(object)]
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

/// A file or directory in a machine.
#[napi(object)]
#[derive(Clone)]
pub struct FileInfo {
    /// Its absolute path in the machine.
    pub path: String,
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    pub size: i64,
    /// Permission bits.
    pub mode: u32,
    pub modified_at: Option<String>,
    /// Where a symlink leads, resolved: for `stat` of a path that is one, and for a listing's
    /// entries of kind `symlink`.
    pub symlink_target: Option<String>,
}

impl From<evervm::FileInfo> for FileInfo {
    fn from(f: evervm::FileInfo) -> Self {
        Self {
            path: f.path,
            name: f.name,
            kind: f.kind.as_str().into(),
            size: number(f.size),
            mode: f.mode,
            modified_at: f.modified_at.map(time),
            symlink_target: f.symlink_target,
        }
    }
}

/// A directory's entries, by name.
#[napi(object)]
pub struct FileList {
    pub directory: FileInfo,
    pub entries: Vec<FileInfo>,
    /// There were more than the server lists (10,000).
    pub truncated: bool,
}

impl From<evervm::FileList> for FileList {
    fn from(l: evervm::FileList) -> Self {
        Self {
            directory: l.directory.into(),
            entries: l.entries.into_iter().map(FileInfo::from).collect(),
            truncated: l.truncated,
        }
    }
}

/// The Python tool's name and descriptions, written for a model.
#[napi(object)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// What the `code` argument is.
    pub code_description: String,
}
