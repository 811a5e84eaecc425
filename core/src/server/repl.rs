//! `GET /v1/machine/{machine_name}/repl`: the ForeverVM WebSocket REPL.
//!
//! `connected` first; then for each `exec`: `exec_received` at once, the instruction's `output`
//! messages, then its `result`. Execs sent back to back are queued on the machine in order and
//! streamed in that order, each `exec_received` still sent as soon as its exec arrives. The
//! server never sends pings (the Rust SDK would stop reading) nor any message type outside the
//! protocol (`display` messages only to a client that asked with `?rich=true`); it answers the
//! client's pings. The machine name `new` creates a machine for the
//! connection; an unknown machine gets the upgrade, an `error` message, and a close, so that every
//! SDK reports the problem instead of retrying.
//!
//! A message over `BODY_LIMIT_BYTES` gets a `PayloadTooLarge` error and a close with code 1009.
//! Output goes out only as fast as the client reads it: a client that stops reading holds up its
//! own connection (what the socket buffers, plus one batch of events), never the machine or other
//! connections. Until it reads or leaves, the engine's event stream it reads from keeps that
//! instruction's output in memory.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::response::Response;
use evervm_engine::{self as engine, Account, Engine};
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};

use super::AppState;
use super::auth::WsAuthed;
use super::error::ApiFailure;
use super::exec::RichQuery;
use super::extract::{WirePath, WireQuery};
use super::redact::Redactor;
use crate::convert::server::{EventView, event_to_wire, exec_from_wire};
use crate::protocol::{ErrorCode, MessageFromServer, MessageToServer, WireInstruction};

/// The machine name that asks for a new machine.
const NEW: &str = "new";

/// Longest close reason a close frame can carry, in bytes.
const MAX_CLOSE_REASON: usize = 123;

/// How long `exec_received` waits for ForeverVM's Rust SDK (`x-forevervm-sdk: rust`). That SDK
/// sends an `exec` and only then starts waiting for its `exec_received`; one that arrives first
/// is dropped, and the instruction's output and result with it (seen with the SDK 0.1.35 and its
/// CLI against this server). No other client needs the pause.
const RUST_SDK_EXEC_RECEIVED_DELAY: std::time::Duration = std::time::Duration::from_millis(10);

