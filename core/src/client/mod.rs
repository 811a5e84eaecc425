//! `Client`: one API over two transports, a remote server (HTTP + WebSocket) or the engine
//! in-process. Every binding wraps exactly this type.

mod files;
#[cfg(feature = "local")]
mod local;
pub(crate) mod remote;
pub(crate) mod trust;

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::error::{Error, ErrorKind, Result};
use crate::types::{
    Accepted, ByteStream, CheckpointInfo, ContextInfo, CreateMachineOptions, ExecEvent,
    ExecOptions, ExecResult, Execution, FileInfo, FileList, FileRead, InstallReport, Lineage,
    MachineHistory, MachineInfo, MachinePage, OutputChunk, Rewound, Tags, WriteFileOptions,
};

#[cfg(feature = "local")]
pub use local::LocalOptions;
pub use trust::{CA_FILE_ENV, Trust};

/// Output then the result of one instruction. Ends after the result.
pub type EventStream = BoxStream<'static, Result<ExecEvent>>;

/// What a transport must do. One method per operation; `Client` adds only conveniences.
/// How many instructions `Machine::history` lists when not told.
pub const DEFAULT_HISTORY_LIST: usize = 100;

#[async_trait]
pub(crate) trait Transport: Send + Sync + 'static {
    fn describe(&self) -> String;
    async fn whoami(&self) -> Result<String>;
    async fn create_machine(&self, options: CreateMachineOptions) -> Result<String>;
    async fn list_machines(&self, tags: &Tags) -> Result<Vec<MachineInfo>>;
    async fn list_machines_page(
        &self,
        tags: &Tags,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<MachinePage>;
    async fn machine_info(&self, name: &str) -> Result<MachineInfo>;
    async fn exec(&self, name: &str, code: &str, options: &ExecOptions) -> Result<Accepted>;
    async fn result(&self, name: &str, seq: i64) -> Result<ExecResult>;
    async fn events(&self, name: &str, seq: i64) -> Result<EventStream>;
    /// Interrupts the running instruction and cancels queued ones; with `seq`, that one alone.
    async fn interrupt(&self, name: &str, seq: Option<i64>) -> Result<bool>;
    async fn delete_machine(&self, name: &str) -> Result<()>;
    async fn swap_out(&self, name: &str) -> Result<()>;
    async fn fork(&self, name: &str, tags: Option<Tags>, at: Option<i64>) -> Result<String>;
    async fn create_checkpoint(
        &self,
        name: &str,
        checkpoint: Option<&str>,
    ) -> Result<CheckpointInfo>;
    async fn list_checkpoints(&self, name: &str) -> Result<Vec<CheckpointInfo>>;
    async fn rollback(&self, name: &str, checkpoint: &str) -> Result<MachineInfo>;
    async fn rewind(&self, name: &str, to: i64) -> Result<Rewound>;
    async fn history(&self, name: &str, limit: usize) -> Result<MachineHistory>;
    async fn lineage(&self, name: &str) -> Result<Lineage>;
    async fn install(&self, name: &str, requirements: &[String]) -> Result<InstallReport>;
    async fn delete_checkpoint(&self, name: &str, checkpoint: &str) -> Result<()>;
    async fn create_context(&self, name: &str, cwd: Option<&str>) -> Result<ContextInfo>;
    async fn list_contexts(&self, name: &str) -> Result<Vec<ContextInfo>>;
    async fn restart_context(&self, name: &str, context: &str) -> Result<ContextInfo>;
    async fn remove_context(&self, name: &str, context: &str) -> Result<()>;
    /// Writes `data` (of `length` bytes, when known) to `path` in the machine.
    async fn write_file(
        &self,
        name: &str,
        path: &str,
        data: ByteStream,
        length: Option<u64>,
        options: WriteFileOptions,
    ) -> Result<FileInfo>;
    async fn read_file(&self, name: &str, path: &str) -> Result<FileRead>;
    async fn stat_file(&self, name: &str, path: &str) -> Result<FileInfo>;
    async fn list_files(&self, name: &str, path: &str) -> Result<FileList>;
    async fn make_dir(&self, name: &str, path: &str, parents: bool) -> Result<FileInfo>;
    async fn remove_file(&self, name: &str, path: &str, recursive: bool) -> Result<FileInfo>;
    /// Stops an in-process engine (machines go to disk where the backend can); nothing for a
    /// remote server.
    async fn shutdown(&self) {}
    /// A session on a machine (`None`: a new one): over WebSocket for a remote server.
    async fn connect(&self, name: Option<&str>) -> Result<Box<dyn SessionTransport>>;
}

