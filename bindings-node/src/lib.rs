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

fn tags(map: Option<HashMap<String, String>>) -> evervm::Tags {
    map.unwrap_or_default().into_iter().collect()
}

fn exec_options(options: Option<ExecOptions>) -> Result<evervm::ExecOptions> {
    let options = options.unwrap_or_default();
    let timeout = match options.timeout_seconds {
        Some(secs) => evervm::timeout_from_secs(secs).map_err(to_js)?,
        None => evervm::DEFAULT_TIMEOUT,
    };
    Ok(evervm::ExecOptions {
        timeout,
        interrupt: options.interrupt.unwrap_or(false),
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

/// A client of the server at `url` with `token` (`EVERVM_URL` and `EVERVM_TOKEN` when absent).
#[napi]
pub fn open_remote(url: Option<String>, token: Option<String>) -> Result<NativeClient> {
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
    let client = evervm::Client::remote(&url, &token).map_err(to_js)?;
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
            env: options.env.unwrap_or_default().into_iter().collect(),
            secret_env: evervm::SecretEnv(
                options.secret_env.unwrap_or_default().into_iter().collect(),
            ),
            ttl,
            expires_at: None,
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
    #[napi]
    pub async fn exec(&self, code: String, options: Option<ExecOptions>) -> Result<ExecResult> {
        let options = exec_options(options)?;
        let run = self
            .machine
            .exec_with(&code, &options)
            .await
            .map_err(to_js)?;
        Ok(ExecResult::from(run))
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

    #[napi]
    pub async fn swap_out(&self) -> Result<()> {
        self.machine.swap_out().await.map_err(to_js)
    }

    #[napi]
    pub async fn fork(&self, tags: Option<HashMap<String, String>>) -> Result<NativeMachine> {
        let tags = tags.map(|t| self::tags(Some(t)));
        let machine = self.machine.fork(tags).await.map_err(to_js)?;
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

    #[napi]
    pub async fn delete_checkpoint(&self, checkpoint: String) -> Result<()> {
        self.machine
            .delete_checkpoint(&checkpoint)
            .await
            .map_err(to_js)
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
        let options = options.unwrap_or_default();
        let options = evervm::WriteFileOptions {
            mode: options.mode,
            make_parents: options.parents.unwrap_or(false),
        };
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
