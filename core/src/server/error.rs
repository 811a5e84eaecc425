//! Errors on the wire: every failure is a status and an [`ApiError`] body
//! `{"code", "id", "message"}`, from the engine's [`ErrorKind`] by the wire's one table
//! ([`ErrorCode`]).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use evervm_engine::{self as engine, ErrorKind};

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

    /// An engine error from accepting an instruction of `code_bytes` bytes: the same as
    /// [`ApiFailure::from`], except that code over the engine's limit is `413 PayloadTooLarge`.
    pub(crate) fn from_exec_error(error: &engine::Error, code_bytes: usize) -> Self {
        if error.kind() == ErrorKind::InvalidInput && code_bytes > engine::MAX_CODE_BYTES {
            Self::payload_too_large(error.message())
        } else {
            Self::from(error)
        }
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

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, "{}", self.message);
        } else {
            tracing::debug!(code = self.code, "{}", self.message);
        }
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn oversized_code_is_413_other_invalid_input_400() {
        let invalid = engine::Error::invalid("code is too large");
        let too_large = ApiFailure::from_exec_error(&invalid, engine::MAX_CODE_BYTES + 1);
        assert_eq!(
            (too_large.status.as_u16(), too_large.code),
            (413, "PayloadTooLarge")
        );
        let small = ApiFailure::from_exec_error(&invalid, 10);
        assert_eq!((small.status.as_u16(), small.code), (400, "BadRequest"));
        let missing =
            ApiFailure::from_exec_error(&engine::Error::machine_not_found("m"), usize::MAX);
        assert_eq!(missing.code, "MachineNotFound");
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
