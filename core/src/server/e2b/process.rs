//! envd's `process.Process` service over the machine's processes (`Engine::start_process`):
//! real processes beside the interpreter, with their own pids, stdin, `Connect` to a running one,
//! signals to the whole process group, and `List`. A command runs whether or not code runs,
//! and goes on when the client that started it leaves (as in E2B: `disconnect` is not `kill`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use evervm_engine::{
    MAX_TIMEOUT, Process, ProcessSpec, ProcessState, ProcessStream, ProcessUpdate,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::connect::{self, Code, RpcError};
use super::{E2bState, EnvdCaller, SandboxCaller, lock};

/// The most keepalive interval a client may ask for, and the one used when it asks for none.
const MAX_KEEPALIVE: Duration = Duration::from_secs(300);
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);
/// Encoded pieces waiting for a slow client; past that the client misses output (the process
/// is never held back for a client).
const QUEUED_PIECES: usize = 16;
/// E2B's commands run `/bin/bash -l -c CMD`: where the image has no bash, `sh` runs it (in the
/// same process: the pid stays the command's).
/// The signals E2B's `SendSignal` names (Linux's numbers, as inside every sandbox).
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;
const BASH_OR_SH: &str = "command -v bash >/dev/null 2>&1 && exec bash \"$@\"; exec /bin/sh \"$@\"";

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub(crate) struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    stdin: Option<bool>,
    #[serde(default)]
    pty: Option<PtyRequest>,
    #[serde(default)]
    tag: Option<String>,
}

