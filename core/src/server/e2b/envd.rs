//! E2B's envd, the daemon inside a sandbox (port 49983), over the machine: `/health`, files in
//! and out (`/files`), the `filesystem.Filesystem` calls (Stat, ListDir, MakeDir, Remove, Move)
//! and `process.Process/Start` (a shell command, run by the machine's interpreter in its
//! sandbox, its output streamed), with SendSignal and List for the commands running.
//!
//! Paths: E2B's home, `/home/user`, is the machine's home, both ways (a gVisor machine's home is
//! `/home/user`, or `/home/machine` on images made before evervm took E2B's user).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Path, Query, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use evervm_engine::{Account, ExecEvent, FileInfo, FileKind, Outcome, WriteFileOptions};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::connect::{self, Code, RpcError};
use super::interpreter::E2B_HOME;
use super::run;
use super::{E2bFailure, E2bState, EnvdCaller, SandboxCaller};

/// The most entries a recursive listing returns.
const MAX_LISTED: usize = evervm_engine::files::MAX_LIST_ENTRIES;
/// The deepest listing (E2B's SDKs ask for 1 unless told).
const MAX_DEPTH: u32 = 16;

/// A path as E2B names it, as the engine takes it: `/home/user/...` is `~/...`.
pub(super) fn to_machine(path: &str) -> String {
    if path == E2B_HOME {
        "~".to_owned()
    } else if let Some(rest) = path.strip_prefix(E2B_HOME).filter(|r| r.starts_with('/')) {
        format!("~{rest}")
    } else if path.is_empty() {
        "~".to_owned()
    } else {
        path.to_owned()
    }
}

/// A path as the engine reports it, as E2B names it.
fn to_e2b(path: &str) -> String {
    let home = evervm_engine::guest::image::LEGACY_HOME;
    if path == home {
        E2B_HOME.to_owned()
    } else if let Some(rest) = path.strip_prefix(home).filter(|r| r.starts_with('/')) {
        format!("{E2B_HOME}{rest}")
    } else {
        path.to_owned()
    }
}

/// `GET /health`: 204 while the sandbox runs, 502 when it is paused or gone.
pub(super) async fn health(
    State(state): State<E2bState>,
    EnvdCaller(caller): EnvdCaller,
) -> Result<StatusCode, E2bFailure> {
    match state.sandboxes.clock(&caller.sandbox) {
        Some(clock) if clock.account.id == caller.account.id => Ok(StatusCode::NO_CONTENT),
        _ => Err(E2bFailure::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "The sandbox {} was not found (or is paused)",
                caller.sandbox
            ),
        )),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct FileQuery {
    #[serde(default)]
    path: Option<String>,
    /// A signed URL's (see `signed.rs`).
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    signature_expiration: Option<String>,
}

/// Who a files request acts for: a signed URL's signer, else the authenticated caller.
async fn files_caller(
    state: &E2bState,
    caller: Result<EnvdCaller, E2bFailure>,
    query: &FileQuery,
    operation: &str,
) -> Result<SandboxCaller, E2bFailure> {
    let Some(signature) = query.signature.as_deref() else {
        return caller.map(|EnvdCaller(caller)| caller);
    };
    let signed = super::signed::Signed {
        path: query.path.as_deref().unwrap_or_default(),
        username: query.username.as_deref().unwrap_or_default(),
        signature,
        expiration: query.signature_expiration.as_deref(),
    };
    let (account, sandbox) = super::signed::verify(state, &signed, operation).await?;
    Ok(SandboxCaller { account, sandbox })
}

/// The envd form of a file failure: `{"code", "message"}` with its status; a missing machine
/// is 502 ("was not found").
fn file_failure(error: &evervm_engine::Error, sandbox: &str) -> E2bFailure {
    super::sandbox_failure(error, sandbox)
}

