//! One Python exception class per error kind, all under `evervm.EvervmError`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    evervm,
    EvervmError,
    PyException,
    "Base class of every evervm error."
);
create_exception!(
    evervm,
    NotFoundError,
    EvervmError,
    "No such machine, instruction or checkpoint."
);
create_exception!(
    evervm,
    InvalidInputError,
    EvervmError,
    "The request was wrong (bad tags, code too large, bad name)."
);
create_exception!(
    evervm,
    UnauthorizedError,
    EvervmError,
    "The token is missing, malformed or unknown."
);
create_exception!(
    evervm,
    UnsupportedError,
    EvervmError,
    "The backend cannot do this (the process backend cannot snapshot)."
);
create_exception!(
    evervm,
    MachineCrashedError,
    EvervmError,
    "The machine's sandbox died or its snapshot cannot be used."
);
create_exception!(
    evervm,
    ConflictError,
    EvervmError,
    "The request conflicts with the current state (a name in use, an engine shut down)."
);
create_exception!(
    evervm,
    LimitExceededError,
    EvervmError,
    "A limit or quota was reached (machines, instruction rate, queue, memory, disk)."
);
create_exception!(
    evervm,
    TransportError,
    EvervmError,
    "The server could not be reached or answered something unexpected."
);
create_exception!(
    evervm,
    InternalError,
    EvervmError,
    "Something went wrong inside evervm."
);

/// The Python exception for an evervm error: its class names the kind, its message is the
/// error's, and `kind` carries the kind's name.
pub(crate) fn to_py(error: evervm::Error) -> PyErr {
    use evervm::ErrorKind as K;
    let message = error.message().to_owned();
    let err = match error.kind() {
        K::NotFound => NotFoundError::new_err(message),
        K::InvalidInput => InvalidInputError::new_err(message),
        K::Unauthorized => UnauthorizedError::new_err(message),
        K::Unsupported => UnsupportedError::new_err(message),
        K::MachineCrashed => MachineCrashedError::new_err(message),
        K::Conflict => ConflictError::new_err(message),
        K::LimitExceeded => LimitExceededError::new_err(message),
        K::Transport => TransportError::new_err(message),
        K::Internal => InternalError::new_err(message),
    };
    Python::attach(|py| {
        let _ = err.value(py).setattr("kind", error.kind().as_str());
    });
    err
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("EvervmError", py.get_type::<EvervmError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("UnauthorizedError", py.get_type::<UnauthorizedError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("MachineCrashedError", py.get_type::<MachineCrashedError>())?;
    m.add("ConflictError", py.get_type::<ConflictError>())?;
    m.add("LimitExceededError", py.get_type::<LimitExceededError>())?;
    m.add("TransportError", py.get_type::<TransportError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}
