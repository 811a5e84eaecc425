//! Errors on the wire: the one table of error codes, with the HTTP status each is sent with and
//! the [`ErrorKind`] it stands for. The server answers with it and the client reads answers with
//! it, so the two cannot drift apart.

use crate::error::ErrorKind;

/// One error code of the wire: an error body `{"code", "id", "message"}` sent with `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode {
    /// The body's `code`. ForeverVM SDKs see these: never change one.
    pub code: &'static str,
    /// The HTTP status it is sent with.
    pub status: u16,
    /// The kind it stands for.
    pub kind: ErrorKind,
    /// For a `NotFound` code that names what is missing: the engine's resource (`machine`,
    /// `instruction`).
    pub resource: Option<&'static str>,
}

impl ErrorCode {
    const fn new(code: &'static str, status: u16, kind: ErrorKind) -> Self {
        Self {
            code,
            status,
            kind,
            resource: None,
        }
    }

    const fn naming(self, resource: &'static str) -> Self {
        Self {
            resource: Some(resource),
            ..self
        }
    }

    pub const NOT_FOUND: Self = Self::new("NotFound", 404, ErrorKind::NotFound);
    pub const MACHINE_NOT_FOUND: Self =
        Self::new("MachineNotFound", 404, ErrorKind::NotFound).naming("machine");
    pub const INSTRUCTION_NOT_FOUND: Self =
        Self::new("InstructionNotFound", 404, ErrorKind::NotFound).naming("instruction");
    pub const BAD_REQUEST: Self = Self::new("BadRequest", 400, ErrorKind::InvalidInput);
    pub const FILE_NOT_FOUND: Self =
        Self::new("FileNotFound", 404, ErrorKind::NotFound).naming("file");
    /// A body, an instruction or a file larger than the limit.
    pub const PAYLOAD_TOO_LARGE: Self = Self::new("PayloadTooLarge", 413, ErrorKind::TooLarge);
    pub const PERMISSION_DENIED: Self =
        Self::new("PermissionDenied", 403, ErrorKind::PermissionDenied);
    /// A route that exists, asked with a method it does not take.
    pub const METHOD_NOT_ALLOWED: Self =
        Self::new("MethodNotAllowed", 405, ErrorKind::InvalidInput);
    pub const UNAUTHORIZED: Self = Self::new("Unauthorized", 401, ErrorKind::Unauthorized);
    pub const UNSUPPORTED: Self = Self::new("Unsupported", 501, ErrorKind::Unsupported);
    pub const MACHINE_CRASHED: Self = Self::new("MachineCrashed", 503, ErrorKind::MachineCrashed);
    pub const CONFLICT: Self = Self::new("Conflict", 409, ErrorKind::Conflict);
    pub const LIMIT_EXCEEDED: Self = Self::new("LimitExceeded", 429, ErrorKind::LimitExceeded);
    pub const INTERNAL_ERROR: Self = Self::new("InternalError", 500, ErrorKind::Internal);

    /// The code an error of `kind` is sent with: for a missing resource that has a code of its
    /// own (`MachineNotFound`), that one; otherwise the kind's first code in [`ERROR_CODES`].
    /// `Transport` never comes from a server's engine and is sent as `InternalError`.
    pub fn for_error(kind: ErrorKind, resource: Option<&str>) -> &'static ErrorCode {
        ERROR_CODES
            .iter()
            .find(|c| c.kind == kind && resource.is_some() && c.resource == resource)
            .or_else(|| {
                ERROR_CODES
                    .iter()
                    .find(|c| c.kind == kind && c.resource.is_none())
            })
            .unwrap_or(&ErrorCode::INTERNAL_ERROR)
    }

    /// The kind a server's error answer stands for: by its code where the table has it, else by
    /// the HTTP status (the answer of a proxy, or of a server that does not send a code). A bare
    /// 5xx other than 501 says nothing about the machine and is `Internal`.
    pub fn kind_of(code: Option<&str>, status: u16) -> ErrorKind {
        if let Some(known) = code.and_then(|code| ERROR_CODES.iter().find(|c| c.code == code)) {
            return known.kind;
        }
        match status {
            403 => ErrorKind::Unauthorized,
            422 => ErrorKind::InvalidInput,
            500..=599 if status != 501 => ErrorKind::Internal,
            _ => ERROR_CODES
                .iter()
                .find(|c| c.status == status)
                .map_or(ErrorKind::Internal, |c| c.kind),
        }
    }
}

