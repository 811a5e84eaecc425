//! The E2B-compatible API (`evervm serve --e2b-listen ADDR`): E2B's SDKs, pointed at this
//! listener with `E2B_API_URL` and `E2B_SANDBOX_URL`, drive evervm machines as E2B sandboxes.
//!
//! One listener serves the three APIs an E2B SDK speaks, told apart by their paths (which never
//! collide) and the headers the SDKs send with every sandbox request:
//! - the control plane ([`control`]): `/sandboxes`, `/v2/sandboxes`, authenticated by the
//!   `X-API-Key` (`e2b_<hex>`, see [`api_key_for_token`]);
//! - envd, the daemon inside an E2B sandbox, on port 49983 ([`envd`]): `/health`, `/files`
//!   and the Connect RPCs `filesystem.Filesystem/*` and `process.Process/*`;
//! - the code interpreter, on port 49999 ([`interpreter`]): `/execute` and `/contexts`.
//!
//! A sandbox request names its sandbox in `E2b-Sandbox-Id` (and its port in
//! `E2b-Sandbox-Port`), or in its host, `<port>-<id>.<domain>`, behind wildcard DNS. A sandbox
//! is a machine of the caller's account, its id the machine's name; its E2B timeout is kept
//! here ([`sandboxes`]): when it passes, the machine is swapped out (E2B's "paused"), and the
//! next `connect` or sandbox request brings it back.

mod access;
mod audit;
mod connect;
mod control;
mod envd;
mod forward;
pub use forward::FORWARD_PREFIX;
mod interpreter;
mod listing;
mod network;
mod ports;
mod process;
mod run;
mod sandboxes;
mod signed;
mod snapshots;
mod watch;

use std::sync::Arc;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use evervm_engine::{Account, Engine, ErrorKind};

pub use self::access::{check_domain, sink_domain_for};
use self::sandboxes::Sandboxes;
use super::redact::Redactor;

/// The port of envd, the daemon inside an E2B sandbox (files, commands).
pub const ENVD_PORT: u16 = 49983;
/// The port of E2B's code interpreter inside a sandbox (`/execute`).
pub const INTERPRETER_PORT: u16 = 49999;
/// The envd version this listener reports: the SDKs switch behaviours on it, and every feature
/// up to it that they use is implemented here (see docs/e2b.md).
pub const ENVD_VERSION: &str = "0.6.4";
/// What E2B keys start with; some SDK releases refuse keys that don't.
const KEY_PREFIX: &str = "e2b_";

/// The E2B API key of an evervm token: `e2b_` and the token's bytes in hex. The key authenticates
/// as the token does (it stops working when the token is revoked).
pub fn api_key_for_token(token: &str) -> String {
    let mut key = String::with_capacity(KEY_PREFIX.len() + 2 * token.len());
    key.push_str(KEY_PREFIX);
    for byte in token.bytes() {
        use std::fmt::Write as _;
        let _ = write!(key, "{byte:02x}");
    }
    key
}

