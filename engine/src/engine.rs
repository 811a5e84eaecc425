//! The `Engine` facade: every operation on machines is one method here. No HTTP, no FFI.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::error::{Error, ErrorKind, Result};
use crate::guest::image::{Profile, StderrProgress};
use crate::machine::{MachineHandle, lock};
use crate::pool::{Pool, Shape};
use crate::sandbox::SandboxBackend;
use crate::sandbox::gvisor::{GvisorBackend, GvisorConfig};
use crate::sandbox::process::{ProcessBackend, ProcessBackendConfig};
use crate::store::CheckpointRecord;
use crate::store::{MachineRecord, Store};
use crate::types::{
    Account, CheckpointInfo, CreateMachine, Durability, ExecAccepted, ExecEvent, ExecRequest,
    ExecResult, ForkMachine, MAX_MEMORY_MB, MIN_MEMORY_MB, MachineInfo, MachineName, MachineState,
    Tags, validate_checkpoint_name, validate_tags,
};

/// Which sandbox backend machines run on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The best one available on this host.
    #[default]
    Auto,
    /// A backend by name (`process`).
    Named(String),
}

impl BackendChoice {
    pub fn parse(name: &str) -> Self {
        if name.is_empty() || name == "auto" {
            BackendChoice::Auto
        } else {
            BackendChoice::Named(name.to_owned())
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where the database, images and machines live.
    pub home: PathBuf,
    pub backend: BackendChoice,
    /// `memory_mb` of machines created without one.
    pub default_memory_mb: u32,
    /// How long a new sandbox may take to report ready.
    pub ready_timeout: Duration,
    /// How long past its timeout (or an interrupt) an instruction may take to stop before its
    /// sandbox is stopped.
    pub timeout_grace: Duration,
    /// Ready sandboxes kept per image and memory size (0: none); `EVERVM_POOL_SIZE`.
    pub pool_size: usize,
    /// Where root filesystem images are kept: `EVERVM_IMAGES`, else `<home>/images`.
    pub images_dir: PathBuf,
    /// A resident machine idle this long is swapped out to disk (backends with snapshots);
    /// `EVERVM_IDLE_SWAP_SECS`, 60 s by default, 0 for never.
    pub idle_swap: Option<Duration>,
    /// At most this many machines resident at once; past it the least recently used idle ones
    /// are swapped out (backends with snapshots). `EVERVM_MAX_RESIDENT`; unlimited when `None`.
    pub max_resident: Option<usize>,
    /// At most this much memory (MiB, measured: the sandboxes' proportional set size) held by
    /// resident machines; past it the least recently used idle ones are swapped out.
    /// `EVERVM_RESIDENT_MEMORY_MB`; unlimited when `None`.
    pub resident_memory_mb: Option<u64>,
    /// The runsc binary for the gVisor backend; `EVERVM_RUNSC` (or a search) when `None`.
    pub runsc: Option<PathBuf>,
    /// The gVisor platform; `EVERVM_RUNSC_PLATFORM` (or a probe) when `None`.
    pub runsc_platform: Option<String>,
}

impl EngineConfig {
    pub fn new(home: impl Into<PathBuf>) -> Self {
        let home = home.into();
        let images_dir = std::env::var_os("EVERVM_IMAGES")
            .filter(|d| !d.is_empty())
            .map_or_else(|| home.join("images"), PathBuf::from);
        let idle_swap = match std::env::var("EVERVM_IDLE_SWAP_SECS")
            .ok()
            .and_then(|n| n.parse::<u64>().ok())
        {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => Some(Duration::from_secs(60)),
        };
        let pool_size = std::env::var("EVERVM_POOL_SIZE")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2);
        let positive = |key: &str| {
            std::env::var(key)
                .ok()
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        Self {
            home,
            images_dir,
            backend: BackendChoice::Auto,
            default_memory_mb: 512,
            ready_timeout: Duration::from_secs(30),
            timeout_grace: Duration::from_secs(5),
            pool_size,
            idle_swap,
            max_resident: positive("EVERVM_MAX_RESIDENT").map(|n| n as usize),
            resident_memory_mb: positive("EVERVM_RESIDENT_MEMORY_MB"),
            runsc: None,
            runsc_platform: None,
        }
    }

    /// `$EVERVM_HOME`, else `$XDG_DATA_HOME/evervm`, else `~/.local/share/evervm`.
    pub fn default_home() -> PathBuf {
        if let Some(home) = std::env::var_os("EVERVM_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(home);
        }
        if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(data).join("evervm");
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        home.join(".local/share/evervm")
    }
}

pub(crate) struct EngineInner {
    pub(crate) config: EngineConfig,
    pub(crate) store: Mutex<Store>,
    pub(crate) backend: Box<dyn SandboxBackend>,
    pub(crate) pool: Pool,
    machines: Mutex<HashMap<String, Arc<MachineHandle>>>,
    closing: AtomicBool,
    /// True while a task is swapping machines out to get back within the resident budget.
    trimming: AtomicBool,
    /// The home's lock, held until shutdown (or drop).
    home_lock: Mutex<Option<File>>,
}

impl EngineInner {
    /// True once the engine is shutting down: no new pooled sandboxes.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    pub(crate) fn record_machine_error(&self, name: &MachineName, text: Option<&str>) {
        if let Err(e) = lock(&self.store).set_last_error(name.as_str(), text) {
            tracing::error!(machine = %name, "storing a machine error failed: {e}");
        }
    }

    /// Swaps out the least recently used idle machines (in the background) while more are
    /// resident than `max_resident` allows or they hold more than `resident_memory_mb`.
    pub(crate) fn keep_within_budget(self: &Arc<Self>) {
        let (count_limit, memory_limit) =
            (self.config.max_resident, self.config.resident_memory_mb);
        if (count_limit.is_none() && memory_limit.is_none())
            || !self.backend.capabilities().snapshots
            || self.trimming.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let mut resident: Vec<(Arc<MachineHandle>, Duration, u64)> = lock(&engine.machines)
                    .values()
                    .filter(|h| h.resident())
                    .map(|h| (Arc::clone(h), h.idle_for(), 0))
                    .collect();
                let mut over_count =
                    count_limit.map_or(0, |limit| resident.len().saturating_sub(limit));
                let mut over_bytes = 0;
                if let Some(limit) = memory_limit {
                    for entry in &mut resident {
                        entry.2 = entry.0.resident_bytes();
                    }
                    let total: u64 = resident.iter().map(|e| e.2).sum();
                    over_bytes = total.saturating_sub(limit * 1024 * 1024);
                }
                if (over_count == 0 && over_bytes == 0) || engine.closing() {
                    break;
                }
                // Least recently used first; a machine with work to do stays.
                resident.retain(|(h, _, _)| !h.has_pending_instruction());
                resident.sort_by_key(|entry| std::cmp::Reverse(entry.1));
                let mut victims = Vec::new();
                for (handle, _, bytes) in resident {
                    if over_count == 0 && over_bytes == 0 {
                        break;
                    }
                    over_count = over_count.saturating_sub(1);
                    over_bytes = over_bytes.saturating_sub(bytes);
                    victims.push(handle);
                }
                if victims.is_empty() {
                    break;
                }
                // A few at a time: a checkpoint waits on disk as much as on the processor.
                futures::stream::iter(victims)
                    .for_each_concurrent(4, |handle| async move {
                        if let Err(e) = handle.swap_out().await {
                            tracing::warn!(machine = %handle.name, "could not swap out to stay within the resident budget: {e}");
                        }
                    })
                    .await;
            }
            engine.trimming.store(false, Ordering::SeqCst);
        });
    }

    /// What a crash costs on this backend, for error texts.
    pub(crate) fn state_loss_note(&self) -> String {
        if self.backend.capabilities().snapshots {
            "its next instruction restores its last snapshot (a machine never swapped out starts \
             a fresh interpreter)"
                .to_owned()
        } else {
            format!(
                "its interpreter state was lost (the {} backend cannot snapshot) and the next \
                 instruction starts a fresh one",
                self.backend.name()
            )
        }
    }
}

