//! One machine's life in the engine: a task that owns its sandbox and runs its instructions one
//! at a time, in the order they were accepted (`task.rs`), how it goes to disk and comes back
//! (`swap.rs`), and the live state that streams read (`live.rs`).

pub(crate) mod bucketed;
mod files;
mod history;
mod live;
pub(crate) mod ports;
pub(crate) mod processes;
mod swap;
mod task;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc, oneshot, watch};

pub(crate) use self::files::{ContextOperation, FileOperation, FileOutcome};
pub(crate) use self::live::LiveInstruction;
use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::pool::{Resident, Shape};
use crate::sync::lock;
use crate::types::{Durability, MachineName};

/// How long a measurement of a sandbox's memory is reused (reading it walks every page table
/// of the sandbox's processes).
const MEMORY_READING_TTL: Duration = Duration::from_secs(2);

/// First wait after a failed swap-out; doubled after each further failure, up to
/// [`SWAP_RETRY_MAX`].
const SWAP_RETRY_FIRST: Duration = Duration::from_secs(10);
const SWAP_RETRY_MAX: Duration = Duration::from_secs(600);

struct Job {
    seq: i64,
    code: String,
    timeout: Duration,
    dialect: crate::Dialect,
    /// The context that runs it (none: the machine's own interpreter).
    context: Option<String>,
    live: Arc<LiveInstruction>,
}

/// What waits in a machine's queue, in the order accepted.
enum Work {
    Instruction(Job),
    Files(files::FileJob),
}

impl MachineState {
    /// An instruction or a file operation is queued or running.
    fn has_work(&self) -> bool {
        self.running.is_some()
            || !self.queued.is_empty()
            || self.file_operations > 0
            || self.processes.as_ref().is_some_and(|p| !p.is_empty())
            || self.tunnels.as_ref().is_some_and(|t| !t.is_empty())
    }
}

#[derive(Default)]
struct MachineState {
    queued: HashSet<i64>,
    cancelled: HashSet<i64>,
    /// File operations accepted and not yet finished.
    file_operations: usize,
    running: Option<i64>,
    /// True while the machine has a sandbox.
    resident: bool,
    /// The host process at the root of that sandbox.
    resident_pid: Option<u32>,
    /// The host processes whose trees hold its memory.
    memory_roots: Vec<u32>,
    /// True while the machine's task is doing something (an instruction, a swap, a restore)
    /// rather than waiting for work: such a machine is not asked to make room for another.
    busy: bool,
    live: HashMap<i64, Arc<LiveInstruction>>,
    /// Why the machine's last sandbox ended abnormally, until its next start says so.
    recovering_from: Option<String>,
    /// Its last sandbox ended abnormally, until its next interpreter starts.
    ended_abnormally: bool,
    /// How its current (or last) interpreter began, and when.
    interpreter: Option<(
        crate::types::InterpreterStart,
        chrono::DateTime<chrono::Utc>,
    )>,
    /// The last reading of the sandbox's memory, and when it was taken.
    memory_reading: Option<(Instant, u64)>,
    /// The processes of its sandbox's agent, while it has one: a process running keeps the
    /// machine from counting as idle.
    processes: Option<Arc<crate::guest::processes::ProcessRouter>>,
    /// The connections to its sandbox's ports, while it has one: one open keeps it resident.
    tunnels: Option<Arc<crate::guest::tunnels::TunnelRouter>>,
    /// Failed swap-outs in a row, and when the idle swapper may try again.
    swap_failures: u32,
    swap_retry_at: Option<Instant>,
    /// True once the store notes that the machine may hold unsaved state (until its next save).
    marked_unsaved: bool,
    /// When its snapshot was last written, if it ever was.
    snapshot_at: Option<chrono::DateTime<chrono::Utc>>,
    /// True once that snapshot was compressed, or found to need no compression.
    snapshot_compressed: bool,
    /// The checksum of its snapshot in the bucket (with `--snapshots`), as last saved or read.
    snapshot_sha256: Option<String>,
    /// This node's lease on it, while this node runs it (in a cluster).
    lease: Option<crate::store::Lease>,
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
    /// Make an undo point the machine's state (see [`history::rewind`]).
    Rewind {
        to: i64,
        reply: oneshot::Sender<Result<crate::types::Rewound>>,
    },
    /// Compress the snapshot of a swapped machine; answers whether it did.
    Compress(oneshot::Sender<Result<bool>>),
    /// Remove the home's copy of a swapped machine's snapshot, if the bucket keeps it; answers
    /// whether it did.
    DropCopy(oneshot::Sender<Result<bool>>),
}

