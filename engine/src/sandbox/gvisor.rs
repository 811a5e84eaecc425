//! The gVisor backend: every sandbox is a gVisor container (`runsc`), the OCI runtime made for
//! untrusted code, whose user-space kernel stands between the machine and the host kernel.
//!
//! Per sandbox: an OCI bundle whose root is the shared image (never written on the host: the
//! sandbox's own writes, `/tmp` and the home directory included, go to an in-memory overlay, so
//! they are part of a checkpoint), no network but `lo`, the machine's user (uid 1000), an
//! `RLIMIT_AS` from `memory_mb` (so code sees `MemoryError`) and a cgroup memory limit above it as
//! the backstop for memory the first limit does not count. The agent talks over the container's
//! stdin and stdout, which `runsc` connects to ours.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::process::{Child, Command};

use super::{Capabilities, Sandbox, SandboxBackend, SandboxSpec};
use crate::error::{Error, Result};
use crate::guest::connection::{ChannelReader, ChannelWriter};
use crate::guest::image::{
    AGENT_PATH, Image, ImageBuilder, MACHINE_HOME, MACHINE_UID, MPLCONFIGDIR, Profile, Progress,
};

/// The part of the cgroup limit above `memory_mb`: the sentry, its page tables and buffers.
const BACKSTOP_EXTRA_MB: u64 = 192;

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
}

impl Runsc {
    /// What snapshots record as their runtime: only the same runsc restores them.
    pub fn describe(&self) -> String {
        format!("gvisor ({}, platform {})", self.version, self.platform)
    }
}

/// What to install when no usable runsc is found.
const INSTALL_HINT: &str = "install gVisor's runsc (`apt-get install runsc` on Debian, or `go \
     install gvisor.dev/gvisor/runsc@latest`), or set EVERVM_RUNSC to its path";

fn candidates(configured: Option<&Path>) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(path) = configured {
        paths.push(path.to_owned());
        return paths;
    }
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

fn binary_digest(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))?;
    Ok(hex::encode(Sha256::digest(bytes))[..16].to_owned())
}

/// Settings of the gVisor backend.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    /// The engine's home: bundles go to `<home>/sandboxes`, runsc's state to `<home>/runsc`.
    pub home: PathBuf,
    /// Where images are built and kept.
    pub images_dir: PathBuf,
    /// The runsc to use (`EVERVM_RUNSC`); else the first that works of those on `PATH` and in
    /// the usual places.
    pub runsc: Option<PathBuf>,
    /// The gVisor platform (`EVERVM_RUNSC_PLATFORM`: `ptrace`, `systrap`, `kvm`); else the first
    /// that runs a sandbox here.
    pub platform: Option<String>,
}

impl GvisorConfig {
    /// Settings for `home`, with `runsc` and `platform` from the environment.
    pub fn new(home: PathBuf, images_dir: PathBuf) -> Self {
        let var = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty());
        Self {
            home,
            images_dir,
            runsc: var("EVERVM_RUNSC").map(PathBuf::from),
            platform: var("EVERVM_RUNSC_PLATFORM").map(|p| p.to_string_lossy().into_owned()),
        }
    }
}

/// What a kept runsc binary was (beside it in `<home>/runsc-bin/<digest>/runsc.json`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeptRunsc {
    version: String,
    platform: String,
}

/// Keeps the runsc binary that writes a snapshot under `<home>/runsc-bin/<digest>/` (a hard link
/// where the file system allows), so that an upgrade of the system's runsc does not strand the
/// snapshots: only the runsc that wrote an image restores it.
fn keep_binary(kept_dir: &Path, runsc: &Runsc) -> Result<()> {
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
    })
    .map_err(|e| Error::internal(format!("cannot describe a kept runsc: {e}")))?;
    crate::fsutil::write_durably(&dir.join("runsc.json"), &description)
}

/// The runsc binaries kept in `kept_dir` by earlier engines.
fn kept_binaries(kept_dir: &Path) -> Vec<Runsc> {
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
            })
        })
        .collect()
}

