//! A machine's snapshot on disk: what the backend's checkpoint wrote (for gVisor, runsc's
//! `checkpoint.img`), plus `manifest.json` naming the format, the engine, the exact runtime
//! (runsc version and binary hash, platform) and image that wrote it, and a SHA-256 over every
//! file. A snapshot is written under a temporary name, fsynced and renamed into place, and is
//! refused, not trusted, when anything does not match.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind, Result};
use crate::fsutil::{fsync_dir, write_durably};

const FORMAT: u32 = 1;
pub(crate) const MANIFEST: &str = "manifest.json";
/// Written beside a snapshot found unusable, with the reason, so that the machine shows as
/// damaged (also after a restart) until it is deleted or gets a new snapshot.
const DAMAGED: &str = "damaged.txt";
/// Marks a snapshot whose next restore must reseed the interpreter's random generators (a fork's
/// or a base snapshot's copy): every copy would otherwise draw the same numbers.
pub(crate) const RESEED: &str = "reseed";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotManifest {
    pub format: u32,
    pub engine_version: String,
    /// The backend and its exact version; only the same restores the snapshot.
    pub runtime: String,
    pub image_id: Option<String>,
    pub sha256: String,
    pub bytes: u64,
    pub created_at: String,
}

/// `<home>/machines/<name>`.
pub fn machine_dir(home: &Path, machine: &str) -> PathBuf {
    home.join("machines").join(machine)
}

/// The machine's current snapshot directory.
pub fn snapshot_dir(home: &Path, machine: &str) -> PathBuf {
    machine_dir(home, machine).join("snapshot")
}

/// Whether a file in a snapshot directory is part of the snapshot (not the manifest, the marks
/// beside it, or a temporary file a crash left).
pub(crate) fn is_snapshot_file(name: &str) -> bool {
    name != MANIFEST && name != DAMAGED && name != RESEED && !name.starts_with('.')
}

/// The names of the files of the snapshot in `dir` (not its manifest or the marks beside it),
/// sorted.
pub(crate) fn snapshot_files(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_snapshot_file(n))
        .collect();
    names.sort();
    Ok(names)
}

/// The files of the snapshot in `dir` that are not recipes (those the chunk store would take).
pub(crate) fn unchunked_files(dir: &Path) -> Result<Vec<String>> {
    Ok(snapshot_files(dir)?
        .into_iter()
        .filter(|n| crate::chunks::chunked_name(n).is_none())
        .collect())
}

/// SHA-256 over every file in `dir` but the manifest (names sorted, each name then contents),
/// and their total size.
fn digest_dir(dir: &Path) -> Result<(String, u64)> {
    let names = snapshot_files(dir)?;
    let mut hasher = Sha256::new();
    let mut bytes = 0;
    for name in names {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        let mut file = std::fs::File::open(dir.join(&name))?;
        bytes += std::io::copy(&mut file, &mut hasher)?;
        file.sync_all()?;
    }
    Ok((hex::encode(hasher.finalize()), bytes))
}

/// `<home>/machines/<name>/history`: the machine's undo points.
pub fn history_dir(home: &Path, machine: &str) -> PathBuf {
    machine_dir(home, machine).join("history")
}

/// `<home>/machines/<name>/history/<seq>`: the machine's state after instruction `seq` (`-1`:
/// before its first).
pub fn point_dir(home: &Path, machine: &str, seq: i64) -> PathBuf {
    history_dir(home, machine).join(seq.to_string())
}

/// The seqs of the machine's undo points on disk, in order.
pub fn points(home: &Path, machine: &str) -> Vec<i64> {
    let mut seqs: Vec<i64> = std::fs::read_dir(history_dir(home, machine))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().join(MANIFEST).is_file())
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    seqs.sort_unstable();
    seqs
}

/// Removes an undo point: renamed to a scratch name first, so nothing finds it half removed.
pub fn remove_point(home: &Path, machine: &str, seq: i64) -> Result<()> {
    remove_renamed(&point_dir(home, machine, seq), &format!("dropped-{seq}"))
}

