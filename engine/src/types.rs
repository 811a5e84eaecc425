//! The engine's domain types. Wire formats live in `core`; nothing here knows about JSON field
//! names kept for compatibility.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Tags: string keys and values set at creation. A list filter matches a machine when every
/// given pair is present on it.
pub type Tags = BTreeMap<String, String>;

/// Largest instruction accepted, in bytes of source code.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
/// Default instruction timeout, as in every ForeverVM client.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest timeout an instruction may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// Smallest and largest `memory_mb` accepted.
pub const MIN_MEMORY_MB: u32 = 64;
pub const MAX_MEMORY_MB: u32 = 64 * 1024;
/// Tag limits.
pub const MAX_TAGS: usize = 64;
pub const MAX_TAG_KEY_BYTES: usize = 128;
pub const MAX_TAG_VALUE_BYTES: usize = 1024;

/// Checks tags for the rules every surface shares: at most [`MAX_TAGS`] pairs; keys are 1 to
/// [`MAX_TAG_KEY_BYTES`] bytes of ASCII letters, digits, `_`, `-`, `.`, `/` or `:`; values are at
/// most [`MAX_TAG_VALUE_BYTES`] bytes with no control characters.
pub fn validate_tags(tags: &Tags) -> Result<()> {
    if tags.len() > MAX_TAGS {
        return Err(Error::invalid(format!(
            "too many tags: {} (at most {MAX_TAGS})",
            tags.len()
        )));
    }
    for (key, value) in tags {
        validate_tag_key(key)?;
        if value.len() > MAX_TAG_VALUE_BYTES {
            return Err(Error::invalid(format!(
                "tag {key:?}: value is {} bytes (at most {MAX_TAG_VALUE_BYTES})",
                value.len()
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "tag {key:?}: value contains a control character"
            )));
        }
    }
    Ok(())
}

fn validate_tag_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("tag key is empty"));
    }
    if key.len() > MAX_TAG_KEY_BYTES {
        return Err(Error::invalid(format!(
            "tag key {key:?} is {} bytes (at most {MAX_TAG_KEY_BYTES})",
            key.len()
        )));
    }
    if let Some(bad) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':')))
    {
        return Err(Error::invalid(format!(
            "tag key {key:?} contains {bad:?}: keys use letters, digits, '_', '-', '.', '/', ':'"
        )));
    }
    Ok(())
}

/// A machine's environment variables, set at creation.
pub type Env = BTreeMap<String, EnvVar>;

/// One environment variable. A secret's value reaches the machine's interpreter and the store,
/// never `info`, lists or logs.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    pub value: String,
    #[serde(default)]
    pub secret: bool,
}

impl fmt::Debug for EnvVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value: &dyn fmt::Debug = if self.secret {
            &"<secret>"
        } else {
            &self.value
        };
        f.debug_struct("EnvVar")
            .field("value", value)
            .field("secret", &self.secret)
            .finish()
    }
}

/// Environment limits.
pub const MAX_ENV_VARS: usize = 128;
pub const MAX_ENV_NAME_BYTES: usize = 256;
pub const MAX_ENV_BYTES: usize = 256 * 1024;

/// Checks a machine's environment: at most [`MAX_ENV_VARS`] variables of at most
/// [`MAX_ENV_BYTES`] together; names are 1 to [`MAX_ENV_NAME_BYTES`] bytes of ASCII letters,
/// digits and `_`, not starting with a digit; values have no NUL. A secret's value is never
/// named in the error.
pub fn validate_env(env: &Env) -> Result<()> {
    if env.len() > MAX_ENV_VARS {
        return Err(Error::invalid(format!(
            "too many environment variables: {} (at most {MAX_ENV_VARS})",
            env.len()
        )));
    }
    let total: usize = env.iter().map(|(k, v)| k.len() + v.value.len()).sum();
    if total > MAX_ENV_BYTES {
        return Err(Error::invalid(format!(
            "the environment is {total} bytes (at most {MAX_ENV_BYTES})"
        )));
    }
    for (name, var) in env {
        let valid = !name.is_empty()
            && name.len() <= MAX_ENV_NAME_BYTES
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(Error::invalid(format!(
                "environment variable name {name:?}: names are letters, digits and '_', not \
                 starting with a digit"
            )));
        }
        if var.value.contains('\0') {
            return Err(Error::invalid(format!(
                "environment variable {name}: the value contains a NUL character"
            )));
        }
    }
    Ok(())
}

