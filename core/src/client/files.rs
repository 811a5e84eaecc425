//! A machine's files: the same verbs on every transport, streamed both ways, plus copies to and
//! from the local disk.
//!
//! Paths are the machine's: absolute (`/tmp/a.csv`), or relative to its home (`a.csv`,
//! `~/a.csv`). They are resolved inside the machine's sandbox, as its user: on gVisor the
//! sandbox's whole file system (the image read-only); on the process backend only the home, and a
//! path that leaves it is refused with `PermissionDenied`.

use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Machine;
use crate::error::{Error, ErrorKind, Result};
use crate::types::{ByteStream, FileInfo, FileList, FileRead, WriteFileOptions};

/// Pieces read from a local file for an upload.
const UPLOAD_PIECE: usize = 1024 * 1024;

impl Machine {
    /// Writes `data` to `path`, replacing what was there. The file appears whole or not at all.
    pub async fn write_file(&self, path: &str, data: impl Into<Bytes>) -> Result<FileInfo> {
        let data: Bytes = data.into();
        let length = data.len() as u64;
        let stream = futures::stream::once(async move { Ok(data) }).boxed();
        self.write_file_stream(path, stream, Some(length), WriteFileOptions::default())
            .await
    }

    /// Writes a stream of pieces to `path` (of `length` bytes, when known: a server can then
    /// refuse a file over its limit before any of it is sent). An error in the stream abandons
    /// the write and leaves what was at `path` as it was.
    pub async fn write_file_stream(
        &self,
        path: &str,
        data: ByteStream,
        length: Option<u64>,
        options: WriteFileOptions,
    ) -> Result<FileInfo> {
        self.transport
            .write_file(&self.name, path, data, length, options)
            .await
    }

    /// Reads the whole file at `path` into memory (at most the server's file limit, 256 MiB by
    /// default); [`Machine::read_file_stream`] or [`Machine::download`] for large files.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let read = self.read_file_stream(path).await?;
        let mut data = Vec::with_capacity(usize::try_from(read.info.size).unwrap_or(0));
        let mut pieces = read.data;
        while let Some(piece) = pieces.next().await {
            data.extend_from_slice(&piece?);
        }
        Ok(data)
    }

    /// Reads the file at `path` as a stream of pieces; the stream ends in an error, never
    /// silently short, if the file cannot be read whole.
    pub async fn read_file_stream(&self, path: &str) -> Result<FileRead> {
        self.transport.read_file(&self.name, path).await
    }

    /// What `path` is: kind, size, mode, modification time (symlinks followed).
    pub async fn stat_file(&self, path: &str) -> Result<FileInfo> {
        self.transport.stat_file(&self.name, path).await
    }

    /// The entries of the directory `dir` (at most 10,000, by name).
    pub async fn list_files(&self, dir: &str) -> Result<FileList> {
        self.transport.list_files(&self.name, dir).await
    }

    /// Makes the directory `path`; with `parents`, missing ones on the way too, and an existing
    /// directory is no error.
    pub async fn make_dir(&self, path: &str, parents: bool) -> Result<FileInfo> {
        self.transport.make_dir(&self.name, path, parents).await
    }

    /// Removes a file, a symlink or an empty directory (any directory with `recursive`).
    pub async fn remove_file(&self, path: &str, recursive: bool) -> Result<FileInfo> {
        self.transport
            .remove_file(&self.name, path, recursive)
            .await
    }

    /// Copies the local file `local` to `path` in the machine, streamed from the disk.
    pub async fn upload(
        &self,
        local: &Path,
        path: &str,
        options: WriteFileOptions,
    ) -> Result<FileInfo> {
        let file = tokio::fs::File::open(local)
            .await
            .map_err(|e| local_error(local, "cannot open", &e))?;
        let length = file
            .metadata()
            .await
            .map_err(|e| local_error(local, "cannot read", &e))?
            .len();
        let shown = local.to_path_buf();
        let pieces = futures::stream::unfold(Some(file), move |file| {
            let shown = shown.clone();
            async move {
                let mut file = file?;
                let mut buffer = BytesMut::with_capacity(UPLOAD_PIECE);
                match file.read_buf(&mut buffer).await {
                    Ok(0) => None,
                    Ok(_) => Some((Ok(buffer.freeze()), Some(file))),
                    Err(e) => Some((Err(local_error(&shown, "cannot read", &e)), None)),
                }
            }
        })
        .boxed();
        self.write_file_stream(path, pieces, Some(length), options)
            .await
    }

    /// Copies `path` in the machine to the local file `local`, streamed to the disk: written
    /// under a temporary name, synced and renamed, so that `local` is the whole file or is left
    /// as it was.
    pub async fn download(&self, path: &str, local: &Path) -> Result<FileInfo> {
        let read = self.read_file_stream(path).await?;
        let temporary = temporary_beside(local);
        let written = write_local(&temporary, read.data).await;
        let renamed = match written {
            Ok(()) => tokio::fs::rename(&temporary, local)
                .await
                .map_err(|e| local_error(local, "cannot write", &e)),
            Err(e) => Err(e),
        };
        if renamed.is_err() {
            let _ = tokio::fs::remove_file(&temporary).await;
        }
        renamed.map(|()| read.info)
    }
}

async fn write_local(temporary: &Path, mut data: ByteStream) -> Result<()> {
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(temporary)
        .await
        .map_err(|e| local_error(temporary, "cannot create", &e))?;
    while let Some(piece) = data.next().await {
        file.write_all(&piece?)
            .await
            .map_err(|e| local_error(temporary, "cannot write", &e))?;
    }
    file.sync_all()
        .await
        .map_err(|e| local_error(temporary, "cannot write", &e))
}

/// A name beside `local` that nothing else uses.
fn temporary_beside(local: &Path) -> PathBuf {
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let unique = format!(
        ".{name}.evervm-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    local.with_file_name(unique)
}

fn local_error(path: &Path, what: &str, error: &std::io::Error) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("{what} {}: {error}", path.display()),
    )
}