/// Removes the snapshot directory `dir`, renamed to a scratch name (`what` in it) first, so
/// that nothing finds it half removed; one that is not there is fine.
fn remove_renamed(dir: &Path, what: &str) -> Result<()> {
    use rand::Rng;
    let scratch = dir.with_file_name(format!(
        "{SCRATCH_BUILDING}{what}-{}-{:08x}",
        std::process::id(),
        rand::rng().random::<u32>()
    ));
    match std::fs::rename(dir, &scratch) {
        Ok(()) => remove_dir(&scratch),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `<home>/machines/<name>/checkpoints/<checkpoint>`: a named, kept snapshot.
pub fn checkpoint_dir(home: &Path, machine: &str, checkpoint: &str) -> PathBuf {
    machine_dir(home, machine)
        .join("checkpoints")
        .join(checkpoint)
}

/// Names the engine gives its own scratch directories beside a snapshot (a copy being built,
/// the snapshot being replaced). They start with `.`, which no machine, checkpoint or base
/// snapshot name can: a user's checkpoint can never be taken for one (and removed, or put back
/// over another).
const SCRATCH_BUILDING: &str = ".tmp-";
const SCRATCH_REPLACED: &str = ".old-";

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "snapshot".into(), |n| n.to_string_lossy().into_owned())
}

/// A fresh, empty directory beside `target` to build a snapshot in before it is renamed into
/// place.
fn staging_for(target: &Path) -> Result<PathBuf> {
    use rand::Rng;
    let suffix: u32 = rand::rng().random();
    let dir = target.with_file_name(format!(
        "{SCRATCH_BUILDING}{}-{}-{suffix:08x}",
        file_name(target),
        std::process::id()
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

/// A fresh, empty directory for a checkpoint of the machine to write into.
pub fn staging_dir(home: &Path, machine: &str) -> Result<PathBuf> {
    staging_for(&snapshot_dir(home, machine))
}

/// Where `target` is kept while a new one replaces it.
fn replaced(target: &Path) -> PathBuf {
    target.with_file_name(format!("{SCRATCH_REPLACED}{}", file_name(target)))
}

/// Renames a finished `staging` directory to `target`, replacing what was there only once the
/// new one is whole (a crash in between leaves the old one under its scratch name, which
/// [`recover`] puts back).
fn install(staging: &Path, target: &Path) -> Result<()> {
    let parent = target
        .parent()
        .ok_or_else(|| Error::internal(format!("{} has no parent", target.display())))?;
    let old = replaced(target);
    if old.exists() {
        if target.exists() {
            std::fs::remove_dir_all(&old)?;
        } else {
            // A crash between the two renames: the old one is the last whole snapshot.
            std::fs::rename(&old, target)?;
        }
    }
    if target.exists() {
        std::fs::rename(target, &old)?;
    }
    std::fs::rename(staging, target)?;
    fsync_dir(parent)?;
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    Ok(())
}

/// Seals a checkpoint written into `staging` as the machine's snapshot: manifest, fsync, and
/// rename into place (the old snapshot is replaced only once the new one is whole).
pub fn commit(
    home: &Path,
    machine: &str,
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
) -> Result<SnapshotManifest> {
    let manifest = seal_staged(staging, runtime, image_id)?;
    install_snapshot(home, machine, staging)?;
    Ok(manifest)
}

/// The first half of [`commit`]: writes the manifest of the checkpoint in `staging` and syncs
/// it, leaving it where it is (to be uploaded before it replaces the machine's snapshot).
pub fn seal_staged(
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
) -> Result<SnapshotManifest> {
    write_manifest(staging, runtime, image_id, chrono::Utc::now().to_rfc3339())
}

/// The second half of [`commit`]: renames a sealed `staging` directory into place as the
/// machine's snapshot.
pub fn install_snapshot(home: &Path, machine: &str, staging: &Path) -> Result<()> {
    std::fs::create_dir_all(machine_dir(home, machine))?;
    install(staging, &snapshot_dir(home, machine))
}

/// Renames a sealed snapshot in `staging` (a download, say) into place at `target`.
pub fn install_at(staging: &Path, target: &Path) -> Result<()> {
    install(staging, target)
}

/// A fresh, empty directory to build a snapshot for `target` in (see [`commit_to`]).
pub fn staging_beside(target: &Path) -> Result<PathBuf> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", parent.display())))?;
    }
    staging_for(target)
}

/// [`commit`] into any snapshot directory (a base snapshot).
pub fn commit_to(
    target: &Path,
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
) -> Result<SnapshotManifest> {
    seal(
        target,
        staging,
        runtime,
        image_id,
        chrono::Utc::now().to_rfc3339(),
    )
}

/// Writes the manifest of the snapshot in `staging` (which was taken at `created_at`) and
/// renames it into place at `target`.
fn seal(
    target: &Path,
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
    created_at: String,
) -> Result<SnapshotManifest> {
    let manifest = write_manifest(staging, runtime, image_id, created_at)?;
    install(staging, target)?;
    Ok(manifest)
}

/// Writes and syncs the manifest of the snapshot in `staging`, taken at `created_at`.
fn write_manifest(
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
    created_at: String,
) -> Result<SnapshotManifest> {
    owner_only(staging)?;
    let (sha256, bytes) = digest_dir(staging)?;
    let manifest = SnapshotManifest {
        format: FORMAT,
        engine_version: env!("CARGO_PKG_VERSION").to_owned(),
        runtime: runtime.to_owned(),
        image_id,
        sha256,
        bytes,
        created_at,
    };
    let text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::internal(format!("cannot encode a snapshot manifest: {e}")))?;
    write_durably(&staging.join(MANIFEST), &text)?;
    fsync_dir(staging)?;
    Ok(manifest)
}

