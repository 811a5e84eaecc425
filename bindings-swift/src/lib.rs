//! evervm for Swift: `evervm::Client` (remote) exported with uniffi. Each export converts its
//! arguments, makes one client call on this library's own tokio runtime and converts the answer;
//! `Sources/Evervm/Evervm+Concurrency.swift` adds what uniffi cannot generate (an `exec` and an
//! `AsyncSequence` of events that a cancelled `Task` interrupts).
//!
//! Swift's generated code does not tell Rust when a `Task` is cancelled (uniffi 0.32), so an
//! instruction is started by a call that returns a handle at once ([`PendingExecution`],
//! [`ExecStream`]), whose `cancel()` the Swift wrapper calls from a cancellation handler.

mod types;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;

pub use types::*;

uniffi::setup_scaffolding!();

/// The runtime every call runs on (so that a Swift caller's threads only wait).
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("evervm")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EvervmError::Internal {
            message: format!("cannot start evervm's runtime: {e}"),
        })
}

/// A task on the runtime, aborted when whoever waits for it stops waiting.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// Runs `work` on the runtime; dropping the returned future (a cancelled caller) aborts it.
async fn on_runtime<T: Send + 'static>(
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let task = AbortOnDrop(runtime()?.spawn(work));
    task.await.map_err(|e| EvervmError::Internal {
        message: format!("the call did not finish: {e}"),
    })?
}

fn tag_map(map: Option<HashMap<String, String>>) -> evervm::Tags {
    map.unwrap_or_default().into_iter().collect()
}

fn exec_options(
    timeout_seconds: Option<f64>,
    context: Option<String>,
) -> Result<evervm::ExecOptions> {
    let mut options = evervm::ExecOptions {
        context,
        ..evervm::ExecOptions::default()
    };
    if let Some(seconds) = timeout_seconds {
        let max = evervm::MAX_TIMEOUT.as_secs_f64();
        if !(seconds.is_finite() && seconds > 0.0 && seconds <= max) {
            return Err(EvervmError::invalid(format!(
                "timeoutSeconds must be more than 0 and at most {max}, not {seconds}"
            )));
        }
        options.timeout = Duration::from_secs_f64(seconds);
    }
    Ok(options)
}

/// A connection to an evervm (or ForeverVM-compatible) server.
#[derive(uniffi::Object)]
pub struct Client {
    client: evervm::Client,
}

#[uniffi::export]
impl Client {
    /// A client of the server at `url` with `token` (`evervm token create` makes one).
    #[uniffi::constructor]
    pub fn new(url: String, token: String) -> Result<Arc<Self>> {
        Ok(Arc::new(Self {
            client: evervm::Client::remote(&url, &token)?,
        }))
    }

    /// A client of the server at `url` with `token` that trusts only the certificates in the
    /// PEM file `caFile` over https (a self-hosted server's own CA).
    #[uniffi::constructor]
    pub fn trusting(url: String, token: String, ca_file: String) -> Result<Arc<Self>> {
        let trust = evervm::Trust::CaFile(ca_file.into());
        Ok(Arc::new(Self {
            client: evervm::Client::remote_trusting(&url, &token, &trust)?,
        }))
    }

    /// A client of `EVERVM_URL` with `EVERVM_TOKEN`, trusting the CA file `EVERVM_CA_FILE`
    /// names when it is set.
    #[uniffi::constructor]
    pub fn from_environment() -> Result<Arc<Self>> {
        Ok(Arc::new(Self {
            client: evervm::Client::from_env()?,
        }))
    }

