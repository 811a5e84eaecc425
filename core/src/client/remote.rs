//! The remote transport: an evervm (or ForeverVM-compatible) server over HTTP and WebSocket.

use std::sync::Arc;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use url::Url;

use super::{EventStream, SessionTransport, Transport, Trust};
use crate::error::{Error, Result};
use crate::protocol::{
    self, ApiError, CreateMachineRequest, CreateMachineResponse, DeleteMachineResponse, ErrorCode,
    ExecResponse, ExecResultResponse, InterruptResponse, ListMachinesRequest, ListMachinesResponse,
    MessageFromServer, MessageToServer, WhoamiResponse, WireInstruction,
};
use crate::types::{
    Accepted, ByteStream, CheckpointInfo, ContextInfo, CreateMachineOptions, ExecEvent,
    ExecOptions, ExecResult, FileInfo, FileKind, FileList, FileRead, InstallReport, Lineage,
    MachineHistory, MachineInfo, MachinePage, Rewound, Tags, WriteFileOptions,
};

pub(crate) struct RemoteTransport {
    base: Url,
    token: String,
    http: reqwest::Client,
    /// The WebSocket's TLS when the client trusts a CA file (else tungstenite's default roots).
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// Maps an error body and status to an error, by the wire's one table of codes.
pub(crate) fn api_error(status: StatusCode, body: &str) -> Error {
    let parsed: Option<ApiError> = serde_json::from_str(body).ok();
    let kind = ErrorCode::kind_of(parsed.as_ref().map(|e| e.code.as_str()), status.as_u16());
    let message = match parsed {
        Some(ApiError {
            message: Some(message),
            ..
        }) => message,
        Some(ApiError { code, .. }) => format!("the server answered {status} {code}"),
        None => format!("the server answered {status}: {}", body.trim()),
    };
    Error::new(kind, message)
}

fn seconds(options: &ExecOptions) -> Result<i32> {
    let secs = options.timeout.as_secs_f64().ceil();
    if secs < 1.0 || secs > f64::from(i32::MAX) {
        return Err(Error::invalid(format!(
            "timeout must be at least 1 s, not {:?}",
            options.timeout
        )));
    }
    Ok(secs as i32)
}

impl RemoteTransport {
    pub(crate) fn new(url: &str, token: &str, trust: &Trust) -> Result<Self> {
        let base =
            Url::parse(url).map_err(|e| Error::invalid(format!("{url:?} is not a URL: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(Error::invalid(format!(
                "{url:?}: the server URL must start with http:// or https://"
            )));
        }
        let tls = trust.client_config()?;
        let mut http = reqwest::Client::builder().tcp_nodelay(true);
        if let Some(config) = &tls {
            http = http.use_preconfigured_tls(rustls::ClientConfig::clone(config));
        }
        let http = http
            .build()
            .map_err(|e| Error::transport(format!("cannot build an HTTP client: {e}")))?;
        Ok(Self {
            base,
            token: token.to_owned(),
            http,
            tls,
        })
    }

    /// The URL of `segments` at the server's root (like the ForeverVM SDK, any path of the base
    /// URL is dropped), each segment percent-encoded.
    fn url(&self, segments: &[&str]) -> Result<Url> {
        let mut url = self.base.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.path_segments_mut()
            .map_err(|()| Error::invalid(format!("{} cannot be a base URL", self.base)))?
            .clear()
            .extend(segments);
        Ok(url)
    }

    /// The URL of `/v1/machine/{name}/{rest...}`, for a name that can exist.
    fn machine_url(&self, name: &str, rest: &[&str]) -> Result<Url> {
        check_machine_name(name)?;
        let mut segments = vec!["v1", "machine", name];
        segments.extend_from_slice(rest);
        self.url(&segments)
    }

    /// The URL of `/v1/machine/{name}/checkpoints/{checkpoint}/{rest...}`.
    fn checkpoint_url(&self, name: &str, checkpoint: &str, rest: &[&str]) -> Result<Url> {
        evervm_engine::validate_checkpoint_name(checkpoint)?;
        let mut segments = vec!["checkpoints", checkpoint];
        segments.extend_from_slice(rest);
        self.machine_url(name, &segments)
    }

