//! Snapshots kept in the bucket (`--snapshots s3://...`). The bucket holds every snapshot that
//! counts; the store says which one is each machine's (and each checkpoint's) by its checksum;
//! the home keeps copies, which serve a restore when their checksum is the one the store names.
//!
//! A save is whole in the bucket before the store points at it, and the store points at it
//! before the home's copy is replaced: whatever step fails, the snapshot the store names is
//! whole somewhere, and a node that finds its own copy out of date downloads the right one.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::snapshot;
use crate::sync::lock;

/// Where a machine's snapshot is kept in the bucket.
pub(crate) fn machine_area(machine: &str) -> String {
    format!("machines/{machine}/snapshot")
}

/// Where a machine's checkpoint is kept in the bucket.
pub(crate) fn checkpoint_area(machine: &str, checkpoint: &str) -> String {
    format!("machines/{machine}/checkpoints/{checkpoint}")
}

/// Everything of a machine's in the bucket (its snapshot, checkpoints and undo points).
fn machine_root(machine: &str) -> String {
    format!("machines/{machine}")
}

/// Where a machine's undo points are kept in the bucket, and one of them.
fn history_area(machine: &str) -> String {
    format!("machines/{machine}/history")
}

fn point_area(machine: &str, seq: i64) -> String {
    format!("{}/{seq}", history_area(machine))
}

/// The seqs of the machine's undo points, in order: with a bucket, those whole in it (any
/// node's), else those on the home's disk.
pub(crate) async fn points(engine: &EngineInner, machine: &str) -> Result<Vec<i64>> {
    let Some(bucket) = &engine.bucket else {
        let (home, machine) = (engine.config.home.clone(), machine.to_owned());
        return tokio::task::spawn_blocking(move || snapshot::points(&home, &machine))
            .await
            .map_err(|e| Error::internal(format!("listing undo points stopped: {e}")));
    };
    let mut seqs: Vec<i64> = bucket
        .whole_under(&history_area(machine))
        .await?
        .into_iter()
        .filter_map(|(seq, _)| seq.parse().ok())
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    Ok(seqs)
}

/// Uploads the undo point after instruction `seq` (sealed on the home's disk); nothing to do
/// without a bucket. Its chunks went up with the save it was taken from.
pub(crate) async fn publish_point(engine: &EngineInner, machine: &str, seq: i64) -> Result<()> {
    let dir = snapshot::point_dir(&engine.config.home, machine, seq);
    publish(engine, &point_area(machine, seq), &dir)
        .await
        .map(|_| ())
}

/// Removes the undo point after instruction `seq` from the bucket, logging a failure.
pub(crate) async fn drop_point(engine: &EngineInner, machine: &str, seq: i64) {
    if let Some(bucket) = &engine.bucket
        && let Err(e) = bucket.remove_area(&point_area(machine, seq)).await
    {
        tracing::warn!(
            machine,
            seq,
            "cannot remove an undo point from the bucket: {e}"
        );
    }
}

/// Makes the home's copy of the undo point after instruction `seq` whole: with a bucket,
/// downloaded when this node lacks it (another node took it) or holds another.
pub(crate) async fn fetch_point(engine: &Arc<EngineInner>, machine: &str, seq: i64) -> Result<()> {
    let Some(bucket) = &engine.bucket else {
        return Ok(());
    };
    let area = point_area(machine, seq);
    let Some(sha256) = bucket.snapshots(&area).await?.pop() else {
        return Ok(());
    };
    let dir = snapshot::point_dir(&engine.config.home, machine, seq);
    fetch(engine, &area, &sha256, &dir).await
}

/// Uploads the sealed snapshot in `dir` as AREA's; its checksum, or `None` when snapshots are
/// kept on the home's disk only.
pub(crate) async fn publish(
    engine: &EngineInner,
    area: &str,
    dir: &Path,
) -> Result<Option<String>> {
    let Some(bucket) = &engine.bucket else {
        return Ok(None);
    };
    let started = std::time::Instant::now();
    let uploaded = bucket.upload(area, dir).await;
    let seconds = started.elapsed().as_secs_f64();
    engine.metrics.bucket_upload(uploaded.is_ok(), seconds);
    let manifest = uploaded?;
    tracing::debug!(
        area,
        bytes = manifest.bytes,
        "uploaded a snapshot in {:.1} ms",
        seconds * 1e3
    );
    Ok(Some(manifest.sha256))
}

