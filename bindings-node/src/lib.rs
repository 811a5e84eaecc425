//! The evervm client for Node.js: `evervm::Client` behind Node-API, each export a conversion, one
//! call and a conversion back. Every call runs on napi's tokio runtime, so none blocks the event
//! loop. `index.cjs` wraps this module: the error classes, `AbortSignal`, output callbacks and
//! async iteration live there.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use napi::bindgen_prelude::{Buffer, Either3};
use napi_derive::napi;

mod types;

pub use types::*;

type Result<T> = napi::Result<T>;

/// A failure as JS receives it: `<kind>: <message>`, which `index.cjs` turns into the error
/// class of that kind (an async export cannot give an error a `code` of its own).
fn to_js(e: evervm::Error) -> napi::Error {
    napi::Error::from_reason(format!("{}: {}", e.kind().as_str(), e.message()))
}

fn invalid(message: impl Into<String>) -> napi::Error {
    to_js(evervm::Error::new(evervm::ErrorKind::InvalidInput, message))
}

/// The names of the error kinds, in the order the engine declares them.
#[napi]
pub fn error_kinds() -> Vec<&'static str> {
    evervm::ErrorKind::ALL.iter().map(|k| k.as_str()).collect()
}

/// The default instruction timeout, in seconds.
#[napi]
pub fn default_timeout_seconds() -> f64 {
    evervm::DEFAULT_TIMEOUT.as_secs_f64()
}

/// The Python tool as a model sees it (the same in every evervm tool helper).
#[napi]
pub fn tool_spec() -> ToolSpec {
    ToolSpec {
        name: evervm::tool::NAME.into(),
        description: evervm::tool::DESCRIPTION.into(),
        code_description: evervm::tool::CODE_DESCRIPTION.into(),
    }
}

/// The text a model is given for a result: what it printed, then its error or value, then what
/// it displayed, each figure as a line saying it comes as an image.
#[napi]
pub fn tool_text(result: ExecResult) -> Result<String> {
    let mut results = Vec::with_capacity(result.results.len());
    for rich in result.results {
        let kind = evervm::RichKind::parse(&rich.kind)
            .ok_or_else(|| invalid(format!("unknown rich result kind {:?}", rich.kind)))?;
        results.push(evervm::RichResult {
            kind,
            data: rich.data,
        });
    }
    Ok(evervm::tool::model_text(
        &result.stdout,
        &result.stderr,
        result.value.as_deref(),
        result.error.as_deref(),
        &results,
    ))
}

/// `future` with its first steps taken on this, the JavaScript, thread (inside napi's runtime):
/// the request leaves before the call returns instead of after a tokio worker wakes to start it,
/// which on a small machine is tens of microseconds of every call. The rest runs on the runtime.
/// Only for futures whose first steps are quick and never block: they run on the event loop.
fn begun_here<T: Send + 'static>(
    future: impl Future<Output = Result<T>> + Send + 'static,
) -> impl Future<Output = Result<T>> + Send + 'static {
    let mut future = Box::pin(future);
    let first = napi::bindgen_prelude::within_runtime_if_available(|| {
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        future.as_mut().poll(&mut context)
    });
    async move {
        match first {
            std::task::Poll::Ready(done) => done,
            // Polled again by the runtime, which registers its own waker: a future must
            // tolerate a new waker on every poll, so nothing the first one missed is lost.
            std::task::Poll::Pending => future.await,
        }
    }
}

fn tags(map: Option<HashMap<String, String>>) -> evervm::Tags {
    map.unwrap_or_default().into_iter().collect()
}

fn exec_options(options: Option<ExecOptions>) -> Result<evervm::ExecOptions> {
    let options = options.unwrap_or_default();
    let timeout = match options.timeout_seconds {
        Some(secs) => evervm::timeout_from_secs(secs).map_err(to_js)?,
        None => evervm::DEFAULT_TIMEOUT,
    };
    let dialect = match options.dialect.as_deref() {
        None => evervm::Dialect::Python,
        Some(text) => evervm::Dialect::named(text).map_err(|e| to_js(e.into()))?,
    };
    Ok(evervm::ExecOptions {
        timeout,
        interrupt: options.interrupt.unwrap_or(false),
        dialect,
        context: options.context,
    })
}