    /// Creates a machine. `memoryMb`, `image` (`data`, `minimal`), `durability` (`idle`,
    /// `instruction`), `history` (how many undo points it keeps; gVisor only) and `ttlSeconds`
    /// take the server's defaults when nil.
    #[uniffi::method(default(
        tags = None,
        memory_mb = None,
        image = None,
        durability = None,
        history = None,
        env = None,
        secret_env = None,
        ttl_seconds = None,
        network = None,
        network_allow = None
    ))]
    #[allow(clippy::too_many_arguments)]
    pub async fn create_machine(
        &self,
        tags: Option<HashMap<String, String>>,
        memory_mb: Option<u32>,
        image: Option<String>,
        durability: Option<String>,
        history: Option<u32>,
        env: Option<HashMap<String, String>>,
        secret_env: Option<HashMap<String, String>>,
        ttl_seconds: Option<f64>,
        network: Option<String>,
        network_allow: Option<Vec<String>>,
    ) -> Result<Arc<Machine>> {
        let ttl = match ttl_seconds {
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => {
                return Err(EvervmError::invalid(format!(
                    "ttlSeconds must be a positive number, not {s}"
                )));
            }
            None => None,
        };
        // `network` is `none`, `public` or `allow`; an allow list may come alone.
        let network = match (network.as_deref(), network_allow) {
            (None | Some("allow"), Some(rules)) => Some(
                evervm::NetworkPolicy::new(evervm::NetworkMode::Allow, &rules)
                    .map_err(|e| EvervmError::from(evervm::Error::from(e)))?,
            ),
            (Some(mode), None) => Some(
                evervm::NetworkPolicy::from_mode_name(mode)
                    .map_err(|e| EvervmError::from(evervm::Error::from(e)))?,
            ),
            (Some(mode), Some(_)) => {
                return Err(EvervmError::invalid(format!(
                    "networkAllow goes with the network `allow`, not `{mode}`"
                )));
            }
            (None, None) => None,
        };
        let options = evervm::CreateMachineOptions {
            tags: tag_map(tags),
            memory_mb,
            image,
            durability,
            history,
            env: env.unwrap_or_default().into_iter().collect(),
            secret_env: evervm::SecretEnv(secret_env.unwrap_or_default().into_iter().collect()),
            ttl,
            network,
            ..evervm::CreateMachineOptions::default()
        };
        let client = self.client.clone();
        let machine = on_runtime(async move { Ok(client.create_machine(options).await?) }).await?;
        Ok(Arc::new(Machine { machine }))
    }

    /// The machines, newest first; with `tags`, those carrying all of them.
    #[uniffi::method(default(tags = None))]
    pub async fn list_machines(
        &self,
        tags: Option<HashMap<String, String>>,
    ) -> Result<Vec<MachineInfo>> {
        let client = self.client.clone();
        let tags = tag_map(tags);
        let list = on_runtime(async move { Ok(client.list_machines(&tags).await?) }).await?;
        Ok(list.into_iter().map(Into::into).collect())
    }

    /// A machine by name (nothing is asked of the server until it is used).
    pub fn machine(&self, name: String) -> Arc<Machine> {
        Arc::new(Machine {
            machine: self.client.machine(&name),
        })
    }

    /// The account the token acts for.
    pub async fn whoami(&self) -> Result<String> {
        let client = self.client.clone();
        on_runtime(async move { Ok(client.whoami().await?) }).await
    }
}

/// A machine: a persistent Python interpreter.
#[derive(uniffi::Object)]
pub struct Machine {
    machine: evervm::Machine,
}

/// Waits for `seq`'s result, collecting its output; ends with `Cancelled` once `cancel` says so
/// (after interrupting the instruction).
async fn collect(
    machine: &evervm::Machine,
    seq: i64,
    mut events: evervm::EventStream,
    mut cancel: tokio::sync::watch::Receiver<bool>,
) -> Result<ExecResult> {
    let mut output = Vec::new();
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(evervm::ExecEvent::Output(chunk))) => output.push(chunk),
                Some(Ok(evervm::ExecEvent::Display(_))) => {}
                Some(Ok(evervm::ExecEvent::Result(result))) => {
                    return Ok(evervm::Execution { seq, output, result }.into());
                }
                Some(Err(e)) => return Err(e.into()),
                None => {
                    return Err(EvervmError::Transport {
                        message: format!("the stream of instruction {seq} ended without a result"),
                    });
                }
            },
            () = until_cancelled(&mut cancel) => {
                return Err(interrupted(machine, seq).await);
            }
        }
    }
}

