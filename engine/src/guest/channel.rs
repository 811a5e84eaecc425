//! Framing of the agent channel: a 4-byte big-endian length, then that many bytes: UTF-8 JSON, or
//! a binary frame whose first byte says what it is (`O` output, `D` file data, `P` a process's
//! output: see `processes.rs`).
//!
//! Everything here treats the guest as hostile: lengths are checked before anything is buffered,
//! and a frame that does not decode is an error for that machine only.

use serde::{Deserialize, Serialize};

use crate::files::{FileInfo, FileKind, MAX_LIST_ENTRIES, MAX_PATH_BYTES};
use crate::types::{FailureCause, OutputStream, RichKind, RichResult};

/// Largest frame either side accepts (a result can carry a large PNG).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

/// A violation of the channel protocol by the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("the agent sent a frame of {0} bytes, over the limit of {MAX_FRAME}")]
    Oversized(usize),
    #[error("the agent sent a frame that is not a valid event: {0}")]
    Malformed(String),
}

/// Incremental decoder: feed bytes as they arrive, take whole frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the channel.
    pub fn feed(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
        self.buffer.extend_from_slice(data);
    }

    /// Takes the next whole frame's payload, if one is complete.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, ProtocolError> {
        let available = &self.buffer[self.start..];
        let Some(header) = available.get(..4) else {
            return Ok(None);
        };
        let mut length_bytes = [0u8; 4];
        length_bytes.copy_from_slice(header);
        let length = u32::from_be_bytes(length_bytes) as usize;
        if length > MAX_FRAME {
            return Err(ProtocolError::Oversized(length));
        }
        let Some(payload) = available.get(4..4 + length) else {
            return Ok(None);
        };
        let payload = payload.to_vec();
        self.start += 4 + length;
        if self.start > 1024 * 1024 && self.start * 2 > self.buffer.len() {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(payload))
    }

    /// Bytes received but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.buffer.len() - self.start
    }
}

/// Encodes one frame.
pub fn encode_frame(payload: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    if payload.len() > MAX_FRAME {
        return Err(ProtocolError::Oversized(payload.len()));
    }
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    Ok(frame)
}

/// A request from the host to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AgentRequest {
    Exec {
        id: i64,
        code: String,
        timeout_ms: u64,
        #[serde(default, skip_serializing_if = "crate::Dialect::is_python")]
        dialect: crate::Dialect,
        /// The context that runs it (none: the machine's own interpreter).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<String>,
    },
    Interrupt {
        id: i64,
    },
    /// Reseed the interpreter's random generators (after a fork or a base snapshot's restore:
    /// every copy would draw the same numbers); the agent answers `ready`.
    Reseed,
    /// Make a fresh interpreter a machine's: its environment variables, the home as working
    /// directory; the agent answers `ready`.
    Configure {
        env: EnvValues,
    },
    /// File operations (between instructions): `path` is resolved by the agent under `roots`
    /// (none: the machine's home). Answered by `file` or `file_error`.
    Stat {
        path: String,
        roots: Vec<String>,
    },
    List {
        path: String,
        roots: Vec<String>,
        limit: usize,
    },
    Mkdir {
        path: String,
        roots: Vec<String>,
        parents: bool,
    },
    Remove {
        path: String,
        roots: Vec<String>,
        recursive: bool,
    },
    /// Answered by `file` (with info), data frames, then `file_end`.
    Read {
        path: String,
        roots: Vec<String>,
        limit: u64,
    },
    /// Answered by `file` once the data may come (data frames, then `WriteEnd` or
    /// `WriteAbort`), and after the end by `file` (with info) or `file_error`.
    Write {
        path: String,
        roots: Vec<String>,
        mode: Option<u32>,
        parents: bool,
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        metadata: std::collections::BTreeMap<String, String>,
    },
    WriteEnd,
    WriteAbort,
    /// What the machine runs and has installed, for an install; answered by `packages`.
    Packages,
    /// Unpack the wheels (files the host wrote, removed afterwards) into the user's
    /// site-packages and make them importable; answered by `installed` or `file_error`.
    Install {
        wheels: Vec<String>,
    },
    /// Start a process beside the interpreter (handled at once, even during an instruction);
    /// answered by `proc_started` or `proc_failed`, then its output and `proc_exit`.
    ProcStart {
        id: u64,
        argv: Vec<String>,
        env: EnvValues,
        cwd: Option<String>,
        stdin: bool,
        /// On a terminal of this size (its output one stream, stdout).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pty: Option<crate::TerminalSize>,
    },
    /// A new size for a process's terminal.
    ProcResize {
        id: u64,
        cols: u16,
        rows: u16,
    },
    /// Bytes for a process's stdin, base64.
    ProcInput {
        id: u64,
        data: String,
    },
    ProcCloseStdin {
        id: u64,
    },
    /// A signal to the process's group (to a watch: its end).
    ProcSignal {
        id: u64,
        signal: i32,
    },
    /// Watch a directory (inotify; `recursive`: its subdirectories too), followed as a process
    /// whose output is its events, a JSON line each.
    WatchStart {
        id: u64,
        path: String,
        roots: Vec<String>,
        recursive: bool,
    },
    /// Contexts (`contexts.py`), between instructions; answered by `contexts` or `file_error`.
    /// Make one, its interpreter started in `cwd` (none: the home).
    ContextCreate {
        cwd: Option<String>,
    },
    ContextList,
    /// Start a context's interpreter again, its variables gone.
    ContextRestart {
        context: String,
    },
    ContextRemove {
        context: String,
    },
    /// Tunnels (`tunnels.py`): connect to `port` on the sandbox's loopback; answered by
    /// `tun_opened` or `tun_failed`. Its bytes then go as binary `T` frames.
    TunOpen {
        id: u64,
        port: u16,
    },
    /// No more bytes from the host.
    TunShutdown {
        id: u64,
    },
    /// The host dropped it.
    TunReset {
        id: u64,
    },
    /// The host knows of no tunnel (a restored snapshot's end).
    TunResetAll,
}

