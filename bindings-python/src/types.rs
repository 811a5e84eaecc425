//! What calls return, as Python objects: plain, immutable, with the Rust client's field names.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// JSON from Rust as Python objects (`dict`, `list`, `str`, ...).
pub(crate) fn json_to_py(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| {
        crate::error::to_py(evervm::Error::new(
            evervm::ErrorKind::Internal,
            format!("cannot pass rich output to Python: {e}"),
        ))
    })?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// One line of output (without its newline).
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct OutputChunk {
    /// Its number within the instruction, from 0, across both streams.
    pub seq: i64,
    /// `"stdout"` or `"stderr"`.
    pub stream: String,
    pub data: String,
}

#[pymethods]
impl OutputChunk {
    fn __repr__(&self) -> String {
        format!(
            "OutputChunk(seq={}, stream={:?}, data={:?})",
            self.seq, self.stream, self.data
        )
    }
}

impl From<evervm::OutputChunk> for OutputChunk {
    fn from(c: evervm::OutputChunk) -> Self {
        Self {
            seq: c.seq,
            stream: c.stream.as_str().to_owned(),
            data: c.data,
        }
    }
}

/// The exception an instruction raised, as data taken from the exception object.
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct ExceptionInfo {
    /// The class's `__name__`: `"ZeroDivisionError"`.
    pub name: String,
    /// The class's `__qualname__`: `"run.<locals>.FinalAnswer"` for a class defined in a
    /// function.
    pub qualname: String,
    /// The class's `__module__`: `"builtins"`, `"json.decoder"`, `"__main__"`.
    pub module: String,
    /// `str(exc)`.
    pub value: String,
}

#[pymethods]
impl ExceptionInfo {
    fn __repr__(&self) -> String {
        format!(
            "ExceptionInfo(name={:?}, module={:?}, value={:?})",
            self.name, self.module, self.value
        )
    }
}

impl From<evervm::ExceptionInfo> for ExceptionInfo {
    fn from(e: evervm::ExceptionInfo) -> Self {
        Self {
            name: e.name,
            qualname: e.qualname,
            module: e.module,
            value: e.value,
        }
    }
}

/// A rich result (Jupyter's display protocol): a MIME bundle. In a notebook it shows itself.
#[pyclass(module = "evervm", frozen)]
#[derive(Clone)]
pub(crate) struct RichResult {
    inner: evervm::RichResult,
}

#[pymethods]
impl RichResult {
    /// `"display"` (shown by `display(obj)`), `"figure"` (a matplotlib figure) or `"value"`
    /// (the last expression's value).
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind.as_str()
    }

    /// MIME type to representation: text, base64 for images such as `image/png`, JSON values
    /// for JSON types. `text/plain` is always there.
    #[getter]
    fn data(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        json_to_py(py, &serde_json::Value::Object(self.inner.data.clone()))
    }

    /// `text/plain`.
    #[getter]
    fn text(&self) -> Option<&str> {
        self.inner.text()
    }

    /// `text/html` (a pandas DataFrame's table, say).
    #[getter]
    fn html(&self) -> Option<&str> {
        self.inner.html()
    }

    /// `image/png`, decoded.
    #[getter]
    fn png<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner.png().map(|png| PyBytes::new(py, &png))
    }

    /// The representation of one MIME type, or `None`.
    fn get(&self, py: Python<'_>, mime: &str) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .data
            .get(mime)
            .map(|value| json_to_py(py, value))
            .transpose()
    }

    /// Jupyter's hook: the bundle as it came, so a notebook shows the result itself.
    #[pyo3(signature = (include=None, exclude=None))]
    fn _repr_mimebundle_(
        &self,
        py: Python<'_>,
        include: Option<Bound<'_, PyAny>>,
        exclude: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (include, exclude);
        self.data(py)
    }

    fn __repr__(&self) -> String {
        let types: Vec<&str> = self.inner.data.keys().map(String::as_str).collect();
        format!(
            "RichResult(kind={:?}, types={types:?})",
            self.inner.kind.as_str()
        )
    }
}

impl From<evervm::RichResult> for RichResult {
    fn from(inner: evervm::RichResult) -> Self {
        Self { inner }
    }
}

/// How an instruction ended, with everything it printed.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct ExecResult {
    run: evervm::Execution,
    /// Rich output as Python objects, converted once.
    data: Option<Py<PyAny>>,
}