/// A connection-oriented session on one machine (a WebSocket REPL for a remote server).
#[async_trait]
pub(crate) trait SessionTransport: Send {
    fn machine_name(&self) -> &str;
    /// Sends an instruction; returns its seq once the server has accepted it.
    async fn send(&mut self, code: &str, options: &ExecOptions) -> Result<i64>;
    /// The next event of the instruction last sent.
    async fn next_event(&mut self) -> Result<ExecEvent>;
}

/// An evervm client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    transport: Arc<dyn Transport>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("transport", &self.transport.describe())
            .finish()
    }
}

impl Client {
    /// A client of the server at `url` (`http://host:port`), authenticating with `token`; over
    /// https, it trusts the default roots.
    pub fn remote(url: &str, token: &str) -> Result<Self> {
        Self::remote_trusting(url, token, &Trust::DefaultRoots)
    }

    /// A client of the server at `url` that verifies an https server by `trust` (a CA file of
    /// a self-hosted server's own, say). A CA file that cannot be read is an error naming it.
    pub fn remote_trusting(url: &str, token: &str, trust: &Trust) -> Result<Self> {
        Ok(Self {
            transport: Arc::new(remote::RemoteTransport::new(url, token, trust)?),
        })
    }

    /// A remote client from `EVERVM_URL` and `EVERVM_TOKEN`, trusting the CA file
    /// `EVERVM_CA_FILE` names when it is set.
    pub fn from_env() -> Result<Self> {
        let url = std::env::var("EVERVM_URL").map_err(|_| {
            Error::invalid(
                "EVERVM_URL is not set: give the server's URL, e.g. http://127.0.0.1:8080",
            )
        })?;
        let token = std::env::var("EVERVM_TOKEN").map_err(|_| {
            Error::invalid("EVERVM_TOKEN is not set: create one with `evervm token create`")
        })?;
        Self::remote_trusting(&url, &token, &Trust::from_option_or_env(None))
    }

    /// A client that runs the engine in this process (no server). The tokio runtime it is
    /// called in then runs the machines.
    #[cfg(feature = "local")]
    pub async fn local(options: LocalOptions) -> Result<Self> {
        Ok(Self {
            transport: Arc::new(local::LocalTransport::open(options).await?),
        })
    }

    /// A client of an engine already open in this process.
    #[cfg(feature = "local")]
    pub fn from_engine(engine: evervm_engine::Engine, account: evervm_engine::Account) -> Self {
        Self {
            transport: Arc::new(local::LocalTransport::new(engine, account)),
        }
    }

    /// Stops the in-process engine of a local client: resident machines are saved to disk
    /// (gVisor) so that the next engine on the home finds them, and the home is released. A
    /// remote client has nothing to stop.
    pub async fn shutdown(&self) {
        self.transport.shutdown().await;
    }

    /// Where this client points: a URL, or `local:<home>`.
    pub fn describe(&self) -> String {
        self.transport.describe()
    }

    /// The account this client acts for.
    pub async fn whoami(&self) -> Result<String> {
        self.transport.whoami().await
    }

    pub async fn create_machine(&self, options: CreateMachineOptions) -> Result<Machine> {
        let name = self.transport.create_machine(options).await?;
        Ok(self.machine(&name))
    }

    /// Machines carrying every given tag (all machines for an empty filter), newest first.
    pub async fn list_machines(&self, tags: &Tags) -> Result<Vec<MachineInfo>> {
        self.transport.list_machines(tags).await
    }

