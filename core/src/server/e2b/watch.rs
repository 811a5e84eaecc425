//! envd's directory watches (`filesystem.Filesystem/WatchDir`, and the polled
//! `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` of the sync SDKs) over the machine's
//! watches (`Engine::watch_dir`: inotify inside the sandbox). A change the caller made through
//! the files API is there when that call has answered.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use evervm_engine::{Process, ProcessState, ProcessUpdate};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::connect::{self, Code, RpcError};
use super::{E2bState, SandboxCaller, lock};

/// The most events one `GetWatcherEvents` returns (the rest wait for the next).
const MAX_EVENTS_PER_POLL: usize = 10_000;

/// The polled watchers, by id: whose they are, and the watch.
#[derive(Default)]
pub(crate) struct Watchers {
    next: AtomicU64,
    watching: Mutex<HashMap<String, Watcher>>,
}

struct Watcher {
    account: i64,
    sandbox: String,
    /// The directory watched, as the engine names it, and whether events carry entries.
    directory: String,
    include_entry: bool,
    process: Process,
    /// Events read but not yet returned (a poll returns at most [`MAX_EVENTS_PER_POLL`]).
    pending: Vec<serde_json::Value>,
}

impl Watcher {
    /// Whether it is the caller's (another account's or sandbox's watcher is not found).
    fn belongs_to(&self, caller: &SandboxCaller) -> bool {
        self.account == caller.account.id && self.sandbox == caller.sandbox
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    /// Each event with the entry it concerns, where it still exists (envd 0.6.3). envd also
    /// takes `allowNetworkMounts` (0.6.4): a machine has no network mounts, so it changes
    /// nothing here.
    #[serde(default)]
    include_entry: bool,
}

/// The most events a poll or a piece of a stream looks up entries for (the rest have none).
const MAX_ENTRIES_LOOKED_UP: usize = 1000;

/// Adds the entry each event concerns, where it exists.
async fn with_entries(
    state: &E2bState,
    caller: &SandboxCaller,
    directory: &str,
    events: &mut [serde_json::Value],
) {
    for event in events.iter_mut().take(MAX_ENTRIES_LOOKED_UP) {
        let Some(name) = event.get("name").and_then(|n| n.as_str()) else {
            continue;
        };
        let path = format!("{}/{name}", directory.trim_end_matches('/'));
        if let Ok(info) = state
            .engine
            .stat_file(&caller.account, &caller.sandbox, &path)
            .await
            && let Ok(entry) = serde_json::to_value(super::envd::entry(&info))
        {
            event["entry"] = entry;
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

/// envd's event type for one of the machine's.
fn event_type(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "create" => "EVENT_TYPE_CREATE",
        "write" => "EVENT_TYPE_WRITE",
        "remove" => "EVENT_TYPE_REMOVE",
        "rename" => "EVENT_TYPE_RENAME",
        "chmod" => "EVENT_TYPE_CHMOD",
        _ => return None,
    })
}

/// The events in a piece of a watch's output (a JSON line each).
fn events_in(data: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(data)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|event| {
            let name = event.get("name")?.as_str()?.to_owned();
            let kind = event_type(event.get("type")?.as_str()?)?;
            Some(serde_json::json!({ "name": name, "type": kind }))
        })
        .collect()
}

async fn start(
    state: &E2bState,
    caller: &SandboxCaller,
    request: &WatchRequest,
) -> Result<Process, RpcError> {
    let path = super::envd::to_machine(&request.path);
    state
        .engine
        .watch_dir(&caller.account, &caller.sandbox, &path, request.recursive)
        .await
        .map_err(|e| super::envd::rpc_failure(&e, &caller.sandbox))
}

/// `CreateWatcher`: starts a watch polled by `GetWatcherEvents`.
pub(super) async fn create(
    state: &E2bState,
    caller: &SandboxCaller,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let request: WatchRequest = connect::parse_unary(body)?;
    let process = start(state, caller, &request).await?;
    let id = format!("w{}", state.watchers.next.fetch_add(1, Ordering::SeqCst));
    let mut ended = process.state.clone();
    lock(&state.watchers.watching).insert(
        id.clone(),
        Watcher {
            account: caller.account.id,
            sandbox: caller.sandbox.clone(),
            directory: super::envd::to_machine(&request.path),
            include_entry: request.include_entry,
            process,
            pending: Vec::new(),
        },
    );
    // A watch whose machine went away leaves the list with it.
    let watchers = std::sync::Arc::clone(&state.watchers);
    let key = id.clone();
    tokio::spawn(async move {
        let _ = ended.wait_for(ProcessState::is_over).await;
        lock(&watchers.watching).remove(&key);
    });
    Ok(serde_json::json!({ "watcherId": id }))
}

/// `GetWatcherEvents`: what the watcher saw since the last call.
pub(super) async fn poll(
    state: &E2bState,
    caller: &SandboxCaller,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let request: WatcherRequest = connect::parse_unary(body)?;
    let (mut events, entries_of) = taken(state, caller, &request)?;
    if let Some(directory) = entries_of {
        with_entries(state, caller, &directory, &mut events).await;
    }
    Ok(serde_json::json!({ "events": events }))
}

/// The events a poll returns, and the directory to look their entries up in if it should.
fn taken(
    state: &E2bState,
    caller: &SandboxCaller,
    request: &WatcherRequest,
) -> Result<(Vec<serde_json::Value>, Option<String>), RpcError> {
    let mut watching = lock(&state.watchers.watching);
    let watcher = watching
        .get_mut(&request.watcher_id)
        .filter(|w| w.belongs_to(caller))
        .ok_or_else(|| not_found(&request.watcher_id))?;
    while watcher.pending.len() < MAX_EVENTS_PER_POLL {
        match watcher.process.output.try_recv() {
            Ok(piece) => watcher.pending.extend(events_in(&piece.data)),
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => {
                tracing::debug!("a watcher missed {n} pieces of events");
            }
            Err(_) => break,
        }
    }
    let take = watcher.pending.len().min(MAX_EVENTS_PER_POLL);
    let events: Vec<serde_json::Value> = watcher.pending.drain(..take).collect();
    let entries_of = watcher.include_entry.then(|| watcher.directory.clone());
    Ok((events, entries_of))
}

/// `RemoveWatcher`.
pub(super) async fn remove(
    state: &E2bState,
    caller: &SandboxCaller,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let request: WatcherRequest = connect::parse_unary(body)?;
    let watcher = {
        let mut watching = lock(&state.watchers.watching);
        if !watching
            .get(&request.watcher_id)
            .is_some_and(|w| w.belongs_to(caller))
        {
            return Err(not_found(&request.watcher_id));
        }
        watching.remove(&request.watcher_id)
    };
    if let Some(watcher) = watcher {
        state
            .engine
            .end_process(&caller.account, &caller.sandbox, &watcher.process)
            .await
            .map_err(|e| super::envd::rpc_failure(&e, &caller.sandbox))?;
    }
    Ok(serde_json::json!({}))
}

fn not_found(id: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("watcher {id} not found"))
}

