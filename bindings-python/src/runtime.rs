//! The one tokio runtime the module owns, and how Python threads wait on it.
//!
//! The runtime is rebuilt in a child after `os.fork()` (its worker threads do not survive a
//! fork); the GIL is released while a call waits, and a waiting call wakes every 100 ms to let
//! Python deliver signals, so Ctrl-C stops the wait (and, for `exec`, interrupts the instruction).
//!
//! The runtime's threads enter Python only through [`with_python`]: once the interpreter exits
//! they stay out, and its exit waits for those inside. (A thread that takes the GIL while the
//! interpreter finalizes is ended by CPython mid-call, unwinding through Rust frames: the process
//! crashed at exit that way when an asyncio future was settled late.)

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

/// The runtime and the process it was built in.
static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// Whether the interpreter is exiting, and how many of the runtime's threads are in Python.
struct Gate {
    closing: bool,
    inside: usize,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    closing: false,
    inside: 0,
});
static GATE_EMPTIED: Condvar = Condvar::new();

/// How long the interpreter's exit waits for the runtime's threads to leave Python.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Runs `f` with the GIL from one of the runtime's threads, unless the interpreter is exiting:
/// then it fails without entering Python.
pub(crate) fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> PyResult<R>) -> PyResult<R> {
    {
        let mut gate = GATE.lock().unwrap_or_else(PoisonError::into_inner);
        if gate.closing {
            return Err(exiting());
        }
        gate.inside += 1;
    }
    let answer = Python::attach(f);
    let mut gate = GATE.lock().unwrap_or_else(PoisonError::into_inner);
    gate.inside -= 1;
    if gate.inside == 0 {
        GATE_EMPTIED.notify_all();
    }
    answer
}

fn exiting() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err("the Python interpreter is exiting")
}

/// Registered with `atexit` (which runs before the interpreter finalizes): closes the gate and
/// waits, without the GIL, for the threads inside Python to leave.
#[pyfunction]
pub(crate) fn close_gate(py: Python<'_>) {
    py.detach(|| {
        let mut gate = GATE.lock().unwrap_or_else(PoisonError::into_inner);
        gate.closing = true;
        let _ = GATE_EMPTIED
            .wait_timeout_while(gate, EXIT_WAIT, |gate| gate.inside > 0)
            .unwrap_or_else(PoisonError::into_inner);
    });
}

/// This process's runtime, built on first use and again after a fork.
pub(crate) fn runtime() -> PyResult<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, runtime)) = slot.as_ref()
        && *owner == pid
    {
        return Ok(Arc::clone(runtime));
    }
    // A runtime inherited through fork() has no worker threads here: it is left alone (never
    // dropped, which would wait for threads that do not exist) and a new one is built.
    if let Some((_, inherited)) = slot.take() {
        std::mem::forget(inherited);
        // The threads counted inside Python were the parent's.
        GATE.lock().unwrap_or_else(PoisonError::into_inner).inside = 0;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("evervm")
        .enable_all()
        .build()
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!(
                "evervm cannot start its runtime: {e}"
            ))
        })?;
    let runtime = Arc::new(runtime);
    *slot = Some((pid, Arc::clone(&runtime)));
    Ok(runtime)
}

/// Runs `future` on the runtime and waits for it without holding the GIL. When Python has a
/// signal to deliver (Ctrl-C), `on_interrupt` runs (for example, interrupting the instruction)
/// and the signal's exception is raised.
pub(crate) fn wait<T: Send + 'static>(
    py: Python<'_>,
    future: impl Future<Output = PyResult<T>> + Send + 'static,
    on_interrupt: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
) -> PyResult<T> {
    let runtime = runtime()?;
    let (done, answer) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let _ = done.send(future.await);
    });
    let mut answer = answer;
    loop {
        let (received, back) = py.detach(move || {
            let received = answer.recv_timeout(Duration::from_millis(100));
            (received, answer)
        });
        answer = back;
        match received {
            Ok(result) => return result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(signal) = py.check_signals() {
                    // Done before the exception is raised, so that what the caller sends next
                    // is not cancelled with it.
                    if let Some(interrupt) = on_interrupt {
                        py.detach(|| {
                            runtime.block_on(async {
                                let _ =
                                    tokio::time::timeout(Duration::from_secs(5), interrupt).await;
                            });
                        });
                    }
                    return Err(signal);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "evervm's runtime stopped before the call finished",
                ));
            }
        }
    }
}

/// Runs `future` on the runtime and returns an asyncio future (of the running loop) that
/// completes with its result.
pub(crate) fn awaitable<'py, T>(
    py: Python<'py>,
    future: impl Future<Output = PyResult<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let asyncio = py.import("asyncio")?;
    let event_loop = asyncio.call_method0("get_running_loop")?;
    let py_future = event_loop.call_method0("create_future")?;
    let (loop_ref, future_ref) = (event_loop.unbind(), py_future.clone().unbind());
    runtime()?.spawn(async move {
        let result = future.await;
        let _ = with_python(|py| {
            let settle = py
                .import("evervm._settle")
                .and_then(|m| m.getattr("settle"));
            let outcome = match result {
                Ok(value) => value.into_py_any(py).map(|v| (v, py.None())),
                Err(error) => Ok((py.None(), error.into_value(py).into_any())),
            };
            let scheduled = settle.and_then(|settle| {
                let (value, error) = outcome?;
                loop_ref.call_method1(
                    py,
                    "call_soon_threadsafe",
                    (settle, future_ref.clone_ref(py), value, error),
                )
            });
            // An error means the loop is closed: nobody waits for this any more.
            drop(scheduled);
            Ok(())
        });
    });
    Ok(py_future)
}