/// The gVisor backend.
pub struct GvisorBackend {
    runsc: Runsc,
    /// Runsc binaries earlier engines kept because their snapshots need them.
    kept: Vec<Runsc>,
    kept_dir: PathBuf,
    state_dir: PathBuf,
    bundles_dir: PathBuf,
    images: std::sync::Mutex<std::collections::HashMap<Profile, Image>>,
    builder: ImageBuilder,
    progress: Arc<dyn Progress>,
}

impl std::fmt::Debug for GvisorBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GvisorBackend")
            .field("runsc", &self.runsc)
            .finish_non_exhaustive()
    }
}

/// The runsc and platform that worked last time, so that a restart probes one platform, not
/// every one (a `kvm` probe on a host without working virtualisation waits for its timeout).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ProbeCache {
    path: PathBuf,
    digest: String,
    platform: String,
}

/// Global flags every runsc command gets.
fn global_args(runsc: &Runsc, state_dir: &Path) -> Vec<String> {
    vec![
        format!("--root={}", state_dir.display()),
        format!("--platform={}", runsc.platform),
        "--network=none".to_owned(),
        "--overlay2=root:memory".to_owned(),
    ]
}

impl GvisorBackend {
    /// Finds a runsc that runs a container on this host (trying each platform), makes the
    /// `minimal` image if needed, and removes what a previous engine left behind.
    pub async fn open(config: GvisorConfig, progress: Arc<dyn Progress>) -> Result<Self> {
        let builder = ImageBuilder::new(config.images_dir.clone());
        let image = image_for(&builder, Profile::Minimal, &progress).await?;
        let state_dir = config.home.join("runsc");
        let bundles_dir = config.home.join("sandboxes");
        for dir in [&state_dir, &bundles_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let paths = candidates(config.runsc.as_deref());
        if paths.is_empty() {
            return Err(Error::unsupported(format!(
                "no runsc found: {INSTALL_HINT}"
            )));
        }
        // What runs here is a property of the host and the runsc binary, not of a home: the
        // answer is kept in the user's cache directory.
        let cache_path = crate::guest::image::default_cache_dir().join("runsc-probe.json");
        // Newest first; older files held one entry.
        let cached: Vec<ProbeCache> = std::fs::read(&cache_path)
            .ok()
            .and_then(|bytes| {
                serde_json::from_slice::<Vec<ProbeCache>>(&bytes)
                    .or_else(|_| serde_json::from_slice::<ProbeCache>(&bytes).map(|c| vec![c]))
                    .ok()
            })
            .unwrap_or_default();
        // Runsc binaries that worked before go first, the most recent first.
        let mut paths = paths;
        paths.sort_by_key(|p| {
            cached
                .iter()
                .position(|c| c.path == *p)
                .unwrap_or(usize::MAX)
        });
        let mut failures = Vec::new();
        for path in paths {
            let known = config.platform.clone().or_else(|| {
                let digest = binary_digest(&path).ok();
                cached
                    .iter()
                    .find(|c| c.path == path && digest.as_ref() == Some(&c.digest))
                    .map(|c| c.platform.clone())
            });
            match probe_runsc(&path, known.as_deref(), &image, &state_dir, &bundles_dir).await {
                Ok(runsc) => {
                    let cache = ProbeCache {
                        path: runsc.path.clone(),
                        digest: runsc.digest.clone(),
                        platform: runsc.platform.clone(),
                    };
                    let newest = cache.path.clone();
                    let mut entries = vec![cache];
                    entries.extend(cached.iter().filter(|c| c.path != newest).cloned());
                    entries.truncate(8);
                    if let Ok(bytes) = serde_json::to_vec(&entries)
                        && std::fs::create_dir_all(crate::guest::image::default_cache_dir()).is_ok()
                    {
                        let _ = crate::fsutil::write_durably(&cache_path, &bytes);
                    }
                    let kept_dir = config.home.join("runsc-bin");
                    let backend = Self {
                        runsc,
                        kept: kept_binaries(&kept_dir),
                        kept_dir,
                        state_dir,
                        bundles_dir,
                        images: std::sync::Mutex::new(
                            [(Profile::Minimal, image)].into_iter().collect(),
                        ),
                        builder,
                        progress,
                    };
                    backend.clean_leftovers().await;
                    tracing::info!(
                        runsc = %backend.runsc.path.display(),
                        version = backend.runsc.version,
                        platform = backend.runsc.platform,
                        "gVisor backend ready"
                    );
                    return Ok(backend);
                }
                Err(e) => failures.push(format!("{}: {e}", path.display())),
            }
        }
        Err(Error::unsupported(format!(
            "no runsc here can run a sandbox ({}); {INSTALL_HINT}",
            failures.join("; ")
        )))
    }

    pub fn runsc(&self) -> &Runsc {
        &self.runsc
    }

    async fn image(&self, profile: Profile) -> Result<Image> {
        if let Some(image) = self
            .images
            .lock()
            .ok()
            .and_then(|i| i.get(&profile).cloned())
        {
            return Ok(image);
        }
        let image = image_for(&self.builder, profile, &self.progress).await?;
        if let Ok(mut images) = self.images.lock() {
            images.insert(profile, image.clone());
        }
        Ok(image)
    }

    /// Writes the sandbox's bundle and starts `runsc <command>` on it (`run`, or `restore`
    /// from a snapshot), with the container's stdio as the agent channel.
    async fn launch(
        &self,
        spec: &SandboxSpec,
        runsc: &Runsc,
        command: &[String],
    ) -> Result<Box<dyn Sandbox>> {
        let image = match &spec.image_id {
            Some(id) => self.builder.by_id(id)?,
            None => self.image(spec.profile).await?,
        };
        let bundle = write_bundle(&self.bundles_dir, &spec.id, &image, spec.memory_mb)?;
        let mut child = match spawn_runsc(runsc, &self.state_dir, &bundle, command, &spec.id) {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&bundle);
                return Err(e);
            }
        };
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            let _ = child.kill().await;
            return Err(Error::internal("runsc has no stdio pipes"));
        };
        super::widen_pipe(&stdout);
        Ok(Box::new(GvisorSandbox {
            id: spec.id.clone(),
            child,
            channel: Some((Box::new(stdout), Box::new(stdin))),
            bundle,
            runsc: runsc.clone(),
            kept_dir: self.kept_dir.clone(),
            state_dir: self.state_dir.clone(),
            released: false,
            image_id: image.id,
        }))
    }

    /// Sandboxes a crashed engine left: stopped and deleted, with their bundles.
    async fn clean_leftovers(&self) {
        let listed = Command::new(&self.runsc.path)
            .args(global_args(&self.runsc, &self.state_dir))
            .args(["list", "--quiet"])
            .output()
            .await;
        if let Ok(output) = listed {
            for id in String::from_utf8_lossy(&output.stdout).lines() {
                let id = id.trim();
                if !id.is_empty() {
                    tracing::info!(sandbox = id, "removing a sandbox left by an earlier engine");
                    delete_container(&self.runsc, &self.state_dir, id).await;
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.bundles_dir) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// The newest built image of a profile, else one built now (on a blocking thread: a build takes
/// seconds to minutes). `evervm image build` checks the package archive for newer versions and
/// builds a new image when an input changed.
async fn image_for(
    builder: &ImageBuilder,
    profile: Profile,
    progress: &Arc<dyn Progress>,
) -> Result<Image> {
    let builder = builder.clone();
    let progress = Arc::clone(progress);
    tokio::task::spawn_blocking(move || builder.built_or_build(profile, progress.as_ref()))
        .await
        .map_err(|e| Error::internal(format!("the image build stopped: {e}")))?
        .map_err(|e| e.context(format!("the {} image", profile.as_str())))
}

/// Stops and deletes a container, retrying: after a kill under load runsc can still list it.
async fn delete_container(runsc: &Runsc, state_dir: &Path, id: &str) {
    for attempt in 0..3 {
        let deleted = Command::new(&runsc.path)
            .args(global_args(runsc, state_dir))
            .args(["delete", "--force", id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        if deleted.is_ok_and(|s| s.success()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
    }
}

/// The OCI runtime spec of one sandbox.
fn bundle_spec(image: &Image, memory_mb: u32) -> serde_json::Value {
    let address_space = u64::from(memory_mb) * 1024 * 1024;
    let backstop = (u64::from(memory_mb) + BACKSTOP_EXTRA_MB) * 1024 * 1024;
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        format!("HOME={MACHINE_HOME}"),
        "LANG=C.UTF-8".to_owned(),
        "TZ=UTC".to_owned(),
        "PYTHONIOENCODING=utf-8".to_owned(),
        "MPLBACKEND=Agg".to_owned(),
        format!("MPLCONFIGDIR={MPLCONFIGDIR}"),
        "OPENBLAS_NUM_THREADS=1".to_owned(),
        // Large blocks come from (and go back to) the heap instead of fresh mappings: every new
        // page is a fault the sentry serves, which costs far more under gVisor than natively.
        "MALLOC_MMAP_THRESHOLD_=33554432".to_owned(),
        "MALLOC_TRIM_THRESHOLD_=134217728".to_owned(),
        "MALLOC_TOP_PAD_=16777216".to_owned(),
        "OMP_NUM_THREADS=1".to_owned(),
    ];
    // Older OpenBLAS builds need these on some processors to compute right.
    for key in ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"] {
        if let Ok(value) = std::env::var(key) {
            env.push(format!("{key}={value}"));
        }
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": MACHINE_UID, "gid": MACHINE_UID},
            "args": ["/usr/bin/python3", "-I", AGENT_PATH],
            "env": env,
            "cwd": MACHINE_HOME,
            "capabilities": {
                "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
            },
            "rlimits": [
                {"type": "RLIMIT_AS", "hard": address_space, "soft": address_space},
                {"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096},
                {"type": "RLIMIT_NPROC", "hard": 512, "soft": 512},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}
            ],
            "noNewPrivileges": true
        },
        "root": {"path": image.root, "readonly": false},
        "hostname": "machine",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                {"type": "network"}
            ],
            "resources": {"memory": {"limit": backstop}}
        }
    })
}