/// `GET /files?path=`: the file's bytes, streamed.
pub(super) async fn read_file(
    State(state): State<E2bState>,
    caller: Result<EnvdCaller, E2bFailure>,
    Query(query): Query<FileQuery>,
) -> Result<Response, E2bFailure> {
    let SandboxCaller { account, sandbox } = files_caller(&state, caller, &query, "read").await?;
    let path = query
        .path
        .ok_or_else(|| E2bFailure::bad_request("GET /files needs ?path="))?;
    let read = state
        .engine
        .read_file(&account, &sandbox, &to_machine(&path))
        .await
        .map_err(|e| file_failure(&e, &sandbox))?;
    state.sandboxes.touch(&account, &sandbox);
    let body = Body::from_stream(
        read.data
            .map(|piece| piece.map_err(|e| std::io::Error::other(e.to_string()))),
    );
    Ok(([(CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

/// What a write answers per file (exactly these fields: older SDKs refuse others).
#[derive(Debug, Serialize)]
struct WrittenEntry {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

/// The metadata an upload gives its files: its `X-Metadata-<name>` headers (names lowercased,
/// as envd does).
fn upload_metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, E2bFailure> {
    let mut metadata = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        let value = value.to_str().map_err(|_| {
            E2bFailure::bad_request(format!(
                "metadata {key:?}: the value is not printable ASCII"
            ))
        })?;
        metadata.insert(key.to_owned(), value.to_owned());
    }
    evervm_engine::files::validate_metadata(&metadata)
        .map_err(|e| E2bFailure::bad_request(e.message().to_owned()))?;
    Ok(metadata)
}

fn written(info: &FileInfo) -> WrittenEntry {
    WrittenEntry {
        name: info.name().to_owned(),
        kind: if info.kind == FileKind::Directory {
            "dir"
        } else {
            "file"
        },
        path: to_e2b(&info.path),
        metadata: info.metadata.clone(),
    }
}

/// A gzip-encoded upload, decoded as it comes, in pieces of at most 64 KiB (a small piece that
/// inflates to gigabytes never sits in memory whole); invalid gzip ends it with an error.
fn gunzip(
    body: axum::body::BodyDataStream,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    use std::io::Read;

    /// The compressed pieces, read on the decoding thread.
    struct Pieces {
        rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
        current: Bytes,
    }
    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            while self.current.is_empty() {
                match self.rx.blocking_recv() {
                    Some(piece) => self.current = piece?,
                    None => return Ok(0),
                }
            }
            let n = buf.len().min(self.current.len());
            buf[..n].copy_from_slice(&self.current.split_to(n));
            Ok(n)
        }
    }

    let (in_tx, in_rx) = tokio::sync::mpsc::channel(4);
    let (out_tx, out_rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut body = body;
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(std::io::Error::other);
            let failed = piece.is_err();
            if in_tx.send(piece).await.is_err() || failed {
                return;
            }
        }
    });
    tokio::task::spawn_blocking(move || {
        let mut decoder = flate2::read::MultiGzDecoder::new(Pieces {
            rx: in_rx,
            current: Bytes::new(),
        });
        loop {
            let mut buffer = vec![0u8; 64 * 1024];
            let piece = match decoder.read(&mut buffer) {
                Ok(0) => return,
                Ok(n) => {
                    buffer.truncate(n);
                    Ok(Bytes::from(buffer))
                }
                Err(e) => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("the upload is not valid gzip: {e}"),
                )),
            };
            let failed = piece.is_err();
            if out_tx.blocking_send(piece).is_err() || failed {
                return;
            }
        }
    });
    futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    })
}