pub(crate) async fn repl(
    State(state): State<AppState>,
    WsAuthed(account, token_id): WsAuthed,
    WirePath(name): WirePath<String>,
    WireQuery(query): WireQuery<RichQuery>,
    headers: axum::http::HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiFailure> {
    let rust_sdk = headers
        .get("x-forevervm-sdk")
        .is_some_and(|sdk| sdk.as_bytes() == b"rust");
    let upgrade = upgrade.map_err(|rejection| {
        ApiFailure::new(
            rejection.status(),
            ErrorCode::BAD_REQUEST.code,
            format!("this route is a WebSocket: {}", rejection.body_text()),
        )
    })?;
    Ok(upgrade
        .max_message_size(super::BODY_LIMIT_BYTES)
        .on_upgrade(move |socket| {
            let caller = Caller { account, token_id };
            session(state, caller, name, socket, rust_sdk, query.rich)
        }))
}

/// Who is on the other end of a connection.
struct Caller {
    account: Account,
    /// Its token's id, for the audit log.
    token_id: String,
}

/// The instruction being streamed: its seq and its events, in batches of those ready at once.
type Streaming = (i64, BoxStream<'static, Vec<engine::ExecEvent>>);

/// Instructions a connection may have accepted and not yet streamed back.
const MAX_UNSENT_RESULTS: usize = 1024;

/// Most events sent in one batch before the socket is flushed.
const EVENT_BATCH: usize = 1024;

/// Whether the session goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// One connection, once upgraded.
struct Session {
    engine: Engine,
    redactor: Arc<Redactor>,
    account: Account,
    token_id: String,
    machine: String,
    socket: WebSocket,
    /// Accepted instructions not yet streamed, in order.
    queue: VecDeque<i64>,
    /// The client is ForeverVM's Rust SDK (`x-forevervm-sdk: rust`): each `exec_received`
    /// waits a moment (see `RUST_SDK_EXEC_RECEIVED_DELAY`), and output lines ready together
    /// go as one chunk (see `lines_together`).
    rust_sdk: bool,
    streaming: Option<Streaming>,
    /// The client asked for rich results (`?rich=true`).
    rich: bool,
    /// How the client sees the instruction being streamed.
    view: EventView,
}

async fn session(
    state: AppState,
    Caller { account, token_id }: Caller,
    requested: String,
    mut socket: WebSocket,
    rust_sdk: bool,
    rich: bool,
) {
    let AppState {
        engine, redactor, ..
    } = state;
    let machine = match open_machine(&engine, &account, &requested).await {
        Ok(machine) => machine,
        Err(failure) => return fail(&mut socket, &failure, &redactor).await,
    };
    let connected = MessageFromServer::Connected {
        machine_name: machine.clone(),
    };
    if send(&mut socket, &connected).await.is_err() {
        return;
    }
    let mut session = Session {
        engine,
        redactor,
        account,
        token_id,
        machine,
        socket,
        queue: VecDeque::new(),
        rust_sdk,
        streaming: None,
        rich,
        view: EventView::new(rich),
    };
    while session.step().await == Flow::Continue {}
}

impl Session {
    /// Waits for a client message or the next event of the instruction being streamed, and
    /// handles it.
    async fn step(&mut self) -> Flow {
        if self.streaming.is_none()
            && let Some(seq) = self.queue.pop_front()
        {
            match self.engine.events(&self.account, &self.machine, seq).await {
                Ok(events) => {
                    self.streaming = Some((seq, events.ready_chunks(EVENT_BATCH).boxed()));
                    self.view = EventView::new(self.rich);
                }
                Err(e) => {
                    fail(&mut self.socket, &ApiFailure::from(e), &self.redactor).await;
                    return Flow::Stop;
                }
            }
        }
        tokio::select! {
            incoming = self.socket.recv() => self.on_incoming(incoming).await,
            event = next_event(&mut self.streaming) => self.on_event(event).await,
        }
    }

    async fn on_incoming(&mut self, incoming: Option<Result<Message, axum::Error>>) -> Flow {
        let decoded = match incoming {
            None | Some(Ok(Message::Close(_))) => return Flow::Stop,
            Some(Err(e)) if is_oversize(&e) => {
                let failure = ApiFailure::payload_too_large(format!(
                    "a WebSocket message is limited to {} bytes",
                    super::BODY_LIMIT_BYTES
                ));
                fail(&mut self.socket, &failure, &self.redactor).await;
                return Flow::Stop;
            }
            Some(Err(e)) => {
                tracing::debug!(machine = self.machine, "WebSocket closed: {e}");
                return Flow::Stop;
            }
            // Pings are answered by the WebSocket layer itself.
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => return Flow::Continue,
            Some(Ok(Message::Text(text))) => decode_message(text.as_bytes()),
            Some(Ok(Message::Binary(bytes))) => decode_message(&bytes),
        };
        match decoded {
            Ok(MessageToServer::Exec {
                instruction,
                request_id,
            }) => self.exec(instruction, request_id).await,
            Err(failure) => flow(send_error(&mut self.socket, &failure).await),
        }
    }

    async fn exec(&mut self, instruction: WireInstruction, request_id: u32) -> Flow {
        let accepted = match exec_from_wire(instruction, false) {
            // Instructions accepted on this connection whose results it has not sent yet: a
            // client that sends far faster than it reads is told to wait.
            Ok(_) if self.queue.len() >= MAX_UNSENT_RESULTS => {
                Err(engine::Error::limit_exceeded(format!(
                    "this connection has {MAX_UNSENT_RESULTS} instructions whose results it has \
                     not read yet: read them before sending more"
                )))
            }
            Ok(request) => {
                let detail = self.engine.audit_detail_for_code(&request.code);
                let accepted = self
                    .engine
                    .exec(&self.account, &self.machine, request)
                    .await;
                let outcome = match &accepted {
                    Ok(_) => "ok".to_owned(),
                    Err(e) => super::audit::outcome(ApiFailure::from(e).status),
                };
                let entry = engine::store::AuditEntry {
                    account: Some(self.account.name.clone()),
                    token_id: Some(self.token_id.clone()),
                    machine: Some(self.machine.clone()),
                    detail: Some(detail),
                    ..engine::store::AuditEntry::now("websocket", "exec", &outcome)
                };
                self.engine.record_audit(entry).await;
                accepted
            }
            Err(e) => Err(e),
        };
        match accepted {
            Ok(accepted) => {
                let received = MessageFromServer::ExecReceived {
                    seq: accepted.seq,
                    request_id,
                };
                self.queue.push_back(accepted.seq);
                if self.rust_sdk {
                    tokio::time::sleep(RUST_SDK_EXEC_RECEIVED_DELAY).await;
                }
                flow(send(&mut self.socket, &received).await)
            }
            // The client waits for this exec's result: end the connection so that no client
            // hangs (the Rust SDK only logs `error` messages).
            Err(e) => {
                fail(&mut self.socket, &ApiFailure::from(&e), &self.redactor).await;
                Flow::Stop
            }
        }
    }

    async fn on_event(&mut self, batch: Option<(i64, Vec<engine::ExecEvent>)>) -> Flow {
        let Some((seq, events)) = batch else {
            // A stream always ends with its result; if one did not, go on with the next.
            if let Some((seq, _)) = self.streaming.take() {
                tracing::warn!(
                    machine = self.machine,
                    seq,
                    "instruction events ended without a result"
                );
            }
            return Flow::Continue;
        };
        let events = if self.rust_sdk {
            lines_together(events)
        } else {
            events
        };
        // Everything ready is written, then flushed once: one system call for many lines.
        for event in events {
            if matches!(event, engine::ExecEvent::Result(_)) {
                self.streaming = None;
            }
            let Some(message) = event_to_wire(seq, event, &self.redactor, &mut self.view) else {
                continue;
            };
            if feed(&mut self.socket, &message).await.is_err() {
                return Flow::Stop;
            }
        }
        flow(self.socket.flush().await.map_err(|e| {
            tracing::debug!("WebSocket flush failed: {e}");
        }))
    }
}

/// Output lines of one stream that follow each other in `events`, as one chunk of those lines
/// joined with newlines. ForeverVM's Rust SDK (so its CLI's `repl`) keeps at most 50 chunks it
/// has not shown yet (0.1.35's `broadcast::channel(50)`) and silently drops the rest of a large
/// print; it prints a chunk as it is, so the lines still show one per line.
fn lines_together(events: Vec<engine::ExecEvent>) -> Vec<engine::ExecEvent> {
    let mut merged: Vec<engine::ExecEvent> = Vec::with_capacity(events.len());
    for event in events {
        if let engine::ExecEvent::Output(chunk) = &event
            && chunk.stream != engine::OutputStream::Display
            && let Some(engine::ExecEvent::Output(last)) = merged.last_mut()
            && last.stream == chunk.stream
            && last.data.len() + chunk.data.len() < MAX_MERGED_CHUNK_BYTES
        {
            last.data.push('\n');
            last.data.push_str(&chunk.data);
            last.partial = chunk.partial;
            continue;
        }
        merged.push(event);
    }
    merged
}

/// The longest chunk made of merged lines.
const MAX_MERGED_CHUNK_BYTES: usize = 1024 * 1024;

/// A client's message (text, or binary holding UTF-8 JSON), decoded.
pub(crate) fn decode_message(bytes: &[u8]) -> Result<MessageToServer, ApiFailure> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| ApiFailure::bad_request("binary message is not UTF-8 JSON"))?;
    serde_json::from_str(text)
        .map_err(|e| ApiFailure::bad_request(format!("unreadable message: {e}")))
}