/// Parses `KEY=VALUE` (the CLI's `--tag` syntax).
pub fn parse_tag(text: &str) -> Result<(String, String)> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(Error::invalid(format!(
            "tag {text:?} has no '=': write tags as KEY=VALUE"
        )));
    };
    validate_tag_key(key)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// A machine's name: 1 to 64 characters of `[A-Za-z0-9_-]`, never the reserved word `new`.
/// Generated names are 16 characters of `[a-z0-9]` (about 82 bits), which makes them valid DNS
/// labels too (E2B's sandbox ids, `<port>-<id>.<domain>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MachineName(String);

impl MachineName {
    pub fn parse(name: &str) -> Result<Self> {
        let ok_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if name.is_empty() || name.len() > 64 || !ok_chars || name == "new" {
            return Err(Error::machine_not_found(name));
        }
        Ok(Self(name.to_owned()))
    }

    #[cfg(feature = "runtime")]
    pub(crate) fn generate() -> Self {
        use rand::Rng;
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::rng();
        let name: String = (0..16)
            .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
            .collect();
        Self(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MachineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An account: machines belong to exactly one and are invisible to others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: i64,
    pub name: String,
}

/// A token as `evervm token list` shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// The part of the token before the `.`: what `evervm token revoke` takes.
    pub id: String,
    pub account: String,
    pub created_at: DateTime<Utc>,
    /// When it stops working; `None`: never.
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a new machine should look like.
#[derive(Debug, Clone, Default)]
pub struct CreateMachine {
    pub tags: Tags,
    /// Memory limit in MiB; the engine's default when `None`.
    pub memory_mb: Option<u32>,
    /// The image profile (`minimal`, `data`); the engine's default (`data`, see
    /// [`crate::EngineConfig::default_image`]) when `None`. The process backend runs the host's
    /// Python whatever the profile.
    pub image: Option<String>,
    /// When the machine's state is saved to disk; `idle` when `None`.
    pub durability: Option<Durability>,
    /// Environment variables its interpreter starts with (kept across swap, restart and fork).
    pub env: Env,
    /// When the machine is deleted (`None`: never). At most [`MAX_LIFETIME`] from now.
    pub expires_at: Option<DateTime<Utc>>,
    /// What it may reach over the network; the engine's default when `None`. Refused when more
    /// than the engine allows.
    pub network: Option<crate::network::NetworkPolicy>,
    /// How many undo points it keeps (a snapshot after each of its latest instructions, to
    /// rewind to); the engine's default when `None` (`EVERVM_HISTORY`, 0: none), at most the
    /// engine's maximum.
    pub history: Option<u32>,
}

/// The longest a machine may be given to live with an expiry.
pub const MAX_LIFETIME: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// The most machines one page of a list holds.
pub const MAX_PAGE: usize = 1000;

/// Where a page of a list starts: after the machine an earlier page ended with. Opaque to
/// callers; stable while machines are created and deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListCursor(pub(crate) i64);

impl ListCursor {
    /// The text form callers pass back.
    pub fn encode(self) -> String {
        format!("m{}", self.0)
    }

    pub fn parse(text: &str) -> Result<Self> {
        text.strip_prefix('m')
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|n| *n > 0)
            .map(ListCursor)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "cursor {text:?} is not one a list returned: pass `next_cursor` back as it \
                     came"
                ))
            })
    }
}

/// One page of machines, newest first, and where the next page starts (`None`: this was the
/// last).
#[derive(Debug, Clone)]
pub struct MachinePage {
    pub machines: Vec<MachineInfo>,
    pub next_cursor: Option<ListCursor>,
}

