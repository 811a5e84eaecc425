//! File operations on a machine, run by its task between instructions: a file operation waits
//! for the instruction running and those accepted before it, and instructions accepted after it
//! wait for it. A swapped machine is restored first.
//!
//! Data is streamed both ways in pieces (never whole in memory): a write's pieces go to the agent
//! as they come from the caller, a read's go to the caller as they come from the agent, through a
//! small bounded queue. A caller that stops sending or reading for [`STALL_TIMEOUT`] loses the
//! operation; an agent that does not answer within [`AGENT_TIMEOUT`], or answers what the
//! protocol does not allow (more data than it announced, an event out of place), loses its
//! sandbox, like any other broken channel.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use super::MachineHandle;
use super::swap::{Save, save};
use super::task::{lost, take_resident};
use crate::engine::EngineInner;
use crate::error::{Error, ErrorKind, Result};
use crate::files::{ByteStream, FileInfo, FileList, FileRead, MAX_LIST_ENTRIES, WriteFileOptions};
use crate::guest::channel::{AgentEvent, AgentRequest, FileFailure};
use crate::pool::Resident;
use crate::types::Durability;

/// How long the agent may take to answer one step of a file operation.
const AGENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a caller may leave a write without data, or a read's data unread.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest piece of a write sent to the agent in one frame.
const WRITE_PIECE: usize = 1024 * 1024;
/// Pieces of a read waiting for the caller.
const READ_QUEUE: usize = 8;