/// The engine's handle on one machine.
pub(crate) struct MachineHandle {
    pub name: MachineName,
    pub account_id: i64,
    pub shape: Shape,
    state: Mutex<MachineState>,
    pub durability: Durability,
    /// How many undo points it keeps (0: none).
    pub history: u32,
    /// True while its task takes an undo point (after an instruction's result is out): a
    /// history listing waits for it.
    pub(crate) taking_point: tokio::sync::watch::Sender<bool>,
    /// The environment a fresh interpreter of this machine gets (secrets included).
    env: crate::types::Env,
    /// Why its sealed secret environment could not be opened, if it could not: it then starts
    /// no fresh interpreter (which would lack the secrets).
    env_error: Option<String>,
    /// What its sandboxes may reach.
    network: crate::network::NetworkPolicy,
    /// Unbounded as a channel, bounded by [`crate::Limits::max_queued_instructions`]: an
    /// instruction is refused before it is sent when the queue is full.
    jobs: mpsc::UnboundedSender<Work>,
    controls: mpsc::Sender<Control>,
    /// Held while an instruction gets its seq and its place in the queue, so that both agree.
    enqueueing: tokio::sync::Mutex<()>,
    /// Wakes the machine's task to look at `interrupt_requested` and `deleted`.
    wake: Notify,
    interrupt_requested: AtomicBool,
    deleted: AtomicBool,
    /// When the machine last accepted or finished an instruction.
    last_active: Mutex<Instant>,
    stopped: watch::Sender<bool>,
    /// Requests about processes beside the interpreter, for its task (bounded: see
    /// [`processes::PROCESS_OPS_WAITING`]).
    process_ops: mpsc::Sender<processes::ProcessOp>,
    /// The id the next process gets on the channel.
    next_process_id: std::sync::atomic::AtomicU64,
}

impl MachineHandle {
    /// The network its sandboxes get, if it has one.
    pub(crate) fn sandbox_network(&self) -> Option<crate::sandbox::SandboxNetwork> {
        self.network
            .is_networked()
            .then(|| crate::sandbox::SandboxNetwork {
                machine: self.name.to_string(),
                policy: self.network.clone(),
            })
    }

    /// Creates the handle and starts the machine's task. With `eager`, the machine takes its
    /// sandbox at once (from the pool), so that its first instruction does not wait for one.
    pub(crate) fn spawn(
        engine: Arc<EngineInner>,
        record: &crate::store::MachineRecord,
        eager: bool,
    ) -> Arc<Self> {
        let shape = Shape {
            profile: record.image.clone(),
            memory_mb: record.memory_mb,
        };
        let state = MachineState {
            // A machine that may have held unsaved state when the last engine stopped lost it:
            // its next instruction says so.
            recovering_from: record.unsaved_since.map(|since| {
                format!(
                    "the engine stopped while the machine was running (it had changes since {}                      that were not saved)",
                    since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )
            }),
            marked_unsaved: record.unsaved_since.is_some(),
            ended_abnormally: record.unsaved_since.is_some(),
            snapshot_at: record.snapshot_at,
            snapshot_sha256: record.snapshot_sha256.clone(),
            ..MachineState::default()
        };
        let (jobs, queue) = mpsc::unbounded_channel();
        let (controls, control_requests) =
            mpsc::channel(engine.config.limits.max_waiting_operations.max(1));
        let (process_ops, process_requests) = mpsc::channel(processes::PROCESS_OPS_WAITING);
        let handle = Arc::new(Self {
            name: record.name.clone(),
            account_id: record.account_id,
            shape,
            durability: record.durability,
            history: record.history,
            taking_point: tokio::sync::watch::Sender::new(false),
            env: record.env.clone(),
            env_error: record.env_error.clone(),
            network: record.network.clone(),
            state: Mutex::new(state),
            jobs,
            controls,
            enqueueing: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            interrupt_requested: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            last_active: Mutex::new(Instant::now()),
            stopped: watch::channel(false).0,
            process_ops,
            next_process_id: std::sync::atomic::AtomicU64::new(1),
        });
        tokio::spawn(task::run(
            engine,
            Arc::clone(&handle),
            task::Queues {
                work: queue,
                controls: control_requests,
                processes: process_requests,
            },
            eager,
        ));
        handle
    }

