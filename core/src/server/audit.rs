//! The audit log on the API: every state-changing call recorded once it is answered (who, which
//! token, which machine, how it went), and `GET /v1/audit` to read it.
//!
//! [`record`] runs after routing, so it knows the route a request took; authentication notes the
//! caller on the request's [`AuditNote`], and handlers add what only they know (the machine a
//! create made, the code an exec ran). A request whose credential was refused never reaches a
//! handler and leaves no entry: the engine counts it (`evervm_refused_credentials_total`), so
//! that a flood of bad tokens cannot fill the log.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use evervm_engine::Account;
use evervm_engine::store::{AuditEntry, AuditQuery};
use serde::Deserialize;

use super::AppState;
use super::error::ApiFailure;
use super::extract::WireQuery;
use super::paths;
use crate::protocol::{AuditResponse, ErrorCode};

/// What is known about a request for its audit entry, filled in as it is served.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuditNote(Arc<Mutex<Noted>>);

#[derive(Debug, Default)]
struct Noted {
    account: Option<String>,
    token_id: Option<String>,
    machine: Option<String>,
    detail: Option<String>,
}

impl AuditNote {
    fn with<T>(&self, f: impl FnOnce(&mut Noted) -> T) -> T {
        let mut noted = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut noted)
    }

    /// The caller, as authentication found it (`token`: the token, or a credential that
    /// starts with its id).
    pub(crate) fn caller(&self, account: &Account, token: &str) {
        let token_id = token_id(token).to_owned();
        self.with(|n| {
            n.account = Some(account.name.clone());
            n.token_id = Some(token_id);
        });
    }

    /// The machine the call was about, when the path does not name it (a create's).
    pub(crate) fn machine(&self, name: &str) {
        self.with(|n| n.machine = Some(name.to_owned()));
    }

    /// What the call was about, briefly.
    pub(crate) fn detail(&self, text: impl Into<String>) {
        let text = text.into();
        self.with(|n| n.detail = Some(text));
    }
}

impl<S: Send + Sync> FromRequestParts<S> for AuditNote {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // A request the audit does not follow gets a note nobody reads.
        Ok(parts.extensions.get::<Self>().cloned().unwrap_or_default())
    }
}

/// A token's id: the part before the `.` (the whole text when it has none).
pub(crate) fn token_id(token: &str) -> &str {
    token.split_once('.').map_or(token, |(id, _)| id)
}

/// How a call went, as the log says it: `ok`, or the status that refused it.
pub(crate) fn outcome(status: StatusCode) -> String {
    if status.is_success() || status.is_redirection() || status.is_informational() {
        "ok".to_owned()
    } else {
        format!(
            "{} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("error")
        )
    }
}

/// The action a route changes state by, or `None` for a route that only reads.
pub(crate) fn action(method: &Method, route: &str) -> Option<&'static str> {
    use paths::{
        CHECKPOINT, CHECKPOINTS, CONTEXT, CONTEXT_RESTART, CONTEXTS, EXEC, FILE_ROUTE, FORK,
        INSTALL, INTERRUPT, MACHINE, MACHINE_NEW, REWIND, ROLLBACK, SWAP,
    };
    let method = method.as_str();
    Some(match (method, route) {
        ("POST", MACHINE_NEW) => "machine.create",
        ("DELETE", MACHINE) => "machine.delete",
        ("POST", INTERRUPT) => "machine.interrupt",
        ("POST", SWAP) => "machine.swap",
        ("POST", FORK) => "machine.fork",
        ("POST", REWIND) => "machine.rewind",
        ("POST", CHECKPOINTS) => "checkpoint.create",
        ("DELETE", CHECKPOINT) => "checkpoint.delete",
        ("POST", ROLLBACK) => "checkpoint.rollback",
        ("POST", CONTEXTS) => "context.create",
        ("DELETE", CONTEXT) => "context.remove",
        ("POST", CONTEXT_RESTART) => "context.restart",
        ("POST", EXEC) => "exec",
        ("POST", INSTALL) => "packages.install",
        ("PUT", FILE_ROUTE) => "file.write",
        ("POST", FILE_ROUTE) => "file.mkdir",
        ("DELETE", FILE_ROUTE) => "file.remove",
        _ => return None,
    })
}