/// Removes AREA's snapshot `sha256` from the bucket (one no longer pointed at), logging a
/// failure: what is left behind is unreferenced.
pub(crate) async fn retire(engine: &EngineInner, area: &str, sha256: &str) {
    if let Some(bucket) = &engine.bucket
        && let Err(e) = bucket.remove(area, sha256).await
    {
        tracing::warn!(area, "cannot remove an old snapshot from the bucket: {e}");
    }
}

/// Removes the snapshot a save replaced (`previous`) from the bucket, unless the save was of
/// the same snapshot (`current`).
pub(crate) async fn retire_replaced(
    engine: &EngineInner,
    area: &str,
    previous: Option<String>,
    current: Option<&str>,
) {
    if let Some(previous) = previous
        && Some(previous.as_str()) != current
    {
        retire(engine, area, &previous).await;
    }
}

/// Removes everything of a deleted machine's from the bucket, logging a failure.
pub(crate) async fn forget_machine(engine: &EngineInner, machine: &str) {
    if let Some(bucket) = &engine.bucket
        && let Err(e) = bucket.remove_area(&machine_root(machine)).await
    {
        tracing::warn!(
            machine,
            "cannot remove the machine's snapshots from the bucket: {e}"
        );
    }
}

/// Makes `target` hold AREA's snapshot `sha256`: the home's copy when it is that one, else a
/// download (checked) that replaces it. Nothing to do without a bucket.
pub(crate) async fn fetch(
    engine: &Arc<EngineInner>,
    area: &str,
    sha256: &str,
    target: &Path,
) -> Result<()> {
    let Some(bucket) = &engine.bucket else {
        return Ok(());
    };
    let current = {
        let target = target.to_path_buf();
        tokio::task::spawn_blocking(move || local_checksum(&target))
            .await
            .map_err(|e| Error::internal(format!("reading a snapshot's manifest stopped: {e}")))?
    };
    if current.as_deref() == Some(sha256) {
        engine.metrics.snapshot_fetched("cache");
        return Ok(());
    }
    let staging = {
        let target = target.to_path_buf();
        tokio::task::spawn_blocking(move || snapshot::staging_beside(&target))
            .await
            .map_err(|e| Error::internal(format!("preparing a download stopped: {e}")))??
    };
    let started = std::time::Instant::now();
    let downloaded = bucket
        .download(area, sha256, &staging, engine.restorable())
        .await;
    engine
        .metrics
        .bucket_download(downloaded.is_ok(), started.elapsed().as_secs_f64());
    let installed = match downloaded {
        // Its chunks stay pinned until it is installed.
        Ok(held) => {
            let (staging, target) = (staging.clone(), target.to_path_buf());
            let installed =
                tokio::task::spawn_blocking(move || snapshot::install_at(&staging, &target))
                    .await
                    .map_err(|e| Error::internal(format!("installing a download stopped: {e}")))
                    .and_then(|r| r);
            drop(held);
            installed
        }
        Err(e) => Err(e),
    };
    if installed.is_err() {
        let _ = tokio::fs::remove_dir_all(&staging).await;
    }
    installed?;
    engine.metrics.snapshot_fetched("bucket");
    keep_cache_within_bound(engine);
    tracing::debug!(
        area,
        "downloaded a snapshot in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// The checksum the manifest in `dir` names, if it has a readable one and was not found
/// damaged (a damaged copy is replaced by a download).
fn local_checksum(dir: &Path) -> Option<String> {
    if snapshot::marked_damaged(dir) {
        return None;
    }
    let text = std::fs::read(dir.join(snapshot::MANIFEST)).ok()?;
    snapshot::parse_manifest(&text, &|_| true)
        .ok()
        .map(|m| m.sha256)
}

/// Keeps the home's copies of machines' snapshots within `snapshot_cache_mb` (in the
/// background): past it, the copies of the machines used least recently are removed, resident
/// machines' never, and only copies of snapshots the bucket holds. Checkpoints' copies stay
/// (they count against the account's disk limit).
pub(crate) fn keep_cache_within_bound(engine: &Arc<EngineInner>) {
    if engine.bucket.is_none() || engine.evicting.swap(true, Ordering::SeqCst) {
        return;
    }
    let engine = Arc::clone(engine);
    tokio::spawn(async move {
        if let Err(e) = evict_past_bound(&engine).await {
            tracing::warn!("cannot keep the snapshot cache within its bound: {e}");
        }
        engine.evicting.store(false, Ordering::SeqCst);
    });
}

/// A copy of a machine's snapshot on the home's disk.
struct Copy {
    machine: String,
    bytes: u64,
    /// How long the machine was not used (the longest for machines without a handle now).
    idle_for: Duration,
    resident: bool,
}

async fn evict_past_bound(engine: &Arc<EngineInner>) -> Result<()> {
    let bound = engine.config.snapshot_cache_mb.saturating_mul(1024 * 1024);
    let inner = Arc::clone(engine);
    let mut copies = tokio::task::spawn_blocking(move || {
        let loaded: std::collections::HashMap<String, (Duration, bool)> = lock(&inner.machines)
            .iter()
            .map(|(name, handle)| (name.clone(), (handle.idle_for(), handle.resident())))
            .collect();
        snapshot::machines_with_snapshots(&inner.config.home)
            .into_iter()
            .map(|machine| {
                let (idle_for, resident) = loaded
                    .get(&machine)
                    .copied()
                    .unwrap_or((Duration::MAX, false));
                Copy {
                    bytes: inner.disk_facts(&machine).snapshot_bytes,
                    machine,
                    idle_for,
                    resident,
                }
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| Error::internal(format!("measuring the snapshot cache stopped: {e}")))?;
    let mut total: u64 = copies.iter().map(|c| c.bytes).sum();
    if total <= bound {
        return Ok(());
    }
    copies.retain(|c| !c.resident);
    copies.sort_by_key(|c| std::cmp::Reverse(c.idle_for));
    for copy in copies {
        if total <= bound {
            break;
        }
        let handle = lock(&engine.machines).get(&copy.machine).cloned();
        let dropped = match handle {
            // Its task removes it between instructions, never under a restore.
            Some(handle) => handle.drop_copy().await,
            None => {
                // No handle can be made for it meanwhile.
                let _membership = engine.membership.lock().await;
                if lock(&engine.machines).contains_key(&copy.machine) {
                    Ok(false)
                } else {
                    drop_copy(engine, &copy.machine).await
                }
            }
        };
        match dropped {
            Ok(true) => total = total.saturating_sub(copy.bytes),
            Ok(false) => {}
            Err(e) => tracing::debug!(machine = copy.machine, "its copy stays: {e}"),
        }
    }
    Ok(())
}

/// Removes the home's copy of the machine's snapshot if the store names one in the bucket (the
/// caller makes sure that nothing restores the machine meanwhile); whether it did.
pub(super) async fn drop_copy(engine: &EngineInner, machine: &str) -> Result<bool> {
    let kept_in_bucket = engine
        .store
        .machine(machine)
        .await?
        .is_some_and(|r| r.snapshot_sha256.is_some());
    if !kept_in_bucket {
        return Ok(false);
    }
    let (home, name) = (engine.config.home.clone(), machine.to_owned());
    tokio::task::spawn_blocking(move || snapshot::remove_copy(&home, &name))
        .await
        .map_err(|e| Error::internal(format!("removing a snapshot's copy stopped: {e}")))??;
    engine.forget_disk_facts(machine);
    // A chunked copy's chunks go with the next collection (those no other snapshot names).
    engine.snapshots_changed();
    tracing::debug!(
        machine,
        "removed the home's copy of its snapshot (the bucket keeps it)"
    );
    Ok(true)
}