/// Writes a sandbox's bundle; returns its directory.
fn write_bundle(bundles_dir: &Path, id: &str, image: &Image, memory_mb: u32) -> Result<PathBuf> {
    let dir = bundles_dir.join(id);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    let spec = serde_json::to_vec_pretty(&bundle_spec(image, memory_mb))
        .map_err(|e| Error::internal(format!("cannot encode a bundle: {e}")))?;
    std::fs::write(dir.join("config.json"), spec)
        .map_err(|e| Error::internal(format!("cannot write a bundle: {e}")))?;
    Ok(dir)
}

/// Starts `runsc run` for a bundle, with the container's stdin and stdout piped to us.
fn spawn_run(runsc: &Runsc, state_dir: &Path, bundle: &Path, id: &str) -> Result<Child> {
    spawn_runsc(runsc, state_dir, bundle, &["run".to_owned()], id)
}

/// Starts `runsc <command...> --bundle=B ID` (`run`, or `restore --image-path=...`), with the
/// container's stdin and stdout piped to us.
fn spawn_runsc(
    runsc: &Runsc,
    state_dir: &Path,
    bundle: &Path,
    command_args: &[String],
    id: &str,
) -> Result<Child> {
    let log = std::fs::File::create(bundle.join("runsc.log"))
        .map_err(|e| Error::internal(format!("cannot create a sandbox log: {e}")))?;
    let mut command = Command::new(&runsc.path);
    command
        .args(global_args(runsc, state_dir))
        .args(command_args)
        .arg(format!("--bundle={}", bundle.display()))
        .arg(id)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which is
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            // runsc run's sandbox processes die with it (they are "attached"); it dies with us.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command
        .spawn()
        .map_err(|e| Error::crashed(format!("cannot start {}: {e}", runsc.path.display())))
}