/// How a machine's current (or last) interpreter began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterpreterStart {
    /// A fresh interpreter (the machine's first, or one after a restart without a snapshot).
    Booted,
    /// From the machine's snapshot, written at `snapshot_at`.
    Restored { snapshot_at: DateTime<Utc> },
    /// After its sandbox ended abnormally (a crash, an out-of-memory kill, an instruction that
    /// ignored its timeout, an engine that stopped without saving it): from its snapshot of
    /// `snapshot_at`, or fresh when it had none.
    RestartedAfterCrash { snapshot_at: Option<DateTime<Utc>> },
}

impl InterpreterStart {
    pub fn as_str(self) -> &'static str {
        match self {
            InterpreterStart::Booted => "booted",
            InterpreterStart::Restored { .. } => "restored",
            InterpreterStart::RestartedAfterCrash { .. } => "restarted_after_crash",
        }
    }

    /// The snapshot it came from, if any.
    pub fn snapshot_at(self) -> Option<DateTime<Utc>> {
        match self {
            InterpreterStart::Booted => None,
            InterpreterStart::Restored { snapshot_at } => Some(snapshot_at),
            InterpreterStart::RestartedAfterCrash { snapshot_at } => snapshot_at,
        }
    }
}

/// What a fork of a machine gets.
#[derive(Debug, Clone, Default)]
pub struct ForkMachine {
    /// The fork's tags; the parent's when `None`.
    pub tags: Option<Tags>,
    /// Fork from the parent's undo point after this instruction (`-1`: before its first)
    /// instead of its current state; the parent is not touched.
    pub at: Option<i64>,
}

/// What a rewind did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Rewound {
    /// The undo point the machine is at now: the state after instruction `to` (`-1`: before
    /// its first instruction).
    pub to: i64,
    /// How many instructions it marked rewound.
    pub rewound: i64,
}

/// One instruction in a machine's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HistoryEntry {
    pub seq: i64,
    pub code: String,
    /// Its value (the `repr` of its last expression), shortened; `None` for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Its error's last line (`ZeroDivisionError: division by zero`), shortened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// False while it runs or waits.
    pub finished: bool,
    /// Taken back by a rewind or a rollback (it stays in the history).
    pub rewound: bool,
    /// Whether an undo point for the state after it is kept (`rewind` to its seq).
    pub undo_point: bool,
}

/// A machine's history: its latest instructions and which of them can be rewound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MachineHistory {
    /// How many undo points the machine keeps (0: none).
    pub keeps: u32,
    /// Whether the state before its first instruction is kept (an undo of that instruction).
    pub initial_point: bool,
    /// Oldest first.
    pub instructions: Vec<HistoryEntry>,
}

/// A machine's family: the machine a lineage was asked for, its ancestors up to the first
/// that was created rather than forked, and every machine forked from them since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Lineage {
    /// The oldest ancestor (the tree's root; the machine itself when it was not forked).
    pub root: String,
    /// Every machine of the tree, parents before their children.
    pub machines: Vec<LineageNode>,
}

/// One machine in a [`Lineage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LineageNode {
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The machine it was forked from; `None` for the root. A parent deleted since is named
    /// here but not in the tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The parent's last instruction the fork holds (-1: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_at: Option<i64>,
    pub instruction_count: i64,
    /// Its checkpoints: name and the instruction count when it was taken.
    pub checkpoints: Vec<LineageCheckpoint>,
    /// The runs of its instructions that a rewind or rollback took back.
    pub taken_back: Vec<TakenBack>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LineageCheckpoint {
    pub name: String,
    pub instruction_count: i64,
}

/// Consecutive instructions taken back by one rewind or rollback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TakenBack {
    /// The first and last seq taken back.
    pub first: i64,
    pub last: i64,
    /// What took them back: `rewind to N` or a checkpoint's name.
    pub by: String,
}