/// envd's `PTY`: a terminal and its size.
#[derive(Debug, Default, Deserialize)]
struct PtyRequest {
    #[serde(default)]
    size: Option<PtySize>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct PtySize {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

impl PtySize {
    fn terminal(self) -> evervm_engine::TerminalSize {
        evervm_engine::TerminalSize {
            cols: self.cols,
            rows: self.rows,
        }
    }
}

/// `process.Process/Update`: a pty's new size.
#[derive(Debug, Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: ProcessSelector,
    #[serde(default)]
    pty: Option<PtyRequest>,
}

#[derive(Debug, Default, Deserialize)]
struct ProcessSelector {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SelectRequest {
    #[serde(default)]
    process: ProcessSelector,
}

#[derive(Debug, Deserialize)]
struct SendSignalRequest {
    #[serde(default)]
    process: ProcessSelector,
    #[serde(default)]
    signal: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    #[serde(default)]
    process: ProcessSelector,
    #[serde(default)]
    input: ProcessInput,
}

#[derive(Debug, Default, Deserialize)]
struct ProcessInput {
    /// Base64 (bytes in protobuf's JSON).
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

/// The commands running through this listener, by account, machine and pid: what `List` shows
/// and what a tag selects. An entry leaves when its process is over.
#[derive(Debug, Default)]
pub(crate) struct Commands {
    running: Mutex<HashMap<CommandKey, Command>>,
}

/// A command as it was started.
#[derive(Debug)]
struct Command {
    config: ProcessConfig,
    tag: Option<String>,
    /// Whether it runs on a terminal (its output is envd's `pty` data).
    pty: bool,
}

type CommandKey = (i64, String, u32);

/// `POST /process.Process/{method}`.
pub(super) async fn process(
    State(state): State<E2bState>,
    EnvdCaller(caller): EnvdCaller,
    note: crate::server::audit::AuditNote,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let unary = |answered: Result<(), RpcError>| match answered {
        Ok(()) => connect::unary(&serde_json::json!({})),
        Err(e) => e.into_response(),
    };
    match method.as_str() {
        "Start" => start(state, caller, &note, &headers, &body).await,
        "Connect" => reconnect(state, caller, &headers, &body).await,
        "List" => connect::unary(&serde_json::json!({ "processes": list(&state, &caller) })),
        "SendSignal" => unary(send_signal(&state, &caller, &body).await),
        "SendInput" => unary(send_input(&state, &caller, &body).await),
        "CloseStdin" => unary(close_stdin(&state, &caller, &body).await),
        "Update" => unary(update(&state, &caller, &body).await),
        other => RpcError::unimplemented(&format!("process.Process/{other}")).into_response(),
    }
}

fn list(state: &E2bState, caller: &SandboxCaller) -> Vec<serde_json::Value> {
    let mut processes: Vec<(u32, serde_json::Value)> = lock(&state.commands.running)
        .iter()
        .filter(|((account, machine, _), _)| {
            *account == caller.account.id && *machine == caller.sandbox
        })
        .map(|((_, _, pid), command)| {
            let mut entry = serde_json::json!({ "config": command.config, "pid": pid });
            if let Some(tag) = &command.tag {
                entry["tag"] = tag.clone().into();
            }
            (*pid, entry)
        })
        .collect();
    processes.sort_by_key(|(pid, _)| *pid);
    processes.into_iter().map(|(_, entry)| entry).collect()
}

/// The pid a selector names among the caller's commands (another account's are not there).
fn selected(
    state: &E2bState,
    caller: &SandboxCaller,
    selector: &ProcessSelector,
) -> Result<u32, RpcError> {
    if let Some(pid) = selector.pid {
        let key = (caller.account.id, caller.sandbox.clone(), pid);
        if !lock(&state.commands.running).contains_key(&key) {
            return Err(RpcError::new(
                Code::NotFound,
                format!("no process {pid} is running"),
            ));
        }
        return Ok(pid);
    }
    let Some(tag) = &selector.tag else {
        return Err(RpcError::invalid("name the process by pid or tag"));
    };
    lock(&state.commands.running)
        .iter()
        .find(|((account, machine, _), command)| {
            *account == caller.account.id
                && *machine == caller.sandbox
                && command.tag.as_ref() == Some(tag)
        })
        .map(|((_, _, pid), _)| *pid)
        .ok_or_else(|| {
            RpcError::new(
                Code::NotFound,
                format!("no process tagged {tag:?} is running"),
            )
        })
}

fn failure(error: &evervm_engine::Error, caller: &SandboxCaller) -> RpcError {
    super::envd::rpc_failure(error, &caller.sandbox)
}

async fn send_signal(
    state: &E2bState,
    caller: &SandboxCaller,
    body: &[u8],
) -> Result<(), RpcError> {
    let request: SendSignalRequest = connect::parse_unary(body)?;
    let pid = selected(state, caller, &request.process)?;
    let signal = match &request.signal {
        None => SIGKILL,
        Some(serde_json::Value::String(name)) => match name.as_str() {
            "SIGNAL_SIGKILL" => SIGKILL,
            "SIGNAL_SIGTERM" => SIGTERM,
            other => {
                return Err(RpcError::new(
                    Code::Unimplemented,
                    format!("invalid signal: {other}"),
                ));
            }
        },
        Some(serde_json::Value::Number(n)) => match n.as_i64() {
            Some(9) => SIGKILL,
            Some(15) => SIGTERM,
            _ => {
                return Err(RpcError::new(
                    Code::Unimplemented,
                    format!("invalid signal: {n}"),
                ));
            }
        },
        Some(other) => return Err(RpcError::invalid(format!("invalid signal: {other}"))),
    };
    state
        .engine
        .signal_process(&caller.account, &caller.sandbox, pid, signal)
        .await
        .map_err(|e| failure(&e, caller))
}

async fn send_input(state: &E2bState, caller: &SandboxCaller, body: &[u8]) -> Result<(), RpcError> {
    let request: SendInputRequest = connect::parse_unary(body)?;
    let pid = selected(state, caller, &request.process)?;
    // A terminal's input is typed on it; either way it is the process's input.
    let (field, input) = match (request.input.pty, request.input.stdin) {
        (Some(typed), _) => ("pty", typed),
        (None, stdin) => ("stdin", stdin.unwrap_or_default()),
    };
    let data = base64::engine::general_purpose::STANDARD
        .decode(input)
        .map_err(|e| RpcError::invalid(format!("input.{field} is not base64: {e}")))?;
    state
        .engine
        .process_input(&caller.account, &caller.sandbox, pid, data)
        .await
        .map_err(|e| failure(&e, caller))
}

async fn update(state: &E2bState, caller: &SandboxCaller, body: &[u8]) -> Result<(), RpcError> {
    let request: UpdateRequest = connect::parse_unary(body)?;
    let pid = selected(state, caller, &request.process)?;
    let Some(size) = request.pty.and_then(|p| p.size) else {
        return Err(RpcError::invalid("Update needs pty.size"));
    };
    state
        .engine
        .resize_terminal(&caller.account, &caller.sandbox, pid, size.terminal())
        .await
        .map_err(|e| failure(&e, caller))
}

async fn close_stdin(
    state: &E2bState,
    caller: &SandboxCaller,
    body: &[u8],
) -> Result<(), RpcError> {
    let request: SelectRequest = connect::parse_unary(body)?;
    let pid = selected(state, caller, &request.process)?;
    state
        .engine
        .close_process_stdin(&caller.account, &caller.sandbox, pid)
        .await
        .map_err(|e| failure(&e, caller))
}

/// What the process is started as: E2B's `/bin/bash` falls back to `sh`; a relative or E2B
/// home path for `cwd` is the machine's.
fn spec(
    config: &ProcessConfig,
    stdin: bool,
    pty: Option<evervm_engine::TerminalSize>,
    timeout: Duration,
) -> Result<ProcessSpec, RpcError> {
    if config.cmd.is_empty() {
        return Err(RpcError::invalid("Start needs a process.cmd"));
    }
    let mut argv = Vec::with_capacity(config.args.len() + 4);
    if config.cmd == "/bin/bash" || config.cmd == "bash" {
        argv.extend(["/bin/sh", "-c", BASH_OR_SH, "bash"].map(str::to_owned));
    } else {
        argv.push(config.cmd.clone());
    }
    argv.extend(config.args.iter().cloned());
    let cwd = config
        .cwd
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(super::envd::absolute);
    Ok(ProcessSpec {
        argv,
        env: config.envs.clone(),
        cwd,
        stdin,
        timeout: Some(timeout),
        pty,
    })
}

/// The call's timeout, `Connect-Timeout-Ms` (at most the engine's longest), if it has one.
fn call_timeout(headers: &HeaderMap) -> Option<Duration> {
    super::header_text(headers, "connect-timeout-ms")
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| Duration::from_millis(ms).min(MAX_TIMEOUT))
}

pub(super) fn keepalive_interval(headers: &HeaderMap) -> Duration {
    super::header_text(headers, "keepalive-ping-interval")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_KEEPALIVE, |s| {
            Duration::from_secs(s).min(MAX_KEEPALIVE)
        })
}

fn event(value: serde_json::Value) -> Bytes {
    connect::message(&serde_json::json!({ "event": value }))
}

/// A streamed call refused before it started: its only message is the error.
fn refused(error: RpcError) -> Response {
    stream_response(Body::from(error.end_of_stream()))
}

pub(super) fn stream_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [(CONTENT_TYPE, connect::STREAM_CONTENT_TYPE)],
        body,
    )
        .into_response()
}