/// Every error code evervm sends. A kind's first code without a resource is the one its errors
/// are sent with.
pub const ERROR_CODES: &[ErrorCode] = &[
    ErrorCode::NOT_FOUND,
    ErrorCode::MACHINE_NOT_FOUND,
    ErrorCode::INSTRUCTION_NOT_FOUND,
    ErrorCode::FILE_NOT_FOUND,
    ErrorCode::BAD_REQUEST,
    ErrorCode::PAYLOAD_TOO_LARGE,
    ErrorCode::PERMISSION_DENIED,
    ErrorCode::METHOD_NOT_ALLOWED,
    ErrorCode::UNAUTHORIZED,
    ErrorCode::UNSUPPORTED,
    ErrorCode::MACHINE_CRASHED,
    ErrorCode::CONFLICT,
    ErrorCode::LIMIT_EXCEEDED,
    ErrorCode::INTERNAL_ERROR,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_but_transport_has_a_code_and_comes_back_as_itself() {
        for kind in ErrorKind::ALL.iter().copied() {
            let code = ErrorCode::for_error(kind, None);
            if kind == ErrorKind::Transport {
                assert_eq!(code, &ErrorCode::INTERNAL_ERROR);
                continue;
            }
            assert_eq!(code.kind, kind, "{kind}");
            assert_eq!(ErrorCode::kind_of(Some(code.code), code.status), kind);
            assert_eq!(ErrorCode::kind_of(Some(code.code), 500), kind);
        }
        for code in ERROR_CODES {
            assert_eq!(ErrorCode::kind_of(Some(code.code), code.status), code.kind);
            assert!((400..600).contains(&code.status), "{code:?}");
        }
        let mut codes: Vec<&str> = ERROR_CODES.iter().map(|c| c.code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ERROR_CODES.len(), "a code is listed twice");
    }

    #[test]
    fn the_codes_forevervm_clients_see_stay_as_they_are() {
        let sent = |kind, resource| {
            let code = ErrorCode::for_error(kind, resource);
            (code.status, code.code)
        };
        assert_eq!(
            sent(ErrorKind::NotFound, Some("machine")),
            (404, "MachineNotFound")
        );
        assert_eq!(
            sent(ErrorKind::NotFound, Some("instruction")),
            (404, "InstructionNotFound")
        );
        assert_eq!(
            sent(ErrorKind::NotFound, Some("checkpoint")),
            (404, "NotFound")
        );
        assert_eq!(sent(ErrorKind::NotFound, None), (404, "NotFound"));
        assert_eq!(sent(ErrorKind::InvalidInput, None), (400, "BadRequest"));
        assert_eq!(sent(ErrorKind::Unauthorized, None), (401, "Unauthorized"));
        assert_eq!(sent(ErrorKind::Unsupported, None), (501, "Unsupported"));
        assert_eq!(sent(ErrorKind::Conflict, None), (409, "Conflict"));
        assert_eq!(
            sent(ErrorKind::MachineCrashed, None),
            (503, "MachineCrashed")
        );
        assert_eq!(sent(ErrorKind::LimitExceeded, None), (429, "LimitExceeded"));
        assert_eq!(sent(ErrorKind::Internal, None), (500, "InternalError"));
    }

    #[test]
    fn answers_without_a_known_code_go_by_status() {
        let kind = |status| ErrorCode::kind_of(None, status);
        assert_eq!(kind(404), ErrorKind::NotFound);
        assert_eq!(kind(400), ErrorKind::InvalidInput);
        assert_eq!(kind(413), ErrorKind::TooLarge);
        assert_eq!(kind(422), ErrorKind::InvalidInput);
        assert_eq!(kind(401), ErrorKind::Unauthorized);
        assert_eq!(kind(403), ErrorKind::Unauthorized);
        assert_eq!(kind(409), ErrorKind::Conflict);
        assert_eq!(kind(429), ErrorKind::LimitExceeded);
        assert_eq!(kind(501), ErrorKind::Unsupported);
        for status in [500, 502, 503, 504, 418] {
            assert_eq!(kind(status), ErrorKind::Internal, "{status}");
        }
        assert_eq!(
            ErrorCode::kind_of(Some("SomethingNew"), 404),
            ErrorKind::NotFound
        );
    }
}