    /// The URL of a file's route: `/v1/machine/{name}/files/{path...}`, the path made plain
    /// first (see [`file_segments`]).
    fn file_url(&self, name: &str, path: &str) -> Result<Url> {
        let segments = file_segments(path)?;
        let mut rest = vec!["files"];
        rest.extend(segments.iter().map(String::as_str));
        self.machine_url(name, &rest)
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        self.http
            .request(method, url)
            .bearer_auth(&self.token)
            .header("x-forevervm-sdk", "evervm-rust")
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&dyn erased::Body>,
    ) -> Result<reqwest::Response> {
        let mut request = self.request(method, url);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_json()?);
        }
        finish(request).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&dyn erased::Body>,
    ) -> Result<T> {
        let path = url.path().to_owned();
        let response = self.send(method, url, body).await?;
        decode(&path, response).await
    }

    /// The WebSocket URL of a machine's REPL; `None` asks for a new machine.
    fn websocket_url(&self, name: Option<&str>) -> Result<Url> {
        let mut url = match name {
            Some(name) => self.machine_url(name, &["repl"])?,
            None => self.url(&["v1", "machine", "new", "repl"])?,
        };
        url.query_pairs_mut().append_pair("rich", "true");
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        url.set_scheme(scheme)
            .map_err(|()| Error::invalid("cannot derive the WebSocket URL"))?;
        Ok(url)
    }
}

/// A new machine's lifetime as the wire takes it (seconds from now): an expiry time is sent as
/// the seconds until it.
fn remote_ttl(
    ttl: Option<std::time::Duration>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Option<u64>> {
    match (ttl, expires_at) {
        (Some(_), Some(_)) => Err(Error::invalid(
            "give a machine a ttl or an expiry time, not both",
        )),
        (Some(ttl), None) => Ok(Some(ttl.as_secs_f64().ceil().max(1.0) as u64)),
        (None, Some(at)) => {
            let millis = (at - chrono::Utc::now()).num_milliseconds();
            if millis <= 0 {
                return Err(Error::invalid(format!(
                    "expires_at {at} is not in the future"
                )));
            }
            Ok(Some((millis as u64).div_ceil(1000)))
        }
        (None, None) => Ok(None),
    }
}

/// Sends a request; an answer other than a success is the error its body names.
async fn finish(request: reqwest::RequestBuilder) -> Result<reqwest::Response> {
    let response = request.send().await?;
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    Err(api_error(status, &text))
}

/// Decodes a JSON answer to the request for `path`.
async fn decode<T: DeserializeOwned>(path: &str, response: reqwest::Response) -> Result<T> {
    let bytes = response.bytes().await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::transport(format!(
            "the server's answer to {path} is not understood: {e}"
        ))
    })
}

/// A machine path as the segments of its URL after `files/` (`/tmp/a` is `tmp`, `a`; a relative
/// path or one starting with `~` starts with `~`, the home). `.` and `..` are resolved here, as
/// text (a URL cannot carry them): a `..` above the home or above `/` is refused, as the machine
/// would refuse it.
pub(crate) fn file_segments(path: &str) -> Result<Vec<String>> {
    evervm_engine::files::validate_path(path)?;
    let (mut segments, rest) = if let Some(rest) = path.strip_prefix('/') {
        (Vec::new(), rest)
    } else if path == "~" {
        (vec!["~".to_owned()], "")
    } else if let Some(rest) = path.strip_prefix("~/") {
        (vec!["~".to_owned()], rest)
    } else {
        (vec!["~".to_owned()], path)
    };
    let floor = segments.len();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if segments.len() == floor {
                    return Err(Error::new(
                        crate::ErrorKind::PermissionDenied,
                        format!(
                            "{path}: outside the directories files may be used in (`..` leaves \
                             the {})",
                            if floor == 0 { "root" } else { "home" }
                        ),
                    ));
                }
                segments.pop();
            }
            part => segments.push(part.to_owned()),
        }
    }
    if segments.is_empty() {
        return Err(Error::new(
            crate::ErrorKind::PermissionDenied,
            format!(
                "{path}: the root directory has no file URL of its own (list it with \
                 `list_files(\"/\")`)"
            ),
        ));
    }
    Ok(segments)
}

