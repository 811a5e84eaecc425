//! The machine's task: takes instructions and operations off its queues, one at a time, and owns
//! the sandbox while it does.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::processes::{self, ProcessOp};
use super::swap::{
    Save, acquire, become_resident, compress_swapped, copy_out, recovery_note, rollback, save,
    swap_out,
};
use super::{Control, Job, MachineHandle, Work, history};
use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::guest::channel::{AgentEvent, AgentOutcome, AgentRequest};
use crate::pool::Resident;
use crate::store::OutputBatches;
use crate::sync::lock;
use crate::types::{Durability, ExecResult, FailureCause, Outcome, OutputStream};

/// Output of a running instruction is handed to the store in pieces of about this size.
const STORE_OUTPUT_EVERY_BYTES: usize = 1024 * 1024;

/// What the machine's task takes requests from.
pub(super) struct Queues {
    /// Instructions and file operations, in order.
    pub work: mpsc::UnboundedReceiver<Work>,
    pub controls: mpsc::Receiver<Control>,
    /// Process requests: taken also while an instruction runs.
    pub processes: mpsc::Receiver<ProcessOp>,
}

pub(super) async fn run(
    engine: Arc<EngineInner>,
    machine: Arc<MachineHandle>,
    queues: Queues,
    eager: bool,
) {
    let Queues {
        work: mut queue,
        mut controls,
        processes: mut process_ops,
    } = queues;
    let mut resident: Option<Resident> = None;
    let keeps_history = machine.history > 0 && engine.backend.capabilities().save_in_place;
    if eager {
        machine.set_busy(true);
        become_resident(&engine, &machine, &mut resident).await;
    }
    loop {
        machine.set_busy(false);
        // Checked every time round, not only when woken: a running instruction may have taken
        // the wake-up that `stop` sent.
        if machine.deleted.load(Ordering::SeqCst) {
            break;
        }
        let job = tokio::select! {
            job = queue.recv() => job,
            Some(control) = controls.recv() => {
                machine.set_busy(true);
                handle_control(&engine, &machine, &mut resident, control).await;
                continue;
            }
            Some(op) = process_ops.recv() => {
                machine.set_busy(true);
                processes::handle_idle(&engine, &machine, &mut resident, op).await;
                continue;
            }
            () = super::ports::kicked(resident.as_ref()) => {
                if let Some(current) = resident.as_mut()
                    && let Err(e) = current.agent.flush_tunnels().await
                    && let Some(current) = resident.take()
                {
                    lost(&engine, &machine, current, e.to_string()).await;
                    machine.set_resident(resident.as_ref());
                }
                continue;
            }
            // While processes run, what else the agent says between instructions (output of
            // the interpreter's own threads) is read and dropped, so that the channel never
            // stops for their sake.
            event = next_idle_event(&mut resident), if has_processes(resident.as_ref()) => {
                if let Err(e) = event
                    && let Some(current) = resident.take()
                {
                    lost(&engine, &machine, current, e.to_string()).await;
                    machine.set_resident(resident.as_ref());
                }
                continue;
            }
            () = machine.wake.notified() => {
                if machine.deleted.load(Ordering::SeqCst) { None } else { continue }
            }
        };
        let Some(work) = job else { break };
        machine.set_busy(true);
        let job = match work {
            Work::Instruction(job) => job,
            Work::Files(file_job) => {
                super::files::run(&engine, &machine, &mut resident, file_job).await;
                machine.file_operation_done();
                machine.set_resident(resident.as_ref());
                continue;
            }
        };
        let mut result = if machine.start_job(&job) {
            if let Some(hook) = &engine.config.hooks.before_run {
                hook(machine.name.to_string()).await;
            }
            // A machine with history keeps the state before its first instruction too.
            if keeps_history && history::has_no_points(&engine, &machine).await {
                become_resident(&engine, &machine, &mut resident).await;
                if resident.is_some() {
                    history::take_point(&engine, &machine, &mut resident, job.seq - 1, false).await;
                }
            }
            run_job(&engine, &machine, &mut resident, &job, &mut process_ops).await
        } else if machine.deleted.load(Ordering::SeqCst) {
            ExecResult::failure(
                FailureCause::MachineDeleted,
                "Instruction interrupted: the machine was deleted",
            )
        } else {
            ExecResult::failure(
                FailureCause::Interrupted,
                "Instruction interrupted before it started",
            )
        };
        // With `durability = instruction` the state the result reflects is on disk before
        // anyone sees the result, or the result says it is not.
        let durable = machine.durability == Durability::Instruction
            && engine.backend.capabilities().snapshots
            && !machine.deleted.load(Ordering::SeqCst);
        if durable && resident.is_some() {
            result.saved = Some(save_for_durability(&engine, &machine, &mut resident, &job).await);
        }
        let saved = result.saved == Some(true);
        // The undo point after it, once its result is out: the caller waits for it only when
        // its next instruction comes first (a history listing waits for it too, from before
        // the result is out).
        let point = keeps_history && resident.is_some() && !machine.deleted.load(Ordering::SeqCst);
        if point {
            machine.taking_point.send_replace(true);
        }
        finish_job(&engine, &machine, &job, result).await;
        if point {
            history::take_point(&engine, &machine, &mut resident, job.seq, saved).await;
        }
        machine.set_resident(resident.as_ref());
        // A machine saved after its instruction is brought back at once, so that the next one
        // does not wait for the restore.
        if durable && resident.is_none() && !machine.deleted.load(Ordering::SeqCst) {
            become_resident(&engine, &machine, &mut resident).await;
        }
    }
    machine.set_busy(true);
    if let Some(resident) = resident.take() {
        resident.kill().await;
    }
    // Anything still queued (the machine was deleted) ends as interrupted.
    queue.close();
    while let Ok(work) = queue.try_recv() {
        match work {
            Work::Instruction(job) => {
                job.live.finish(ExecResult::failure(
                    FailureCause::MachineDeleted,
                    "Instruction interrupted: the machine was deleted",
                ));
            }
            Work::Files(file_job) => {
                let _ = file_job
                    .reply
                    .send(Err(Error::machine_not_found(machine.name.as_str())));
                machine.file_operation_done();
            }
        }
    }
    controls.close();
    while let Ok(control) = controls.try_recv() {
        let gone = || Error::machine_not_found(machine.name.as_str());
        match control {
            Control::SwapOut(reply) | Control::Rollback { reply, .. } => {
                let _ = reply.send(Err(gone()));
            }
            Control::Rewind { reply, .. } => {
                let _ = reply.send(Err(gone()));
            }
            Control::CopyOut { reply, .. } => {
                let _ = reply.send(Err(gone()));
            }
            Control::Compress(reply) | Control::DropCopy(reply) => {
                let _ = reply.send(Err(gone()));
            }
        }
    }
    {
        let mut state = lock(&machine.state);
        state.resident = false;
        state.resident_pid = None;
        state.memory_roots.clear();
        state.running = None;
    }
    machine.stopped.send_replace(true);
}

