//! One error type for the whole engine, with a stable [`ErrorKind`] that every surface maps once
//! (HTTP status and code, Python exception class, JS `code`).

use std::fmt;

/// Defines [`ErrorKind`] from one list: the enum, [`ErrorKind::ALL`] and [`ErrorKind::as_str`]
/// (the variant's name), so that no kind can be missing from any of them.
macro_rules! error_kinds {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// What went wrong, independent of the message. Stable across versions, and the one list
        /// of kinds every surface maps (`evervm::ErrorKind` is this type; HTTP statuses and wire
        /// codes in `evervm::protocol`, Python exception classes in the Python package).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorKind {
            $($(#[$doc])* $kind,)*
        }

        impl ErrorKind {
            /// Every kind, in the order declared.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind,)*];

            /// A short, stable identifier: the kind's name (`NotFound`, `InvalidInput`, ...).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => stringify!($kind),)*
                }
            }
        }
    };
}

error_kinds! {
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
    /// A quota or limit was hit (too many machines, a rate limit, an output cap, a full queue);
    /// the message names the limit.
    LimitExceeded,
    /// Something sent is larger than the limit for it (an instruction's code, a file); the
    /// message names the limit.
    TooLarge,
    /// The caller may not touch this (a path outside the directories files may be used in).
    PermissionDenied,
    /// Clients only (the engine never returns it): the server could not be reached, or answered
    /// something that is not the protocol.
    Transport,
    /// Something broke inside the engine (I/O, database). The message says what.
    Internal,
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

    pub fn context_not_found(machine: &str, context: &str) -> Self {
        Self {
            kind: ErrorKind::NotFound,
            message: format!("machine {machine:?} has no context {context:?}"),
            resource: Some("context"),
        }
    }

    /// Nothing listens on `port` in the machine.
    pub fn port_not_open(machine: &str, port: u16, why: &str) -> Self {
        Self {
            kind: ErrorKind::NotFound,
            message: format!("nothing listens on port {port} in machine {machine:?} ({why})"),
            resource: Some("port"),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
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

    /// A quota or limit was hit; `message` names the limit (and what to do about it).
    pub fn limit_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::LimitExceeded, message)
    }

    /// Something sent is larger than its limit; `message` names the limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, message)
    }

    /// A file that does not exist in a machine.
    pub fn file_not_found(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::NotFound,
            message: message.into(),
            resource: Some("file"),
        }
    }

    /// Prefixes the message with context, keeping the kind.
    #[must_use]
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

#[cfg(feature = "runtime")]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_under_its_name() {
        let names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        assert!(names.contains(&"LimitExceeded"));
        assert_eq!(ErrorKind::LimitExceeded.to_string(), "LimitExceeded");
        let limit = Error::limit_exceeded("at most 3 machines per account");
        assert_eq!(limit.kind(), ErrorKind::LimitExceeded);
    }
}