/// `POST /files`: multipart (a part `file` per file, its filename the destination unless
/// `?path=` names it) or the raw bytes of one file (`application/octet-stream`, `?path=`).
/// Parent directories are made; existing files are replaced.
pub(super) async fn write_files(
    State(state): State<E2bState>,
    caller: Result<EnvdCaller, E2bFailure>,
    Query(query): Query<FileQuery>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, E2bFailure> {
    let SandboxCaller { account, sandbox } = files_caller(&state, caller, &query, "write").await?;
    let encoding = headers
        .get(axum::http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    let request = match encoding.as_str() {
        "identity" | "" => request,
        "gzip" => {
            let (parts, body) = request.into_parts();
            Request::from_parts(parts, Body::from_stream(gunzip(body.into_data_stream())))
        }
        other => {
            return Err(E2bFailure::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("uploads encoded as {other:?} are not accepted: send gzip or plain bytes"),
            ));
        }
    };
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let options = WriteFileOptions {
        mode: None,
        make_parents: true,
        metadata: upload_metadata(&headers)?,
    };
    let mut entries = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let mut multipart = Multipart::from_request(request, &state)
            .await
            .map_err(|e| E2bFailure::bad_request(format!("the upload is not multipart: {e}")))?;
        let mut parts = 0usize;
        while let Some(field) = multipart
            .next_field()
            .await
            .map_err(|e| E2bFailure::bad_request(format!("the upload broke off: {e}")))?
        {
            parts += 1;
            let destination = match (&query.path, field.file_name()) {
                (Some(path), _) if parts == 1 => path.clone(),
                (_, Some(name)) => name.to_owned(),
                (_, None) => {
                    return Err(E2bFailure::bad_request(
                        "a part of the upload has no filename and ?path= names none",
                    ));
                }
            };
            // The part borrows the upload: its pieces go to the write through a channel.
            let (tx, rx) = tokio::sync::mpsc::channel::<evervm_engine::Result<Bytes>>(4);
            let pump = async move {
                let mut field = field;
                loop {
                    let piece = match field.chunk().await {
                        Ok(Some(piece)) => Ok(piece),
                        Ok(None) => return,
                        Err(e) => Err(evervm_engine::Error::invalid(format!(
                            "the upload broke off: {e}"
                        ))),
                    };
                    let failed = piece.is_err();
                    if tx.send(piece).await.is_err() || failed {
                        return;
                    }
                }
            };
            let data = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|piece| (piece, rx))
            })
            .boxed();
            let target = to_machine(&destination);
            let write = state
                .engine
                .write_file(&account, &sandbox, &target, data, options.clone());
            let ((), written_info) = tokio::join!(pump, write);
            let info = written_info.map_err(|e| file_failure(&e, &sandbox))?;
            entries.push(written(&info));
        }
    } else {
        let path = query.path.ok_or_else(|| {
            E2bFailure::bad_request("an upload of raw bytes needs ?path= (where to write them)")
        })?;
        let data = request
            .into_body()
            .into_data_stream()
            .map(|piece| {
                piece.map_err(|e| {
                    evervm_engine::Error::invalid(format!("the upload broke off: {e}"))
                })
            })
            .boxed();
        let info = state
            .engine
            .write_file(&account, &sandbox, &to_machine(&path), data, options)
            .await
            .map_err(|e| file_failure(&e, &sandbox))?;
        entries.push(written(&info));
    }
    if entries.is_empty() {
        return Err(E2bFailure::bad_request("the upload holds no file"));
    }
    state.sandboxes.touch(&account, &sandbox);
    Ok(axum::Json(entries).into_response())
}

// --- filesystem.Filesystem -----------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// envd's `EntryInfo`, as protobuf's JSON writes it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EntryInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    /// int64: a string.
    size: String,
    mode: u32,
    permissions: String,
    owner: &'static str,
    group: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    modified_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlink_target: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

pub(super) fn entry(info: &FileInfo) -> EntryInfo {
    let kind = match info.kind {
        FileKind::File | FileKind::Other => "FILE_TYPE_FILE",
        FileKind::Directory => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
    };
    EntryInfo {
        name: info.name().to_owned(),
        kind,
        path: to_e2b(&info.path),
        size: info.size.to_string(),
        mode: info.mode,
        permissions: permissions(info),
        owner: "user",
        group: "user",
        modified_time: info
            .modified
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)),
        symlink_target: None,
        metadata: info.metadata.clone(),
    }
}

