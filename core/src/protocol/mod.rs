//! Wire types of the ForeverVM-compatible HTTP + WebSocket API (see `protocol.md`), plus the
//! evervm additions under `/v1`. Field names here are the wire's; the engine never sees them.
//!
//! With the `server` feature every type also derives `schemars::JsonSchema`: the schemas of
//! `openapi.json` are generated from these types, so their doc comments are the schemas'
//! descriptions (written for API users), and the `schemars` attributes only add what serde does
//! not know (the engine's limits, schema names). They never change the serde representation.

#[cfg(feature = "server")]
pub(crate) mod schema;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use evervm_engine::Dialect;
use serde::{Deserialize, Serialize};

mod errors;

pub use errors::{ERROR_CODES, ErrorCode};

mod contexts;
pub use contexts::{ApiContext, CreateContextRequest, DeleteContextResponse, ListContextsResponse};

/// Tags on the wire: a JSON object of strings.
pub type WireTags = BTreeMap<String, String>;

/// The default instruction timeout when a request gives none (every ForeverVM client's default,
/// 15 s): the engine's `DEFAULT_TIMEOUT`.
pub const DEFAULT_TIMEOUT_SECONDS: i32 = evervm_engine::DEFAULT_TIMEOUT.as_secs() as i32;

/// Every error. Statuses and codes: 400 `BadRequest`, 401 `Unauthorized`, 403 `PermissionDenied`
/// (a path outside the directories files may be used in), 404 `MachineNotFound` /
/// `InstructionNotFound` / `FileNotFound` / `NotFound` (no such route or checkpoint), 405
/// `MethodNotAllowed`, 409 `Conflict`, 413 `PayloadTooLarge`, 429 `LimitExceeded` (a quota or limit was hit; the message
/// names it), 500 `InternalError`, 501 `Unsupported`, 503 `MachineCrashed`. Messages never contain
/// the server's host paths (they read `<evervm home>/...`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "server",
    derive(schemars::JsonSchema),
    schemars(rename = "Error")
)]
pub struct ApiError {
    #[cfg_attr(feature = "server", schemars(example = &"MachineNotFound"))]
    pub code: String,
    /// Always null from evervm.
    #[serde(default)]
    pub id: Option<String>,
    /// evervm: what happened and what to do, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `GET /v1/audit`'s answer: audit entries, newest first (evervm's own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct AuditResponse {
    pub entries: Vec<evervm_engine::audit::AuditEntry>,
}

/// The account of the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct WhoamiResponse {
    pub account: String,
}

