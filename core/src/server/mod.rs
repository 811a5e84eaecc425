//! The HTTP + WebSocket server: an [`Engine`] behind the ForeverVM-compatible wire protocol
//! (`protocol.md`), plus evervm's own routes (machine info, delete, interrupt, `/healthz`,
//! `/openapi.json`).
//!
//! Handlers only parse, call the engine and map: wire types are in [`crate::protocol`], the
//! mapping in `convert.rs`, the errors in [`error`]. Routes live at the root, and a doubled
//! leading slash (`//v1/...`, what the Python and JS SDKs send when the base URL ends in `/`) is
//! accepted too.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use evervm::server::{self, ServeOptions};
//! let server = server::open(ServeOptions {
//!     home: Some("/tmp/evervm".into()),
//!     ..ServeOptions::default()
//! })
//! .await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! server.serve_with_shutdown(listener, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

pub(crate) mod audit;
mod auth;
mod contexts;
pub mod e2b;
pub(crate) mod error;
mod exec;
pub(crate) mod extract;
mod files;
mod forward;
mod machines;
mod mcp;
mod open;
mod openapi;
mod proxy;
pub(crate) mod redact;
pub(crate) mod repl;
pub mod tls;

pub use forward::trust_nodes;
pub use open::{PROCESS_FALLBACK_REFUSED, ServeOptions, Server, open};

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post};
use evervm_engine::Engine;

use self::error::ApiFailure;
use self::redact::Redactor;
use crate::protocol::{ErrorCode, HealthResponse};

/// The largest request body, a bit above the engine's code limit so that code between the two
/// gets the engine's own explanation; larger bodies get `413 PayloadTooLarge` too.
pub(crate) const BODY_LIMIT_BYTES: usize = 2 * 1024 * 1024;

/// How long a graceful shutdown waits for open requests (result long-polls) before it stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Every route, as written in the router and in `openapi.json` (the tests of [`openapi`] check
/// that the two agree).
pub(crate) mod paths {
    pub(crate) const HEALTHZ: &str = "/healthz";
    pub(crate) const METRICS: &str = "/metrics";
    pub(crate) const OPENAPI: &str = "/openapi.json";
    pub(crate) const SIGNUP: &str = "/internal/signup";
    pub(crate) const WHOAMI: &str = "/v1/whoami";
    pub(crate) const NODES: &str = "/v1/nodes";
    pub(crate) const AUDIT: &str = "/v1/audit";
    pub(crate) const MACHINE_NEW: &str = "/v1/machine/new";
    pub(crate) const MACHINE_LIST: &str = "/v1/machine/list";
    pub(crate) const MACHINE: &str = "/v1/machine/{machine_name}";
    pub(crate) const INTERRUPT: &str = "/v1/machine/{machine_name}/interrupt";
    pub(crate) const SWAP: &str = "/v1/machine/{machine_name}/swap";
    pub(crate) const FORK: &str = "/v1/machine/{machine_name}/fork";
    pub(crate) const CHECKPOINTS: &str = "/v1/machine/{machine_name}/checkpoints";
    pub(crate) const CHECKPOINT: &str = "/v1/machine/{machine_name}/checkpoints/{checkpoint}";
    pub(crate) const ROLLBACK: &str =
        "/v1/machine/{machine_name}/checkpoints/{checkpoint}/rollback";
    pub(crate) const CONTEXTS: &str = "/v1/machine/{machine_name}/contexts";
    pub(crate) const CONTEXT: &str = "/v1/machine/{machine_name}/contexts/{context}";
    pub(crate) const CONTEXT_RESTART: &str =
        "/v1/machine/{machine_name}/contexts/{context}/restart";
    pub(crate) const REWIND: &str = "/v1/machine/{machine_name}/rewind";
    pub(crate) const HISTORY: &str = "/v1/machine/{machine_name}/history";
    pub(crate) const LINEAGE: &str = "/v1/machine/{machine_name}/lineage";
    pub(crate) const EXEC: &str = "/v1/machine/{machine_name}/exec";
    pub(crate) const RESULT: &str = "/v1/machine/{machine_name}/exec/{instruction_seq}/result";
    pub(crate) const STREAM_RESULT: &str =
        "/v1/machine/{machine_name}/exec/{instruction_seq}/stream-result";
    pub(crate) const REPL: &str = "/v1/machine/{machine_name}/repl";
    pub(crate) const FILES: &str = "/v1/machine/{machine_name}/files";
    pub(crate) const INSTALL: &str = "/v1/machine/{machine_name}/install";
    /// As `openapi.json` writes it; the router's pattern is [`FILE_ROUTE`] (the path may hold
    /// `/`).
    #[cfg(test)]
    pub(crate) const FILE: &str = "/v1/machine/{machine_name}/files/{path}";
    pub(crate) const FILE_ROUTE: &str = "/v1/machine/{machine_name}/files/{*path}";
    /// The MCP server (streamable HTTP), outside the OpenAPI document.
    pub(crate) const MCP: &str = "/mcp";