    /// The host process at the root of the machine's sandbox, while it has one.
    pub(crate) fn sandbox_pid(&self) -> Option<u32> {
        lock(&self.state).resident_pid
    }

    pub(crate) fn resident(&self) -> bool {
        lock(&self.state).resident
    }

    /// Resident and waiting for work: it can be asked to swap out at once.
    pub(crate) fn idle_resident(&self) -> bool {
        let state = lock(&self.state);
        state.resident && !state.busy && !state.has_work()
    }

    /// Memory the machine's sandbox holds (a reading at most [`MEMORY_READING_TTL`] old); 0
    /// when it is not resident. Reads `/proc`: call it off the async workers.
    pub(crate) fn resident_bytes(&self) -> u64 {
        let roots = {
            let state = lock(&self.state);
            if let Some((at, bytes)) = state.memory_reading
                && at.elapsed() < MEMORY_READING_TTL
                && state.resident
            {
                return bytes;
            }
            state.memory_roots.clone()
        };
        let bytes = crate::sandbox::process_tree_pss(&roots);
        lock(&self.state).memory_reading = Some((Instant::now(), bytes));
        bytes
    }

    fn set_resident(&self, resident: Option<&Resident>) {
        let mut state = lock(&self.state);
        state.resident = resident.is_some();
        state.resident_pid = resident.and_then(|r| r.sandbox.pid());
        state.memory_roots = resident
            .map(|r| r.sandbox.memory_roots())
            .unwrap_or_default();
        state.memory_reading = None;
        state.processes = resident.map(|r| Arc::clone(r.agent.processes()));
        state.tunnels = resident.map(|r| Arc::clone(r.agent.tunnels()));
    }

    /// The processes of the sandbox it has, if it has one.
    fn process_router(&self) -> Option<Arc<crate::guest::processes::ProcessRouter>> {
        lock(&self.state).processes.clone()
    }

    fn set_busy(&self, busy: bool) {
        lock(&self.state).busy = busy;
    }

    /// How long since the machine last accepted or finished an instruction.
    pub(crate) fn idle_for(&self) -> Duration {
        lock(&self.last_active).elapsed()
    }

    fn touch(&self) {
        *lock(&self.last_active) = Instant::now();
    }

    pub(crate) fn has_pending_instruction(&self) -> bool {
        let state = lock(&self.state);
        state.running.is_some() || !state.queued.is_empty()
    }

    /// An instruction or a file operation is queued or running.
    pub(crate) fn has_pending_work(&self) -> bool {
        lock(&self.state).has_work()
    }

    /// Whether the idle swapper may try to swap this machine out now (not while it backs off
    /// after failures).
    pub(crate) fn may_try_swap(&self) -> bool {
        lock(&self.state)
            .swap_retry_at
            .is_none_or(|at| Instant::now() >= at)
    }

    fn swap_failed(&self) -> Duration {
        let mut state = lock(&self.state);
        state.swap_failures = state.swap_failures.saturating_add(1);
        let wait = SWAP_RETRY_FIRST
            .saturating_mul(1 << state.swap_failures.saturating_sub(1).min(10))
            .min(SWAP_RETRY_MAX);
        state.swap_retry_at = Some(Instant::now() + wait);
        wait
    }