/// A new machine's options, every one optional: an empty body, `null` and `{}` all mean the
/// defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct CreateMachineRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Tags>"))]
    pub tags: Option<WireTags>,
    /// Memory limit in MiB; the server's default (512) when absent. Only the sizes the server
    /// offers are accepted (by default 128, 256, 512, 1024, 2048, 4096 and 8192; a 400 names
    /// them).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integral::optional"
    )]
    #[cfg_attr(
        feature = "server",
        schemars(range(min = evervm_engine::MIN_MEMORY_MB, max = evervm_engine::MAX_MEMORY_MB))
    )]
    pub memory_mb: Option<u32>,
    /// evervm: the image profile: `data` (CPython 3.11 with numpy, pandas, matplotlib,
    /// requests, Beautiful Soup, PyYAML) or `minimal` (CPython 3.11 alone). Default: the
    /// server's (`data` unless `EVERVM_DEFAULT_IMAGE` says otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Image>"))]
    pub image: Option<String>,
    /// evervm: when the machine's state is saved to disk: `idle` (default; at swap-out, at
    /// checkpoints and at a graceful engine stop) or `instruction` (also after every
    /// instruction, before its result is reported, so a crash of the engine never loses an
    /// acknowledged instruction's state; costs a checkpoint and a restore per instruction).
    /// `instruction` only on gVisor: the process backend answers `501 Unsupported`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Durability>"))]
    pub durability: Option<String>,
    /// evervm: how many undo points the machine keeps (its whole state after each of its latest
    /// `history` instructions, and before its first), to rewind to (`POST .../rewind`); the
    /// server's default (0: none) when absent, at most its maximum (100 by default). gVisor
    /// only: the process backend answers `501 Unsupported`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integral::optional"
    )]
    #[cfg_attr(feature = "server", schemars(range(max = 100)))]
    pub history: Option<u32>,
    /// evervm: environment variables of the machine's interpreter (`os.environ`, inherited by
    /// its subprocesses), kept across swap, restart and fork; returned by `info`. Names are
    /// letters, digits and `_`; at most 128 variables, 256 KiB together (with `secret_env`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Env>"))]
    pub env: Option<BTreeMap<String, String>>,
    /// evervm: environment variables whose values are secrets: set like `env`, but `info` and
    /// lists give only their names, and the server never logs them. A name in both maps is
    /// secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Env>"))]
    pub secret_env: Option<crate::types::SecretEnv>,
    /// evervm: the machine is deleted this many seconds after its creation (at most ten years);
    /// its `expires_at` then says when.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integral::optional"
    )]
    #[cfg_attr(feature = "server", schemars(range(min = 1, max = 316_224_000)))]
    pub ttl_seconds: Option<u64>,
    /// evervm: what the machine may reach over the network: `{"mode": "none"}` (loopback
    /// only), `{"mode": "public"}` (TCP and DNS to public addresses) or `{"mode": "allow",
    /// "allow": ["pypi.org", "*.pythonhosted.org", "203.0.113.0/24"]}` (those names and blocks
    /// only). Never the host, private, shared, link-local (the metadata service) or other
    /// special addresses, whatever the mode. Default: the server's (`none` unless
    /// `--network-default public`); more than the server allows (`--network-max`) is `403`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Network>"))]
    pub network: Option<crate::types::NetworkPolicy>,
}

/// The new machine's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct CreateMachineResponse {
    #[cfg_attr(feature = "server", schemars(example = &"9kaTDWiKdAvaIZNE"))]
    pub machine_name: String,
}

/// A machine list's filter (`POST /v1/machine/list`; `GET` takes none). An empty body, `null`,
/// `{}` or no `tags` list every machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ListMachinesRequest {
    /// A machine is listed when it carries every given pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<WireTags>,
    /// evervm: at most this many machines (1 to 1000); every machine when absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integral::optional"
    )]
    #[cfg_attr(feature = "server", schemars(range(min = 1, max = 1000)))]
    pub limit: Option<u32>,
    /// evervm: start after the machines of an earlier page: its `next_cursor`, as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(regex(pattern = r"^m[1-9][0-9]{0,17}$")))]
    pub cursor: Option<String>,
}

/// Machines, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ListMachinesResponse {
    pub machines: Vec<ApiMachine>,
    /// evervm: with a `limit`, where the next page starts (pass it as `cursor`); absent after
    /// the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A machine. The fields marked evervm are absent from other servers' answers; evervm sets them