/// What a caller asks of a machine's files.
pub(crate) enum FileOperation {
    Stat {
        path: String,
    },
    List {
        path: String,
    },
    MakeDir {
        path: String,
        parents: bool,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Read {
        path: String,
    },
    Write {
        path: String,
        options: WriteFileOptions,
        data: ByteStream,
    },
    /// Packages from the index, unpacked into the machine (`crate::packages`).
    Install {
        requirements: Vec<String>,
    },
    /// Makes, lists, restarts or removes the machine's contexts (`contexts.py`).
    Context(ContextOperation),
}

/// What a context operation does.
#[derive(Debug)]
pub(crate) enum ContextOperation {
    Create { cwd: Option<String> },
    List,
    Restart { context: String },
    Remove { context: String },
}

impl FileOperation {
    fn changes_state(&self) -> bool {
        matches!(
            self,
            FileOperation::MakeDir { .. }
                | FileOperation::Remove { .. }
                | FileOperation::Write { .. }
                | FileOperation::Install { .. }
                | FileOperation::Context(
                    ContextOperation::Create { .. }
                        | ContextOperation::Restart { .. }
                        | ContextOperation::Remove { .. }
                )
        )
    }
}

/// What a file operation gives back.
pub(crate) enum FileOutcome {
    Info(FileInfo),
    List(FileList),
    Read(FileRead),
    Installed(crate::packages::InstallReport),
    /// The contexts a context operation concerned.
    Contexts(Vec<crate::ContextInfo>),
}

/// A file operation in the machine's queue, and where its answer goes.
pub(super) struct FileJob {
    pub(super) operation: FileOperation,
    pub(super) reply: oneshot::Sender<Result<FileOutcome>>,
}

/// Runs one file operation on the machine's sandbox (acquiring one if it has none).
pub(super) async fn run(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    job: FileJob,
) {
    let FileJob { operation, reply } = job;
    let changes_state = operation.changes_state();
    let mut current = match take_resident(engine, machine, resident).await {
        Ok(current) => current,
        Err(e) => {
            let _ = reply.send(Err(e.context("the machine could not start")));
            return;
        }
    };
    if changes_state {
        machine.mark_unsaved(engine).await;
    }
    let roots = file_roots(engine);
    let limit = engine.config.limits.max_file_bytes;
    let outcome = match operation {
        FileOperation::Read { path } => {
            let request = AgentRequest::Read { path, roots, limit };
            read(&engine.metrics, &mut current, request, reply).await
        }
        FileOperation::Write {
            path,
            options,
            data,
        } => {
            let request = AgentRequest::Write {
                path,
                roots,
                mode: options.mode,
                parents: options.make_parents,
                metadata: options.metadata,
            };
            let written = write(&engine.metrics, &mut current, request, data, limit).await;
            send_answer(reply, written.map(|r| r.map(FileOutcome::Info)))
        }
        FileOperation::Stat { path } => {
            let request = AgentRequest::Stat { path, roots };
            send_answer(reply, simple(&mut current, &request, false).await)
        }
        FileOperation::List { path } => {
            let request = AgentRequest::List {
                path,
                roots,
                limit: MAX_LIST_ENTRIES,
            };
            send_answer(reply, simple(&mut current, &request, true).await)
        }
        FileOperation::MakeDir { path, parents } => {
            let request = AgentRequest::Mkdir {
                path,
                roots,
                parents,
            };
            send_answer(reply, simple(&mut current, &request, false).await)
        }
        FileOperation::Install { requirements } => {
            let installed = install(engine, &mut current, &requirements).await;
            send_answer(reply, installed.map(|r| r.map(FileOutcome::Installed)))
        }
        FileOperation::Context(operation) => {
            let answered = context(machine.name.as_str(), &mut current, operation).await;
            send_answer(reply, answered)
        }
        FileOperation::Remove { path, recursive } => {
            let request = AgentRequest::Remove {
                path,
                roots,
                recursive,
            };
            send_answer(reply, simple(&mut current, &request, false).await)
        }
    };
    match outcome {
        Ok(()) => *resident = Some(current),
        Err(broken) => {
            lost(engine, machine, current, broken.to_string()).await;
            return;
        }
    }
    let durable = changes_state
        && machine.durability == Durability::Instruction
        && engine.backend.capabilities().snapshots
        && !machine.deleted.load(Ordering::SeqCst);
    if durable && let Err(e) = save(engine, machine, resident, Save::InPlace).await {
        tracing::error!(machine = %machine.name, "saving after a file operation failed: {e}");
    }
}

/// The directories a caller's paths may touch in the machine (none: its home).
pub(super) fn file_roots(engine: &EngineInner) -> Vec<String> {
    engine
        .backend
        .file_roots()
        .iter()
        .map(|root| (*root).to_owned())
        .collect()
}

/// Hands the answer of an operation that ended to its caller. An `Err` outside means the channel
/// broke (the caller is told so), an inner `Err` that the agent refused.
fn send_answer(
    reply: oneshot::Sender<Result<FileOutcome>>,
    answered: Result<Result<FileOutcome>>,
) -> Result<()> {
    match answered {
        Ok(answer) => {
            let _ = reply.send(answer);
            Ok(())
        }
        Err(broken) => {
            let _ = reply.send(Err(broken.clone().context("the machine's sandbox stopped")));
            Err(broken)
        }
    }
}

/// The agent's next event for a file operation. Output written meanwhile (by a thread the
/// machine's code left running) belongs to no instruction and is dropped.
async fn next_file_event(current: &mut Resident) -> Result<AgentEvent> {
    let waited = tokio::time::timeout(AGENT_TIMEOUT, async {
        loop {
            match current.agent.next_event().await? {
                AgentEvent::Output { .. } => {}
                event => return Ok(event),
            }
        }
    })
    .await;
    waited.unwrap_or_else(|_| {
        Err(Error::crashed(format!(
            "the agent did not answer a file operation within {} s",
            AGENT_TIMEOUT.as_secs()
        )))
    })
}

fn out_of_place(event: &AgentEvent) -> Error {
    let what = match event {
        AgentEvent::FileData(data) => format!("{} bytes of file data", data.len()),
        other => format!("{other:?}"),
    };
    Error::crashed(format!(
        "the agent answered a file operation with an event out of place: {what}"
    ))
}

/// The error a caller sees for what the agent refused.
fn refused(failure: FileFailure, message: String) -> Error {
    match failure {
        FileFailure::NotFound => Error::file_not_found(message),
        FileFailure::Denied => Error::new(ErrorKind::PermissionDenied, message),
        FileFailure::Exists
        | FileFailure::NotEmpty
        | FileFailure::IsADirectory
        | FileFailure::NotADirectory => Error::new(ErrorKind::Conflict, message),
        FileFailure::Invalid | FileFailure::Aborted => Error::invalid(message),
        FileFailure::NoSpace => {
            Error::limit_exceeded(format!("the machine's filesystem is full: {message}"))
        }
        FileFailure::TooLarge => Error::too_large(message),
        FileFailure::Io => Error::internal(format!("in the machine: {message}")),
    }
}

/// A stat, a listing, a mkdir or a remove: one request, one answer.
async fn simple(
    current: &mut Resident,
    request: &AgentRequest,
    listing: bool,
) -> Result<Result<FileOutcome>> {
    current.agent.send(request).await?;
    match next_file_event(current).await? {
        AgentEvent::File {
            info: Some(info),
            entries,
            truncated,
        } => Ok(Ok(match (listing, entries) {
            (true, Some(entries)) => FileOutcome::List(FileList {
                directory: info,
                entries,
                truncated,
            }),
            (false, None) => FileOutcome::Info(info),
            (_, entries) => {
                return Err(Error::crashed(format!(
                    "the agent answered a file operation with {} entries where it should not",
                    entries.map_or(0, |e| e.len())
                )));
            }
        })),
        AgentEvent::FileError { failure, message } => Ok(Err(refused(failure, message))),
        other => Err(out_of_place(&other)),
    }
}

/// Runs a context operation: the agent answers with the contexts it concerned.
async fn context(
    machine: &str,
    current: &mut Resident,
    operation: ContextOperation,
) -> Result<Result<FileOutcome>> {
    let (request, named) = match operation {
        ContextOperation::Create { cwd } => (AgentRequest::ContextCreate { cwd }, None),
        ContextOperation::List => (AgentRequest::ContextList, None),
        ContextOperation::Restart { context } => (
            AgentRequest::ContextRestart {
                context: context.clone(),
            },
            Some(context),
        ),
        ContextOperation::Remove { context } => (
            AgentRequest::ContextRemove {
                context: context.clone(),
            },
            Some(context),
        ),
    };
    current.agent.send(&request).await?;
    match next_file_event(current).await? {
        AgentEvent::Contexts(contexts) => Ok(Ok(FileOutcome::Contexts(contexts))),
        AgentEvent::FileError { failure, message } => Ok(Err(match (named, failure) {
            (Some(context), FileFailure::NotFound) => Error::context_not_found(machine, &context),
            // Too many contexts, or none more under the machine's limits.
            (_, FileFailure::NoSpace) => Error::limit_exceeded(message),
            _ => refused(failure, message),
        })),
        other => Err(out_of_place(&other)),
    }
}

/// Streams a file out of the machine: answers the caller with its info and a stream as soon as
/// the agent has opened it, then forwards its pieces.
async fn read(
    metrics: &crate::metrics::Metrics,
    current: &mut Resident,
    request: AgentRequest,
    reply: oneshot::Sender<Result<FileOutcome>>,
) -> Result<()> {
    current.agent.send(&request).await?;
    let info = match next_file_event(current).await? {
        AgentEvent::File {
            info: Some(info),
            entries: None,
            ..
        } if info.kind == crate::files::FileKind::File => info,
        AgentEvent::FileError { failure, message } => {
            let _ = reply.send(Err(refused(failure, message)));
            return Ok(());
        }
        other => return Err(out_of_place(&other)),
    };
    let announced = info.size;
    let (pieces, queue) = mpsc::channel::<Result<Bytes>>(READ_QUEUE);
    let data = futures::stream::unfold(queue, |mut queue| async move {
        queue.recv().await.map(|piece| (piece, queue))
    })
    .boxed();
    let _ = reply.send(Ok(FileOutcome::Read(FileRead { info, data })));
    // The caller may go away or stall: the rest is then read and dropped, so that the channel
    // stays in step.
    let mut caller = Some(pieces);
    let mut received: u64 = 0;
    loop {
        match next_file_event(current).await? {
            AgentEvent::FileData(piece) => {
                received += piece.len() as u64;
                metrics.file_bytes("out", piece.len() as u64);
                if received > announced {
                    return Err(Error::crashed(format!(
                        "the agent sent more of a file than the {announced} bytes it announced"
                    )));
                }
                if let Some(pieces) = &caller {
                    let sent =
                        tokio::time::timeout(STALL_TIMEOUT, pieces.send(Ok(Bytes::from(piece))))
                            .await;
                    if !matches!(sent, Ok(Ok(()))) {
                        caller = None;
                    }
                }
            }
            AgentEvent::FileEnd { size } => {
                if size != received {
                    return Err(Error::crashed(format!(
                        "the agent ended a file at {size} bytes after sending {received}"
                    )));
                }
                if received < announced
                    && let Some(pieces) = &caller
                {
                    let short = Error::internal(format!(
                        "the file shrank while it was read: {received} of {announced} bytes"
                    ));
                    let _ = tokio::time::timeout(STALL_TIMEOUT, pieces.send(Err(short))).await;
                }
                return Ok(());
            }
            other => return Err(out_of_place(&other)),
        }
    }
}

/// Streams a file into the machine. The agent writes it under a temporary name and renames it
/// into place at the end, so that the file appears whole or not at all.
async fn write(
    metrics: &crate::metrics::Metrics,
    current: &mut Resident,
    request: AgentRequest,
    mut data: ByteStream,
    limit: u64,
) -> Result<Result<FileInfo>> {
    current.agent.send(&request).await?;
    match next_file_event(current).await? {
        AgentEvent::File {
            info: None,
            entries: None,
            ..
        } => {}
        AgentEvent::FileError { failure, message } => return Ok(Err(refused(failure, message))),
        other => return Err(out_of_place(&other)),
    }
    let mut written: u64 = 0;
    let failure = loop {
        match tokio::time::timeout(STALL_TIMEOUT, data.next()).await {
            Ok(Some(Ok(piece))) => {
                written += piece.len() as u64;
                if written > limit {
                    break Error::too_large(format!(
                        "the file is larger than the limit of {limit} bytes (EVERVM_MAX_FILE_MB)"
                    ));
                }
                for part in piece.chunks(WRITE_PIECE) {
                    current.agent.send_data(part).await?;
                }
                metrics.file_bytes("in", piece.len() as u64);
            }
            Ok(Some(Err(e))) => break e.context("the file's data could not be read"),
            Ok(None) => {
                current.agent.send(&AgentRequest::WriteEnd).await?;
                return match next_file_event(current).await? {
                    AgentEvent::File {
                        info: Some(info),
                        entries: None,
                        ..
                    } => Ok(Ok(info)),
                    AgentEvent::FileError { failure, message } => {
                        Ok(Err(refused(failure, message)))
                    }
                    other => Err(out_of_place(&other)),
                };
            }
            Err(_) => {
                break Error::invalid(format!(
                    "the file's data stopped coming for {} s; nothing was written",
                    STALL_TIMEOUT.as_secs()
                ));
            }
        }
    };
    current.agent.send(&AgentRequest::WriteAbort).await?;
    match next_file_event(current).await? {
        AgentEvent::FileError { .. } => Ok(Err(failure)),
        other => Err(out_of_place(&other)),
    }
}

/// Where the host puts wheels for the agent to unpack (under the home; the agent removes them).
const INSTALL_STAGING: &str = ".cache/evervm-install";

/// Installs packages into the machine (see `crate::packages`): asks what it runs and has,
/// resolves and fetches wheels on the host, writes them into the machine, has the agent unpack
/// them. An `Err` outside means the channel broke; an inner `Err` that nothing was installed.
pub(super) async fn install(
    engine: &Arc<EngineInner>,
    current: &mut Resident,
    requirements: &[String],
) -> Result<Result<crate::packages::InstallReport>> {
    use crate::packages::resolve::{MachinePython, parse_requested, resolve};

    let parsed = match parse_requested(requirements) {
        Ok(parsed) => parsed,
        Err(e) => return Ok(Err(e)),
    };
    let index = match &engine.packages {
        Ok(index) => index,
        Err(e) => return Ok(Err(e.clone())),
    };
    current.agent.send(&AgentRequest::Packages).await?;
    let machine_python = match next_file_event(current).await? {
        AgentEvent::Packages {
            environment,
            libc,
            installed,
        } => MachinePython::new(&environment, libc.as_deref(), installed),
        AgentEvent::FileError { failure, message } => return Ok(Err(refused(failure, message))),
        other => return Err(out_of_place(&other)),
    };
    let machine_python = match machine_python {
        Ok(found) => found,
        Err(e) => return Ok(Err(e)),
    };
    let limits = &engine.config.packages;
    let plan = match resolve(index, &machine_python, parsed, limits.max_install_bytes).await {
        Ok(plan) => plan,
        Err(e) => return Ok(Err(e)),
    };
    let mut report = crate::packages::InstallReport {
        installed: Vec::new(),
        satisfied: plan.satisfied,
    };
    if plan.install.is_empty() {
        return Ok(Ok(report));
    }
    let roots = file_roots(engine);
    let mut staged = Vec::new();
    for planned in plan.install {
        let data = match wheel_stream(&planned.wheel.path).await {
            Ok(data) => data,
            Err(e) => return Ok(Err(e)),
        };
        let request = AgentRequest::Write {
            path: format!("{INSTALL_STAGING}/{}.whl", planned.wheel.sha256),
            roots: roots.clone(),
            mode: Some(0o600),
            parents: true,
            metadata: std::collections::BTreeMap::default(),
        };
        match write(&engine.metrics, current, request, data, u64::MAX).await? {
            Ok(info) => staged.push(info.path),
            Err(e) => return Ok(Err(e.context("the wheel could not be put into the machine"))),
        }
        report.installed.push(planned.package);
    }
    current
        .agent
        .send(&AgentRequest::Install { wheels: staged })
        .await?;
    match next_file_event(current).await? {
        AgentEvent::Installed { .. } => Ok(Ok(report)),
        AgentEvent::FileError { failure, message } => Ok(Err(refused(failure, message))),
        other => Err(out_of_place(&other)),
    }
}

/// A wheel in the cache as a stream of pieces.
async fn wheel_stream(path: &std::path::Path) -> Result<ByteStream> {
    use tokio::io::AsyncReadExt;

    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| Error::internal(format!("opening a cached wheel: {e}")))?;
    Ok(futures::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut piece = vec![0; WRITE_PIECE];
        match file.read(&mut piece).await {
            Ok(0) => None,
            Ok(n) => {
                piece.truncate(n);
                Some((Ok(Bytes::from(piece)), Some(file)))
            }
            Err(e) => Some((
                Err(Error::internal(format!("reading a cached wheel: {e}"))),
                None,
            )),
        }
    })
    .boxed())
}
