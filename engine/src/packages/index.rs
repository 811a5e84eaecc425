//! A package index's JSON API (PEP 691) and the engine's wheel cache: every wheel is downloaded
//! once, checked against its sha256 while it streams to disk, written durably, and kept under a
//! size bound (least recently used go first).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use url::Url;

use crate::error::{Error, Result};

/// The largest project page read from the index (numpy's is a few MB).
const MAX_PAGE_BYTES: usize = 64 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one request (a page, or a whole wheel) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
const SIMPLE_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// Where packages come from and what may be fetched.
#[derive(Debug, Clone)]
pub struct PackageSettings {
    /// The index's simple API: `EVERVM_PACKAGE_INDEX`, `https://pypi.org/simple/` by default.
    pub index_url: String,
    /// Most bytes of wheels one install may bring: `EVERVM_MAX_INSTALL_MB`, 1,024.
    pub max_install_bytes: u64,
    /// The wheel cache's size bound: `EVERVM_WHEEL_CACHE_MB`, 4,096.
    pub cache_bytes: u64,
}

impl PackageSettings {
    pub fn from_env() -> Self {
        let megabytes = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(default)
                .saturating_mul(1024 * 1024)
        };
        PackageSettings {
            index_url: std::env::var("EVERVM_PACKAGE_INDEX")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| "https://pypi.org/simple/".to_owned()),
            max_install_bytes: megabytes("EVERVM_MAX_INSTALL_MB", 1024),
            cache_bytes: megabytes("EVERVM_WHEEL_CACHE_MB", 4096),
        }
    }
}

/// A file the index lists for a project.
#[derive(Debug, Clone)]
pub(crate) struct IndexFile {
    pub filename: String,
    pub url: Url,
    pub sha256: Option<String>,
    pub requires_python: Option<String>,
    pub yanked: bool,
    pub size: Option<u64>,
}

#[derive(serde::Deserialize)]
struct ProjectPage {
    files: Vec<RawFile>,
}

#[derive(serde::Deserialize)]
struct RawFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: std::collections::BTreeMap<String, String>,
    #[serde(default, rename = "requires-python")]
    requires_python: Option<String>,
    #[serde(default)]
    yanked: serde_json::Value,
    #[serde(default)]
    size: Option<u64>,
}

/// A wheel in the cache, checked.
#[derive(Debug, Clone)]
pub(crate) struct CachedWheel {
    pub path: PathBuf,
    pub sha256: String,
    pub bytes: u64,
}

pub(crate) struct PackageIndex {
    client: reqwest::Client,
    base: Url,
    cache: PathBuf,
    cache_bytes: u64,
}

impl PackageIndex {
    pub fn new(settings: &PackageSettings, cache: PathBuf) -> Result<Self> {
        let mut text = settings.index_url.trim().to_owned();
        if !text.ends_with('/') {
            text.push('/');
        }
        let base = Url::parse(&text).map_err(|e| {
            Error::invalid(format!(
                "EVERVM_PACKAGE_INDEX={text:?} is not a URL ({e}); set it to an index's simple \
                 API, like https://pypi.org/simple/"
            ))
        })?;
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("evervm/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::internal(format!("making the package index client: {e}")))?;
        Ok(PackageIndex {
            client,
            base,
            cache,
            cache_bytes: settings.cache_bytes,
        })
    }

    /// The files the index has for `project` (a normalised name).
    pub async fn files(&self, project: &str) -> Result<Vec<IndexFile>> {
        let page_url = self
            .base
            .join(&format!("{project}/"))
            .map_err(|e| Error::invalid(format!("{project:?} makes no index URL: {e}")))?;
        let unreachable = |e: String| {
            Error::internal(format!(
                "the package index {} could not be read for {project}: {e} (is \
                 EVERVM_PACKAGE_INDEX right, and can the engine reach it?)",
                self.base
            ))
        };
        let response = self
            .client
            .get(page_url.clone())
            .header(reqwest::header::ACCEPT, SIMPLE_JSON)
            .send()
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(Error::invalid(format!(
                "the package index has no project named {project:?}"
            )));
        }
        if !response.status().is_success() {
            return Err(unreachable(format!("HTTP {}", response.status())));
        }
        let body = read_bounded(response, MAX_PAGE_BYTES)
            .await
            .map_err(unreachable)?;
        let page: ProjectPage = serde_json::from_slice(&body).map_err(|e| {
            unreachable(format!(
                "its answer is not the JSON simple API (PEP 691): {e}"
            ))
        })?;
        Ok(page
            .files
            .into_iter()
            .filter_map(|file| {
                let url = page_url.join(&file.url).ok()?;
                Some(IndexFile {
                    sha256: file
                        .hashes
                        .get("sha256")
                        .map(|h| h.to_ascii_lowercase())
                        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
                    yanked: match file.yanked {
                        serde_json::Value::Bool(b) => b,
                        serde_json::Value::String(_) => true,
                        _ => false,
                    },
                    filename: file.filename,
                    url,
                    requires_python: file.requires_python.filter(|r| !r.trim().is_empty()),
                    size: file.size,
                })
            })
            .collect())
    }