/// Environment variables on their way to the agent: their values may be secrets, so they are
/// never shown (`Debug` lists the names only).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EnvValues(pub std::collections::BTreeMap<String, String>);

impl std::fmt::Debug for EnvValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// The header of a data frame carrying `len` bytes of file data: the length, then `D`.
pub fn data_frame_header(len: usize) -> Result<[u8; 5], ProtocolError> {
    if len >= MAX_FRAME {
        return Err(ProtocolError::Oversized(len + 1));
    }
    let mut header = [0u8; 5];
    header[..4].copy_from_slice(&((len + 1) as u32).to_be_bytes());
    header[4] = b'D';
    Ok(header)
}

impl AgentRequest {
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let payload =
            serde_json::to_vec(self).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
        encode_frame(&payload)
    }
}

/// An event from the agent, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    Ready {
        python: String,
    },
    Output {
        /// The instruction running when the output was read, if any.
        id: Option<i64>,
        stream: OutputStream,
        data: String,
    },
    /// A rich result shown during an instruction.
    Display {
        /// The instruction running when it was shown.
        id: i64,
        result: RichResult,
    },
    Result {
        id: i64,
        outcome: AgentOutcome,
        /// With an error: the exception raised, as the agent read it from the object.
        exception: Option<crate::ExceptionInfo>,
        /// ForeverVM's `data`, from agents before rich results (now derived from `results`).
        data: Option<serde_json::Value>,
        /// The value's and the figures' rich results.
        results: Vec<RichResult>,
        runtime_ms: u64,
        /// A Jupyter cell's number in IPython's shell.
        execution_count: Option<u64>,
    },
    /// A file operation's answer: the file it concerned (none: a write may start), and for a
    /// listing the directory's entries.
    File {
        info: Option<FileInfo>,
        entries: Option<Vec<FileInfo>>,
        truncated: bool,
    },
    FileError {
        failure: FileFailure,
        message: String,
    },
    /// A piece of a file being read.
    FileData(Vec<u8>),
    /// The end of a file being read, and how many bytes were sent.
    FileEnd {
        size: u64,
    },
    /// What the machine runs (PEP 508 marker values, its C library) and has installed
    /// (normalised name to version).
    Packages {
        environment: Box<crate::packages::resolve::ReportedEnvironment>,
        libc: Option<String>,
        installed: std::collections::BTreeMap<String, String>,
    },
    /// The wheels are unpacked into `site`.
    Installed {
        site: String,
    },
    /// About a process beside the interpreter (the connection's reader routes these).
    Process(super::processes::ProcessEvent),
    /// About a connection to one of the sandbox's ports (`tunnels.py`).
    Tunnel(super::tunnels::TunnelEvent),
    /// A context operation's answer: the contexts it concerned.
    Contexts(Vec<crate::ContextInfo>),
}