    /// Notes that the machine's sandbox ended abnormally: its next start says so (`why`), and
    /// its next interpreter counts as restarted after a crash.
    fn ended_abnormally(&self, why: String) {
        let mut state = lock(&self.state);
        state.recovering_from = Some(why);
        state.ended_abnormally = true;
    }

    /// Notes that a new interpreter started, from the snapshot of `snapshot_at` or fresh.
    fn interpreter_started(&self, snapshot_at: Option<chrono::DateTime<chrono::Utc>>) {
        use crate::types::InterpreterStart;
        let mut state = lock(&self.state);
        let start = match (std::mem::take(&mut state.ended_abnormally), snapshot_at) {
            (true, snapshot_at) => InterpreterStart::RestartedAfterCrash { snapshot_at },
            (false, Some(snapshot_at)) => InterpreterStart::Restored { snapshot_at },
            (false, None) => InterpreterStart::Booted,
        };
        state.interpreter = Some((start, chrono::Utc::now()));
    }

    /// How its current (or last) interpreter began, and when.
    pub(crate) fn interpreter(
        &self,
    ) -> Option<(
        crate::types::InterpreterStart,
        chrono::DateTime<chrono::Utc>,
    )> {
        lock(&self.state).interpreter
    }

    /// Notes (in the store, once until the next save) that the machine may now hold state that
    /// is not on disk.
    async fn mark_unsaved(&self, engine: &EngineInner) {
        let first = {
            let mut state = lock(&self.state);
            !std::mem::replace(&mut state.marked_unsaved, true)
        };
        if first {
            let name = self.name.to_string();
            if let Err(e) = engine.store.mark_unsaved(&name).await {
                tracing::warn!(machine = %self.name, "cannot note unsaved state: {e}");
            }
        }
    }

    /// Notes in the store that the machine's whole state is in its snapshot now, and which one
    /// in the bucket (`sha256`, with `--snapshots`); the checksum it replaced. Refused when the
    /// store cannot take it: with a bucket, the save does not count until it has.
    async fn note_saved(
        &self,
        engine: &EngineInner,
        sha256: Option<String>,
    ) -> Result<Option<String>> {
        let name = self.name.to_string();
        let lease = lock(&self.state).lease.clone();
        match &lease {
            // Fenced: refused once another node took the machine.
            Some(lease) => {
                engine
                    .store
                    .mark_saved_fenced(lease, sha256.as_deref())
                    .await?;
            }
            None => engine.store.mark_saved(&name, sha256.as_deref()).await?,
        }
        let mut state = lock(&self.state);
        state.marked_unsaved = false;
        state.snapshot_at = Some(chrono::Utc::now());
        state.snapshot_compressed = false;
        Ok(std::mem::replace(&mut state.snapshot_sha256, sha256))
    }

    /// Notes this node's lease on the machine, and what the store says of it now: another node
    /// may have run it since this one did, saved it, or stopped with changes unsaved.
    async fn took_lease(&self, engine: &EngineInner, lease: crate::store::Lease) -> Result<()> {
        let name = self.name.to_string();
        let record = engine
            .store
            .machine(&name)
            .await?
            .ok_or_else(|| Error::machine_not_found(&name))?;
        let except: Vec<i64> = {
            let mut state = lock(&self.state);
            state.lease = Some(lease);
            state.snapshot_at = record.snapshot_at;
            state.snapshot_sha256 = record.snapshot_sha256;
            state.marked_unsaved = record.unsaved_since.is_some();
            if let Some(since) = record.unsaved_since
                && state.recovering_from.is_none()
            {
                state.recovering_from = Some(format!(
                    "the node that ran it stopped with changes since {} not saved",
                    since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ));
                state.ended_abnormally = true;
            }
            state.live.keys().copied().collect()
        };
        // Instructions the node that ran it before left without a result (it stopped) end now:
        // no one else would ever finish them.
        let failed = engine
            .store
            .fail_unfinished(
                "MachineCrashed: the node that ran this instruction stopped before it finished",
                crate::store::Unfinished::OfMachine {
                    machine: name,
                    except,
                },
            )
            .await?;
        if failed > 0 {
            tracing::warn!(machine = %self.name, "{failed} instructions left unfinished by another node");
        }
        Ok(())
    }