/// Replaces the machine's snapshot by a changed copy of it (compressed, say): the snapshot is
/// checked first (a damaged one is refused, never sealed anew), its files are linked into a
/// staging directory where `change` works, and the result is sealed with the same runtime,
/// image and time and renamed into place. Marks beside the snapshot (reseed) are kept.
pub fn rewrite(
    home: &Path,
    machine: &str,
    restorable: &dyn Fn(&str) -> bool,
    change: impl FnOnce(&Path) -> Result<()>,
) -> Result<SnapshotManifest> {
    let target = snapshot_dir(home, machine);
    rewrite_to(&target, &target, restorable, change)
}

/// [`rewrite`] from the snapshot in `from` to `to` (the same directory, or another: an undo
/// point made from the machine's snapshot).
pub fn rewrite_to(
    from: &Path,
    to: &Path,
    restorable: &dyn Fn(&str) -> bool,
    change: impl FnOnce(&Path) -> Result<()>,
) -> Result<SnapshotManifest> {
    let manifest = verify_dir(from, restorable)?.ok_or_else(|| {
        Error::internal(format!("{} holds no snapshot to rewrite", from.display()))
    })?;
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", parent.display())))?;
    }
    let staging = staging_for(to)?;
    let target = to.to_path_buf();
    let rewritten = (|| -> Result<SnapshotManifest> {
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            let name = entry.file_name();
            let name_text = name.to_string_lossy();
            if !(is_snapshot_file(&name_text) || name_text == RESEED)
                || !entry.file_type()?.is_file()
            {
                continue;
            }
            std::fs::hard_link(entry.path(), staging.join(&name))?;
        }
        change(&staging)?;
        seal(
            &target,
            &staging,
            &manifest.runtime,
            manifest.image_id.clone(),
            manifest.created_at.clone(),
        )
    })();
    if rewritten.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    rewritten
}

