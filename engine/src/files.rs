//! Files in a machine's filesystem, as the engine describes them, and the limits that bound them.
//!
//! Paths are never resolved on the host: the agent inside the sandbox resolves each one, one
//! component at a time, under the backend's roots (the sandbox's `/` on gVisor, the machine's home
//! on the process backend), and refuses what leaves them. A relative path, or one starting with `~/`, is relative to the
//! machine's home.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The largest file written or read by default (`EVERVM_MAX_FILE_MB`).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;
/// The most entries a listing returns; a larger directory's listing says it was cut.
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// The longest path accepted or reported.
pub const MAX_PATH_BYTES: usize = 4096;

/// File data flowing in or out of a machine, in pieces.
pub type ByteStream = BoxStream<'static, Result<Bytes>>;

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    /// A device, a FIFO or a socket.
    Other,
}

impl FileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Directory => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "file" => Some(FileKind::File),
            "directory" => Some(FileKind::Directory),
            "symlink" => Some(FileKind::Symlink),
            "other" => Some(FileKind::Other),
            _ => None,
        }
    }
}

/// One file or directory in a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// Its absolute path in the machine, symlinks on the way resolved.
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`0o644`).
    pub mode: u32,
    pub modified: Option<DateTime<Utc>>,
    /// Where the symlink this is leads, resolved to the end: for a stat, when the path asked for
    /// is a symlink (`path` and the rest then describe its target); for a listing's entry of
    /// kind [`FileKind::Symlink`] (which describes the link itself).
    pub symlink_target: Option<String>,
    /// Its metadata: its `user.e2b.*` extended attributes (E2B's file metadata), by name without
    /// the prefix.
    pub metadata: std::collections::BTreeMap<String, String>,
}

impl FileInfo {
    /// The last component of its path.
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }
}

/// A directory's entries, by name; symlinks are listed as themselves, not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileList {
    pub directory: FileInfo,
    pub entries: Vec<FileInfo>,
    /// True when the directory holds more than [`MAX_LIST_ENTRIES`] and only the first were
    /// returned.
    pub truncated: bool,
}

/// How a file is written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteFileOptions {
    /// Permission bits; those of the file it replaces, or `0o644`, when `None`.
    pub mode: Option<u32>,
    /// Make missing parent directories (inside the roots).
    pub make_parents: bool,
    /// Metadata the file gets (see [`FileInfo::metadata`]; checked by [`validate_metadata`]);
    /// the metadata of the file it replaces goes with it.
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// The most metadata entries a file carries, the longest name and the longest value.
pub const MAX_METADATA_ENTRIES: usize = 64;
pub const MAX_METADATA_NAME_BYTES: usize = 200;
pub const MAX_METADATA_VALUE_BYTES: usize = 4096;

/// Checks file metadata: at most [`MAX_METADATA_ENTRIES`]; names of HTTP token characters
/// (letters, digits, ``!#$%&'*+-.^_`|~``), values of printable ASCII, within the lengths above.
pub fn validate_metadata(metadata: &std::collections::BTreeMap<String, String>) -> Result<()> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(Error::invalid(format!(
            "a file carries at most {MAX_METADATA_ENTRIES} metadata entries"
        )));
    }
    for (name, value) in metadata {
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || name.len() > MAX_METADATA_NAME_BYTES || !name.bytes().all(token) {
            return Err(Error::invalid(format!(
                "metadata name {name:?}: 1 to {MAX_METADATA_NAME_BYTES} letters, digits or \
                 !#$%&'*+-.^_`|~"
            )));
        }
        if value.len() > MAX_METADATA_VALUE_BYTES
            || !value.bytes().all(|b| (0x20..0x7f).contains(&b))
        {
            return Err(Error::invalid(format!(
                "metadata {name:?}: a value is at most {MAX_METADATA_VALUE_BYTES} bytes of \
                 printable ASCII"
            )));
        }
    }
    Ok(())
}

/// A file being read: what it is, then its bytes. The stream ends with an error (never short
/// and silent) when the file could not be read whole.
pub struct FileRead {
    pub info: FileInfo,
    pub data: ByteStream,
}

impl std::fmt::Debug for FileRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRead")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Checks a path given by a caller: not empty, at most [`MAX_PATH_BYTES`], no NUL.
pub fn validate_path(path: &str) -> Result<()> {
    if path.is_empty() {
        return Err(Error::invalid("the path is empty"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(Error::invalid(format!(
            "the path is {} bytes (at most {MAX_PATH_BYTES})",
            path.len()
        )));
    }
    if path.contains('\0') {
        return Err(Error::invalid("the path contains a NUL character"));
    }
    Ok(())
}

/// Checks permission bits given by a caller.
pub fn validate_mode(mode: u32) -> Result<()> {
    if mode > 0o7777 {
        return Err(Error::invalid(format!(
            "mode {mode:o} is not a permission mode (at most 7777, octal)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_modes_are_checked() {
        assert!(validate_path("").is_err());
        assert!(validate_path("a\0b").is_err());
        assert!(validate_path(&"a".repeat(MAX_PATH_BYTES + 1)).is_err());
        assert!(validate_path("~/data.csv").is_ok());
        assert!(validate_mode(0o644).is_ok());
        assert!(validate_mode(0o10000).is_err());
        for kind in [
            FileKind::File,
            FileKind::Directory,
            FileKind::Symlink,
            FileKind::Other,
        ] {
            assert_eq!(FileKind::parse(kind.as_str()), Some(kind));
        }
        let info = FileInfo {
            path: "/home/user/a.csv".into(),
            kind: FileKind::File,
            size: 1,
            mode: 0o644,
            modified: None,
            symlink_target: None,
            metadata: std::collections::BTreeMap::default(),
        };
        assert_eq!(info.name(), "a.csv");
    }
}