/// Saves the machine after an instruction (`durability = instruction`); true when its state is
/// on disk. When it is not, the instruction's output says why and what that means.
async fn save_for_durability(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    job: &Job,
) -> bool {
    match save(engine, machine, resident, Save::InPlace).await {
        Ok(()) => true,
        Err(e) => {
            let note = if resident.is_some() {
                format!(
                    "[evervm] warning: the machine's state after this instruction could not be \
                     saved ({e}); it is still in memory, but an engine crash before its next \
                     successful save would lose it"
                )
            } else {
                format!(
                    "[evervm] error: the machine's state after this instruction could not be \
                     saved ({e}) and its sandbox stopped: that state is lost, and the next \
                     instruction starts from the last saved state"
                )
            };
            job.live.push_chunks([(OutputStream::Stderr, note)]);
            tracing::error!(machine = %machine.name, "durability snapshot failed: {e}");
            false
        }
    }
}

/// Stores the rest of the output and the result (before anyone sees it: a result anyone has
/// seen is never lost), then reports it.
async fn finish_job(
    engine: &EngineInner,
    machine: &MachineHandle,
    job: &Job,
    mut result: ExecResult,
) {
    job.live.complete(&mut result);
    let outcome = match &result.outcome {
        Outcome::Value(_) => "value",
        Outcome::Error { cause, .. } => cause.as_str(),
    };
    engine.metrics.instruction_finished(
        machine.account_id,
        outcome,
        result.runtime_ms as f64 / 1e3,
    );
    let name = machine.name.to_string();
    let seq = job.seq;
    let mut stored_result = result.clone();
    stored_result.output_truncated |= job.live.truncated();
    let chunks = unsaved_output(machine, job);
    let stored = engine
        .store
        .finish_instruction(&name, seq, chunks, stored_result)
        .await;
    if let Err(e) = stored
        && !machine.deleted.load(Ordering::SeqCst)
    {
        tracing::error!(machine = %machine.name, seq = job.seq, "storing a result failed: {e}");
    }
    job.live.finish(result);
    machine.touch();
    let mut state = lock(&machine.state);
    state.running = None;
    state.live.remove(&job.seq);
}

