//! Durable file writes (a temporary name, fsync, rename, fsync of the directory), readable by
//! their owner only; and how much room a file system has left.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `data` to `path` so that after a crash the file has either its old or its new
/// contents, never a part. The file is readable and writable by its owner only.
pub fn write_durably(path: &Path, data: &[u8]) -> Result<()> {
    let dir = directory_of(path)?;
    let name = path
        .file_name()
        .ok_or_else(|| Error::internal(format!("{} has no file name", path.display())))?;
    let temporary = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
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

/// The directory a file is in: a bare file name (`profile.toml.lock`) is in the working
/// directory.
fn directory_of(path: &Path) -> Result<&Path> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::internal(format!("{} has no directory", path.display())))?;
    Ok(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    })
}

/// Makes a directory's entries (a rename into it) durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::internal(format!("cannot sync {}: {e}", dir.display())))
}

/// Bytes an unprivileged writer can still put on the file system that holds `path`.
pub fn free_bytes(path: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::internal(format!("{} contains a NUL byte", path.display())))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a valid NUL-terminated string and `stats` points to writable memory
    // the size of a `statvfs`, which the call fills when it returns 0.
    let status = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if status != 0 {
        return Err(Error::internal(format!(
            "cannot read the free space of {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: statvfs returned 0, so it initialised the whole struct.
    let stats = unsafe { stats.assume_init() };
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    let (available, fragment) = (u64::from(stats.f_bavail), u64::from(stats.f_frsize));
    Ok(available.saturating_mul(fragment))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_file_name_is_in_the_working_directory() {
        assert_eq!(directory_of(Path::new("x.lock")).unwrap(), Path::new("."));
        assert_eq!(directory_of(Path::new("/a/x")).unwrap(), Path::new("/a"));
        assert!(directory_of(Path::new("/")).is_err());
    }
}