    #[cfg(test)]
    pub(crate) const ALL: &[&str] = &[
        HEALTHZ,
        METRICS,
        OPENAPI,
        SIGNUP,
        WHOAMI,
        NODES,
        AUDIT,
        MACHINE_NEW,
        MACHINE_LIST,
        MACHINE,
        INTERRUPT,
        SWAP,
        FORK,
        CHECKPOINTS,
        CHECKPOINT,
        ROLLBACK,
        CONTEXTS,
        CONTEXT,
        CONTEXT_RESTART,
        REWIND,
        HISTORY,
        LINEAGE,
        EXEC,
        RESULT,
        STREAM_RESULT,
        REPL,
        FILES,
        FILE,
        INSTALL,
    ];
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) engine: Engine,
    /// Takes host paths out of the engine's text before a client sees it.
    pub(crate) redactor: Arc<Redactor>,
    /// The OpenAPI document, with this server's settings in it.
    pub(crate) openapi: Arc<str>,
    /// The token `/metrics` asks for (`EVERVM_METRICS_TOKEN`); none: `/metrics` is open.
    pub(crate) metrics_token: Option<Arc<str>>,
    /// The token that reads every account's audit entries (`EVERVM_ADMIN_TOKEN`); none: each
    /// account reads its own only.
    pub(crate) admin_token: Option<Arc<str>>,
}

/// The whole API for `engine`, ready for `axum::serve`; `/metrics` asks for the token in
/// `EVERVM_METRICS_TOKEN` when it is set, and the token in `EVERVM_ADMIN_TOKEN` reads every
/// account's audit entries.
pub fn router(engine: Engine) -> Router {
    let token = |key: &str| std::env::var(key).ok().filter(|t| !t.trim().is_empty());
    router_with_tokens(
        engine,
        token("EVERVM_METRICS_TOKEN"),
        token("EVERVM_ADMIN_TOKEN"),
    )
}

/// The whole API for `engine`; `/metrics` asks for `metrics_token` (none: it is open).
pub fn router_with_metrics_token(engine: Engine, metrics_token: Option<String>) -> Router {
    router_with_tokens(engine, metrics_token, None)
}

