//! Processes beside the interpreter (E2B's commands): started, fed and signalled through the
//! machine's task, which owns the agent channel, whether an instruction runs or not. Their
//! output and ends flow through the connection's [`ProcessRouter`] to whoever follows them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine as _;
use tokio::sync::{broadcast, oneshot, watch};

use super::MachineHandle;
use super::task::take_resident;
use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::guest::channel::{AgentRequest, EnvValues};
use crate::guest::processes::{ProcessEntry, ProcessOutput, ProcessState};
use crate::pool::Resident;

/// Process requests waiting for the machine's task, at most.
pub(super) const PROCESS_OPS_WAITING: usize = 64;
/// The most bytes one `input` carries.
pub const MAX_PROCESS_INPUT_BYTES: usize = 1024 * 1024;
/// The most arguments, and bytes of arguments and environment, a process is started with.
const MAX_ARGS: usize = 4096;
const MAX_ARG_BYTES: usize = 1024 * 1024;
/// How long a start waits for the agent to say whether the process runs.
const START_WAIT: Duration = Duration::from_secs(60);

/// A process to start.
#[derive(Debug, Clone, Default)]
pub struct ProcessSpec {
    pub argv: Vec<String>,
    /// Set on top of the machine's environment.
    pub env: BTreeMap<String, String>,
    /// Where it starts (none: the machine's home).
    pub cwd: Option<String>,
    /// Whether the caller will feed its stdin (else it reads nothing).
    pub stdin: bool,
    /// Killed (its whole group) after this long; none: [`crate::MAX_TIMEOUT`].
    pub timeout: Option<Duration>,
    /// Run on a terminal (a pty) of this size, its controlling terminal: what it writes to
    /// stdout and stderr comes as one stream (stdout), and its input is typed on the terminal.
    pub pty: Option<TerminalSize>,
}

/// A terminal's size, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TerminalSize {
    pub cols: u16,
    pub rows: u16,
}

impl TerminalSize {
    fn check(self) -> Result<Self> {
        if self.cols == 0 || self.rows == 0 {
            return Err(Error::invalid(format!(
                "a terminal of {} columns and {} rows: both must be at least 1",
                self.cols, self.rows
            )));
        }
        Ok(self)
    }
}

impl ProcessSpec {
    fn check(&self) -> Result<()> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(Error::invalid("a process needs a command (argv[0])"));
        }
        if self.argv.len() > MAX_ARGS {
            return Err(Error::invalid(format!(
                "a process takes at most {MAX_ARGS} arguments"
            )));
        }
        let bytes: usize = self.argv.iter().map(String::len).sum::<usize>()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        if bytes > MAX_ARG_BYTES {
            return Err(Error::invalid(format!(
                "a process's arguments and environment take at most {MAX_ARG_BYTES} bytes"
            )));
        }
        if let Some(size) = self.pty {
            size.check()?;
        }
        let nul = |s: &String| s.contains('\0');
        if self.argv.iter().any(nul) || self.cwd.as_ref().is_some_and(nul) {
            return Err(Error::invalid("a process's arguments may not contain NUL"));
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(Error::invalid(format!(
                    "environment variable {name:?}: a name is non-empty without `=` or NUL, a \
                     value has no NUL"
                )));
            }
        }
        Ok(())
    }
}

/// A process followed from the host: its pid, its output from when it was followed, how it is.
#[derive(Debug)]
pub struct Process {
    /// Its id on the machine's channel (a watch's pid is the agent's; this one is its own).
    pub(crate) id: u64,
    pub pid: u32,
    pub output: broadcast::Receiver<ProcessOutput>,
    pub state: watch::Receiver<ProcessState>,
}

/// What a followed process did next.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessUpdate {
    Output(ProcessOutput),
    /// This many pieces of output went by while the follower did not read.
    Missed(u64),
    /// It is over (ended, never ran, or lost); what it wrote before came first.
    Over(ProcessState),
}

impl Process {
    fn follow(entry: &ProcessEntry, pid: u32) -> Self {
        Self {
            id: entry.id,
            pid,
            output: entry.subscribe(),
            state: entry.state(),
        }
    }

