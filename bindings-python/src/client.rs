//! `Client` and `Machine` (blocking) and `AsyncClient` and `AsyncMachine` (asyncio): the same
//! verbs as `evervm::Client`, each a conversion, one call, and a conversion back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use pyo3::exceptions::{PyStopAsyncIteration, PyStopIteration};
use pyo3::prelude::*;

use crate::error::{invalid_input, to_py};
use crate::history::{Lineage, MachineHistory, Rewound};
use crate::runtime::{awaitable, wait};
use crate::types::{
    Checkpoint, Context, ContextArg, ExecResult, InstallReport, MachineInfo, MachinePage,
    OutputChunk,
};

type Tags = BTreeMap<String, String>;

/// An instruction's options; `timeout` in seconds, [`evervm::DEFAULT_TIMEOUT`] when `None`;
/// `dialect` `"python"`, `"jupyter"` or `"e2b"`; `context` the code context that runs it (`None`:
/// the machine's own interpreter).
fn exec_options(
    timeout: Option<f64>,
    interrupt: bool,
    dialect: &str,
    context: Option<ContextArg>,
) -> PyResult<evervm::ExecOptions> {
    let timeout = match timeout {
        Some(secs) => evervm::timeout_from_secs(secs).map_err(to_py)?,
        None => evervm::DEFAULT_TIMEOUT,
    };
    let dialect = evervm::Dialect::named(dialect).map_err(|e| to_py(e.into()))?;
    Ok(evervm::ExecOptions {
        timeout,
        interrupt,
        dialect,
        context: context.map(ContextArg::id),
    })
}

/// What a client object holds: the Rust client of the process it runs in. After `os.fork()`
/// a server's client is made again in the child (the parent's connections belong to the
/// parent's runtime); an in-process engine stays with the parent, and the child is told so.
pub(crate) struct Connection {
    /// The server's URL, token and whom it trusts; `None` for an in-process engine.
    server: Option<Remote>,
    current: std::sync::Mutex<(u32, evervm::Client)>,
}

/// Where a client of a server connects, and how.
struct Remote {
    url: String,
    token: String,
    trust: evervm::Trust,
}

impl Connection {
    fn new(client: evervm::Client, server: Option<Remote>) -> Arc<Self> {
        Arc::new(Self {
            server,
            current: std::sync::Mutex::new((std::process::id(), client)),
        })
    }

    pub(crate) fn client(&self) -> PyResult<evervm::Client> {
        let pid = std::process::id();
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.0 == pid {
            return Ok(current.1.clone());
        }
        let Some(server) = &self.server else {
            return Err(crate::error::ConflictError::new_err(
                "this client runs its engine in the parent process (Client.local); in a forked \
                 child open a client of its own: Client(url, token) for a server, or \
                 Client.local() on another home",
            ));
        };
        let fresh = evervm::Client::remote_trusting(&server.url, &server.token, &server.trust)
            .map_err(to_py)?;
        // The parent's client is not dropped here: its connections belong to a runtime this
        // process does not have.
        let inherited = std::mem::replace(&mut *current, (pid, fresh.clone()));
        std::mem::forget(inherited);
        Ok(fresh)
    }
}

// --- the operations, shared by both flavours --------------------------------------------------

async fn connect_local(
    home: Option<PathBuf>,
    backend: Option<String>,
    account: Option<String>,
    pool_size: Option<usize>,
) -> PyResult<evervm::Client> {
    evervm::Client::local(evervm::LocalOptions {
        home,
        backend,
        account,
        pool_size,
    })
    .await
    .map_err(to_py)
}

fn connect_remote(
    url: Option<String>,
    token: Option<String>,
    ca_file: Option<PathBuf>,
) -> PyResult<(evervm::Client, Remote)> {
    let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    let url = url.or_else(|| env("EVERVM_URL")).ok_or_else(|| {
        invalid_input(
            "no server given: pass url= (or set EVERVM_URL), or use Client.local() to run the \
             engine in this process",
        )
    })?;
    let token = token
        .or_else(|| env("EVERVM_TOKEN"))
        .ok_or_else(|| invalid_input("no token given: pass token= (or set EVERVM_TOKEN)"))?;
    let trust = evervm::Trust::from_option_or_env(ca_file);
    let client = evervm::Client::remote_trusting(&url, &token, &trust).map_err(to_py)?;
    Ok((client, Remote { url, token, trust }))
}