#[pymethods]
impl ExecResult {
    /// The instruction's number on its machine, from 0.
    #[getter]
    fn seq(&self) -> i64 {
        self.run.seq
    }

    /// The `repr` of the last expression (`None` for statements, `None` values and errors).
    #[getter]
    fn value(&self) -> Option<&str> {
        self.run.result.value.as_deref()
    }

    /// The traceback or reason when the instruction failed.
    #[getter]
    fn error(&self) -> Option<&str> {
        self.run.result.error.as_deref()
    }

    /// Why it failed: `"exception"`, `"timeout"`, `"interrupted"`, `"machine_crashed"`,
    /// `"limit_exceeded"` or `"machine_deleted"`.
    #[getter]
    fn cause(&self) -> Option<&'static str> {
        self.run.result.cause.map(evervm::FailureCause::as_str)
    }

    /// The exception the code raised, as data (`None` when it raised none, and from servers
    /// that don't say); `error` holds its traceback.
    #[getter]
    fn exception(&self) -> Option<ExceptionInfo> {
        self.run.result.exception.clone().map(Into::into)
    }

    /// ForeverVM's rich output: `{"png": "<base64>"}` for the last matplotlib figure.
    #[getter]
    fn data(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.data.as_ref().map(|d| d.clone_ref(py))
    }

    /// The rich results, in order: those shown during the instruction (`display(obj)`,
    /// `plt.show()`), the last expression's value when it has more than text (a DataFrame's
    /// HTML), then every figure left open.
    #[getter]
    fn results(&self) -> Vec<RichResult> {
        self.run
            .result
            .results
            .iter()
            .cloned()
            .map(RichResult::from)
            .collect()
    }

    #[getter]
    fn output(&self) -> Vec<OutputChunk> {
        self.run.output.iter().cloned().map(Into::into).collect()
    }

    /// The text a language model is given for this instruction: what it printed, then its
    /// error or value, then what it displayed (the same text in every evervm tool helper).
    fn model_text(&self) -> String {
        self.run.model_text()
    }

    #[getter]
    fn runtime_ms(&self) -> u64 {
        self.run.result.runtime_ms
    }

    /// True when the instruction printed more than the server keeps per instruction: the rest
    /// of its output was dropped (the output ends with a line saying so).
    #[getter]
    fn output_truncated(&self) -> bool {
        self.run.result.output_truncated
    }

    /// For machines with `durability="instruction"`: whether the state after the instruction
    /// is on disk; `None` for other machines.
    #[getter]
    fn saved(&self) -> Option<bool> {
        self.run.result.saved
    }

    /// Everything printed to stdout, one line per chunk.
    #[getter]
    fn stdout(&self) -> String {
        self.run.stdout()
    }

    /// Everything printed to stderr.
    #[getter]
    fn stderr(&self) -> String {
        self.run.stderr()
    }

    /// True when the instruction ran past its timeout.
    #[getter]
    fn timed_out(&self) -> bool {
        self.run.result.cause == Some(evervm::FailureCause::Timeout)
    }

    /// True when the instruction ended without an error.
    #[getter]
    fn ok(&self) -> bool {
        !self.run.result.is_error()
    }

    fn __repr__(&self) -> String {
        let seq = self.run.seq;
        match (&self.run.result.error, &self.run.result.value) {
            (Some(error), _) => format!("ExecResult(seq={seq}, error={error:?})"),
            (None, Some(value)) => format!("ExecResult(seq={seq}, value={value:?})"),
            (None, None) => format!("ExecResult(seq={seq}, value=None)"),
        }
    }
}

impl ExecResult {
    pub(crate) fn new(py: Python<'_>, run: evervm::Execution) -> PyResult<Self> {
        let data = run
            .result
            .data
            .as_ref()
            .map(|d| json_to_py(py, d))
            .transpose()?;
        Ok(Self { run, data })
    }
}

