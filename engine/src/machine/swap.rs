//! How a machine goes to disk and comes back: swap-out (a checkpoint committed as its snapshot),
//! copies of its state (forks, checkpoints), rollback, and getting a sandbox (its snapshot
//! restored, or a fresh one).
//!
//! A swap-out never loses state without saying so. Before it starts, it checks that the disk
//! has room; a checkpoint that fails with the sandbox still alive leaves the machine resident; a
//! commit that fails restores the machine from the checkpoint it just wrote; and when the state
//! really is gone, the machine's next instruction says so and what it came back from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{MachineHandle, bucketed};
use crate::engine::EngineInner;
use crate::error::{Error, ErrorKind, Result};
use crate::pool::{Pool, Resident, connect_restored, sandbox_id};
use crate::sandbox::{Effort, SandboxSpec};
use crate::snapshot;
use crate::sync::lock;

/// How long a sandbox whose checkpoint failed has to answer before it counts as gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Room kept free on the disk beyond a checkpoint's expected size.
const DISK_MARGIN_BYTES: u64 = 64 * 1024 * 1024;

/// Gives the machine a sandbox now (its snapshot restored, or a fresh one), logging a failure:
/// the next instruction tries again and reports it.
pub(super) async fn become_resident(
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

/// A sandbox for a machine that has none: its snapshot restored when it has one (refused, with
/// the reason, when the snapshot is damaged), else a fresh one from the pool. The account's
/// resident memory limit is made room for first. In a cluster, this node takes the machine's
/// lease first (refused when another node runs it) and gives it up again if this fails.
pub(super) async fn acquire(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
) -> Result<Resident> {
    // Taken already when its instruction was accepted; else taken now.
    if machine.holds_lease() {
        engine.refuse_if_fenced()?;
    } else if let Some(lease) = engine.take_lease(machine.name.as_str()).await? {
        machine.took_lease(engine, lease).await?;
    }
    let acquired = acquire_here(engine, machine).await;
    if acquired.is_err()
        && let Some(lease) = machine.lease_given_up()
    {
        engine.release_lease(&lease).await;
    }
    acquired
}

/// [`acquire`] once this node may run the machine.
async fn acquire_here(engine: &Arc<EngineInner>, machine: &MachineHandle) -> Result<Resident> {
    engine
        .make_room_for(
            machine.account_id,
            machine.name.as_str(),
            machine.shape.memory_mb,
        )
        .await?;
    let home = &engine.config.home;
    let name = machine.name.as_str();
    let dir = snapshot::snapshot_dir(home, name);
    let refuse = |e: Error| {
        snapshot::mark_damaged(home, name, e.message());
        engine.forget_disk_facts(name);
        e
    };
    // With a bucket, the snapshot that counts is the one the store names (as this node read it
    // when it took the machine's lease, or saved it itself): the home's copy when it is that
    // one, else downloaded now.
    let pointer = lock(&machine.state).snapshot_sha256.clone();
    if let Some(sha256) = &pointer {
        fetch_snapshot(engine, machine, sha256, &dir).await?;
    }
    let manifest = read_manifest(engine, &dir).await?.map_err(refuse)?;
    let Some(manifest) = manifest else {
        let had_snapshot = lock(&machine.state).snapshot_at;
        if let Some(saved) = had_snapshot {
            // It had a snapshot and its files are gone: that is damage, not a fresh start.
            let e = Error::crashed(format!(
                "its snapshot (saved {}) is missing from the disk: roll back to a checkpoint \
                 or delete the machine",
                saved.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
            let _ = std::fs::create_dir_all(&dir);
            return Err(refuse(e));
        }
        let fresh = fresh_interpreter(engine, machine).await?;
        machine.interpreter_started(None);
        return Ok(fresh);
    };
    let started = std::time::Instant::now();
    let mut restored = restore_snapshot(engine, machine, &dir, manifest).await;
    if let (Err(e), Some(sha256)) = (&restored, &pointer)
        && snapshot::marked_damaged(&dir)
    {
        // The home's copy was damaged; the bucket's is whole.
        tracing::warn!(machine = name, "downloading its snapshot again: {e}");
        fetch_snapshot(engine, machine, sha256, &dir).await?;
        if let Some(manifest) = read_manifest(engine, &dir).await?.map_err(refuse)? {
            restored = restore_snapshot(engine, machine, &dir, manifest).await;
        }
    }
    engine
        .metrics
        .restored(restored.is_ok(), started.elapsed().as_secs_f64());
    restored
}

/// Makes the machine's snapshot directory hold its snapshot `sha256` from the bucket.
async fn fetch_snapshot(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    sha256: &str,
    dir: &Path,
) -> Result<()> {
    let name = machine.name.as_str();
    let fetched = bucketed::fetch(engine, &bucketed::machine_area(name), sha256, dir).await;
    engine.forget_disk_facts(name);
    fetched.map_err(|e| {
        e.context(format!(
            "bringing machine {name}'s snapshot from the bucket"
        ))
    })
}

/// The manifest of the snapshot in `dir`, checked ([`snapshot::check_manifest`]); the outer
/// error is the engine's, the inner one the snapshot's.
async fn read_manifest(
    engine: &EngineInner,
    dir: &Path,
) -> Result<Result<Option<snapshot::SnapshotManifest>>> {
    let dir = dir.to_path_buf();
    let restorable = engine.restorable();
    tokio::task::spawn_blocking(move || snapshot::check_manifest(&dir, &*restorable))
        .await
        .map_err(|e| Error::internal(format!("reading the snapshot stopped: {e}")))
}

/// Restores the machine's snapshot in `dir` (its manifest read and accepted).
async fn restore_snapshot(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    dir: &Path,
    manifest: snapshot::SnapshotManifest,
) -> Result<Resident> {
    let home = &engine.config.home;
    let name = machine.name.as_str();
    let refuse = |e: Error| {
        snapshot::mark_damaged(home, name, e.message());
        engine.forget_disk_facts(name);
        e
    };
    // The checksum is computed while runsc starts (most of a restore is starting its processes);
    // nothing talks to the restored sandbox before it matched.
    let checking = {
        let dir = dir.to_path_buf();
        let manifest = manifest.clone();
        tokio::task::spawn_blocking(move || snapshot::check_files(&dir, &manifest))
    };
    let spec = SandboxSpec {
        id: sandbox_id(),
        memory_mb: machine.shape.memory_mb,
        profile: machine.shape.profile.clone(),
        image_id: manifest.image_id.clone(),
        network: machine.sandbox_network(),
    };
    let restored = engine.backend.restore(&spec, dir, &manifest.runtime).await;
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
    let restored = connect_restored(engine, sandbox, snapshot::needs_reseed(dir)).await?;
    let snapshot_at = chrono::DateTime::parse_from_rfc3339(&manifest.created_at)
        .map_or_else(|_| chrono::Utc::now(), |t| t.with_timezone(&chrono::Utc));
    machine.interpreter_started(Some(snapshot_at));
    Ok(restored)
}

/// What the next instruction's output starts with after the machine's sandbox ended
/// abnormally (or its state was lost): how it came back.
/// A fresh interpreter from the pool, made the machine's: its environment, its home. A machine
/// with a network boots one of its own (pooled sandboxes have none).
async fn fresh_interpreter(engine: &Arc<EngineInner>, machine: &MachineHandle) -> Result<Resident> {
    if let Some(why) = &machine.env_error {
        return Err(crate::Error::new(
            crate::ErrorKind::PermissionDenied,
            format!(
                "machine {} cannot start a fresh interpreter: {why}",
                machine.name
            ),
        ));
    }
    let mut resident = match machine.sandbox_network() {
        None => Pool::take(engine, &machine.shape).await?,
        Some(network) => crate::pool::start_networked(engine, &machine.shape, network).await?,
    };
    if machine.env.is_empty() {
        return Ok(resident);
    }
    let env = machine
        .env
        .iter()
        .map(|(name, var)| (name.clone(), var.value.clone()))
        .collect();
    match resident
        .agent
        .configure(env, engine.config.ready_timeout)
        .await
    {
        Ok(()) => Ok(resident),
        Err(e) => {
            resident.kill().await;
            Err(e)
        }
    }
}

pub(super) async fn recovery_note(engine: &EngineInner, machine: &MachineHandle) -> Option<String> {
    let why = lock(&machine.state).recovering_from.take()?;
    let dir = snapshot::snapshot_dir(&engine.config.home, machine.name.as_str());
    let restorable = engine.restorable();
    let saved = tokio::task::spawn_blocking(move || snapshot::check_manifest(&dir, &*restorable))
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
    Some(match saved {
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

/// Records that the machine's state since its last snapshot is gone: its next instruction says
/// so, and its info shows why.
async fn state_lost(engine: &EngineInner, machine: &MachineHandle, why: String) {
    let text = format!(
        "MachineCrashed: the machine's sandbox stopped ({why}); {}",
        engine.state_loss_note()
    );
    engine
        .record_machine_error(&machine.name, Some(&text))
        .await;
    machine.ended_abnormally(why);
}

/// Records a swap-out that failed with the machine still resident: the idle swapper waits
/// before it tries again.
async fn swap_deferred(engine: &EngineInner, machine: &MachineHandle, error: &Error) {
    let wait = machine.swap_failed();
    let text = format!(
        "could not save the machine to disk, so it stays in memory (the next swap-out is tried \
         in {} s at the earliest): {error}",
        wait.as_secs()
    );
    tracing::warn!(machine = %machine.name, "{text}");
    engine
        .record_machine_error(&machine.name, Some(&text))
        .await;
}

/// Refuses a swap-out up front when the disk the snapshot goes to has less room than the
/// machine's memory (what its checkpoint can take at most) plus a margin: with the runsc this
/// engine drives, a checkpoint that runs out of space takes the sandbox down with it.
fn check_room(dir: &Path, needed: u64) -> Result<()> {
    let free = crate::fsutil::free_bytes(dir)?;
    let wanted = needed + DISK_MARGIN_BYTES;
    if free < wanted {
        return Err(Error::limit_exceeded(format!(
            "the disk holding the machine's snapshots has {} MiB free, and saving this machine \
             needs up to {} MiB: free some space (delete machines or checkpoints)",
            free / (1024 * 1024),
            wanted.div_ceil(1024 * 1024)
        )));
    }
    Ok(())
}

/// What a save does with the machine's sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Save {
    /// Stop it (a swap-out): the machine's memory is released.
    AndStop,
    /// Leave it running where the sandbox can be saved in place (it pauses for the save; a fork
    /// or a durable save); otherwise stop it, as [`Save::AndStop`].
    InPlace,
}

/// Checkpoints the resident sandbox into the machine's snapshot, and releases it unless it is
/// saved in place. On failure the machine keeps its state wherever that is possible (see the
/// module's documentation).
pub(super) async fn swap_out(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
) -> Result<()> {
    save(engine, machine, resident, Save::AndStop).await
}

/// Compresses the snapshot of a swapped machine where the backend can (see
/// [`crate::EngineConfig::compress_after`]); true when it did. The snapshot is checked first and
/// replaced only by a whole compressed copy; on failure it stays as it was.
pub(super) async fn compress_swapped(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    effort: Effort,
) -> Result<bool> {
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    let backend = Arc::clone(&engine.backend);
    let chunking = engine.chunking();
    let restorable = engine.restorable();
    let started = std::time::Instant::now();
    let compressed = tokio::task::spawn_blocking(move || {
        if !backend.compressible(&snapshot::snapshot_dir(&home, &name)) {
            return Ok(false);
        }
        // Held until the chunked snapshot is installed: a collection meanwhile keeps its chunks.
        let mut pinned = None;
        let rewritten = snapshot::rewrite(&home, &name, &*restorable, |dir| match &chunking {
            Some(chunks) => {
                let names = snapshot::unchunked_files(dir)?;
                pinned = Some(chunks.put_files(dir, &names, chunk_level(effort))?);
                Ok(())
            }
            None => backend.compress_snapshot(dir, effort),
        });
        drop(pinned);
        rewritten.map(|_| true)
    })
    .await
    .map_err(|e| Error::internal(format!("compressing the snapshot stopped: {e}")))
    .and_then(|r| r);
    // Tried once per snapshot, whatever came of it: a failure is logged, not retried in a loop.
    lock(&machine.state).snapshot_compressed = true;
    if matches!(compressed, Ok(true)) {
        engine.forget_disk_facts(machine.name.as_str());
        if engine.bucket.is_some() {
            // The compressed copy replaces the bucket's too (restores download less).
            note_current_snapshot(engine, machine).await?;
        }
        tracing::debug!(
            machine = %machine.name,
            "compressed the snapshot in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    compressed
}

/// zstd's level for the chunks a save brings to the store: only chunks new to the store are
/// compressed, so even `Small` costs little.
fn chunk_level(effort: Effort) -> i32 {
    match effort {
        Effort::Fast => 3,
        Effort::Small => 9,
    }
}

/// Saves the resident machine into its snapshot (see [`Save`]). Nothing to do without one.
pub(super) async fn save(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    how: Save,
) -> Result<()> {
    let Some(mut current) = resident.take() else {
        // Nothing in memory: the snapshot on disk (if any) is already the machine.
        return Ok(());
    };
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    let prepared = {
        let home = home.clone();
        let name = name.clone();
        let roots = current.sandbox.memory_roots();
        let inner = Arc::clone(engine);
        tokio::task::spawn_blocking(move || {
            let previous = inner.disk_facts(&name).snapshot_bytes;
            std::fs::create_dir_all(snapshot::machine_dir(&home, &name))?;
            let memory = crate::sandbox::process_tree_pss(&roots);
            check_room(&snapshot::machine_dir(&home, &name), memory.max(previous))?;
            snapshot::staging_dir(&home, &name)
        })
        .await
        .map_err(|e| Error::internal(format!("preparing a swap-out stopped: {e}")))
        .and_then(|r| r)
    };
    let staging = match prepared {
        Ok(staging) => staging,
        Err(e) => {
            *resident = Some(current);
            swap_deferred(engine, machine, &e).await;
            return Err(e);
        }
    };
    let image_id = current.sandbox.image_id();
    let runtime = current
        .sandbox
        .runtime()
        .unwrap_or_else(|| engine.backend.describe());
    let started = std::time::Instant::now();
    let in_place = how == Save::InPlace && current.sandbox.can_checkpoint_in_place();
    let checkpoint = if in_place {
        current.sandbox.checkpoint_in_place(&staging).await
    } else {
        current.sandbox.checkpoint(&staging).await
    };
    if let Err(e) = checkpoint {
        let _ = tokio::fs::remove_dir_all(&staging).await;
        if e.kind() == ErrorKind::Unsupported {
            *resident = Some(current);
            return Err(e);
        }
        // Whether the sandbox survived its failed checkpoint decides what was lost.
        if current.sandbox.exit_reason().is_none()
            && current.agent.probe(PROBE_TIMEOUT).await.is_ok()
        {
            *resident = Some(current);
            swap_deferred(engine, machine, &e).await;
        } else {
            let reason = current.kill().await;
            let why = match reason {
                Some(reason) => format!("a swap-out failed ({e}) and {reason}"),
                None => format!("a swap-out failed and stopped it: {e}"),
            };
            state_lost(engine, machine, why).await;
            machine.swap_failed();
        }
        return Err(e);
    }
    let checkpointed = started.elapsed();
    if let Some(hook) = &engine.config.hooks.before_commit {
        hook(name.clone()).await;
    }
    let committed = commit_saved(engine, machine, &staging, &runtime, image_id.clone()).await;
    engine.forget_disk_facts(&name);
    // The snapshot it replaced may have held chunks no other does.
    engine.snapshots_changed();
    let manifest = match committed {
        Ok(manifest) => manifest,
        Err(e) if engine.node.is_some() && e.kind() == ErrorKind::Conflict => {
            // Another node took the machine: this one must not run it any more.
            let _ = tokio::fs::remove_dir_all(&staging).await;
            current.kill().await;
            machine.lease_given_up();
            machine.ended_abnormally(format!("this node lost it to another: {e}"));
            return Err(e);
        }
        Err(e) if in_place => {
            // The previous snapshot is untouched, and the machine runs on with its state.
            let _ = tokio::fs::remove_dir_all(&staging).await;
            *resident = Some(current);
            swap_deferred(engine, machine, &e).await;
            return Err(e);
        }
        Err(e) => {
            // The previous snapshot is untouched; the state is in the staging directory,
            // whole (the checkpoint finished): bring the machine back from there.
            drop(current);
            // A full disk is the likely cause: the restore needs a little room.
            engine.release_reserve();
            let restored = restore_uncommitted(engine, machine, &staging, &runtime, image_id).await;
            let _ = tokio::fs::remove_dir_all(&staging).await;
            match restored {
                Ok(back) => {
                    *resident = Some(back);
                    swap_deferred(engine, machine, &e).await;
                }
                Err(again) => {
                    state_lost(
                        engine,
                        machine,
                        format!(
                            "saving its snapshot failed ({e}) and restoring it from the \
                             unsaved checkpoint failed too ({again})"
                        ),
                    )
                    .await;
                    machine.swap_failed();
                }
            }
            return Err(e);
        }
    };
    if in_place {
        *resident = Some(current);
    } else {
        drop(current);
        // Swapped out: any node may take it next.
        if let Some(lease) = machine.lease_given_up() {
            engine.release_lease(&lease).await;
        }
    }
    // A swap-out may stay on disk for long: compressed now where `compress_after` is 0, else
    // later in the background. A compression that fails leaves the snapshot as it is.
    if how == Save::AndStop
        && engine.config.compress_swaps
        && engine.config.compress_after.is_zero()
    {
        let _ = compress_swapped(engine, machine, Effort::Fast).await;
    }
    if machine.swap_succeeded() {
        engine.record_machine_error(&machine.name, None).await;
        let inner = Arc::clone(engine);
        let _ = tokio::task::spawn_blocking(move || inner.hold_reserve()).await;
    }
    tracing::debug!(
        machine = %machine.name,
        bytes = manifest.bytes,
        in_place,
        "saved: checkpoint {:.1} ms, commit {:.1} ms",
        checkpointed.as_secs_f64() * 1e3,
        started.elapsed().saturating_sub(checkpointed).as_secs_f64() * 1e3
    );
    Ok(())
}

/// Makes the sealed checkpoint in `staging` the machine's snapshot and notes it in the store.
/// With a bucket, it is uploaded and the store points at it before the home's copy is
/// replaced, and a failure before the store took it leaves `staging` whole and nothing else
/// changed (the caller brings the machine back from it); the snapshot it replaced is removed
/// from the bucket.
async fn commit_saved(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
) -> Result<snapshot::SnapshotManifest> {
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    // With a bucket, chunked as it is saved: the upload sends only the chunks the bucket
    // lacks. A machine with a history too: its save becomes an undo point, which is chunked
    // anyway, and chunking it here spares hashing and syncing the whole memory file first.
    // Its chunks stay pinned until it is installed.
    let chunking = engine
        .chunking_saves()
        .or_else(|| engine.chunking().filter(|_| machine.history > 0));
    let chunked = chunking.is_some();
    let (manifest, _pinned) = {
        let (staging, runtime) = (staging.to_path_buf(), runtime.to_owned());
        tokio::task::spawn_blocking(move || {
            let pinned = match &chunking {
                Some(chunks) => Some(chunks.put_files(
                    &staging,
                    &snapshot::unchunked_files(&staging)?,
                    chunk_level(Effort::Fast),
                )?),
                None => None,
            };
            Ok::<_, Error>((snapshot::seal_staged(&staging, &runtime, image_id)?, pinned))
        })
        .await
        .map_err(|e| Error::internal(format!("saving the snapshot stopped: {e}")))??
    };
    let install = || {
        let (home, name, staging) = (home.clone(), name.clone(), staging.to_path_buf());
        async move {
            tokio::task::spawn_blocking(move || snapshot::install_snapshot(&home, &name, &staging))
                .await
                .map_err(|e| Error::internal(format!("saving the snapshot stopped: {e}")))
                .and_then(|r| r)
        }
    };
    if engine.bucket.is_none() {
        install().await?;
        if let Err(e) = machine.note_saved(engine, None).await {
            tracing::warn!(machine = %machine.name, "cannot note a save: {e}");
        }
        if chunked {
            // Nothing left for the compressor to do with it.
            machine.snapshot_chunked();
        }
        return Ok(manifest);
    }
    let area = bucketed::machine_area(&name);
    let sha256 = bucketed::publish(engine, &area, staging).await?;
    let previous = match machine.note_saved(engine, sha256.clone()).await {
        Ok(previous) => previous,
        Err(e) => {
            // Not the snapshot the store still names (an unchanged machine's save is the same).
            let current = lock(&machine.state).snapshot_sha256.clone();
            if let Some(sha256) = &sha256
                && current.as_ref() != Some(sha256)
            {
                bucketed::retire(engine, &area, sha256).await;
            }
            return Err(e.context("recording the save in the store"));
        }
    };
    // From here on the save counts: the home's copy is only a cache.
    if let Err(e) = install().await {
        tracing::warn!(
            machine = %machine.name,
            "the snapshot is saved in the bucket, but keeping a copy on this disk failed (the \
             next restore downloads it): {e}"
        );
        let _ = tokio::fs::remove_dir_all(staging).await;
    }
    bucketed::retire_replaced(engine, &area, previous, sha256.as_deref()).await;
    bucketed::keep_cache_within_bound(engine);
    Ok(manifest)
}

/// Publishes the machine's snapshot as it is on the home's disk now (rewritten, rolled back)
/// and notes it as the machine's; without a bucket, only notes it.
async fn note_current_snapshot(engine: &Arc<EngineInner>, machine: &MachineHandle) -> Result<()> {
    let name = machine.name.to_string();
    let dir = snapshot::snapshot_dir(&engine.config.home, &name);
    let area = bucketed::machine_area(&name);
    let sha256 = bucketed::publish(engine, &area, &dir).await?;
    let previous = machine.note_saved(engine, sha256.clone()).await?;
    bucketed::retire_replaced(engine, &area, previous, sha256.as_deref()).await;
    Ok(())
}

/// Restores a machine from a checkpoint that could not be committed as its snapshot, and waits
/// until it answers.
async fn restore_uncommitted(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
) -> Result<Resident> {
    let spec = SandboxSpec {
        id: sandbox_id(),
        memory_mb: machine.shape.memory_mb,
        profile: machine.shape.profile.clone(),
        image_id,
        network: machine.sandbox_network(),
    };
    let sandbox = engine.backend.restore(&spec, staging, runtime).await?;
    let mut back = connect_restored(engine, sandbox, false).await?;
    // Once the agent answers, the restore has read the checkpoint: it can go.
    if let Err(e) = back.agent.probe(engine.config.ready_timeout).await {
        back.kill().await;
        return Err(e);
    }
    Ok(back)
}

/// Saves the machine (starting it first if it has no state yet) and copies its snapshot to `to`.
pub(super) async fn copy_out(
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
            let restorable = engine.restorable();
            let dir = from.clone();
            let verified =
                tokio::task::spawn_blocking(move || snapshot::verify_dir(&dir, &*restorable))
                    .await
                    .map_err(|e| Error::internal(format!("checking the snapshot stopped: {e}")))?;
            if let Err(e) = verified {
                snapshot::mark_damaged(&home, &name, e.message());
                engine.forget_disk_facts(&name);
                return Err(e);
            }
        } else {
            // A machine that never ran: its state is a fresh interpreter.
            *resident = Some(acquire(engine, machine).await?);
        }
    }
    // A sandbox that can be saved in place keeps running: the parent of a fork never stops.
    save(engine, machine, resident, Save::InPlace).await?;
    let first_excluded = machine.first_unrun_seq(engine).await?;
    let chunks = Arc::clone(&engine.chunks);
    tokio::task::spawn_blocking(move || {
        crate::engine::chunks::copy_snapshot(&chunks, &from, &to, reseed)
    })
    .await
    .map_err(|e| Error::internal(format!("copying the snapshot stopped: {e}")))??;
    engine.forget_disk_facts(&name);
    Ok(first_excluded)
}

/// Replaces the machine's state with the snapshot in `from` (a checkpoint).
pub(super) async fn rollback(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    from: PathBuf,
) -> Result<()> {
    if let Some(current) = resident.take() {
        current.kill().await;
    }
    machine.set_resident(None);
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    let chunks = Arc::clone(&engine.chunks);
    engine.snapshots_changed();
    let copied = tokio::task::spawn_blocking(move || {
        let to = snapshot::snapshot_dir(&home, &name);
        crate::engine::chunks::copy_snapshot(&chunks, &from, &to, false)
    })
    .await
    .map_err(|e| Error::internal(format!("the rollback stopped: {e}")))
    .and_then(|r| r);
    engine.forget_disk_facts(machine.name.as_str());
    copied?;
    {
        let mut state = lock(&machine.state);
        state.recovering_from = None;
        state.ended_abnormally = false;
    }
    note_current_snapshot(engine, machine).await?;
    engine.record_machine_error(&machine.name, None).await;
    Ok(())
}

impl MachineHandle {
    /// The seq of the first instruction that has not run: the first queued one, else the next
    /// to be accepted. Only meaningful between instructions (in the machine's task).
    pub(super) async fn first_unrun_seq(&self, engine: &EngineInner) -> Result<i64> {
        // No instruction gets its seq meanwhile: one stored but not yet queued would be missed.
        let _order = self.enqueueing.lock().await;
        if let Some(first) = lock(&self.state).queued.iter().min() {
            return Ok(*first);
        }
        let name = self.name.to_string();
        let record = engine.store.machine(&name).await?;
        Ok(record.map_or(0, |r| r.next_seq))
    }
}