/// The evervm engine. Cheap to clone; all clones share one engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("home", &self.inner.config.home)
            .field("backend", &self.inner.backend.name())
            .finish_non_exhaustive()
    }
}

/// Takes the home's lock file, or says which process holds it.
fn lock_home(home: &Path) -> Result<File> {
    let path = home.join("evervm.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
    // A lock just released can still be held for a moment by a child forked meanwhile (it holds
    // the descriptor until its exec closes it): try again briefly before naming the holder.
    let mut locked = file.try_lock();
    for _ in 0..40 {
        if !matches!(locked, Err(std::fs::TryLockError::WouldBlock)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
        locked = file.try_lock();
    }
    match locked {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let holder = if holder.is_empty() {
                "another process".to_owned()
            } else {
                format!("process {holder}")
            };
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "the evervm home {} is in use by {holder}: stop that engine or use another \
                     home (--home or EVERVM_HOME)",
                    home.display()
                ),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Error::internal(format!(
                "cannot lock {}: {e}",
                path.display()
            )));
        }
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(file)
}

fn process_backend(config: &EngineConfig) -> Result<Box<dyn SandboxBackend>> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let as_root = unsafe { libc::geteuid() } == 0;
    // Machines run as `nobody` under root and must reach their working directory, which a home
    // below /root would not allow.
    let work_root = if as_root {
        let digest = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(
                config.home.as_os_str().as_encoded_bytes(),
            ))
        };
        std::env::temp_dir().join(format!("evervm-process-{}", &digest[..12]))
    } else {
        config.home.join("work")
    };
    let backend_config = ProcessBackendConfig::detect(work_root)?;
    Ok(Box::new(ProcessBackend::new(backend_config)?))
}