/// What is known about a machine.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct MachineInfo {
    pub name: String,
    /// ISO 8601, UTC.
    pub created_at: String,
    pub tags: Py<PyDict>,
    /// True while its sandbox is in memory.
    pub running: bool,
    pub has_pending_instruction: bool,
    pub memory_mb: Option<u32>,
    pub image: Option<String>,
    pub backend: Option<String>,
    /// `"resident"`, `"swapped"`, `"damaged"` or `"stopped"`.
    pub state: Option<String>,
    pub instruction_count: Option<i64>,
    pub last_used_at: Option<String>,
    pub last_error: Option<String>,
    pub disk_bytes: Option<u64>,
    pub resident_bytes: Option<u64>,
    pub durability: Option<String>,
    /// How many undo points it keeps (`0`: none; see `Machine.undo`).
    pub history: Option<u32>,
    /// The machine it was forked from; `None` when it was created.
    pub parent: Option<String>,
    /// The seq of the parent's last instruction the fork holds (`-1`: none).
    pub forked_at: Option<i64>,
    /// Its environment variables that are not secret.
    pub env: Py<PyDict>,
    /// The names of its secret environment variables (never their values).
    pub secret_env: Vec<String>,
    /// When it is deleted (ISO 8601, UTC); `None`: never.
    pub expires_at: Option<String>,
    /// How its current (or last) interpreter began: `"booted"`, `"restored"` or
    /// `"restarted_after_crash"`; `None` before its first start under this engine or server.
    pub interpreter: Option<String>,
    /// When that interpreter began (ISO 8601, UTC).
    pub interpreter_started_at: Option<String>,
    /// When the snapshot it came from was written; `None` when it began fresh.
    pub interpreter_snapshot_at: Option<String>,
    /// What it may reach: `"none"`, `"public"` or `"allow"` (see `network_allow`); `None` from
    /// servers that do not say.
    pub network: Option<String>,
    /// The names and blocks it may reach when `network` is `"allow"`.
    pub network_allow: Vec<String>,
}

/// One page of a machine list, newest first.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct MachinePage {
    pub machines: Vec<Py<MachineInfo>>,
    /// Pass it as `cursor` for the next page; `None` after the last page.
    pub next_cursor: Option<String>,
}

#[pymethods]
impl MachinePage {
    fn __repr__(&self) -> String {
        format!(
            "MachinePage(machines={}, next_cursor={:?})",
            self.machines.len(),
            self.next_cursor
        )
    }
}

#[pymethods]
impl MachineInfo {
    fn __repr__(&self) -> String {
        format!(
            "MachineInfo(name={:?}, state={:?}, running={})",
            self.name, self.state, self.running
        )
    }
}

impl MachineInfo {
    pub(crate) fn new(py: Python<'_>, m: evervm::MachineInfo) -> PyResult<Self> {
        let (network, network_allow) = evervm::NetworkPolicy::mode_and_rules(m.network.as_ref());
        let tags = PyDict::new(py);
        for (k, v) in &m.tags {
            tags.set_item(k, v)?;
        }
        let env = PyDict::new(py);
        for (k, v) in &m.env {
            env.set_item(k, v)?;
        }
        Ok(Self {
            name: m.name,
            created_at: m.created_at.to_rfc3339(),
            tags: tags.unbind(),
            running: m.running,
            has_pending_instruction: m.has_pending_instruction,
            memory_mb: m.memory_mb,
            image: m.image,
            backend: m.backend,
            state: m.state,
            instruction_count: m.instruction_count,
            last_used_at: m.last_used_at.map(|t| t.to_rfc3339()),
            last_error: m.last_error,
            disk_bytes: m.disk_bytes,
            resident_bytes: m.resident_bytes,
            durability: m.durability,
            history: m.history,
            parent: m.parent,
            forked_at: m.forked_at,
            env: env.unbind(),
            secret_env: m.secret_env,
            expires_at: m.expires_at.map(|t| t.to_rfc3339()),
            interpreter: m.interpreter.as_ref().map(|i| i.began.clone()),
            interpreter_started_at: m.interpreter.as_ref().map(|i| i.started_at.to_rfc3339()),
            interpreter_snapshot_at: m
                .interpreter
                .as_ref()
                .and_then(|i| i.snapshot_at)
                .map(|t| t.to_rfc3339()),
            network,
            network_allow,
        })
    }
}

/// A package `Machine.install` put into the machine.
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct InstalledPackage {
    pub name: String,
    pub version: String,
    /// The wheel's file name.
    pub wheel: String,
    /// The wheel's sha256, as checked.
    pub sha256: String,
    /// The wheel's size in bytes.
    pub bytes: u64,
}

#[pymethods]
impl InstalledPackage {
    fn __repr__(&self) -> String {
        format!(
            "InstalledPackage(name={:?}, version={:?})",
            self.name, self.version
        )
    }
}

