//! One machine's life in the engine: a task that owns its sandbox and runs its instructions one
//! at a time, in the order they were accepted, and the live state that streams read.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::guest::channel::{AgentEvent, AgentOutcome, AgentRequest};
use crate::pool::{Pool, Resident, Shape, connect_restored, sandbox_id};
use crate::sandbox::SandboxSpec;
use crate::snapshot;
use crate::types::{
    Durability, ExecEvent, ExecResult, FailureCause, MachineName, Outcome, OutputChunk,
    OutputStream,
};

/// Locks a mutex, recovering the data if a holder panicked (the data is always left consistent).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A partial line longer than this is sent as a chunk of its own.
const MAX_LINE_BYTES: usize = 1024 * 1024;

/// An instruction that is queued, running, or finished but not yet only in the store.
pub(crate) struct LiveInstruction {
    data: Mutex<LiveData>,
    version: watch::Sender<u64>,
}

#[derive(Default)]
struct LiveData {
    chunks: Vec<OutputChunk>,
    result: Option<ExecResult>,
}

impl LiveInstruction {
    fn new() -> Self {
        Self {
            data: Mutex::new(LiveData::default()),
            version: watch::channel(0).0,
        }
    }

    /// Appends lines (one lock and one wake-up for many).
    fn push_chunks(&self, lines: impl IntoIterator<Item = (OutputStream, String)>) {
        let mut live = lock(&self.data);
        let before = live.chunks.len();
        for (stream, data) in lines {
            let seq = live.chunks.len() as i64;
            live.chunks.push(OutputChunk { seq, stream, data });
        }
        let added = live.chunks.len() > before;
        drop(live);
        if added {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// Sets the result once; later calls are ignored.
    fn finish(&self, result: ExecResult) -> bool {
        let mut live = lock(&self.data);
        if live.result.is_some() {
            return false;
        }
        live.result = Some(result);
        drop(live);
        self.version.send_modify(|v| *v += 1);
        true
    }

    fn snapshot(&self) -> (Vec<OutputChunk>, Option<ExecResult>) {
        let live = lock(&self.data);
        (live.chunks.clone(), live.result.clone())
    }

    pub(crate) async fn wait_result(self: Arc<Self>) -> ExecResult {
        let mut changes = self.version.subscribe();
        loop {
            changes.borrow_and_update();
            if let Some(result) = lock(&self.data).result.clone() {
                return result;
            }
            if changes.changed().await.is_err() {
                return ExecResult::failure(FailureCause::MachineCrashed, "the machine stopped");
            }
        }
    }

    /// Output chunks from the first, then the result; ends after the result. Takes everything
    /// available under one lock and hands it out from a local buffer.
    pub(crate) fn events(self: Arc<Self>) -> impl futures::Stream<Item = ExecEvent> + Send {
        struct Cursor {
            live: Arc<LiveInstruction>,
            changes: watch::Receiver<u64>,
            next: usize,
            buffer: std::collections::VecDeque<ExecEvent>,
            done: bool,
        }
        let changes = self.version.subscribe();
        let cursor = Cursor {
            live: self,
            changes,
            next: 0,
            buffer: std::collections::VecDeque::new(),
            done: false,
        };
        futures::stream::unfold(cursor, |mut cursor| async move {
            loop {
                if let Some(event) = cursor.buffer.pop_front() {
                    return Some((event, cursor));
                }
                if cursor.done {
                    return None;
                }
                cursor.changes.borrow_and_update();
                {
                    let data = lock(&cursor.live.data);
                    let available = data.chunks.get(cursor.next..).unwrap_or_default();
                    cursor.next += available.len();
                    cursor
                        .buffer
                        .extend(available.iter().cloned().map(ExecEvent::Output));
                    if let Some(result) = data.result.clone() {
                        cursor.buffer.push_back(ExecEvent::Result(result));
                        cursor.done = true;
                    }
                }
                if cursor.buffer.is_empty() && cursor.changes.changed().await.is_err() {
                    return None;
                }
            }
        })
    }
}

struct Job {
    seq: i64,
    code: String,
    timeout: Duration,
    live: Arc<LiveInstruction>,
}

#[derive(Default)]
struct MachineState {
    queued: HashSet<i64>,
    cancelled: HashSet<i64>,
    running: Option<i64>,
    /// True while the machine has a sandbox.
    resident: bool,
    /// The host process at the root of that sandbox.
    resident_pid: Option<u32>,
    live: HashMap<i64, Arc<LiveInstruction>>,
    /// Why the machine's last sandbox ended abnormally, until its next start says so.
    recovering_from: Option<String>,
}

/// Work on a machine's state that its task does between instructions.
enum Control {
    /// Save the machine to disk and release its sandbox.
    SwapOut(oneshot::Sender<Result<()>>),
    /// Save the machine and copy its snapshot to `to` (a checkpoint, a fork); answers the seq of
    /// the first instruction the copy does not include.
    CopyOut {
        to: PathBuf,
        reseed: bool,
        reply: oneshot::Sender<Result<i64>>,
    },
    /// Replace the machine's state with the snapshot in `from` (a checkpoint).
    Rollback {
        from: PathBuf,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// The engine's handle on one machine.
pub(crate) struct MachineHandle {
    pub name: MachineName,
    pub account_id: i64,
    pub shape: Shape,
    state: Mutex<MachineState>,
    pub durability: Durability,
    jobs: mpsc::UnboundedSender<Job>,
    controls: mpsc::UnboundedSender<Control>,
    /// Wakes the machine's task to look at `interrupt_requested` and `deleted`.
    wake: Notify,
    interrupt_requested: AtomicBool,
    deleted: AtomicBool,
    /// When the machine last accepted or finished an instruction.
    last_active: Mutex<std::time::Instant>,
    stopped: watch::Sender<bool>,
}

impl MachineHandle {
    /// Creates the handle and starts the machine's task. With `eager`, the machine takes its
    /// sandbox at once (from the pool), so that its first instruction does not wait for one.
    pub(crate) fn spawn(
        engine: Arc<EngineInner>,
        name: MachineName,
        account_id: i64,
        shape: Shape,
        durability: Durability,
        eager: bool,
    ) -> Arc<Self> {
        let (jobs, queue) = mpsc::unbounded_channel();
        let (controls, control_requests) = mpsc::unbounded_channel();
        let handle = Arc::new(Self {
            name,
            account_id,
            shape,
            durability,
            state: Mutex::new(MachineState::default()),
            jobs,
            controls,
            wake: Notify::new(),
            interrupt_requested: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            last_active: Mutex::new(std::time::Instant::now()),
            stopped: watch::channel(false).0,
        });
        tokio::spawn(run(
            engine,
            Arc::clone(&handle),
            queue,
            control_requests,
            eager,
        ));
        handle
    }

    pub(crate) fn resident(&self) -> bool {
        lock(&self.state).resident
    }

    /// Memory the machine's sandbox holds now; 0 when it is not resident.
    pub(crate) fn resident_bytes(&self) -> u64 {
        let pid = lock(&self.state).resident_pid;
        pid.map_or(0, crate::sandbox::process_tree_pss)
    }

    fn set_resident(&self, resident: Option<&Resident>) {
        let mut state = lock(&self.state);
        state.resident = resident.is_some();
        state.resident_pid = resident.and_then(|r| r.sandbox.pid());
    }

    /// How long since the machine last accepted or finished an instruction.
    pub(crate) fn idle_for(&self) -> Duration {
        lock(&self.last_active).elapsed()
    }

    fn touch(&self) {
        *lock(&self.last_active) = std::time::Instant::now();
    }

    pub(crate) fn has_pending_instruction(&self) -> bool {
        let state = lock(&self.state);
        state.running.is_some() || !state.queued.is_empty()
    }

    /// Accepts an instruction: `allocate` stores it and gives its seq, under the machine's lock so
    /// that seqs and queue order agree.
    pub(crate) fn enqueue(
        &self,
        code: String,
        timeout: Duration,
        allocate: impl FnOnce() -> Result<i64>,
    ) -> Result<i64> {
        if self.deleted.load(Ordering::SeqCst) {
            return Err(Error::machine_not_found(self.name.as_str()));
        }
        self.touch();
        let mut state = lock(&self.state);
        let seq = allocate()?;
        let live = Arc::new(LiveInstruction::new());
        state.live.insert(seq, Arc::clone(&live));
        state.queued.insert(seq);
        drop(state);
        let job = Job {
            seq,
            code,
            timeout,
            live,
        };
        if self.jobs.send(job).is_err() {
            return Err(Error::internal(format!(
                "machine {} is shutting down",
                self.name
            )));
        }
        Ok(seq)
    }

    /// The live state of an instruction, or what `fallback` finds (the store) while holding the
    /// machine's lock, so that an instruction is always found in one or the other.
    pub(crate) fn live_or<T>(
        &self,
        seq: i64,
        fallback: impl FnOnce() -> Result<T>,
    ) -> Result<std::result::Result<Arc<LiveInstruction>, T>> {
        let state = lock(&self.state);
        if let Some(live) = state.live.get(&seq) {
            return Ok(Ok(Arc::clone(live)));
        }
        Ok(Err(fallback()?))
    }

    /// Cancels queued instructions and interrupts the running one. True if anything was.
    pub(crate) fn interrupt(&self) -> bool {
        let mut state = lock(&self.state);
        let queued: Vec<i64> = state.queued.iter().copied().collect();
        let mut any = !queued.is_empty();
        for seq in queued {
            state.cancelled.insert(seq);
        }
        if state.running.is_some() {
            any = true;
            self.interrupt_requested.store(true, Ordering::SeqCst);
            self.wake.notify_one();
        }
        any
    }

    async fn control<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Control,
    ) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.controls
            .send(make(reply))
            .map_err(|_| Error::machine_not_found(self.name.as_str()))?;
        answer
            .await
            .map_err(|_| Error::machine_not_found(self.name.as_str()))?
    }

    /// Saves the machine to disk and releases its sandbox (between instructions).
    pub(crate) async fn swap_out(&self) -> Result<()> {
        self.control(Control::SwapOut).await
    }

    /// Saves the machine and copies its snapshot to `to` (between instructions); a machine that
    /// was resident is restored again. Returns the seq of the first instruction the copy does
    /// not include.
    pub(crate) async fn copy_out(&self, to: PathBuf, reseed: bool) -> Result<i64> {
        self.control(|reply| Control::CopyOut { to, reseed, reply })
            .await
    }

    /// Replaces the machine's state with the snapshot in `from` (between instructions).
    pub(crate) async fn rollback(&self, from: PathBuf) -> Result<()> {
        self.control(|reply| Control::Rollback { from, reply })
            .await
    }

    /// Stops the machine's task and its sandbox; pending instructions end as interrupted.
    pub(crate) async fn stop(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        self.interrupt();
        self.wake.notify_one();
        let mut stopped = self.stopped.subscribe();
        let _ = stopped.wait_for(|s| *s).await;
    }

    fn finish_cancelled(&self, job: &Job) -> bool {
        let mut state = lock(&self.state);
        state.queued.remove(&job.seq);
        let cancelled = state.cancelled.remove(&job.seq) || self.deleted.load(Ordering::SeqCst);
        if !cancelled {
            state.running = Some(job.seq);
        }
        cancelled
    }
}

/// Splits output into lines, one chunk per line without its newline.
#[derive(Default)]
struct LineSplitter {
    partial: [String; 2],
}

impl LineSplitter {
    fn index(stream: OutputStream) -> usize {
        match stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        }
    }

    fn push(&mut self, live: &LiveInstruction, stream: OutputStream, data: &str) {
        let partial = &mut self.partial[Self::index(stream)];
        let mut lines = Vec::new();
        let mut rest = data;
        while let Some(newline) = rest.find('\n') {
            if partial.is_empty() {
                lines.push((stream, rest[..newline].to_owned()));
            } else {
                partial.push_str(&rest[..newline]);
                lines.push((stream, std::mem::take(partial)));
            }
            rest = &rest[newline + 1..];
        }
        partial.push_str(rest);
        if partial.len() > MAX_LINE_BYTES {
            lines.push((stream, std::mem::take(partial)));
        }
        live.push_chunks(lines);
    }

    fn flush(&mut self, live: &LiveInstruction) {
        let mut lines = Vec::new();
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let partial = &mut self.partial[Self::index(stream)];
            if !partial.is_empty() {
                lines.push((stream, std::mem::take(partial)));
            }
        }
        live.push_chunks(lines);
    }
}