/// Why the agent refused or failed a file operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFailure {
    NotFound,
    /// Outside the roots, or the machine's user may not.
    Denied,
    Exists,
    NotEmpty,
    IsADirectory,
    NotADirectory,
    /// The machine's filesystem is full.
    NoSpace,
    TooLarge,
    /// The write was abandoned (the caller's data ended in an error).
    Aborted,
    Invalid,
    /// Anything else (an I/O error, or a kind this engine does not know).
    Io,
}

impl FileFailure {
    fn parse(text: &str) -> Self {
        match text {
            "not_found" => FileFailure::NotFound,
            "denied" => FileFailure::Denied,
            "exists" => FileFailure::Exists,
            "not_empty" => FileFailure::NotEmpty,
            "is_a_directory" => FileFailure::IsADirectory,
            "not_a_directory" => FileFailure::NotADirectory,
            "no_space" => FileFailure::NoSpace,
            "too_large" => FileFailure::TooLarge,
            "aborted" => FileFailure::Aborted,
            "invalid" => FileFailure::Invalid,
            _ => FileFailure::Io,
        }
    }
}

/// The longest file error message kept from the agent.
const MAX_FILE_ERROR_BYTES: usize = 8 * 1024;

/// The longest value in a `packages` event, and most distributions it may list.
const MAX_PACKAGE_TEXT_BYTES: usize = 256;
const MAX_INSTALLED_REPORTED: usize = 20_000;

/// How the agent says an instruction ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentOutcome {
    Value(Option<String>),
    Error { text: String, cause: FailureCause },
}

#[derive(Deserialize)]
struct RawEvent {
    ev: String,
    #[serde(default)]
    python: Option<String>,
    #[serde(default)]
    id: Option<i64>,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    data: Option<serde_json::Value>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    cause: Option<String>,
    #[serde(default)]
    exception: Option<RawException>,
    #[serde(default)]
    runtime_ms: Option<u64>,
    #[serde(default)]
    execution_count: Option<u64>,
    #[serde(default)]
    info: Option<RawFileInfo>,
    #[serde(default)]
    entries: Option<Vec<RawFileInfo>>,
    #[serde(default)]
    truncated: Option<bool>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    results: Option<Vec<RawRichResult>>,
    #[serde(default)]
    environment: Option<crate::packages::resolve::ReportedEnvironment>,
    #[serde(default)]
    libc: Option<String>,
    #[serde(default)]
    installed: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    site: Option<String>,
}

#[derive(Deserialize)]
struct RawException {
    #[serde(default)]
    name: String,
    #[serde(default)]
    qualname: String,
    #[serde(default)]
    module: String,
    #[serde(default)]
    value: String,
}

/// The longest exception class name, qualified name or module kept; and the longest message.
const MAX_EXCEPTION_NAME_BYTES: usize = 1024;
const MAX_EXCEPTION_VALUE_BYTES: usize = 1024 * 1024;

impl RawException {
    fn check(self) -> crate::ExceptionInfo {
        crate::ExceptionInfo {
            name: bounded(self.name, MAX_EXCEPTION_NAME_BYTES),
            qualname: bounded(self.qualname, MAX_EXCEPTION_NAME_BYTES),
            module: bounded(self.module, MAX_EXCEPTION_NAME_BYTES),
            value: bounded(self.value, MAX_EXCEPTION_VALUE_BYTES),
        }
    }
}

#[derive(Deserialize)]
struct RawRichResult {
    kind: String,
    data: serde_json::Value,
}

/// Most MIME types in one result, and the longest type name.
const MAX_BUNDLE_TYPES: usize = 64;
const MAX_MIME_BYTES: usize = 128;
/// Most results at the end of one instruction.
pub const MAX_END_RESULTS: usize = 1024;