/// all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "server",
    derive(schemars::JsonSchema),
    schemars(rename = "Machine")
)]
pub struct ApiMachine {
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The machine's sandbox is in memory.
    pub running: bool,
    /// An instruction is queued or running. Singular, as the ForeverVM CLI requires.
    pub has_pending_instruction: bool,
    /// When the machine is deleted; null: never.
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub tags: WireTags,
    /// evervm: the memory limit in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u32>,
    /// evervm: the image profile (`minimal`, `data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// evervm: the sandbox backend (`process`, `gvisor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// evervm: `resident` (in memory), `swapped` (on disk; the next instruction restores it),
    /// `damaged` (its snapshot cannot be used; see `last_error`) or `stopped` (no sandbox and
    /// no snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// evervm: instructions accepted so far; the next one gets this seq.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction_count: Option<i64>,
    /// evervm; absent when never used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
    /// evervm: why the last sandbox ended abnormally; absent when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// evervm: bytes of the machine's snapshot and checkpoints on disk (hard-linked files
    /// counted once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// evervm: bytes of memory the machine's sandbox holds now, the proportional set size (PSS)
    /// of its host processes; 0 when not resident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
    /// evervm: when the machine's state is saved to disk (`idle`, `instruction`); see
    /// `CreateMachineRequest.durability`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// evervm: how many undo points the machine keeps (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<u32>,
    /// evervm: the machine it was forked from; absent when it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// evervm: the seq of the parent's last instruction the fork holds (-1: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_at: Option<i64>,
    /// evervm: the machine's environment variables that are not secret; absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// evervm: the names of its secret environment variables (never their values); absent
    /// when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<String>,
    /// evervm: how its current interpreter (or its last, when it is not resident) began;
    /// absent before its first start under the running server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<crate::types::InterpreterInfo>,
    /// evervm: what it may reach over the network; see `CreateMachineRequest.network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Network>"))]
    pub network: Option<crate::types::NetworkPolicy>,
}

/// An instruction: code and a timeout in seconds ([`DEFAULT_TIMEOUT_SECONDS`] when absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "server",
    derive(schemars::JsonSchema),
    schemars(rename = "Instruction")
)]
pub struct WireInstruction {
    /// Python source, at most 1 MiB (1048576 bytes: code over it is refused with 413), without
    /// NUL characters. The `repr` of a final expression becomes the result's `value`.
    #[cfg_attr(feature = "server", schemars(with = "schema::Code"))]
    pub code: String,
    /// The instruction is interrupted after this long; its result is then an error containing
    /// `Timed out`, and the machine keeps its state.
    #[serde(
        default = "default_timeout_seconds",
        deserialize_with = "integral::required"
    )]
    #[cfg_attr(
        feature = "server",
        schemars(range(min = 1, max = evervm_engine::MAX_TIMEOUT.as_secs()))
    )]
    pub timeout_seconds: i32,
    /// evervm addition: how the code runs, `python` (a REPL line, the default and ForeverVM's)
    /// or `jupyter` (a Jupyter cell, run by IPython's own shell: magics, shell escapes,
    /// IPython's formatters and tracebacks; the image needs IPython). Other clients leave it out.
    #[serde(default, skip_serializing_if = "Dialect::is_python")]
    pub dialect: Dialect,
    /// evervm addition: which of the machine's interpreters runs it, a context's id from
    /// `POST /v1/machine/{machine_name}/contexts` (absent or `default`: the machine's own). An id
    /// the machine does not have ends the instruction with the error `ContextNotFound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::ContextId>"))]
    pub context: Option<String>,
}

fn default_timeout_seconds() -> i32 {
    DEFAULT_TIMEOUT_SECONDS
}

/// Integers in what clients send: JSON has only numbers, and JSON Schema (so the OpenAPI
/// document) counts `512.0` as the integer 512, as JavaScript and Python's `json` may write it;
/// serde alone refuses it. A fraction, or a value out of the type's range, is still refused.
mod integral {
    use serde::de::{Deserialize, Deserializer, Error};

    fn integer<T: TryFrom<i64>, E: Error>(number: &serde_json::Number) -> Result<T, E> {
        let whole = number.as_i64().or_else(|| {
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && (-(2f64.powi(63))..2f64.powi(63)).contains(f))
                .map(|f| f as i64)
        });
        whole.and_then(|i| T::try_from(i).ok()).ok_or_else(|| {
            E::custom(format!(
                "invalid value: {number}, expected an integer that fits {}",
                std::any::type_name::<T>()
            ))
        })
    }

    pub(super) fn required<'de, D: Deserializer<'de>, T: TryFrom<i64>>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        integer(&serde_json::Number::deserialize(deserializer)?)
    }

    pub(super) fn optional<'de, D: Deserializer<'de>, T: TryFrom<i64>>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        Option::<serde_json::Number>::deserialize(deserializer)?
            .map(|number| integer(&number))
            .transpose()
    }
}