async fn handle_control(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    control: Control,
) {
    match control {
        Control::SwapOut(reply) => {
            let started = std::time::Instant::now();
            let swapped = swap_out(engine, machine, resident).await;
            engine
                .metrics
                .swapped_out(swapped.is_ok(), started.elapsed().as_secs_f64());
            machine.set_resident(resident.as_ref());
            let _ = reply.send(swapped);
        }
        Control::CopyOut { to, reseed, reply } => {
            let was_resident = resident.is_some();
            let copied = copy_out(engine, machine, resident, to, reseed).await;
            machine.set_resident(resident.as_ref());
            let _ = reply.send(copied);
            if was_resident {
                become_resident(engine, machine, resident).await;
            }
        }
        Control::Compress(reply) => {
            // An instruction waiting goes first: the compression is tried again later.
            let compressed = if resident.is_some() || machine.has_pending_work() {
                Ok(false)
            } else {
                compress_swapped(engine, machine, crate::sandbox::Effort::Small).await
            };
            let _ = reply.send(compressed);
        }
        Control::DropCopy(reply) => {
            let dropped = if resident.is_some() || machine.has_pending_work() {
                Ok(false)
            } else {
                super::bucketed::drop_copy(engine, machine.name.as_str()).await
            };
            let _ = reply.send(dropped);
        }
        Control::Rewind { to, reply } => {
            let rewound = history::rewind(engine, machine, resident, to).await;
            machine.set_resident(resident.as_ref());
            let _ = reply.send(rewound);
        }
        Control::Rollback { from, reply } => {
            let was_resident = resident.is_some();
            let rolled_back = rollback(engine, machine, resident, from).await;
            let _ = reply.send(rolled_back);
            if was_resident {
                become_resident(engine, machine, resident).await;
            }
        }
    }
}

/// The output not yet handed to the store, encoded; none (with a log line) where it cannot be
/// encoded, so that the result is stored all the same.
fn unsaved_output(machine: &MachineHandle, job: &Job) -> OutputBatches {
    job.live.take_unsaved().unwrap_or_else(|e| {
        tracing::error!(machine = %machine.name, seq = job.seq, "output not stored: {e}");
        OutputBatches::default()
    })
}

/// Output of a running instruction on its way to the store: at most one piece is in the store's
/// hands at a time, so reading the guest goes on while the store writes, and a guest that writes
/// faster than the disk takes waits for it instead of growing a queue.
#[derive(Default)]
struct OutputToStore {
    in_flight: Option<tokio::task::JoinHandle<crate::Result<()>>>,
}

impl OutputToStore {
    /// Hands the output gathered so far to the store once there is enough of it.
    async fn store_so_far(&mut self, engine: &EngineInner, machine: &MachineHandle, job: &Job) {
        if job.live.unsaved_bytes() < STORE_OUTPUT_EVERY_BYTES {
            return;
        }
        self.wait(machine, job).await;
        let name = machine.name.to_string();
        let seq = job.seq;
        let chunks = unsaved_output(machine, job);
        let store = Arc::clone(&engine.store);
        self.in_flight = Some(tokio::spawn(async move {
            store.append_output(&name, seq, chunks).await
        }));
    }