/// The values of a route's parameters in a request's path.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Parameters(Vec<(String, String)>);

impl Parameters {
    /// The values in `path` of `route`'s parameters (`{name}` one segment, `{*name}` the rest),
    /// percent-decoded.
    pub(crate) fn of(route: &str, path: &str) -> Self {
        let mut values = Vec::new();
        let mut given = path.trim_start_matches('/').split('/');
        for part in route.trim_start_matches('/').split('/') {
            let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) else {
                if given.next().is_none() {
                    break;
                }
                continue;
            };
            let value = match name.strip_prefix('*') {
                Some(_) => given.by_ref().collect::<Vec<_>>().join("/"),
                None => given.next().unwrap_or_default().to_owned(),
            };
            let decoded = percent_encoding::percent_decode_str(&value)
                .decode_utf8_lossy()
                .into_owned();
            values.push((name.trim_start_matches('*').to_owned(), decoded));
        }
        Self(values)
    }

    /// The value of the parameter `name`.
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    }
}

/// Records the request's call in the audit log once it is answered, when its route changes
/// state and its caller was authenticated.
pub(crate) async fn record(
    State(state): State<AppState>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let Some((action, route)) = matched
        .and_then(|m| action(request.method(), m.as_str()).map(|a| (a, m.as_str().to_owned())))
    else {
        return next.run(request).await;
    };
    let found = Parameters::of(&route, request.uri().path());
    let named = |key: &str| found.get(key);
    let call = Call {
        door: "api",
        action,
        machine: named("machine_name"),
        detail: named("checkpoint")
            .or_else(|| named("context"))
            .or_else(|| named("path")),
    };
    call.run(&state.engine, request, next).await
}

/// A call the audit log follows: what is known of it before it is served.
pub(crate) struct Call {
    pub(crate) door: &'static str,
    pub(crate) action: &'static str,
    /// The machine its path names, if any.
    pub(crate) machine: Option<String>,
    /// What its path says it is about, if anything (a handler's note replaces it).
    pub(crate) detail: Option<String>,
}

impl Call {
    /// Serves `request` with an [`AuditNote`] on it, then records the call: once it is
    /// answered, and only when authentication noted its caller.
    pub(crate) async fn run(
        self,
        engine: &evervm_engine::Engine,
        mut request: Request,
        next: Next,
    ) -> Response {
        let note = AuditNote::default();
        request.extensions_mut().insert(note.clone());
        let response = next.run(request).await;
        let noted = note.with(std::mem::take);
        let Some(account) = noted.account else {
            return response;
        };
        let entry = AuditEntry {
            account: Some(account),
            token_id: noted.token_id,
            machine: noted.machine.or(self.machine),
            detail: noted.detail.or(self.detail),
            ..AuditEntry::now(self.door, self.action, &outcome(response.status()))
        };
        engine.record_audit(entry).await;
        response
    }
}

/// `GET /v1/audit`'s query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditParams {
    account: Option<String>,
    machine: Option<String>,
    action: Option<String>,
    /// RFC 3339, or an age (`90s`, `15m`, `12h`, `30d`).
    since: Option<String>,
    /// Entries before this id (paging back).
    before: Option<i64>,
    limit: Option<usize>,
}