/// An instruction to queue on a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ExecRequest {
    pub instruction: WireInstruction,
    /// Interrupt whatever is running or queued on the machine first.
    #[serde(default)]
    pub interrupt: bool,
}

/// The answer to an exec, sent as soon as the instruction is queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ExecResponse {
    /// The instruction's number on the machine, from 0; never null from evervm.
    pub instruction_seq: Option<i64>,
    /// The machine's name; never null from evervm.
    pub machine: Option<String>,
    /// This request interrupted another instruction.
    #[serde(default)]
    pub interrupted: bool,
}

/// An instruction's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ExecResultResponse {
    /// The instruction's seq.
    pub instruction_id: i64,
    pub result: WireExecResult,
}

/// A result: exactly one of the value form (`value` always present, null for no value, plus
/// `data`) and the error form (`error`, and from evervm `cause`), each with `runtime_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "server",
    derive(schemars::JsonSchema),
    schemars(rename = "ExecResult")
)]
pub struct WireExecResult {
    #[serde(flatten)]
    pub outcome: WireOutcome,
    /// How long the instruction ran, in milliseconds.
    pub runtime_ms: u64,
    /// evervm addition: the instruction printed more than the server keeps per instruction,
    /// and the rest of its output was dropped. Sent only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    /// evervm addition, for machines with `durability = instruction`: whether the state after
    /// the instruction is on disk. Absent for other machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<bool>,
    /// evervm addition, sent only to a client that asks with `rich=true`: the rich results
    /// (MIME bundles, as in Jupyter), in order: those shown during the instruction, then the
    /// last expression's value when it has more than text, then the figures left open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<Vec<schema::RichResult>>"))]
    pub results: Option<Vec<crate::types::RichResult>>,
}

/// How an instruction ended: a value or an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum WireOutcome {
    Error {
        /// The traceback, or a text containing `Timed out` after a timeout.
        error: String,
        /// evervm addition: why it failed (`exception`, `timeout`, `interrupted`,
        /// `machine_crashed`, `limit_exceeded`, `machine_deleted`). Other clients ignore it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(
            feature = "server",
            schemars(with = "Option<crate::types::FailureCause>")
        )]
        cause: Option<String>,
        /// evervm addition: the exception raised, as data (class name, qualified name,
        /// module, message), when the code raised one. Other clients ignore it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exception: Option<crate::types::ExceptionInfo>,
    },
    Value {
        /// The `repr` of the final expression; null for statements and `None`.
        value: Option<String>,
        /// Rich output, such as `{"png": "<base64>"}` for a matplotlib figure; usually null.
        data: Option<serde_json::Value>,
    },
}

/// One line of output, without its newline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct StandardOutput {
    pub stream: WireStream,
    pub data: String,
    /// From 0 per instruction, across both streams.
    pub seq: i64,
}

/// Which stream a line of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "server",
    derive(schemars::JsonSchema),
    schemars(rename = "Stream")
)]
#[serde(rename_all = "snake_case")]
pub enum WireStream {
    Stdout,
    Stderr,
}

/// A WebSocket message from the client: an instruction to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessageToServer {
    /// Queue an instruction; the server answers with `exec_received`.
    Exec {
        instruction: WireInstruction,
        /// Chosen by the client, echoed in `exec_received`.
        #[serde(deserialize_with = "integral::required")]
        request_id: u32,
    },
}

/// The level of a `message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MessageLevel {
    Info,
    Warn,
    Error,
}