/// A client: of the engine in this process (`openLocal`) or of a server (`openRemote`).
#[napi]
pub struct NativeClient {
    client: evervm::Client,
}

/// Runs the engine in this process.
#[napi]
pub async fn open_local(options: Option<LocalOptions>) -> Result<NativeClient> {
    let options = options.unwrap_or_default();
    let client = evervm::Client::local(evervm::LocalOptions {
        home: options.home.map(PathBuf::from),
        backend: options.backend,
        account: options.account,
        pool_size: options.pool_size.map(|n| n as usize),
    })
    .await
    .map_err(to_js)?;
    Ok(NativeClient { client })
}

/// A client of the server at `url` with `token` (`EVERVM_URL` and `EVERVM_TOKEN` when absent);
/// over https it trusts the default roots, or only the CA file `ca_file` (else
/// `EVERVM_CA_FILE`) names.
#[napi]
pub fn open_remote(
    url: Option<String>,
    token: Option<String>,
    ca_file: Option<String>,
) -> Result<NativeClient> {
    let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    let url = url.or_else(|| env("EVERVM_URL")).ok_or_else(|| {
        invalid(
            "no server given: pass { url } (or set EVERVM_URL), or use Client.local() to run the \
             engine in this process",
        )
    })?;
    let token = token
        .or_else(|| env("EVERVM_TOKEN"))
        .ok_or_else(|| invalid("no token given: pass { token } (or set EVERVM_TOKEN)"))?;
    let trust = evervm::Trust::from_option_or_env(ca_file.map(std::path::PathBuf::from));
    let client = evervm::Client::remote_trusting(&url, &token, &trust).map_err(to_js)?;
    Ok(NativeClient { client })
}

#[napi]
impl NativeClient {
    /// What the client talks to.
    #[napi]
    pub fn describe(&self) -> String {
        self.client.describe()
    }

    #[napi]
    pub async fn create_machine(
        &self,
        options: Option<CreateMachineOptions>,
    ) -> Result<NativeMachine> {
        let options = options.unwrap_or_default();
        let ttl = options
            .ttl_seconds
            .map(|secs| {
                Duration::try_from_secs_f64(secs)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| invalid(format!("ttlSeconds {secs} is not a positive number")))
            })
            .transpose()?;
        let options = evervm::CreateMachineOptions {
            tags: tags(options.tags),
            memory_mb: options.memory_mb,
            image: options.image,
            durability: options.durability,
            history: options.history,
            env: options.env.unwrap_or_default().into_iter().collect(),
            secret_env: evervm::SecretEnv(
                options.secret_env.unwrap_or_default().into_iter().collect(),
            ),
            ttl,
            expires_at: None,
            network: options
                .network
                .map(|network| match network {
                    napi::Either::A(mode) => evervm::NetworkPolicy::from_mode_name(&mode),
                    napi::Either::B(rules) => {
                        evervm::NetworkPolicy::new(evervm::NetworkMode::Allow, &rules)
                    }
                })
                .transpose()
                .map_err(|e| to_js(e.into()))?,
        };
        let machine = self.client.create_machine(options).await.map_err(to_js)?;
        Ok(NativeMachine { machine })
    }

    /// Machines carrying every one of `tags`, newest first.
    #[napi]
    pub async fn list_machines(
        &self,
        tags: Option<HashMap<String, String>>,
    ) -> Result<Vec<MachineInfo>> {
        let list = self
            .client
            .list_machines(&self::tags(tags))
            .await
            .map_err(to_js)?;
        Ok(list.into_iter().map(MachineInfo::from).collect())
    }

    /// A machine by name (nothing is checked until it is used).
    #[napi]
    pub fn machine(&self, name: String) -> NativeMachine {
        NativeMachine {
            machine: self.client.machine(&name),
        }
    }

    /// Stops the engine of a local client (its machines are swapped out where the backend can);
    /// nothing for a server's client.
    #[napi]
    pub async fn close(&self) {
        self.client.shutdown().await;
    }
}