async fn create_machine(
    client: evervm::Client,
    options: evervm::CreateMachineOptions,
) -> PyResult<evervm::Machine> {
    client.create_machine(options).await.map_err(to_py)
}

async fn list_machines(client: evervm::Client, tags: Tags) -> PyResult<Vec<MachineInfo>> {
    let machines = client.list_machines(&tags).await.map_err(to_py)?;
    crate::runtime::with_python(|py| {
        machines
            .into_iter()
            .map(|m| MachineInfo::new(py, m))
            .collect()
    })
}

async fn list_machines_page(
    client: evervm::Client,
    tags: Tags,
    limit: u32,
    cursor: Option<String>,
) -> PyResult<MachinePage> {
    let page = client
        .list_machines_page(&tags, limit, cursor.as_deref())
        .await
        .map_err(to_py)?;
    crate::runtime::with_python(|py| {
        Ok(MachinePage {
            machines: page
                .machines
                .into_iter()
                .map(|m| MachineInfo::new(py, m).and_then(|info| Py::new(py, info)))
                .collect::<PyResult<_>>()?,
            next_cursor: page.next_cursor,
        })
    })
}

async fn exec(
    machine: evervm::Machine,
    code: String,
    options: evervm::ExecOptions,
) -> PyResult<ExecResult> {
    let run = machine.exec_with(&code, &options).await.map_err(to_py)?;
    crate::runtime::with_python(|py| ExecResult::new(py, run))
}

async fn info(machine: evervm::Machine) -> PyResult<MachineInfo> {
    let info = machine.info().await.map_err(to_py)?;
    crate::runtime::with_python(|py| MachineInfo::new(py, info))
}

async fn rollback(machine: evervm::Machine, checkpoint: String) -> PyResult<MachineInfo> {
    let info = machine.rollback(&checkpoint).await.map_err(to_py)?;
    crate::runtime::with_python(|py| MachineInfo::new(py, info))
}

async fn checkpoints(machine: evervm::Machine) -> PyResult<Vec<Checkpoint>> {
    let list = machine.checkpoints().await.map_err(to_py)?;
    Ok(list.into_iter().map(Into::into).collect())
}

async fn create_context(machine: evervm::Machine, cwd: Option<String>) -> PyResult<Context> {
    machine
        .create_context(cwd.as_deref())
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn contexts(machine: evervm::Machine) -> PyResult<Vec<Context>> {
    let list = machine.contexts().await.map_err(to_py)?;
    Ok(list.into_iter().map(Into::into).collect())
}

async fn restart_context(machine: evervm::Machine, context: String) -> PyResult<Context> {
    machine
        .restart_context(&context)
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn remove_context(machine: evervm::Machine, context: String) -> PyResult<()> {
    machine.remove_context(&context).await.map_err(to_py)
}

async fn rewind(machine: evervm::Machine, seq: i64) -> PyResult<Rewound> {
    machine.rewind(seq).await.map(Into::into).map_err(to_py)
}

async fn undo(machine: evervm::Machine) -> PyResult<Rewound> {
    machine.undo().await.map(Into::into).map_err(to_py)
}

async fn history(machine: evervm::Machine, limit: Option<usize>) -> PyResult<MachineHistory> {
    machine.history(limit).await.map(Into::into).map_err(to_py)
}

async fn lineage(machine: evervm::Machine) -> PyResult<Lineage> {
    machine.lineage().await.map(Into::into).map_err(to_py)
}

/// `fork(tags=, at=)`: from the current state, or from the undo point after instruction `at`.
async fn fork(
    machine: evervm::Machine,
    tags: Option<Tags>,
    at: Option<i64>,
) -> PyResult<evervm::Machine> {
    match at {
        Some(seq) => machine.fork_at(seq, tags).await,
        None => machine.fork(tags).await,
    }
    .map_err(to_py)
}

/// `network=`: a mode (`"none"`, `"public"`) or the rules of an allow list.
#[derive(FromPyObject)]
pub(crate) enum NetworkArg {
    Mode(String),
    Allow(Vec<String>),
}

impl NetworkArg {
    fn policy(self) -> PyResult<evervm::NetworkPolicy> {
        match self {
            NetworkArg::Mode(mode) => {
                evervm::NetworkPolicy::from_mode_name(&mode).map_err(|e| to_py(e.into()))
            }
            NetworkArg::Allow(rules) => {
                evervm::NetworkPolicy::new(evervm::NetworkMode::Allow, &rules)
                    .map_err(|e| to_py(e.into()))
            }
        }
    }
}

// One parameter per keyword argument of `create_machine`.
#[allow(clippy::too_many_arguments)]
fn create_options(
    tags: Option<Tags>,
    memory_mb: Option<u32>,
    image: Option<String>,
    durability: Option<String>,
    history: Option<u32>,
    env: Option<Tags>,
    secret_env: Option<Tags>,
    ttl_seconds: Option<f64>,
    network: Option<NetworkArg>,
) -> PyResult<evervm::CreateMachineOptions> {
    let ttl = ttl_seconds
        .map(|seconds| {
            std::time::Duration::try_from_secs_f64(seconds.ceil())
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid_input(format!(
                        "ttl_seconds={seconds}: give a positive number of seconds"
                    ))
                })
        })
        .transpose()?;
    Ok(evervm::CreateMachineOptions {
        tags: tags.unwrap_or_default(),
        memory_mb,
        image,
        durability,
        env: env.unwrap_or_default(),
        secret_env: evervm::SecretEnv(secret_env.unwrap_or_default()),
        ttl,
        expires_at: None,
        network: network.map(NetworkArg::policy).transpose()?,
        history,
    })
}