/// When a machine's state is saved to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// At swap-out, at checkpoints and at a graceful engine stop: a crash of the engine or the
    /// host can lose what happened since the last of these.
    #[default]
    Idle,
    /// Also after every instruction, before its result is reported: a crash never loses an
    /// acknowledged instruction's state. Costs a checkpoint and a restore per instruction.
    Instruction,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Idle => "idle",
            Durability::Instruction => "instruction",
        }
    }

    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "idle" => Ok(Durability::Idle),
            "instruction" => Ok(Durability::Instruction),
            other => Err(Error::invalid(format!(
                "unknown durability {other:?}: use `idle` or `instruction`"
            ))),
        }
    }
}

/// A named, kept snapshot of a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The machine's instruction count when it was taken: rolling back marks instructions from
    /// this seq on as rolled back.
    pub instruction_count: i64,
    pub disk_bytes: u64,
}

/// Checks a checkpoint name: 1 to 64 letters, digits, `_`, `-` or `.`, not starting with `.`.
pub fn validate_checkpoint_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "checkpoint name {name:?} must be 1 to 64 letters, digits, '_', '-' or '.' (not \
             starting with '.')"
        )))
    }
}

/// Where a machine is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    /// Its sandbox is running and holds the interpreter.
    Resident,
    /// Saved to disk, no sandbox: the next instruction restores it.
    Swapped,
    /// Its snapshot cannot be used (the reason is in `last_error`); it can still be deleted or
    /// rolled back to a checkpoint.
    Damaged,
    /// No sandbox yet or any more; the next instruction starts one. On a backend without
    /// snapshots a fresh interpreter is started and earlier state is gone.
    Stopped,
}

impl MachineState {
    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Resident => "resident",
            MachineState::Swapped => "swapped",
            MachineState::Damaged => "damaged",
            MachineState::Stopped => "stopped",
        }
    }
}

/// Everything the engine knows about a machine.
#[derive(Debug, Clone)]
pub struct MachineInfo {
    pub name: MachineName,
    pub created_at: DateTime<Utc>,
    pub tags: Tags,
    pub memory_mb: u32,
    /// The image profile (`minimal`, `data`).
    pub image: String,
    /// The sandbox backend the machine runs on (`process`, `gvisor`).
    pub backend: String,
    pub state: MachineState,
    /// True while an instruction is queued or running.
    pub has_pending_instruction: bool,
    /// Instructions accepted so far (the next one gets this number as its seq).
    pub instruction_count: i64,
    pub last_used_at: Option<DateTime<Utc>>,
    /// Why the last sandbox ended abnormally, if it did.
    pub last_error: Option<String>,
    /// Bytes of the machine's snapshot and checkpoints on disk (0 without any).
    pub disk_bytes: u64,
    /// Memory its sandbox holds now (proportional set size of the sandbox's processes); 0 when
    /// not resident.
    pub resident_bytes: u64,
    pub durability: Durability,
    /// How many undo points it keeps (0: none).
    pub history: u32,
    /// The machine it was forked from, and the seq of that machine's last instruction in the
    /// fork (-1: none); `None` when it was created, not forked.
    pub parent: Option<String>,
    pub forked_at: Option<i64>,
    /// Its environment variables that are not secret, with their values.
    pub env: BTreeMap<String, String>,
    /// The names of its secret environment variables (never their values).
    pub secret_env: Vec<String>,
    /// When it is deleted (`None`: never).
    pub expires_at: Option<DateTime<Utc>>,
    /// What it may reach over the network.
    pub network: crate::network::NetworkPolicy,
    /// How its current interpreter (or its last, when it is not resident) began; `None` before
    /// its first start under this engine.
    pub interpreter: Option<InterpreterStart>,
    /// When that interpreter began.
    pub interpreter_started_at: Option<DateTime<Utc>>,
}

/// One instruction to run.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub code: String,
    pub timeout: Duration,
    /// Interrupt whatever is queued or running on the machine before this one.
    pub interrupt: bool,
    /// How the code is run: a REPL line (the default) or a Jupyter cell.
    pub dialect: Dialect,
    /// Which of the machine's interpreters runs it: `None` (or [`DEFAULT_CONTEXT`]) the
    /// machine's own, else a context made by `create_context`.
    pub context: Option<String>,
}

