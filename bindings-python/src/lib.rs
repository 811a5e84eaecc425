//! `evervm._native`: the Python face of `evervm::Client`. Wrappers only: every method converts
//! its arguments, calls the Rust client, and converts the answer (see `../shared/docs/style.md`).

mod client;
mod error;
mod files;
mod history;
mod runtime;
mod types;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::Client>()?;
    m.add_class::<client::Machine>()?;
    m.add_class::<client::AsyncClient>()?;
    m.add_class::<client::AsyncMachine>()?;
    m.add_class::<client::ExecStream>()?;
    m.add_class::<client::AsyncExecStream>()?;
    m.add_class::<types::ExecResult>()?;
    m.add_class::<types::ExceptionInfo>()?;
    m.add_class::<types::OutputChunk>()?;
    m.add_class::<types::RichResult>()?;
    m.add_class::<types::MachineInfo>()?;
    m.add_class::<types::MachinePage>()?;
    m.add_class::<types::Checkpoint>()?;
    m.add_class::<types::Context>()?;
    m.add_class::<history::Rewound>()?;
    m.add_class::<history::MachineHistory>()?;
    m.add_class::<history::HistoryEntry>()?;
    m.add_class::<history::Lineage>()?;
    m.add_class::<history::LineageNode>()?;
    m.add_class::<history::LineageCheckpoint>()?;
    m.add_class::<history::TakenBack>()?;
    m.add_class::<types::InstallReport>()?;
    m.add_class::<types::InstalledPackage>()?;
    m.add_class::<types::SatisfiedPackage>()?;
    m.add_class::<files::Files>()?;
    m.add_class::<files::AsyncFiles>()?;
    m.add_class::<files::FileInfo>()?;
    m.add_class::<files::FileList>()?;
    error::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Seconds: what `timeout=None` means, and the longest timeout accepted.
    m.add("DEFAULT_TIMEOUT", evervm::DEFAULT_TIMEOUT.as_secs_f64())?;
    m.add("MAX_TIMEOUT", evervm::MAX_TIMEOUT.as_secs_f64())?;
    // The id of a machine's own interpreter among its code contexts.
    m.add("DEFAULT_CONTEXT", evervm::DEFAULT_CONTEXT)?;
    m.add("TOOL_NAME", evervm::tool::NAME)?;
    m.add("TOOL_DESCRIPTION", evervm::tool::DESCRIPTION)?;
    m.add("TOOL_CODE_DESCRIPTION", evervm::tool::CODE_DESCRIPTION)?;
    // Registered, not exported: at exit the runtime's threads stop entering Python.
    let close_gate = wrap_pyfunction!(runtime::close_gate, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (close_gate,))?;
    Ok(())
}