async fn run(
    engine: Arc<EngineInner>,
    machine: Arc<MachineHandle>,
    mut queue: mpsc::UnboundedReceiver<Job>,
    mut controls: mpsc::UnboundedReceiver<Control>,
    eager: bool,
) {
    let mut resident: Option<Resident> = None;
    if eager {
        become_resident(&engine, &machine, &mut resident).await;
    }
    loop {
        let job = tokio::select! {
            job = queue.recv() => job,
            Some(control) = controls.recv() => {
                handle_control(&engine, &machine, &mut resident, control).await;
                continue;
            }
            () = machine.wake.notified() => {
                if machine.deleted.load(Ordering::SeqCst) { None } else { continue }
            }
        };
        let Some(job) = job else { break };
        let result = if machine.finish_cancelled(&job) {
            let text = if machine.deleted.load(Ordering::SeqCst) {
                "Instruction interrupted: the machine was deleted"
            } else {
                "Instruction interrupted before it started"
            };
            ExecResult::failure(FailureCause::Interrupted, text)
        } else {
            machine.interrupt_requested.store(false, Ordering::SeqCst);
            run_job(&engine, &machine, &mut resident, &job).await
        };
        // With `durability = instruction` the state the result reflects is on disk before
        // anyone sees the result.
        let saved_for_durability = machine.durability == Durability::Instruction
            && resident.is_some()
            && engine.backend.capabilities().snapshots;
        if saved_for_durability {
            if let Err(e) = swap_out(&engine, &machine, &mut resident).await {
                let note = format!(
                    "[evervm] warning: the machine's state after this instruction could not be \
                     saved ({e}); a crash before its next save would lose it"
                );
                job.live.push_chunks([(OutputStream::Stderr, note)]);
                tracing::error!(machine = %machine.name, "durability snapshot failed: {e}");
            }
            machine.set_resident(resident.as_ref());
        }
        // Stored before it is reported: a result anyone has seen is never lost.
        let (chunks, _) = job.live.snapshot();
        let persisted = {
            let engine = Arc::clone(&engine);
            let name = machine.name.to_string();
            let seq = job.seq;
            let result = result.clone();
            tokio::task::spawn_blocking(move || {
                lock(&engine.store).finish_instruction(&name, seq, &chunks, &result)
            })
            .await
        };
        if let Ok(Err(e)) | Err(e) = persisted.map_err(|e| Error::internal(e.to_string())) {
            tracing::error!(machine = %machine.name, seq = job.seq, "storing a result failed: {e}");
        }
        job.live.finish(result);
        machine.touch();
        {
            let mut state = lock(&machine.state);
            state.running = None;
            state.live.remove(&job.seq);
        }
        machine.set_resident(resident.as_ref());
        // A machine saved after its instruction is brought back at once, so that the next one
        // does not wait for the restore.
        if saved_for_durability && !machine.deleted.load(Ordering::SeqCst) {
            become_resident(&engine, &machine, &mut resident).await;
        }
    }
    if let Some(resident) = resident.take() {
        resident.kill().await;
    }
    // Anything still queued (the machine was deleted) ends as interrupted.
    queue.close();
    while let Ok(job) = queue.try_recv() {
        job.live.finish(ExecResult::failure(
            FailureCause::Interrupted,
            "Instruction interrupted: the machine was deleted",
        ));
    }
    controls.close();
    while let Ok(control) = controls.try_recv() {
        let gone = || Error::machine_not_found(machine.name.as_str());
        match control {
            Control::SwapOut(reply) | Control::Rollback { reply, .. } => {
                let _ = reply.send(Err(gone()));
            }
            Control::CopyOut { reply, .. } => {
                let _ = reply.send(Err(gone()));
            }
        }
    }
    {
        let mut state = lock(&machine.state);
        state.resident = false;
        state.resident_pid = None;
        state.running = None;
    }
    machine.stopped.send_replace(true);
}