/// The context every machine has: its own interpreter.
pub const DEFAULT_CONTEXT: &str = "default";
/// The longest context id.
pub const MAX_CONTEXT_ID_BYTES: usize = 64;
/// The longest working directory a caller may give a context, in characters.
pub const MAX_CONTEXT_CWD_CHARS: usize = 1024;
/// The longest working directory of a context the machine may report, in bytes (UTF-8: up to
/// 4 per character).
pub const MAX_CONTEXT_CWD_BYTES: usize = 4 * MAX_CONTEXT_CWD_CHARS;

/// One of a machine's interpreters: the default (the machine's own) or a context made by
/// `create_context`, with globals and a working directory of its own, sharing the machine's
/// files, packages and environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(rename = "Context")
)]
pub struct ContextInfo {
    /// `default`, or the id the machine gave the context.
    pub id: String,
    /// The working directory it was made with.
    pub cwd: String,
    /// Its interpreter's process id in the machine; `None` while it is not running (it starts
    /// again with its next instruction, its variables gone).
    pub pid: Option<u32>,
}

/// Checks a context id: 1 to [`MAX_CONTEXT_ID_BYTES`] ASCII letters, digits, `-` and `_`.
pub fn validate_context_id(id: &str) -> Result<()> {
    if id.is_empty()
        || id.len() > MAX_CONTEXT_ID_BYTES
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Error::invalid(format!(
            "context {:?}: a context id is 1 to {MAX_CONTEXT_ID_BYTES} letters, digits, '-' or '_'",
            id.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

/// How an instruction's code is run. Every dialect shares the machine's one namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Dialect {
    /// A plain Python REPL (ForeverVM's): the value is the last expression's `repr`.
    #[default]
    Python,
    /// A Jupyter cell, run by IPython's own shell as an IPython kernel runs it: magics, shell
    /// escapes, the cell's common indentation removed, IPython's display formatters and
    /// tracebacks. Needs IPython in the image (the `data` image has it).
    Jupyter,
    /// A Jupyter cell with what E2B's code interpreter adds to the kernel (a DataFrame's
    /// columns as `e2b/data`, lists and dicts as JSON, charts as `e2b/chart`): the E2B door's.
    E2b,
}

impl Dialect {
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Python => "python",
            Dialect::Jupyter => "jupyter",
            Dialect::E2b => "e2b",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Dialect::Python, Dialect::Jupyter, Dialect::E2b]
            .into_iter()
            .find(|dialect| dialect.as_str() == text)
    }

    /// The dialect named `text`, or an `InvalidInput` error naming the dialects there are.
    pub fn named(text: &str) -> Result<Self> {
        Self::parse(text).ok_or_else(|| {
            Error::invalid(format!(
                "dialect {text:?}: it is \"python\" (a REPL line), \"jupyter\" (a Jupyter cell) \
                 or \"e2b\" (a Jupyter cell with E2B's formatters)"
            ))
        })
    }

    pub fn is_python(&self) -> bool {
        *self == Dialect::Python
    }
}

impl ExecRequest {
    pub fn new(code: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            timeout: DEFAULT_TIMEOUT,
            interrupt: false,
            dialect: Dialect::Python,
            context: None,
        }
    }

    #[cfg(feature = "runtime")]
    pub(crate) fn validate(&self) -> Result<()> {
        if self.code.len() > MAX_CODE_BYTES {
            return Err(Error::too_large(format!(
                "code is {} bytes, more than the limit of {MAX_CODE_BYTES} bytes",
                self.code.len()
            )));
        }
        if self.code.contains('\0') {
            return Err(Error::invalid("code contains a NUL byte"));
        }
        if let Some(context) = &self.context {
            validate_context_id(context)?;
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(Error::invalid(format!(
                "timeout must be between 1 second and {} seconds",
                MAX_TIMEOUT.as_secs()
            )));
        }
        Ok(())
    }
}

/// What `exec` answers as soon as the instruction is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecAccepted {
    /// The instruction's number on its machine, from 0.
    pub seq: i64,
    /// True if this request interrupted a queued or running instruction.
    pub interrupted: bool,
}