async fn gvisor_backend(config: &EngineConfig) -> Result<Box<dyn SandboxBackend>> {
    let mut gvisor = GvisorConfig::new(config.home.clone(), config.images_dir.clone());
    gvisor.runsc = config.runsc.clone().or(gvisor.runsc);
    gvisor.platform = config.runsc_platform.clone().or(gvisor.platform);
    Ok(Box::new(
        GvisorBackend::open(gvisor, Arc::new(StderrProgress::default())).await?,
    ))
}

/// The configured backend; for `auto`, gVisor where it runs here, else the process backend.
async fn choose_backend(config: &EngineConfig) -> Result<Box<dyn SandboxBackend>> {
    match &config.backend {
        BackendChoice::Auto => match gvisor_backend(config).await {
            Ok(backend) => Ok(backend),
            Err(e) => {
                tracing::warn!(
                    "gVisor is not available ({e}); machines run on the process backend, which \
                     is not a security boundary"
                );
                process_backend(config)
            }
        },
        BackendChoice::Named(name) => match name.as_str() {
            "process" => process_backend(config),
            "gvisor" => gvisor_backend(config).await,
            other => Err(Error::invalid(format!(
                "unknown backend {other:?}: use `gvisor`, `process` or `auto`"
            ))),
        },
    }
}

impl Engine {
    /// Opens the engine on its home, creating the home on first use (for gVisor, the first
    /// start also builds the root filesystem image, with progress on stderr). The tokio runtime
    /// it is called in then runs the machines.
    pub async fn open(config: EngineConfig) -> Result<Self> {
        std::fs::create_dir_all(&config.home).map_err(|e| {
            Error::internal(format!(
                "cannot create the evervm home {}: {e}",
                config.home.display()
            ))
        })?;
        let lock_file = lock_home(&config.home)?;
        let mut store = Store::open(&config.home.join("evervm.db"))?;
        crate::snapshot::recover(&config.home);
        let backend = choose_backend(&config).await?;
        let unfinished = store.fail_unfinished(
            "MachineCrashed: the engine stopped before this instruction finished",
        )?;
        if unfinished > 0 {
            tracing::warn!("{unfinished} instructions were left unfinished by the last engine");
        }
        let engine = Self {
            inner: Arc::new(EngineInner {
                config,
                store: Mutex::new(store),
                backend,
                pool: Pool::default(),
                machines: Mutex::new(HashMap::new()),
                closing: AtomicBool::new(false),
                trimming: AtomicBool::new(false),
                home_lock: Mutex::new(Some(lock_file)),
            }),
        };
        Pool::refill(&engine.inner, engine.default_shape());
        if engine.inner.backend.capabilities().snapshots
            && let Some(idle) = engine.inner.config.idle_swap
        {
            tokio::spawn(swap_idle_machines(Arc::downgrade(&engine.inner), idle));
        }
        Ok(engine)
    }

    fn default_shape(&self) -> Shape {
        Shape {
            profile: Profile::Minimal,
            memory_mb: self.inner.config.default_memory_mb,
        }
    }

    /// The backend and its exact version (for gVisor: the runsc and its platform).
    pub fn backend_description(&self) -> String {
        self.inner.backend.describe()
    }

    /// How many ready sandboxes the pool holds now.
    pub fn pooled_sandboxes(&self) -> usize {
        self.inner.pool.len()
    }