    /// Whether this node holds the machine's lease (as far as it knows: a node that could not
    /// renew its leases stops its machines and drops their handles).
    pub(crate) fn holds_lease(&self) -> bool {
        lock(&self.state).lease.is_some()
    }

    /// Takes this node's lease on the machine out of its state (to give it up).
    fn lease_given_up(&self) -> Option<crate::store::Lease> {
        lock(&self.state).lease.take()
    }

    fn swap_succeeded(&self) -> bool {
        let mut state = lock(&self.state);
        let had_failed = state.swap_failures > 0;
        state.swap_failures = 0;
        state.swap_retry_at = None;
        had_failed
    }

    /// Accepts an instruction: stores it (which gives its seq) and queues it, in the same
    /// order for every caller. Refused when the machine's queue is full or it was deleted.
    pub(crate) async fn enqueue(
        &self,
        engine: &EngineInner,
        code: String,
        timeout: Duration,
        dialect: crate::Dialect,
        context: Option<String>,
    ) -> Result<i64> {
        let _order = self.enqueueing.lock().await;
        if self.deleted.load(Ordering::SeqCst) {
            return Err(Error::machine_not_found(self.name.as_str()));
        }
        let limit = engine.config.limits.max_queued_instructions;
        let waiting = {
            // Cancelled ones leave as soon as the running one ends: they don't count.
            let state = lock(&self.state);
            state.queued.len().saturating_sub(state.cancelled.len())
        };
        if waiting >= limit {
            return Err(Error::limit_exceeded(format!(
                "machine {} already has {limit} instructions waiting to run (the limit per \
                 machine, EVERVM_MAX_QUEUED): wait for results before sending more",
                self.name
            )));
        }
        self.touch();
        let name = self.name.to_string();
        // In a cluster, an instruction is accepted only by the node that may run it: one
        // that another node runs is refused before it is stored.
        let leased = lock(&self.state).lease.is_some();
        if !leased && let Some(lease) = engine.take_lease(&name).await? {
            self.took_lease(engine, lease).await?;
        }
        let timeout_ms = timeout.as_millis() as u64;
        let stored_code = code.clone();
        let seq = engine
            .store
            .insert_instruction(&name, &stored_code, timeout_ms)
            .await?;
        let live = Arc::new(LiveInstruction::new(engine.config.limits.max_output_bytes));
        {
            let mut state = lock(&self.state);
            state.live.insert(seq, Arc::clone(&live));
            state.queued.insert(seq);
        }
        let job = Job {
            seq,
            code,
            timeout,
            dialect,
            context,
            live,
        };
        if self.jobs.send(Work::Instruction(job)).is_err() {
            return Err(Error::machine_not_found(self.name.as_str()));
        }
        Ok(seq)
    }

    /// Runs a file operation in its turn among the machine's instructions (see `files.rs`).
    /// Refused when [`crate::Limits::max_waiting_operations`] file operations already wait.
    pub(crate) async fn file_operation(
        &self,
        engine: &EngineInner,
        operation: FileOperation,
    ) -> Result<FileOutcome> {
        let (reply, answer) = oneshot::channel();
        {
            let _order = self.enqueueing.lock().await;
            if self.deleted.load(Ordering::SeqCst) {
                return Err(Error::machine_not_found(self.name.as_str()));
            }
            let limit = engine.config.limits.max_waiting_operations.max(1);
            let mut state = lock(&self.state);
            if state.file_operations >= limit {
                return Err(Error::limit_exceeded(format!(
                    "machine {} already has {limit} file operations waiting: try again when                      they are done",
                    self.name
                )));
            }
            state.file_operations += 1;
            let job = files::FileJob { operation, reply };
            if self.jobs.send(Work::Files(job)).is_err() {
                state.file_operations -= 1;
                return Err(Error::machine_not_found(self.name.as_str()));
            }
        }
        self.touch();
        let answered = answer
            .await
            .map_err(|_| Error::machine_not_found(self.name.as_str()))?;
        self.touch();
        answered
    }