/// A requirement the machine already satisfied.
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct SatisfiedPackage {
    pub name: String,
    pub version: String,
}

#[pymethods]
impl SatisfiedPackage {
    fn __repr__(&self) -> String {
        format!(
            "SatisfiedPackage(name={:?}, version={:?})",
            self.name, self.version
        )
    }
}

/// What `Machine.install` did.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct InstallReport {
    /// What was put into the machine, dependencies included.
    pub installed: Vec<InstalledPackage>,
    /// What the machine had already.
    pub satisfied: Vec<SatisfiedPackage>,
}

#[pymethods]
impl InstallReport {
    /// pip-like lines saying what was done.
    fn summary(&self) -> String {
        self.report().summary()
    }

    fn __repr__(&self) -> String {
        let names: Vec<String> = self
            .installed
            .iter()
            .map(|p| format!("{}=={}", p.name, p.version))
            .collect();
        format!(
            "InstallReport(installed=[{}], satisfied={})",
            names.join(", "),
            self.satisfied.len()
        )
    }
}

impl InstallReport {
    fn report(&self) -> evervm::InstallReport {
        evervm::InstallReport {
            installed: self
                .installed
                .iter()
                .map(|p| evervm::InstalledPackage {
                    name: p.name.clone(),
                    version: p.version.clone(),
                    wheel: p.wheel.clone(),
                    sha256: p.sha256.clone(),
                    bytes: p.bytes,
                })
                .collect(),
            satisfied: self
                .satisfied
                .iter()
                .map(|p| evervm::SatisfiedPackage {
                    name: p.name.clone(),
                    version: p.version.clone(),
                })
                .collect(),
        }
    }
}

impl From<evervm::InstallReport> for InstallReport {
    fn from(report: evervm::InstallReport) -> Self {
        Self {
            installed: report
                .installed
                .into_iter()
                .map(|p| InstalledPackage {
                    name: p.name,
                    version: p.version,
                    wheel: p.wheel,
                    sha256: p.sha256,
                    bytes: p.bytes,
                })
                .collect(),
            satisfied: report
                .satisfied
                .into_iter()
                .map(|p| SatisfiedPackage {
                    name: p.name,
                    version: p.version,
                })
                .collect(),
        }
    }
}

/// A named, kept snapshot of a machine.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct Checkpoint {
    pub name: String,
    /// ISO 8601, UTC.
    pub created_at: String,
    /// The machine's instruction count when it was taken.
    pub instruction_count: i64,
    pub disk_bytes: u64,
}

#[pymethods]
impl Checkpoint {
    fn __repr__(&self) -> String {
        format!(
            "Checkpoint(name={:?}, instruction_count={})",
            self.name, self.instruction_count
        )
    }
}

impl From<evervm::CheckpointInfo> for Checkpoint {
    fn from(c: evervm::CheckpointInfo) -> Self {
        Self {
            name: c.name,
            created_at: c.created_at.to_rfc3339(),
            instruction_count: c.instruction_count,
            disk_bytes: c.disk_bytes,
        }
    }
}

/// A code context: another Python interpreter in the machine, with globals and a working
/// directory of its own, sharing the machine's files, packages and environment.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct Context {
    /// `"default"` (the machine's own interpreter), or the id the machine gave it.
    pub id: String,
    /// The working directory it was made with.
    pub cwd: String,
    /// Its interpreter's process id in the machine; `None` while it is not running (it starts
    /// again with its next instruction, its variables gone).
    pub pid: Option<u32>,
}

#[pymethods]
impl Context {
    fn __repr__(&self) -> String {
        let pid = self
            .pid
            .map_or_else(|| "None".to_owned(), |pid| pid.to_string());
        format!("Context(id={:?}, cwd={:?}, pid={pid})", self.id, self.cwd)
    }
}

impl From<evervm::ContextInfo> for Context {
    fn from(c: evervm::ContextInfo) -> Self {
        Self {
            id: c.id,
            cwd: c.cwd,
            pid: c.pid,
        }
    }
}

/// `context=`: a `Context` or its id.
#[derive(FromPyObject)]
pub(crate) enum ContextArg {
    Id(String),
    Context(Py<Context>),
}

impl ContextArg {
    pub(crate) fn id(self) -> String {
        match self {
            ContextArg::Id(id) => id,
            ContextArg::Context(context) => context.get().id.clone(),
        }
    }
}