/// `WatchDir`: the events as a stream (the async SDKs'), ended by the client.
pub(super) async fn stream(
    state: E2bState,
    caller: SandboxCaller,
    keepalive_every: Duration,
    body: &[u8],
) -> Body {
    let request: WatchRequest = match connect::parse_enveloped(body) {
        Ok(request) => request,
        Err(e) => return Body::from(e.end_of_stream()),
    };
    let mut process = match start(&state, &caller, &request).await {
        Ok(process) => process,
        Err(e) => return Body::from(e.end_of_stream()),
    };
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(64);
    let directory = super::envd::to_machine(&request.path);
    tokio::spawn(async move {
        // WatchDirResponse's oneof is the message itself (no `event` field as a process's has).
        let event = |value: serde_json::Value| connect::message(&value);
        if tx
            .send(Ok(event(serde_json::json!({ "start": {} }))))
            .await
            .is_err()
        {
            let _ = state
                .engine
                .end_process(&caller.account, &caller.sandbox, &process)
                .await;
            return;
        }
        let mut quiet = tokio::time::interval(keepalive_every);
        quiet.reset();
        loop {
            let pieces: Vec<Bytes> = tokio::select! {
                update = process.next() => match update {
                    ProcessUpdate::Output(piece) => {
                        let mut events = events_in(&piece.data);
                        if request.include_entry {
                            with_entries(&state, &caller, &directory, &mut events).await;
                        }
                        events
                            .into_iter()
                            .map(|e| event(serde_json::json!({ "filesystem": e })))
                            .collect()
                    }
                    ProcessUpdate::Missed(_) => continue,
                    ProcessUpdate::Over(_) => {
                        let error = RpcError::new(Code::Unavailable, "the watch ended: the sandbox stopped");
                        let _ = tx.send(Ok(error.end_of_stream())).await;
                        return;
                    }
                },
                _ = quiet.tick() => vec![event(serde_json::json!({ "keepalive": {} }))],
                () = tx.closed() => break,
            };
            for piece in pieces {
                if tx.send(Ok(piece)).await.is_err() {
                    break;
                }
            }
            quiet.reset();
        }
        // The client left: so does the watch.
        let _ = state
            .engine
            .end_process(&caller.account, &caller.sandbox, &process)
            .await;
    });
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    }))
}