    /// The next thing the process did. Once it is over, every call says so again.
    pub async fn next(&mut self) -> ProcessUpdate {
        use broadcast::error::{RecvError, TryRecvError};
        loop {
            match self.output.try_recv() {
                Ok(piece) => return ProcessUpdate::Output(piece),
                Err(TryRecvError::Lagged(n)) => return ProcessUpdate::Missed(n),
                Err(TryRecvError::Empty | TryRecvError::Closed) => {}
            }
            let state = self.state.borrow_and_update().clone();
            if state.is_over() {
                // Output is handed over before the end: what came meanwhile goes first.
                if let Ok(piece) = self.output.try_recv() {
                    return ProcessUpdate::Output(piece);
                }
                return ProcessUpdate::Over(state);
            }
            tokio::select! {
                piece = self.output.recv() => match piece {
                    Ok(piece) => return ProcessUpdate::Output(piece),
                    Err(RecvError::Lagged(n)) => return ProcessUpdate::Missed(n),
                    Err(RecvError::Closed) => {
                        if self.state.changed().await.is_err() && !self.state.borrow().is_over() {
                            return ProcessUpdate::Over(ProcessState::Lost(
                                "the machine stopped following it".to_owned(),
                            ));
                        }
                    }
                },
                changed = self.state.changed() => {
                    if changed.is_err() && !self.state.borrow().is_over() {
                        return ProcessUpdate::Over(ProcessState::Lost(
                            "the machine stopped following it".to_owned(),
                        ));
                    }
                }
            }
        }
    }
}

/// What a start starts: a process, or a watch of a directory (followed as a process whose
/// output is its events, a JSON line each).
#[derive(Debug, Clone)]
pub(crate) enum Started {
    Process(ProcessSpec),
    Watch { path: String, recursive: bool },
}

/// A request for the machine's task.
pub(crate) enum ProcessOp {
    Start {
        spec: Started,
        reply: oneshot::Sender<Result<(Arc<ProcessEntry>, Process)>>,
    },
    Input {
        pid: u32,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<()>>,
    },
    CloseStdin {
        pid: u32,
        reply: oneshot::Sender<Result<()>>,
    },
    Signal {
        pid: u32,
        signal: i32,
        reply: oneshot::Sender<Result<()>>,
    },
    Resize {
        pid: u32,
        size: TerminalSize,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Ends the process (SIGKILL to its group) or watch with this id, if it still runs.
    End {
        id: u64,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Connects to a port in the machine (see `ports.rs`): like a start, it brings the machine
    /// back first.
    OpenPort {
        port: u16,
        reply: oneshot::Sender<Result<super::ports::Opening>>,
    },
}

impl ProcessOp {
    /// Whether it needs the machine's sandbox, restored if need be (else it concerns what ran in
    /// a sandbox that is gone).
    fn starts(&self) -> bool {
        matches!(self, ProcessOp::Start { .. } | ProcessOp::OpenPort { .. })
    }
}

fn not_running(pid: u32) -> Error {
    Error::new(
        crate::ErrorKind::NotFound,
        format!("no process {pid} is running in this machine"),
    )
}

impl MachineHandle {
    pub(super) async fn process_op<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> ProcessOp,
    ) -> Result<T> {
        if self.deleted.load(Ordering::SeqCst) {
            return Err(Error::machine_not_found(self.name.as_str()));
        }
        let (reply, answer) = oneshot::channel();
        self.process_ops
            .try_send(make(reply))
            .map_err(|e| match e {
                tokio::sync::mpsc::error::TrySendError::Full(_) => Error::limit_exceeded(format!(
                    "machine {} already has {PROCESS_OPS_WAITING} process requests waiting: try \
                 again when they are done",
                    self.name
                )),
                tokio::sync::mpsc::error::TrySendError::Closed(_) => {
                    Error::machine_not_found(self.name.as_str())
                }
            })?;
        self.touch();
        answer
            .await
            .map_err(|_| Error::machine_not_found(self.name.as_str()))?
    }

    /// Starts a process and waits until it runs (or did not start).
    pub(crate) async fn start_process(self: &Arc<Self>, spec: ProcessSpec) -> Result<Process> {
        spec.check()?;
        let timeout = spec.timeout.unwrap_or(crate::MAX_TIMEOUT);
        self.start(Started::Process(spec), timeout).await
    }

    /// Starts watching a directory; its events are the output, a JSON line each.
    pub(crate) async fn watch_dir(
        self: &Arc<Self>,
        path: String,
        recursive: bool,
    ) -> Result<Process> {
        crate::files::validate_path(&path)?;
        self.start(Started::Watch { path, recursive }, crate::MAX_TIMEOUT)
            .await
    }

    async fn start(self: &Arc<Self>, spec: Started, timeout: Duration) -> Result<Process> {
        let (entry, mut process) = self
            .process_op(|reply| ProcessOp::Start { spec, reply })
            .await?;
        let state = {
            let started = tokio::time::timeout(
                START_WAIT,
                process
                    .state
                    .wait_for(|s| !matches!(s, ProcessState::Starting)),
            )
            .await;
            match started {
                Ok(Ok(state)) => state.clone(),
                Ok(Err(_)) => ProcessState::Lost("the machine stopped".to_owned()),
                Err(_) => ProcessState::Lost(format!(
                    "the machine did not start the process within {} s",
                    START_WAIT.as_secs()
                )),
            }
        };
        match state {
            ProcessState::Running { pid } | ProcessState::Ended { pid, .. } => {
                process.pid = pid;
                self.kill_after(entry, timeout);
                Ok(process)
            }
            ProcessState::Failed { error, kind } => Err(match kind.as_deref() {
                Some("not_found") => Error::file_not_found(error),
                Some("denied") => Error::new(crate::ErrorKind::PermissionDenied, error),
                _ => Error::invalid(error),
            }),
            ProcessState::Lost(why) => Err(Error::crashed(why)),
            ProcessState::Starting => Err(Error::internal("the process is still starting")),
        }
    }

    /// Kills the process's group once `timeout` has passed, if it still runs then.
    fn kill_after(self: &Arc<Self>, entry: Arc<ProcessEntry>, timeout: Duration) {
        let machine = Arc::downgrade(self);
        let id = entry.id;
        tokio::spawn(async move {
            let mut state = entry.state();
            drop(entry);
            let over = {
                let ended = tokio::time::timeout(timeout, state.wait_for(ProcessState::is_over));
                ended.await.is_ok()
            };
            if !over && let Some(machine) = machine.upgrade() {
                let _ = machine.end_process(id).await;
            }
        });
    }

    /// Follows a running process from now on.
    pub(crate) fn connect_process(&self, pid: u32) -> Result<Process> {
        let router = self.process_router().ok_or_else(|| not_running(pid))?;
        router
            .running()
            .into_iter()
            .find(|e| e.pid() == Some(pid))
            .map(|entry| Process::follow(&entry, pid))
            .ok_or_else(|| not_running(pid))
    }

    /// The pids of the processes running.
    pub(crate) fn process_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .process_router()
            .map(|r| r.running().iter().filter_map(|e| e.pid()).collect())
            .unwrap_or_default();
        pids.sort_unstable();
        pids
    }