fn flow(sent: Result<(), ()>) -> Flow {
    if sent.is_ok() {
        Flow::Continue
    } else {
        Flow::Stop
    }
}

/// The next events of the instruction being streamed; never resolves when there is none.
async fn next_event(streaming: &mut Option<Streaming>) -> Option<(i64, Vec<engine::ExecEvent>)> {
    match streaming {
        Some((seq, events)) => events.next().await.map(|event| (*seq, event)),
        None => std::future::pending().await,
    }
}

/// Whether a read failed because the client's message (or one frame of it) was over the limit.
/// The WebSocket layer has then read the whole frame, unless the frame itself was over its own
/// 16 MiB frame limit; either way the connection cannot go on.
fn is_oversize(error: &axum::Error) -> bool {
    let source = std::error::Error::source(error);
    matches!(
        source.and_then(|e| e.downcast_ref::<tungstenite::Error>()),
        Some(tungstenite::Error::Capacity(_))
    )
}

/// The machine of this connection: a new one for `new`, else the named one if the account has it.
async fn open_machine(
    engine: &Engine,
    account: &Account,
    requested: &str,
) -> Result<String, ApiFailure> {
    if requested == NEW {
        let info = engine
            .create_machine(account, engine::CreateMachine::default())
            .await?;
        Ok(info.name.to_string())
    } else {
        engine.machine_info(account, requested).await?;
        Ok(requested.to_owned())
    }
}