/// The whole API for `engine`; `/metrics` asks for `metrics_token` (none: it is open), and
/// `admin_token` reads every account's audit entries (none: each account reads its own).
pub fn router_with_tokens(
    engine: Engine,
    metrics_token: Option<String>,
    admin_token: Option<String>,
) -> Router {
    let state = AppState {
        redactor: Arc::new(Redactor::for_engine(&engine)),
        openapi: openapi::document_for(engine.limits(), engine.max_history()).into(),
        metrics_token: metrics_token.map(Into::into),
        admin_token: admin_token.map(Into::into),
        engine,
    };
    let api = Router::new()
        .route(paths::HEALTHZ, get(healthz))
        .route(paths::METRICS, get(metrics))
        .route(paths::OPENAPI, get(openapi::openapi))
        .route(paths::SIGNUP, post(signup))
        .route(paths::WHOAMI, get(machines::whoami))
        .route(paths::NODES, get(machines::nodes))
        .route(paths::AUDIT, get(audit::read))
        .route(paths::MACHINE_NEW, post(machines::create))
        .route(
            paths::MACHINE_LIST,
            get(machines::list_all).post(machines::list_filtered),
        )
        .route(paths::MACHINE, get(machines::info).delete(machines::delete))
        .route(paths::INTERRUPT, post(machines::interrupt))
        .route(paths::SWAP, post(machines::swap))
        .route(paths::FORK, post(machines::fork))
        .route(
            paths::CHECKPOINTS,
            get(machines::list_checkpoints).post(machines::create_checkpoint),
        )
        .route(paths::CHECKPOINT, delete(machines::delete_checkpoint))
        .route(paths::ROLLBACK, post(machines::rollback))
        .route(paths::CONTEXTS, get(contexts::list).post(contexts::create))
        .route(paths::CONTEXT, delete(contexts::remove))
        .route(paths::CONTEXT_RESTART, post(contexts::restart))
        .route(paths::REWIND, post(machines::rewind))
        .route(paths::HISTORY, get(machines::history))
        .route(paths::LINEAGE, get(machines::lineage))
        .route(paths::EXEC, post(exec::exec))
        .route(paths::RESULT, get(exec::result))
        .route(paths::STREAM_RESULT, get(exec::stream_result))
        .route(paths::REPL, get(repl::repl))
        .route(paths::FILES, get(files::list))
        .route(paths::INSTALL, post(files::install))
        .route(
            paths::FILE_ROUTE,
            get(files::read)
                .head(files::head)
                .put(files::write)
                .post(files::make_dir)
                .delete(files::remove)
                // A file's body is streamed to the machine, bounded by the file size limit.
                .layer(DefaultBodyLimit::disable()),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), audit::record))
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state.redactor),
            error::redact_failure,
        ))
        // Added after the layers above: MCP bounds its own requests and redacts its own
        // failures (they are tool results, not API errors).
        .merge(
            Router::new()
                .route_service(
                    paths::MCP,
                    mcp::service(state.engine.clone(), Arc::clone(&state.redactor)),
                )
                .route_layer(middleware::from_fn_with_state(
                    state.clone(),
                    mcp::authenticate,
                )),
        )
        .with_state(state.clone());
    let state_for_forwarding = state;
    // Routing happens inside `api`, after the outer layers have run: that is what lets
    // `normalize` rewrite the path before it is matched.
    Router::new()
        .fallback_service(api)
        .layer(middleware::from_fn_with_state(
            state_for_forwarding,
            forward::to_owner,
        ))
        .layer(middleware::from_fn(log_request))
        .layer(middleware::from_fn(close_after_refusal))
        .layer(middleware::map_request(normalize))
}

