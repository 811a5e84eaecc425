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
        Self::transport(format!("HTTP request failed: {}", with_causes(&e)))
    }
}

/// `e` and each error under it (where the reason is: a refused certificate, a refused
/// connection), with what to do about a certificate the client does not trust.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(inner) = cause {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = inner.source();
    }
    if text.contains("certificate") {
        text.push_str(
            " (for a server with a CA of its own, give the client its CA file: EVERVM_CA_FILE, \
             ca_file, --ca-file)",
        );
    }
    text
}

impl From<tokio_tungstenite::tungstenite::Error> for Error {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Self::transport(format!("WebSocket failed: {}", with_causes(&e)))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
