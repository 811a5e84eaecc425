//! Extractors whose rejections are [`ApiFailure`]s (JSON bodies); axum's own answer in plain
//! text. JSON bodies don't require `Content-Type`: ForeverVM clients always send JSON.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiFailure;

/// A required JSON body.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

/// An optional JSON body: `None` for an empty body or `null`.
#[derive(Debug)]
pub(crate) struct OptionalJsonBody<T>(pub(crate) Option<T>);

/// Path parameters.
#[derive(Debug)]
pub(crate) struct WirePath<T>(pub(crate) T);

/// Query parameters.
#[derive(Debug)]
pub(crate) struct WireQuery<T>(pub(crate) T);

fn body_failure(rejection: &BytesRejection) -> ApiFailure {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiFailure::payload_too_large(format!(
            "the request body is larger than the limit of {} bytes",
            super::BODY_LIMIT_BYTES
        ))
    } else {
        ApiFailure::bad_request(format!(
            "cannot read the request body: {}",
            rejection.body_text()
        ))
    }
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

/// Parses a JSON object, naming the field and the position of what is wrong. Every body of the
/// API is an object: serde alone would also read a struct from an array of its fields
/// (`[null, null]`).
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiFailure> {
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiFailure::bad_request(
            "the request body must be a JSON object (`{...}`)",
        ));
    }
    axum::Json::<T>::from_bytes(bytes)
        .map(|axum::Json(value)| value)
        .map_err(|rejection| ApiFailure::bad_request(rejection.body_text()))
}

/// A required JSON body, decoded.
pub(crate) fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiFailure> {
    if is_blank(bytes) {
        return Err(ApiFailure::bad_request(
            "the request body is empty: this endpoint needs a JSON object",
        ));
    }
    parse_json(bytes)
}

/// An optional JSON body, decoded: `None` for an empty body or `null`.
pub(crate) fn parse_optional_body<T: DeserializeOwned>(
    bytes: &[u8],
) -> Result<Option<T>, ApiFailure> {
    if is_blank(bytes) || bytes.trim_ascii() == b"null" {
        return Ok(None);
    }
    parse_json::<T>(bytes).map(Some)
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiFailure;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|r| body_failure(&r))?;
        parse_body(&bytes).map(JsonBody)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiFailure;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|r| body_failure(&r))?;
        parse_optional_body(&bytes).map(OptionalJsonBody)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for WirePath<T> {
    type Rejection = ApiFailure;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(WirePath(value)),
            Err(rejection) => Err(ApiFailure::bad_request(rejection.body_text())),
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for WireQuery<T> {
    type Rejection = ApiFailure;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(WireQuery(value)),
            Err(rejection) => Err(ApiFailure::bad_request(rejection.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{CreateMachineRequest, ExecRequest};

    #[test]
    fn json_errors_name_the_problem() {
        let err = parse_json::<ExecRequest>(b"{").unwrap_err();
        assert_eq!(err.code, "BadRequest");
        assert!(err.message.contains("parse"), "{}", err.message);
        let err = parse_json::<ExecRequest>(br#"{"instruction":{"code":5}}"#).unwrap_err();
        assert!(err.message.contains("instruction.code"), "{}", err.message);
        let err = parse_json::<ExecRequest>(b"{}").unwrap_err();
        assert!(err.message.contains("instruction"), "{}", err.message);
    }

    #[test]
    fn bodies_are_objects() {
        assert_eq!(
            parse_json::<CreateMachineRequest>(b" \n{} ").unwrap(),
            CreateMachineRequest::default()
        );
        // serde reads a struct from an array of its fields; the API does not.
        for bad in [
            &b"[null, null]"[..],
            b"[]",
            b"null",
            b"5",
            b"\"x\"",
            b"",
            b"  ",
        ] {
            let err = parse_json::<CreateMachineRequest>(bad).unwrap_err();
            assert_eq!((err.status.as_u16(), err.code), (400, "BadRequest"));
            assert!(err.message.contains("JSON object"), "{}", err.message);
        }
        assert!(is_blank(b" \r\n"));
        assert!(!is_blank(b" {}"));
    }
}