    pub fn home(&self) -> &Path {
        &self.inner.config.home
    }

    /// The sandbox backend in use (`process`, `gvisor`).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    // --- accounts -------------------------------------------------------------------------

    /// The account with this name, created if needed.
    pub fn ensure_account(&self, name: &str) -> Result<Account> {
        validate_account_name(name)?;
        lock(&self.inner.store).ensure_account(name)
    }

    /// Creates a token (`id.secret`) for the named account, creating the account if needed.
    pub fn create_token(&self, account_name: &str) -> Result<String> {
        validate_account_name(account_name)?;
        let mut store = lock(&self.inner.store);
        let account = store.ensure_account(account_name)?;
        store.create_token(&account)
    }

    /// How many tokens exist (a fresh home has none).
    pub fn token_count(&self) -> Result<i64> {
        lock(&self.inner.store).count_tokens()
    }

    /// The account a token belongs to.
    pub fn authenticate(&self, token: &str) -> Result<Account> {
        lock(&self.inner.store).authenticate(token)
    }

    // --- machines -------------------------------------------------------------------------

    pub fn create_machine(&self, account: &Account, request: CreateMachine) -> Result<MachineInfo> {
        self.refuse_when_closed()?;
        validate_tags(&request.tags)?;
        let memory_mb = request
            .memory_mb
            .unwrap_or(self.inner.config.default_memory_mb);
        if !(MIN_MEMORY_MB..=MAX_MEMORY_MB).contains(&memory_mb) {
            return Err(Error::invalid(format!(
                "memory_mb must be between {MIN_MEMORY_MB} and {MAX_MEMORY_MB}, not {memory_mb}"
            )));
        }
        let profile = Profile::parse(request.image.as_deref().unwrap_or("minimal"))?;
        let durability = request.durability.unwrap_or_default();
        if durability == Durability::Instruction && !self.inner.backend.capabilities().snapshots {
            return Err(Error::unsupported(format!(
                "durability `instruction` needs snapshots, which the {} backend cannot take (the \
                 gVisor backend can)",
                self.inner.backend.name()
            )));
        }
        let record = MachineRecord {
            name: MachineName::generate(),
            account_id: account.id,
            created_at: Utc::now(),
            tags: request.tags,
            memory_mb,
            image: profile,
            backend: self.inner.backend.name().to_owned(),
            next_seq: 0,
            last_used_at: None,
            last_error: None,
            durability,
        };
        lock(&self.inner.store).insert_machine(&record)?;
        let handle = self.spawn_handle(&record, true);
        Ok(self.info_of(&record, Some(&handle)))
    }

    fn spawn_handle(&self, record: &MachineRecord, eager: bool) -> Arc<MachineHandle> {
        let mut machines = lock(&self.inner.machines);
        let shape = Shape {
            profile: record.image,
            memory_mb: record.memory_mb,
        };
        Arc::clone(machines.entry(record.name.to_string()).or_insert_with(|| {
            MachineHandle::spawn(
                Arc::clone(&self.inner),
                record.name.clone(),
                record.account_id,
                shape,
                record.durability,
                eager,
            )
        }))
    }

    fn record(&self, account: &Account, name: &str) -> Result<MachineRecord> {
        let parsed = MachineName::parse(name)?;
        match lock(&self.inner.store).machine(parsed.as_str())? {
            Some(record) if record.account_id == account.id => Ok(record),
            _ => Err(Error::machine_not_found(name)),
        }
    }

    fn refuse_when_closed(&self) -> Result<()> {
        if self.inner.closing() {
            return Err(Error::new(
                ErrorKind::Conflict,
                "the engine has shut down: open it again to use its machines",
            ));
        }
        Ok(())
    }

    fn handle(&self, account: &Account, name: &str) -> Result<Arc<MachineHandle>> {
        self.refuse_when_closed()?;
        if let Some(handle) = lock(&self.inner.machines).get(name) {
            if handle.account_id == account.id {
                return Ok(Arc::clone(handle));
            }
            return Err(Error::machine_not_found(name));
        }
        let record = self.record(account, name)?;
        Ok(self.spawn_handle(&record, false))
    }

