//! Files in a machine: write, read, list, stat, make a directory, remove. Each runs in the
//! machine's turn among its instructions (see `machine/files.rs`), under the same rate limit as
//! instructions; paths are resolved inside the sandbox.

use super::Engine;
use crate::error::{Error, Result};
use crate::files::{
    ByteStream, FileInfo, FileList, FileRead, WriteFileOptions, validate_mode, validate_path,
};
use crate::machine::{FileOperation, FileOutcome};
use crate::packages::InstallReport;
use crate::types::Account;

impl Engine {
    async fn file_operation(
        &self,
        account: &Account,
        name: &str,
        path: &str,
        operation: FileOperation,
    ) -> Result<FileOutcome> {
        validate_path(path)?;
        let handle = self.handle(account, name).await?;
        self.inner.take_instruction_token(account.id)?;
        handle.file_operation(&self.inner, operation).await
    }

    /// What `path` is (symlinks followed).
    pub async fn stat_file(&self, account: &Account, name: &str, path: &str) -> Result<FileInfo> {
        let operation = FileOperation::Stat {
            path: path.to_owned(),
        };
        match self.file_operation(account, name, path, operation).await? {
            FileOutcome::Info(info) => Ok(info),
            _ => Err(unexpected()),
        }
    }

    /// The entries of the directory `path`, by name (at most [`crate::files::MAX_LIST_ENTRIES`]).
    pub async fn list_files(&self, account: &Account, name: &str, path: &str) -> Result<FileList> {
        let operation = FileOperation::List {
            path: path.to_owned(),
        };
        match self.file_operation(account, name, path, operation).await? {
            FileOutcome::List(list) => Ok(list),
            _ => Err(unexpected()),
        }
    }

    /// Makes the directory `path`; with `parents`, also missing directories on the way, and an
    /// existing directory is no error (`mkdir -p`).
    pub async fn make_dir(
        &self,
        account: &Account,
        name: &str,
        path: &str,
        parents: bool,
    ) -> Result<FileInfo> {
        let operation = FileOperation::MakeDir {
            path: path.to_owned(),
            parents,
        };
        match self.file_operation(account, name, path, operation).await? {
            FileOutcome::Info(info) => Ok(info),
            _ => Err(unexpected()),
        }
    }

    /// Removes a file, a symlink (not what it points at) or an empty directory; with
    /// `recursive`, a directory and everything in it. Returns what was removed.
    pub async fn remove_file(
        &self,
        account: &Account,
        name: &str,
        path: &str,
        recursive: bool,
    ) -> Result<FileInfo> {
        let operation = FileOperation::Remove {
            path: path.to_owned(),
            recursive,
        };
        match self.file_operation(account, name, path, operation).await? {
            FileOutcome::Info(info) => Ok(info),
            _ => Err(unexpected()),
        }
    }

    /// Reads a regular file: its info at once, then its bytes as a stream. Files larger than
    /// [`crate::Limits::max_file_bytes`] are refused (`TooLarge`).
    pub async fn read_file(&self, account: &Account, name: &str, path: &str) -> Result<FileRead> {
        let operation = FileOperation::Read {
            path: path.to_owned(),
        };
        match self.file_operation(account, name, path, operation).await? {
            FileOutcome::Read(read) => Ok(read),
            _ => Err(unexpected()),
        }
    }

    /// Writes `data` to `path`, replacing what was there; the file appears whole once the data
    /// has ended, or not at all (data over [`crate::Limits::max_file_bytes`] is `TooLarge`, an
    /// error in the data abandons the write).
    pub async fn write_file(
        &self,
        account: &Account,
        name: &str,
        path: &str,
        data: ByteStream,
        options: WriteFileOptions,
    ) -> Result<FileInfo> {
        if let Some(mode) = options.mode {
            validate_mode(mode)?;
        }
        crate::files::validate_metadata(&options.metadata)?;
        let operation = FileOperation::Write {
            path: path.to_owned(),
            options,
            data,
        };
        match self.file_operation(account, name, path, operation).await? {
            FileOutcome::Info(info) => Ok(info),
            _ => Err(unexpected()),
        }
    }
}

impl Engine {
    /// Installs packages from the package index into the machine: `requirements` like
    /// `requests==2.32.3` (PEP 508, optionally `--hash=sha256:HEX`), their dependencies with
    /// them; binary wheels only, hash-checked, fetched by the engine (see `crate::packages`).
    /// Runs in the machine's turn, like a file operation.
    pub async fn install_packages(
        &self,
        account: &Account,
        name: &str,
        requirements: &[String],
    ) -> Result<InstallReport> {
        // Refused before the machine's turn; checked again there (`%pip install` comes that way).
        crate::packages::resolve::parse_requested(requirements)?;
        let handle = self.handle(account, name).await?;
        self.inner.take_instruction_token(account.id)?;
        let operation = FileOperation::Install {
            requirements: requirements.to_vec(),
        };
        match handle.file_operation(&self.inner, operation).await? {
            FileOutcome::Installed(report) => Ok(report),
            _ => Err(unexpected()),
        }
    }
}

pub(super) fn unexpected() -> Error {
    Error::internal("a file operation answered with the wrong kind of answer")
}