/// Finds the platform this runsc runs containers on here: `known` first (what worked last
/// time), then `kvm` (where /dev/kvm exists), `systrap` (where this runsc has it), `ptrace`.
async fn probe_runsc(
    path: &Path,
    known: Option<&str>,
    image: &Image,
    state_dir: &Path,
    bundles_dir: &Path,
) -> Result<Runsc> {
    let version_output = Command::new(path)
        .arg("--version")
        .output()
        .await
        .map_err(|e| Error::unsupported(format!("cannot run it: {e}")))?;
    let first_line = String::from_utf8_lossy(&version_output.stdout)
        .lines()
        .next()
        .unwrap_or("runsc version unknown")
        .to_owned();
    let digest = binary_digest(path)?;
    let version = format!("{first_line} (sha256 {digest})");
    let mut platforms = Vec::new();
    if let Some(known) = known {
        let runsc = Runsc {
            path: path.to_owned(),
            version: version.clone(),
            platform: known.to_owned(),
            digest: digest.clone(),
        };
        // This binary ran sandboxes on this platform before: no need to start one now (a
        // failure later is reported by the sandbox that fails).
        return Ok(runsc);
    }
    if Path::new("/dev/kvm").exists() {
        platforms.push("kvm");
    }
    let flags = Command::new(path).arg("flags").output().await;
    let flags = flags
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        })
        .unwrap_or_default();
    if flags.contains("systrap") {
        platforms.push("systrap");
    }
    platforms.push("ptrace");
    let mut failures = Vec::new();
    for platform in platforms {
        let runsc = Runsc {
            path: path.to_owned(),
            version: version.clone(),
            platform: platform.to_owned(),
            digest: digest.clone(),
        };
        match tokio::time::timeout(
            Duration::from_secs(10),
            probe_platform(&runsc, image, state_dir, bundles_dir),
        )
        .await
        {
            Ok(Ok(())) => return Ok(runsc),
            Ok(Err(e)) => failures.push(format!("{platform}: {e}")),
            Err(_) => failures.push(format!("{platform}: no answer within 10 s")),
        }
    }
    Err(Error::unsupported(failures.join(", ")))
}