    fn info_of(&self, record: &MachineRecord, handle: Option<&Arc<MachineHandle>>) -> MachineInfo {
        let home = &self.inner.config.home;
        let name = record.name.as_str();
        let restorable = |runtime: &str| self.inner.backend.restorable(runtime);
        let snapshot = crate::snapshot::quick_check(home, name, &restorable);
        let (resident, pending) = handle.map_or((false, false), |h| {
            (h.resident(), h.has_pending_instruction())
        });
        MachineInfo {
            name: record.name.clone(),
            created_at: record.created_at,
            tags: record.tags.clone(),
            memory_mb: record.memory_mb,
            image: record.image.as_str().to_owned(),
            backend: record.backend.clone(),
            state: match (resident, &snapshot) {
                (true, _) => MachineState::Resident,
                (false, Some(Err(_))) => MachineState::Damaged,
                (false, Some(Ok(()))) => MachineState::Swapped,
                (false, None) => MachineState::Stopped,
            },
            disk_bytes: crate::snapshot::disk_bytes(home, name),
            resident_bytes: handle.map_or(0, |h| h.resident_bytes()),
            durability: record.durability,
            has_pending_instruction: pending,
            instruction_count: record.next_seq,
            last_used_at: record.last_used_at,
            // A damaged snapshot's reason comes first: it is what stands in the way now.
            last_error: match (resident, snapshot) {
                (false, Some(Err(reason))) => Some(reason),
                _ => record.last_error.clone(),
            },
        }
    }

    /// The account's machines that carry every given tag, newest first.
    pub fn list_machines(&self, account: &Account, filter: &Tags) -> Result<Vec<MachineInfo>> {
        let records = lock(&self.inner.store).machines(account.id)?;
        let machines = lock(&self.inner.machines);
        Ok(records
            .iter()
            .filter(|r| filter.iter().all(|(k, v)| r.tags.get(k) == Some(v)))
            .map(|r| self.info_of(r, machines.get(r.name.as_str())))
            .collect())
    }

    pub fn machine_info(&self, account: &Account, name: &str) -> Result<MachineInfo> {
        let record = self.record(account, name)?;
        let handle = lock(&self.inner.machines).get(name).cloned();
        Ok(self.info_of(&record, handle.as_ref()))
    }

    /// Queues an instruction and returns at once with its seq.
    pub fn exec(
        &self,
        account: &Account,
        name: &str,
        request: ExecRequest,
    ) -> Result<ExecAccepted> {
        request.validate()?;
        let handle = self.handle(account, name)?;
        let interrupted = request.interrupt && handle.interrupt();
        let timeout_ms = request.timeout.as_millis() as u64;
        let seq = handle.enqueue(request.code.clone(), request.timeout, || {
            lock(&self.inner.store).insert_instruction(name, &request.code, timeout_ms)
        })?;
        Ok(ExecAccepted { seq, interrupted })
    }

    /// Interrupts the running instruction and cancels queued ones. True if there was any.
    pub fn interrupt(&self, account: &Account, name: &str) -> Result<bool> {
        Ok(self.handle(account, name)?.interrupt())
    }

    /// Waits for an instruction's result (at once if it already finished).
    pub async fn result(&self, account: &Account, name: &str, seq: i64) -> Result<ExecResult> {
        let handle = self.handle(account, name)?;
        let found = handle.live_or(seq, || {
            lock(&self.inner.store).instruction_result(name, seq)
        })?;
        match found {
            Ok(live) => Ok(live.wait_result().await),
            Err(Some(Some(result))) => Ok(result),
            Err(Some(None)) => Err(Error::internal(format!(
                "instruction {seq} of {name} has no result and is not running"
            ))),
            Err(None) => Err(Error::instruction_not_found(name, seq)),
        }
    }