/// Makes the files a backend wrote into `dir` readable by their owner only: a snapshot is a
/// machine's whole memory.
fn owner_only(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// Marks a snapshot so that every restore of it reseeds the interpreter's random generators.
pub fn mark_reseed(dir: &Path) -> Result<()> {
    write_durably(&dir.join(RESEED), b"reseed the interpreter after restore\n")
}

/// Copies a whole snapshot (`from`, manifest included, its damage note not) to `to`, replacing
/// what is there once the copy is whole. Files are hard-linked where the file system allows:
/// snapshot files are never changed in place, only replaced. With `reseed`, the copy is marked
/// so that its first restore reseeds the interpreter's random generators (a fork, a base
/// snapshot).
pub fn copy(from: &Path, to: &Path, reseed: bool) -> Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", parent.display())))?;
    }
    let staging = staging_for(to)?;
    let copied = (|| -> Result<()> {
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            let name = entry.file_name();
            let is_manifest = name == MANIFEST;
            if !(is_manifest || is_snapshot_file(&name.to_string_lossy()))
                || !entry.file_type()?.is_file()
            {
                continue;
            }
            let target = staging.join(&name);
            if std::fs::hard_link(entry.path(), &target).is_err() {
                std::fs::copy(entry.path(), &target)?;
                std::fs::File::open(&target)?.sync_all()?;
            }
        }
        if reseed {
            mark_reseed(&staging)?;
        }
        fsync_dir(&staging)?;
        install(&staging, to)
    })();
    if copied.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    copied.map_err(|e| {
        e.context(format!(
            "copying the snapshot {} to {}",
            from.display(),
            to.display()
        ))
    })
}

/// Whether a restore of this snapshot must reseed the interpreter (a fork's first restore).
pub fn needs_reseed(dir: &Path) -> bool {
    dir.join(RESEED).exists()
}

/// The machine's snapshot, checked: `Ok(None)` when it has none; an error naming what is wrong
/// when it is missing a part, truncated, corrupt, or from a runtime `restorable` refuses.
pub fn verify(
    home: &Path,
    machine: &str,
    restorable: &dyn Fn(&str) -> bool,
) -> Result<Option<SnapshotManifest>> {
    verify_dir(&snapshot_dir(home, machine), restorable)
}

/// [`verify`] for any snapshot directory (a checkpoint, a base snapshot).
pub fn verify_dir(
    dir: &Path,
    restorable: &dyn Fn(&str) -> bool,
) -> Result<Option<SnapshotManifest>> {
    let Some(manifest) = check_manifest(dir, restorable)? else {
        return Ok(None);
    };
    check_files(dir, &manifest)?;
    Ok(Some(manifest))
}

fn damaged(dir: &Path, why: String) -> Error {
    Error::new(
        ErrorKind::MachineCrashed,
        format!("the snapshot in {} cannot be used: {why}", dir.display()),
    )
}

/// The cheap half of [`verify_dir`]: the manifest is readable, of this format, and from a
/// runtime `restorable` accepts. `Ok(None)` when there is no snapshot.
pub fn check_manifest(
    dir: &Path,
    restorable: &dyn Fn(&str) -> bool,
) -> Result<Option<SnapshotManifest>> {
    if !dir.exists() {
        return Ok(None);
    }
    let text = std::fs::read(dir.join(MANIFEST))
        .map_err(|e| damaged(dir, format!("its manifest is unreadable ({e})")))?;
    parse_manifest(&text, restorable)
        .map(Some)
        .map_err(|e| damaged(dir, e.message().to_owned()))
}

/// Decodes a `manifest.json` and checks that it is of this format and from a runtime
/// `restorable` accepts. The error (`MachineCrashed`) says what is wrong, without the directory.
pub fn parse_manifest(text: &[u8], restorable: &dyn Fn(&str) -> bool) -> Result<SnapshotManifest> {
    let refused = |why: String| Error::new(ErrorKind::MachineCrashed, why);
    let manifest: SnapshotManifest = serde_json::from_slice(text)
        .map_err(|e| refused(format!("its manifest is invalid ({e})")))?;
    if manifest.format != FORMAT {
        return Err(refused(format!(
            "format {} (this engine reads format {FORMAT})",
            manifest.format
        )));
    }
    if !restorable(&manifest.runtime) {
        return Err(refused(format!(
            "it was written by {}, which this engine does not have (keep that runsc, or delete \
             the machine)",
            manifest.runtime
        )));
    }
    Ok(manifest)
}