// --- blocking -------------------------------------------------------------------------------

/// An evervm client: a server (`Client(url, token)`, defaults from `EVERVM_URL` and
/// `EVERVM_TOKEN`; over https it trusts the default roots, or only the CA file `ca_file` or
/// `EVERVM_CA_FILE` names) or the engine in this process (`Client.local()`).
#[pyclass(module = "evervm", frozen)]
pub(crate) struct Client {
    conn: Arc<Connection>,
}

impl Client {
    fn checked(&self) -> PyResult<evervm::Client> {
        self.conn.client()
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (url=None, token=None, ca_file=None))]
    fn new(url: Option<String>, token: Option<String>, ca_file: Option<PathBuf>) -> PyResult<Self> {
        let (client, server) = connect_remote(url, token, ca_file)?;
        Ok(Self {
            conn: Connection::new(client, Some(server)),
        })
    }

    /// Runs the engine in this process on `home` (default `$EVERVM_HOME` or
    /// `~/.local/share/evervm`), with `backend` `"auto"`, `"gvisor"` or `"process"`.
    #[staticmethod]
    #[pyo3(signature = (home=None, backend=None, account=None, pool_size=None))]
    fn local(
        py: Python<'_>,
        home: Option<PathBuf>,
        backend: Option<String>,
        account: Option<String>,
        pool_size: Option<usize>,
    ) -> PyResult<Self> {
        let inner = wait(py, connect_local(home, backend, account, pool_size), None)?;
        Ok(Self {
            conn: Connection::new(inner, None),
        })
    }

    /// The account the token belongs to.
    fn whoami(&self, py: Python<'_>) -> PyResult<String> {
        let client = self.checked()?;
        wait(
            py,
            async move { client.whoami().await.map_err(to_py) },
            None,
        )
    }

    // One parameter per keyword argument of the Python method.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (*, tags=None, memory_mb=None, image=None, durability=None, history=None, env=None, secret_env=None, ttl_seconds=None, network=None))]
    fn create_machine(
        &self,
        py: Python<'_>,
        tags: Option<Tags>,
        memory_mb: Option<u32>,
        image: Option<String>,
        durability: Option<String>,
        history: Option<u32>,
        env: Option<Tags>,
        secret_env: Option<Tags>,
        ttl_seconds: Option<f64>,
        network: Option<NetworkArg>,
    ) -> PyResult<Machine> {
        let options = create_options(
            tags,
            memory_mb,
            image,
            durability,
            history,
            env,
            secret_env,
            ttl_seconds,
            network,
        )?;
        let inner = wait(py, create_machine(self.checked()?, options), None)?;
        Ok(Machine {
            name: inner.name().to_owned(),
            conn: Arc::clone(&self.conn),
        })
    }

    /// The account's machines carrying every given tag, newest first.
    #[pyo3(signature = (*, tags=None))]
    fn list_machines(&self, py: Python<'_>, tags: Option<Tags>) -> PyResult<Vec<MachineInfo>> {
        wait(
            py,
            list_machines(self.checked()?, tags.unwrap_or_default()),
            None,
        )
    }

    /// One page of the machines carrying every given tag, newest first: at most `limit` (1 to
    /// 1000), after `cursor` (an earlier page's `next_cursor`).
    #[pyo3(signature = (*, tags=None, limit=100, cursor=None))]
    fn list_machines_page(
        &self,
        py: Python<'_>,
        tags: Option<Tags>,
        limit: u32,
        cursor: Option<String>,
    ) -> PyResult<MachinePage> {
        let client = self.checked()?;
        wait(
            py,
            list_machines_page(client, tags.unwrap_or_default(), limit, cursor),
            None,
        )
    }

    /// A machine by name (nothing is checked until it is used).
    fn machine(&self, name: &str) -> Machine {
        Machine {
            conn: Arc::clone(&self.conn),
            name: name.to_owned(),
        }
    }

    /// Stops an in-process engine (its machines are saved to disk where the backend can);
    /// nothing for a server. The client cannot be used afterwards.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.checked()?;
        wait(
            py,
            async move {
                client.shutdown().await;
                Ok(())
            },
            None,
        )
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: Option<Py<PyAny>>,
        _value: Option<Py<PyAny>>,
        _traceback: Option<Py<PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        self.conn.client().map_or_else(
            |_| "Client(<engine of the parent process>)".to_owned(),
            |c| format!("Client({})", c.describe()),
        )
    }
}