/// Gives the machine a sandbox now (its snapshot restored, or a fresh one), logging a failure:
/// the next instruction tries again and reports it.
async fn become_resident(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
) {
    if resident.is_some() {
        return;
    }
    match acquire(engine, machine).await {
        Ok(ready) => {
            machine.set_resident(Some(&ready));
            *resident = Some(ready);
            engine.keep_within_budget();
        }
        Err(e) => tracing::warn!(machine = %machine.name, "no sandbox yet: {e}"),
    }
}

async fn handle_control(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    control: Control,
) {
    match control {
        Control::SwapOut(reply) => {
            let swapped = swap_out(engine, machine, resident).await;
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
        Control::Rollback { from, reply } => {
            let was_resident = resident.is_some();
            if let Some(current) = resident.take() {
                current.kill().await;
            }
            machine.set_resident(None);
            let home = engine.config.home.clone();
            let name = machine.name.to_string();
            let copied = tokio::task::spawn_blocking(move || {
                snapshot::copy(&from, &snapshot::snapshot_dir(&home, &name), false)
            })
            .await
            .map_err(|e| Error::internal(format!("the rollback stopped: {e}")))
            .and_then(|r| r);
            if copied.is_ok() {
                lock(&machine.state).recovering_from = None;
                engine.record_machine_error(&machine.name, None);
            }
            let _ = reply.send(copied);
            if was_resident {
                become_resident(engine, machine, resident).await;
            }
        }
    }
}

/// Saves the machine (starting it first if it has no state yet) and copies its snapshot to `to`.
async fn copy_out(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    to: PathBuf,
    reseed: bool,
) -> Result<i64> {
    if !engine.backend.capabilities().snapshots {
        return Err(Error::unsupported(format!(
            "the {} backend cannot snapshot a machine, so it cannot fork or checkpoint one (the \
             gVisor backend can)",
            engine.backend.name()
        )));
    }
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    let from = snapshot::snapshot_dir(&home, &name);
    if resident.is_none() {
        if from.exists() {
            // A damaged snapshot is not copied: the copy would be refused too.
            let restorable = |runtime: &str| engine.backend.restorable(runtime);
            if let Err(e) = snapshot::verify_dir(&from, &restorable) {
                snapshot::mark_damaged(&home, &name, e.message());
                return Err(e);
            }
        } else {
            // A machine that never ran: its state is a fresh interpreter.
            *resident = Some(acquire(engine, machine).await?);
        }
    }
    swap_out(engine, machine, resident).await?;
    let first_excluded = machine.first_unrun_seq(engine)?;
    tokio::task::spawn_blocking(move || snapshot::copy(&from, &to, reseed))
        .await
        .map_err(|e| Error::internal(format!("copying the snapshot stopped: {e}")))??;
    Ok(first_excluded)
}

/// A sandbox for a machine that has none: its snapshot restored when it has one (refused, with
/// the reason, when the snapshot is damaged), else a fresh one from the pool. After a crash, the
/// machine's next instruction says what it came back from.
async fn acquire(engine: &Arc<EngineInner>, machine: &MachineHandle) -> Result<Resident> {
    let home = &engine.config.home;
    let name = machine.name.as_str();
    let dir = snapshot::snapshot_dir(home, name);
    let refuse = |e: Error| {
        snapshot::mark_damaged(home, name, e.message());
        e
    };
    let restorable = |runtime: &str| engine.backend.restorable(runtime);
    let Some(manifest) = snapshot::check_manifest(&dir, &restorable).map_err(refuse)? else {
        return Pool::take(engine, machine.shape).await;
    };
    // The checksum is computed while runsc starts (most of a restore is starting its processes);
    // nothing talks to the restored sandbox before it matched.
    let checking = {
        let dir = dir.clone();
        let manifest = manifest.clone();
        tokio::task::spawn_blocking(move || snapshot::check_files(&dir, &manifest))
    };
    let spec = SandboxSpec {
        id: sandbox_id(),
        memory_mb: machine.shape.memory_mb,
        profile: machine.shape.profile,
        image_id: manifest.image_id.clone(),
    };
    let restored = engine.backend.restore(&spec, &dir, &manifest.runtime).await;
    let checked = checking
        .await
        .map_err(|e| Error::internal(format!("checking the snapshot stopped: {e}")))
        .and_then(|r| r);
    let sandbox = match (restored, checked) {
        (Ok(sandbox), Ok(())) => sandbox,
        (Ok(mut sandbox), Err(e)) => {
            let _ = sandbox.kill().await;
            return Err(refuse(e));
        }
        (Err(_), Err(e)) => return Err(refuse(e)),
        (Err(e), Ok(())) => return Err(e),
    };
    connect_restored(engine, sandbox, snapshot::needs_reseed(&dir)).await
}

impl MachineHandle {
    /// The seq of the first instruction that has not run: the first queued one, else the next
    /// to be accepted. Only meaningful between instructions (in the machine's task).
    fn first_unrun_seq(&self, engine: &EngineInner) -> Result<i64> {
        let state = lock(&self.state);
        if let Some(first) = state.queued.iter().min() {
            return Ok(*first);
        }
        let record = lock(&engine.store).machine(self.name.as_str())?;
        Ok(record.map_or(0, |r| r.next_seq))
    }

    /// What the next instruction's output starts with after the machine's sandbox ended
    /// abnormally: how it came back.
    fn recovery_note(&self, engine: &EngineInner) -> Option<String> {
        let why = lock(&self.state).recovering_from.take()?;
        let home = &engine.config.home;
        let restorable = |runtime: &str| engine.backend.restorable(runtime);
        let restored = snapshot::verify(home, self.name.as_str(), &restorable)
            .ok()
            .flatten();
        Some(match restored {
            Some(manifest) => format!(
                "[evervm] this machine's sandbox stopped ({why}); it was restored from its \
                 snapshot of {}, and changes made after that were lost",
                manifest.created_at
            ),
            None => format!(
                "[evervm] this machine's sandbox stopped ({why}); it had no snapshot, so this \
                 instruction runs in a fresh interpreter and earlier state was lost"
            ),
        })
    }
}

/// Checkpoints the resident sandbox into the machine's snapshot and releases it.
async fn swap_out(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
) -> Result<()> {
    let Some(mut current) = resident.take() else {
        // Nothing in memory: the snapshot on disk (if any) is already the machine.
        return Ok(());
    };
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    let staging = snapshot::staging_dir(&home, &name)?;
    let image_id = current.sandbox.image_id();
    let runtime = current
        .sandbox
        .runtime()
        .unwrap_or_else(|| engine.backend.describe());
    let started = std::time::Instant::now();
    if let Err(e) = current.sandbox.checkpoint(&staging).await {
        let _ = std::fs::remove_dir_all(&staging);
        if e.kind() == crate::ErrorKind::Unsupported {
            *resident = Some(current);
        } else {
            current.kill().await;
        }
        return Err(e);
    }
    drop(current);
    let checkpointed = started.elapsed();
    let manifest = tokio::task::spawn_blocking(move || {
        snapshot::commit(&home, &name, &staging, &runtime, image_id)
    })
    .await
    .map_err(|e| Error::internal(format!("saving the snapshot stopped: {e}")))??;
    tracing::debug!(
        machine = %machine.name,
        bytes = manifest.bytes,
        "swapped out: checkpoint {:.1} ms, commit {:.1} ms",
        checkpointed.as_secs_f64() * 1e3,
        started.elapsed().saturating_sub(checkpointed).as_secs_f64() * 1e3
    );
    Ok(())
}

async fn run_job(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    job: &Job,
) -> ExecResult {
    let note = machine.recovery_note(engine);
    let mut current = match resident.take() {
        Some(r) => r,
        None => match acquire(engine, machine).await {
            Ok(r) => {
                machine.set_resident(Some(&r));
                engine.keep_within_budget();
                r
            }
            Err(e) => {
                engine.record_machine_error(&machine.name, Some(&e.to_string()));
                return ExecResult::failure(
                    FailureCause::MachineCrashed,
                    format!("MachineCrashed: the machine could not start: {e}"),
                );
            }
        },
    };
    if let Some(note) = note {
        job.live.push_chunks([(OutputStream::Stderr, note)]);
    }
    let request = AgentRequest::Exec {
        id: job.seq,
        code: job.code.clone(),
        timeout_ms: job.timeout.as_millis() as u64,
    };
    let started = Instant::now();
    if let Err(e) = current.agent.send(&request).await {
        return crashed(engine, machine, current, e.to_string()).await;
    }
    let grace = engine.config.timeout_grace;
    let mut deadline = started + job.timeout + grace;
    let mut interrupted_by_request = false;
    let mut lines = LineSplitter::default();
    loop {
        tokio::select! {
            event = current.agent.next_event() => match event {
                Ok(AgentEvent::Output { stream, data, .. }) => lines.push(&job.live, stream, &data),
                Ok(AgentEvent::Result { id, outcome, data, runtime_ms }) if id == job.seq => {
                    lines.flush(&job.live);
                    *resident = Some(current);
                    let outcome = match outcome {
                        AgentOutcome::Value(value) => Outcome::Value(value),
                        AgentOutcome::Error { text, cause } => Outcome::Error { text, cause },
                    };
                    return ExecResult { outcome, data, runtime_ms };
                }
                Ok(other) => {
                    tracing::warn!(machine = %machine.name, "ignoring unexpected agent event {other:?}");
                }
                Err(e) => {
                    lines.flush(&job.live);
                    return crashed(engine, machine, current, e.to_string()).await;
                }
            },
            () = machine.wake.notified() => {
                if machine.deleted.load(Ordering::SeqCst) {
                    current.kill().await;
                    return ExecResult::failure(
                        FailureCause::Interrupted,
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
                engine.record_machine_error(&machine.name, Some(&text));
                lock(&machine.state).recovering_from =
                    Some(format!("an instruction {what} and did not stop"));
                let cause = if interrupted_by_request { FailureCause::Interrupted } else { FailureCause::Timeout };
                let mut result = ExecResult::failure(cause, text);
                result.runtime_ms = started.elapsed().as_millis() as u64;
                return result;
            }
        }
    }
}

async fn crashed(
    engine: &EngineInner,
    machine: &MachineHandle,
    resident: Resident,
    error: String,
) -> ExecResult {
    // Give the sandbox a moment to finish exiting so that its exit status can be read.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reason = resident.kill().await;
    let cause = match reason {
        Some(reason) if reason.contains("signal 9") => {
            format!("{reason} (most likely out of memory)")
        }
        Some(reason) => reason,
        None => error,
    };
    let text = format!(
        "MachineCrashed: the machine stopped unexpectedly ({cause}); {}",
        engine.state_loss_note()
    );
    engine.record_machine_error(&machine.name, Some(&text));
    lock(&machine.state).recovering_from = Some(cause);
    ExecResult::failure(FailureCause::MachineCrashed, text)
}
