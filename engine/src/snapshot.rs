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
const MANIFEST: &str = "manifest.json";
/// Written beside a snapshot found unusable, with the reason, so that the machine shows as
/// damaged (also after a restart) until it is deleted or gets a new snapshot.
const DAMAGED: &str = "damaged.txt";

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

/// SHA-256 over every file in `dir` but the manifest (names sorted, each name then contents),
/// and their total size.
fn digest_dir(dir: &Path) -> Result<(String, u64)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != MANIFEST && n != DAMAGED)
        .collect();
    names.sort();
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

/// A fresh, empty directory for a checkpoint to write into.
pub fn staging_dir(home: &Path, machine: &str) -> Result<PathBuf> {
    let dir = machine_dir(home, machine).join(format!("snapshot.tmp-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

/// Seals a checkpoint written into `staging`: manifest, fsync, and rename into place (the old
/// snapshot is replaced only once the new one is whole).
pub fn commit(
    home: &Path,
    machine: &str,
    staging: &Path,
    runtime: &str,
    image_id: Option<String>,
) -> Result<SnapshotManifest> {
    let (sha256, bytes) = digest_dir(staging)?;
    let manifest = SnapshotManifest {
        format: FORMAT,
        engine_version: env!("CARGO_PKG_VERSION").to_owned(),
        runtime: runtime.to_owned(),
        image_id,
        sha256,
        bytes,
        created_at: chrono::Utc::now().to_rfc3339(),
    };
    let text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::internal(format!("cannot encode a snapshot manifest: {e}")))?;
    write_durably(&staging.join(MANIFEST), &text)?;
    fsync_dir(staging)?;
    let target = snapshot_dir(home, machine);
    let old = machine_dir(home, machine).join("snapshot.old");
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    if target.exists() {
        std::fs::rename(&target, &old)?;
    }
    std::fs::rename(staging, &target)?;
    fsync_dir(&machine_dir(home, machine))?;
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    Ok(manifest)
}

/// The machine's snapshot, checked: `Ok(None)` when it has none; an error naming what is wrong
/// when it is missing a part, truncated, corrupt, or from another runtime.
pub fn verify(home: &Path, machine: &str, runtime: &str) -> Result<Option<SnapshotManifest>> {
    let dir = snapshot_dir(home, machine);
    if !dir.exists() {
        return Ok(None);
    }
    let damaged = |why: String| {
        Error::new(
            ErrorKind::MachineCrashed,
            format!("the snapshot in {} cannot be used: {why}", dir.display()),
        )
    };
    let text = std::fs::read(dir.join(MANIFEST))
        .map_err(|e| damaged(format!("its manifest is unreadable ({e})")))?;
    let manifest: SnapshotManifest = serde_json::from_slice(&text)
        .map_err(|e| damaged(format!("its manifest is invalid ({e})")))?;
    if manifest.format != FORMAT {
        return Err(damaged(format!(
            "format {} (this engine reads format {FORMAT})",
            manifest.format
        )));
    }
    if manifest.runtime != runtime {
        return Err(damaged(format!(
            "it was written by {}, and this engine runs {runtime}",
            manifest.runtime
        )));
    }
    let (sha256, bytes) = digest_dir(&dir).map_err(|e| damaged(e.to_string()))?;
    if bytes != manifest.bytes || sha256 != manifest.sha256 {
        return Err(damaged(format!(
            "its files do not match the manifest ({bytes} bytes, expected {}; checksum {})",
            manifest.bytes,
            if sha256 == manifest.sha256 {
                "matches"
            } else {
                "differs"
            }
        )));
    }
    Ok(Some(manifest))
}

/// The snapshot's size on disk, and whether a look without reading it all finds it unusable
/// (no manifest, another runtime, a size that differs). `None` without a snapshot.
pub fn quick_check(home: &Path, machine: &str, runtime: &str) -> Option<(u64, bool)> {
    let dir = snapshot_dir(home, machine);
    let entries = std::fs::read_dir(&dir).ok()?;
    let mut bytes = 0;
    for entry in entries.flatten() {
        if entry.file_name() != MANIFEST && entry.file_name() != DAMAGED {
            bytes += entry.metadata().map_or(0, |m| m.len());
        }
    }
    let manifest: Option<SnapshotManifest> = std::fs::read(dir.join(MANIFEST))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok());
    let damaged = dir.join(DAMAGED).exists()
        || manifest.is_none_or(|m| m.format != FORMAT || m.runtime != runtime || m.bytes != bytes);
    Some((bytes, damaged))
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
    let dir = machine_dir(home, machine);
    match std::fs::remove_dir_all(&dir) {
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

    #[test]
    fn a_committed_snapshot_verifies_and_damage_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let staging = staging_dir(home.path(), "m").unwrap();
        std::fs::write(staging.join("checkpoint.img"), vec![7u8; 4096]).unwrap();
        let written = commit(home.path(), "m", &staging, "runsc 1 ptrace", None).unwrap();
        assert_eq!(
            verify(home.path(), "m", "runsc 1 ptrace").unwrap(),
            Some(written)
        );
        assert!(
            verify(home.path(), "other", "runsc 1 ptrace")
                .unwrap()
                .is_none()
        );

        assert_eq!(
            quick_check(home.path(), "m", "runsc 1 ptrace"),
            Some((4096, false))
        );
        assert_eq!(
            quick_check(home.path(), "m", "runsc 2 ptrace"),
            Some((4096, true))
        );
        assert_eq!(quick_check(home.path(), "other", "runsc 1 ptrace"), None);

        let err = verify(home.path(), "m", "runsc 2 ptrace").unwrap_err();
        assert!(err.message().contains("written by runsc 1"), "{err}");

        let image = snapshot_dir(home.path(), "m").join("checkpoint.img");
        let mut bytes = std::fs::read(&image).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&image, &bytes).unwrap();
        let err = verify(home.path(), "m", "runsc 1 ptrace").unwrap_err();
        assert!(err.message().contains("checksum differs"), "{err}");

        std::fs::write(&image, &bytes[..10]).unwrap();
        let err = verify(home.path(), "m", "runsc 1 ptrace").unwrap_err();
        assert!(err.message().contains("10 bytes"), "{err}");

        mark_damaged(home.path(), "m", "checksum differs");
        assert_eq!(
            quick_check(home.path(), "m", "runsc 1 ptrace").map(|(_, damaged)| damaged),
            Some(true)
        );
        std::fs::remove_file(snapshot_dir(home.path(), "m").join(MANIFEST)).unwrap();
        let err = verify(home.path(), "m", "runsc 1 ptrace").unwrap_err();
        assert!(err.message().contains("manifest is unreadable"), "{err}");
        remove(home.path(), "m").unwrap();
        assert!(verify(home.path(), "m", "x").unwrap().is_none());
    }
}