    pub(crate) async fn process_input(&self, pid: u32, data: Vec<u8>) -> Result<()> {
        if data.len() > MAX_PROCESS_INPUT_BYTES {
            return Err(Error::too_large(format!(
                "{} bytes of input at once, over the limit of {MAX_PROCESS_INPUT_BYTES}",
                data.len()
            )));
        }
        self.process_op(|reply| ProcessOp::Input { pid, data, reply })
            .await
    }

    /// Ends a process or a watch (this one, whatever its pid).
    pub(crate) async fn end_process(&self, id: u64) -> Result<()> {
        self.process_op(|reply| ProcessOp::End { id, reply }).await
    }

    /// Gives a process's terminal a new size (a process without one ignores it).
    pub(crate) async fn resize_terminal(&self, pid: u32, size: TerminalSize) -> Result<()> {
        let size = size.check()?;
        self.process_op(|reply| ProcessOp::Resize { pid, size, reply })
            .await
    }

    pub(crate) async fn close_process_stdin(&self, pid: u32) -> Result<()> {
        self.process_op(|reply| ProcessOp::CloseStdin { pid, reply })
            .await
    }

    pub(crate) async fn signal_process(&self, pid: u32, signal: i32) -> Result<()> {
        if !(1..64).contains(&signal) {
            return Err(Error::invalid(format!("{signal} is not a signal")));
        }
        self.process_op(|reply| ProcessOp::Signal { pid, signal, reply })
            .await
    }
}

/// Handles a process request between instructions: a start brings the machine back first, and
/// once more if its sandbox turns out to have stopped meanwhile (the agent was killed, say).
pub(super) async fn handle_idle(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    mut op: ProcessOp,
) {
    for _attempt in 0..2 {
        if op.starts() && resident.is_none() {
            match take_resident(engine, machine, resident).await {
                Ok(current) => *resident = Some(current),
                Err(e) => {
                    refuse(op, e.context("the machine could not start"));
                    return;
                }
            }
        }
        let Some(current) = resident.as_mut() else {
            refuse_not_running(op);
            return;
        };
        match handle(engine, machine, current, op).await {
            Ok(()) => {
                machine.set_resident(resident.as_ref());
                return;
            }
            Err(broken) => {
                if let Some(current) = resident.take() {
                    super::task::lost(engine, machine, current, broken.error.to_string()).await;
                }
                machine.set_resident(resident.as_ref());
                match broken.retry {
                    Some(again) => op = again,
                    None => return,
                }
            }
        }
    }
    refuse_not_running(op);
}

/// The agent channel broke while a request was sent; a start not yet answered comes back to be
/// tried again on a new sandbox.
pub(super) struct Broken {
    pub error: Error,
    pub retry: Option<ProcessOp>,
}

impl Broken {
    /// Answers the request that would have been tried again, with the error.
    pub fn refuse(self) -> Error {
        if let Some(op) = self.retry {
            refuse(op, self.error.clone());
        }
        self.error
    }
}