/// Which stream an output chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
    /// A rich result shown during the instruction (`display(obj)`, `plt.show()`), in order with
    /// the output: the chunk's `data` is the [`RichResult`] as JSON (see [`OutputChunk::rich`]).
    Display,
}

impl OutputStream {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
            OutputStream::Display => "display",
        }
    }

    #[cfg(feature = "runtime")]
    pub(crate) fn from_str_opt(s: &str) -> Option<Self> {
        match s {
            "stdout" => Some(OutputStream::Stdout),
            "stderr" => Some(OutputStream::Stderr),
            _ => None,
        }
    }
}

/// What a rich result is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RichKind {
    /// Shown by `display(obj)` during the instruction.
    Display,
    /// A matplotlib figure: shown by `plt.show()`, or still open when the instruction ended.
    Figure,
    /// The last expression's value, when it has a representation beyond text (a pandas
    /// DataFrame's HTML, say).
    Value,
}

impl RichKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RichKind::Display => "display",
            RichKind::Figure => "figure",
            RichKind::Value => "value",
        }
    }

    pub const ALL: [RichKind; 3] = [RichKind::Display, RichKind::Figure, RichKind::Value];

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "display" => Some(RichKind::Display),
            "figure" => Some(RichKind::Figure),
            "value" => Some(RichKind::Value),
            _ => None,
        }
    }
}

/// A rich result, following Jupyter's display protocol: a MIME bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RichResult {
    pub kind: RichKind,
    /// MIME type to representation: text for text types and `image/svg+xml`, base64 for other
    /// images (`image/png`, `image/jpeg`), any JSON value for JSON types (`application/json`).
    /// `text/plain` is always there.
    pub data: serde_json::Map<String, serde_json::Value>,
}

impl RichResult {
    /// Whether a MIME type's representation is any JSON value (the others are text):
    /// `application/json`, `*+json`, and E2B's `e2b/data` and `e2b/chart`.
    pub fn carries_json(mime: &str) -> bool {
        mime == "application/json"
            || mime.ends_with("+json")
            || mime == "e2b/data"
            || mime == "e2b/chart"
    }

    /// About what it takes to keep: the MIME types and their representations.
    pub fn size(&self) -> usize {
        self.data
            .iter()
            .map(|(mime, value)| {
                mime.len()
                    + match value {
                        serde_json::Value::String(text) => text.len(),
                        other => other.to_string().len(),
                    }
            })
            .sum()
    }

    /// The representation of one MIME type, if it is text (or base64).
    pub fn get(&self, mime: &str) -> Option<&str> {
        self.data.get(mime)?.as_str()
    }

    /// `text/plain`.
    pub fn text(&self) -> Option<&str> {
        self.get("text/plain")
    }

    /// `text/html` (a pandas DataFrame's table, say).
    pub fn html(&self) -> Option<&str> {
        self.get("text/html")
    }

    /// `image/png`, decoded.
    pub fn png(&self) -> Option<Vec<u8>> {
        self.image("image/png")
    }

    /// A base64 image type, decoded (`None` when absent or not valid base64).
    pub fn image(&self, mime: &str) -> Option<Vec<u8>> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(self.get(mime)?)
            .ok()
    }

    #[cfg(feature = "runtime")]
    /// The base64 PNG of a figure, if it is one.
    pub(crate) fn figure_png(&self) -> Option<&str> {
        (self.kind == RichKind::Figure)
            .then(|| self.data.get("image/png")?.as_str())
            .flatten()
    }
}

/// One line of output (without its newline), numbered from 0 per instruction across both streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub seq: i64,
    pub stream: OutputStream,
    /// A line of text, without its newline (a rich result's JSON for `Display`).
    pub data: String,
    /// The text did not end with a newline: the instruction ended (or the line passed the
    /// longest the engine keeps in one chunk) before one came. `print('x', end='')` is one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl OutputChunk {
    /// The text exactly as printed: the line with its newline, unless it did not end.
    pub fn text(&self) -> String {
        let mut text = String::with_capacity(self.data.len() + 1);
        text.push_str(&self.data);
        if !self.partial {
            text.push('\n');
        }
        text
    }

    /// The rich result a [`OutputStream::Display`] chunk carries (`None` for text, or a chunk
    /// that does not decode).
    pub fn rich(&self) -> Option<RichResult> {
        if self.stream != OutputStream::Display {
            return None;
        }
        serde_json::from_str(&self.data).ok()
    }
}