/// A file's info from the headers of its read.
fn info_from_headers(headers: &reqwest::header::HeaderMap) -> Result<FileInfo> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let size = text("content-length")
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| Error::transport("the server sent a file without its length"))?;
    let path: String = text("x-evervm-path")
        .map(|v| {
            url::form_urlencoded::parse(format!("p={v}").as_bytes())
                .map(|(_, value)| value.into_owned())
                .collect()
        })
        .unwrap_or_default();
    let mode = text("x-evervm-mode")
        .and_then(|v| u32::from_str_radix(v, 8).ok())
        .unwrap_or(0o644);
    let modified_at = text("x-evervm-modified")
        .and_then(|v| chrono::DateTime::parse_from_rfc3339(v).ok())
        .map(|t| t.with_timezone(&chrono::Utc));
    Ok(FileInfo {
        name: path.rsplit('/').next().unwrap_or_default().to_owned(),
        path,
        kind: FileKind::File,
        size,
        mode,
        modified_at,
        symlink_target: None,
    })
}

/// Object-safe JSON bodies.
mod erased {
    pub(crate) trait Body: Send + Sync {
        fn to_json(&self) -> crate::Result<Vec<u8>>;
    }
    impl<T: serde::Serialize + Send + Sync> Body for T {
        fn to_json(&self) -> crate::Result<Vec<u8>> {
            serde_json::to_vec(self)
                .map_err(|e| crate::Error::invalid(format!("cannot encode the request: {e}")))
        }
    }
}

fn body<T: Serialize + Send + Sync>(value: &T) -> &dyn erased::Body {
    value
}

#[async_trait]
impl Transport for RemoteTransport {
    fn describe(&self) -> String {
        self.base.to_string()
    }

    async fn whoami(&self) -> Result<String> {
        let answer: WhoamiResponse = self
            .call(Method::GET, self.url(&["v1", "whoami"])?, None)
            .await?;
        Ok(answer.account)
    }

    async fn create_machine(&self, options: CreateMachineOptions) -> Result<String> {
        let request = CreateMachineRequest {
            tags: (!options.tags.is_empty()).then_some(options.tags),
            memory_mb: options.memory_mb,
            image: options.image,
            durability: options.durability,
            history: options.history,
            env: (!options.env.is_empty()).then_some(options.env),
            secret_env: (!options.secret_env.0.is_empty()).then_some(options.secret_env),
            ttl_seconds: remote_ttl(options.ttl, options.expires_at)?,
            network: options.network,
        };
        let answer: CreateMachineResponse = self
            .call(
                Method::POST,
                self.url(&["v1", "machine", "new"])?,
                Some(body(&request)),
            )
            .await?;
        Ok(answer.machine_name)
    }

    async fn list_machines(&self, tags: &Tags) -> Result<Vec<MachineInfo>> {
        let request = ListMachinesRequest {
            tags: (!tags.is_empty()).then(|| tags.clone()),
            ..ListMachinesRequest::default()
        };
        let answer: ListMachinesResponse = self
            .call(
                Method::POST,
                self.url(&["v1", "machine", "list"])?,
                Some(body(&request)),
            )
            .await?;
        Ok(answer.machines.into_iter().map(Into::into).collect())
    }