    /// Waits for the piece in the store's hands.
    async fn wait(&mut self, machine: &MachineHandle, job: &Job) {
        if let Some(pending) = self.in_flight.take()
            && let Err(e) = pending
                .await
                .unwrap_or_else(|e| Err(crate::Error::internal(format!("storing output: {e}"))))
        {
            tracing::warn!(machine = %machine.name, seq = job.seq, "storing output failed: {e}");
        }
    }
}

async fn run_job(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    job: &Job,
    process_ops: &mut mpsc::Receiver<ProcessOp>,
) -> ExecResult {
    let mut output = OutputToStore::default();
    let result = run_instruction(engine, machine, resident, job, &mut output, process_ops).await;
    output.wait(machine, job).await;
    result
}

async fn run_instruction(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    job: &Job,
    output: &mut OutputToStore,
    process_ops: &mut mpsc::Receiver<ProcessOp>,
) -> ExecResult {
    let note = recovery_note(engine, machine).await;
    let mut current = match take_resident(engine, machine, resident).await {
        Ok(current) => current,
        Err(e) if e.kind() == crate::ErrorKind::LimitExceeded => {
            return ExecResult::failure(
                FailureCause::LimitExceeded,
                format!("LimitExceeded: the machine could not start: {e}"),
            );
        }
        Err(e) => {
            return ExecResult::failure(
                FailureCause::MachineCrashed,
                format!("MachineCrashed: the machine could not start: {e}"),
            );
        }
    };
    if let Some(note) = note {
        job.live.push_chunks([(OutputStream::Stderr, note)]);
    }
    machine.mark_unsaved(engine).await;
    if let Some(pip) = crate::packages::pip_install_line(&job.code) {
        return pip_install(engine, machine, resident, current, job, pip).await;
    }
    let request = AgentRequest::Exec {
        id: job.seq,
        code: job.code.clone(),
        timeout_ms: job.timeout.as_millis() as u64,
        dialect: job.dialect,
        context: job.context.clone(),
    };
    let started = Instant::now();
    if let Err(e) = current.agent.send(&request).await {
        return crashed(engine, machine, current, e.to_string()).await;
    }
    let grace = engine.config.timeout_grace;
    let mut deadline = started + job.timeout + grace;
    let mut interrupted_by_request = false;
    let mut lines = super::live::LineSplitter::default();
    let tunnels = Arc::clone(current.agent.tunnels());
    loop {
        tokio::select! {
            event = current.agent.next_event() => match event {
                Ok(AgentEvent::Output { stream, data, .. }) => {
                    lines.push(&job.live, stream, &data);
                    output.store_so_far(engine, machine, job).await;
                }
                Ok(AgentEvent::Display { id, result }) => {
                    // One shown by a thread of an earlier instruction goes nowhere, like output.
                    if id == job.seq {
                        lines.flush(&job.live);
                        job.live.push_display(result);
                        output.store_so_far(engine, machine, job).await;
                    }
                }
                Ok(AgentEvent::Result { id, outcome, exception, data, results, runtime_ms, execution_count }) if id == job.seq => {
                    lines.flush(&job.live);
                    *resident = Some(current);
                    let outcome = match outcome {
                        AgentOutcome::Value(value) => Outcome::Value(value),
                        AgentOutcome::Error { text, cause } => Outcome::Error { text, cause },
                    };
                    return ExecResult { outcome, exception, data, results, runtime_ms, execution_count, ..ExecResult::default() };
                }
                Ok(other) => {
                    tracing::warn!(machine = %machine.name, "ignoring unexpected agent event {other:?}");
                }
                Err(e) => {
                    lines.flush(&job.live);
                    return crashed(engine, machine, current, e.to_string()).await;
                }
            },
            Some(op) = process_ops.recv() => {
                if let Err(broken) = processes::handle(engine, machine, &mut current, op).await {
                    lines.flush(&job.live);
                    let error = broken.refuse();
                    return crashed(engine, machine, current, error.to_string()).await;
                }
            }
            () = tunnels.kicked() => {
                if let Err(e) = current.agent.flush_tunnels().await {
                    lines.flush(&job.live);
                    return crashed(engine, machine, current, e.to_string()).await;
                }
            }
            () = machine.wake.notified() => {
                if machine.deleted.load(Ordering::SeqCst) {
                    current.kill().await;
                    return ExecResult::failure(
                        FailureCause::MachineDeleted,
                        "Instruction interrupted: the machine was deleted",
                    );
                }
                if machine.interrupt_requested.swap(false, Ordering::SeqCst) {
                    interrupted_by_request = true;
                    deadline = deadline.min(Instant::now() + grace);
                    if let Err(e) = current.agent.send(&AgentRequest::Interrupt { id: job.seq }).await {
                        return crashed(engine, machine, current, e.to_string()).await;
                    }
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                lines.flush(&job.live);
                current.kill().await;
                let what = if interrupted_by_request { "was interrupted" } else { "timed out" };
                let text = format!(
                    "Timed out: the instruction {what} and did not stop within {} s, so its sandbox \
                     was stopped; {}",
                    grace.as_secs(),
                    engine.state_loss_note(),
                );
                engine.record_machine_error(&machine.name, Some(&text)).await;
                machine.ended_abnormally(format!("an instruction {what} and did not stop"));
                let cause = if interrupted_by_request { FailureCause::Interrupted } else { FailureCause::Timeout };
                let mut result = ExecResult::failure(cause, text);
                result.runtime_ms = started.elapsed().as_millis() as u64;
                return result;
            }
        }
    }
}

/// A `%pip install ...` instruction: the engine installs the packages (`crate::packages`), and
/// the instruction's output says what it did, like pip would.
async fn pip_install(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    mut current: Resident,
    job: &Job,
    requirements: std::result::Result<Vec<String>, String>,
) -> ExecResult {
    let started = Instant::now();
    let installed = match requirements {
        Ok(requirements) => super::files::install(engine, &mut current, &requirements).await,
        Err(text) => Ok(Err(Error::invalid(text))),
    };
    let mut result = match installed {
        Ok(Ok(report)) => {
            job.live
                .push_chunks([(OutputStream::Stdout, report.summary())]);
            ExecResult::default()
        }
        Ok(Err(e)) => ExecResult::failure(FailureCause::Exception, format!("InstallError: {e}")),
        Err(broken) => return crashed(engine, machine, current, broken.to_string()).await,
    };
    *resident = Some(current);
    result.runtime_ms = started.elapsed().as_millis() as u64;
    result
}

/// Whether the machine's sandbox has processes running.
fn has_processes(resident: Option<&Resident>) -> bool {
    resident.is_some_and(|r| !r.agent.processes().is_empty())
}

/// The agent's next event between instructions (only read while processes run).
async fn next_idle_event(resident: &mut Option<Resident>) -> Result<()> {
    match resident {
        Some(current) => current.agent.next_event().await.map(|event| {
            tracing::debug!("between instructions, the agent said {event:?}");
        }),
        None => std::future::pending().await,
    }
}

/// The machine's sandbox: the one it has, or one acquired now (a restore, or a fresh start).
pub(super) async fn take_resident(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
) -> Result<Resident> {
    if let Some(current) = resident.take() {
        return Ok(current);
    }
    match acquire(engine, machine).await {
        Ok(current) => {
            machine.set_resident(Some(&current));
            engine.keep_within_budget();
            Ok(current)
        }
        Err(e) => {
            engine
                .record_machine_error(&machine.name, Some(&e.to_string()))
                .await;
            Err(e)
        }
    }
}

async fn crashed(
    engine: &EngineInner,
    machine: &MachineHandle,
    resident: Resident,
    error: String,
) -> ExecResult {
    ExecResult::failure(
        FailureCause::MachineCrashed,
        lost(engine, machine, resident, error).await,
    )
}

/// Stops a sandbox whose channel broke or whose agent misbehaved, notes why for the machine's
/// next start, and returns the text that says so.
pub(super) async fn lost(
    engine: &EngineInner,
    machine: &MachineHandle,
    resident: Resident,
    error: String,
) -> String {
    // Give the sandbox a moment to finish exiting so that its exit status can be read.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reason = resident.kill().await;
    let cause = reason.map_or(error, |reason| reason.text);
    let text = format!(
        "MachineCrashed: the machine stopped unexpectedly ({cause}); {}",
        engine.state_loss_note()
    );
    engine
        .record_machine_error(&machine.name, Some(&text))
        .await;
    machine.ended_abnormally(cause);
    text
}