/// Why an instruction ended in an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum FailureCause {
    /// The code raised an exception; the text is its traceback.
    Exception,
    /// The instruction ran past its timeout and was interrupted.
    Timeout,
    /// The instruction was interrupted by a request (or cancelled before it ran).
    Interrupted,
    /// The sandbox died (out of memory, crash); the machine was restarted.
    MachineCrashed,
    /// The instruction could not run because a limit was reached (the account's resident
    /// memory, say); the text names it.
    LimitExceeded,
    /// The machine was deleted while the instruction ran or waited.
    MachineDeleted,
}

impl FailureCause {
    /// Its name on the wire (`machine_crashed`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCause::Exception => "exception",
            FailureCause::Timeout => "timeout",
            FailureCause::Interrupted => "interrupted",
            FailureCause::MachineDeleted => "machine_deleted",
            FailureCause::MachineCrashed => "machine_crashed",
            FailureCause::LimitExceeded => "limit_exceeded",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            FailureCause::Exception,
            FailureCause::Timeout,
            FailureCause::Interrupted,
            FailureCause::MachineCrashed,
            FailureCause::LimitExceeded,
            FailureCause::MachineDeleted,
        ]
        .into_iter()
        .find(|cause| cause.as_str() == text)
    }
}

/// How an instruction ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The `repr` of the final expression, or `None` for statements and `None` values.
    Value(Option<String>),
    Error {
        text: String,
        cause: FailureCause,
    },
}

/// The exception an instruction raised, as data taken from the exception object in the
/// machine (never parsed from the traceback's text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExceptionInfo {
    /// The class's `__name__`: `ZeroDivisionError`, `JSONDecodeError`.
    pub name: String,
    /// The class's `__qualname__`: `Agent.run.<locals>.FinalAnswer` for a class defined in a
    /// function.
    pub qualname: String,
    /// The class's `__module__`: `builtins`, `json.decoder`, `__main__`.
    pub module: String,
    /// `str(exc)`; `<exception str() failed>` when that raised.
    pub value: String,
}

/// The result of one instruction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResult {
    pub outcome: Outcome,
    /// With an error: the exception raised, when one was (none when the sandbox died or a
    /// limit refused the instruction). The traceback is the error's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<ExceptionInfo>,
    /// ForeverVM's rich output: `{"png": "<base64>"}` for the last matplotlib figure.
    pub data: Option<serde_json::Value>,
    /// The rich results, in order: those shown during the instruction (also in its output, as
    /// [`OutputStream::Display`] chunks), then the value's and the figures left open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<RichResult>,
    pub runtime_ms: u64,
    /// A Jupyter cell's number (`jupyter` and `e2b` dialects), as a kernel numbers its cells
    /// (IPython's `execution_count`: one per cell, REPL lines and commands not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    /// True when the instruction printed more than the engine keeps
    /// ([`crate::Limits::max_output_bytes`]): the rest of its output was dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    /// For machines with `durability = instruction`: whether the state after this instruction
    /// is on disk. `None` for other machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<bool>,
}

impl Default for ExecResult {
    fn default() -> Self {
        Self {
            outcome: Outcome::Value(None),
            exception: None,
            data: None,
            results: Vec::new(),
            runtime_ms: 0,
            execution_count: None,
            output_truncated: false,
            saved: None,
        }
    }
}

impl ExecResult {
    #[cfg(feature = "runtime")]
    pub(crate) fn failure(cause: FailureCause, text: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::Error {
                text: text.into(),
                cause,
            },
            ..Self::default()
        }
    }
}

/// What a stream of an instruction carries: output chunks in order, then exactly one result.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    Output(OutputChunk),
    Result(ExecResult),
}
