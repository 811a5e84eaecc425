//! Creating, finding, running and deleting machines.

use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::Engine;
use super::inner::{DiskFacts, EngineInner};
use crate::error::{Error, ErrorKind, Result};
use crate::guest::image::Profile;
use crate::machine::MachineHandle;
use crate::store::MachineRecord;
use crate::sync::lock;
use crate::types::{
    Account, CreateMachine, Durability, ExecAccepted, ExecEvent, ExecRequest, ExecResult,
    MIN_MEMORY_MB, MachineInfo, MachineName, MachineState, Tags, validate_tags,
};

impl Engine {
    pub async fn create_machine(
        &self,
        account: &Account,
        request: CreateMachine,
    ) -> Result<MachineInfo> {
        self.refuse_when_closed()?;
        validate_tags(&request.tags)?;
        crate::types::validate_env(&request.env)?;
        let expires_at = super::lifecycle::check_expiry(request.expires_at)?;
        let limits = &self.inner.config.limits;
        let memory_mb = request
            .memory_mb
            .unwrap_or(self.inner.config.default_memory_mb);
        if memory_mb < MIN_MEMORY_MB || !limits.allowed_memory_mb.contains(&memory_mb) {
            let allowed: Vec<String> = limits
                .allowed_memory_mb
                .iter()
                .map(ToString::to_string)
                .collect();
            return Err(Error::invalid(format!(
                "memory_mb {memory_mb} is not offered by this server: use one of {} \
                 (EVERVM_MEMORY_MB_ALLOWED)",
                allowed.join(", ")
            )));
        }
        let profile = match request.image.as_deref() {
            Some(name) => Profile::parse(name)?,
            None => self.inner.config.default_image.clone(),
        };
        // A custom image must have been built here (backends without images ignore it).
        if matches!(profile, Profile::Custom(_)) {
            self.inner.backend.current_image(profile.clone()).await?;
        }
        let durability = request.durability.unwrap_or_default();
        if durability == Durability::Instruction && !self.inner.backend.capabilities().snapshots {
            return Err(Error::unsupported(format!(
                "durability `instruction` needs snapshots, which the {} backend cannot take (the \
                 gVisor backend can)",
                self.inner.backend.name()
            )));
        }
        let history = self.history_for(request.history)?;
        let network = request
            .network
            .unwrap_or_else(|| self.inner.config.network_default.clone());
        let max = self.inner.config.network_max;
        if network.mode() > max {
            return Err(Error::new(
                crate::error::ErrorKind::PermissionDenied,
                format!(
                    "this server gives machines at most the network `{max}`, not `{}` \
                 (EVERVM_NETWORK_MAX or `evervm serve --network-max`)",
                    network.mode()
                ),
            ));
        }
        if network.is_networked() && !self.inner.backend.capabilities().network {
            return Err(Error::unsupported(format!(
                "the {} backend gives machines no network here: the process backend never does; \
                 gVisor does with a current runsc (scripts/runsc.sh builds one; Debian's 2022 \
                 runsc cannot on current kernels), as root, with `ip` and `nft` installed \
                 (apt-get install iproute2 nftables)",
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
            unsaved_since: None,
            snapshot_at: None,
            env: request.env,
            expires_at,
            position: 0,
            network,
            snapshot_sha256: None,
            history,
            parent: None,
            forked_at: None,
            env_error: None,
        };
        self.insert_machine(&record).await?;
        let handle = self.spawn_handle(&record, true);
        self.fresh_info(record, Some(handle)).await
    }

    /// Stores a new machine's row, within the account's machine limit.
    pub(super) async fn insert_machine(&self, record: &MachineRecord) -> Result<()> {
        let limit = self.inner.config.limits.max_machines_per_account;
        let record = record.clone();
        self.inner.store.insert_machine(&record, limit).await
    }

    pub(super) fn spawn_handle(&self, record: &MachineRecord, eager: bool) -> Arc<MachineHandle> {
        let mut machines = lock(&self.inner.machines);
        Arc::clone(
            machines
                .entry(record.name.to_string())
                .or_insert_with(|| MachineHandle::spawn(Arc::clone(&self.inner), record, eager)),
        )
    }

    /// Machines an earlier engine left swapped with uncompressed snapshots get a handle now, so
    /// that the idle tender compresses them in time (handles are otherwise made on first use).
    /// Holds the engine only step by step: an engine dropped meanwhile ends it.
    pub(super) async fn adopt_uncompressed_snapshots(engine: std::sync::Weak<EngineInner>) {
        let Some(inner) = engine.upgrade() else {
            return;
        };
        let home = inner.config.home.clone();
        let backend = Arc::clone(&inner.backend);
        drop(inner);
        let names = tokio::task::spawn_blocking(move || {
            crate::snapshot::machines_with_snapshots(&home)
                .into_iter()
                .filter(|name| backend.compressible(&crate::snapshot::snapshot_dir(&home, name)))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for name in names {
            let Some(inner) = engine.upgrade() else {
                return;
            };
            let this = Self { inner };
            // Looked up under the lock a delete takes too, so a machine deleted meanwhile is
            // not brought back.
            let _membership = this.inner.membership.lock().await;
            if this.inner.closing() {
                return;
            }
            let lookup = name.clone();
            let Ok(Some(record)) = this.inner.store.machine(&lookup).await else {
                continue;
            };
            if lock(&this.inner.deleting).contains(&name) {
                continue;
            }
            this.spawn_handle(&record, false);
        }
    }

    /// The machine's row, if the account has it.
    pub(super) async fn record(&self, account: &Account, name: &str) -> Result<MachineRecord> {
        let parsed = MachineName::parse(name)?;
        let found = self.inner.store.machine(parsed.as_str()).await?;
        match found {
            Some(record) if record.account_id == account.id => Ok(record),
            _ => Err(Error::machine_not_found(name)),
        }
    }

    /// True once the engine has shut down (or begun to).
    pub fn is_closed(&self) -> bool {
        self.inner.closing()
    }

    pub(super) fn refuse_when_closed(&self) -> Result<()> {
        if self.inner.closing() {
            return Err(Error::new(
                ErrorKind::Conflict,
                "the engine has shut down: open it again to use its machines",
            ));
        }
        Ok(())
    }

    /// The handle of the account's machine, made on first use. A machine being deleted is
    /// never found again, however the lookup and the delete interleave.
    pub(super) async fn handle(&self, account: &Account, name: &str) -> Result<Arc<MachineHandle>> {
        self.refuse_when_closed()?;
        if let Some(handle) = self.cached_handle(account, name)? {
            return Ok(handle);
        }
        let _membership = self.inner.membership.lock().await;
        if let Some(handle) = self.cached_handle(account, name)? {
            return Ok(handle);
        }
        let record = self.record(account, name).await?;
        if let Some(hook) = &self.inner.config.hooks.before_handle {
            hook(name.to_owned()).await;
        }
        if lock(&self.inner.deleting).contains(name) {
            return Err(Error::machine_not_found(name));
        }
        Ok(self.spawn_handle(&record, false))
    }

    pub(super) fn cached_handle(
        &self,
        account: &Account,
        name: &str,
    ) -> Result<Option<Arc<MachineHandle>>> {
        if lock(&self.inner.deleting).contains(name) {
            return Err(Error::machine_not_found(name));
        }
        match lock(&self.inner.machines).get(name) {
            Some(handle) if handle.account_id == account.id => Ok(Some(Arc::clone(handle))),
            Some(_) => Err(Error::machine_not_found(name)),
            None => Ok(None),
        }
    }

    /// A machine's info with what the disk holds read now.
    pub(super) async fn fresh_info(
        &self,
        record: MachineRecord,
        handle: Option<Arc<MachineHandle>>,
    ) -> Result<MachineInfo> {
        let inner = Arc::clone(&self.inner);
        let name = record.name.to_string();
        tokio::task::spawn_blocking(move || {
            let facts = inner.fresh_disk_facts(&name);
            let resident_bytes = handle.as_ref().map_or(0, |h| h.resident_bytes());
            info_of(&record, handle.as_deref(), &facts, resident_bytes)
        })
        .await
        .map_err(|e| Error::internal(format!("reading a machine's info stopped: {e}")))
    }

    /// The account's machines that carry every given tag, newest first. What the disk holds is
    /// remembered between calls (the engine forgets it whenever it changes a machine's files),
    /// so listing thousands of machines reads no files.
    pub async fn list_machines(
        &self,
        account: &Account,
        filter: &Tags,
    ) -> Result<Vec<MachineInfo>> {
        let account_id = account.id;
        let records = self.inner.store.machines(account_id).await?;
        let records: Vec<MachineRecord> = records
            .into_iter()
            .filter(|r| filter.iter().all(|(k, v)| r.tags.get(k) == Some(v)))
            .collect();
        self.infos(records).await
    }

    /// The infos of these machines, with what their disks hold (remembered) and their memory.
    pub(super) async fn infos(&self, records: Vec<MachineRecord>) -> Result<Vec<MachineInfo>> {
        let handles: Vec<Option<Arc<MachineHandle>>> = {
            let machines = lock(&self.inner.machines);
            records
                .iter()
                .map(|r| machines.get(r.name.as_str()).cloned())
                .collect()
        };
        let inner: Arc<EngineInner> = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            records
                .iter()
                .zip(handles)
                .map(|(record, handle)| {
                    let facts = inner.disk_facts(record.name.as_str());
                    let resident_bytes = handle.as_ref().map_or(0, |h| h.resident_bytes());
                    info_of(record, handle.as_deref(), &facts, resident_bytes)
                })
                .collect()
        })
        .await
        .map_err(|e| Error::internal(format!("listing machines stopped: {e}")))
    }

    /// One machine's info, with its snapshot looked at now (a damaged one shows as damaged,
    /// with the reason, before any instruction finds out).
    pub async fn machine_info(&self, account: &Account, name: &str) -> Result<MachineInfo> {
        let record = self.record(account, name).await?;
        let handle = lock(&self.inner.machines).get(name).cloned();
        self.fresh_info(record, handle).await
    }

    /// Queues an instruction and returns at once with its seq.
    pub async fn exec(
        &self,
        account: &Account,
        name: &str,
        request: ExecRequest,
    ) -> Result<ExecAccepted> {
        request.validate()?;
        let handle = self.handle(account, name).await?;
        self.inner.take_instruction_token(account.id)?;
        let interrupted = request.interrupt && handle.interrupt();
        let seq = handle
            .enqueue(
                &self.inner,
                request.code,
                request.timeout,
                request.dialect,
                request.context,
            )
            .await?;
        Ok(ExecAccepted { seq, interrupted })
    }

    /// Interrupts the running instruction and cancels queued ones. True if there was any.
    pub async fn interrupt(&self, account: &Account, name: &str) -> Result<bool> {
        Ok(self.handle(account, name).await?.interrupt())
    }

    /// Interrupts one instruction: cancelled while it waits, interrupted while it runs (the
    /// others are left alone); false when it is neither.
    pub async fn interrupt_instruction(
        &self,
        account: &Account,
        name: &str,
        seq: i64,
    ) -> Result<bool> {
        Ok(self.handle(account, name).await?.interrupt_instruction(seq))
    }

    /// Waits for an instruction's result (at once if it already finished).
    pub async fn result(&self, account: &Account, name: &str, seq: i64) -> Result<ExecResult> {
        let handle = self.handle(account, name).await?;
        if let Some(live) = handle.live(seq) {
            return Ok(live.wait_result().await);
        }
        let machine = name.to_owned();
        let stored = self.inner.store.instruction_result(&machine, seq).await?;
        match stored {
            Some(Some(result)) => Ok(result),
            Some(None) => Err(Error::internal(format!(
                "instruction {seq} of {name} has no result and is not running"
            ))),
            None => Err(Error::instruction_not_found(name, seq)),
        }
    }

    /// An instruction's output, then its result: live while it runs, replayed from the store
    /// after it finished.
    pub async fn events(
        &self,
        account: &Account,
        name: &str,
        seq: i64,
    ) -> Result<BoxStream<'static, ExecEvent>> {
        let handle = self.handle(account, name).await?;
        if let Some(live) = handle.live(seq) {
            return Ok(live.events().boxed());
        }
        let machine = name.to_owned();
        let store = &self.inner.store;
        let stored = match store.instruction_result(&machine, seq).await? {
            Some(Some(result)) => Some((store.instruction_output(&machine, seq).await?, result)),
            Some(None) => {
                return Err(Error::internal(format!(
                    "instruction {seq} of {machine} has no result and is not running"
                )));
            }
            None => None,
        };
        match stored {
            Some((chunks, result)) => Ok(futures::stream::iter(
                chunks
                    .into_iter()
                    .map(ExecEvent::Output)
                    .chain(std::iter::once(ExecEvent::Result(result))),
            )
            .boxed()),
            None => Err(Error::instruction_not_found(name, seq)),
        }
    }

    /// Deletes a machine: its sandbox, its files, its instructions and their output. Whatever
    /// runs meanwhile on it (an instruction, a fork, a checkpoint) ends cleanly, and no lookup
    /// finds it again.
    pub async fn delete_machine(&self, account: &Account, name: &str) -> Result<()> {
        self.refuse_when_closed()?;
        self.record(account, name).await?;
        let handle = {
            let _membership = self.inner.membership.lock().await;
            if !lock(&self.inner.deleting).insert(name.to_owned()) {
                // Another delete of it is under way.
                return Err(Error::machine_not_found(name));
            }
            lock(&self.inner.machines).remove(name)
        };
        let deleted = async {
            if let Some(handle) = handle {
                handle.stop().await;
            }
            let machine = name.to_owned();
            self.inner.store.delete_machine(&machine).await?;
            crate::machine::bucketed::forget_machine(&self.inner, &machine).await;
            let home = self.inner.config.home.clone();
            let machine = name.to_owned();
            tokio::task::spawn_blocking(move || crate::snapshot::remove(&home, &machine))
                .await
                .map_err(|e| {
                    Error::internal(format!("removing the machine's files stopped: {e}"))
                })?
        }
        .await;
        self.inner.forget_disk_facts(name);
        self.inner.snapshots_changed();
        lock(&self.inner.deleting).remove(name);
        deleted
    }
}

/// A machine's info from its row, its handle (if it has one), what its disk holds and the
/// memory its sandbox holds.
pub(super) fn info_of(
    record: &MachineRecord,
    handle: Option<&MachineHandle>,
    facts: &DiskFacts,
    resident_bytes: u64,
) -> MachineInfo {
    let (resident, pending) = handle.map_or((false, false), |h| {
        (h.resident(), h.has_pending_instruction())
    });
    let interpreter = handle.and_then(MachineHandle::interpreter);
    MachineInfo {
        name: record.name.clone(),
        created_at: record.created_at,
        tags: record.tags.clone(),
        memory_mb: record.memory_mb,
        image: record.image.as_str().to_owned(),
        backend: record.backend.clone(),
        state: match (resident, &facts.snapshot) {
            (true, _) => MachineState::Resident,
            (false, Some(Err(_))) => MachineState::Damaged,
            (false, Some(Ok(()))) => MachineState::Swapped,
            (false, None) => MachineState::Stopped,
        },
        disk_bytes: facts.disk_bytes,
        resident_bytes,
        durability: record.durability,
        history: record.history,
        parent: record.parent.clone(),
        forked_at: record.forked_at,
        has_pending_instruction: pending,
        instruction_count: record.next_seq,
        last_used_at: record.last_used_at,
        // A damaged snapshot's reason comes first: it is what stands in the way now.
        last_error: match (resident, &facts.snapshot) {
            (false, Some(Err(reason))) => Some(reason.clone()),
            _ => record.last_error.clone(),
        },
        env: record
            .env
            .iter()
            .filter(|(_, var)| !var.secret)
            .map(|(name, var)| (name.clone(), var.value.clone()))
            .collect(),
        secret_env: record
            .env
            .iter()
            .filter(|(_, var)| var.secret)
            .map(|(name, _)| name.clone())
            .collect(),
        expires_at: record.expires_at,
        network: record.network.clone(),
        interpreter: interpreter.map(|(start, _)| start),
        interpreter_started_at: interpreter.map(|(_, at)| at),
    }
}
