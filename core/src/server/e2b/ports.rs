//! A sandbox's ports, as E2B's `get_host(port)` reaches them: a request for any port other than
//! envd's and the code interpreter's is proxied (HTTP and WebSocket) to whatever listens on that
//! port inside the machine, through a tunnel over the agent channel; a swapped-out machine is
//! restored by the first request.
//!
//! Which sandbox and port a request is for, in this order:
//! - the headers `E2b-Sandbox-Id` and `E2b-Sandbox-Port` (E2B's own proxy honours them too);
//! - a host `<port>-<sandbox>.<domain>` (what `get_host` builds; needs wildcard DNS for the
//!   domain to reach evervm);
//! - `Authorization: Basic base64("<port>-<sandbox>.sdk-too-old:")`: what httpx, curl and Node's
//!   `http` send for `get_host`'s URL under evervm's default domain (`sdk-too-old@HOST`);
//! - a path `/ports/<port>-<sandbox>/...` (for setups without wildcard DNS; the prefix is taken
//!   off and sent on as `X-Forwarded-Prefix`).
//!
//! Who may: the sandbox's owner (its access token in `e2b-traffic-access-token`, as E2B's SDKs
//! send it, or `X-Access-Token`, or the account's API key in `X-API-Key`), or anyone when the
//! sandbox was created with `network.allowPublicTraffic = true`. E2B's default is public; evervm's
//! is private (docs/e2b.md). Those headers and the routing ones are taken off before the request
//! goes on; its `Authorization: Bearer` belongs to the application and goes on as it came.
//! Failures answer E2B's proxy's bodies.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use evervm_engine::{Account, ErrorKind, Tags};

use super::network::{is_public, masked_host};
use super::{E2bState, ENVD_PORT, INTERPRETER_PORT, access, header_text};

/// The header E2B's SDKs send a sandbox's traffic token in.
const TRAFFIC_TOKEN: &str = "e2b-traffic-access-token";
/// Where the path form starts.
const PATH_PREFIX: &str = "/ports/";

/// A request for a port of a sandbox.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) sandbox: String,
    port: u16,
    /// The path form's prefix, taken off before the request goes on.
    prefix: Option<String>,
    /// Whether `Authorization` carried the routing (and so is not the application's).
    routed_by_userinfo: bool,
}

/// Serves requests for a sandbox's own ports; passes every other request on.
pub(super) async fn dispatch(
    State(state): State<E2bState>,
    request: Request,
    next: Next,
) -> Response {
    match target(request.headers(), request.uri()) {
        None => next.run(request).await,
        Some(Err(refusal)) => refusal,
        Some(Ok(target)) => proxy(&state, target, request).await,
    }
}

/// `<port>-<sandbox>`, if it is one.
fn port_and_sandbox(label: &str) -> Option<(&str, &str)> {
    let (port, sandbox) = label.split_once('-')?;
    let valid = !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && !sandbox.is_empty()
        && sandbox.len() <= 64
        && sandbox
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    valid.then_some((port, sandbox))
}

/// The port and sandbox a request names. `None`: not a request for a user port (envd's and the
/// interpreter's stay with their handlers); `Some(Err)`: one with a bad port.
pub(super) fn target(headers: &HeaderMap, uri: &Uri) -> Option<Result<Target, Response>> {
    let (port, sandbox, prefix, routed_by_userinfo) =
        if let Some(sandbox) = header_text(headers, "e2b-sandbox-id") {
            let port = header_text(headers, "e2b-sandbox-port")?;
            (port.to_owned(), sandbox.to_owned(), None, false)
        } else if let Some((port, sandbox)) = host_label(headers) {
            (port, sandbox, None, false)
        } else if let Some((port, sandbox)) = userinfo(headers) {
            (port, sandbox, None, true)
        } else {
            let rest = uri.path().strip_prefix(PATH_PREFIX)?;
            let label = rest.split('/').next().unwrap_or_default();
            let (port, sandbox) = port_and_sandbox(label)?;
            let prefix = format!("{PATH_PREFIX}{label}");
            (port.to_owned(), sandbox.to_owned(), Some(prefix), false)
        };
    let port = match port.parse::<u16>() {
        Ok(port) if port > 0 => port,
        _ => return Some(Err(plain(StatusCode::BAD_REQUEST, "Invalid sandbox port"))),
    };
    if port == ENVD_PORT || port == INTERPRETER_PORT {
        return None;
    }
    Some(Ok(Target {
        sandbox,
        port,
        prefix,
        routed_by_userinfo,
    }))
}

