//! Compressed snapshots. A current runsc compresses a checkpoint with flate or not at all, and
//! flate doubles the time of a checkpoint and of a restore. Instead the engine has runsc write
//! it uncompressed and compresses its files with zstd (smaller than flate and several times faster
//! to unpack). runsc cannot read those, so a restore unpacks them into a scratch directory (in
//! the engine's `sandboxes/`, with hard links to the snapshot's other files) and restores from
//! there; the scratch directory goes once `runsc restore --detach` returns, or, for a plain
//! `runsc restore`, when the sandbox ends.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::sandbox::Effort;

/// The files of an uncompressed checkpoint worth compressing: the kernel's state and the memory.
const COMPRESSED: [&str; 2] = ["checkpoint.img", "pages.img"];
/// What a compressed file's name ends with.
const SUFFIX: &str = ".zst";
/// zstd's level for an effort (decompression takes about as long at any level): `Fast` (3) packs
/// a fresh interpreter's 7.2 MB of memory and kernel state into 1.52 MB in about 30 ms, `Small`
/// (9) into 1.37 MB in about 130 ms.
fn level(effort: Effort) -> i32 {
    match effort {
        Effort::Fast => 3,
        Effort::Small => 9,
    }
}
/// Files are read and written in pieces of this size (fewer system calls than the usual 8 KiB).
const BUFFER: usize = 1024 * 1024;

/// Whether `dir` holds an uncompressed checkpoint of a runsc that writes its memory apart
/// (`pages.img`; Debian's runsc writes one flate-compressed file).
pub(super) fn compressible(dir: &Path) -> bool {
    dir.join("pages.img").is_file()
}

/// Compresses the big files of the uncompressed checkpoint in `dir`, replacing them. All or
/// nothing: on failure (a full disk, say) the compressed files written so far are removed and
/// the uncompressed ones stay.
pub(super) fn compress(dir: &Path, effort: Effort) -> Result<()> {
    let mut written = Vec::new();
    let compressed = (|| -> Result<()> {
        for name in COMPRESSED {
            let plain = dir.join(name);
            let Ok(input) = File::open(&plain) else {
                continue;
            };
            let packed = dir.join(format!("{name}{SUFFIX}"));
            let failed = |e: std::io::Error| {
                Error::internal(format!("cannot compress {}: {e}", plain.display()))
            };
            let output = File::create_new(&packed).map_err(failed)?;
            written.push(packed);
            let mut encoder =
                zstd::stream::Encoder::new(BufWriter::with_capacity(BUFFER, output), level(effort))
                    .map_err(failed)?;
            encoder.include_checksum(true).map_err(failed)?;
            std::io::copy(&mut BufReader::with_capacity(BUFFER, input), &mut encoder)
                .map_err(failed)?;
            encoder
                .finish()
                .and_then(|mut writer| writer.flush())
                .map_err(failed)?;
        }
        Ok(())
    })();
    if let Err(e) = compressed {
        for packed in written {
            let _ = std::fs::remove_file(packed);
        }
        return Err(e);
    }
    for name in COMPRESSED {
        if dir.join(format!("{name}{SUFFIX}")).exists() {
            std::fs::remove_file(dir.join(name)).map_err(|e| {
                Error::internal(format!("cannot remove {name} once compressed: {e}"))
            })?;
        }
    }
    Ok(())
}

/// A checkpoint as runsc can read it: the snapshot's own directory, or a scratch directory with
/// the memory unpacked, removed when this is dropped.
#[derive(Debug)]
pub(super) struct Unpacked {
    dir: PathBuf,
    scratch: bool,
}

