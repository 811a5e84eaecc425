//! What every part of the engine shares: its settings, the store, the backend, the pool, the
//! machines' handles, and the bookkeeping that keeps callers within their limits.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::EngineConfig;
use crate::error::{Error, Result};
use crate::machine::MachineHandle;
use crate::pool::Pool;
use crate::sandbox::SandboxBackend;
use crate::snapshot;
use crate::store::Metadata;
use crate::sync::lock;
use crate::types::MachineName;

/// Whether a runtime (a snapshot's `runtime`) can be restored, callable from any thread.
pub(crate) type Restorable = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What the disk holds for a machine, as last read (reading it touches several files per
/// machine: a list of thousands of machines reads it from memory).
#[derive(Debug, Clone, Default)]
pub(crate) struct DiskFacts {
    /// `None` without a snapshot; else whether a look without reading it all finds it usable,
    /// and why not.
    pub snapshot: Option<std::result::Result<(), String>>,
    /// Bytes of the snapshot itself (a chunked one's: its recipes and the compressed chunks
    /// they name).
    pub snapshot_bytes: u64,
    /// Bytes of the snapshot and the checkpoints (hard-linked files once).
    pub disk_bytes: u64,
}

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
struct Bucket {
    tokens: f64,
    at: Instant,
}

pub(crate) struct EngineInner {
    pub(crate) config: EngineConfig,
    pub(crate) store: Arc<dyn Metadata>,
    /// Where snapshots are kept beyond the home (`--snapshots`).
    pub(crate) bucket: Option<crate::bucket::Bucket>,
    /// This engine's standing as a node of a cluster, when it is one.
    pub(crate) node: Option<super::node::Node>,
    pub(crate) backend: Arc<dyn SandboxBackend>,
    /// The home's snapshot chunk store.
    pub(crate) chunks: Arc<crate::chunks::ChunkStore>,
    /// Set when snapshots may have been replaced or removed since the last collection of
    /// chunks (see [`super::chunks`]).
    pub(crate) chunks_dirty: AtomicBool,
    pub(crate) pool: Pool,
    pub(crate) machines: Mutex<HashMap<String, Arc<MachineHandle>>>,
    /// Held while a machine's handle is made or a machine is deleted, so that a lookup racing
    /// a delete can never bring the deleted machine back.
    pub(crate) membership: tokio::sync::Mutex<()>,
    /// Machines being deleted: lookups of them fail at once.
    pub(crate) deleting: Mutex<HashSet<String>>,
    pub(crate) closing: AtomicBool,
    /// True while a task is swapping machines out to get back within the resident budget.
    pub(crate) trimming: AtomicBool,
    /// True while a task removes copies of snapshots to keep the home's cache within bounds.
    pub(crate) evicting: AtomicBool,
    /// The home's lock, held until shutdown (or drop).
    pub(crate) home_lock: Mutex<Option<File>>,
    disk: Mutex<HashMap<String, DiskFacts>>,
    rates: Mutex<HashMap<i64, Bucket>>,
    pub(crate) metrics: crate::metrics::Metrics,
    /// The audit log's writer.
    pub(crate) audit: super::audit::AuditLog,
    /// The package index and wheel cache of `install` (an unusable index URL is told at install).
    pub(crate) packages: Result<crate::packages::index::PackageIndex>,
}

impl EngineInner {
    pub(crate) fn new(
        config: EngineConfig,
        store: Arc<dyn Metadata>,
        bucket: Option<crate::bucket::Bucket>,
        backend: Arc<dyn SandboxBackend>,
        chunks: Arc<crate::chunks::ChunkStore>,
        home_lock: File,
    ) -> Self {
        let packages =
            crate::packages::index::PackageIndex::new(&config.packages, config.home.join("wheels"));
        let metrics = crate::metrics::Metrics::default();
        let audit = super::audit::AuditLog::start(
            Arc::clone(&store),
            config.node.as_ref().map(|node| node.id.clone()),
            &config.audit,
            metrics.audit_counter(),
        );
        Self {
            node: config.node.clone().map(super::node::Node::new),
            audit,
            config,
            store,
            bucket,
            backend,
            chunks,
            chunks_dirty: AtomicBool::new(true),
            pool: Pool::default(),
            machines: Mutex::new(HashMap::new()),
            membership: tokio::sync::Mutex::new(()),
            deleting: Mutex::new(HashSet::new()),
            closing: AtomicBool::new(false),
            trimming: AtomicBool::new(false),
            evicting: AtomicBool::new(false),
            home_lock: Mutex::new(Some(home_lock)),
            disk: Mutex::new(HashMap::new()),
            rates: Mutex::new(HashMap::new()),
            packages,
            metrics,
        }
    }

    /// True once the engine is shutting down: no new pooled sandboxes.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Sets (or clears) the error shown in a machine's info.
    pub(crate) async fn record_machine_error(&self, name: &MachineName, text: Option<&str>) {
        let machine = name.to_string();
        let text = text.map(str::to_owned);
        let stored = self.store.set_last_error(&machine, text.as_deref()).await;
        if let Err(e) = stored {
            tracing::error!(machine = %name, "storing a machine error failed: {e}");
        }
    }

    /// Which runtimes this engine's backend restores.
    pub(crate) fn restorable(&self) -> Restorable {
        let backend = Arc::clone(&self.backend);
        Arc::new(move |runtime: &str| backend.restorable(runtime))
    }

    /// What the disk holds for a machine: remembered, or read now (blocking I/O: call it off
    /// the async workers).
    pub(crate) fn disk_facts(&self, machine: &str) -> DiskFacts {
        if let Some(facts) = lock(&self.disk).get(machine) {
            return facts.clone();
        }
        let facts = self.read_disk_facts(machine);
        lock(&self.disk).insert(machine.to_owned(), facts.clone());
        facts
    }

    /// [`Self::disk_facts`] read from the disk now (and remembered).
    pub(crate) fn fresh_disk_facts(&self, machine: &str) -> DiskFacts {
        let facts = self.read_disk_facts(machine);
        lock(&self.disk).insert(machine.to_owned(), facts.clone());
        facts
    }

    fn read_disk_facts(&self, machine: &str) -> DiskFacts {
        let home = &self.config.home;
        let restorable = |runtime: &str| self.backend.restorable(runtime);
        // Chunked snapshots, checkpoints and undo points hold recipes: what they name in the
        // chunk store counts too (once per machine, however many of them name a chunk).
        let current = snapshot::snapshot_dir(home, machine);
        let mut dirs = vec![current.clone()];
        let machine_dir = snapshot::machine_dir(home, machine);
        for kind in ["checkpoints", "history"] {
            if let Ok(entries) = std::fs::read_dir(machine_dir.join(kind)) {
                dirs.extend(entries.flatten().map(|e| e.path()));
            }
        }
        DiskFacts {
            snapshot: snapshot::quick_check(home, machine, &restorable),
            snapshot_bytes: snapshot::dir_bytes(&current)
                + self.chunks.referenced_bytes(std::slice::from_ref(&current)),
            disk_bytes: snapshot::disk_bytes(home, machine) + self.chunks.referenced_bytes(&dirs),
        }
    }

    /// Forgets what the disk held for a machine: called whenever the engine changes its files.
    pub(crate) fn forget_disk_facts(&self, machine: &str) {
        lock(&self.disk).remove(machine);
    }

    /// Takes one instruction from the account's allowance, or says when there is none left.
    pub(crate) fn take_instruction_token(&self, account_id: i64) -> Result<()> {
        let limits = &self.config.limits;
        if limits.instructions_per_second <= 0.0 {
            return Ok(());
        }
        let burst = f64::from(limits.instruction_burst.max(1));
        let mut rates = lock(&self.rates);
        let now = Instant::now();
        let bucket = rates.entry(account_id).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let earned = now.duration_since(bucket.at).as_secs_f64() * limits.instructions_per_second;
        bucket.tokens = (bucket.tokens + earned).min(burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Err(Error::limit_exceeded(format!(
                "this account started more than {} instructions a second (bursts up to {}; \
                 EVERVM_INSTRUCTION_RATE and EVERVM_INSTRUCTION_BURST on the server): slow down \
                 and try again",
                limits.instructions_per_second, limits.instruction_burst
            )));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }

    /// Makes room within the account's resident memory limit for `machine` (of `memory_mb`)
    /// to become resident: swaps out the account's least recently used idle machines while the
    /// limit would be passed, and refuses when that is not enough.
    pub(crate) async fn make_room_for(
        &self,
        account_id: i64,
        machine: &str,
        memory_mb: u32,
    ) -> Result<()> {
        let limit = self.config.limits.max_resident_mb_per_account;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (used, mut idle): (u64, Vec<(Duration, Arc<MachineHandle>)>) = {
                let machines = lock(&self.machines);
                let mine = machines.values().filter(|h| {
                    h.account_id == account_id && h.name.as_str() != machine && h.resident()
                });
                let used = mine.clone().map(|h| u64::from(h.shape.memory_mb)).sum();
                let idle = mine
                    .filter(|h| h.idle_resident())
                    .map(|h| (h.idle_for(), Arc::clone(h)))
                    .collect();
                (used, idle)
            };
            if used + u64::from(memory_mb) <= limit {
                return Ok(());
            }
            if !self.backend.capabilities().snapshots
                || idle.is_empty()
                || Instant::now() > deadline
            {
                return Err(Error::limit_exceeded(format!(
                    "this account's resident machines hold {used} MiB and {machine} needs \
                     {memory_mb} MiB more, past the limit of {limit} MiB per account \
                     (EVERVM_ACCOUNT_RESIDENT_MB on the server): wait for idle machines to swap \
                     out, swap some out, or delete some"
                )));
            }
            // The longest idle first.
            idle.sort_by_key(|(idle_for, _)| std::cmp::Reverse(*idle_for));
            let (_, victim) = idle.swap_remove(0);
            if let Err(e) = victim.swap_out().await {
                tracing::warn!(machine = %victim.name, "could not swap out to make room: {e}");
            }
        }
    }

    /// Bytes of snapshots and checkpoints the account's machines hold on disk.
    pub(crate) async fn account_disk_bytes(self: &Arc<Self>, account_id: i64) -> Result<u64> {
        let names: Vec<String> = self
            .store
            .machines(account_id)
            .await?
            .into_iter()
            .map(|r| r.name.to_string())
            .collect();
        let engine = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            names
                .iter()
                .map(|name| engine.disk_facts(name).disk_bytes)
                .sum()
        })
        .await
        .map_err(|e| Error::internal(format!("measuring the account's disk stopped: {e}")))
    }

    /// Refuses a new snapshot copy (a fork, a checkpoint) once the account's machines hold as
    /// much disk as its limit allows.
    pub(crate) async fn check_disk_quota(self: &Arc<Self>, account_id: i64) -> Result<()> {
        let limit_mb = self.config.limits.max_disk_mb_per_account;
        let used = self.account_disk_bytes(account_id).await?;
        if used >= limit_mb.saturating_mul(1024 * 1024) {
            return Err(Error::limit_exceeded(format!(
                "this account's snapshots and checkpoints take {} MiB of disk, the limit per \
                 account is {limit_mb} MiB (EVERVM_ACCOUNT_DISK_MB on the server): delete \
                 checkpoints or machines first",
                used / (1024 * 1024)
            )));
        }
        Ok(())
    }

    /// `<home>/reserve`: room held back on the home's disk, given up when a machine has to be
    /// brought back from a checkpoint that could not be committed because the disk is full (a
    /// restore writes a few small files), and taken again after the next successful save.
    fn reserve_path(&self) -> std::path::PathBuf {
        self.config.home.join("reserve")
    }

    /// Takes the reserve if it is not held (best effort: on a full disk it waits for later).
    pub(crate) fn hold_reserve(&self) {
        const RESERVE_BYTES: usize = 8 * 1024 * 1024;
        let path = self.reserve_path();
        if path.exists() {
            return;
        }
        let written = crate::fsutil::write_durably(&path, &vec![0u8; RESERVE_BYTES]);
        if let Err(e) = written {
            tracing::debug!("cannot hold the disk reserve yet: {e}");
        }
    }

    /// Gives up the reserve, so that what follows finds room on a full disk.
    pub(crate) fn release_reserve(&self) {
        let _ = std::fs::remove_file(self.reserve_path());
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
