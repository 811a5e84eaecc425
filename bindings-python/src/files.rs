//! `machine.files`: a machine's files, blocking (`Files`) and for asyncio (`AsyncFiles`). Each
//! method converts its arguments, calls the Rust client's file verb and converts the answer.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyString};

use crate::client::Connection;
use crate::error::{invalid_input, to_py};
use crate::runtime::{awaitable, wait};

/// A file or directory in a machine.
#[pyclass(module = "evervm", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct FileInfo {
    /// Its absolute path in the machine.
    pub path: String,
    /// The last component of the path.
    pub name: String,
    /// `"file"`, `"directory"`, `"symlink"` or `"other"`.
    pub r#type: String,
    pub size: u64,
    /// Permission bits (`0o644`).
    pub mode: u32,
    /// ISO 8601, UTC.
    pub modified_at: Option<String>,
    /// Where a symlink leads, resolved: for `stat` of a path that is one, and for a listing's
    /// entries of type `"symlink"`; else `None`.
    pub symlink_target: Option<String>,
}

#[pymethods]
impl FileInfo {
    fn __repr__(&self) -> String {
        format!(
            "FileInfo(path={:?}, type={:?}, size={}, mode=0o{:o})",
            self.path, self.r#type, self.size, self.mode
        )
    }
}

impl From<evervm::FileInfo> for FileInfo {
    fn from(f: evervm::FileInfo) -> Self {
        Self {
            path: f.path,
            name: f.name,
            r#type: f.kind.as_str().to_owned(),
            size: f.size,
            mode: f.mode,
            modified_at: f.modified_at.map(|t| t.to_rfc3339()),
            symlink_target: f.symlink_target,
        }
    }
}

/// A directory's entries, by name; iterating gives the entries.
#[pyclass(module = "evervm", frozen, get_all)]
pub(crate) struct FileList {
    /// The directory itself.
    pub directory: FileInfo,
    pub entries: Vec<FileInfo>,
    /// True when the directory holds more entries than a listing returns (10,000).
    pub truncated: bool,
}

#[pymethods]
impl FileList {
    fn __len__(&self) -> usize {
        self.entries.len()
    }

    fn __iter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let entries = pyo3::types::PyList::new(py, self.entries.clone())?;
        Ok(entries.call_method0("__iter__")?.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "FileList(directory={:?}, entries={}, truncated={})",
            self.directory.path,
            self.entries.len(),
            if self.truncated { "True" } else { "False" }
        )
    }
}

impl From<evervm::FileList> for FileList {
    fn from(list: evervm::FileList) -> Self {
        Self {
            directory: list.directory.into(),
            entries: list.entries.into_iter().map(Into::into).collect(),
            truncated: list.truncated,
        }
    }
}

/// `bytes`, `bytearray` or `str` (written as UTF-8).
fn data_of(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        Ok(bytes.as_bytes().to_vec())
    } else if let Ok(array) = data.cast::<PyByteArray>() {
        Ok(array.to_vec())
    } else if let Ok(text) = data.cast::<PyString>() {
        Ok(text.to_str()?.as_bytes().to_vec())
    } else {
        Err(PyTypeError::new_err(format!(
            "file data must be bytes, bytearray or str, not {}",
            data.get_type().name()?
        )))
    }
}

fn write_options(mode: Option<u32>, parents: bool) -> PyResult<evervm::WriteFileOptions> {
    if mode.is_some_and(|m| m > 0o7777) {
        return Err(invalid_input(
            "mode must be permission bits, at most 0o7777",
        ));
    }
    Ok(evervm::WriteFileOptions {
        mode,
        make_parents: parents,
    })
}