/// Runs the agent in a sandbox on this platform and waits for it to be ready.
async fn probe_platform(
    runsc: &Runsc,
    image: &Image,
    state_dir: &Path,
    bundles_dir: &Path,
) -> Result<()> {
    let id = format!("probe-{}-{}", runsc.platform, std::process::id());
    let bundle = write_bundle(bundles_dir, &id, image, 256)?;
    let result = async {
        let mut child = spawn_run(runsc, state_dir, &bundle, &id)?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(Error::internal("runsc has no stdio pipes"));
        };
        let ready = crate::guest::connection::AgentConnection::establish(
            Box::new(stdout),
            Box::new(stdin),
            Duration::from_secs(10),
        )
        .await;
        let _ = child.kill().await;
        let log = std::fs::read_to_string(bundle.join("runsc.log")).unwrap_or_default();
        ready.map(drop).map_err(|e| {
            let tail: String = log.lines().last().unwrap_or("").chars().take(300).collect();
            e.context(tail)
        })
    }
    .await;
    delete_container(runsc, state_dir, &id).await;
    let _ = std::fs::remove_dir_all(&bundle);
    result
}

#[async_trait]
impl SandboxBackend for GvisorBackend {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { snapshots: true }
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        self.launch(spec, &self.runsc, &["run".to_owned()]).await
    }

    async fn current_image(&self, profile: Profile) -> Result<Option<String>> {
        Ok(Some(self.image(profile).await?.id))
    }

    fn restorable(&self, runtime: &str) -> bool {
        self.runsc.describe() == runtime || self.kept.iter().any(|r| r.describe() == runtime)
    }

    /// Restores with the runsc that wrote the snapshot: this engine's, or one kept for it.
    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        runtime: &str,
    ) -> Result<Box<dyn Sandbox>> {
        let runsc = std::iter::once(&self.runsc)
            .chain(&self.kept)
            .find(|r| r.describe() == runtime)
            .ok_or_else(|| {
                Error::crashed(format!(
                    "the snapshot in {} was written by {runtime}, which is not kept in {}",
                    dir.display(),
                    self.kept_dir.display()
                ))
            })?;
        let restore = [
            "restore".to_owned(),
            format!("--image-path={}", dir.display()),
        ];
        self.launch(spec, runsc, &restore).await
    }

    fn describe(&self) -> String {
        self.runsc.describe()
    }
}