/// A message from the server, on the WebSocket or as a line of `stream-result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessageFromServer {
    /// The first message on a WebSocket.
    Connected { machine_name: String },
    /// An `exec` was queued as instruction `seq`.
    ExecReceived {
        seq: i64,
        /// The `exec`'s `request_id`.
        request_id: u32,
    },
    /// A line of an instruction's output.
    Output {
        chunk: StandardOutput,
        instruction_id: i64,
    },
    /// evervm addition, sent only to a client that asks with `rich=true`: a rich result shown
    /// during the instruction (`display(obj)`, `plt.show()`), in order with its output.
    Display {
        instruction_id: i64,
        /// Its place among the instruction's output lines (numbered together).
        seq: i64,
        #[cfg_attr(feature = "server", schemars(with = "schema::RichResult"))]
        result: crate::types::RichResult,
    },
    /// An instruction's result, after all its output.
    Result {
        instruction_id: i64,
        result: WireExecResult,
    },
    /// Something went wrong (code `MachineNotFound`, `BadRequest`, `PayloadTooLarge`, ...).
    Error { code: String, id: Option<String> },
    /// A diagnostic.
    Message {
        message: String,
        level: MessageLevel,
    },
}

// --- evervm additions ----------------------------------------------------------------------

/// `GET /v1/machine/{name}`: everything about one machine (the list's object, every field set).
pub type MachineInfoResponse = ApiMachine;

/// What the ForeverVM CLI's `signup` sends. evervm has no sign-up and answers 501 whatever the
/// body; the server never parses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct SignupRequest {
    pub email: String,
    pub account_name: String,
}

/// A deleted machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct DeleteMachineResponse {
    /// Always true.
    pub deleted: bool,
}

/// A machine swapped out to disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct SwapResponse {
    /// Always true.
    pub swapped: bool,
}

/// Packages to install from the package index (evervm): binary wheels only, hash-checked,
/// fetched by the server, dependencies included.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct InstallRequest {
    /// PEP 508 requirements such as `requests==2.32.3`, each optionally followed by
    /// `--hash=sha256:HEX`; no URLs or paths.
    #[cfg_attr(feature = "server", schemars(with = "schema::Requirements"))]
    pub requirements: Vec<String>,
}

/// What an install did: the engine's own type.
pub use evervm_engine::InstallReport as InstallResponse;

/// `POST /v1/machine/{machine_name}/rewind` (evervm): which undo point to make the machine's
/// state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct RewindRequest {
    /// The seq of the instruction whose after-state to go back to; `-1` (the default) for the
    /// state before the last instruction (an undo).
    #[serde(default = "undo", deserialize_with = "integral::required")]
    #[cfg_attr(feature = "server", schemars(range(min = -1)))]
    pub to: i64,
}

fn undo() -> i64 {
    -1
}

/// `GET /v1/machine/{machine_name}/lineage` (evervm): the tree of forks the machine is in.
pub use evervm_engine::Lineage as LineageResponse;
/// `GET /v1/machine/{machine_name}/history` (evervm): the machine's latest instructions.
pub use evervm_engine::MachineHistory as HistoryResponse;
/// `POST /v1/machine/{machine_name}/rewind` (evervm): what the rewind did.
pub use evervm_engine::Rewound as RewindResponse;

/// A fork's options; an empty body, `null` and `{}` all mean the defaults. Answered like a new
/// machine, with the fork's name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ForkMachineRequest {
    /// The fork's tags; the parent's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::Tags>"))]
    pub tags: Option<WireTags>,
    /// evervm: fork from the machine's undo point after this instruction (`-1`: before its
    /// first; `GET .../history` lists the kept ones) instead of its current state. The
    /// machine itself is not touched.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integral::optional"
    )]
    #[cfg_attr(feature = "server", schemars(range(min = -1)))]
    pub at: Option<i64>,
}

/// A new checkpoint's options; an empty body, `null` and `{}` all mean the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct CreateCheckpointRequest {
    /// The checkpoint's name, unique on the machine. Generated when absent:
    /// `cp-YYYYmmdd-HHMMSS-mmm` (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schemars(with = "Option<schema::CheckpointName>"))]
    pub name: Option<String>,
}