/// envd's entry for the symlink at `own` (its path as E2B names it), as envd describes one:
/// the type and mode of what it leads to (`target`; none when it leads nowhere, whose type is
/// unspecified), the size and time of `shown` (the link itself where known, else the target),
/// `L` and the link's permissions (always all of them on Linux), and where it leads, resolved.
fn symlink_entry(
    own: &str,
    shown: &FileInfo,
    target: Option<&FileInfo>,
    leads_to: &str,
) -> EntryInfo {
    EntryInfo {
        name: own.rsplit('/').next().unwrap_or_default().to_owned(),
        path: own.to_owned(),
        kind: match target.map(|t| t.kind) {
            Some(FileKind::File | FileKind::Other) => "FILE_TYPE_FILE",
            Some(FileKind::Directory) => "FILE_TYPE_DIRECTORY",
            Some(FileKind::Symlink) | None => "FILE_TYPE_UNSPECIFIED",
        },
        mode: target.map_or(0, |t| t.mode),
        permissions: "Lrwxrwxrwx".to_owned(),
        symlink_target: Some(to_e2b(leads_to)),
        ..entry(shown)
    }
}

/// `path` as envd reports a path it was given: absolute (relative to `/home/user`), `.` and
/// `..` taken out, symlinks left as they are.
pub(super) fn absolute(path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else if path == "~" || path.is_empty() {
        E2B_HOME.to_owned()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{E2B_HOME}/{rest}")
    } else {
        format!("{E2B_HOME}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `ls -l`'s permissions: `drwxr-xr-x`.
fn permissions(info: &FileInfo) -> String {
    let mut text = String::with_capacity(10);
    text.push(match info.kind {
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::File | FileKind::Other => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (info.mode >> shift) & 0o7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// The Connect error of an engine failure on a sandbox's files.
pub(super) fn rpc_failure(error: &evervm_engine::Error, sandbox: &str) -> RpcError {
    use evervm_engine::ErrorKind;
    if error.kind() == ErrorKind::NotFound && error.resource() == Some("machine") {
        return RpcError::new(
            Code::Unavailable,
            format!("The sandbox {sandbox} was not found"),
        );
    }
    RpcError::from(error)
}

/// Who calls a filesystem method, on which sandbox.
#[derive(Clone, Copy)]
struct Call<'a> {
    state: &'a E2bState,
    account: &'a Account,
    sandbox: &'a str,
}

/// `POST /filesystem.Filesystem/{method}`.
pub(super) async fn filesystem(
    State(state): State<E2bState>,
    EnvdCaller(caller): EnvdCaller,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let watched = match method.as_str() {
        "WatchDir" => {
            let keepalive = super::process::keepalive_interval(&headers);
            let body = super::watch::stream(state.clone(), caller, keepalive, &body).await;
            return super::process::stream_response(body);
        }
        "CreateWatcher" => Some(super::watch::create(&state, &caller, &body).await),
        "GetWatcherEvents" => Some(super::watch::poll(&state, &caller, &body).await),
        "RemoveWatcher" => Some(super::watch::remove(&state, &caller, &body).await),
        _ => None,
    };
    if let Some(answer) = watched {
        return match answer {
            Ok(message) => connect::unary(&message),
            Err(e) => e.into_response(),
        };
    }
    let SandboxCaller { account, sandbox } = caller;
    let call = Call {
        state: &state,
        account: &account,
        sandbox: &sandbox,
    };
    let answer = match method.as_str() {
        "Stat" => stat(call, &body).await,
        "ListDir" => list_dir(call, &body).await,
        "MakeDir" => make_dir(call, &body).await,
        "Remove" => remove(call, &body).await,
        "Move" => move_entry(call, &body).await,
        other => Err(RpcError::unimplemented(&format!(
            "filesystem.Filesystem/{other}"
        ))),
    };
    match answer {
        Ok(message) => {
            state.sandboxes.touch(&account, &sandbox);
            connect::unary(&message)
        }
        Err(e) => e.into_response(),
    }
}

async fn stat(
    Call {
        state,
        account,
        sandbox,
    }: Call<'_>,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let request: PathRequest = connect::parse_unary(body)?;
    let info = state
        .engine
        .stat_file(account, sandbox, &to_machine(&request.path))
        .await
        .map_err(|e| rpc_failure(&e, sandbox))?;
    let entry = match &info.symlink_target {
        Some(leads_to) => symlink_entry(&absolute(&request.path), &info, Some(&info), leads_to),
        None => entry(&info),
    };
    Ok(serde_json::json!({ "entry": entry }))
}

async fn list_dir(call: Call<'_>, body: &[u8]) -> Result<serde_json::Value, RpcError> {
    let request: ListDirRequest = connect::parse_unary(body)?;
    let depth = request.depth.unwrap_or(1).max(1);
    if depth > MAX_DEPTH {
        return Err(RpcError::invalid(format!(
            "depth {depth}: at most {MAX_DEPTH}"
        )));
    }
    // E2B's order: each directory's entries by name, a subdirectory's entries right after it.
    let mut entries = Vec::new();
    let mut open = vec![(
        sorted_listing(call, &to_machine(&request.path)).await?,
        1u32,
    )];
    while let Some((listing, level)) = open.last_mut() {
        let level = *level;
        let Some(info) = listing.next() else {
            open.pop();
            continue;
        };
        if entries.len() >= MAX_LISTED {
            break;
        }
        entries.push(match (&info.kind, &info.symlink_target) {
            (FileKind::Symlink, Some(leads_to)) => {
                // What it leads to, if anything: its type and mode are the entry's.
                let target = call
                    .state
                    .engine
                    .stat_file(call.account, call.sandbox, &info.path)
                    .await
                    .ok();
                let leads_to = if target.is_some() {
                    leads_to
                } else {
                    &info.path
                };
                symlink_entry(&to_e2b(&info.path), &info, target.as_ref(), leads_to)
            }
            _ => entry(&info),
        });
        if info.kind == FileKind::Directory && level < depth {
            open.push((sorted_listing(call, &info.path).await?, level + 1));
        }
    }
    Ok(serde_json::json!({ "entries": entries }))
}

/// The entries of `directory`, by name.
async fn sorted_listing(
    Call {
        state,
        account,
        sandbox,
    }: Call<'_>,
    directory: &str,
) -> Result<std::vec::IntoIter<evervm_engine::FileInfo>, RpcError> {
    let mut listing = state
        .engine
        .list_files(account, sandbox, directory)
        .await
        .map_err(|e| rpc_failure(&e, sandbox))?
        .entries;
    listing.sort_by(|a, b| a.name().cmp(b.name()));
    Ok(listing.into_iter())
}

async fn make_dir(
    Call {
        state,
        account,
        sandbox,
    }: Call<'_>,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let request: PathRequest = connect::parse_unary(body)?;
    let path = to_machine(&request.path);
    match state.engine.stat_file(account, sandbox, &path).await {
        Ok(_) => {
            return Err(RpcError::new(
                Code::AlreadyExists,
                format!("{} already exists", request.path),
            ));
        }
        Err(e)
            if e.kind() == evervm_engine::ErrorKind::NotFound && e.resource() == Some("file") => {}
        Err(e) => return Err(rpc_failure(&e, sandbox)),
    }
    let info = state
        .engine
        .make_dir(account, sandbox, &path, true)
        .await
        .map_err(|e| rpc_failure(&e, sandbox))?;
    Ok(serde_json::json!({ "entry": entry(&info) }))
}

async fn remove(
    Call {
        state,
        account,
        sandbox,
    }: Call<'_>,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let request: PathRequest = connect::parse_unary(body)?;
    let removed = state
        .engine
        .remove_file(account, sandbox, &to_machine(&request.path), true)
        .await;
    match removed {
        // As E2B's envd: removing what is not there does nothing.
        Err(e)
            if e.kind() == evervm_engine::ErrorKind::NotFound
                && e.resource() != Some("machine") =>
        {
            Ok(serde_json::json!({}))
        }
        Err(e) => Err(rpc_failure(&e, sandbox)),
        Ok(_) => Ok(serde_json::json!({})),
    }
}

/// Python's literal of a machine path (`~` expanded in the machine).
fn python_path(path: &str) -> Result<String, RpcError> {
    evervm_engine::files::validate_path(path).map_err(|e| RpcError::invalid(e.message()))?;
    let literal = serde_json::to_string(path).map_err(|e| RpcError::invalid(e.to_string()))?;
    Ok(format!("__import__('os').path.expanduser({literal})"))
}

/// Move: renamed by the machine's interpreter, inside its sandbox.
async fn move_entry(
    Call {
        state,
        account,
        sandbox,
    }: Call<'_>,
    body: &[u8],
) -> Result<serde_json::Value, RpcError> {
    let request: MoveRequest = connect::parse_unary(body)?;
    if request.source.is_empty() || request.destination.is_empty() {
        return Err(RpcError::invalid("Move needs a source and a destination"));
    }
    let destination = to_machine(&request.destination);
    let code = format!(
        "__import__('os').rename({}, {})",
        python_path(&to_machine(&request.source))?,
        python_path(&destination)?
    );
    let (_, events) = run::start(
        &state.engine,
        account,
        sandbox,
        code,
        Duration::from_secs(60),
        evervm_engine::Dialect::Python,
        None,
    )
    .await
    .map_err(|e| rpc_failure(&e, sandbox))?;
    if let Some(Outcome::Error { text, .. }) = final_outcome(events).await {
        let last = text.lines().last().unwrap_or_default().to_owned();
        let code = if last.starts_with("FileNotFoundError") {
            Code::NotFound
        } else if last.starts_with("PermissionError") {
            Code::PermissionDenied
        } else {
            Code::InvalidArgument
        };
        return Err(RpcError::new(code, last));
    }
    let info = state
        .engine
        .stat_file(account, sandbox, &destination)
        .await
        .map_err(|e| rpc_failure(&e, sandbox))?;
    Ok(serde_json::json!({ "entry": entry(&info) }))
}

async fn final_outcome(
    mut events: futures::stream::BoxStream<'static, ExecEvent>,
) -> Option<Outcome> {
    while let Some(event) = events.next().await {
        if let ExecEvent::Result(result) = event {
            return Some(result.outcome);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_home_is_the_machine_home() {
        assert_eq!(to_machine("/home/user"), "~");
        assert_eq!(to_machine("/home/user/a.csv"), "~/a.csv");
        assert_eq!(to_machine("/home/username"), "/home/username");
        assert_eq!(to_machine("/tmp/x"), "/tmp/x");
        assert_eq!(to_machine("a.csv"), "a.csv");
        assert_eq!(to_e2b("/home/machine/a.csv"), "/home/user/a.csv");
        assert_eq!(to_e2b("/home/machine"), "/home/user");
        assert_eq!(to_e2b("/home/machinery"), "/home/machinery");
        assert_eq!(absolute("a/./b/../c"), "/home/user/a/c");
        assert_eq!(absolute("~/x"), "/home/user/x");
        assert_eq!(absolute("/tmp//y/"), "/tmp/y");
        assert_eq!(absolute("/.."), "/");
    }

    #[test]
    fn permissions_read_like_ls() {
        let info = FileInfo {
            path: "/tmp/x".into(),
            kind: FileKind::Directory,
            size: 0,
            mode: 0o755,
            modified: None,
            symlink_target: None,
            metadata: BTreeMap::new(),
        };
        assert_eq!(permissions(&info), "drwxr-xr-x");
    }
}