/// The evervm token an E2B key stands for.
fn token_for_api_key(key: &str) -> Result<String, E2bFailure> {
    let malformed = || {
        E2bFailure::unauthorized(
            "the API key is not an evervm E2B key: make one with `evervm token create ACCOUNT \
             --e2b` (or `evervm token e2b TOKEN` for an existing token)",
        )
    };
    let hex = key.trim().strip_prefix(KEY_PREFIX).ok_or_else(malformed)?;
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 1024 {
        return Err(malformed());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(malformed)?;
    String::from_utf8(bytes).map_err(|_| malformed())
}

/// What every handler of the listener shares.
#[derive(Clone)]
pub(crate) struct E2bState {
    pub(crate) engine: Engine,
    pub(crate) redactor: Arc<Redactor>,
    pub(crate) sandboxes: Arc<Sandboxes>,
    pub(crate) commands: Arc<process::Commands>,
    pub(crate) watchers: Arc<watch::Watchers>,
    pub(crate) signed: Arc<signed::SignedUrls>,
    /// The domain sandboxes are answered under (`--e2b-domain`); none: evervm's sink domain.
    pub(crate) domain: Option<Arc<str>>,
    /// Whether a sandbox's ports answer anyone unless it was created private
    /// (`--e2b-public-ports`, E2B's default), rather than only its owner unless created public.
    pub(crate) public_ports: bool,
}

/// How the E2B-compatible API is served.
#[derive(Debug, Clone, Default)]
pub struct E2bOptions {
    /// The domain sandboxes are answered under, so that `get_host(port)` gives
    /// `<port>-<id>.<domain>` (wildcard DNS for it leads to this listener); checked with
    /// [`check_domain`]. None: `sdk-too-old@<the listener's address>`.
    pub domain: Option<String>,
    /// A sandbox's ports answer anyone unless it is created with `allowPublicTraffic: false`
    /// (E2B's default); otherwise only its owner unless it is created with `true`.
    pub public_ports: bool,
}

/// The E2B-compatible API's listener and how it is served.
#[derive(Debug)]
pub struct E2bListener {
    pub listener: tokio::net::TcpListener,
    pub options: E2bOptions,
}

/// The E2B-compatible API over `engine`, served at its root. Spawns the task that pauses
/// sandboxes whose timeout passed (it ends with the engine).
pub fn router(engine: Engine) -> Router {
    router_with(engine, E2bOptions::default())
}

/// [`router`], served as `options` say.
pub fn router_with(engine: Engine, options: E2bOptions) -> Router {
    let sandboxes = Sandboxes::new();
    sandboxes::spawn_reaper(engine.clone(), Arc::downgrade(&sandboxes));
    let state = E2bState {
        redactor: Arc::new(Redactor::for_engine(&engine)),
        sandboxes,
        commands: Arc::default(),
        watchers: Arc::default(),
        signed: Arc::default(),
        domain: options.domain.map(Arc::from),
        public_ports: options.public_ports,
        engine,
    };
    Router::new()
        // The control plane, both path generations.
        .route(
            "/sandboxes",
            post(control::create).get(listing::list_running),
        )
        .route("/v2/sandboxes", post(control::create).get(listing::list))
        .route(
            "/sandboxes/{sandbox_id}",
            get(control::info).delete(control::kill),
        )
        .route("/v2/sandboxes/{sandbox_id}", get(control::info))
        .route(
            "/sandboxes/{sandbox_id}/timeout",
            post(control::set_timeout),
        )
        .route("/sandboxes/{sandbox_id}/refreshes", post(control::refresh))
        .route("/sandboxes/{sandbox_id}/pause", post(control::pause))
        .route(
            "/sandboxes/{sandbox_id}/network",
            put(control::update_network),
        )
        .route("/sandboxes/{sandbox_id}/resume", post(control::connect))
        .route("/sandboxes/{sandbox_id}/connect", post(control::connect))
        .route("/v2/sandboxes/{sandbox_id}/connect", post(control::connect))
        .route("/sandboxes/{sandbox_id}/metrics", get(control::metrics))
        .route("/sandboxes/{sandbox_id}/fork", post(control::fork))
        .route("/sandboxes/{sandbox_id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{template_id}", delete(snapshots::delete))
        .route("/templates/aliases/{alias}", get(control::template_alias))
        // envd.
        .route("/health", get(envd::health))
        .route(
            "/files",
            get(envd::read_file)
                .post(envd::write_files)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/filesystem.Filesystem/{method}", post(envd::filesystem))
        .route("/process.Process/{method}", post(process::process))
        // The code interpreter.
        .route("/execute", post(interpreter::execute))
        .route(
            "/contexts",
            post(interpreter::create_context).get(interpreter::list_contexts),
        )
        .route(
            "/contexts/{context_id}",
            delete(interpreter::remove_context),
        )
        .route(
            "/contexts/{context_id}/restart",
            post(interpreter::restart_context),
        )
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            audit::record,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(
            super::BODY_LIMIT_BYTES,
        ))
        // A request for a sandbox's own port goes there whatever its path.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ports::dispatch,
        ))
        // Outermost: in a cluster, a sandbox another node runs is served there.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_owner,
        ))
        .with_state(state)
}

async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> E2bFailure {
    E2bFailure::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {method} {} in evervm's E2B-compatible API (see docs/e2b.md)",
            uri.path()
        ),
    )
}