/// Checks a rich result the agent sent: a known kind; an object of MIME types (printable
/// ASCII with a `/`) to text, or to any JSON value for JSON types.
fn check_rich(kind: &str, data: serde_json::Value) -> Result<RichResult, ProtocolError> {
    let malformed = |what: String| ProtocolError::Malformed(format!("rich result {what}"));
    let kind =
        RichKind::parse(kind).ok_or_else(|| malformed(format!("of unknown kind {kind:?}")))?;
    let serde_json::Value::Object(data) = data else {
        return Err(malformed("is not an object".into()));
    };
    if data.len() > MAX_BUNDLE_TYPES {
        return Err(malformed(format!("has more than {MAX_BUNDLE_TYPES} types")));
    }
    for (mime, value) in &data {
        let named = mime.len() <= MAX_MIME_BYTES
            && mime.contains('/')
            && mime.bytes().all(|b| b.is_ascii_graphic());
        if !named {
            return Err(malformed("has a type that is not a MIME type".into()));
        }
        if !RichResult::carries_json(mime) && !value.is_string() {
            return Err(malformed(format!("has a {mime} that is not text")));
        }
    }
    Ok(RichResult { kind, data })
}

/// A file as the agent describes it; checked by [`RawFileInfo::check`].
#[derive(Deserialize)]
struct RawFileInfo {
    path: String,
    #[serde(rename = "type")]
    kind: String,
    size: u64,
    mode: u32,
    mtime: f64,
    #[serde(default)]
    symlink_target: Option<String>,
    #[serde(default)]
    metadata: Option<std::collections::BTreeMap<String, String>>,
}

impl RawFileInfo {
    fn check(self) -> Result<FileInfo, ProtocolError> {
        let malformed = |what: &str| ProtocolError::Malformed(format!("file info {what}"));
        if self.path.len() > MAX_PATH_BYTES || !self.path.starts_with('/') {
            return Err(malformed("has a path that is not absolute or is too long"));
        }
        let kind = FileKind::parse(&self.kind).ok_or_else(|| malformed("has an unknown type"))?;
        if self.mode > 0o7777 {
            return Err(malformed("has a mode beyond 7777"));
        }
        if self
            .symlink_target
            .as_ref()
            .is_some_and(|t| t.len() > MAX_PATH_BYTES || !t.starts_with('/'))
        {
            return Err(malformed(
                "has a symlink target that is not absolute or is too long",
            ));
        }
        let metadata = self.metadata.unwrap_or_default();
        if crate::files::validate_metadata(&metadata).is_err() {
            return Err(malformed("has metadata beyond the limits"));
        }
        // To the microsecond (what a double holds of a time now); none before 1970 or after 2286.
        let modified = (self.mtime.is_finite() && (0.0..1e10).contains(&self.mtime))
            .then(|| {
                let micros = (self.mtime * 1e6).round() as i64;
                chrono::DateTime::from_timestamp_micros(micros)
            })
            .flatten();
        Ok(FileInfo {
            path: self.path,
            kind,
            size: self.size,
            mode: self.mode,
            modified,
            symlink_target: self.symlink_target,
            metadata,
        })
    }
}

/// Cuts a text the guest sent to at most `max` bytes, at a character boundary.
fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The parts of a binary output frame (`kind` names it in errors): its kind byte, then `o` or
/// `e` (whether it is stdout), 8 bytes of id, the data.
pub(super) fn split_output_frame<'a>(
    payload: &'a [u8],
    kind: &str,
) -> Result<(bool, [u8; 8], &'a [u8]), ProtocolError> {
    let malformed = |what: &str| ProtocolError::Malformed(format!("{kind} frame {what}"));
    let stdout = match payload.get(1) {
        Some(b'o') => true,
        Some(b'e') => false,
        _ => return Err(malformed("names no stream")),
    };
    let id_bytes: [u8; 8] = payload
        .get(2..10)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| malformed("is too short"))?;
    Ok((stdout, id_bytes, &payload[10..]))
}

/// Decodes a binary output frame: `O`, `o` or `e`, a big-endian i64 id (-1: none), UTF-8 text.
fn decode_output(payload: &[u8]) -> Result<AgentEvent, ProtocolError> {
    let (stdout, id_bytes, text) = split_output_frame(payload, "output")?;
    let stream = if stdout {
        OutputStream::Stdout
    } else {
        OutputStream::Stderr
    };
    let id = i64::from_be_bytes(id_bytes);
    let data = match std::str::from_utf8(text) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(text).into_owned(),
    };
    Ok(AgentEvent::Output {
        id: (id >= 0).then_some(id),
        stream,
        data,
    })
}