/// `process.Process/Start`: starts the command and streams its start, output and end.
async fn start(
    state: E2bState,
    caller: SandboxCaller,
    note: &crate::server::audit::AuditNote,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let request: StartRequest = match connect::parse_enveloped(body) {
        Ok(request) => request,
        Err(e) => return refused(e),
    };
    // The command line, kept or hashed as code is (the environment is not kept: it may hold
    // secrets).
    let line = std::iter::once(request.process.cmd.as_str())
        .chain(request.process.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    note.detail(state.engine.audit_detail_for_code(&line));
    // envd's default size when a pty names none.
    let pty = request.pty.map(|p| {
        p.size.map_or(
            evervm_engine::TerminalSize { cols: 80, rows: 24 },
            PtySize::terminal,
        )
    });
    let timeout = call_timeout(headers);
    let stdin = request.stdin == Some(true);
    let spec = match spec(&request.process, stdin, pty, timeout.unwrap_or(MAX_TIMEOUT)) {
        Ok(spec) => spec,
        Err(e) => return refused(e),
    };
    let process = match state
        .engine
        .start_process(&caller.account, &caller.sandbox, spec)
        .await
    {
        Ok(process) => process,
        Err(e) => return refused(failure(&e, &caller)),
    };
    state.sandboxes.touch(&caller.account, &caller.sandbox);
    let command = Command {
        config: request.process,
        tag: request.tag,
        pty: pty.is_some(),
    };
    let on_terminal = command.pty;
    register(&state, &caller, &process, command);
    // At the call's timeout the process is killed (by the engine) and the answer says so.
    stream_response(follow(
        process,
        on_terminal,
        keepalive_interval(headers),
        timeout,
    ))
}

/// `process.Process/Connect`: follows a running command from now on.
async fn reconnect(
    state: E2bState,
    caller: SandboxCaller,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let request: SelectRequest = match connect::parse_enveloped(body) {
        Ok(request) => request,
        Err(e) => return refused(e),
    };
    let pid = match selected(&state, &caller, &request.process) {
        Ok(pid) => pid,
        Err(e) => return refused(e),
    };
    let key = (caller.account.id, caller.sandbox.clone(), pid);
    let on_terminal = lock(&state.commands.running)
        .get(&key)
        .is_some_and(|command| command.pty);
    match state
        .engine
        .connect_process(&caller.account, &caller.sandbox, pid)
        .await
    {
        // Connect's timeout ends the following, not the process.
        Ok(process) => stream_response(follow(
            process,
            on_terminal,
            keepalive_interval(headers),
            call_timeout(headers),
        )),
        Err(e) => refused(failure(&e, &caller)),
    }
}

/// Lists the command until it is over.
fn register(state: &E2bState, caller: &SandboxCaller, process: &Process, command: Command) {
    let key = (caller.account.id, caller.sandbox.clone(), process.pid);
    lock(&state.commands.running).insert(key.clone(), command);
    let commands = Arc::clone(&state.commands);
    let mut watched = process.state.clone();
    tokio::spawn(async move {
        let _ = watched.wait_for(ProcessState::is_over).await;
        lock(&commands.running).remove(&key);
    });
}

/// Go's name for a signal, as envd's `status` says it (`signal: killed`).
fn signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        6 => "aborted",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

/// envd's `end` event for how a process ended.
fn end_event(end: &evervm_engine::ProcessEnd) -> serde_json::Value {
    let (exit_code, status) = match (end.exit_code, end.signal) {
        (Some(code), _) => (code, format!("exit status {code}")),
        (None, Some(signal)) => (-1, format!("signal: {}", signal_name(signal))),
        (None, None) => (-1, "unknown".to_owned()),
    };
    let mut event = serde_json::json!({
        "exitCode": exit_code,
        "exited": end.exit_code.is_some(),
        "status": status,
    });
    if let Some(error) = &end.error {
        event["error"] = error.clone().into();
    } else if exit_code != 0 {
        event["error"] = status.into();
    }
    event
}

/// The response body of a followed process: its start, its output (envd's `pty` data for a
/// process on a terminal), its end, keepalives while it is quiet; after `timeout`, a
/// `deadline_exceeded` error. A client too slow for the output misses pieces, never holds the
/// process back.
fn follow(
    mut process: Process,
    on_terminal: bool,
    keepalive_every: Duration,
    timeout: Option<Duration>,
) -> Body {
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(QUEUED_PIECES);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    tokio::spawn(async move {
        let start = event(serde_json::json!({ "start": { "pid": process.pid } }));
        if tx.send(Ok(start)).await.is_err() {
            return;
        }
        let keepalive = event(serde_json::json!({ "keepalive": {} }));
        let mut quiet = tokio::time::interval(keepalive_every);
        quiet.reset();
        loop {
            let (pieces, last) = tokio::select! {
                update = process.next() => match update {
                    ProcessUpdate::Output(piece) => {
                        let stream = match piece.stream {
                            _ if on_terminal => "pty",
                            ProcessStream::Stdout => "stdout",
                            ProcessStream::Stderr => "stderr",
                        };
                        let data = base64::engine::general_purpose::STANDARD.encode(&piece.data);
                        (vec![Ok(event(serde_json::json!({ "data": { stream: data } })))], false)
                    }
                    ProcessUpdate::Missed(n) => {
                        tracing::debug!(pid = process.pid, "a client missed {n} pieces of output");
                        continue;
                    }
                    ProcessUpdate::Over(ProcessState::Ended { end, .. }) => (
                        vec![
                            Ok(event(serde_json::json!({ "end": end_event(&end) }))),
                            Ok(connect::end_of_stream(None)),
                        ],
                        true,
                    ),
                    // As when E2B's sandbox dies: the answer breaks off, and the SDK, finding
                    // the sandbox gone (/health), says it was killed.
                    ProcessUpdate::Over(_) => {
                        (vec![Err(std::io::Error::other("the sandbox stopped"))], true)
                    }
                },
                _ = quiet.tick() => (vec![Ok(keepalive.clone())], false),
                () = sleep_until(deadline) => {
                    let error = RpcError::new(Code::DeadlineExceeded, "the command's timeout passed");
                    (vec![Ok(error.end_of_stream())], true)
                }
                () = tx.closed() => return,
            };
            for piece in pieces {
                if tx.send(piece).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
            quiet.reset();
        }
    });
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    }))
}

