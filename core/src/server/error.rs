//! Errors on the wire: every failure is a status and an [`ApiError`] body
//! `{"code", "id", "message"}`, from the engine's [`ErrorKind`] by the wire's one table
//! ([`ErrorCode`]).

use std::borrow::Cow;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use evervm_engine as engine;

use super::redact::Redactor;
use crate::protocol::{ApiError, ErrorCode};

/// A failed request: the status and the body's `code` and `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiFailure {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl ApiFailure {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// A failure with one of the wire's codes, sent with its status.
    pub(crate) fn coded(code: &ErrorCode, message: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(code.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(status, code.code, message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::coded(&ErrorCode::BAD_REQUEST, message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::coded(&ErrorCode::UNAUTHORIZED, message)
    }

    pub(crate) fn payload_too_large(message: impl Into<String>) -> Self {
        Self::coded(&ErrorCode::PAYLOAD_TOO_LARGE, message)
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> ApiError {
        ApiError {
            code: self.code.to_owned(),
            id: None,
            message: Some(self.message.clone()),
        }
    }
}

impl From<&engine::Error> for ApiFailure {
    fn from(error: &engine::Error) -> Self {
        Self::coded(
            ErrorCode::for_error(error.kind(), error.resource()),
            error.message(),
        )
    }
}

impl From<engine::Error> for ApiFailure {
    fn from(error: engine::Error) -> Self {
        Self::from(&error)
    }
}

impl ApiFailure {
    /// The status and JSON body, as sent.
    fn render(&self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// Whether an answer with `status` is the server's own fault, logged as an error: a 5xx but
/// 501, which only says that something asked for is not offered (no sign-up, no network on the
/// process backend, another language's kernel) and is no more the operator's concern than a 4xx.
pub(crate) fn is_server_fault(status: StatusCode) -> bool {
    status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED
}

/// Logged with the full message, rendered, and kept in the response's extensions so that
/// [`redact_failure`] can take the host paths out of what the client sees.
impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        if is_server_fault(self.status) {
            tracing::error!(code = self.code, "{}", self.message);
        } else {
            tracing::debug!(code = self.code, "{}", self.message);
        }
        let mut response = self.render();
        response.extensions_mut().insert(self);
        response
    }
}

/// Middleware: a failure whose message names host paths is sent again without them.
pub(crate) async fn redact_failure(
    State(redactor): State<Arc<Redactor>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let Some(failure) = response.extensions().get::<ApiFailure>() else {
        return response;
    };
    match redactor.text(&failure.message) {
        Cow::Borrowed(_) => response,
        Cow::Owned(message) => ApiFailure {
            message,
            ..failure.clone()
        }
        .render(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evervm_engine::ErrorKind;

    fn mapped(error: engine::Error) -> (u16, &'static str) {
        let failure = ApiFailure::from(error);
        (failure.status.as_u16(), failure.code)
    }

    #[test]
    fn engine_kinds_map_to_statuses_and_codes() {
        assert_eq!(
            mapped(engine::Error::machine_not_found("m")),
            (404, "MachineNotFound")
        );
        assert_eq!(
            mapped(engine::Error::instruction_not_found("m", 3)),
            (404, "InstructionNotFound")
        );
        assert_eq!(
            mapped(engine::Error::new(ErrorKind::NotFound, "x")),
            (404, "NotFound")
        );
        assert_eq!(mapped(engine::Error::invalid("x")), (400, "BadRequest"));
        assert_eq!(
            mapped(engine::Error::unauthorized("x")),
            (401, "Unauthorized")
        );
        assert_eq!(
            mapped(engine::Error::unsupported("x")),
            (501, "Unsupported")
        );
        assert_eq!(
            mapped(engine::Error::new(ErrorKind::Conflict, "x")),
            (409, "Conflict")
        );
        assert_eq!(mapped(engine::Error::crashed("x")), (503, "MachineCrashed"));
        assert_eq!(mapped(engine::Error::internal("x")), (500, "InternalError"));
        assert_eq!(
            mapped(engine::Error::limit_exceeded("at most 3 machines")),
            (429, "LimitExceeded")
        );
    }

    #[test]
    fn too_large_is_413_denied_403_missing_file_404() {
        assert_eq!(
            mapped(engine::Error::too_large("code is too large")),
            (413, "PayloadTooLarge")
        );
        assert_eq!(
            mapped(engine::Error::new(ErrorKind::PermissionDenied, "outside")),
            (403, "PermissionDenied")
        );
        assert_eq!(
            mapped(engine::Error::file_not_found("/tmp/x: no such file")),
            (404, "FileNotFound")
        );
    }

    #[tokio::test]
    async fn failures_reach_clients_without_host_paths() {
        use axum::routing::get;
        let redactor = Arc::new(Redactor::new(
            std::path::Path::new("/srv/evervm"),
            std::path::Path::new("/srv/evervm/images"),
            None,
        ));
        let app = axum::Router::new()
            .route(
                "/damaged",
                get(|| async {
                    ApiFailure::from(engine::Error::crashed(
                        "the snapshot in /srv/evervm/machines/m/snapshot cannot be used: truncated",
                    ))
                }),
            )
            .route(
                "/plain",
                get(|| async { ApiFailure::from(engine::Error::machine_not_found("m")) }),
            )
            .layer(axum::middleware::from_fn_with_state(
                redactor,
                redact_failure,
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let answer = |path: &'static str| {
            let url = format!("{base}{path}");
            async move {
                let response = reqwest::get(url).await.unwrap();
                let status = response.status().as_u16();
                (status, response.text().await.unwrap())
            }
        };
        let (status, body) = answer("/damaged").await;
        assert_eq!(status, 503);
        assert!(!body.contains("/srv/evervm"), "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "code": "MachineCrashed",
                "id": null,
                "message": "the snapshot in <evervm home>/machines/m/snapshot cannot be used: truncated",
            })
        );
        let (status, body) = answer("/plain").await;
        assert_eq!(status, 404);
        assert!(body.contains("MachineNotFound"), "{body}");
    }

    #[test]
    fn body_has_code_null_id_and_message() {
        let body = ApiFailure::from(engine::Error::machine_not_found("m")).body();
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "code": "MachineNotFound",
                "id": null,
                "message": "no machine named \"m\"",
            })
        );
    }
}
