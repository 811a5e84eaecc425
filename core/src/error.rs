//! The one error type of `evervm`, with a stable [`ErrorKind`] that each binding maps once.

/// What went wrong, independent of the message: the engine's one list of kinds (with
/// `Transport` for clients). The wire's codes and statuses for each are in
/// [`crate::protocol::ErrorCode`].
pub use evervm_engine::ErrorKind;

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
        Self::new(e.kind(), e.message())
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