fn encode(message: &MessageFromServer) -> Result<Message, ()> {
    let text = serde_json::to_string(message).map_err(|e| {
        tracing::error!("cannot encode {message:?}: {e}");
    })?;
    Ok(Message::Text(text.into()))
}

/// Sends one message and flushes.
async fn send(socket: &mut WebSocket, message: &MessageFromServer) -> Result<(), ()> {
    socket.send(encode(message)?).await.map_err(|e| {
        tracing::debug!("WebSocket send failed: {e}");
    })
}

/// Queues one message without flushing.
async fn feed(socket: &mut WebSocket, message: &MessageFromServer) -> Result<(), ()> {
    socket.feed(encode(message)?).await.map_err(|e| {
        tracing::debug!("WebSocket send failed: {e}");
    })
}

async fn send_error(socket: &mut WebSocket, failure: &ApiFailure) -> Result<(), ()> {
    tracing::debug!(code = failure.code, "REPL error: {}", failure.message);
    let message = MessageFromServer::Error {
        code: failure.code.to_owned(),
        id: None,
    };
    send(socket, &message).await
}

/// Sends an `error` message, then closes the connection with the message (without host paths)
/// as the reason: code 1009 (message too big) for a message or code over its limit, 1011 for a
/// server error, 1008 otherwise.
async fn fail(socket: &mut WebSocket, failure: &ApiFailure, redactor: &Redactor) {
    if send_error(socket, failure).await.is_err() {
        return;
    }
    let code = if failure.status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        close_code::SIZE
    } else if failure.status.is_server_error() {
        close_code::ERROR
    } else {
        close_code::POLICY
    };
    let frame = CloseFrame {
        code,
        reason: close_reason(&redactor.text(&failure.message)).into(),
    };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

/// `text` cut to fit a close frame, at a character boundary.
pub(crate) fn close_reason(text: &str) -> String {
    if text.len() <= MAX_CLOSE_REASON {
        return text.to_owned();
    }
    let mut end = MAX_CLOSE_REASON;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_ready_together_go_as_one_chunk_per_stream_run() {
        let line = |seq: i64, stream, data: &str| {
            engine::ExecEvent::Output(engine::OutputChunk {
                seq,
                stream,
                data: data.to_owned(),
                partial: false,
            })
        };
        let mut events: Vec<_> = (0..500)
            .map(|i| line(i, engine::OutputStream::Stdout, &i.to_string()))
            .collect();
        events.push(line(500, engine::OutputStream::Stderr, "oops"));
        events.push(line(501, engine::OutputStream::Stdout, "after"));
        let merged = lines_together(events);
        assert_eq!(merged.len(), 3);
        let engine::ExecEvent::Output(first) = &merged[0] else {
            panic!("not output");
        };
        assert_eq!(first.data.lines().count(), 500);
        assert_eq!(first.data.lines().last(), Some("499"));
    }

    #[test]
    fn close_reasons_fit_a_frame() {
        assert_eq!(close_reason("short"), "short");
        let long = "é".repeat(100);
        let cut = close_reason(&long);
        assert!(cut.len() <= MAX_CLOSE_REASON);
        assert!(long.starts_with(&cut));
        assert_eq!(cut.len(), 122);
    }
}