/// What a sandbox request that failed gets: a sandbox that does not exist (or was killed) is
/// E2B's proxy's 502 "was not found" (which the SDKs read as "not running"), anything else the
/// engine's error.
pub(crate) fn sandbox_failure(error: &evervm_engine::Error, sandbox: &str) -> E2bFailure {
    if error.kind() == ErrorKind::NotFound && error.resource() == Some("machine") {
        E2bFailure::new(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {sandbox} was not found"),
        )
    } else {
        E2bFailure::from(error)
    }
}

/// A failed control-plane (or plain HTTP envd) request: E2B's error body, `{"code": <the
/// status>, "message"}` (the SDKs branch on `code`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct E2bFailure {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl E2bFailure {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    pub(crate) fn sandbox_not_found(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("sandbox {id:?} not found"))
    }
}

impl From<&evervm_engine::Error> for E2bFailure {
    fn from(error: &evervm_engine::Error) -> Self {
        let status = match error.kind() {
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
            ErrorKind::MachineCrashed | ErrorKind::Transport => StatusCode::BAD_GATEWAY,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error.message())
    }
}

impl From<evervm_engine::Error> for E2bFailure {
    fn from(error: evervm_engine::Error) -> Self {
        Self::from(&error)
    }
}

impl IntoResponse for E2bFailure {
    fn into_response(self) -> Response {
        if crate::server::error::is_server_fault(self.status) {
            tracing::error!(status = self.status.as_u16(), "{}", self.message);
        } else {
            tracing::debug!(status = self.status.as_u16(), "{}", self.message);
        }
        (
            self.status,
            axum::Json(serde_json::json!({
                "code": self.status.as_u16(),
                "message": self.message,
            })),
        )
            .into_response()
    }
}

/// The caller of a control-plane request, from its `X-API-Key` (or `Authorization: Bearer`).
#[derive(Debug)]
pub(crate) struct ApiCaller(pub(crate) Account);

impl FromRequestParts<E2bState> for ApiCaller {
    type Rejection = E2bFailure;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, E2bFailure> {
        let key = header_text(&parts.headers, "x-api-key")
            .or_else(|| bearer(&parts.headers))
            .ok_or_else(|| {
                E2bFailure::unauthorized(
                    "no API key: send `X-API-Key: e2b_...` (E2B_API_KEY; make one with `evervm \
                     token create ACCOUNT --e2b`)",
                )
            })?;
        let account = authenticate(state, key).await?;
        if let Some(note) = parts.extensions.get::<crate::server::audit::AuditNote>()
            && let Ok(token) = token_for_api_key(key)
        {
            note.caller(&account, &token);
        }
        Ok(ApiCaller(account))
    }
}

/// The caller of a sandbox request and the sandbox it names.
#[derive(Debug)]
pub(crate) struct SandboxCaller {
    pub(crate) account: Account,
    /// The sandbox id: the machine's name.
    pub(crate) sandbox: String,
}

/// The sandbox a request names and the port it is for: the `E2b-Sandbox-Id` and
/// `E2b-Sandbox-Port` headers, or a host `<port>-<id>.<domain>`.
fn sandbox_target(parts: &Parts) -> Result<(String, Option<u16>), E2bFailure> {
    if let Some(id) = header_text(&parts.headers, "e2b-sandbox-id") {
        let port = header_text(&parts.headers, "e2b-sandbox-port")
            .map(|p| {
                p.parse::<u16>().map_err(|_| {
                    E2bFailure::bad_request(format!("E2b-Sandbox-Port {p:?} is not a port"))
                })
            })
            .transpose()?;
        return Ok((id.to_owned(), port));
    }
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.host())
        .unwrap_or_default();
    let label = host.split('.').next().unwrap_or_default();
    if host.contains('.')
        && let Some((port, id)) = label.split_once('-')
        && let Ok(port) = port.parse::<u16>()
        && !id.is_empty()
    {
        return Ok((id.to_owned(), Some(port)));
    }
    Err(E2bFailure::bad_request(
        "this is a sandbox request but names no sandbox: send E2b-Sandbox-Id and \
         E2b-Sandbox-Port (E2B_SANDBOX_URL makes the SDKs do so), or use a host \
         <port>-<sandbox id>.<domain>",
    ))
}