    /// An instruction's output, then its result: live while it runs, replayed from the store
    /// after it finished.
    pub fn events(
        &self,
        account: &Account,
        name: &str,
        seq: i64,
    ) -> Result<BoxStream<'static, ExecEvent>> {
        let handle = self.handle(account, name)?;
        let found = handle.live_or(seq, || {
            let store = lock(&self.inner.store);
            match store.instruction_result(name, seq)? {
                Some(Some(result)) => Ok(Some((store.instruction_output(name, seq)?, result))),
                Some(None) => Err(Error::internal(format!(
                    "instruction {seq} of {name} has no result and is not running"
                ))),
                None => Ok(None),
            }
        })?;
        match found {
            Ok(live) => Ok(live.events().boxed()),
            Err(Some((chunks, result))) => Ok(futures::stream::iter(
                chunks
                    .into_iter()
                    .map(ExecEvent::Output)
                    .chain(std::iter::once(ExecEvent::Result(result))),
            )
            .boxed()),
            Err(None) => Err(Error::instruction_not_found(name, seq)),
        }
    }

    /// Deletes a machine: its sandbox, its files, its instructions and their output.
    pub async fn delete_machine(&self, account: &Account, name: &str) -> Result<()> {
        let handle = self.handle(account, name)?;
        handle.stop().await;
        lock(&self.inner.store).delete_machine(name)?;
        lock(&self.inner.machines).remove(name);
        crate::snapshot::remove(&self.inner.config.home, name)
    }

    /// Saves a machine to disk (memory, files, everything) and releases its sandbox; its next
    /// instruction restores it. Waits for the running instruction to finish first.
    pub async fn swap_out(&self, account: &Account, name: &str) -> Result<()> {
        self.handle(account, name)?.swap_out().await
    }

    /// A new machine from another's current state (memory, files, everything), with its own
    /// tags (the parent's when `None`). The parent waits for its running instruction, is saved,
    /// and carries on where it was; the fork's random generators are reseeded, so the two never
    /// draw the same numbers.
    pub async fn fork_machine(
        &self,
        account: &Account,
        name: &str,
        request: ForkMachine,
    ) -> Result<MachineInfo> {
        let parent = self.record(account, name)?;
        let tags = request.tags.unwrap_or_else(|| parent.tags.clone());
        validate_tags(&tags)?;
        let handle = self.handle(account, name)?;
        let child = MachineRecord {
            name: MachineName::generate(),
            created_at: Utc::now(),
            tags,
            next_seq: 0,
            last_used_at: None,
            last_error: None,
            ..parent
        };
        let home = &self.inner.config.home;
        let target = crate::snapshot::snapshot_dir(home, child.name.as_str());
        if let Err(e) = handle.copy_out(target, true).await {
            let _ = crate::snapshot::remove(home, child.name.as_str());
            return Err(e);
        }
        if let Err(e) = lock(&self.inner.store).insert_machine(&child) {
            let _ = crate::snapshot::remove(home, child.name.as_str());
            return Err(e);
        }
        let handle = self.spawn_handle(&child, true);
        Ok(self.info_of(&child, Some(&handle)))
    }

    /// Saves the machine's current state as a named checkpoint (a generated name when `None`);
    /// the machine carries on. Waits for its running instruction first.
    pub async fn create_checkpoint(
        &self,
        account: &Account,
        name: &str,
        checkpoint: Option<String>,
    ) -> Result<CheckpointInfo> {
        let _ = self.record(account, name)?;
        let checkpoint =
            checkpoint.unwrap_or_else(|| Utc::now().format("cp-%Y%m%d-%H%M%S-%3f").to_string());
        validate_checkpoint_name(&checkpoint)?;
        let handle = self.handle(account, name)?;
        let home = &self.inner.config.home;
        let dir = crate::snapshot::checkpoint_dir(home, name, &checkpoint);
        // The row first: it reserves the name.
        let mut record = CheckpointRecord {
            name: checkpoint.clone(),
            created_at: Utc::now(),
            instruction_count: 0,
        };
        lock(&self.inner.store).insert_checkpoint(name, &record)?;
        let copied = handle.copy_out(dir.clone(), false).await;
        let stored = copied.and_then(|first_excluded| {
            record.instruction_count = first_excluded;
            record.created_at = Utc::now();
            lock(&self.inner.store).complete_checkpoint(name, &record)
        });
        if let Err(e) = stored {
            let _ = lock(&self.inner.store).delete_checkpoint(name, &checkpoint);
            let _ = crate::snapshot::remove_checkpoint(home, name, &checkpoint);
            return Err(e);
        }
        Ok(self.checkpoint_info(name, record))
    }

    fn checkpoint_info(&self, machine: &str, record: CheckpointRecord) -> CheckpointInfo {
        let dir = crate::snapshot::checkpoint_dir(&self.inner.config.home, machine, &record.name);
        CheckpointInfo {
            name: record.name,
            created_at: record.created_at,
            instruction_count: record.instruction_count,
            disk_bytes: crate::snapshot::dir_bytes(&dir),
        }
    }

    /// The machine's checkpoints, oldest first.
    pub fn list_checkpoints(&self, account: &Account, name: &str) -> Result<Vec<CheckpointInfo>> {
        let _ = self.record(account, name)?;
        let records = lock(&self.inner.store).checkpoints(name)?;
        Ok(records
            .into_iter()
            .map(|r| self.checkpoint_info(name, r))
            .collect())
    }

    fn find_checkpoint(&self, machine: &str, checkpoint: &str) -> Result<CheckpointRecord> {
        lock(&self.inner.store)
            .checkpoints(machine)?
            .into_iter()
            .find(|c| c.name == checkpoint)
            .ok_or_else(|| Error::checkpoint_not_found(machine, checkpoint))
    }

    /// Returns the machine to a checkpoint's state (also a damaged machine). Waits for its
    /// running instruction first; instructions run since the checkpoint stay in the history,
    /// marked as rolled back.
    pub async fn rollback(
        &self,
        account: &Account,
        name: &str,
        checkpoint: &str,
    ) -> Result<MachineInfo> {
        let record = self.record(account, name)?;
        let found = self.find_checkpoint(name, checkpoint)?;
        let dir = crate::snapshot::checkpoint_dir(&self.inner.config.home, name, checkpoint);
        let restorable = |runtime: &str| self.inner.backend.restorable(runtime);
        if crate::snapshot::verify_dir(&dir, &restorable)?.is_none() {
            return Err(Error::new(
                ErrorKind::MachineCrashed,
                format!(
                    "the files of checkpoint {checkpoint:?} of {name} are missing ({})",
                    dir.display()
                ),
            ));
        }
        let handle = self.handle(account, name)?;
        handle.rollback(dir).await?;
        lock(&self.inner.store).mark_rolled_back(name, &found)?;
        Ok(self.info_of(&record, Some(&handle)))
    }

    /// Deletes a checkpoint (the machine itself is untouched).
    pub fn delete_checkpoint(&self, account: &Account, name: &str, checkpoint: &str) -> Result<()> {
        let _ = self.record(account, name)?;
        self.find_checkpoint(name, checkpoint)?;
        crate::snapshot::remove_checkpoint(&self.inner.config.home, name, checkpoint)?;
        lock(&self.inner.store).delete_checkpoint(name, checkpoint)?;
        Ok(())
    }

    /// Stops the engine: resident machines are swapped out to disk where the backend can, every
    /// sandbox stops, and the home is released for the next engine. Afterwards every operation
    /// on machines is refused.
    pub async fn shutdown(&self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        let handles: Vec<_> = lock(&self.inner.machines).drain().map(|(_, h)| h).collect();
        let snapshots = self.inner.backend.capabilities().snapshots;
        for handle in handles {
            // Resident machines go to disk, so the next engine finds them as they were.
            if snapshots
                && handle.resident()
                && let Err(e) = handle.swap_out().await
            {
                tracing::warn!(machine = %handle.name, "could not swap out at shutdown: {e}");
            }
            handle.stop().await;
        }
        self.inner.pool.drain().await;
        lock(&self.inner.home_lock).take();
    }
}