/// One machine.
#[napi]
pub struct NativeMachine {
    machine: evervm::Machine,
}

#[napi]
impl NativeMachine {
    #[napi(getter)]
    pub fn name(&self) -> String {
        self.machine.name().to_owned()
    }

    /// Runs code and collects its output and result.
    #[napi(ts_return_type = "Promise<ExecResult>")]
    pub fn exec<'env>(
        &self,
        env: &'env napi::Env,
        code: String,
        options: Option<ExecOptions>,
    ) -> Result<napi::bindgen_prelude::PromiseRaw<'env, ExecResult>> {
        // Bad options reject the promise, as every failure of a call does.
        let options = exec_options(options);
        let machine = self.machine.clone();
        env.spawn_future(begun_here(async move {
            let options = options?;
            let run = machine.exec_with(&code, &options).await.map_err(to_js)?;
            Ok(ExecResult::from(run))
        }))
    }

    /// Starts code and streams its output, the rich results it shows, then its result.
    #[napi]
    pub async fn stream(&self, code: String, options: Option<ExecOptions>) -> Result<NativeStream> {
        let options = exec_options(options)?;
        let (seq, events) = self.machine.stream(&code, &options).await.map_err(to_js)?;
        Ok(NativeStream {
            state: Arc::new(tokio::sync::Mutex::new(StreamState {
                seq,
                events: Some(events),
                output: Vec::new(),
            })),
        })
    }

    /// Interrupts the running instruction (its state is kept); false when none ran.
    #[napi]
    pub async fn interrupt(&self) -> Result<bool> {
        self.machine.interrupt().await.map_err(to_js)
    }

    #[napi]
    pub async fn info(&self) -> Result<MachineInfo> {
        Ok(self.machine.info().await.map_err(to_js)?.into())
    }

    /// Installs packages from the server's package index (see `Machine.install`).
    #[napi]
    pub async fn install(&self, requirements: Vec<String>) -> Result<InstallReport> {
        let requirements: Vec<&str> = requirements.iter().map(String::as_str).collect();
        let report = self.machine.install(&requirements).await.map_err(to_js)?;
        Ok(report.into())
    }

    #[napi]
    pub async fn swap_out(&self) -> Result<()> {
        self.machine.swap_out().await.map_err(to_js)
    }

    /// A new machine from this one's current state, or with `at` from its undo point after
    /// instruction `at` (-1: before its first), which leaves this machine untouched.
    #[napi]
    pub async fn fork(
        &self,
        tags: Option<HashMap<String, String>>,
        at: Option<i64>,
    ) -> Result<NativeMachine> {
        let tags = tags.map(|t| self::tags(Some(t)));
        let machine = match at {
            Some(seq) => self.machine.fork_at(seq, tags).await,
            None => self.machine.fork(tags).await,
        }
        .map_err(to_js)?;
        Ok(NativeMachine { machine })
    }

    #[napi]
    pub async fn checkpoint(&self, name: Option<String>) -> Result<Checkpoint> {
        let info = self
            .machine
            .checkpoint(name.as_deref())
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }

    #[napi]
    pub async fn checkpoints(&self) -> Result<Vec<Checkpoint>> {
        let list = self.machine.checkpoints().await.map_err(to_js)?;
        Ok(list.into_iter().map(Checkpoint::from).collect())
    }

    #[napi]
    pub async fn rollback(&self, checkpoint: String) -> Result<MachineInfo> {
        Ok(self
            .machine
            .rollback(&checkpoint)
            .await
            .map_err(to_js)?
            .into())
    }

    /// Takes back the last instruction: the state becomes what it was before it.
    #[napi]
    pub async fn undo(&self) -> Result<Rewound> {
        Ok(self.machine.undo().await.map_err(to_js)?.into())
    }

    /// Makes the state right after instruction `seq` the machine's state (an undo point).
    #[napi]
    pub async fn rewind(&self, seq: i64) -> Result<Rewound> {
        Ok(self.machine.rewind(seq).await.map_err(to_js)?.into())
    }

    /// The latest instructions (at most `limit`, 100 when absent), oldest first.
    #[napi]
    pub async fn history(&self, limit: Option<u32>) -> Result<MachineHistory> {
        let history = self
            .machine
            .history(limit.map(|n| n as usize))
            .await
            .map_err(to_js)?;
        Ok(history.into())
    }

    /// The tree of forks this machine is in, parents first.
    #[napi]
    pub async fn lineage(&self) -> Result<Lineage> {
        Ok(self.machine.lineage().await.map_err(to_js)?.into())
    }

    #[napi]
    pub async fn delete_checkpoint(&self, checkpoint: String) -> Result<()> {
        self.machine
            .delete_checkpoint(&checkpoint)
            .await
            .map_err(to_js)
    }

    /// Makes a code context: another Python interpreter in the machine, with globals of its
    /// own, started in `cwd` (absent: the machine's home). Run code in it with `exec`'s
    /// `context`.
    #[napi]
    pub async fn create_context(&self, cwd: Option<String>) -> Result<Context> {
        let info = self
            .machine
            .create_context(cwd.as_deref())
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }

    /// The machine's contexts: `default` (its own interpreter) first, then the others in the
    /// order made.
    #[napi]
    pub async fn contexts(&self) -> Result<Vec<Context>> {
        let list = self.machine.contexts().await.map_err(to_js)?;
        Ok(list.into_iter().map(Context::from).collect())
    }

    /// Starts a context's interpreter again: its variables are gone.
    #[napi]
    pub async fn restart_context(&self, context: String) -> Result<Context> {
        let info = self
            .machine
            .restart_context(&context)
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }

    /// Removes a context, its interpreter stopped.
    #[napi]
    pub async fn remove_context(&self, context: String) -> Result<()> {
        self.machine.remove_context(&context).await.map_err(to_js)
    }

    #[napi]
    pub async fn delete(&self) -> Result<()> {
        self.machine.delete().await.map_err(to_js)
    }

    // --- files ---------------------------------------------------------------------------

    #[napi]
    pub async fn write_file(
        &self,
        path: String,
        data: Buffer,
        options: Option<WriteOptions>,
    ) -> Result<FileInfo> {
        let options = write_options(options);
        let data = bytes_of(data);
        let length = data.len() as u64;
        let stream = futures::stream::once(async move { Ok::<_, evervm::Error>(data) }).boxed();
        let info = self
            .machine
            .write_file_stream(&path, stream, Some(length), options)
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }

    /// Opens a streamed write of `path`: pieces go in with `write`, `finish` makes the file
    /// appear whole (or not at all, after `abort` or a failure). `length`, when known, lets a
    /// server refuse a file over its limit before any of it is sent.
    #[napi]
    pub fn open_write(
        &self,
        path: String,
        options: Option<WriteOptions>,
        length: Option<i64>,
    ) -> Result<NativeFileWriter> {
        let options = write_options(options);
        let length = match length {
            Some(n) => Some(u64::try_from(n).map_err(|_| invalid("length must not be negative"))?),
            None => None,
        };
        let (sender, receiver) = tokio::sync::mpsc::channel(WRITE_PIECES_IN_FLIGHT);
        let pieces = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|piece| (piece, receiver))
        })
        .boxed();
        let machine = self.machine.clone();
        let (done, task) = tokio::sync::oneshot::channel();
        napi::bindgen_prelude::spawn(async move {
            let outcome = machine
                .write_file_stream(&path, pieces, length, options)
                .await;
            // Nobody is waiting when the writer was dropped unfinished: nothing to tell.
            let _ = done.send(outcome);
        });
        Ok(NativeFileWriter {
            sender: tokio::sync::Mutex::new(Some(sender)),
            task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    /// Opens a streamed read of `path`: its information, then its pieces with `next`.
    #[napi]
    pub async fn open_read(&self, path: String) -> Result<NativeFileReader> {
        let read = self.machine.read_file_stream(&path).await.map_err(to_js)?;
        Ok(NativeFileReader {
            info: read.info.into(),
            pieces: tokio::sync::Mutex::new(Some(read.data)),
        })
    }

    #[napi]
    pub async fn read_file(&self, path: String) -> Result<Buffer> {
        let data = self.machine.read_file(&path).await.map_err(to_js)?;
        Ok(data.into())
    }

    #[napi]
    pub async fn stat_file(&self, path: String) -> Result<FileInfo> {
        Ok(self.machine.stat_file(&path).await.map_err(to_js)?.into())
    }

    #[napi]
    pub async fn list_files(&self, dir: String) -> Result<FileList> {
        Ok(self.machine.list_files(&dir).await.map_err(to_js)?.into())
    }

    #[napi]
    pub async fn make_dir(&self, path: String, parents: Option<bool>) -> Result<FileInfo> {
        let info = self
            .machine
            .make_dir(&path, parents.unwrap_or(false))
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }

    #[napi]
    pub async fn remove_file(&self, path: String, recursive: Option<bool>) -> Result<FileInfo> {
        let info = self
            .machine
            .remove_file(&path, recursive.unwrap_or(false))
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }

    /// Copies a local file into the machine, streamed.
    #[napi]
    pub async fn upload(
        &self,
        local: String,
        path: String,
        options: Option<WriteOptions>,
    ) -> Result<FileInfo> {
        let options = options.unwrap_or_default();
        let options = evervm::WriteFileOptions {
            mode: options.mode,
            make_parents: options.parents.unwrap_or(false),
        };
        let info = self
            .machine
            .upload(std::path::Path::new(&local), &path, options)
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }

    /// Copies a file of the machine to a local path, streamed.
    #[napi]
    pub async fn download(&self, path: String, local: String) -> Result<FileInfo> {
        let info = self
            .machine
            .download(&path, std::path::Path::new(&local))
            .await
            .map_err(to_js)?;
        Ok(info.into())
    }
}

fn write_options(options: Option<WriteOptions>) -> evervm::WriteFileOptions {
    let options = options.unwrap_or_default();
    evervm::WriteFileOptions {
        mode: options.mode,
        make_parents: options.parents.unwrap_or(false),
    }
}

/// Pieces of a streamed write waiting for the transport: `write` waits while they are this many,
/// so a fast producer holds at most this many pieces in memory.
const WRITE_PIECES_IN_FLIGHT: usize = 4;

/// How a streamed write ended, sent by the task that does it.
type WriteTask = tokio::sync::oneshot::Receiver<evervm::Result<evervm::FileInfo>>;

/// A streamed write of a machine's file (`Files.write` with a stream or an async iterable).
#[napi]
pub struct NativeFileWriter {
    sender: tokio::sync::Mutex<Option<tokio::sync::mpsc::Sender<evervm::Result<bytes::Bytes>>>>,
    task: tokio::sync::Mutex<Option<WriteTask>>,
}

impl NativeFileWriter {
    /// How the write ended (once; later calls say it is over).
    async fn outcome(&self) -> Result<FileInfo> {
        let Some(task) = self.task.lock().await.take() else {
            return Err(invalid("this write has already ended"));
        };
        match task.await {
            Ok(result) => Ok(result.map_err(to_js)?.into()),
            Err(_) => Err(to_js(evervm::Error::new(
                evervm::ErrorKind::Internal,
                "the write stopped without saying how it ended",
            ))),
        }
    }
}

#[napi]
impl NativeFileWriter {
    /// Adds a piece; waits while earlier pieces are still on their way.
    #[napi]
    pub async fn write(&self, piece: Buffer) -> Result<()> {
        let sent = match self.sender.lock().await.as_ref() {
            Some(sender) => sender.send(Ok(bytes_of(piece))).await.is_ok(),
            None => return Err(invalid("this write has already ended")),
        };
        if sent {
            return Ok(());
        }
        // The write ended early: its error says why.
        self.sender.lock().await.take();
        self.outcome().await?;
        Err(invalid("the write ended before all of the data was given"))
    }

    /// Ends the write: the file appears whole, and its information is returned.
    #[napi]
    pub async fn finish(&self) -> Result<FileInfo> {
        self.sender.lock().await.take();
        self.outcome().await
    }

    /// Abandons the write: what was at the path stays as it was.
    #[napi]
    pub async fn abort(&self, reason: String) -> Result<()> {
        if let Some(sender) = self.sender.lock().await.take() {
            let error = evervm::Error::new(evervm::ErrorKind::InvalidInput, reason);
            let _ = sender.send(Err(error)).await;
        }
        let _ = self.outcome().await;
        Ok(())
    }
}

/// A streamed read of a machine's file.
#[napi]
pub struct NativeFileReader {
    info: FileInfo,
    pieces: tokio::sync::Mutex<Option<evervm::ByteStream>>,
}

#[napi]
impl NativeFileReader {
    /// The file's information (its size, mode and modification time).
    #[napi(getter)]
    pub fn info(&self) -> FileInfo {
        self.info.clone()
    }

    /// The next piece, or `null` at the end; fails, never ends short, when the file cannot be
    /// read whole.
    #[napi]
    pub async fn next(&self) -> Result<Option<Buffer>> {
        let mut pieces = self.pieces.lock().await;
        let Some(stream) = pieces.as_mut() else {
            return Ok(None);
        };
        match stream.next().await {
            Some(Ok(piece)) => Ok(Some(Buffer::from(piece.to_vec()))),
            Some(Err(e)) => {
                *pieces = None;
                Err(to_js(e))
            }
            None => {
                *pieces = None;
                Ok(None)
            }
        }
    }
}

/// A Node `Buffer`'s bytes, copied once (the engine keeps them past the call).
fn bytes_of(data: Buffer) -> bytes::Bytes {
    bytes::Bytes::from(Vec::<u8>::from(data))
}

struct StreamState {
    seq: i64,
    events: Option<evervm::EventStream>,
    output: Vec<evervm::OutputChunk>,
}

/// An instruction's events as they come (`index.cjs` makes it an async iterable).
#[napi]
pub struct NativeStream {
    state: Arc<tokio::sync::Mutex<StreamState>>,
}

#[napi]
impl NativeStream {
    /// The next event: an output chunk, a rich result shown, or the result (with everything
    /// collected); `null` after the result.
    #[napi]
    pub async fn next(&self) -> Result<Option<Either3<OutputChunk, RichResult, ExecResult>>> {
        let mut state = self.state.lock().await;
        let Some(events) = state.events.as_mut() else {
            return Ok(None);
        };
        match events.next().await {
            Some(Ok(evervm::ExecEvent::Output(chunk))) => {
                state.output.push(chunk.clone());
                Ok(Some(Either3::A(chunk.into())))
            }
            Some(Ok(evervm::ExecEvent::Display(rich))) => Ok(Some(Either3::B(rich.into()))),
            Some(Ok(evervm::ExecEvent::Result(result))) => {
                state.events = None;
                let run = evervm::Execution {
                    seq: state.seq,
                    output: std::mem::take(&mut state.output),
                    result,
                };
                Ok(Some(Either3::C(run.into())))
            }
            Some(Err(e)) => {
                state.events = None;
                Err(to_js(e))
            }
            None => {
                state.events = None;
                Ok(None)
            }
        }
    }
}