/// A checkpoint: the answer to its creation, and an item of a list.
pub type ApiCheckpoint = crate::types::CheckpointInfo;

/// A machine's checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ListCheckpointsResponse {
    /// Oldest first.
    pub checkpoints: Vec<ApiCheckpoint>,
}

/// A deleted checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct DeleteCheckpointResponse {
    /// Always true.
    pub deleted: bool,
}

/// What to interrupt; an empty body, `null` and `{}` mean the running instruction and every
/// queued one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct InterruptRequest {
    /// Interrupt this instruction alone (cancelled while it waits, interrupted while it runs);
    /// the others are left alone.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integral::optional"
    )]
    #[cfg_attr(feature = "server", schemars(range(min = 0)))]
    pub instruction_seq: Option<i64>,
}

/// The answer to an interrupt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct InterruptResponse {
    /// There was a running or queued instruction.
    pub interrupted: bool,
}

/// The server is up; which sandbox backend its engine uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct HealthResponse {
    /// Always `ok` when the server answers.
    pub status: String,
    /// The sandbox backend (`process`, `gvisor`).
    #[cfg_attr(feature = "server", schemars(example = &"process"))]
    pub backend: String,
    /// The backend's exact version (for gVisor: runsc's version, binary hash and platform).
    #[serde(default)]
    pub backend_version: String,
}

/// The nodes of the cluster this server belongs to (`GET /v1/nodes`, evervm's own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct NodesResponse {
    /// This server's node id; null when it is no node of a cluster (then `nodes` is empty).
    pub this_node: Option<String>,
    pub nodes: Vec<ApiNode>,
}