    /// The wheel in the cache, downloaded first if it is not there. Refused without a sha256
    /// from the index, when the bytes do not match it (or `pinned`), or past `max_bytes`.
    pub async fn wheel(
        &self,
        file: &IndexFile,
        pinned: &[String],
        max_bytes: u64,
    ) -> Result<CachedWheel> {
        let sha256 = file.sha256.clone().ok_or_else(|| {
            Error::invalid(format!(
                "the package index gives no sha256 for {}: evervm installs only wheels it can check",
                file.filename
            ))
        })?;
        if !pinned.is_empty() && !pinned.contains(&sha256) {
            return Err(Error::invalid(format!(
                "{} has sha256 {sha256}, not the pinned {}",
                file.filename,
                pinned.join(" or ")
            )));
        }
        let path = self.cache.join(format!("{sha256}.whl"));
        if let Ok(bytes) = check_file(&path, &sha256).await {
            let _ = touch(&path);
            return Ok(CachedWheel {
                path,
                sha256,
                bytes,
            });
        }
        if let Some(size) = file.size
            && size > max_bytes
        {
            return Err(too_large(&file.filename, max_bytes));
        }
        let bytes = self.download(file, &sha256, &path, max_bytes).await?;
        self.evict(&path);
        Ok(CachedWheel {
            path,
            sha256,
            bytes,
        })
    }

    async fn download(
        &self,
        file: &IndexFile,
        sha256: &str,
        path: &Path,
        max_bytes: u64,
    ) -> Result<u64> {
        let failed =
            |e: String| Error::internal(format!("downloading {} failed: {e}", file.filename));
        let io = |e: std::io::Error| Error::internal(format!("the wheel cache: {e}"));
        tokio::fs::create_dir_all(&self.cache).await.map_err(io)?;
        let response = self
            .client
            .get(file.url.clone())
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        if !response.status().is_success() {
            return Err(failed(format!("HTTP {}", response.status())));
        }
        let temp = self
            .cache
            .join(format!(".{sha256}.{}.part", rand::random::<u64>()));
        let written = async {
            let mut out = tokio::fs::File::create(&temp).await.map_err(io)?;
            let mut hasher = Sha256::new();
            let mut bytes: u64 = 0;
            let mut body = response.bytes_stream();
            while let Some(piece) = body.next().await {
                let piece = piece.map_err(|e| failed(e.to_string()))?;
                bytes += piece.len() as u64;
                if bytes > max_bytes {
                    return Err(too_large(&file.filename, max_bytes));
                }
                hasher.update(&piece);
                out.write_all(&piece).await.map_err(io)?;
            }
            let got = hex::encode(hasher.finalize());
            if got != sha256 {
                return Err(Error::invalid(format!(
                    "{} does not match its sha256: the index says {sha256}, the download is \
                     {got}; nothing was installed",
                    file.filename
                )));
            }
            out.sync_all().await.map_err(io)?;
            drop(out);
            tokio::fs::rename(&temp, path).await.map_err(io)?;
            Ok(bytes)
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&temp).await;
        }
        written
    }

    /// Removes the least recently used wheels until the cache is within its bound (`keep`, just
    /// added, stays).
    fn evict(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.cache) else {
            return;
        };
        let mut wheels: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(std::result::Result::ok)
            .filter_map(|entry| {
                let metadata = entry.metadata().ok()?;
                let path = entry.path();
                (path.extension()? == "whl" && metadata.is_file()).then(|| {
                    (
                        metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        metadata.len(),
                        path,
                    )
                })
            })
            .collect();
        let mut total: u64 = wheels.iter().map(|(_, size, _)| size).sum();
        wheels.sort();
        for (_, size, path) in wheels {
            if total <= self.cache_bytes {
                break;
            }
            if path != keep && std::fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(size);
            }
        }
    }
}

fn too_large(filename: &str, max_bytes: u64) -> Error {
    Error::too_large(format!(
        "{filename} is larger than what one install may bring ({} MB, EVERVM_MAX_INSTALL_MB)",
        max_bytes / (1024 * 1024)
    ))
}

/// The file's size if its contents have the sha256 `expected`.
async fn check_file(path: &Path, expected: &str) -> std::io::Result<u64> {
    let path = path.to_owned();
    let expected = expected.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(&path)?;
        let mut hasher = Sha256::new();
        let bytes = std::io::copy(&mut file, &mut hasher)?;
        if hex::encode(hasher.finalize()) == expected {
            Ok(bytes)
        } else {
            Err(std::io::Error::other(
                "the cached wheel does not match its sha256",
            ))
        }
    })
    .await
    .map_err(std::io::Error::other)?
}

fn touch(path: &Path) -> std::io::Result<()> {
    std::fs::File::options()
        .append(true)
        .open(path)?
        .set_modified(SystemTime::now())
}

async fn read_bounded(
    response: reqwest::Response,
    max: usize,
) -> std::result::Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| e.to_string())?;
        if body.len() + piece.len() > max {
            return Err(format!("its answer is larger than {max} bytes"));
        }
        body.extend_from_slice(&piece);
    }
    Ok(body)
}