    async fn list_machines_page(
        &self,
        tags: &Tags,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<MachinePage> {
        let request = ListMachinesRequest {
            tags: (!tags.is_empty()).then(|| tags.clone()),
            limit: Some(limit),
            cursor: cursor.map(str::to_owned),
        };
        let answer: ListMachinesResponse = self
            .call(
                Method::POST,
                self.url(&["v1", "machine", "list"])?,
                Some(body(&request)),
            )
            .await?;
        Ok(MachinePage {
            machines: answer.machines.into_iter().map(Into::into).collect(),
            next_cursor: answer.next_cursor,
        })
    }

    async fn machine_info(&self, name: &str) -> Result<MachineInfo> {
        let answer: protocol::MachineInfoResponse = self
            .call(Method::GET, self.machine_url(name, &[])?, None)
            .await?;
        Ok(answer.into())
    }

    async fn exec(&self, name: &str, code: &str, options: &ExecOptions) -> Result<Accepted> {
        let request = protocol::ExecRequest {
            instruction: WireInstruction {
                code: code.to_owned(),
                timeout_seconds: seconds(options)?,
                dialect: options.dialect,
                context: options.context.clone(),
            },
            interrupt: options.interrupt,
        };
        let answer: ExecResponse = self
            .call(
                Method::POST,
                self.machine_url(name, &["exec"])?,
                Some(body(&request)),
            )
            .await?;
        let seq = answer
            .instruction_seq
            .ok_or_else(|| Error::transport("the server accepted the instruction without a seq"))?;
        Ok(Accepted {
            seq,
            interrupted: answer.interrupted,
        })
    }

    async fn result(&self, name: &str, seq: i64) -> Result<ExecResult> {
        let mut url = self.machine_url(name, &["exec", &seq.to_string(), "result"])?;
        url.query_pairs_mut().append_pair("rich", "true");
        let answer: ExecResultResponse = self.call(Method::GET, url, None).await?;
        Ok(answer.result.into())
    }

    async fn events(&self, name: &str, seq: i64) -> Result<EventStream> {
        let mut url = self.machine_url(name, &["exec", &seq.to_string(), "stream-result"])?;
        url.query_pairs_mut().append_pair("rich", "true");
        let response = self.send(Method::GET, url, None).await?;
        let bytes = response.bytes_stream();
        let stream = futures::stream::unfold(
            (bytes, LineBuffer::default(), false),
            |(mut bytes, mut buffer, done)| async move {
                if done {
                    return None;
                }
                loop {
                    if let Some(event) = buffer.next_event() {
                        let finished =
                            !matches!(event, Ok(ExecEvent::Output(_) | ExecEvent::Display(_)));
                        return Some((event, (bytes, buffer, finished)));
                    }
                    match bytes.next().await {
                        Some(Ok(chunk)) => buffer.push(&chunk),
                        Some(Err(e)) => {
                            return Some((Err(Error::from(e)), (bytes, buffer, true)));
                        }
                        None => {
                            let error = Error::transport(
                                "the result stream ended before the result arrived",
                            );
                            return Some((Err(error), (bytes, buffer, true)));
                        }
                    }
                }
            },
        );
        Ok(stream.boxed())
    }

    async fn interrupt(&self, name: &str, seq: Option<i64>) -> Result<bool> {
        let request = protocol::InterruptRequest {
            instruction_seq: seq,
        };
        let answer: InterruptResponse = self
            .call(
                Method::POST,
                self.machine_url(name, &["interrupt"])?,
                seq.is_some().then(|| body(&request)),
            )
            .await?;
        Ok(answer.interrupted)
    }

    async fn delete_machine(&self, name: &str) -> Result<()> {
        let _: DeleteMachineResponse = self
            .call(Method::DELETE, self.machine_url(name, &[])?, None)
            .await?;
        Ok(())
    }

    async fn swap_out(&self, name: &str) -> Result<()> {
        let _: protocol::SwapResponse = self
            .call(Method::POST, self.machine_url(name, &["swap"])?, None)
            .await?;
        Ok(())
    }

    async fn fork(&self, name: &str, tags: Option<Tags>, at: Option<i64>) -> Result<String> {
        let request = protocol::ForkMachineRequest { tags, at };
        let answer: CreateMachineResponse = self
            .call(
                Method::POST,
                self.machine_url(name, &["fork"])?,
                Some(body(&request)),
            )
            .await?;
        Ok(answer.machine_name)
    }

    async fn create_checkpoint(
        &self,
        name: &str,
        checkpoint: Option<&str>,
    ) -> Result<CheckpointInfo> {
        let request = protocol::CreateCheckpointRequest {
            name: checkpoint.map(str::to_owned),
        };
        self.call(
            Method::POST,
            self.machine_url(name, &["checkpoints"])?,
            Some(body(&request)),
        )
        .await
    }

    async fn list_checkpoints(&self, name: &str) -> Result<Vec<CheckpointInfo>> {
        let answer: protocol::ListCheckpointsResponse = self
            .call(Method::GET, self.machine_url(name, &["checkpoints"])?, None)
            .await?;
        Ok(answer.checkpoints)
    }

    async fn write_file(
        &self,
        name: &str,
        path: &str,
        data: ByteStream,
        length: Option<u64>,
        options: WriteFileOptions,
    ) -> Result<FileInfo> {
        let mut url = self.file_url(name, path)?;
        {
            let mut query = url.query_pairs_mut();
            if let Some(mode) = options.mode {
                query.append_pair("mode", &format!("{mode:o}"));
            }
            if options.make_parents {
                query.append_pair("parents", "true");
            }
        }
        let what = url.path().to_owned();
        let body = reqwest::Body::wrap_stream(
            data.map(|piece| piece.map_err(|e| std::io::Error::other(e.message().to_owned()))),
        );
        let mut request = self
            .request(Method::PUT, url)
            .header("content-type", "application/octet-stream")
            .body(body);
        if let Some(length) = length {
            request = request.header("content-length", length);
        }
        decode(&what, finish(request).await?).await
    }

    async fn read_file(&self, name: &str, path: &str) -> Result<FileRead> {
        let url = self.file_url(name, path)?;
        let response = self.send(Method::GET, url, None).await?;
        let info = info_from_headers(response.headers())?;
        let expected = info.size;
        let data = futures::stream::unfold(
            (response.bytes_stream(), 0u64, false),
            move |(mut bytes, received, done)| async move {
                if done {
                    return None;
                }
                match bytes.next().await {
                    Some(Ok(piece)) => {
                        let received = received + piece.len() as u64;
                        Some((Ok(piece), (bytes, received, false)))
                    }
                    Some(Err(e)) => Some((Err(Error::from(e)), (bytes, received, true))),
                    None if received == expected => None,
                    None => Some((
                        Err(Error::transport(format!(
                            "the file arrived incomplete: {received} of {expected} bytes"
                        ))),
                        (bytes, received, true),
                    )),
                }
            },
        )
        .boxed();
        Ok(FileRead { info, data })
    }

    async fn stat_file(&self, name: &str, path: &str) -> Result<FileInfo> {
        let mut url = self.file_url(name, path)?;
        url.query_pairs_mut().append_pair("stat", "true");
        self.call(Method::GET, url, None).await
    }

    async fn list_files(&self, name: &str, path: &str) -> Result<FileList> {
        let mut url = self.machine_url(name, &["files"])?;
        url.query_pairs_mut().append_pair("dir", path);
        self.call(Method::GET, url, None).await
    }

    async fn make_dir(&self, name: &str, path: &str, parents: bool) -> Result<FileInfo> {
        let mut url = self.file_url(name, path)?;
        if parents {
            url.query_pairs_mut().append_pair("parents", "true");
        }
        self.call(Method::POST, url, None).await
    }

    async fn remove_file(&self, name: &str, path: &str, recursive: bool) -> Result<FileInfo> {
        let mut url = self.file_url(name, path)?;
        if recursive {
            url.query_pairs_mut().append_pair("recursive", "true");
        }
        self.call(Method::DELETE, url, None).await
    }

    async fn install(&self, name: &str, requirements: &[String]) -> Result<InstallReport> {
        let request = protocol::InstallRequest {
            requirements: requirements.to_vec(),
        };
        self.call(
            Method::POST,
            self.machine_url(name, &["install"])?,
            Some(body(&request)),
        )
        .await
    }

    async fn rollback(&self, name: &str, checkpoint: &str) -> Result<MachineInfo> {
        let answer: protocol::MachineInfoResponse = self
            .call(
                Method::POST,
                self.checkpoint_url(name, checkpoint, &["rollback"])?,
                None,
            )
            .await?;
        Ok(answer.into())
    }

    async fn rewind(&self, name: &str, to: i64) -> Result<Rewound> {
        let request = protocol::RewindRequest { to };
        self.call(
            Method::POST,
            self.machine_url(name, &["rewind"])?,
            Some(body(&request)),
        )
        .await
    }

    async fn lineage(&self, name: &str) -> Result<Lineage> {
        self.call(Method::GET, self.machine_url(name, &["lineage"])?, None)
            .await
    }

    async fn history(&self, name: &str, limit: usize) -> Result<MachineHistory> {
        let mut url = self.machine_url(name, &["history"])?;
        url.query_pairs_mut()
            .append_pair("limit", &limit.to_string());
        self.call(Method::GET, url, None).await
    }

    async fn create_context(&self, name: &str, cwd: Option<&str>) -> Result<ContextInfo> {
        let request = protocol::CreateContextRequest {
            cwd: cwd.map(str::to_owned),
        };
        let url = self.machine_url(name, &["contexts"])?;
        self.call(Method::POST, url, Some(body(&request))).await
    }

    async fn list_contexts(&self, name: &str) -> Result<Vec<ContextInfo>> {
        let url = self.machine_url(name, &["contexts"])?;
        let answer: protocol::ListContextsResponse = self.call(Method::GET, url, None).await?;
        Ok(answer.contexts)
    }

    async fn restart_context(&self, name: &str, context: &str) -> Result<ContextInfo> {
        evervm_engine::validate_context_id(context)?;
        let url = self.machine_url(name, &["contexts", context, "restart"])?;
        self.call(Method::POST, url, None).await
    }

    async fn remove_context(&self, name: &str, context: &str) -> Result<()> {
        evervm_engine::validate_context_id(context)?;
        let url = self.machine_url(name, &["contexts", context])?;
        let _: protocol::DeleteContextResponse = self.call(Method::DELETE, url, None).await?;
        Ok(())
    }

    async fn delete_checkpoint(&self, name: &str, checkpoint: &str) -> Result<()> {
        let _: protocol::DeleteCheckpointResponse = self
            .call(
                Method::DELETE,
                self.checkpoint_url(name, checkpoint, &[])?,
                None,
            )
            .await?;
        Ok(())
    }

    async fn connect(&self, name: Option<&str>) -> Result<Box<dyn SessionTransport>> {
        let mut request = self.websocket_url(name)?.as_str().into_client_request()?;
        let bearer = format!("Bearer {}", self.token)
            .parse()
            .map_err(|_| Error::invalid("the token contains characters not allowed in a header"))?;
        request.headers_mut().insert("authorization", bearer);
        let connector = self
            .tls
            .as_ref()
            .map(|config| tokio_tungstenite::Connector::Rustls(Arc::clone(config)));
        let (socket, _) =
            tokio_tungstenite::connect_async_tls_with_config(request, None, true, connector)
                .await
                .map_err(|e| match e {
                    tokio_tungstenite::tungstenite::Error::Http(response) => {
                        let body = response
                            .body()
                            .as_ref()
                            .map(|b| String::from_utf8_lossy(b).into_owned())
                            .unwrap_or_default();
                        let status = StatusCode::from_u16(response.status().as_u16())
                            .unwrap_or(StatusCode::BAD_GATEWAY);
                        api_error(status, &body)
                    }
                    other => Error::from(other),
                })?;
        let mut session = WebSocketSession {
            socket,
            machine_name: String::new(),
            next_request: 0,
            current: None,
        };
        match session.receive().await? {
            MessageFromServer::Connected { machine_name } => session.machine_name = machine_name,
            other => {
                return Err(Error::transport(format!(
                    "the server's first WebSocket message was {other:?}, not `connected`"
                )));
            }
        }
        Ok(Box::new(session))
    }
}

/// Checks a machine name by the engine's rule: a name that cannot exist is `NotFound`, as the
/// server would answer.
fn check_machine_name(name: &str) -> Result<()> {
    evervm_engine::MachineName::parse(name)?;
    Ok(())
}

/// Longest line a result stream may send: above the largest result an agent can send (a 64 MiB
/// frame), so that only a broken or hostile server reaches it.
const MAX_STREAM_LINE: usize = 80 * 1024 * 1024;

/// Bytes split into lines without moving the unread rest for every line, nor searching the same
/// bytes twice for a newline (a long line arrives in many chunks).
pub(crate) struct LineBuffer {
    bytes: Vec<u8>,
    start: usize,
    /// Bytes after `start` known to hold no newline.
    searched: usize,
    /// Longest line accepted; a longer one is an error, not an ever larger buffer.
    limit: usize,
}

impl Default for LineBuffer {
    fn default() -> Self {
        Self::with_limit(MAX_STREAM_LINE)
    }
}

impl LineBuffer {
    pub(crate) fn with_limit(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            start: 0,
            searched: 0,
            limit,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        if self.start > 0 {
            self.bytes.drain(..self.start);
            self.start = 0;
        }
        self.bytes.extend_from_slice(data);
    }