/// Decodes and validates one event payload taken whole from the channel (a file data frame
/// keeps its buffer).
pub fn decode_frame(mut payload: Vec<u8>) -> Result<AgentEvent, ProtocolError> {
    if payload.first() == Some(&b'D') {
        payload.remove(0);
        return Ok(AgentEvent::FileData(payload));
    }
    decode_event(&payload)
}

/// Decodes and validates one event payload: a binary output or file data frame, or a JSON event.
pub fn decode_event(payload: &[u8]) -> Result<AgentEvent, ProtocolError> {
    match payload.first() {
        Some(&b'O') => return decode_output(payload),
        Some(&b'D') => return Ok(AgentEvent::FileData(payload[1..].to_vec())),
        Some(&b'P') => return super::processes::decode_output(payload).map(AgentEvent::Process),
        Some(&b'T') => return super::tunnels::decode_frame(payload).map(AgentEvent::Tunnel),
        _ => {}
    }

    let raw: RawEvent =
        serde_json::from_slice(payload).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    let malformed = |what: &str| ProtocolError::Malformed(format!("{} event {what}", raw.ev));
    match raw.ev.as_str() {
        "proc_started" | "proc_failed" | "proc_exit" => {
            let raw: super::processes::RawProcessEvent = serde_json::from_slice(payload)
                .map_err(|e| ProtocolError::Malformed(e.to_string()))?;
            raw.check().map(AgentEvent::Process)
        }
        "tun_opened" | "tun_failed" | "tun_eof" | "tun_closed" => {
            let raw: super::tunnels::RawTunnelEvent = serde_json::from_slice(payload)
                .map_err(|e| ProtocolError::Malformed(e.to_string()))?;
            raw.check().map(AgentEvent::Tunnel)
        }
        "ready" => Ok(AgentEvent::Ready {
            python: raw.python.unwrap_or_default(),
        }),
        "output" => {
            let stream = raw
                .stream
                .as_deref()
                .and_then(OutputStream::from_str_opt)
                .ok_or_else(|| malformed("has no valid stream"))?;
            let Some(serde_json::Value::String(data)) = raw.data else {
                return Err(malformed("has no text data"));
            };
            Ok(AgentEvent::Output {
                id: raw.id,
                stream,
                data,
            })
        }
        "result" => {
            let id = raw.id.ok_or_else(|| malformed("has no id"))?;
            let outcome = match (raw.error, raw.value) {
                (Some(text), None) => {
                    let cause = match raw.cause.as_deref() {
                        Some("timeout") => FailureCause::Timeout,
                        Some("interrupted") => FailureCause::Interrupted,
                        Some("exception") | None => FailureCause::Exception,
                        Some(other) => {
                            return Err(malformed(&format!("has an unknown cause {other:?}")));
                        }
                    };
                    AgentOutcome::Error { text, cause }
                }
                (None, value) => AgentOutcome::Value(value),
                (Some(_), Some(_)) => return Err(malformed("has both a value and an error")),
            };
            let exception = match (&outcome, raw.exception) {
                (_, None) => None,
                (AgentOutcome::Error { .. }, Some(raw)) => Some(raw.check()),
                (AgentOutcome::Value(_), Some(_)) => {
                    return Err(malformed("has an exception but no error"));
                }
            };
            let data = match raw.data {
                None | Some(serde_json::Value::Null) => None,
                Some(object @ serde_json::Value::Object(_)) => Some(object),
                Some(_) => return Err(malformed("has data that is not an object")),
            };
            let raw_results = raw.results.unwrap_or_default();
            if raw_results.len() > MAX_END_RESULTS {
                return Err(malformed("has too many results"));
            }
            let results = raw_results
                .into_iter()
                .map(|r| check_rich(&r.kind, r.data))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(AgentEvent::Result {
                id,
                outcome,
                exception,
                data,
                results,
                runtime_ms: raw.runtime_ms.unwrap_or(0),
                execution_count: raw.execution_count,
            })
        }
        "display" => {
            let id = raw.id.ok_or_else(|| malformed("has no id"))?;
            let kind = raw.kind.unwrap_or_default();
            let data = raw.data.ok_or_else(|| malformed("has no data"))?;
            Ok(AgentEvent::Display {
                id,
                result: check_rich(&kind, data)?,
            })
        }
        "file" => {
            let info = raw.info.map(RawFileInfo::check).transpose()?;
            let entries = match raw.entries {
                Some(entries) if entries.len() > MAX_LIST_ENTRIES => {
                    return Err(malformed("lists too many entries"));
                }
                Some(entries) => Some(
                    entries
                        .into_iter()
                        .map(RawFileInfo::check)
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                None => None,
            };
            Ok(AgentEvent::File {
                info,
                entries,
                truncated: raw.truncated.unwrap_or(false),
            })
        }
        "file_error" => Ok(AgentEvent::FileError {
            failure: FileFailure::parse(raw.kind.as_deref().unwrap_or_default()),
            message: bounded(raw.error.unwrap_or_default(), MAX_FILE_ERROR_BYTES),
        }),
        "file_end" => Ok(AgentEvent::FileEnd {
            size: raw.size.ok_or_else(|| malformed("has no size"))?,
        }),
        "packages" => {
            let environment = raw
                .environment
                .ok_or_else(|| malformed("has no environment"))?;
            let installed = raw.installed.unwrap_or_default();
            let values = [
                &environment.implementation_name,
                &environment.implementation_version,
                &environment.os_name,
                &environment.platform_machine,
                &environment.platform_python_implementation,
                &environment.platform_release,
                &environment.platform_system,
                &environment.platform_version,
                &environment.python_full_version,
                &environment.python_version,
                &environment.sys_platform,
            ];
            let long = |text: &String| text.len() > MAX_PACKAGE_TEXT_BYTES;
            if values.into_iter().any(long) || raw.libc.as_ref().is_some_and(long) {
                return Err(malformed("has a value that is too long"));
            }
            if installed.len() > MAX_INSTALLED_REPORTED
                || installed
                    .iter()
                    .any(|(name, version)| long(name) || long(version))
            {
                return Err(malformed("lists too many or too long distributions"));
            }
            Ok(AgentEvent::Packages {
                environment: Box::new(environment),
                libc: raw.libc,
                installed,
            })
        }
        "contexts" => super::contexts::decode(payload).map(AgentEvent::Contexts),
        "installed" => {
            let site = raw.site.ok_or_else(|| malformed("has no site"))?;
            if site.len() > MAX_PATH_BYTES {
                return Err(malformed("has a site path that is too long"));
            }
            Ok(AgentEvent::Installed { site })
        }
        other => Err(ProtocolError::Malformed(format!(
            "unknown event type {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(json: &str) -> Vec<u8> {
        encode_frame(json.as_bytes()).unwrap()
    }

    #[test]
    fn decodes_frames_split_anywhere() {
        let mut bytes = frame(r#"{"ev":"ready","python":"3.11.2"}"#);
        bytes.extend(frame(
            r#"{"ev":"output","id":0,"stream":"stdout","data":"hi\n"}"#,
        ));
        for split in 0..bytes.len() {
            let mut decoder = FrameDecoder::new();
            decoder.feed(&bytes[..split]);
            let mut frames = Vec::new();
            while let Some(f) = decoder.next_frame().unwrap() {
                frames.push(f);
            }
            decoder.feed(&bytes[split..]);
            while let Some(f) = decoder.next_frame().unwrap() {
                frames.push(f);
            }
            assert_eq!(frames.len(), 2, "split at {split}");
            assert_eq!(decoder.pending(), 0);
        }
    }

    #[test]
    fn refuses_oversized_length_before_buffering() {
        let mut decoder = FrameDecoder::new();
        decoder.feed(&u32::MAX.to_be_bytes());
        assert_eq!(
            decoder.next_frame(),
            Err(ProtocolError::Oversized(u32::MAX as usize))
        );
    }

    #[test]
    fn validates_events() {
        assert!(decode_event(br#"{"ev":"result","id":1,"value":"2","error":"x"}"#).is_err());
        assert!(decode_event(br#"{"ev":"output","stream":"stdin","data":"x"}"#).is_err());
        assert!(decode_event(br#"{"ev":"result","value":"2"}"#).is_err());
        assert!(decode_event(b"not json").is_err());
        assert!(
            decode_event(br#"{"ev":"result","id":1,"value":"2","exception":{"name":"E"}}"#)
                .is_err()
        );
        assert_eq!(
            decode_event(
                br#"{"ev":"result","id":3,"error":"boom","cause":"timeout","runtime_ms":5}"#
            )
            .unwrap(),
            AgentEvent::Result {
                id: 3,
                outcome: AgentOutcome::Error {
                    text: "boom".into(),
                    cause: FailureCause::Timeout
                },
                exception: None,
                data: None,
                results: Vec::new(),
                runtime_ms: 5,
                execution_count: None,
            }
        );
        let AgentEvent::Result {
            execution_count, ..
        } = decode_event(br#"{"ev":"result","id":4,"value":"1","execution_count":7}"#).unwrap()
        else {
            panic!("not a result");
        };
        assert_eq!(execution_count, Some(7));
    }

    #[test]
    fn exceptions_are_decoded_and_bounded() {
        let long = "N".repeat(5000);
        let event = format!(
            r#"{{"ev":"result","id":4,"error":"Traceback...","cause":"exception",
               "exception":{{"name":"{long}","qualname":"f.<locals>.E","module":"__main__",
               "value":"two\nlines"}}}}"#
        );
        let AgentEvent::Result { exception, .. } = decode_event(event.as_bytes()).unwrap() else {
            panic!("not a result");
        };
        let exception = exception.unwrap();
        assert_eq!(exception.name.len(), MAX_EXCEPTION_NAME_BYTES);
        assert_eq!(exception.qualname, "f.<locals>.E");
        assert_eq!(exception.module, "__main__");
        assert_eq!(exception.value, "two\nlines");
    }

    #[test]
    fn rich_results_are_checked() {
        let event = decode_event(
            br#"{"ev":"display","id":2,"kind":"display","data":{"text/plain":"x","text/html":"<b>x</b>","application/vnd.x+json":{"a":[1]}}}"#,
        )
        .unwrap();
        let AgentEvent::Display { id: 2, result } = event else {
            panic!("not a display: {event:?}");
        };
        assert_eq!(result.kind, RichKind::Display);
        assert_eq!(result.data["application/vnd.x+json"]["a"][0], 1);
        let event = decode_event(
            br#"{"ev":"result","id":1,"value":"f","results":[{"kind":"figure","data":{"image/png":"AA=="}}]}"#,
        )
        .unwrap();
        let AgentEvent::Result { results, .. } = event else {
            panic!("not a result: {event:?}");
        };
        assert_eq!(results[0].kind, RichKind::Figure);
        for bad in [
            // No such kind; not an object; a type that is no MIME type; text types hold text.
            r#"{"ev":"display","id":1,"kind":"movie","data":{"text/plain":"x"}}"#,
            r#"{"ev":"display","id":1,"kind":"display","data":["text/plain"]}"#,
            r#"{"ev":"display","id":1,"kind":"display","data":{"plain":"x"}}"#,
            r#"{"ev":"display","id":1,"kind":"display","data":{"text/ plain":"x"}}"#,
            r#"{"ev":"display","id":1,"kind":"display","data":{"text/html":{"a":1}}}"#,
            r#"{"ev":"display","kind":"display","data":{"text/plain":"x"}}"#,
            r#"{"ev":"result","id":1,"value":null,"results":[{"kind":"value","data":{"image/png":7}}]}"#,
        ] {
            assert!(decode_event(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn numbers_in_result_data_are_decoded_exactly() {
        // Without serde_json's `float_roundtrip` this came back one ULP off.
        let event =
            decode_event(br#"{"ev":"result","id":1,"data":{"x":9.158604021021239e-300}}"#).unwrap();
        let AgentEvent::Result {
            data: Some(data), ..
        } = event
        else {
            panic!("not a result with data: {event:?}");
        };
        assert_eq!(
            data["x"].as_f64().map(f64::to_bits),
            Some(9.158_604_021_021_239e-300_f64.to_bits())
        );
    }

    #[test]
    fn decodes_binary_output_frames() {
        let mut payload = b"Oe".to_vec();
        payload.extend(7i64.to_be_bytes());
        payload.extend("caf\u{e9}\n".as_bytes());
        assert_eq!(
            decode_event(&payload).unwrap(),
            AgentEvent::Output {
                id: Some(7),
                stream: OutputStream::Stderr,
                data: "caf\u{e9}\n".into()
            }
        );
        let mut none = b"Oo".to_vec();
        none.extend((-1i64).to_be_bytes());
        none.push(0xff);
        assert_eq!(
            decode_event(&none).unwrap(),
            AgentEvent::Output {
                id: None,
                stream: OutputStream::Stdout,
                data: "\u{fffd}".into()
            }
        );
        assert!(decode_event(b"Ox").is_err());
        assert!(decode_event(b"Oo123").is_err());
    }

    #[test]
    fn decodes_file_events_and_refuses_bad_ones() {
        let event = decode_event(
            br#"{"ev":"file","info":{"path":"/tmp/a","type":"file","size":3,"mode":420,"mtime":1.5}}"#,
        )
        .unwrap();
        let AgentEvent::File {
            info: Some(info), ..
        } = event
        else {
            panic!("not a file event: {event:?}");
        };
        assert_eq!(
            (info.kind, info.size, info.mode),
            (FileKind::File, 3, 0o644)
        );
        assert_eq!(
            info.modified.map(|m| m.timestamp_millis()),
            Some(1500),
            "{info:?}"
        );
        for bad in [
            r#"{"ev":"file","info":{"path":"tmp/a","type":"file","size":3,"mode":420,"mtime":1}}"#,
            r#"{"ev":"file","info":{"path":"/a","type":"pipe","size":3,"mode":420,"mtime":1}}"#,
            r#"{"ev":"file","info":{"path":"/a","type":"file","size":-1,"mode":420,"mtime":1}}"#,
            r#"{"ev":"file","info":{"path":"/a","type":"file","size":1,"mode":99999,"mtime":1}}"#,
            r#"{"ev":"file_end"}"#,
        ] {
            assert!(decode_event(bad.as_bytes()).is_err(), "{bad}");
        }
        let error = decode_event(br#"{"ev":"file_error","kind":"denied","error":"no"}"#).unwrap();
        assert_eq!(
            error,
            AgentEvent::FileError {
                failure: FileFailure::Denied,
                message: "no".into()
            }
        );
        assert_eq!(
            decode_frame(b"Dabc".to_vec()).unwrap(),
            AgentEvent::FileData(b"abc".to_vec())
        );
        let long = format!(
            r#"{{"ev":"file_error","kind":"?","error":"{}"}}"#,
            "é".repeat(9000)
        );
        let AgentEvent::FileError { failure, message } = decode_event(long.as_bytes()).unwrap()
        else {
            panic!("not a file error");
        };
        assert_eq!(failure, FileFailure::Io);
        assert!(message.len() <= MAX_FILE_ERROR_BYTES);
    }

    proptest! {
        #[test]
        fn garbage_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut decoder = FrameDecoder::new();
            for chunk in &chunks {
                decoder.feed(chunk);
                while let Ok(Some(payload)) = decoder.next_frame() {
                    let _ = decode_event(&payload);
                }
            }
        }

        /// Streams of plausible events, however split, through the fuzz harness's checks.
        #[test]
        fn event_streams_hold_the_fuzz_invariants(
            seed in any::<u8>(),
            events in proptest::collection::vec((0u8..4, any::<i64>(), ".{0,12}"), 0..8),
        ) {
            let mut input = vec![seed];
            for (kind, id, text) in &events {
                let payload = match kind {
                    0 => serde_json::json!({"ev": "ready", "python": text}).to_string().into_bytes(),
                    1 => serde_json::json!({"ev": "output", "id": id, "stream": "stderr", "data": text})
                        .to_string()
                        .into_bytes(),
                    2 => serde_json::json!({"ev": "result", "id": id, "error": text, "cause": "timeout"})
                        .to_string()
                        .into_bytes(),
                    _ => {
                        let mut binary = b"Oo".to_vec();
                        binary.extend(id.to_be_bytes());
                        binary.extend(text.as_bytes());
                        binary
                    }
                };
                input.extend(encode_frame(&payload).unwrap());
            }
            crate::fuzz_targets::agent_channel(&input);
        }

        #[test]
        fn frames_round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8), cut in 1usize..50) {
            let mut stream = Vec::new();
            for p in &payloads { stream.extend(encode_frame(p).unwrap()); }
            let mut decoder = FrameDecoder::new();
            let mut out = Vec::new();
            for piece in stream.chunks(cut) {
                decoder.feed(piece);
                while let Some(f) = decoder.next_frame().unwrap() { out.push(f); }
            }
            prop_assert_eq!(out, payloads);
        }
    }
}