struct GvisorSandbox {
    id: String,
    child: Child,
    channel: Option<(ChannelReader, ChannelWriter)>,
    bundle: PathBuf,
    runsc: Runsc,
    kept_dir: PathBuf,
    state_dir: PathBuf,
    image_id: String,
    /// True once a checkpoint handed the sandbox's clean-up to a background task.
    released: bool,
}

#[async_trait]
impl Sandbox for GvisorSandbox {
    fn take_channel(&mut self) -> Option<(ChannelReader, ChannelWriter)> {
        self.channel.take()
    }

    async fn checkpoint(&mut self, dir: &Path) -> Result<()> {
        // The binary that writes a snapshot is kept for as long as the home lives.
        let kept_dir = self.kept_dir.clone();
        let runsc = self.runsc.clone();
        tokio::task::spawn_blocking(move || keep_binary(&kept_dir, &runsc))
            .await
            .map_err(|e| Error::internal(format!("keeping runsc stopped: {e}")))??;
        let started = std::time::Instant::now();
        let output = Command::new(&self.runsc.path)
            .args(global_args(&self.runsc, &self.state_dir))
            .arg("checkpoint")
            .arg(format!("--image-path={}", dir.display()))
            .arg(&self.id)
            .output()
            .await
            .map_err(|e| Error::internal(format!("cannot run runsc checkpoint: {e}")))?;
        if !output.status.success() {
            return Err(Error::crashed(format!(
                "runsc checkpoint failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        // The snapshot is whole once `runsc checkpoint` returns, and the sandbox has stopped:
        // the `runsc run` process and runsc's state are cleaned up without making the caller
        // wait (`runsc run` can take 100 ms to notice).
        let _ = self.child.start_kill();
        let (runsc, state_dir, id, bundle) = (
            self.runsc.clone(),
            self.state_dir.clone(),
            self.id.clone(),
            self.bundle.clone(),
        );
        self.released = true;
        tokio::spawn(async move {
            delete_container(&runsc, &state_dir, &id).await;
            let _ = tokio::fs::remove_dir_all(&bundle).await;
        });
        tracing::debug!(
            sandbox = %self.id,
            "runsc checkpoint took {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    fn image_id(&self) -> Option<String> {
        Some(self.image_id.clone())
    }

    fn runtime(&self) -> Option<String> {
        Some(self.runsc.describe())
    }

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn kill(&mut self) -> Result<()> {
        let _ = self.child.kill().await;
        if self.released {
            return Ok(());
        }
        delete_container(&self.runsc, &self.state_dir, &self.id).await;
        let _ = tokio::fs::remove_dir_all(&self.bundle).await;
        Ok(())
    }

    fn exit_reason(&mut self) -> Option<String> {
        use std::os::unix::process::ExitStatusExt;
        let status = self.child.try_wait().ok().flatten()?;
        Some(match (status.code(), status.signal()) {
            (Some(137), _) | (_, Some(9)) => {
                "the sandbox was killed (its memory went past the limit, or it was stopped)"
                    .to_owned()
            }
            (Some(code), None) => {
                let log =
                    std::fs::read_to_string(self.bundle.join("runsc.log")).unwrap_or_default();
                let tail = log.lines().last().unwrap_or("").trim().to_owned();
                if tail.is_empty() {
                    format!("the sandbox exited with status {code}")
                } else {
                    format!("the sandbox exited with status {code}: {tail}")
                }
            }
            (_, Some(signal)) => format!("the sandbox was killed by signal {signal}"),
            (None, None) => "the sandbox ended".to_owned(),
        })
    }
}