/// A machine: a persistent Python interpreter in its own sandbox.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct Machine {
    conn: Arc<Connection>,
    name: String,
}

impl Machine {
    fn checked(&self) -> PyResult<evervm::Machine> {
        Ok(self.conn.client()?.machine(&self.name))
    }
}

#[pymethods]
impl Machine {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The machine's files: `machine.files.write(path, data)`, `.read(path)`, `.list()`, ...
    #[getter]
    fn files(&self) -> crate::files::Files {
        crate::files::Files {
            conn: Arc::clone(&self.conn),
            name: self.name.clone(),
        }
    }

    /// Runs code and returns its result with everything it printed; `timeout` in seconds
    /// (`DEFAULT_TIMEOUT`, 15 s, when not given); `dialect="jupyter"` runs it as a Jupyter cell
    /// (IPython's shell); `context` (a `Context` or its id) runs it in that code context instead
    /// of the machine's own interpreter. Ctrl-C while waiting interrupts the instruction.
    #[pyo3(signature = (code, *, timeout=None, interrupt=false, dialect="python", context=None))]
    fn exec(
        &self,
        py: Python<'_>,
        code: String,
        timeout: Option<f64>,
        interrupt: bool,
        dialect: &str,
        context: Option<ContextArg>,
    ) -> PyResult<ExecResult> {
        let options = exec_options(timeout, interrupt, dialect, context)?;
        let machine = self.checked()?;
        let on_interrupt = {
            let machine = self.checked()?;
            Box::pin(async move {
                let _ = machine.interrupt().await;
            })
        };
        wait(py, exec(machine, code, options), Some(on_interrupt))
    }

    /// Runs code and yields its output chunks as they come, then its `ExecResult`.
    #[pyo3(signature = (code, *, timeout=None, dialect="python", context=None))]
    fn stream(
        &self,
        py: Python<'_>,
        code: String,
        timeout: Option<f64>,
        dialect: &str,
        context: Option<ContextArg>,
    ) -> PyResult<ExecStream> {
        let options = exec_options(timeout, false, dialect, context)?;
        let machine = self.checked()?;
        let state = wait(py, open_stream(machine, code, options), None)?;
        Ok(ExecStream { state })
    }

    /// Interrupts the running instruction and cancels queued ones; true if there were any.
    fn interrupt(&self, py: Python<'_>) -> PyResult<bool> {
        let machine = self.checked()?;
        wait(
            py,
            async move { machine.interrupt().await.map_err(to_py) },
            None,
        )
    }

    fn info(&self, py: Python<'_>) -> PyResult<MachineInfo> {
        wait(py, info(self.checked()?), None)
    }

