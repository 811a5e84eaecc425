//! One Python exception class per error kind, all under `evervm.EvervmError`.
//!
//! `InvalidInputError` is also a `ValueError`: a wrong argument is a `ValueError` in Python, and
//! code that caught `ValueError` for a bad timeout or a missing URL keeps working.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

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
    "A quota or limit was hit (too many machines, a rate limit, an output cap, a full queue); the \
     message names the limit."
);
create_exception!(
    evervm,
    TooLargeError,
    EvervmError,
    "Something sent is larger than its limit (an instruction's code, a file); the message names \
     the limit."
);
create_exception!(
    evervm,
    PermissionDeniedError,
    EvervmError,
    "The caller may not touch this (a path outside the directories a machine's files may be used \
     in)."
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

/// `InvalidInputError(EvervmError, ValueError)`, made once (pyo3's `create_exception!` takes one
/// base class).
static INVALID_INPUT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn invalid_input_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    INVALID_INPUT_ERROR
        .get_or_try_init(py, || {
            let bases = PyTuple::new(
                py,
                [py.get_type::<EvervmError>(), py.get_type::<PyValueError>()],
            )?;
            let namespace = PyDict::new(py);
            namespace.set_item("__module__", "evervm")?;
            namespace.set_item(
                "__doc__",
                "The request was wrong (bad tags, code too large, bad name, bad timeout); also a \
                 ValueError.",
            )?;
            let class = py
                .get_type::<PyType>()
                .call1(("InvalidInputError", bases, namespace))?
                .cast_into::<PyType>()?;
            Ok(class.unbind())
        })
        .map(|class| class.bind(py))
}

/// An `InvalidInputError` for a wrong argument found before anything is called.
pub(crate) fn invalid_input(message: impl Into<String>) -> PyErr {
    to_py(evervm::Error::new(
        evervm::ErrorKind::InvalidInput,
        message.into(),
    ))
}

/// The Python exception for an evervm error: its class names the kind, its message is the
/// error's, and `kind` carries the kind's name. (While the interpreter exits, a plain
/// `RuntimeError` with the message, made without entering Python.)
pub(crate) fn to_py(error: evervm::Error) -> PyErr {
    use evervm::ErrorKind as K;
    let message = error.message().to_owned();
    let fallback = message.clone();
    crate::runtime::with_python(|py| {
        let err = match error.kind() {
            K::NotFound => NotFoundError::new_err(message),
            K::InvalidInput => match invalid_input_error(py) {
                Ok(class) => PyErr::from_type(class.clone(), message),
                Err(e) => e,
            },
            K::Unauthorized => UnauthorizedError::new_err(message),
            K::Unsupported => UnsupportedError::new_err(message),
            K::MachineCrashed => MachineCrashedError::new_err(message),
            K::Conflict => ConflictError::new_err(message),
            K::LimitExceeded => LimitExceededError::new_err(message),
            K::TooLarge => TooLargeError::new_err(message),
            K::PermissionDenied => PermissionDeniedError::new_err(message),
            K::Transport => TransportError::new_err(message),
            K::Internal => InternalError::new_err(message),
        };
        let _ = err.value(py).setattr("kind", error.kind().as_str());
        Ok(err)
    })
    .unwrap_or_else(|_| pyo3::exceptions::PyRuntimeError::new_err(fallback))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("EvervmError", py.get_type::<EvervmError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("InvalidInputError", invalid_input_error(py)?)?;
    m.add("UnauthorizedError", py.get_type::<UnauthorizedError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("MachineCrashedError", py.get_type::<MachineCrashedError>())?;
    m.add("ConflictError", py.get_type::<ConflictError>())?;
    m.add("LimitExceededError", py.get_type::<LimitExceededError>())?;
    m.add("TooLargeError", py.get_type::<TooLargeError>())?;
    m.add(
        "PermissionDeniedError",
        py.get_type::<PermissionDeniedError>(),
    )?;
    m.add("TransportError", py.get_type::<TransportError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}
