//! The audit log on the E2B door: the same entries as the evervm API's ([`crate::server::audit`]),
//! with the door `e2b`, for E2B's state-changing calls (sandboxes made, killed, paused, forked;
//! files written; processes started and signalled; cells run).

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use super::E2bState;
use crate::server::audit::{Call, Parameters};

/// The action a route of the E2B door changes state by; `None` for one that only reads.
/// `rpc` is the method a Connect route names (`Start`, `MakeDir`, ...).
fn action(method: &Method, route: &str, rpc: Option<&str>) -> Option<&'static str> {
    Some(match (method.as_str(), route, rpc) {
        ("POST", "/sandboxes" | "/v2/sandboxes", _) => "machine.create",
        ("DELETE", "/sandboxes/{sandbox_id}", _) => "machine.delete",
        ("POST", "/sandboxes/{sandbox_id}/timeout" | "/sandboxes/{sandbox_id}/refreshes", _) => {
            "sandbox.timeout"
        }
        ("POST", "/sandboxes/{sandbox_id}/pause", _) => "machine.swap",
        ("PUT", "/sandboxes/{sandbox_id}/network", _) => "sandbox.network",
        (
            "POST",
            "/sandboxes/{sandbox_id}/resume"
            | "/sandboxes/{sandbox_id}/connect"
            | "/v2/sandboxes/{sandbox_id}/connect",
            _,
        ) => "sandbox.connect",
        ("POST", "/sandboxes/{sandbox_id}/fork", _) => "machine.fork",
        ("POST", "/sandboxes/{sandbox_id}/snapshots", _) => "checkpoint.create",
        ("DELETE", "/templates/{template_id}", _) => "checkpoint.delete",
        ("POST", "/files", _) => "file.write",
        ("POST", "/filesystem.Filesystem/{method}", Some(rpc)) => match rpc {
            "MakeDir" => "file.mkdir",
            "Remove" => "file.remove",
            "Move" => "file.move",
            _ => return None,
        },
        ("POST", "/process.Process/{method}", Some(rpc)) => match rpc {
            "Start" => "process.start",
            "SendInput" => "process.input",
            "CloseStdin" => "process.close-stdin",
            "SendSignal" => "process.signal",
            "Update" => "process.update",
            _ => return None,
        },
        ("POST", "/execute", _) => "exec",
        ("POST", "/contexts", _) => "context.create",
        ("DELETE", "/contexts/{context_id}", _) => "context.remove",
        ("POST", "/contexts/{context_id}/restart", _) => "context.restart",
        _ => return None,
    })
}

/// Records an E2B call in the audit log once it is answered, when it changes state and its
/// caller was authenticated.
pub(super) async fn record(
    State(state): State<E2bState>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let Some(route) = matched.map(|m| m.as_str().to_owned()) else {
        return next.run(request).await;
    };
    let found = Parameters::of(&route, request.uri().path());
    let named = |key: &str| found.get(key);
    let Some(action) = action(request.method(), &route, named("method").as_deref()) else {
        return next.run(request).await;
    };
    let machine = named("sandbox_id")
        .or_else(|| super::header_text(request.headers(), "e2b-sandbox-id").map(str::to_owned));
    let call = Call {
        door: "e2b",
        action,
        machine,
        detail: named("context_id").or_else(|| named("template_id")),
    };
    call.run(&state.engine, request, next).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_not_audited_and_changes_are() {
        let post = Method::POST;
        assert_eq!(action(&post, "/sandboxes", None), Some("machine.create"));
        assert_eq!(
            action(&post, "/process.Process/{method}", Some("Start")),
            Some("process.start")
        );
        assert_eq!(
            action(&post, "/process.Process/{method}", Some("List")),
            None
        );
        assert_eq!(
            action(&post, "/filesystem.Filesystem/{method}", Some("Stat")),
            None
        );
        assert_eq!(action(&Method::GET, "/files", None), None);
        assert_eq!(action(&post, "/files", None), Some("file.write"));
    }
}