/// The expensive half of [`verify_dir`]: every file's bytes match the manifest's size and
/// SHA-256.
pub fn check_files(dir: &Path, manifest: &SnapshotManifest) -> Result<()> {
    let (sha256, bytes) = digest_dir(dir).map_err(|e| damaged(dir, e.to_string()))?;
    if bytes != manifest.bytes || sha256 != manifest.sha256 {
        return Err(damaged(
            dir,
            format!(
                "its files do not match the manifest ({bytes} bytes, expected {}; checksum {})",
                manifest.bytes,
                if sha256 == manifest.sha256 {
                    "matches"
                } else {
                    "differs"
                }
            ),
        ));
    }
    Ok(())
}

/// Bytes of the files under `dir` (snapshot files only), counting hard-linked files once
/// (`seen` holds the inodes counted so far).
fn snapshot_bytes(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut bytes = 0;
    for entry in entries.flatten() {
        if !is_snapshot_file(&entry.file_name().to_string_lossy()) {
            continue;
        }
        if let Ok(meta) = entry.metadata()
            && meta.is_file()
            && seen.insert((meta.dev(), meta.ino()))
        {
            bytes += meta.len();
        }
    }
    bytes
}

/// Bytes of the snapshot files in one snapshot directory (a checkpoint's, say).
pub fn dir_bytes(dir: &Path) -> u64 {
    snapshot_bytes(dir, &mut std::collections::HashSet::new())
}

/// Bytes of the machine's snapshot and checkpoints on disk (hard-linked files counted once).
pub fn disk_bytes(home: &Path, machine: &str) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut bytes = snapshot_bytes(&snapshot_dir(home, machine), &mut seen);
    if let Ok(entries) = std::fs::read_dir(machine_dir(home, machine).join("checkpoints")) {
        for entry in entries.flatten() {
            bytes += snapshot_bytes(&entry.path(), &mut seen);
        }
    }
    bytes
}

/// Whether the machine has a snapshot (`None` without one), and whether a look without reading
/// it all finds it unusable, and why: marked damaged earlier, no valid manifest, a runtime
/// `restorable` refuses, or a size that differs.
pub fn quick_check(
    home: &Path,
    machine: &str,
    restorable: &dyn Fn(&str) -> bool,
) -> Option<std::result::Result<(), String>> {
    let dir = snapshot_dir(home, machine);
    if !dir.is_dir() {
        return None;
    }
    if let Ok(reason) = std::fs::read_to_string(dir.join(DAMAGED)) {
        return Some(Err(reason));
    }
    let manifest = match check_manifest(&dir, restorable) {
        Ok(Some(manifest)) => manifest,
        Ok(None) => return None,
        Err(e) => return Some(Err(e.message().to_owned())),
    };
    let bytes = snapshot_bytes(&dir, &mut std::collections::HashSet::new());
    if bytes != manifest.bytes {
        return Some(Err(damaged(
            &dir,
            format!(
                "its files hold {bytes} bytes, the manifest says {}",
                manifest.bytes
            ),
        )
        .message()
        .to_owned()));
    }
    Some(Ok(()))
}