    /// One page of the machines carrying every tag, newest first: at most `limit` (1 to 1000),
    /// after `cursor` (a `next_cursor` an earlier page gave; `None` for the first page). The
    /// order is stable while machines come and go: none is listed twice.
    pub async fn list_machines_page(
        &self,
        tags: &Tags,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<MachinePage> {
        self.transport.list_machines_page(tags, limit, cursor).await
    }

    /// A handle on an existing machine. Nothing is checked until it is used.
    pub fn machine(&self, name: &str) -> Machine {
        Machine {
            transport: Arc::clone(&self.transport),
            name: name.to_owned(),
        }
    }

    /// Opens a session (a WebSocket REPL on a remote server) on a new machine.
    pub async fn connect_new(&self) -> Result<Session> {
        Ok(Session {
            inner: self.transport.connect(None).await?,
        })
    }
}

/// A machine: a persistent Python interpreter.
#[derive(Clone)]
pub struct Machine {
    transport: Arc<dyn Transport>,
    name: String,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Machine {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn info(&self) -> Result<MachineInfo> {
        self.transport.machine_info(&self.name).await
    }

    /// Runs code and waits for its output and result.
    pub async fn exec(&self, code: &str) -> Result<Execution> {
        self.exec_with(code, &ExecOptions::default()).await
    }

    pub async fn exec_with(&self, code: &str, options: &ExecOptions) -> Result<Execution> {
        let accepted = self.start(code, options).await?;
        collect(
            accepted.seq,
            self.transport.events(&self.name, accepted.seq).await?,
        )
        .await
    }

    /// Queues code and returns at once with its seq.
    pub async fn start(&self, code: &str, options: &ExecOptions) -> Result<Accepted> {
        self.transport.exec(&self.name, code, options).await
    }

    /// Runs code and streams its output as it comes, then the result.
    pub async fn stream(&self, code: &str, options: &ExecOptions) -> Result<(i64, EventStream)> {
        let accepted = self.start(code, options).await?;
        Ok((
            accepted.seq,
            self.transport.events(&self.name, accepted.seq).await?,
        ))
    }

    /// Waits for the result of an instruction (at once if it finished).
    pub async fn result(&self, seq: i64) -> Result<ExecResult> {
        self.transport.result(&self.name, seq).await
    }

    /// The output and result of an instruction: live if it runs, replayed if it finished.
    pub async fn events(&self, seq: i64) -> Result<EventStream> {
        self.transport.events(&self.name, seq).await
    }

    /// Interrupts the running instruction and cancels queued ones. True if there were any.
    pub async fn interrupt(&self) -> Result<bool> {
        self.transport.interrupt(&self.name, None).await
    }

    pub async fn delete(&self) -> Result<()> {
        self.transport.delete_machine(&self.name).await
    }

    /// Saves the machine (memory and files) to disk and releases its sandbox; the next
    /// instruction restores it. Not available on the process backend.
    pub async fn swap_out(&self) -> Result<()> {
        self.transport.swap_out(&self.name).await
    }

    /// A new machine from this one's current state (memory, files, everything), with its own
    /// tags (this machine's when `None`). Both carry on independently; the fork's `random` is
    /// reseeded. Not available on the process backend.
    pub async fn fork(&self, tags: Option<Tags>) -> Result<Machine> {
        let name = self.transport.fork(&self.name, tags, None).await?;
        Ok(Machine {
            transport: Arc::clone(&self.transport),
            name,
        })
    }

    /// A new machine from one of this machine's undo points: its state right after
    /// instruction `seq` (`-1`: before its first), with its own tags (this one's when `None`).
    /// This machine is not touched.
    pub async fn fork_at(&self, seq: i64, tags: Option<Tags>) -> Result<Machine> {
        let name = self.transport.fork(&self.name, tags, Some(seq)).await?;
        Ok(Machine {
            transport: Arc::clone(&self.transport),
            name,
        })
    }

    /// Saves the machine's current state as a named checkpoint (a generated name when `None`).
    pub async fn checkpoint(&self, name: Option<&str>) -> Result<CheckpointInfo> {
        self.transport.create_checkpoint(&self.name, name).await
    }

    /// The machine's checkpoints, oldest first.
    pub async fn checkpoints(&self) -> Result<Vec<CheckpointInfo>> {
        self.transport.list_checkpoints(&self.name).await
    }

    /// Installs packages from the server's package index (`requests==2.32.3`, dependencies
    /// included): binary wheels only, checked against their sha256, fetched by the server (the
    /// machine needs no network), unpacked into the machine's user site-packages and importable
    /// at once. They stay through swap, restart and fork.
    pub async fn install(&self, requirements: &[&str]) -> Result<InstallReport> {
        let requirements: Vec<String> = requirements.iter().map(|r| (*r).to_owned()).collect();
        self.transport.install(&self.name, &requirements).await
    }

    /// Returns the machine to a checkpoint's state; the instructions run since stay in its
    /// history, marked as rolled back.
    pub async fn rollback(&self, checkpoint: &str) -> Result<MachineInfo> {
        self.transport.rollback(&self.name, checkpoint).await
    }

    /// Interrupts instruction `seq` alone (cancelled while it waits, interrupted while it
    /// runs), leaving the machine's other instructions alone; false when it had finished.
    pub async fn interrupt_instruction(&self, seq: i64) -> Result<bool> {
        self.transport.interrupt(&self.name, Some(seq)).await
    }

    /// Makes one of the machine's undo points its state: the state right after instruction
    /// `seq` ran. The instructions after it stay in its history, marked rewound. The machine
    /// must keep a history (`CreateMachineOptions::history`); waits for a running instruction.
    pub async fn rewind(&self, seq: i64) -> Result<Rewound> {
        self.transport.rewind(&self.name, seq).await
    }

    /// Takes back the machine's last instruction: its state becomes what it was before it
    /// (the undo point before it; see [`Machine::rewind`]).
    pub async fn undo(&self) -> Result<Rewound> {
        self.transport.rewind(&self.name, -1).await
    }

    /// The machine's latest instructions (at most `limit`, 100 when `None`), oldest first, each
    /// with a short result, whether it was rewound and whether it can be rewound to.
    pub async fn history(&self, limit: Option<usize>) -> Result<MachineHistory> {
        self.transport
            .history(&self.name, limit.unwrap_or(DEFAULT_HISTORY_LIST))
            .await
    }

    /// The tree of forks this machine is in: its oldest ancestor still there and every machine
    /// forked from it since (parents first), each with its checkpoints and the instructions
    /// rewinds and rollbacks took back.
    pub async fn lineage(&self) -> Result<Lineage> {
        self.transport.lineage(&self.name).await
    }

    pub async fn delete_checkpoint(&self, checkpoint: &str) -> Result<()> {
        self.transport
            .delete_checkpoint(&self.name, checkpoint)
            .await
    }

    /// Makes a code context: another Python interpreter in the machine, with globals of its own,
    /// started in `cwd` (none: the machine's home), sharing the machine's files, packages and
    /// environment. Run code in it with [`ExecOptions::context`]. Swap, fork, checkpoints and
    /// history keep it with its variables.
    pub async fn create_context(&self, cwd: Option<&str>) -> Result<ContextInfo> {
        self.transport.create_context(&self.name, cwd).await
    }

    /// The machine's contexts: `default` (its own interpreter) first, then the others in the
    /// order made.
    pub async fn contexts(&self) -> Result<Vec<ContextInfo>> {
        self.transport.list_contexts(&self.name).await
    }

    /// Starts a context's interpreter again: its variables are gone.
    pub async fn restart_context(&self, context: &str) -> Result<ContextInfo> {
        self.transport.restart_context(&self.name, context).await
    }

    /// Removes a context, its interpreter stopped.
    pub async fn remove_context(&self, context: &str) -> Result<()> {
        self.transport.remove_context(&self.name, context).await
    }

    /// Opens a session (a WebSocket REPL on a remote server) on this machine.
    pub async fn connect(&self) -> Result<Session> {
        Ok(Session {
            inner: self.transport.connect(Some(&self.name)).await?,
        })
    }
}

/// Collects a stream into an `Execution`.
async fn collect(seq: i64, mut events: EventStream) -> Result<Execution> {
    let mut output = Vec::new();
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Output(chunk) => output.push(chunk),
            // The result repeats it.
            ExecEvent::Display(_) => {}
            ExecEvent::Result(result) => {
                return Ok(Execution {
                    seq,
                    output,
                    result,
                });
            }
        }
    }
    Err(Error::new(
        ErrorKind::Transport,
        format!("the stream of instruction {seq} ended without a result"),
    ))
}

/// A REPL session on one machine: instructions run one after another over one connection.
pub struct Session {
    inner: Box<dyn SessionTransport>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("machine", &self.inner.machine_name())
            .finish()
    }
}

impl Session {
    pub fn machine_name(&self) -> &str {
        self.inner.machine_name()
    }

    /// Runs code; `on_output` sees each line as it arrives. Returns everything collected
    /// (rich results shown on the way are in the result's `results`).
    pub async fn exec(
        &mut self,
        code: &str,
        options: &ExecOptions,
        mut on_output: impl FnMut(&OutputChunk) + Send,
    ) -> Result<Execution> {
        let seq = self.inner.send(code, options).await?;
        let mut output = Vec::new();
        loop {
            match self.inner.next_event().await? {
                ExecEvent::Output(chunk) => {
                    on_output(&chunk);
                    output.push(chunk);
                }
                ExecEvent::Display(_) => {}
                ExecEvent::Result(result) => {
                    return Ok(Execution {
                        seq,
                        output,
                        result,
                    });
                }
            }
        }
    }
}