/// A host `<port>-<sandbox>.<domain>`.
pub(super) fn host_label(headers: &HeaderMap) -> Option<(String, String)> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let (label, rest) = host.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    let (port, sandbox) = port_and_sandbox(label)?;
    Some((port.to_owned(), sandbox.to_owned()))
}

/// `Authorization: Basic base64("<port>-<sandbox>.sdk-too-old:")`.
fn userinfo(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?.trim();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.strip_suffix(':')?;
    let label = user.strip_suffix(&format!(".{}", access::SINK_USER))?;
    let (port, sandbox) = port_and_sandbox(label)?;
    Some((port.to_owned(), sandbox.to_owned()))
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

/// E2B's proxy's JSON failure.
fn failure(status: StatusCode, sandbox: &str, message: &str, port: Option<u16>) -> Response {
    let mut body = serde_json::json!({
        "sandboxId": sandbox,
        "message": message,
        "code": status.as_u16(),
    });
    if let Some(port) = port {
        body["port"] = port.into();
    }
    (status, axum::Json(body)).into_response()
}

fn not_found(sandbox: &str) -> Response {
    failure(
        StatusCode::BAD_GATEWAY,
        sandbox,
        "The sandbox was not found",
        None,
    )
}

/// Who the request acts for: the owner, by a credential, or anyone for a public sandbox. As
/// E2B's proxy does, a sandbox that does not exist is "not found" before any credential is
/// looked at.
async fn caller(
    state: &E2bState,
    headers: &HeaderMap,
    sandbox: &str,
) -> Result<(Account, Tags), Response> {
    let (owner, tags) = match state.engine.machine_owner(sandbox).await {
        Ok(found) => found,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidInput) => {
            return Err(not_found(sandbox));
        }
        Err(e) => return Err(super::E2bFailure::from(&e).into_response()),
    };
    let credential = [TRAFFIC_TOKEN, "x-access-token", "x-api-key"]
        .iter()
        .find_map(|name| header_text(headers, name));
    match credential {
        Some(credential) => {
            match access::authenticate_sandbox(&state.engine, credential, sandbox).await {
                Ok(account) if account.id == owner.id => Ok((account, tags)),
                // Another account's key: as for E2B, this sandbox is not one of its own.
                Ok(_) => Err(not_found(sandbox)),
                Err(_) => Err(failure(
                    StatusCode::FORBIDDEN,
                    sandbox,
                    "Sandbox is secured with traffic access token. Provided token in header \
                     'e2b-traffic-access-token' is invalid",
                    None,
                )),
            }
        }
        None if is_public(&tags) => Ok((owner, tags)),
        None => Err(failure(
            StatusCode::FORBIDDEN,
            sandbox,
            "Sandbox is secured with traffic access token. Token header \
             'e2b-traffic-access-token' is missing",
            None,
        )),
    }
}