impl Unpacked {
    pub(super) fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        if self.scratch {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The snapshot in `dir` as runsc can read it; compressed files are unpacked, and chunked ones
/// put back together from `chunks`, into a new directory `scratch` (which must not exist, on
/// the same file system as `dir`).
pub(super) fn unpack(
    dir: &Path,
    scratch: PathBuf,
    chunks: Option<&crate::chunks::ChunkStore>,
) -> Result<Unpacked> {
    let failed = |what: &str, e: std::io::Error| {
        Error::internal(format!(
            "cannot unpack the snapshot in {}: {what}: {e}",
            dir.display()
        ))
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| failed("listing", e))? {
        let entry = entry.map_err(|e| failed("listing", e))?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            files.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    let packed = |name: &str| {
        name.strip_suffix(SUFFIX)
            .or_else(|| crate::chunks::chunked_name(name))
            .map(str::to_owned)
    };
    if let Some(both) = files.iter().filter_map(|name| packed(name)).find(|plain| {
        files
            .iter()
            .filter(|name| packed(name).as_ref() == Some(plain) || *name == plain)
            .count()
            > 1
    }) {
        return Err(Error::crashed(format!(
            "the snapshot in {} holds {both} twice (compressed, chunked or plain)",
            dir.display()
        )));
    }
    if !files.iter().any(|name| packed(name).is_some()) {
        return Ok(Unpacked {
            dir: dir.to_owned(),
            scratch: false,
        });
    }
    std::fs::create_dir(&scratch).map_err(|e| failed("scratch directory", e))?;
    // From here on the guard removes the scratch directory, also on failure.
    let unpacked = Unpacked {
        dir: scratch,
        scratch: true,
    };
    for name in files {
        let from = dir.join(&name);
        if let Some(plain) = crate::chunks::chunked_name(&name) {
            let chunks = chunks.ok_or_else(|| {
                Error::crashed(format!(
                    "the snapshot in {} is chunked and this engine opened no chunk store",
                    dir.display()
                ))
            })?;
            chunks.materialize(&from, &unpacked.dir.join(plain))?;
        } else if let Some(plain) = name.strip_suffix(SUFFIX) {
            let input = File::open(&from).map_err(|e| failed(&name, e))?;
            let output =
                File::create_new(unpacked.dir.join(plain)).map_err(|e| failed(plain, e))?;
            let mut writer = BufWriter::with_capacity(BUFFER, output);
            zstd::stream::copy_decode(BufReader::with_capacity(BUFFER, input), &mut writer)
                .and_then(|()| writer.flush())
                .map_err(|e| failed(&name, e))?;
        } else {
            let to = unpacked.dir.join(&name);
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).map_err(|e| failed(&name, e))?;
            }
        }
    }
    Ok(unpacked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressed_memory_unpacks_into_a_scratch_directory_that_goes_away() {
        let home = tempfile::tempdir().unwrap();
        let snapshot = home.path().join("snapshot");
        std::fs::create_dir(&snapshot).unwrap();
        let memory: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(snapshot.join("pages.img"), &memory).unwrap();
        std::fs::write(snapshot.join("checkpoint.img"), b"state").unwrap();
        std::fs::write(snapshot.join("pages_meta.img"), b"meta").unwrap();
        compress(&snapshot, Effort::Fast).unwrap();
        assert!(!snapshot.join("pages.img").exists());
        assert!(!snapshot.join("checkpoint.img").exists());
        assert!(snapshot.join("pages_meta.img").exists());
        let packed = std::fs::metadata(snapshot.join("pages.img.zst"))
            .unwrap()
            .len();
        assert!(packed < memory.len() as u64 / 10, "{packed}");

        let scratch = home.path().join("scratch");
        let unpacked = unpack(&snapshot, scratch.clone(), None).unwrap();
        assert_eq!(unpacked.path(), scratch);
        assert_eq!(std::fs::read(scratch.join("pages.img")).unwrap(), memory);
        assert_eq!(
            std::fs::read(scratch.join("checkpoint.img")).unwrap(),
            b"state"
        );
        drop(unpacked);
        assert!(!scratch.exists());
        assert!(snapshot.join("pages.img.zst").exists());
    }

    #[test]
    fn an_uncompressed_snapshot_is_read_in_place_and_damage_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let snapshot = home.path().join("snapshot");
        std::fs::create_dir(&snapshot).unwrap();
        let memory = "a fresh interpreter's memory ".repeat(1000);
        std::fs::write(snapshot.join("pages.img"), &memory).unwrap();
        let unpacked = unpack(&snapshot, home.path().join("scratch"), None).unwrap();
        assert_eq!(unpacked.path(), snapshot);
        drop(unpacked);
        assert!(snapshot.join("pages.img").exists());

        compress(&snapshot, Effort::Fast).unwrap();
        let mut packed = std::fs::read(snapshot.join("pages.img.zst")).unwrap();
        let middle = packed.len() / 2;
        packed[middle] ^= 0xff;
        std::fs::write(snapshot.join("pages.img.zst"), packed).unwrap();
        let scratch = home.path().join("scratch2");
        assert!(unpack(&snapshot, scratch.clone(), None).is_err());
        assert!(
            !scratch.exists(),
            "a failed unpack leaves no scratch directory"
        );
    }

    #[test]
    fn a_failed_compression_leaves_the_checkpoint_as_it_was() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path();
        std::fs::write(dir.join("checkpoint.img"), b"state").unwrap();
        std::fs::write(dir.join("pages.img"), b"memory").unwrap();
        // Something already holds the name the memory would be compressed to.
        std::fs::write(dir.join("pages.img.zst"), b"in the way").unwrap();
        assert!(compress(dir, Effort::Fast).is_err());
        assert_eq!(std::fs::read(dir.join("checkpoint.img")).unwrap(), b"state");
        assert_eq!(std::fs::read(dir.join("pages.img")).unwrap(), b"memory");
        assert!(!dir.join("checkpoint.img.zst").exists());
        // And a directory with a file both compressed and not is refused, not guessed at.
        assert!(unpack(dir, home.path().join("scratch"), None).is_err());
    }
}
