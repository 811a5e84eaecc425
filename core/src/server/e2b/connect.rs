//! The Connect protocol (connectrpc.com) with its JSON codec, as E2B's in-sandbox daemon
//! (envd) speaks it and the E2B SDKs expect: unary calls (`application/json` in and out, errors
//! as a status and `{"code", "message"}`) and server streams (`application/connect+json`: every
//! message in a 5-byte envelope, a flags byte and a big-endian length, and an end-of-stream
//! envelope, flags `0x02`, carrying the error if there was one).

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use evervm_engine::{self as engine, ErrorKind};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The content type of a unary call's request and answer.
pub(super) const UNARY_CONTENT_TYPE: &str = "application/json";
/// The content type of a streaming call's request and answer.
pub(super) const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// An envelope's flags: a message.
const FLAG_MESSAGE: u8 = 0x00;
/// An envelope's flags: compressed (this server never accepts compression, nor sends it).
const FLAG_COMPRESSED: u8 = 0x01;
/// An envelope's flags: the end of the stream.
const FLAG_END_STREAM: u8 = 0x02;
/// The largest request message, enveloped or not: requests are commands and paths.
pub(super) const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    /// Its name on the wire.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status a unary error goes with (the Connect specification's table).
    pub(super) fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }

    /// The code for an engine error.
    pub(super) fn for_kind(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::InvalidInput => Code::InvalidArgument,
            ErrorKind::Unauthorized => Code::Unauthenticated,
            ErrorKind::Unsupported => Code::Unimplemented,
            ErrorKind::MachineCrashed | ErrorKind::Transport => Code::Unavailable,
            ErrorKind::Conflict => Code::FailedPrecondition,
            ErrorKind::LimitExceeded | ErrorKind::TooLarge => Code::ResourceExhausted,
            ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::Internal => Code::Internal,
        }
    }
}

/// A failed Connect call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RpcError {
    pub(super) code: Code,
    pub(super) message: String,
}

impl RpcError {
    pub(super) fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// A call evervm does not emulate: say which and what works instead.
    pub(super) fn unimplemented(procedure: &str) -> Self {
        Self::new(
            Code::Unimplemented,
            format!(
                "{procedure} is not emulated by evervm's E2B listener: see docs/e2b.md for \
                 what is"
            ),
        )
    }

    fn body(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }

    /// The end-of-stream envelope that ends a stream with this error.
    pub(super) fn end_of_stream(&self) -> Bytes {
        end_of_stream(Some(self))
    }
}

impl From<&engine::Error> for RpcError {
    fn from(error: &engine::Error) -> Self {
        Self::new(Code::for_kind(error.kind()), error.message())
    }
}

impl From<engine::Error> for RpcError {
    fn from(error: engine::Error) -> Self {
        Self::from(&error)
    }
}

impl IntoResponse for RpcError {
    /// The unary form: the code's status and the JSON body.
    fn into_response(self) -> Response {
        (
            self.code.status(),
            [(CONTENT_TYPE, UNARY_CONTENT_TYPE)],
            self.body().to_string(),
        )
            .into_response()
    }
}

/// A unary call's answer.
pub(super) fn unary<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => ([(CONTENT_TYPE, UNARY_CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            RpcError::new(Code::Internal, format!("cannot encode the answer: {e}")).into_response()
        }
    }
}

/// A unary call's request: the body as JSON (an empty body is the empty message).
pub(super) fn parse_unary<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let body = if body.trim_ascii().is_empty() {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| RpcError::invalid(format!("bad request message: {e}")))
}

/// A streaming call's request: exactly one uncompressed message envelope.
pub(super) fn parse_enveloped<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let (flags, message, rest) = split_envelope(body)?;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(RpcError::new(
            Code::Unimplemented,
            "compressed messages are not accepted: send them uncompressed (identity)",
        ));
    }
    if flags != FLAG_MESSAGE || !rest.is_empty() {
        return Err(RpcError::invalid(
            "a server-streaming call takes exactly one request message",
        ));
    }
    parse_unary(message)
}

/// The first envelope of `body`: its flags, its message and what follows it.
fn split_envelope(body: &[u8]) -> Result<(u8, &[u8], &[u8]), RpcError> {
    let Some((header, rest)) = body.split_first_chunk::<5>() else {
        return Err(RpcError::invalid(
            "the request is not an enveloped message (5-byte prefix missing)",
        ));
    };
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if length > MAX_REQUEST_BYTES {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("the request message is larger than {MAX_REQUEST_BYTES} bytes"),
        ));
    }
    if rest.len() < length {
        return Err(RpcError::invalid(format!(
            "the request envelope says {length} bytes but {} follow",
            rest.len()
        )));
    }
    let (message, rest) = rest.split_at(length);
    Ok((header[0], message, rest))
}

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    // A message larger than 4 GiB is never built here (output is cut into lines well below).
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// One message of a stream.
pub(super) fn message<T: Serialize>(message: &T) -> Bytes {
    match serde_json::to_vec(message) {
        Ok(payload) => envelope(FLAG_MESSAGE, &payload),
        Err(e) => {
            RpcError::new(Code::Internal, format!("cannot encode a message: {e}")).end_of_stream()
        }
    }
}

/// The end-of-stream envelope: `{}`, or `{"error": {...}}`.
pub(super) fn end_of_stream(error: Option<&RpcError>) -> Bytes {
    let payload = match error {
        Some(error) => serde_json::json!({ "error": error.body() }),
        None => serde_json::json!({}),
    };
    envelope(FLAG_END_STREAM, payload.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Ping {
        #[serde(default)]
        n: u32,
    }

    #[test]
    fn envelopes_round_trip() {
        let framed = message(&serde_json::json!({"n": 7}));
        assert_eq!(framed[0], FLAG_MESSAGE);
        assert_eq!(&framed[1..5], &7u32.to_be_bytes());
        assert_eq!(parse_enveloped::<Ping>(&framed).unwrap(), Ping { n: 7 });
    }

    #[test]
    fn bad_envelopes_are_refused_with_reasons() {
        let short = [0u8, 0, 0, 0, 9, b'{', b'}'];
        let err = parse_enveloped::<Ping>(&short).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(err.message.contains("says 9 bytes"), "{}", err.message);

        let huge = [0u8, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            parse_enveloped::<Ping>(&huge).unwrap_err().code,
            Code::ResourceExhausted
        );

        let compressed = [FLAG_COMPRESSED, 0, 0, 0, 2, b'{', b'}'];
        assert_eq!(
            parse_enveloped::<Ping>(&compressed).unwrap_err().code,
            Code::Unimplemented
        );

        let mut two = message(&serde_json::json!({})).to_vec();
        two.extend_from_slice(&message(&serde_json::json!({})));
        assert_eq!(
            parse_enveloped::<Ping>(&two).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            parse_enveloped::<Ping>(b"").unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn end_of_stream_carries_the_error() {
        let end = end_of_stream(Some(&RpcError::new(Code::NotFound, "no such file")));
        assert_eq!(end[0], FLAG_END_STREAM);
        let body: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(body["error"]["code"], "not_found");
        assert_eq!(body["error"]["message"], "no such file");
        assert_eq!(&end_of_stream(None)[5..], b"{}");
    }

    #[test]
    fn unary_bodies() {
        assert_eq!(parse_unary::<Ping>(b"").unwrap(), Ping { n: 0 });
        assert_eq!(parse_unary::<Ping>(b"{\"n\":3}").unwrap(), Ping { n: 3 });
        assert_eq!(
            parse_unary::<Ping>(b"[").unwrap_err().code,
            Code::InvalidArgument
        );
    }
}