/// One evervm server sharing the database with others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(schemars::JsonSchema))]
pub struct ApiNode {
    pub id: String,
    /// Where the other nodes forward its machines' requests.
    pub address: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// When it last renewed its leases.
    pub heartbeat_at: chrono::DateTime<chrono::Utc>,
    /// Whether it renewed them within one lease's length: a node that is not alive runs no
    /// machine (its machines come back on others).
    pub alive: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_forms_match_the_wire() {
        let value = WireExecResult {
            outcome: WireOutcome::Value {
                value: None,
                data: None,
            },
            runtime_ms: 3,
            output_truncated: false,
            saved: None,
            results: None,
        };
        assert_eq!(
            serde_json::to_string(&value).unwrap(),
            r#"{"value":null,"data":null,"runtime_ms":3}"#
        );
        let error = WireExecResult {
            outcome: WireOutcome::Error {
                error: "boom".into(),
                cause: None,
                exception: None,
            },
            runtime_ms: 1,
            output_truncated: false,
            saved: None,
            results: None,
        };
        assert_eq!(
            serde_json::to_string(&error).unwrap(),
            r#"{"error":"boom","runtime_ms":1}"#
        );
        let raised = r#"{"error":"Traceback...","cause":"exception","exception":{"name":"E","qualname":"f.<locals>.E","module":"__main__","value":"no"},"runtime_ms":1}"#;
        let decoded: WireExecResult = serde_json::from_str(raised).unwrap();
        assert!(matches!(
            &decoded.outcome,
            WireOutcome::Error { exception: Some(e), .. } if e.qualname == "f.<locals>.E"
        ));
        assert_eq!(serde_json::to_string(&decoded).unwrap(), raised);
        let back: WireExecResult =
            serde_json::from_str(r#"{"value":"2","data":null,"runtime_ms":0}"#).unwrap();
        assert_eq!(
            back.outcome,
            WireOutcome::Value {
                value: Some("2".into()),
                data: None
            }
        );
    }

    /// `WireOutcome::Error::cause` is documented with `FailureCause`'s schema: the names must be
    /// the ones the server writes.
    #[test]
    fn causes_are_written_as_failure_cause_serializes() {
        use crate::types::FailureCause;
        for cause in [
            FailureCause::Exception,
            FailureCause::Timeout,
            FailureCause::Interrupted,
            FailureCause::MachineCrashed,
        ] {
            assert_eq!(
                serde_json::to_value(cause).unwrap(),
                serde_json::json!(cause.as_str())
            );
        }
    }

    #[test]
    fn integers_may_be_written_as_whole_floats() {
        let exec: ExecRequest =
            serde_json::from_str(r#"{"instruction":{"code":"1","timeout_seconds":7.0}}"#).unwrap();
        assert_eq!(exec.instruction.timeout_seconds, 7);
        let create: CreateMachineRequest = serde_json::from_str(r#"{"memory_mb":366.0}"#).unwrap();
        assert_eq!(create.memory_mb, Some(366));
        let create: CreateMachineRequest = serde_json::from_str(r#"{"memory_mb":null}"#).unwrap();
        assert_eq!(create.memory_mb, None);
        let exec: MessageToServer =
            serde_json::from_str(r#"{"type":"exec","instruction":{"code":"1"},"request_id":3.0}"#)
                .unwrap();
        assert!(matches!(exec, MessageToServer::Exec { request_id: 3, .. }));
        for bad in [
            r#"{"memory_mb":366.5}"#,
            r#"{"memory_mb":-1}"#,
            r#"{"memory_mb":4294967296}"#,
            r#"{"memory_mb":1e300}"#,
            r#"{"memory_mb":"512"}"#,
        ] {
            assert!(
                serde_json::from_str::<CreateMachineRequest>(bad).is_err(),
                "{bad}"
            );
        }
        let err = serde_json::from_str::<ExecRequest>(
            r#"{"instruction":{"code":"1","timeout_seconds":2147483648}}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("i32"), "{err}");
        // What the server writes is unchanged.
        let request = ExecRequest {
            instruction: WireInstruction {
                dialect: Dialect::Python,
                code: "1".into(),
                timeout_seconds: 7,
                context: None,
            },
            interrupt: false,
        };
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"instruction":{"code":"1","timeout_seconds":7},"interrupt":false}"#
        );
    }

    #[test]
    fn numbers_in_data_survive_a_round_trip() {
        // Without serde_json's `float_roundtrip`, this number came back one ULP off after each
        // decode and re-encode (seen through the fuzz harnesses' round-trip checks).
        let text = r#"{"value":null,"data":{"x":9.15860402102123842989e-300},"runtime_ms":0}"#;
        let first: WireExecResult = serde_json::from_str(text).unwrap();
        let again: WireExecResult =
            serde_json::from_str(&serde_json::to_string(&first).unwrap()).unwrap();
        assert_eq!(again, first);
        let WireOutcome::Value {
            data: Some(data), ..
        } = first.outcome
        else {
            panic!("not a value: {first:?}");
        };
        assert_eq!(
            data["x"].as_f64().map(f64::to_bits),
            Some(9.158_604_021_021_239e-300_f64.to_bits())
        );
    }

    #[test]
    fn server_messages_are_tagged() {
        let message = MessageFromServer::Result {
            instruction_id: 4,
            result: WireExecResult {
                outcome: WireOutcome::Value {
                    value: Some("2".into()),
                    data: None,
                },
                runtime_ms: 0,
                output_truncated: false,
                saved: None,
                results: None,
            },
        };
        assert_eq!(
            serde_json::to_string(&message).unwrap(),
            r#"{"type":"result","instruction_id":4,"result":{"value":"2","data":null,"runtime_ms":0}}"#
        );
        let exec: MessageToServer =
            serde_json::from_str(r#"{"type":"exec","instruction":{"code":"1"},"request_id":0}"#)
                .unwrap();
        assert_eq!(
            exec,
            MessageToServer::Exec {
                instruction: WireInstruction {
                    dialect: Dialect::Python,
                    code: "1".into(),
                    timeout_seconds: 15,
                    context: None,
                },
                request_id: 0
            }
        );
    }
}
