//! One error type for the whole engine, with a stable [`ErrorKind`] that every surface maps once
//! (HTTP status and code, Python exception class, JS `code`).

use std::fmt;

/// What went wrong, independent of the message. Stable across versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The named machine, instruction or account does not exist (or is not visible to the caller).
    NotFound,
    /// The request itself was wrong: bad tag syntax, code too large, bad memory size.
    InvalidInput,
    /// The token is missing, malformed or unknown.
    Unauthorized,
    /// The operation is not available on this backend or in this build.
    Unsupported,
    /// The machine's sandbox died or misbehaved (crash, out of memory, broken channel).
    MachineCrashed,
    /// Another engine already holds this home, or a resource is busy.
    Conflict,
    /// A limit or quota was reached (machines per account, instruction rate, queue length,
    /// resident memory, disk); the message names the limit.
    LimitExceeded,
    /// Something broke inside the engine (I/O, database). The message says what.
    Internal,
}

impl ErrorKind {
    /// A short, stable identifier (`NotFound`, `InvalidInput`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "NotFound",
            ErrorKind::InvalidInput => "InvalidInput",
            ErrorKind::Unauthorized => "Unauthorized",
            ErrorKind::Unsupported => "Unsupported",
            ErrorKind::MachineCrashed => "MachineCrashed",
            ErrorKind::Conflict => "Conflict",
            ErrorKind::LimitExceeded => "LimitExceeded",
            ErrorKind::Internal => "Internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An engine error: a kind, a message for people, and for `NotFound` what was not found.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// For `NotFound`: which resource (`machine`, `instruction`, `account`).
    resource: Option<&'static str>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            resource: None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// For `NotFound` errors: the kind of resource that was missing.
    pub fn resource(&self) -> Option<&'static str> {
        self.resource
    }

    pub fn machine_not_found(name: &str) -> Self {
        Self {
            kind: ErrorKind::NotFound,
            message: format!("no machine named {name:?}"),
            resource: Some("machine"),
        }
    }

    pub fn instruction_not_found(machine: &str, seq: i64) -> Self {
        Self {
            kind: ErrorKind::NotFound,
            message: format!("machine {machine:?} has no instruction {seq}"),
            resource: Some("instruction"),
        }
    }

    pub fn checkpoint_not_found(machine: &str, checkpoint: &str) -> Self {
        Self {
            kind: ErrorKind::NotFound,
            message: format!("machine {machine:?} has no checkpoint {checkpoint:?}"),
            resource: Some("checkpoint"),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// A limit or quota was reached; the message names it and says what to do.
    pub fn limit(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::LimitExceeded, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthorized, message)
    }

    pub fn crashed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::MachineCrashed, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// Prefixes the message with context, keeping the kind.
    #[must_use]
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::internal(format!("database error: {e}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::internal(format!("I/O error: {e}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
