//! Durable file writes: a temporary name, fsync, rename, fsync of the directory.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `data` to `path` so that after a crash the file has either its old or its new
/// contents, never a part.
pub fn write_durably(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::internal(format!("{} has no directory", path.display())))?;
    let name = path
        .file_name()
        .ok_or_else(|| Error::internal(format!("{} has no file name", path.display())))?;
    let temporary = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(data)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&temporary);
        return Err(Error::internal(format!(
            "cannot write {}: {e}",
            path.display()
        )));
    }
    fsync_dir(dir)
}

/// Makes a directory's entries (a rename into it) durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::internal(format!("cannot sync {}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.json");
        write_durably(&path, b"one").unwrap();
        write_durably(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