/// `GET /v1/audit`: audit entries, newest first. An account's token reads its own account's;
/// the admin token (`EVERVM_ADMIN_TOKEN` on the server) reads every account's.
pub(crate) async fn read(
    State(state): State<AppState>,
    mut parts: Parts,
    WireQuery(params): WireQuery<AuditParams>,
) -> Result<Json<AuditResponse>, ApiFailure> {
    let admin = is_admin(&state, &parts.headers);
    let own = if admin {
        None
    } else {
        let super::auth::Authed(account) =
            super::auth::Authed::from_request_parts(&mut parts, &state).await?;
        Some(account.name)
    };
    if let (Some(own), Some(asked)) = (&own, &params.account)
        && own != asked
    {
        return Err(ApiFailure::coded(
            &ErrorCode::PERMISSION_DENIED,
            "an account's token reads its own account's audit entries; the admin token \
             (EVERVM_ADMIN_TOKEN on the server) reads every account's",
        ));
    }
    let limit = params.limit.unwrap_or(100);
    if !(1..=evervm_engine::store::AUDIT_PAGE_MAX).contains(&limit) {
        return Err(ApiFailure::bad_request(format!(
            "limit={limit} is out of range: 1 to {}",
            evervm_engine::store::AUDIT_PAGE_MAX
        )));
    }
    let since = params
        .since
        .as_deref()
        .map(parse_since)
        .transpose()?
        .flatten();
    // No entry names a NUL (and PostgreSQL takes no NUL in text): such a filter matches none.
    let filters = [&params.account, &params.machine, &params.action];
    if filters
        .iter()
        .any(|f| f.as_deref().is_some_and(|t| t.contains('\0')))
    {
        return Ok(Json(AuditResponse {
            entries: Vec::new(),
        }));
    }
    let query = AuditQuery {
        account: own.or(params.account),
        machine: params.machine,
        action: params.action,
        since,
        before_id: params.before,
        limit,
    };
    Ok(Json(AuditResponse {
        entries: state.engine.audit_entries(&query).await?,
    }))
}

fn is_admin(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(expected) = &state.admin_token else {
        return false;
    };
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| super::auth::bearer_token(v).ok())
        .is_some_and(|given| super::constant_time_eq(given.as_bytes(), expected.as_bytes()))
}

/// A time given as RFC 3339 or as an age before now (`None`: an age reaching past every
/// time there is, so every entry).
fn parse_since(text: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiFailure> {
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(Some(time.with_timezone(&chrono::Utc)));
    }
    let age = crate::admin::parse_duration(text).map_err(|_| {
        ApiFailure::bad_request(format!(
            "since={text:?} is neither an RFC 3339 time nor an age such as 15m, 12h or 30d"
        ))
    })?;
    Ok(chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| chrono::Utc::now().checked_sub_signed(age)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_read_from_the_path_by_the_route() {
        let file = Parameters::of(paths::FILE_ROUTE, "/v1/machine/m-1/files/a/b%20c.txt");
        assert_eq!(file.get("machine_name").as_deref(), Some("m-1"));
        assert_eq!(file.get("path").as_deref(), Some("a/b c.txt"));
        let checkpoint = Parameters::of(paths::CHECKPOINT, "/v1/machine/m-2/checkpoints/before");
        assert_eq!(checkpoint.get("checkpoint").as_deref(), Some("before"));
        assert_eq!(
            Parameters::of(paths::MACHINE_NEW, "/v1/machine/new"),
            Parameters::default()
        );
    }

    #[test]
    fn outcomes_say_what_refused() {
        assert_eq!(outcome(StatusCode::OK), "ok");
        assert_eq!(outcome(StatusCode::NOT_FOUND), "404 Not Found");
    }

    /// Every route of the OpenAPI document that is not a read has an action, so no
    /// state-changing call goes unrecorded.
    #[test]
    fn every_state_changing_route_is_audited() {
        let document: serde_json::Value =
            serde_json::from_str(include_str!("openapi.json")).unwrap();
        let reads_by_post = [paths::MACHINE_LIST, paths::SIGNUP];
        let mut audited = 0;
        for (path, operations) in document["paths"].as_object().unwrap() {
            let route = if path == "/v1/machine/{machine_name}/files/{path}" {
                paths::FILE_ROUTE
            } else {
                path.as_str()
            };
            let methods = ["get", "head", "post", "put", "delete", "patch"];
            for method in operations
                .as_object()
                .unwrap()
                .keys()
                .filter(|key| methods.contains(&key.as_str()))
            {
                let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                if matches!(method, Method::GET | Method::HEAD) || reads_by_post.contains(&route) {
                    continue;
                }
                assert!(
                    action(&method, route).is_some(),
                    "{method} {path} changes state and has no audit action"
                );
                audited += 1;
            }
        }
        assert!(audited >= 17, "{audited}");
    }
}