    fn file_operation_done(&self) {
        let mut state = lock(&self.state);
        state.file_operations = state.file_operations.saturating_sub(1);
    }

    /// The live state of an instruction, if it is queued, running, or just finished and not
    /// yet only in the store. An instruction leaves this state only after its result is
    /// stored, so one not found here is in the store.
    pub(crate) fn live(&self, seq: i64) -> Option<Arc<LiveInstruction>> {
        lock(&self.state).live.get(&seq).cloned()
    }

    /// Cancels queued instructions and interrupts the running one. True if anything was.
    /// Interrupts instruction `seq` alone: cancelled while it waits, interrupted while it
    /// runs; false when it is neither (it finished, or never was).
    pub(crate) fn interrupt_instruction(&self, seq: i64) -> bool {
        let mut state = lock(&self.state);
        if state.queued.contains(&seq) {
            state.cancelled.insert(seq);
            return true;
        }
        if state.running == Some(seq) {
            self.interrupt_requested.store(true, Ordering::SeqCst);
            self.wake.notify_one();
            return true;
        }
        false
    }

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
        self.controls.try_send(make(reply)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Error::limit_exceeded(format!(
                "machine {} already has {} operations (swap, fork, checkpoint, rollback) \
                 waiting: try again when they are done",
                self.name,
                self.controls.max_capacity()
            )),
            mpsc::error::TrySendError::Closed(_) => Error::machine_not_found(self.name.as_str()),
        })?;
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

    /// Removes the home's copy of the machine's snapshot when it is swapped, idle, and its
    /// snapshot is in the bucket; whether it did.
    pub(crate) async fn drop_copy(&self) -> Result<bool> {
        self.control(Control::DropCopy).await
    }

    /// Makes undo point `to` (`-1`: before the last instruction) the machine's state (between
    /// instructions).
    pub(crate) async fn rewind(&self, to: i64) -> Result<crate::types::Rewound> {
        self.control(|reply| Control::Rewind { to, reply }).await
    }

    /// Replaces the machine's state with the snapshot in `from` (between instructions).
    pub(crate) async fn rollback(&self, from: PathBuf) -> Result<()> {
        self.control(|reply| Control::Rollback { from, reply })
            .await
    }

    /// Compresses the snapshot of a swapped machine (between instructions); false when there
    /// was nothing to compress (or the machine is resident again).
    pub(crate) async fn compress(&self) -> Result<bool> {
        self.control(Control::Compress).await
    }

    /// Notes that the machine's snapshot was compressed (chunked) where it lies.
    pub(super) fn snapshot_chunked(&self) {
        lock(&self.state).snapshot_compressed = true;
    }

    /// Whether the machine is swapped, unused for `idle`, with a snapshot not yet compressed.
    pub(crate) fn may_compress(&self, idle: Duration) -> bool {
        let idle_enough = self.idle_for() >= idle;
        let state = lock(&self.state);
        idle_enough
            && !state.resident
            && !state.busy
            && !state.has_work()
            && state.snapshot_at.is_some()
            && !state.snapshot_compressed
    }

    /// Stops the machine's task and its sandbox; pending instructions end as interrupted.
    pub(crate) async fn stop(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        self.interrupt();
        self.wake.notify_one();
        let mut stopped = self.stopped.subscribe();
        let _ = stopped.wait_for(|s| *s).await;
    }

    /// Takes a queued job off the queue: false if it was cancelled (or the machine deleted),
    /// else it is now the running one. Clears any interrupt request under the same lock that
    /// makes it the running one, so that an interrupt arriving from now on is never lost.
    fn start_job(&self, job: &Job) -> bool {
        let mut state = lock(&self.state);
        state.queued.remove(&job.seq);
        let cancelled = state.cancelled.remove(&job.seq) || self.deleted.load(Ordering::SeqCst);
        if !cancelled {
            self.interrupt_requested.store(false, Ordering::SeqCst);
            state.running = Some(job.seq);
        }
        !cancelled
    }
}