    /// Installs packages from the server's package index (`"requests==2.32.3"`, dependencies
    /// included): binary wheels only, checked against their sha256, fetched by the engine, so
    /// the machine needs no network. Importable at once; kept through swap, restart and fork.
    fn install(&self, py: Python<'_>, requirements: Vec<String>) -> PyResult<InstallReport> {
        let machine = self.checked()?;
        wait(
            py,
            async move {
                let requirements: Vec<&str> = requirements.iter().map(String::as_str).collect();
                machine
                    .install(&requirements)
                    .await
                    .map(InstallReport::from)
                    .map_err(to_py)
            },
            None,
        )
    }

    /// Saves the machine to disk and releases its memory; its next instruction restores it.
    fn swap_out(&self, py: Python<'_>) -> PyResult<()> {
        let machine = self.checked()?;
        wait(
            py,
            async move { machine.swap_out().await.map_err(to_py) },
            None,
        )
    }

    /// A new machine from this one's current state, with its own tags (this one's by default);
    /// with `at`, from its undo point after instruction `at` (`-1`: before its first), which
    /// leaves this machine untouched.
    #[pyo3(signature = (*, tags=None, at=None))]
    fn fork(&self, py: Python<'_>, tags: Option<Tags>, at: Option<i64>) -> PyResult<Machine> {
        let inner = wait(py, fork(self.checked()?, tags, at), None)?;
        Ok(Machine {
            name: inner.name().to_owned(),
            conn: Arc::clone(&self.conn),
        })
    }

    /// Saves the current state as a named checkpoint (a generated name by default).
    #[pyo3(signature = (name=None))]
    fn checkpoint(&self, py: Python<'_>, name: Option<String>) -> PyResult<Checkpoint> {
        let machine = self.checked()?;
        wait(
            py,
            async move {
                machine
                    .checkpoint(name.as_deref())
                    .await
                    .map(Into::into)
                    .map_err(to_py)
            },
            None,
        )
    }

    /// The machine's checkpoints, oldest first.
    fn checkpoints(&self, py: Python<'_>) -> PyResult<Vec<Checkpoint>> {
        wait(py, checkpoints(self.checked()?), None)
    }

    /// Returns the machine to a checkpoint's state.
    fn rollback(&self, py: Python<'_>, checkpoint: String) -> PyResult<MachineInfo> {
        wait(py, rollback(self.checked()?, checkpoint), None)
    }

    /// Takes back the last instruction: the machine's state becomes what it was before it. The
    /// machine must keep a history (`create_machine(history=N)`).
    fn undo(&self, py: Python<'_>) -> PyResult<Rewound> {
        wait(py, undo(self.checked()?), None)
    }

    /// Makes the state right after instruction `seq` the machine's state (one of its undo
    /// points); the instructions after it stay in its history, marked rewound.
    fn rewind(&self, py: Python<'_>, seq: i64) -> PyResult<Rewound> {
        wait(py, rewind(self.checked()?, seq), None)
    }

    /// The machine's latest instructions (at most `limit`, 100 by default), oldest first, and
    /// which of them can be rewound to.
    #[pyo3(signature = (limit=None))]
    fn history(&self, py: Python<'_>, limit: Option<usize>) -> PyResult<MachineHistory> {
        wait(py, history(self.checked()?, limit), None)
    }

    /// The tree of forks this machine is in: its oldest ancestor still there (`root`) and every
    /// machine forked from it since, parents first, each with its checkpoints and the
    /// instructions rewinds and rollbacks took back.
    fn lineage(&self, py: Python<'_>) -> PyResult<Lineage> {
        wait(py, lineage(self.checked()?), None)
    }

    fn delete_checkpoint(&self, py: Python<'_>, checkpoint: String) -> PyResult<()> {
        let machine = self.checked()?;
        wait(
            py,
            async move { machine.delete_checkpoint(&checkpoint).await.map_err(to_py) },
            None,
        )
    }

    /// Makes a code context: another Python interpreter in the machine, with globals of its
    /// own, starting in `cwd` (the machine's home by default), sharing its files, packages and
    /// environment. Run code in it with `exec(code, context=...)`.
    #[pyo3(signature = (cwd=None))]
    fn create_context(&self, py: Python<'_>, cwd: Option<String>) -> PyResult<Context> {
        wait(py, create_context(self.checked()?, cwd), None)
    }