async fn proxy(state: &E2bState, target: Target, mut request: Request) -> Response {
    let (account, tags) = match caller(state, request.headers(), &target.sandbox).await {
        Ok(found) => found,
        Err(refusal) => return refusal,
    };
    let stream = match state
        .engine
        .connect_port(&account, &target.sandbox, target.port)
        .await
    {
        Ok(stream) => stream,
        Err(e) => {
            return match (e.kind(), e.resource()) {
                (ErrorKind::NotFound, Some("port")) => failure(
                    StatusCode::BAD_GATEWAY,
                    &target.sandbox,
                    "The sandbox is running but port is not open",
                    Some(target.port),
                ),
                (ErrorKind::NotFound | ErrorKind::InvalidInput, _) => not_found(&target.sandbox),
                (ErrorKind::LimitExceeded, _) => failure(
                    StatusCode::TOO_MANY_REQUESTS,
                    &target.sandbox,
                    &format!(
                        "The sandbox has too many concurrent incoming connections (limit: {})",
                        evervm_engine::MAX_PORT_CONNECTIONS
                    ),
                    None,
                ),
                _ => failure(
                    StatusCode::BAD_GATEWAY,
                    &target.sandbox,
                    &format!("The sandbox's port {} did not answer: {e}", target.port),
                    None,
                ),
            };
        }
    };
    // A request to a paused sandbox resumes it, as E2B's auto-resume does.
    state.sandboxes.touch(&account, &target.sandbox);
    let headers = request.headers_mut();
    for name in [
        TRAFFIC_TOKEN,
        "x-access-token",
        "x-api-key",
        "e2b-sandbox-id",
        "e2b-sandbox-port",
    ] {
        headers.remove(name);
    }
    if target.routed_by_userinfo {
        headers.remove(header::AUTHORIZATION);
    }
    if let Some(host) = masked_host(&tags, target.port) {
        headers.insert(header::HOST, host);
    }
    if let Some(prefix) = &target.prefix {
        if let Ok(value) = HeaderValue::from_str(prefix) {
            headers.insert("x-forwarded-prefix", value);
        }
        let rest = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let rest = rest.strip_prefix(prefix.as_str()).unwrap_or(rest);
        let rest = if rest.starts_with('/') {
            rest.to_owned()
        } else {
            format!("/{rest}")
        };
        match rest.parse::<Uri>() {
            Ok(uri) => *request.uri_mut() = uri,
            Err(_) => return plain(StatusCode::BAD_REQUEST, "Invalid path"),
        }
    } else if let Some(path) = request.uri().path_and_query().cloned() {
        // The server in the sandbox gets an origin-form target.
        if let Ok(uri) = Uri::builder().path_and_query(path).build() {
            *request.uri_mut() = uri;
        }
    }
    match crate::server::proxy::proxy_over(stream, request).await {
        Ok(response) => response,
        Err(why) => failure(
            StatusCode::BAD_GATEWAY,
            &target.sandbox,
            &format!("The sandbox's port {} did not answer: {why}", target.port),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes())
                    .unwrap_or_else(|e| panic!("{e}")),
                HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")),
            );
        }
        map
    }

    fn uri(text: &str) -> Uri {
        text.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn ok(found: Option<Result<Target, Response>>) -> Target {
        match found {
            Some(Ok(target)) => target,
            Some(Err(response)) => panic!("refused: {}", response.status()),
            None => panic!("not a port request"),
        }
    }

    #[test]
    fn every_form_of_a_port_request_is_found() {
        let by_headers = headers(&[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "8000")]);
        let found = ok(target(&by_headers, &uri("/x")));
        assert_eq!((found.sandbox.as_str(), found.port), ("abc", 8000));
        let by_host = headers(&[("host", "8000-abc.example.test:3000")]);
        let found = ok(target(&by_host, &uri("/x")));
        assert_eq!((found.sandbox.as_str(), found.port), ("abc", 8000));
        let basic = base64::engine::general_purpose::STANDARD.encode("8001-abc.sdk-too-old:");
        let by_userinfo = headers(&[
            ("host", "127.0.0.1:3000"),
            ("authorization", &format!("Basic {basic}")),
        ]);
        let found = ok(target(&by_userinfo, &uri("/x")));
        assert_eq!((found.port, found.routed_by_userinfo), (8001, true));
        let plain_host = headers(&[("host", "127.0.0.1:3000")]);
        let found = ok(target(&plain_host, &uri("/ports/8002-abc/a/b?c=d")));
        assert_eq!(found.port, 8002);
        assert_eq!(found.prefix.as_deref(), Some("/ports/8002-abc"));
    }

    #[test]
    fn envd_and_the_interpreter_and_plain_requests_are_left_alone() {
        let envd = headers(&[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "49983")]);
        assert!(target(&envd, &uri("/files")).is_none());
        let interpreter = headers(&[("host", "49999-abc.example.test")]);
        assert!(target(&interpreter, &uri("/execute")).is_none());
        let plain_host = headers(&[("host", "127.0.0.1:3000")]);
        assert!(target(&plain_host, &uri("/sandboxes")).is_none());
        // An application's own Basic credentials are not routing.
        let basic = base64::engine::general_purpose::STANDARD.encode("alice:secret");
        let app = headers(&[("authorization", &format!("Basic {basic}"))]);
        assert!(target(&app, &uri("/")).is_none());
        let bad = headers(&[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "http")]);
        assert!(
            matches!(target(&bad, &uri("/")), Some(Err(r)) if r.status() == StatusCode::BAD_REQUEST)
        );
        let zero = headers(&[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "0")]);
        assert!(matches!(target(&zero, &uri("/")), Some(Err(_))));
    }
}
