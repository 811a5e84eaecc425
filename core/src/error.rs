//! The one error type of `evervm`, with a stable [`ErrorKind`] that each binding maps once.

use std::fmt;

/// What went wrong, independent of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// No such machine or instruction (or not visible to this account).
    NotFound,
    /// The request was wrong: bad tags, code too large, bad memory size, malformed input.
    InvalidInput,
    /// The token is missing, malformed or unknown.
    Unauthorized,
    /// Not available on this backend, server or build.
    Unsupported,
    /// The machine's sandbox died or could not start.
    MachineCrashed,
    /// The resource is in use (another engine holds the home).
    Conflict,
    /// The server could not be reached, or answered something that is not the protocol.
    Transport,
    /// Something broke inside the engine or the server.
    Internal,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "NotFound",
            ErrorKind::InvalidInput => "InvalidInput",
            ErrorKind::Unauthorized => "Unauthorized",
            ErrorKind::Unsupported => "Unsupported",
            ErrorKind::MachineCrashed => "MachineCrashed",
            ErrorKind::Conflict => "Conflict",
            ErrorKind::Transport => "Transport",
            ErrorKind::Internal => "Internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from the client, the server or the engine.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn transport(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transport, message)
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }
}

impl From<evervm_engine::Error> for Error {
    fn from(e: evervm_engine::Error) -> Self {
        use evervm_engine::ErrorKind as E;
        let kind = match e.kind() {
            E::NotFound => ErrorKind::NotFound,
            E::InvalidInput => ErrorKind::InvalidInput,
            E::Unauthorized => ErrorKind::Unauthorized,
            E::Unsupported => ErrorKind::Unsupported,
            E::MachineCrashed => ErrorKind::MachineCrashed,
            E::Conflict => ErrorKind::Conflict,
            E::Internal => ErrorKind::Internal,
        };
        Self::new(kind, e.message())
    }
}

impl From<reqwest::Error> for Error {
    fn from(e: reqwest::Error) -> Self {
        Self::transport(format!("HTTP request failed: {e}"))
    }
}

impl From<tokio_tungstenite::tungstenite::Error> for Error {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Self::transport(format!("WebSocket failed: {e}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