/// Completes once `cancel` says so; never when its sender is gone without saying so (a handle
/// dropped by a caller that stopped caring is no cancel).
async fn until_cancelled(cancel: &mut tokio::sync::watch::Receiver<bool>) {
    if cancel.wait_for(|cancelled| *cancelled).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Interrupts `seq` for a cancelled caller; the error that caller gets.
async fn interrupted(machine: &evervm::Machine, seq: i64) -> EvervmError {
    match machine.interrupt().await {
        Ok(_) => EvervmError::Cancelled {
            message: format!(
                "cancelled: instruction {seq} was interrupted and the machine kept its state"
            ),
        },
        Err(e) => EvervmError::Cancelled {
            message: format!("cancelled, but interrupting instruction {seq} failed: {e}"),
        },
    }
}

#[uniffi::export]
impl Machine {
    pub fn name(&self) -> String {
        self.machine.name().to_owned()
    }

    /// Starts `code` and returns at once; `result()` waits for how it ended, `cancel()`
    /// interrupts it. (Swift's `exec(code:timeoutSeconds:context:)` is this, cancelled with its
    /// `Task`.) `context` is a context's id from `createContext` (nil: the machine's own
    /// interpreter); an unknown one ends the instruction with the exception `ContextNotFound`.
    #[uniffi::method(default(timeout_seconds = None, context = None))]
    pub fn start_exec(
        &self,
        code: String,
        timeout_seconds: Option<f64>,
        context: Option<String>,
    ) -> Result<Arc<PendingExecution>> {
        let options = exec_options(timeout_seconds, context)?;
        let machine = self.machine.clone();
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        let task = runtime()?.spawn(async move {
            // Started whatever happens (a cancel meanwhile interrupts it right after), so that
            // an instruction is never left running for a caller that gave up.
            let (seq, events) = machine.stream(&code, &options).await?;
            collect(&machine, seq, events, cancelled).await
        });
        Ok(Arc::new(PendingExecution {
            cancel,
            task: tokio::sync::Mutex::new(Some(AbortOnDrop(task))),
        }))
    }

    /// Starts `code` and streams its output and rich results as they come, then its result;
    /// in the context `context` when given (as `startExec`).
    #[uniffi::method(default(timeout_seconds = None, context = None))]
    pub fn stream(
        &self,
        code: String,
        timeout_seconds: Option<f64>,
        context: Option<String>,
    ) -> Result<Arc<ExecStream>> {
        let options = exec_options(timeout_seconds, context)?;
        let machine = self.machine.clone();
        let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let producer = runtime()?.spawn(async move {
            let started = machine.stream(&code, &options).await;
            let (seq, mut events) = match started {
                Ok(started) => started,
                Err(e) => {
                    let _ = sender.send(Err(e.into())).await;
                    return;
                }
            };
            let mut output = Vec::new();
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    () = until_cancelled(&mut cancelled) => {
                        let _ = sender.send(Err(interrupted(&machine, seq).await)).await;
                        return;
                    }
                };
                let item = match event {
                    Some(Ok(evervm::ExecEvent::Output(chunk))) => {
                        output.push(chunk.clone());
                        ExecEvent::Output {
                            chunk: chunk.into(),
                        }
                    }
                    Some(Ok(evervm::ExecEvent::Display(rich))) => ExecEvent::Rich {
                        result: rich.into(),
                    },
                    Some(Ok(evervm::ExecEvent::Result(result))) => {
                        let output = std::mem::take(&mut output);
                        let result = evervm::Execution {
                            seq,
                            output,
                            result,
                        };
                        let _ = sender
                            .send(Ok(ExecEvent::Finished {
                                result: result.into(),
                            }))
                            .await;
                        return;
                    }
                    Some(Err(e)) => {
                        let _ = sender.send(Err(e.into())).await;
                        return;
                    }
                    None => return,
                };
                if sender.send(Ok(item)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Arc::new(ExecStream {
            cancel,
            events: tokio::sync::Mutex::new(receiver),
            producer: producer.abort_handle(),
        }))
    }

    /// Interrupts the running instruction and cancels queued ones (the state is kept); false
    /// when nothing ran.
    pub async fn interrupt(&self) -> Result<bool> {
        let machine = self.machine.clone();
        on_runtime(async move { Ok(machine.interrupt().await?) }).await
    }

    pub async fn info(&self) -> Result<MachineInfo> {
        let machine = self.machine.clone();
        Ok(on_runtime(async move { Ok(machine.info().await?) })
            .await?
            .into())
    }

    /// Installs packages from the server's package index (`["requests==2.32.3"]`, dependencies
    /// included): binary wheels only, hash-checked, fetched by the server, so the machine needs
    /// no network. Importable at once; kept through swap, restart and fork.
    pub async fn install(&self, requirements: Vec<String>) -> Result<InstallReport> {
        let machine = self.machine.clone();
        let report = on_runtime(async move {
            let requirements: Vec<&str> = requirements.iter().map(String::as_str).collect();
            Ok(machine.install(&requirements).await?)
        })
        .await?;
        Ok(report.into())
    }

    /// Saves the machine to disk and releases its memory; its next instruction restores it.
    pub async fn swap_out(&self) -> Result<()> {
        let machine = self.machine.clone();
        on_runtime(async move { Ok(machine.swap_out().await?) }).await
    }

    /// A new machine from this one's current state (its tags unless `tags` are given); with
    /// `at`, from its undo point after instruction `at` (-1: before its first), which leaves
    /// this machine untouched.
    #[uniffi::method(default(tags = None, at = None))]
    pub async fn fork(
        &self,
        tags: Option<HashMap<String, String>>,
        at: Option<i64>,
    ) -> Result<Arc<Machine>> {
        let machine = self.machine.clone();
        let tags = tags.map(|t| t.into_iter().collect());
        let copy = on_runtime(async move {
            Ok(match at {
                Some(seq) => machine.fork_at(seq, tags).await?,
                None => machine.fork(tags).await?,
            })
        })
        .await?;
        Ok(Arc::new(Machine { machine: copy }))
    }

    /// Saves the machine's state under `name` (made up when nil).
    #[uniffi::method(default(name = None))]
    pub async fn checkpoint(&self, name: Option<String>) -> Result<Checkpoint> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.checkpoint(name.as_deref()).await?) })
                .await?
                .into(),
        )
    }

    /// The checkpoints, oldest first.
    pub async fn checkpoints(&self) -> Result<Vec<Checkpoint>> {
        let machine = self.machine.clone();
        let list = on_runtime(async move { Ok(machine.checkpoints().await?) }).await?;
        Ok(list.into_iter().map(Into::into).collect())
    }

    /// Returns the machine to a checkpoint's state.
    pub async fn rollback(&self, checkpoint: String) -> Result<MachineInfo> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.rollback(&checkpoint).await?) })
                .await?
                .into(),
        )
    }

    /// Takes back the last instruction: the state becomes what it was before it. The machine
    /// must keep a history (`createMachine(history:)`).
    pub async fn undo(&self) -> Result<Rewound> {
        let machine = self.machine.clone();
        Ok(on_runtime(async move { Ok(machine.undo().await?) })
            .await?
            .into())
    }

    /// Makes the state right after instruction `seq` the machine's state (one of its undo
    /// points); the instructions after it stay in its history, marked rewound.
    pub async fn rewind(&self, seq: i64) -> Result<Rewound> {
        let machine = self.machine.clone();
        Ok(on_runtime(async move { Ok(machine.rewind(seq).await?) })
            .await?
            .into())
    }

    /// The latest instructions (at most `limit`, 100 when nil), oldest first, and which of them
    /// can be rewound to.
    #[uniffi::method(default(limit = None))]
    pub async fn history(&self, limit: Option<u32>) -> Result<MachineHistory> {
        let machine = self.machine.clone();
        let limit = limit.map(|n| n as usize);
        Ok(on_runtime(async move { Ok(machine.history(limit).await?) })
            .await?
            .into())
    }

    /// The tree of forks this machine is in: its oldest ancestor still there (`root`) and every
    /// machine forked from it since, parents first, each with its checkpoints and the
    /// instructions rewinds and rollbacks took back.
    pub async fn lineage(&self) -> Result<Lineage> {
        let machine = self.machine.clone();
        Ok(on_runtime(async move { Ok(machine.lineage().await?) })
            .await?
            .into())
    }

    pub async fn delete_checkpoint(&self, checkpoint: String) -> Result<()> {
        let machine = self.machine.clone();
        on_runtime(async move { Ok(machine.delete_checkpoint(&checkpoint).await?) }).await
    }

    /// Makes a code context: another Python interpreter in the machine, with globals of its
    /// own, started in `cwd` (nil: the machine's home), sharing its files, packages and
    /// environment. Run code in it with `exec(code:context:)`.
    #[uniffi::method(default(cwd = None))]
    pub async fn create_context(&self, cwd: Option<String>) -> Result<Context> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.create_context(cwd.as_deref()).await?) })
                .await?
                .into(),
        )
    }

    /// The machine's contexts: `default` (its own interpreter) first, then the others in the
    /// order made.
    pub async fn contexts(&self) -> Result<Vec<Context>> {
        let machine = self.machine.clone();
        let list = on_runtime(async move { Ok(machine.contexts().await?) }).await?;
        Ok(list.into_iter().map(Into::into).collect())
    }

    /// Starts a context's interpreter again: its variables are gone.
    pub async fn restart_context(&self, context: String) -> Result<Context> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.restart_context(&context).await?) })
                .await?
                .into(),
        )
    }

    /// Removes a context, its interpreter stopped.
    pub async fn remove_context(&self, context: String) -> Result<()> {
        let machine = self.machine.clone();
        on_runtime(async move { Ok(machine.remove_context(&context).await?) }).await
    }

    /// Deletes the machine, its state and its history.
    pub async fn delete(&self) -> Result<()> {
        let machine = self.machine.clone();
        on_runtime(async move { Ok(machine.delete().await?) }).await
    }

    /// Writes `data` to `path` (relative paths are under the machine's home), whole or not at
    /// all.
    pub async fn write_file(&self, path: String, data: Vec<u8>) -> Result<FileInfo> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.write_file(&path, data).await?) })
                .await?
                .into(),
        )
    }

    pub async fn read_file(&self, path: String) -> Result<Vec<u8>> {
        let machine = self.machine.clone();
        on_runtime(async move { Ok(machine.read_file(&path).await?) }).await
    }

    pub async fn stat_file(&self, path: String) -> Result<FileInfo> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.stat_file(&path).await?) })
                .await?
                .into(),
        )
    }

    /// A directory's entries (`~` is the machine's home).
    #[uniffi::method(default(dir = "~"))]
    pub async fn list_files(&self, dir: String) -> Result<FileList> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.list_files(&dir).await?) })
                .await?
                .into(),
        )
    }

    #[uniffi::method(default(parents = false))]
    pub async fn make_dir(&self, path: String, parents: bool) -> Result<FileInfo> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.make_dir(&path, parents).await?) })
                .await?
                .into(),
        )
    }

    #[uniffi::method(default(recursive = false))]
    pub async fn remove_file(&self, path: String, recursive: bool) -> Result<FileInfo> {
        let machine = self.machine.clone();
        Ok(
            on_runtime(async move { Ok(machine.remove_file(&path, recursive).await?) })
                .await?
                .into(),
        )
    }
}

