//! In a cluster, a request for a sandbox whose machine another node runs is forwarded to that
//! node, as the evervm API's are ([`crate::server::forward`]): to its API listener, under
//! [`FORWARD_PREFIX`], where every node with an E2B listener serves the same E2B API. A sandbox
//! named by its host (`<port>-<id>.<domain>`) is restated in `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` (the forwarded request's host is the node's), and the host the client
//! called goes along in [`CALLED_HOST`], so that answers name the client's own domain.
//!
//! A sandbox's timeout runs on the node it was made on (its home), so while no node runs its
//! machine (it starts on its first request, and stops when paused) its requests go home. When
//! the home node is gone, the node a request reaches serves it.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{E2bFailure, E2bState, header_text, ports};
use crate::server::forward::forwarding_node;

/// Where each node's API listener serves the E2B API for the other nodes.
pub const FORWARD_PREFIX: &str = "/_e2b";
/// The host the client of a forwarded request called.
pub(super) const CALLED_HOST: &str = "x-evervm-e2b-host";
/// The hidden tag naming the node a sandbox was made on: its timeout's clock runs there, so
/// its requests go there while no node runs its machine (which starts on its first request).
const HOME_TAG: &str = "e2b:node";

/// The tag that makes this node the home of a sandbox made here (none outside a cluster).
pub(super) fn home_tag(engine: &evervm_engine::Engine) -> Option<(String, String)> {
    engine
        .node_id()
        .map(|node| (HOME_TAG.to_owned(), node.to_owned()))
}

/// The sandbox a control-plane path is about (`/sandboxes/ID/...`, `/v2/sandboxes/ID/...`).
fn sandbox_in_path(path: &str) -> Option<&str> {
    let rest = path
        .strip_prefix("/sandboxes/")
        .or_else(|| path.strip_prefix("/v2/sandboxes/"))?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// The sandbox a request is for, and the port to restate in headers when its host named them.
fn named_sandbox(request: &Request) -> Option<(String, Option<String>)> {
    let headers = request.headers();
    if let Some(id) = sandbox_in_path(request.uri().path()) {
        return Some((id.to_owned(), None));
    }
    if let Some(id) = header_text(headers, "e2b-sandbox-id") {
        return Some((id.to_owned(), None));
    }
    if let Some((port, id)) = ports::host_label(headers) {
        return Some((id, Some(port)));
    }
    match ports::target(headers, request.uri()) {
        Some(Ok(target)) => Some((target.sandbox, None)),
        _ => None,
    }
}

/// Forwards a request for a sandbox another node runs; serves the others here.
pub(super) async fn to_owner(
    State(state): State<E2bState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(node) = forwarding_node(&state.engine, &request) else {
        return next.run(request).await;
    };
    let Some((sandbox, port)) = named_sandbox(&request) else {
        return next.run(request).await;
    };
    // The home node is looked up only when no node holds the sandbox's lease.
    let home = async || match state.engine.machine_owner(&sandbox).await {
        Ok((_, tags)) => tags.get(HOME_TAG).cloned(),
        Err(_) => None,
    };
    let address = match state.engine.serving_address(&sandbox, home).await {
        Ok(Some(address)) => address,
        Ok(None) => return next.run(request).await,
        Err(e) => {
            tracing::warn!(sandbox, "cannot tell which node runs the sandbox: {e}");
            return next.run(request).await;
        }
    };
    let called = request.headers().get(header::HOST).cloned();
    let headers = request.headers_mut();
    if let Some(called) = called {
        headers.insert(CALLED_HOST, called);
    }
    if let Some(port) = port
        && let (Ok(id), Ok(port)) = (
            HeaderValue::from_str(&sandbox),
            HeaderValue::from_str(&port),
        )
    {
        headers.insert("e2b-sandbox-id", id);
        headers.insert("e2b-sandbox-port", port);
    }
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    match format!("{FORWARD_PREFIX}{path}").parse::<Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => {
            return E2bFailure::bad_request("the request's path cannot be forwarded")
                .into_response();
        }
    }
    match crate::server::forward::forward(&address, &node, request).await {
        Ok(response) => response,
        Err(why) => E2bFailure::new(
            StatusCode::BAD_GATEWAY,
            format!("the node that runs sandbox {sandbox:?} ({address}) did not answer: {why}; try again"),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = Request::builder().uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn every_way_of_naming_a_sandbox_is_found() {
        let cases = [
            (request("/sandboxes/abc/timeout", &[]), Some(("abc", None))),
            (request("/v2/sandboxes/abc", &[]), Some(("abc", None))),
            (request("/sandboxes", &[]), None),
            (request("/v2/sandboxes?limit=5", &[]), None),
            (
                request("/execute", &[("E2b-Sandbox-Id", "abc")]),
                Some(("abc", None)),
            ),
            (
                request("/files", &[("Host", "49983-abc.example.com")]),
                Some(("abc", Some("49983"))),
            ),
            (
                request("/ports/8000-abc/index.html", &[]),
                Some(("abc", None)),
            ),
            (request("/health", &[("Host", "127.0.0.1:3000")]), None),
        ];
        for (request, expected) in cases {
            let found = named_sandbox(&request);
            let found = found
                .as_ref()
                .map(|(id, port)| (id.as_str(), port.as_deref()));
            assert_eq!(found, expected, "{}", request.uri());
        }
    }
}
