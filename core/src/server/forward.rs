//! In a cluster, a request for a machine that another node runs is forwarded to that node as it
//! came (method, path, query, headers, body streamed), and its answer streamed back; a WebSocket
//! upgrade is forwarded too, then its bytes copied both ways. A forwarded request carries
//! [`FORWARDED_BY`] and is never forwarded again: the node it reaches serves it (or refuses it,
//! if the machine moved meanwhile). The node forwarded to checks the token itself.
//!
//! Nodes that advertise `https://` addresses (each serving with `--tls-cert`) are reached over
//! TLS, their certificates verified against the cluster's CA (`--cluster-ca`) or, without one,
//! Mozilla's roots.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiFailure;
use crate::protocol::ErrorCode;

/// The header a forwarded request carries: the id of the node that forwarded it.
pub(crate) const FORWARDED_BY: &str = "x-evervm-forwarded-by";

/// How long connecting to the owner (its TLS handshake included) may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How this process verifies the nodes it forwards to over https; set once, by `evervm serve`.
static NODE_TLS: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> =
    std::sync::OnceLock::new();

/// Sets how the nodes this process forwards to over https are verified: against `trust` (a
/// cluster's CA file, or the default roots). Once per process; an error names a CA file that
/// cannot be read, or says it was set before.
pub fn trust_nodes(trust: &crate::Trust) -> crate::error::Result<()> {
    let config = trust.rustls_config()?;
    NODE_TLS.set(config).map_err(|_| {
        crate::error::Error::new(
            crate::error::ErrorKind::Conflict,
            "the nodes' CA is set once per process",
        )
    })
}

fn node_tls() -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    if let Some(config) = NODE_TLS.get() {
        return Ok(std::sync::Arc::clone(config));
    }
    let config = crate::Trust::DefaultRoots
        .rustls_config()
        .map_err(|e| e.to_string())?;
    Ok(std::sync::Arc::clone(NODE_TLS.get_or_init(|| config)))
}

/// The machine a path is about (`/v1/machine/NAME/...`), if any.
fn machine_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/machine/")?;
    let name = rest.split('/').next()?;
    (!name.is_empty() && name != "new" && name != "list").then_some(name)
}

/// Forwards requests for machines another node runs; serves the others here. A request this
/// node took for its own but lost to another node (both asked for a swapped machine at once:
/// the other took its lease) is forwarded to the winner, when its body was small enough to keep.
pub(crate) async fn to_owner(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(node) = forwarding_node(&state.engine, &request) else {
        return next.run(request).await;
    };
    let Some(machine) = machine_in_path(request.uri().path()).map(str::to_owned) else {
        return next.run(request).await;
    };
    if let Some(address) = owner_elsewhere(&state, &machine).await {
        return forwarded(&address, &node, request).await;
    }
    // Kept for a second try only when it is small: a file's bytes stream through.
    let replayable = !request.headers().contains_key(header::UPGRADE)
        && !request.uri().path().contains("/files/");
    if !replayable {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, super::BODY_LIMIT_BYTES).await else {
        return ApiFailure::coded(
            &ErrorCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than {} bytes",
                super::BODY_LIMIT_BYTES
            ),
        )
        .into_response();
    };
    let copy = Request::from_parts(parts.clone(), Body::from(body.clone()));
    let response = next.run(copy).await;
    if response.status() != StatusCode::CONFLICT {
        return response;
    }
    match owner_elsewhere(&state, &machine).await {
        Some(address) => {
            tracing::debug!(
                machine,
                "lost the machine to the node at {address}: forwarding"
            );
            forwarded(
                &address,
                &node,
                Request::from_parts(parts, Body::from(body)),
            )
            .await
        }
        None => response,
    }
}

/// This node's id when `request` may be forwarded: in a cluster, and not forwarded already.
pub(crate) fn forwarding_node(engine: &evervm_engine::Engine, request: &Request) -> Option<String> {
    if request.headers().contains_key(FORWARDED_BY) {
        return None;
    }
    engine.node_id().map(str::to_owned)
}

/// The address of the node that holds the machine's lease, when it is another node.
async fn owner_elsewhere(state: &AppState, machine: &str) -> Option<String> {
    match state.engine.owner_address(machine).await {
        Ok(address) => address,
        Err(e) => {
            tracing::warn!(machine, "cannot tell which node runs the machine: {e}");
            None
        }
    }
}

/// [`forward`], its failure answered as a bad gateway.
async fn forwarded(address: &str, node: &str, request: Request) -> Response {
    match forward(address, node, request).await {
        Ok(response) => response,
        Err(why) => ApiFailure::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::INTERNAL_ERROR.code,
            format!("the node that runs this machine ({address}) did not answer: {why}; try again"),
        )
        .into_response(),
    }
}

/// Sends `request` to the node at `address` (`http://HOST:PORT`) and streams its answer back.
pub(crate) async fn forward(
    address: &str,
    node: &str,
    mut request: Request,
) -> Result<Response, String> {
    let url = url::Url::parse(address).map_err(|e| format!("its address is invalid: {e}"))?;
    let secure = match url.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(format!(
                "its address is {other}://, not http:// or https://"
            ));
        }
    };
    let host = url.host_str().ok_or("its address has no host")?.to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let connecting = async {
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        if !secure {
            return Ok(NodeStream::Plain(stream));
        }
        // An address in brackets is an IPv6 address: its name for the certificate is bare.
        let name = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let name = rustls::pki_types::ServerName::try_from(name)
            .map_err(|e| format!("its host cannot be checked against a certificate: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(node_tls()?)
            .connect(name, stream)
            .await
            .map_err(|e| format!("its TLS certificate was refused: {e}"))?;
        Ok::<_, String>(NodeStream::Tls(Box::new(tls)))
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()))??;
    let headers = request.headers_mut();
    if let Ok(authority) = HeaderValue::from_str(&format!("{host}:{port}")) {
        headers.insert(header::HOST, authority);
    }
    if let Ok(by) = HeaderValue::from_str(node) {
        headers.insert(FORWARDED_BY, by);
    }
    match stream {
        NodeStream::Plain(stream) => super::proxy::proxy_over(stream, request).await,
        NodeStream::Tls(stream) => super::proxy::proxy_over(*stream, request).await,
    }
}

/// A connection to another node: plain, or TLS to an `https://` address.
enum NodeStream {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_of_one_machine_are_forwarded() {
        assert_eq!(machine_in_path("/v1/machine/abc/exec"), Some("abc"));
        assert_eq!(machine_in_path("/v1/machine/abc"), Some("abc"));
        assert_eq!(machine_in_path("/v1/machine/abc/files/a/b"), Some("abc"));
        assert_eq!(machine_in_path("/v1/machine/new"), None);
        assert_eq!(machine_in_path("/v1/machine/list"), None);
        assert_eq!(machine_in_path("/v1/machine/"), None);
        assert_eq!(machine_in_path("/v1/whoami"), None);
        assert_eq!(machine_in_path("/healthz"), None);
    }
}