    /// The next whole line, without its `\n`; an error when the line being received is over
    /// the limit.
    pub(crate) fn next_line(&mut self) -> Result<Option<&[u8]>> {
        let rest = &self.bytes[self.start..];
        let Some(newline) = rest[self.searched..].iter().position(|b| *b == b'\n') else {
            self.searched = rest.len();
            if rest.len() > self.limit {
                return Err(Error::transport(format!(
                    "the result stream has a line longer than {} bytes",
                    self.limit
                )));
            }
            return Ok(None);
        };
        let end = self.start + self.searched + newline;
        let line = &self.bytes[self.start..end];
        self.start = end + 1;
        self.searched = 0;
        if line.len() > self.limit {
            return Err(Error::transport(format!(
                "the result stream has a line longer than {} bytes",
                self.limit
            )));
        }
        Ok(Some(line))
    }

    /// The next event, once its whole line has arrived (blank lines are skipped).
    pub(crate) fn next_event(&mut self) -> Option<Result<ExecEvent>> {
        loop {
            match self.next_line() {
                Ok(Some(line)) if line.iter().all(u8::is_ascii_whitespace) => {}
                Ok(Some(line)) => return Some(parse_stream_line(line)),
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

pub(crate) fn parse_stream_line(line: &[u8]) -> Result<ExecEvent> {
    let message: MessageFromServer = serde_json::from_slice(line).map_err(|e| {
        Error::transport(format!(
            "the result stream has a line that is not a message: {e}"
        ))
    })?;
    match message {
        MessageFromServer::Output { chunk, .. } => Ok(ExecEvent::Output(chunk.into())),
        MessageFromServer::Display { result, .. } => Ok(ExecEvent::Display(result)),
        MessageFromServer::Result { result, .. } => Ok(ExecEvent::Result(result.into())),
        MessageFromServer::Error { code, .. } => Err(api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(r#"{{"code":{code:?}}}"#),
        )),
        other => Err(Error::transport(format!(
            "unexpected message in a result stream: {other:?}"
        ))),
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct WebSocketSession {
    socket: Socket,
    machine_name: String,
    next_request: u32,
    current: Option<i64>,
}

impl WebSocketSession {
    async fn receive(&mut self) -> Result<MessageFromServer> {
        loop {
            let Some(frame) = self.socket.next().await else {
                return Err(Error::transport("the server closed the WebSocket"));
            };
            match frame? {
                Message::Text(text) => {
                    return serde_json::from_str(text.as_str()).map_err(|e| {
                        Error::transport(format!("the server sent a message not understood: {e}"))
                    });
                }
                Message::Close(_) => {
                    return Err(Error::transport("the server closed the WebSocket"));
                }
                _ => {}
            }
        }
    }
}

#[async_trait]
impl SessionTransport for WebSocketSession {
    fn machine_name(&self) -> &str {
        &self.machine_name
    }

    async fn send(&mut self, code: &str, options: &ExecOptions) -> Result<i64> {
        let request_id = self.next_request;
        self.next_request = self.next_request.wrapping_add(1);
        let message = MessageToServer::Exec {
            instruction: WireInstruction {
                code: code.to_owned(),
                timeout_seconds: seconds(options)?,
                dialect: options.dialect,
                context: options.context.clone(),
            },
            request_id,
        };
        let text = serde_json::to_string(&message)
            .map_err(|e| Error::invalid(format!("cannot encode the instruction: {e}")))?;
        self.socket.send(Message::text(text)).await?;
        loop {
            match self.receive().await? {
                MessageFromServer::ExecReceived {
                    seq,
                    request_id: id,
                } if id == request_id => {
                    self.current = Some(seq);
                    return Ok(seq);
                }
                MessageFromServer::Error { code, .. } => {
                    return Err(api_error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!(r#"{{"code":{code:?}}}"#),
                    ));
                }
                _ => {}
            }
        }
    }

    async fn next_event(&mut self) -> Result<ExecEvent> {
        let Some(current) = self.current else {
            return Err(Error::invalid("no instruction was sent on this session"));
        };
        loop {
            match self.receive().await? {
                MessageFromServer::Output {
                    chunk,
                    instruction_id,
                } if instruction_id == current => return Ok(ExecEvent::Output(chunk.into())),
                MessageFromServer::Display {
                    result,
                    instruction_id,
                    ..
                } if instruction_id == current => return Ok(ExecEvent::Display(result)),
                MessageFromServer::Result {
                    result,
                    instruction_id,
                } if instruction_id == current => {
                    self.current = None;
                    return Ok(ExecEvent::Result(result.into()));
                }
                MessageFromServer::Error { code, .. } => {
                    return Err(api_error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!(r#"{{"code":{code:?}}}"#),
                    ));
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn error_bodies_map_to_kinds() {
        let e = api_error(
            StatusCode::NOT_FOUND,
            r#"{"code":"MachineNotFound","id":null}"#,
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let e = api_error(
            StatusCode::BAD_REQUEST,
            r#"{"code":"BadRequest","id":null,"message":"tag key is empty"}"#,
        );
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::InvalidInput, "tag key is empty")
        );
        let e = api_error(StatusCode::BAD_GATEWAY, "<html>proxy</html>");
        assert_eq!(e.kind(), ErrorKind::Internal);
        assert!(e.message().contains("proxy"));
        let e = api_error(
            StatusCode::TOO_MANY_REQUESTS,
            r#"{"code":"LimitExceeded","id":null,"message":"at most 3 machines"}"#,
        );
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::LimitExceeded, "at most 3 machines")
        );
        let e = api_error(StatusCode::TOO_MANY_REQUESTS, "slow down");
        assert_eq!(e.kind(), ErrorKind::LimitExceeded);
    }

    #[test]
    fn a_long_line_is_searched_once() {
        let mut buffer = LineBuffer::default();
        for _ in 0..1000 {
            buffer.push(&[b'x'; 100]);
            assert!(buffer.next_line().unwrap().is_none());
            // Only the new bytes are searched: the scan is linear in the line, not quadratic.
            assert_eq!(buffer.searched, buffer.bytes.len() - buffer.start);
        }
        buffer.push(b"\nnext");
        assert_eq!(buffer.next_line().unwrap().unwrap().len(), 100_000);
        assert!(buffer.next_line().unwrap().is_none());
        buffer.push(b"\n");
        assert_eq!(buffer.next_line().unwrap(), Some(&b"next"[..]));
    }

    #[test]
    fn a_line_over_the_limit_is_an_error() {
        let mut buffer = LineBuffer::with_limit(8);
        buffer.push(b"12345678\n123456789");
        assert_eq!(buffer.next_line().unwrap(), Some(&b"12345678"[..]));
        let err = buffer.next_line().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Transport);
        assert!(err.message().contains("longer than 8 bytes"), "{err}");
        let mut buffer = LineBuffer::with_limit(8);
        buffer.push(b"123456789\n");
        assert!(buffer.next_line().is_err());
    }

    #[test]
    fn urls_drop_any_base_path_like_the_forevervm_sdk() {
        let t = RemoteTransport::new(
            "http://127.0.0.1:9/prefix/?q=1#f",
            "a.b",
            &Trust::DefaultRoots,
        )
        .unwrap();
        assert_eq!(
            t.url(&["v1", "whoami"]).unwrap().as_str(),
            "http://127.0.0.1:9/v1/whoami"
        );
        assert_eq!(
            t.websocket_url(None).unwrap().as_str(),
            "ws://127.0.0.1:9/v1/machine/new/repl?rich=true"
        );
        assert_eq!(
            t.websocket_url(Some("abc")).unwrap().as_str(),
            "ws://127.0.0.1:9/v1/machine/abc/repl?rich=true"
        );
        assert!(RemoteTransport::new("ftp://x", "a.b", &Trust::DefaultRoots).is_err());
    }

    #[test]
    fn machine_names_follow_the_engine_rule() {
        let t = RemoteTransport::new("http://127.0.0.1:9", "a.b", &Trust::DefaultRoots).unwrap();
        assert_eq!(
            t.machine_url("a_B-9", &["exec"]).unwrap().as_str(),
            "http://127.0.0.1:9/v1/machine/a_B-9/exec"
        );
        for bad in ["", "../etc", "a/b", "a.b", "new", "é", &"x".repeat(65)] {
            let err = t.machine_url(bad, &[]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NotFound, "{bad:?}");
            assert!(err.message().contains("no machine named"), "{err}");
        }
    }

    #[test]
    fn checkpoint_names_follow_the_engine_rule() {
        let t = RemoteTransport::new("http://127.0.0.1:9", "a.b", &Trust::DefaultRoots).unwrap();
        for good in ["v1.2", "before-cleanup", "a_b.c-d", "x.", &"c".repeat(64)] {
            let url = t.checkpoint_url("m", good, &["rollback"]).unwrap();
            assert_eq!(
                url.as_str(),
                format!("http://127.0.0.1:9/v1/machine/m/checkpoints/{good}/rollback")
            );
        }
        for bad in [
            "",
            ".hidden",
            "..",
            "a/b",
            "a b",
            "a%2Fb",
            "é",
            &"c".repeat(65),
        ] {
            let err = t.checkpoint_url("m", bad, &[]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
            assert!(err.message().contains("checkpoint name"), "{err}");
        }
        // The machine is checked as a machine, not as a checkpoint.
        let err = t.checkpoint_url("m.1", "v1.2", &[]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }
}