/// Swaps out resident machines idle for `idle`, until the engine is gone.
async fn swap_idle_machines(engine: std::sync::Weak<EngineInner>, idle: Duration) {
    let period = (idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        tokio::time::sleep(period).await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if engine.closing() {
            return;
        }
        let idle_machines: Vec<Arc<MachineHandle>> = lock(&engine.machines)
            .values()
            .filter(|h| h.resident() && !h.has_pending_instruction() && h.idle_for() >= idle)
            .cloned()
            .collect();
        drop(engine);
        for handle in idle_machines {
            if let Err(e) = handle.swap_out().await {
                tracing::warn!(machine = %handle.name, "could not swap out an idle machine: {e}");
            }
        }
    }
}

fn validate_account_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "account name {name:?} must be 1 to 64 letters, digits, '_' or '-'"
        )))
    }
}

/// Creates a token for an account directly in a home's database, without taking the engine's
/// lock, so that it works while a server runs on that home.
pub fn create_token_in_home(home: &Path, account_name: &str) -> Result<String> {
    validate_account_name(account_name)?;
    std::fs::create_dir_all(home).map_err(|e| {
        Error::internal(format!(
            "cannot create the evervm home {}: {e}",
            home.display()
        ))
    })?;
    let mut store = Store::open(&home.join("evervm.db"))?;
    let account = store.ensure_account(account_name)?;
    store.create_token(&account)
}
