//! `/mcp`: the MCP server ([`crate::mcp`]) over streamable HTTP, for the account of the bearer
//! token each request carries (the API's tokens). Stateless: no MCP session is kept between
//! requests, so any server behind a load balancer can take any of them; the machine travels in
//! tool arguments. A response streams (server-sent events) while a tool runs, with its progress
//! notifications; a client that closes it cancels the call, which interrupts the instruction.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::HeaderValue;
use axum::http::header::WWW_AUTHENTICATE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use evervm_engine::{Account, Engine};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::AppState;
use super::auth::Authed;
use crate::client::Client;
use crate::mcp::{AuditedCall, McpServer};

/// The caller of an MCP request, for the audit entries of its tool calls.
#[derive(Debug, Clone)]
struct Caller {
    account: String,
    token_id: String,
}

/// The largest MCP request: room for the largest code (1 MiB) and the largest file the file
/// tools take (4 MiB, as base64), so that those get the tools' own explanation; larger requests
/// get `413`.
pub(crate) const MCP_BODY_LIMIT_BYTES: usize = 8 * 1024 * 1024;

/// The MCP service for `engine`: each request's tools act for the account that
/// [`authenticate`] put on it.
pub(super) fn service(
    engine: Engine,
    redactor: Arc<super::redact::Redactor>,
) -> StreamableHttpService<McpServer, NeverSessionManager> {
    let engine_for_audit = engine.clone();
    let client_for = Arc::new(move |parts: &axum::http::request::Parts| {
        let account = parts.extensions.get::<Account>()?;
        Some(Client::from_engine(engine.clone(), account.clone()))
    });
    let redact = Arc::new(move |text: &str| redactor.text(text).into_owned());
    let audit = Arc::new(
        move |parts: &axum::http::request::Parts, call: AuditedCall| {
            let caller = parts.extensions.get::<Caller>().cloned();
            let engine = engine_for_audit.clone();
            let entry: futures::future::BoxFuture<'static, ()> = Box::pin(async move {
                let Some(Caller { account, token_id }) = caller else {
                    return;
                };
                let entry = evervm_engine::store::AuditEntry {
                    account: Some(account),
                    token_id: Some(token_id),
                    machine: call.machine,
                    detail: call
                        .code
                        .map(|code| engine.audit_detail_for_code(&code))
                        .or(call.detail),
                    ..evervm_engine::store::AuditEntry::now(
                        "mcp",
                        call.action,
                        if call.ok { "ok" } else { "error" },
                    )
                };
                engine.record_audit(entry).await;
            });
            entry
        },
    );
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        // Callers are known by their tokens, which a page that rebinds a name to this server
        // does not have; and behind a load balancer the Host is the balancer's name.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(MCP_BODY_LIMIT_BYTES);
    StreamableHttpService::new(
        move || {
            Ok(McpServer::per_request(
                client_for.clone(),
                redact.clone(),
                audit.clone(),
            ))
        },
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The bearer token's account on the request, or `401` (with the `WWW-Authenticate` header
/// MCP clients look for).
pub(super) async fn authenticate(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    match Authed::from_request_parts(&mut parts, &state).await {
        Ok(Authed(account)) => {
            if let Some(token) = super::auth::request_token(&parts) {
                parts.extensions.insert(Caller {
                    account: account.name.clone(),
                    token_id: super::audit::token_id(token).to_owned(),
                });
            }
            parts.extensions.insert(account);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(failure) => {
            let mut response = failure.into_response();
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}