    /// The machine's code contexts: `default` (its own interpreter) first.
    fn contexts(&self, py: Python<'_>) -> PyResult<Vec<Context>> {
        wait(py, contexts(self.checked()?), None)
    }

    /// Starts a context's interpreter again (a `Context` or its id): its variables are gone.
    fn restart_context(&self, py: Python<'_>, context: ContextArg) -> PyResult<Context> {
        wait(py, restart_context(self.checked()?, context.id()), None)
    }

    /// Removes a context (a `Context` or its id), its interpreter stopped.
    fn remove_context(&self, py: Python<'_>, context: ContextArg) -> PyResult<()> {
        wait(py, remove_context(self.checked()?, context.id()), None)
    }

    /// Deletes the machine, its state and its history.
    fn delete(&self, py: Python<'_>) -> PyResult<()> {
        let machine = self.checked()?;
        wait(
            py,
            async move { machine.delete().await.map_err(to_py) },
            None,
        )
    }

    fn __repr__(&self) -> String {
        format!("Machine({:?})", self.name)
    }
}

// --- streams ---------------------------------------------------------------------------------

/// An instruction's events as they come: output first, the result last.
struct StreamState {
    /// An instruction to start at the first `next` (asyncio streams start lazily).
    start: Option<(evervm::Machine, String, evervm::ExecOptions)>,
    seq: i64,
    events: Option<evervm::EventStream>,
    output: Vec<evervm::OutputChunk>,
}

type SharedStream = Arc<tokio::sync::Mutex<StreamState>>;

async fn open_stream(
    machine: evervm::Machine,
    code: String,
    options: evervm::ExecOptions,
) -> PyResult<SharedStream> {
    let (seq, events) = machine.stream(&code, &options).await.map_err(to_py)?;
    Ok(Arc::new(tokio::sync::Mutex::new(StreamState {
        start: None,
        seq,
        events: Some(events),
        output: Vec::new(),
    })))
}

/// The next event as a Python object (`OutputChunk`, `RichResult` or `ExecResult`); `None`
/// after the result.
async fn next_event(state: SharedStream) -> PyResult<Option<Py<PyAny>>> {
    let mut state = state.lock().await;
    if let Some((machine, code, options)) = state.start.take() {
        let (seq, events) = machine.stream(&code, &options).await.map_err(to_py)?;
        state.seq = seq;
        state.events = Some(events);
    }
    let Some(events) = state.events.as_mut() else {
        return Ok(None);
    };
    match events.next().await {
        Some(Ok(evervm::ExecEvent::Output(chunk))) => {
            state.output.push(chunk.clone());
            let chunk = OutputChunk::from(chunk);
            crate::runtime::with_python(|py| Ok(Some(Py::new(py, chunk)?.into_any())))
        }
        Some(Ok(evervm::ExecEvent::Display(rich))) => {
            let rich = crate::types::RichResult::from(rich);
            crate::runtime::with_python(|py| Ok(Some(Py::new(py, rich)?.into_any())))
        }
        Some(Ok(evervm::ExecEvent::Result(result))) => {
            state.events = None;
            let run = evervm::Execution {
                seq: state.seq,
                output: std::mem::take(&mut state.output),
                result,
            };
            crate::runtime::with_python(|py| {
                Ok(Some(Py::new(py, ExecResult::new(py, run)?)?.into_any()))
            })
        }
        Some(Err(e)) => {
            state.events = None;
            Err(to_py(e))
        }
        None => {
            state.events = None;
            Ok(None)
        }
    }
}

/// Iterates over an instruction's output chunks and the rich results it shows, in order, then
/// its result.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct ExecStream {
    state: SharedStream,
}

#[pymethods]
impl ExecStream {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match wait(py, next_event(Arc::clone(&self.state)), None)? {
            Some(event) => Ok(event),
            None => Err(PyStopIteration::new_err(())),
        }
    }
}

/// `async for` over an instruction's output chunks and the rich results it shows, in order,
/// then its result.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct AsyncExecStream {
    state: SharedStream,
}

#[pymethods]
impl AsyncExecStream {
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = Arc::clone(&self.state);
        awaitable(py, async move {
            match next_event(state).await? {
                Some(event) => Ok(event),
                None => Err(PyStopAsyncIteration::new_err(())),
            }
        })
    }
}