/// Says `Connection: close` on an error answer to an HTTP/1 request that carried a body. A
/// refusal (a bad token, a body too large) answers before the body is read, and hyper then
/// closes the connection without saying so: a client that sends its next request on it (httpx
/// does) finds it closed under it. Told, the client opens a new one.
async fn close_after_refusal(request: Request, next: Next) -> Response {
    use axum::http::{Version, header};
    let has_body = request.headers().contains_key(header::TRANSFER_ENCODING)
        || request
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|length| length.as_bytes() != b"0");
    let http1 = matches!(request.version(), Version::HTTP_10 | Version::HTTP_11);
    let mut response = next.run(request).await;
    if has_body
        && http1
        && (response.status().is_client_error() || response.status().is_server_error())
    {
        response.headers_mut().insert(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Serves `engine` on `listener` until Ctrl-C (or SIGTERM), then shuts down gracefully.
pub async fn serve(engine: Engine, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    serve_with_shutdown(engine, listener, shutdown_signal()).await
}

/// Serves `engine` on `listener` until `signal` completes. Then it stops accepting connections,
/// waits up to 10 s for open requests, and stops the machines' sandboxes (the engine stays
/// usable: machines start again on their next instruction).
pub async fn serve_with_shutdown<F>(
    engine: Engine,
    listener: tokio::net::TcpListener,
    signal: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_listeners(engine, listener, None, None, signal).await
}

/// Serves `engine`'s API on `listener` and, given `e2b`, its E2B-compatible API on that one
/// (see [`e2b`]), both over `tls` when given, until `signal` completes; then shuts down as
/// [`serve_with_shutdown`] does.
pub async fn serve_listeners<F>(
    engine: Engine,
    listener: tokio::net::TcpListener,
    e2b: Option<e2b::E2bListener>,
    tls: Option<tls::Tls>,
    signal: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, backend = engine.backend_name(), "serving the evervm API");
    }
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let signal = async move {
        signal.await;
        tracing::info!("shutting down");
        let _ = stopping_tx.send(true);
    };
    let stopped = |mut stopping: tokio::sync::watch::Receiver<bool>| async move {
        if stopping.wait_for(|stopping| *stopping).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    if let Some(tls) = &tls {
        tls.reload_on_sighup();
    }
    let serve = |listener: tokio::net::TcpListener, app: axum::Router, until: Until| {
        std::io::Result::Ok(match &tls {
            Some(tls) => spawn_server(tls.listener(listener)?, app, until),
            None => spawn_server(without_nagle(listener), app, until),
        })
    };
    let e2b = e2b.map(|e2b::E2bListener { listener, options }| {
        (listener, e2b::router_with(engine.clone(), options))
    });
    let mut api = router(engine.clone());
    if let Some((_, e2b_api)) = &e2b
        && engine.node_id().is_some()
    {
        // The other nodes forward E2B requests for this node's sandboxes here.
        api = api.nest_service(e2b::FORWARD_PREFIX, e2b_api.clone());
    }
    let mut servers = vec![serve(listener, api, Box::pin(signal))?];
    if let Some((e2b_listener, e2b_api)) = e2b {
        if let Ok(address) = e2b_listener.local_addr() {
            tracing::info!(%address, "serving the E2B-compatible API");
        }
        servers.push(serve(
            e2b_listener,
            e2b_api,
            Box::pin(stopped(stopping.clone())),
        )?);
    }
    let all_served = async {
        let mut result = Ok(());
        for server in servers {
            let served = server
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(format!("a listener stopped: {e}"))));
            if result.is_ok() {
                result = served;
            }
        }
        result
    };
    let grace_over = async move {
        stopped(stopping).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let result = tokio::select! {
        result = all_served => result,
        () = grace_over => {
            tracing::warn!("requests still open {} s after shutdown began: stopping anyway", SHUTDOWN_GRACE.as_secs());
            Ok(())
        }
    };
    engine.shutdown().await;
    result
}

/// When a server stops taking connections.
type Until = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves `app` on `listener` until `until`, on a task of its own.
fn spawn_server<L>(
    listener: L,
    app: axum::Router,
    until: Until,
) -> tokio::task::JoinHandle<std::io::Result<()>>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(until)
            .into_future(),
    )
}

/// The listener, with small messages (an exec, its result) sent without waiting for Nagle's
/// algorithm.
fn without_nagle(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
    })
}