/// Answers a start (or a port's opening) with `error`.
fn refuse(op: ProcessOp, error: Error) {
    match op {
        ProcessOp::Start { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        ProcessOp::OpenPort { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        other => refuse_not_running(other),
    }
}

fn refuse_not_running(op: ProcessOp) {
    match op {
        ProcessOp::Start { reply, .. } => {
            let _ = reply.send(Err(Error::internal("the machine is not running")));
        }
        ProcessOp::OpenPort { reply, .. } => {
            let _ = reply.send(Err(Error::internal("the machine is not running")));
        }
        ProcessOp::Input { pid, reply, .. }
        | ProcessOp::CloseStdin { pid, reply }
        | ProcessOp::Signal { pid, reply, .. }
        | ProcessOp::Resize { pid, reply, .. } => {
            let _ = reply.send(Err(not_running(pid)));
        }
        // Its sandbox is gone, and it with it.
        ProcessOp::End { reply, .. } => {
            let _ = reply.send(Ok(()));
        }
    }
}

/// Sends a process request to the running agent. `Err`: the channel broke (the caller ends the
/// sandbox); the request's own answer has gone to its caller, except a start's (see [`Broken`]).
pub(super) async fn handle(
    engine: &EngineInner,
    machine: &MachineHandle,
    current: &mut Resident,
    op: ProcessOp,
) -> std::result::Result<(), Broken> {
    let router = Arc::clone(current.agent.processes());
    let find = |pid: u32| {
        router
            .running()
            .into_iter()
            .find(|e| e.pid() == Some(pid))
            .map(|e| e.id)
    };
    let (request, reply) = match op {
        ProcessOp::OpenPort { port, reply } => {
            return super::ports::open(engine, machine, current, port, reply).await;
        }
        ProcessOp::Start { spec, reply } => {
            if router.is_closed() {
                return Err(Broken {
                    error: Error::crashed("the machine's sandbox had stopped"),
                    retry: Some(ProcessOp::Start { spec, reply }),
                });
            }
            machine.mark_unsaved(engine).await;
            let id = machine.next_process_id.fetch_add(1, Ordering::SeqCst);
            let entry = router.register(id);
            let process = Process::follow(&entry, 0);
            let request = match &spec {
                Started::Process(process) => AgentRequest::ProcStart {
                    id,
                    argv: process.argv.clone(),
                    env: EnvValues(process.env.clone()),
                    cwd: process.cwd.clone(),
                    stdin: process.stdin || process.pty.is_some(),
                    pty: process.pty,
                },
                Started::Watch { path, recursive } => AgentRequest::WatchStart {
                    id,
                    path: path.clone(),
                    roots: super::files::file_roots(engine),
                    recursive: *recursive,
                },
            };
            return match current.agent.send(&request).await {
                Ok(()) => {
                    let _ = reply.send(Ok((entry, process)));
                    Ok(())
                }
                Err(error) => {
                    router.forget(id, "the machine's channel broke");
                    Err(Broken {
                        error,
                        retry: Some(ProcessOp::Start { spec, reply }),
                    })
                }
            };
        }
        ProcessOp::Input { pid, data, reply } => match find(pid) {
            Some(id) => {
                let data = base64::engine::general_purpose::STANDARD.encode(data);
                (AgentRequest::ProcInput { id, data }, reply)
            }
            None => {
                let _ = reply.send(Err(not_running(pid)));
                return Ok(());
            }
        },
        ProcessOp::CloseStdin { pid, reply } => match find(pid) {
            Some(id) => (AgentRequest::ProcCloseStdin { id }, reply),
            None => {
                let _ = reply.send(Err(not_running(pid)));
                return Ok(());
            }
        },
        ProcessOp::End { id, reply } => {
            if router.get(id).is_none() {
                let _ = reply.send(Ok(()));
                return Ok(());
            }
            let signal = libc::SIGKILL;
            (AgentRequest::ProcSignal { id, signal }, reply)
        }
        ProcessOp::Signal { pid, signal, reply } => match find(pid) {
            Some(id) => (AgentRequest::ProcSignal { id, signal }, reply),
            None => {
                let _ = reply.send(Err(not_running(pid)));
                return Ok(());
            }
        },
        ProcessOp::Resize { pid, size, reply } => match find(pid) {
            Some(id) => (
                AgentRequest::ProcResize {
                    id,
                    cols: size.cols,
                    rows: size.rows,
                },
                reply,
            ),
            None => {
                let _ = reply.send(Err(not_running(pid)));
                return Ok(());
            }
        },
    };
    let sent = current.agent.send(&request).await;
    let _ = reply.send(sent.clone());
    sent.map_err(|error| Broken { error, retry: None })
}