// --- asyncio --------------------------------------------------------------------------------

/// `Client` for asyncio: the same methods, awaited.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct AsyncClient {
    conn: Arc<Connection>,
}

impl AsyncClient {
    fn checked(&self) -> PyResult<evervm::Client> {
        self.conn.client()
    }
}

#[pymethods]
impl AsyncClient {
    #[new]
    #[pyo3(signature = (url=None, token=None, ca_file=None))]
    fn new(url: Option<String>, token: Option<String>, ca_file: Option<PathBuf>) -> PyResult<Self> {
        let (client, server) = connect_remote(url, token, ca_file)?;
        Ok(Self {
            conn: Connection::new(client, Some(server)),
        })
    }

    /// `await AsyncClient.local(...)`: the engine in this process.
    #[staticmethod]
    #[pyo3(signature = (home=None, backend=None, account=None, pool_size=None))]
    fn local(
        py: Python<'_>,
        home: Option<PathBuf>,
        backend: Option<String>,
        account: Option<String>,
        pool_size: Option<usize>,
    ) -> PyResult<Bound<'_, PyAny>> {
        awaitable(py, async move {
            let inner = connect_local(home, backend, account, pool_size).await?;
            Ok(AsyncClient {
                conn: Connection::new(inner, None),
            })
        })
    }

    fn whoami<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.checked()?;
        awaitable(py, async move { client.whoami().await.map_err(to_py) })
    }

    // One parameter per keyword argument of the Python method.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (*, tags=None, memory_mb=None, image=None, durability=None, history=None, env=None, secret_env=None, ttl_seconds=None, network=None))]
    fn create_machine<'py>(
        &self,
        py: Python<'py>,
        tags: Option<Tags>,
        memory_mb: Option<u32>,
        image: Option<String>,
        durability: Option<String>,
        history: Option<u32>,
        env: Option<Tags>,
        secret_env: Option<Tags>,
        ttl_seconds: Option<f64>,
        network: Option<NetworkArg>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = create_options(
            tags,
            memory_mb,
            image,
            durability,
            history,
            env,
            secret_env,
            ttl_seconds,
            network,
        )?;
        let client = self.checked()?;
        let conn = Arc::clone(&self.conn);
        awaitable(py, async move {
            let inner = create_machine(client, options).await?;
            Ok(AsyncMachine {
                name: inner.name().to_owned(),
                conn,
            })
        })
    }

    #[pyo3(signature = (*, tags=None))]
    fn list_machines<'py>(
        &self,
        py: Python<'py>,
        tags: Option<Tags>,
    ) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, list_machines(self.checked()?, tags.unwrap_or_default()))
    }

    #[pyo3(signature = (*, tags=None, limit=100, cursor=None))]
    fn list_machines_page<'py>(
        &self,
        py: Python<'py>,
        tags: Option<Tags>,
        limit: u32,
        cursor: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.checked()?;
        awaitable(
            py,
            list_machines_page(client, tags.unwrap_or_default(), limit, cursor),
        )
    }

    fn machine(&self, name: &str) -> AsyncMachine {
        AsyncMachine {
            conn: Arc::clone(&self.conn),
            name: name.to_owned(),
        }
    }

    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.checked()?;
        awaitable(py, async move {
            client.shutdown().await;
            Ok(())
        })
    }

    fn __aenter__(slf: Py<Self>, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        awaitable(py, async move { Ok(slf) })
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _kind: Option<Py<PyAny>>,
        _value: Option<Py<PyAny>>,
        _traceback: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.checked()?;
        awaitable(py, async move {
            client.shutdown().await;
            Ok(false)
        })
    }

    fn __repr__(&self) -> String {
        self.conn.client().map_or_else(
            |_| "AsyncClient(<engine of the parent process>)".to_owned(),
            |c| format!("AsyncClient({})", c.describe()),
        )
    }
}

/// `Machine` for asyncio: the same methods, awaited.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct AsyncMachine {
    conn: Arc<Connection>,
    name: String,
}

impl AsyncMachine {
    fn checked(&self) -> PyResult<evervm::Machine> {
        Ok(self.conn.client()?.machine(&self.name))
    }
}

