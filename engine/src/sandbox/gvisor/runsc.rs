//! The `runsc` binary: finding one that runs here (and on which platform), the flags every
//! command gets, and the binaries kept because snapshots they wrote need them.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// An installed `runsc`, and how it runs here.
#[derive(Debug, Clone)]
pub struct Runsc {
    pub path: PathBuf,
    /// `runsc --version`'s first line and the binary's SHA-256 (a build without a version
    /// string is still told apart).
    pub version: String,
    /// `kvm`, `systrap` or `ptrace`: the first that ran a container on this host.
    pub platform: String,
    /// The binary's SHA-256 (16 hex digits), computed once.
    pub digest: String,
    /// `runsc checkpoint --leave-running` saves a sandbox and leaves it running (a current
    /// runsc; Debian's 2022 one destroys the sandbox instead), found by trying it once.
    pub leave_running: bool,
    /// `runsc restore --detach` restores a snapshot into a sandbox made ahead of time by
    /// `runsc create` (a current runsc; Debian's answers "container already exists").
    pub restore_into_created: bool,
    /// A sandbox with a network (its own netstack on a namespace's veth) runs: a current runsc
    /// does; Debian's 2022 one refuses on current kernels ("cannot run with network enabled in
    /// root network namespace"). False also where the namespaces cannot be made (no root, no
    /// `ip` or `nft`).
    pub network: bool,
    /// `runsc checkpoint --compression` chooses between compressed and uncompressed images (a
    /// current runsc writes them uncompressed by default; Debian's 2022 one always compresses).
    pub compression_flag: bool,
}

impl Runsc {
    /// What snapshots record as their runtime: only the same runsc restores them.
    pub fn describe(&self) -> String {
        format!("gvisor ({}, platform {})", self.version, self.platform)
    }
}

/// What to install when no usable runsc is found.
pub(super) const INSTALL_HINT: &str = "build the pinned current runsc with `scripts/runsc.sh` (it \
     goes to ~/.cache/evervm/runsc/), install Debian's (`apt-get install runsc`), or set \
     EVERVM_RUNSC to a runsc's path";

/// The runsc binaries `scripts/runsc.sh` built, newest version first:
/// `~/.cache/evervm/runsc/<version>/runsc`.
fn built_here() -> Vec<PathBuf> {
    let dir = crate::guest::image::default_cache_dir().join("runsc");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    // Pseudo-versions carry their date: the greatest name is the newest.
    versions.sort();
    versions.reverse();
    versions.into_iter().map(|v| v.join("runsc")).collect()
}

/// The runsc binaries to try, best first: the one configured (and only it), else the pinned
/// current build from `scripts/runsc.sh`, then those on `PATH` and in the usual places (Debian's
/// package, say).
pub(super) fn candidates(configured: Option<&Path>) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(path) = configured {
        paths.push(path.to_owned());
        return paths;
    }
    paths.extend(built_here());
    if let Some(path) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&path).map(|d| d.join("runsc")));
    }
    paths.extend(
        ["/usr/local/bin/runsc", "/usr/bin/runsc", "/usr/sbin/runsc"]
            .iter()
            .map(PathBuf::from),
    );
    let mut unique = Vec::new();
    for path in paths {
        if path.is_file() && !unique.contains(&path) {
            unique.push(path);
        }
    }
    unique
}

pub(crate) fn binary_digest(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))?;
    Ok(hex::encode(Sha256::digest(bytes))[..16].to_owned())
}

/// What a kept runsc binary was (beside it in `<home>/runsc-bin/<digest>/runsc.json`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct KeptRunsc {
    version: String,
    platform: String,
    #[serde(default)]
    leave_running: bool,
}

/// Keeps the runsc binary that writes a snapshot under `<home>/runsc-bin/<digest>/` (a hard link
/// where the file system allows), so that an upgrade of the system's runsc does not strand the
/// snapshots: only the runsc that wrote an image restores it.
pub(super) fn keep_binary(kept_dir: &Path, runsc: &Runsc) -> Result<()> {
    let dir = kept_dir.join(&runsc.digest);
    if dir.join("runsc.json").is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    let target = dir.join("runsc");
    if !target.is_file() && std::fs::hard_link(&runsc.path, &target).is_err() {
        let partial = dir.join("runsc.partial");
        std::fs::copy(&runsc.path, &partial).map_err(|e| {
            Error::internal(format!(
                "cannot keep a copy of {}: {e}",
                runsc.path.display()
            ))
        })?;
        std::fs::File::open(&partial)?.sync_all()?;
        std::fs::rename(&partial, &target)?;
    }
    let description = serde_json::to_vec(&KeptRunsc {
        version: runsc.version.clone(),
        platform: runsc.platform.clone(),
        leave_running: runsc.leave_running,
    })
    .map_err(|e| Error::internal(format!("cannot describe a kept runsc: {e}")))?;
    crate::fsutil::write_durably(&dir.join("runsc.json"), &description)
}

/// The runsc binaries kept in `kept_dir` by earlier engines.
pub(super) fn kept_binaries(kept_dir: &Path) -> Vec<Runsc> {
    let Ok(entries) = std::fs::read_dir(kept_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let text = std::fs::read(entry.path().join("runsc.json")).ok()?;
            let kept: KeptRunsc = serde_json::from_slice(&text).ok()?;
            let path = entry.path().join("runsc");
            path.is_file().then(|| Runsc {
                digest: entry.file_name().to_string_lossy().into_owned(),
                path,
                version: kept.version,
                platform: kept.platform,
                leave_running: kept.leave_running,
                restore_into_created: false,
                network: false,
                compression_flag: false,
            })
        })
        .collect()
}

/// Global flags every runsc command gets.
pub(super) fn global_args(runsc: &Runsc, state_dir: &Path) -> Vec<String> {
    vec![
        format!("--root={}", state_dir.display()),
        format!("--platform={}", runsc.platform),
        "--network=none".to_owned(),
        "--overlay2=root:memory".to_owned(),
    ]
}