/// An instruction started by `startExec`.
#[derive(uniffi::Object)]
pub struct PendingExecution {
    cancel: tokio::sync::watch::Sender<bool>,
    task: tokio::sync::Mutex<Option<AbortOnDrop<Result<ExecResult>>>>,
}

#[uniffi::export]
impl PendingExecution {
    /// How the instruction ended (once; a second call is an error).
    pub async fn result(&self) -> Result<ExecResult> {
        let mut slot = self.task.lock().await;
        let Some(task) = slot.as_mut() else {
            return Err(EvervmError::invalid(
                "this instruction's result was already taken",
            ));
        };
        let result = task.await;
        *slot = None;
        result.map_err(|e| EvervmError::Internal {
            message: format!("the instruction's task did not finish: {e}"),
        })?
    }

    /// Interrupts the instruction (the machine keeps its state); `result()` then fails with
    /// `Cancelled`.
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }
}

/// The events of an instruction started by `stream`.
#[derive(uniffi::Object)]
pub struct ExecStream {
    cancel: tokio::sync::watch::Sender<bool>,
    events: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Result<ExecEvent>>>,
    producer: tokio::task::AbortHandle,
}

impl Drop for ExecStream {
    fn drop(&mut self) {
        // Nobody reads any more: stop reading from the server (the instruction runs on).
        self.producer.abort();
    }
}

#[uniffi::export]
impl ExecStream {
    /// The next event, or nil after the result.
    pub async fn next(&self) -> Result<Option<ExecEvent>> {
        self.events.lock().await.recv().await.transpose()
    }

    /// Interrupts the instruction (the machine keeps its state); the stream then ends with
    /// `Cancelled`.
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }
}