#[pymethods]
impl AsyncMachine {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The machine's files, for asyncio: `await machine.files.read(path)`, ...
    #[getter]
    fn files(&self) -> crate::files::AsyncFiles {
        crate::files::AsyncFiles {
            conn: Arc::clone(&self.conn),
            name: self.name.clone(),
        }
    }

    #[pyo3(signature = (code, *, timeout=None, interrupt=false, dialect="python", context=None))]
    fn exec<'py>(
        &self,
        py: Python<'py>,
        code: String,
        timeout: Option<f64>,
        interrupt: bool,
        dialect: &str,
        context: Option<ContextArg>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = exec_options(timeout, interrupt, dialect, context)?;
        awaitable(py, exec(self.checked()?, code, options))
    }

    /// `async for event in machine.stream(code)`: output chunks, then the result (the
    /// instruction starts at the first iteration).
    #[pyo3(signature = (code, *, timeout=None, dialect="python", context=None))]
    fn stream(
        &self,
        code: String,
        timeout: Option<f64>,
        dialect: &str,
        context: Option<ContextArg>,
    ) -> PyResult<AsyncExecStream> {
        let options = exec_options(timeout, false, dialect, context)?;
        Ok(AsyncExecStream {
            state: Arc::new(tokio::sync::Mutex::new(StreamState {
                start: Some((self.checked()?, code, options)),
                seq: 0,
                events: None,
                output: Vec::new(),
            })),
        })
    }

    fn interrupt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.checked()?;
        awaitable(py, async move { machine.interrupt().await.map_err(to_py) })
    }

    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, info(self.checked()?))
    }

    fn install<'py>(
        &self,
        py: Python<'py>,
        requirements: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.checked()?;
        awaitable(py, async move {
            let requirements: Vec<&str> = requirements.iter().map(String::as_str).collect();
            machine
                .install(&requirements)
                .await
                .map(InstallReport::from)
                .map_err(to_py)
        })
    }

    fn swap_out<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.checked()?;
        awaitable(py, async move { machine.swap_out().await.map_err(to_py) })
    }

    #[pyo3(signature = (*, tags=None, at=None))]
    fn fork<'py>(
        &self,
        py: Python<'py>,
        tags: Option<Tags>,
        at: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.checked()?;
        let conn = Arc::clone(&self.conn);
        awaitable(py, async move {
            let inner = fork(machine, tags, at).await?;
            Ok(AsyncMachine {
                name: inner.name().to_owned(),
                conn,
            })
        })
    }

    #[pyo3(signature = (name=None))]
    fn checkpoint<'py>(
        &self,
        py: Python<'py>,
        name: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.checked()?;
        awaitable(py, async move {
            machine
                .checkpoint(name.as_deref())
                .await
                .map(Checkpoint::from)
                .map_err(to_py)
        })
    }

    fn checkpoints<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, checkpoints(self.checked()?))
    }

    fn rollback<'py>(&self, py: Python<'py>, checkpoint: String) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, rollback(self.checked()?, checkpoint))
    }

    fn undo<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, undo(self.checked()?))
    }

    fn rewind<'py>(&self, py: Python<'py>, seq: i64) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, rewind(self.checked()?, seq))
    }

    #[pyo3(signature = (limit=None))]
    fn history<'py>(&self, py: Python<'py>, limit: Option<usize>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, history(self.checked()?, limit))
    }

    fn lineage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, lineage(self.checked()?))
    }

    fn delete_checkpoint<'py>(
        &self,
        py: Python<'py>,
        checkpoint: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.checked()?;
        awaitable(py, async move {
            machine.delete_checkpoint(&checkpoint).await.map_err(to_py)
        })
    }

    #[pyo3(signature = (cwd=None))]
    fn create_context<'py>(
        &self,
        py: Python<'py>,
        cwd: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, create_context(self.checked()?, cwd))
    }

    fn contexts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, contexts(self.checked()?))
    }

    fn restart_context<'py>(
        &self,
        py: Python<'py>,
        context: ContextArg,
    ) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, restart_context(self.checked()?, context.id()))
    }

    fn remove_context<'py>(
        &self,
        py: Python<'py>,
        context: ContextArg,
    ) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, remove_context(self.checked()?, context.id()))
    }

    fn delete<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.checked()?;
        awaitable(py, async move { machine.delete().await.map_err(to_py) })
    }

    fn __repr__(&self) -> String {
        format!("AsyncMachine({:?})", self.name)
    }
}