/// Sleeps until `deadline`, or for ever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_falls_back_to_sh_in_the_same_process() {
        let config = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "echo hi".into()],
            envs: BTreeMap::from([("A".into(), "1".into())]),
            cwd: Some("d".into()),
        };
        let made = spec(&config, false, None, Duration::from_secs(5)).unwrap();
        assert_eq!(made.argv[..4], ["/bin/sh", "-c", BASH_OR_SH, "bash"]);
        assert_eq!(made.argv[4..], ["-l", "-c", "echo hi"]);
        assert_eq!(made.cwd.as_deref(), Some("/home/user/d"));
        assert!(
            spec(
                &ProcessConfig::default(),
                false,
                None,
                Duration::from_secs(5)
            )
            .is_err()
        );
    }

    #[test]
    fn ends_read_as_envd_says_them() {
        let killed = evervm_engine::ProcessEnd {
            exit_code: None,
            signal: Some(SIGKILL),
            error: None,
        };
        let event = end_event(&killed);
        assert_eq!(event["status"], "signal: killed");
        assert_eq!(event["exited"], false);
        assert_eq!(event["exitCode"], -1);
        let ok = evervm_engine::ProcessEnd {
            exit_code: Some(0),
            signal: None,
            error: None,
        };
        assert_eq!(end_event(&ok).get("error"), None);
    }
}