impl SandboxCaller {
    /// The caller and its sandbox, for a request to `port`: authenticated by the sandbox's
    /// access token (`X-Access-Token`, or `E2B-Traffic-Access-Token` where the code
    /// interpreter's SDKs send only that), or the account's API key.
    async fn extract(parts: &Parts, state: &E2bState, port: u16) -> Result<Self, E2bFailure> {
        let (sandbox, asked_port) = sandbox_target(parts)?;
        if let Some(asked) = asked_port
            && asked != port
        {
            return Err(E2bFailure::new(
                StatusCode::BAD_GATEWAY,
                format!(
                    "the sandbox {sandbox:?} has nothing on port {asked} for {}: evervm serves \
                     envd on {ENVD_PORT} and the code interpreter on {INTERPRETER_PORT}",
                    parts.uri.path()
                ),
            ));
        }
        let key = header_text(&parts.headers, "x-access-token")
            .or_else(|| header_text(&parts.headers, "e2b-traffic-access-token"))
            .or_else(|| header_text(&parts.headers, "x-api-key"))
            .or_else(|| bearer(&parts.headers))
            .ok_or_else(|| {
                E2bFailure::unauthorized(
                    "no access token: send the sandbox's envdAccessToken as X-Access-Token",
                )
            })?;
        let account = access::authenticate_sandbox(&state.engine, key, &sandbox).await?;
        if let Some(note) = parts.extensions.get::<crate::server::audit::AuditNote>() {
            note.caller(&account, &access::token_id_of(key));
        }
        Ok(Self { account, sandbox })
    }
}

/// A caller of envd (port 49983).
#[derive(Debug)]
pub(crate) struct EnvdCaller(pub(crate) SandboxCaller);

impl FromRequestParts<E2bState> for EnvdCaller {
    type Rejection = E2bFailure;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, E2bFailure> {
        SandboxCaller::extract(parts, state, ENVD_PORT)
            .await
            .map(EnvdCaller)
    }
}

/// A caller of the code interpreter (port 49999).
#[derive(Debug)]
pub(crate) struct InterpreterCaller(pub(crate) SandboxCaller);

impl FromRequestParts<E2bState> for InterpreterCaller {
    type Rejection = E2bFailure;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, E2bFailure> {
        SandboxCaller::extract(parts, state, INTERPRETER_PORT)
            .await
            .map(InterpreterCaller)
    }
}

async fn authenticate(state: &E2bState, key: &str) -> Result<Account, E2bFailure> {
    let token = token_for_api_key(key)?;
    state
        .engine
        .authenticate(&token)
        .await
        .map_err(E2bFailure::from)
}

/// A mutex's data, even after a panic elsewhere (what the maps here hold stays consistent).
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = header_text(headers, header::AUTHORIZATION.as_str())?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stand_for_tokens() {
        let key = api_key_for_token("abc123.secret");
        assert!(key.starts_with("e2b_"));
        assert!(key[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(token_for_api_key(&key).unwrap(), "abc123.secret");
        for bad in ["", "e2b_", "e2b_abc", "e2b_zz", "abc123.secret", "e2b_ff"] {
            let err = token_for_api_key(bad).unwrap_err();
            assert_eq!(err.status, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
    }

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = axum::http::Request::builder().uri("/files");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn sandbox_targets_from_headers_or_host() {
        let by_header = parts(&[("E2b-Sandbox-Id", "abc"), ("E2b-Sandbox-Port", "49983")]);
        assert_eq!(
            sandbox_target(&by_header).unwrap(),
            ("abc".to_owned(), Some(49983))
        );
        let by_host = parts(&[("host", "49999-abc.sandbox.example.com")]);
        assert_eq!(
            sandbox_target(&by_host).unwrap(),
            ("abc".to_owned(), Some(49999))
        );
        let bad_port = parts(&[("E2b-Sandbox-Id", "abc"), ("E2b-Sandbox-Port", "x")]);
        assert_eq!(
            sandbox_target(&bad_port).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        for host in ["localhost:3000", "api.example.com", "x-abc.example.com"] {
            let none = parts(&[("host", host)]);
            assert!(sandbox_target(&none).is_err(), "{host}");
        }
    }
}