async fn write(
    machine: evervm::Machine,
    path: String,
    data: Vec<u8>,
    options: evervm::WriteFileOptions,
) -> PyResult<FileInfo> {
    use futures::StreamExt;
    let length = data.len() as u64;
    let stream = futures::stream::once(async move { Ok(bytes::Bytes::from(data)) }).boxed();
    machine
        .write_file_stream(&path, stream, Some(length), options)
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn read(machine: evervm::Machine, path: String) -> PyResult<Vec<u8>> {
    machine.read_file(&path).await.map_err(to_py)
}

async fn stat(machine: evervm::Machine, path: String) -> PyResult<FileInfo> {
    machine
        .stat_file(&path)
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn exists(machine: evervm::Machine, path: String) -> PyResult<bool> {
    match machine.stat_file(&path).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == evervm::ErrorKind::NotFound => {
            // The machine itself must exist: only a missing file is `False`.
            machine.info().await.map_err(to_py)?;
            Ok(false)
        }
        Err(e) => Err(to_py(e)),
    }
}

async fn list(machine: evervm::Machine, path: String) -> PyResult<FileList> {
    machine
        .list_files(&path)
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn mkdir(machine: evervm::Machine, path: String, parents: bool) -> PyResult<FileInfo> {
    machine
        .make_dir(&path, parents)
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn remove(machine: evervm::Machine, path: String, recursive: bool) -> PyResult<FileInfo> {
    machine
        .remove_file(&path, recursive)
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn upload(
    machine: evervm::Machine,
    local: PathBuf,
    path: String,
    options: evervm::WriteFileOptions,
) -> PyResult<FileInfo> {
    machine
        .upload(&local, &path, options)
        .await
        .map(Into::into)
        .map_err(to_py)
}

async fn download(machine: evervm::Machine, path: String, local: PathBuf) -> PyResult<FileInfo> {
    machine
        .download(&path, &local)
        .await
        .map(Into::into)
        .map_err(to_py)
}

/// A machine's files (`machine.files`). Paths are the machine's: absolute (`/tmp/a.csv`) or
/// relative to its home (`a.csv`, `~/a.csv`); a path that leaves the home and `/tmp` is refused
/// with `PermissionDeniedError`. Each operation runs in its turn among the machine's
/// instructions.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct Files {
    pub(crate) conn: Arc<Connection>,
    pub(crate) name: String,
}

impl Files {
    fn machine(&self) -> PyResult<evervm::Machine> {
        Ok(self.conn.client()?.machine(&self.name))
    }
}

#[pymethods]
impl Files {
    /// Writes `data` (bytes, or str as UTF-8) to `path`, replacing what was there; the file
    /// appears whole or not at all.
    #[pyo3(signature = (path, data, *, mode=None, parents=false))]
    fn write(
        &self,
        py: Python<'_>,
        path: String,
        data: &Bound<'_, PyAny>,
        mode: Option<u32>,
        parents: bool,
    ) -> PyResult<FileInfo> {
        let (data, options) = (data_of(data)?, write_options(mode, parents)?);
        wait(py, write(self.machine()?, path, data, options), None)
    }

    /// The file's bytes.
    fn read(&self, py: Python<'_>, path: String) -> PyResult<Py<PyBytes>> {
        let data = wait(py, read(self.machine()?, path), None)?;
        Ok(PyBytes::new(py, &data).unbind())
    }

    /// The file's text.
    #[pyo3(signature = (path, encoding="utf-8"))]
    fn read_text(&self, py: Python<'_>, path: String, encoding: &str) -> PyResult<Py<PyAny>> {
        let data = self.read(py, path)?;
        Ok(data.bind(py).call_method1("decode", (encoding,))?.unbind())
    }

    /// What `path` is: type, size, mode, modification time (symlinks followed).
    fn stat(&self, py: Python<'_>, path: String) -> PyResult<FileInfo> {
        wait(py, stat(self.machine()?, path), None)
    }

    /// Whether something is at `path`.
    fn exists(&self, py: Python<'_>, path: String) -> PyResult<bool> {
        wait(py, exists(self.machine()?, path), None)
    }

    /// The entries of a directory (the home by default).
    #[pyo3(signature = (path="~"))]
    fn list(&self, py: Python<'_>, path: &str) -> PyResult<FileList> {
        wait(py, list(self.machine()?, path.to_owned()), None)
    }

    /// Makes a directory; with `parents`, missing ones on the way too (an existing one is then
    /// no error).
    #[pyo3(signature = (path, *, parents=false))]
    fn mkdir(&self, py: Python<'_>, path: String, parents: bool) -> PyResult<FileInfo> {
        wait(py, mkdir(self.machine()?, path, parents), None)
    }

    /// Removes a file, a symlink or an empty directory (any directory with `recursive`).
    #[pyo3(signature = (path, *, recursive=false))]
    fn remove(&self, py: Python<'_>, path: String, recursive: bool) -> PyResult<FileInfo> {
        wait(py, remove(self.machine()?, path, recursive), None)
    }

    /// Copies a local file into the machine, streamed.
    #[pyo3(signature = (local_path, path, *, mode=None, parents=false))]
    fn upload(
        &self,
        py: Python<'_>,
        local_path: PathBuf,
        path: String,
        mode: Option<u32>,
        parents: bool,
    ) -> PyResult<FileInfo> {
        let options = write_options(mode, parents)?;
        wait(py, upload(self.machine()?, local_path, path, options), None)
    }

    /// Copies a file out of the machine to a local path, streamed (written whole or not at all).
    fn download(&self, py: Python<'_>, path: String, local_path: PathBuf) -> PyResult<FileInfo> {
        wait(py, download(self.machine()?, path, local_path), None)
    }

    fn __repr__(&self) -> String {
        format!("Files({:?})", self.name)
    }
}

/// `Files` for asyncio: the same methods, awaited.
#[pyclass(module = "evervm", frozen)]
pub(crate) struct AsyncFiles {
    pub(crate) conn: Arc<Connection>,
    pub(crate) name: String,
}

impl AsyncFiles {
    fn machine(&self) -> PyResult<evervm::Machine> {
        Ok(self.conn.client()?.machine(&self.name))
    }
}

#[pymethods]
impl AsyncFiles {
    #[pyo3(signature = (path, data, *, mode=None, parents=false))]
    fn write<'py>(
        &self,
        py: Python<'py>,
        path: String,
        data: &Bound<'py, PyAny>,
        mode: Option<u32>,
        parents: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (data, options) = (data_of(data)?, write_options(mode, parents)?);
        awaitable(py, write(self.machine()?, path, data, options))
    }

    fn read<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.machine()?;
        awaitable(py, async move {
            let data = read(machine, path).await?;
            crate::runtime::with_python(|py| Ok(PyBytes::new(py, &data).unbind()))
        })
    }

    #[pyo3(signature = (path, encoding="utf-8"))]
    fn read_text<'py>(
        &self,
        py: Python<'py>,
        path: String,
        encoding: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let machine = self.machine()?;
        let encoding = encoding.to_owned();
        awaitable(py, async move {
            let data = read(machine, path).await?;
            crate::runtime::with_python(|py| {
                Ok(PyBytes::new(py, &data)
                    .call_method1("decode", (encoding,))?
                    .unbind())
            })
        })
    }

    fn stat<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, stat(self.machine()?, path))
    }

    fn exists<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, exists(self.machine()?, path))
    }

    #[pyo3(signature = (path="~"))]
    fn list<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, list(self.machine()?, path.to_owned()))
    }

    #[pyo3(signature = (path, *, parents=false))]
    fn mkdir<'py>(
        &self,
        py: Python<'py>,
        path: String,
        parents: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, mkdir(self.machine()?, path, parents))
    }

    #[pyo3(signature = (path, *, recursive=false))]
    fn remove<'py>(
        &self,
        py: Python<'py>,
        path: String,
        recursive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, remove(self.machine()?, path, recursive))
    }

    #[pyo3(signature = (local_path, path, *, mode=None, parents=false))]
    fn upload<'py>(
        &self,
        py: Python<'py>,
        local_path: PathBuf,
        path: String,
        mode: Option<u32>,
        parents: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = write_options(mode, parents)?;
        awaitable(py, upload(self.machine()?, local_path, path, options))
    }

    fn download<'py>(
        &self,
        py: Python<'py>,
        path: String,
        local_path: PathBuf,
    ) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, download(self.machine()?, path, local_path))
    }

    fn __repr__(&self) -> String {
        format!("AsyncFiles({:?})", self.name)
    }
}