/// Completes at Ctrl-C, or SIGTERM on Unix. The handlers are installed when this is called (a
/// signal that arrives between this call and the first poll is not lost), so call it before
/// telling anyone that the server is up. Never completes if no handler can be installed. Needs a
/// tokio runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &'static str| {
            let installed = signal(kind);
            async move {
                match installed {
                    Ok(mut signal) => {
                        signal.recv().await;
                    }
                    Err(e) => {
                        tracing::warn!("cannot listen for {name}: {e}");
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        let interrupt = listen(SignalKind::interrupt(), "Ctrl-C");
        let terminate = listen(SignalKind::terminate(), "SIGTERM");
        async move {
            tokio::select! {
                () = interrupt => {}
                () = terminate => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    }
}

/// The path with its leading slashes collapsed to one (`//v1/whoami` is `/v1/whoami`), keeping
/// the query; `None` when it is already normal.
pub(crate) fn normalized_path(path_and_query: &str) -> Option<String> {
    let rest = path_and_query.trim_start_matches('/');
    let slashes = path_and_query.len() - rest.len();
    (slashes > 1).then(|| format!("/{rest}"))
}

async fn normalize(mut request: Request) -> Request {
    let normal = request
        .uri()
        .path_and_query()
        .and_then(|p| normalized_path(p.as_str()));
    if let Some(normal) = normal {
        let mut parts = request.uri().clone().into_parts();
        match normal.parse() {
            Ok(path_and_query) => {
                parts.path_and_query = Some(path_and_query);
                match Uri::from_parts(parts) {
                    Ok(uri) => *request.uri_mut() = uri,
                    Err(e) => tracing::debug!("cannot normalise {}: {e}", request.uri().path()),
                }
            }
            Err(e) => tracing::debug!("cannot normalise {}: {e}", request.uri().path()),
        }
    }
    request
}

/// Logs each request at debug level (never the query, which may carry a token) and the
/// ForeverVM SDK headers at trace level.
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let headers = request.headers();
    if let Some(sdk) = headers.get("x-forevervm-sdk") {
        tracing::trace!(?sdk, runner = ?headers.get("x-forevervm-runner"), "client");
    }
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(
        %method,
        path,
        status = response.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}

/// `GET /metrics`: the engine's metrics in the OpenMetrics text format (which Prometheus
/// scrapes), behind `EVERVM_METRICS_TOKEN` when it is set.
async fn metrics(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiFailure> {
    use axum::response::IntoResponse;
    if let Some(expected) = &state.metrics_token {
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
            return Err(ApiFailure::unauthorized(
                "/metrics needs the metrics token (EVERVM_METRICS_TOKEN on the server) as a \
                 bearer token",
            ));
        }
    }
    let text = state.engine.metrics_text().await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Compares two secrets in a time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn healthz(State(state): State<AppState>) -> axum::Json<HealthResponse> {
    axum::Json(HealthResponse {
        status: "ok".to_owned(),
        backend: state.engine.backend_name().to_owned(),
        backend_version: state
            .redactor
            .text(&state.engine.backend_description())
            .into_owned(),
    })
}

/// `POST /internal/signup` (the ForeverVM CLI's `signup`): accounts on evervm are made by whoever
/// runs the server.
async fn signup() -> ApiFailure {
    ApiFailure::coded(
        &ErrorCode::UNSUPPORTED,
        "evervm has no sign-up: whoever runs the server creates tokens with \
         `evervm token create --account NAME`",
    )
}

async fn not_found(method: Method, uri: Uri) -> ApiFailure {
    ApiFailure::coded(
        &ErrorCode::NOT_FOUND,
        format!(
            "no route {method} {}: see /openapi.json for the API",
            uri.path()
        ),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiFailure {
    ApiFailure::coded(
        &ErrorCode::METHOD_NOT_ALLOWED,
        format!(
            "{} does not take {method}: see /openapi.json for the API",
            uri.path()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_slashes_collapse() {
        assert_eq!(normalized_path("/v1/whoami"), None);
        assert_eq!(normalized_path("/"), None);
        assert_eq!(normalized_path(""), None);
        assert_eq!(
            normalized_path("//v1/whoami").as_deref(),
            Some("/v1/whoami")
        );
        assert_eq!(
            normalized_path("///v1/machine/x/repl?_forevervm_jwt=a.b").as_deref(),
            Some("/v1/machine/x/repl?_forevervm_jwt=a.b")
        );
        assert_eq!(normalized_path("//").as_deref(), Some("/"));
        // Only the leading slashes: the rest of the path is the client's business.
        assert_eq!(normalized_path("/v1//whoami"), None);
    }
}