/// Puts back what a crash in the middle of replacing snapshots left (a replaced snapshot
/// without its successor) and removes unfinished copies, under every machine's directory, its
/// checkpoints and the base snapshots. Only the engine's own scratch names are touched (and,
/// from engines before those names, `snapshot.old`/`snapshot.tmp-*` and the base snapshots'
/// `*.old`/`*.tmp-*`, which no user could name).
pub fn recover(home: &Path) {
    let machine_dirs: Vec<PathBuf> = std::fs::read_dir(home.join("machines"))
        .map(|entries| entries.flatten().map(|m| m.path()).collect())
        .unwrap_or_default();
    let mut dirs = Vec::new();
    for machine in &machine_dirs {
        dirs.push((machine.clone(), Legacy::SnapshotOnly));
        dirs.push((machine.join("checkpoints"), Legacy::None));
        dirs.push((machine.join("history"), Legacy::None));
    }
    dirs.push((home.join("base"), Legacy::Any));
    for (dir, legacy) in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(SCRATCH_BUILDING) || legacy.building(&name) {
                let _ = std::fs::remove_dir_all(&path);
            } else if let Some(base) = name
                .strip_prefix(SCRATCH_REPLACED)
                .or_else(|| legacy.replaced(&name))
            {
                let target = dir.join(base);
                if target.exists() {
                    let _ = std::fs::remove_dir_all(&path);
                } else {
                    tracing::warn!(path = %target.display(), "putting back a snapshot an interrupted swap left");
                    let _ = std::fs::rename(&path, &target);
                }
            }
        }
    }
}

/// Which scratch names of engines before the `.`-prefixed ones a directory may hold.
#[derive(Clone, Copy)]
enum Legacy {
    None,
    /// A machine's directory: only its `snapshot`'s.
    SnapshotOnly,
    /// The base snapshots' directory: every name there is the engine's.
    Any,
}

impl Legacy {
    fn building(self, name: &str) -> bool {
        match self {
            Legacy::None => false,
            Legacy::SnapshotOnly => name.starts_with("snapshot.tmp-"),
            Legacy::Any => name.contains(".tmp-"),
        }
    }

    fn replaced(self, name: &str) -> Option<&str> {
        match self {
            Legacy::None => None,
            Legacy::SnapshotOnly => (name == "snapshot.old").then_some("snapshot"),
            Legacy::Any => name.strip_suffix(".old"),
        }
    }
}

/// The machines that have a snapshot directory under `home`.
pub fn machines_with_snapshots(home: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(home.join("machines")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().join("snapshot").join(MANIFEST).is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Whether the snapshot in `dir` was found unusable (and marked so).
pub fn marked_damaged(dir: &Path) -> bool {
    dir.join(DAMAGED).exists()
}

/// Records why a machine's snapshot cannot be used.
pub fn mark_damaged(home: &Path, machine: &str, reason: &str) {
    let path = snapshot_dir(home, machine).join(DAMAGED);
    if let Err(e) = write_durably(&path, reason.as_bytes()) {
        tracing::warn!(machine, "cannot mark the snapshot damaged: {e}");
    }
}

/// Removes a machine's snapshot and everything else under its directory.
pub fn remove(home: &Path, machine: &str) -> Result<()> {
    remove_dir(&machine_dir(home, machine))
}

/// Removes the home's copy of a machine's snapshot (one the bucket keeps): renamed to a scratch
/// name first, so that nothing finds it half removed.
pub fn remove_copy(home: &Path, machine: &str) -> Result<()> {
    remove_renamed(&snapshot_dir(home, machine), "evicted")
}

/// Removes one checkpoint's files.
pub fn remove_checkpoint(home: &Path, machine: &str, checkpoint: &str) -> Result<()> {
    remove_dir(&checkpoint_dir(home, machine, checkpoint))
}

/// Removes a directory and what it holds; one that is not there is fine.
fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::internal(format!(
            "cannot remove {}: {e}",
            dir.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runsc(version: &'static str) -> impl Fn(&str) -> bool {
        move |runtime| runtime == version
    }

    #[test]
    fn a_rewritten_snapshot_keeps_its_time_runtime_and_marks_and_damage_is_never_resealed() {
        let home = tempfile::tempdir().unwrap();
        let staging = staging_dir(home.path(), "m").unwrap();
        std::fs::write(staging.join("pages.img"), vec![7u8; 4096]).unwrap();
        std::fs::write(staging.join("meta.img"), b"meta").unwrap();
        mark_reseed(&staging).unwrap();
        let written = commit(home.path(), "m", &staging, "runsc 1", Some("img".into())).unwrap();
        let v1 = runsc("runsc 1");
        let rewritten = rewrite(home.path(), "m", &v1, |dir| {
            let packed = std::fs::read(dir.join("pages.img"))?.len().to_string();
            std::fs::remove_file(dir.join("pages.img"))?;
            std::fs::write(dir.join("pages.img.small"), packed)?;
            Ok(())
        })
        .unwrap();
        assert_eq!(rewritten.created_at, written.created_at);
        assert_eq!(rewritten.runtime, "runsc 1");
        assert_eq!(rewritten.image_id.as_deref(), Some("img"));
        assert_ne!(rewritten.sha256, written.sha256);
        assert_eq!(verify(home.path(), "m", &v1).unwrap(), Some(rewritten));
        let dir = snapshot_dir(home.path(), "m");
        assert!(needs_reseed(&dir));
        assert_eq!(std::fs::read(dir.join("pages.img.small")).unwrap(), b"4096");
        assert_eq!(std::fs::read(dir.join("meta.img")).unwrap(), b"meta");
        assert!(!dir.join("pages.img").exists());

        // A failed change leaves the snapshot as it was, and no staging directory behind.
        let before = verify(home.path(), "m", &v1).unwrap();
        let failed = rewrite(home.path(), "m", &v1, |_| Err(Error::internal("no room")));
        assert!(failed.is_err());
        assert_eq!(verify(home.path(), "m", &v1).unwrap(), before);
        let leftovers: Vec<_> = std::fs::read_dir(machine_dir(home.path(), "m"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(leftovers, ["snapshot"]);

        // A damaged snapshot is refused, never sealed anew with its damage.
        let mut bytes = std::fs::read(dir.join("meta.img")).unwrap();
        bytes[0] ^= 1;
        std::fs::write(dir.join("meta.img"), &bytes).unwrap();
        let refused = rewrite(home.path(), "m", &v1, |_| Ok(()));
        assert!(refused.is_err());
        assert!(verify(home.path(), "m", &v1).is_err());
    }

    #[test]
    fn a_committed_snapshot_verifies_and_damage_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let staging = staging_dir(home.path(), "m").unwrap();
        std::fs::write(staging.join("checkpoint.img"), vec![7u8; 4096]).unwrap();
        let written = commit(home.path(), "m", &staging, "runsc 1 ptrace", None).unwrap();
        let v1 = runsc("runsc 1 ptrace");
        let v2 = runsc("runsc 2 ptrace");
        assert_eq!(verify(home.path(), "m", &v1).unwrap(), Some(written));
        assert!(verify(home.path(), "other", &v1).unwrap().is_none());

        assert_eq!(quick_check(home.path(), "m", &v1), Some(Ok(())));
        let refused = quick_check(home.path(), "m", &v2).unwrap().unwrap_err();
        assert!(refused.contains("written by runsc 1"), "{refused}");
        assert_eq!(quick_check(home.path(), "other", &v1), None);
        assert_eq!(disk_bytes(home.path(), "m"), 4096);
        use std::os::unix::fs::PermissionsExt;
        let image = snapshot_dir(home.path(), "m").join("checkpoint.img");
        assert_eq!(
            std::fs::metadata(&image).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let err = verify(home.path(), "m", &v2).unwrap_err();
        assert!(err.message().contains("written by runsc 1"), "{err}");

        let image = snapshot_dir(home.path(), "m").join("checkpoint.img");
        let mut bytes = std::fs::read(&image).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&image, &bytes).unwrap();
        let err = verify(home.path(), "m", &v1).unwrap_err();
        assert!(err.message().contains("checksum differs"), "{err}");

        std::fs::write(&image, &bytes[..10]).unwrap();
        let err = verify(home.path(), "m", &v1).unwrap_err();
        assert!(err.message().contains("10 bytes"), "{err}");

        mark_damaged(home.path(), "m", "checksum differs");
        assert_eq!(
            quick_check(home.path(), "m", &v1),
            Some(Err("checksum differs".to_owned()))
        );
        std::fs::remove_file(snapshot_dir(home.path(), "m").join(MANIFEST)).unwrap();
        let err = verify(home.path(), "m", &v1).unwrap_err();
        assert!(err.message().contains("manifest is unreadable"), "{err}");
        remove(home.path(), "m").unwrap();
        assert!(verify(home.path(), "m", &v1).unwrap().is_none());
    }

    #[test]
    fn checkpoint_names_never_collide_with_scratch_names() {
        let home = tempfile::tempdir().unwrap();
        let v1 = runsc("r");
        let staging = staging_dir(home.path(), "m").unwrap();
        std::fs::write(staging.join("checkpoint.img"), vec![1u8; 100]).unwrap();
        commit(home.path(), "m", &staging, "r", None).unwrap();
        let snapshot = snapshot_dir(home.path(), "m");
        // Names a user may give that look like what engines used as scratch names.
        let names = ["a.old", "a", "x.tmp-1-0", "snapshot.old", "b.tmp-"];
        for name in names {
            copy(&snapshot, &checkpoint_dir(home.path(), "m", name), false).unwrap();
        }
        // A crash left scratch directories of its own.
        let checkpoints = machine_dir(home.path(), "m").join("checkpoints");
        std::fs::create_dir_all(checkpoints.join(".tmp-a-1-0")).unwrap();
        recover(home.path());
        for name in names {
            let dir = checkpoint_dir(home.path(), "m", name);
            assert!(verify_dir(&dir, &v1).unwrap().is_some(), "{name} is gone");
        }
        assert!(!checkpoints.join(".tmp-a-1-0").exists());
        let mut left: Vec<String> = std::fs::read_dir(&checkpoints)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort_unstable();
        let mut expected: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        expected.sort_unstable();
        assert_eq!(left, expected);
    }

    #[test]
    fn copies_share_files_verify_and_carry_the_reseed_mark() {
        let home = tempfile::tempdir().unwrap();
        let v1 = runsc("r");
        let staging = staging_dir(home.path(), "m").unwrap();
        std::fs::write(staging.join("checkpoint.img"), vec![1u8; 1000]).unwrap();
        commit(home.path(), "m", &staging, "r", None).unwrap();
        let checkpoint = checkpoint_dir(home.path(), "m", "before");
        copy(&snapshot_dir(home.path(), "m"), &checkpoint, false).unwrap();
        assert!(verify_dir(&checkpoint, &v1).unwrap().is_some());
        assert!(!needs_reseed(&checkpoint));
        // Hard links: the checkpoint costs no extra bytes.
        assert_eq!(disk_bytes(home.path(), "m"), 1000);

        let fork = snapshot_dir(home.path(), "f");
        copy(&snapshot_dir(home.path(), "m"), &fork, true).unwrap();
        assert!(needs_reseed(&fork));
        assert!(verify(home.path(), "f", &v1).unwrap().is_some());

        // A damaged snapshot is replaced whole by a rollback's copy, damage note gone.
        mark_damaged(home.path(), "m", "bad");
        copy(&checkpoint, &snapshot_dir(home.path(), "m"), false).unwrap();
        assert_eq!(quick_check(home.path(), "m", &v1), Some(Ok(())));

        // An interrupted replacement is put back.
        let target = snapshot_dir(home.path(), "m");
        std::fs::rename(&target, target.with_file_name(".old-snapshot")).unwrap();
        std::fs::create_dir_all(target.with_file_name(".tmp-snapshot-1-0")).unwrap();
        recover(home.path());
        assert!(verify(home.path(), "m", &v1).unwrap().is_some());
        assert!(!target.with_file_name(".tmp-snapshot-1-0").exists());
        // And what engines before the scratch names left.
        std::fs::rename(&target, target.with_file_name("snapshot.old")).unwrap();
        std::fs::create_dir_all(target.with_file_name("snapshot.tmp-1-0")).unwrap();
        recover(home.path());
        assert!(verify(home.path(), "m", &v1).unwrap().is_some());
        assert!(!target.with_file_name("snapshot.tmp-1-0").exists());
        remove_checkpoint(home.path(), "m", "before").unwrap();
        assert!(!checkpoint.exists());
    }
}
