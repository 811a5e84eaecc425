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
use std::sync::Arc;

use async_trait::async_trait;
use tokio::process::Command;

use super::{Capabilities, Sandbox, SandboxBackend, SandboxSpec};
use crate::error::{Error, Result};
use crate::guest::image::{Image, ImageBuilder, Profile, Progress};
use crate::network::{Fabric, MachineNetwork};

mod bundle;
mod pages;
mod precreated;
mod probe;
mod runsc;
pub(crate) use runsc::binary_digest;
mod sandbox;

pub use runsc::Runsc;

use bundle::{delete_container, spawn_runsc, write_bundle};
use precreated::Precreated;
use probe::find_runsc;
use runsc::{global_args, kept_binaries};
use sandbox::{GvisorSandbox, Processes};

/// Created sandboxes kept for restores: one for new machines and one for swapped or forked ones
/// of the usual shape, about 30 MB each.
const DEFAULT_PRECREATED: usize = 2;

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
    /// Sandboxes created ahead of time for restores (`EVERVM_PRECREATED`, default 2; 0: none).
    pub precreated: usize,
    /// How sandboxes with a network get it.
    pub network: crate::network::NetworkSettings,
    /// Where chunked snapshots' chunks are read from (see [`crate::chunks`]).
    pub chunks: Option<Arc<crate::chunks::ChunkStore>>,
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
            precreated: var("EVERVM_PRECREATED")
                .and_then(|n| n.to_str().and_then(|n| n.trim().parse().ok()))
                .unwrap_or(DEFAULT_PRECREATED),
            network: crate::network::NetworkSettings::from_env(),
            chunks: None,
        }
    }
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
    /// Sandboxes created ahead of time for restores by this runsc.
    precreated: Arc<Precreated>,
    progress: Arc<dyn Progress>,
    network_settings: crate::network::NetworkSettings,
    /// Opened for the first sandbox with a network (or why it could not be).
    fabric: std::sync::OnceLock<std::result::Result<Arc<Fabric>, String>>,
    chunks: Option<Arc<crate::chunks::ChunkStore>>,
}

impl std::fmt::Debug for GvisorBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GvisorBackend")
            .field("runsc", &self.runsc)
            .finish_non_exhaustive()
    }
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
        let runsc = find_runsc(
            config.runsc.as_deref(),
            config.platform.as_deref(),
            &image,
            &state_dir,
            &bundles_dir,
        )
        .await?;
        let kept_dir = config.home.join("runsc-bin");
        // Leftovers go before the watchdog starts (it only ever deletes this engine's).
        clean_leftovers(&runsc, &state_dir, &bundles_dir).await;
        let precreated = Arc::new(Precreated::new(
            runsc.clone(),
            state_dir.clone(),
            bundles_dir.clone(),
            if runsc.restore_into_created {
                config.precreated
            } else {
                0
            },
        ));
        let backend = Self {
            runsc,
            kept: kept_binaries(&kept_dir),
            kept_dir,
            state_dir,
            bundles_dir,
            images: std::sync::Mutex::new([(Profile::Minimal, image)].into_iter().collect()),
            builder,
            progress,
            precreated,
            network_settings: config.network,
            fabric: std::sync::OnceLock::new(),
            chunks: config.chunks,
        };
        tracing::info!(
            runsc = %backend.runsc.path.display(),
            version = backend.runsc.version,
            platform = backend.runsc.platform,
            "gVisor backend ready"
        );
        Ok(backend)
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
        let image = image_for(&self.builder, profile.clone(), &self.progress).await?;
        if let Ok(mut images) = self.images.lock() {
            images.insert(profile, image.clone());
        }
        Ok(image)
    }

    /// The image a sandbox runs: the exact one its spec names, else the profile's newest.
    async fn image_of(&self, spec: &SandboxSpec) -> Result<Image> {
        match &spec.image_id {
            Some(id) => self.builder.by_id(id),
            None => self.image(spec.profile.clone()).await,
        }
    }

    /// The machines' network fabric, opened on first use.
    fn fabric(&self) -> Result<Arc<Fabric>> {
        self.fabric
            .get_or_init(|| {
                Fabric::open(&self.network_settings)
                    .map(Arc::new)
                    .map_err(|e| e.message().to_owned())
            })
            .clone()
            .map_err(Error::unsupported)
    }

    /// Writes the sandbox's bundle and starts `runsc <command>` on it (`run`, or `restore`
    /// from a snapshot), with the container's stdio as the agent channel. A sandbox with a
    /// network gets its namespaces, proxy and DNS first.
    async fn launch(
        &self,
        spec: &SandboxSpec,
        runsc: &Runsc,
        command: &[String],
        unpacked: Option<pages::Unpacked>,
    ) -> Result<Box<dyn Sandbox>> {
        let image = self.image_of(spec).await?;
        let network = match &spec.network {
            Some(network) => Some(
                self.fabric()?
                    .attach(&network.machine, &network.policy)
                    .await?,
            ),
            None => None,
        };
        let netns = network.as_ref().map(MachineNetwork::netns_path);
        let bundle = write_bundle(&self.bundles_dir, &spec.id, &image, spec.memory_mb, netns)?;
        let spawned = spawn_runsc(
            runsc,
            &self.state_dir,
            &bundle,
            command,
            &spec.id,
            network.is_some(),
        );
        let mut child = match spawned {
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
            processes: Processes::Attached(child),
            memory_mb: spec.memory_mb,
            channel: Some((Box::new(stdout), Box::new(stdin))),
            bundle,
            runsc: runsc.clone(),
            kept_dir: self.kept_dir.clone(),
            state_dir: self.state_dir.clone(),
            released: false,
            image_id: image.id,
            unpacked,
            network,
        }))
    }

    /// Restores the snapshot in `dir` into a sandbox created ahead of time, if one of the
    /// right shape waits; `None` when none does (or the restore into it failed: a plain
    /// restore follows). A replacement is made either way.
    async fn restore_into_created(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
    ) -> Option<Box<dyn Sandbox>> {
        let image = self.image_of(spec).await.ok()?;
        let created = self.precreated.take(&image.id, spec.memory_mb);
        self.precreated.replenish(image, spec.memory_mb);
        let created = created?;
        let restored = precreated::restore_detached(
            &self.runsc,
            &self.state_dir,
            &created.bundle,
            &created.id,
            dir,
        )
        .await;
        if let Err(e) = restored {
            tracing::warn!(
                sandbox = created.id,
                "restoring into a created sandbox: {e}"
            );
            self.precreated.discard(created);
            return None;
        }
        Some(Box::new(GvisorSandbox {
            id: created.id,
            processes: Processes::Detached(created.processes),
            memory_mb: spec.memory_mb,
            channel: Some((Box::new(created.reader), Box::new(created.writer))),
            bundle: created.bundle,
            runsc: self.runsc.clone(),
            kept_dir: self.kept_dir.clone(),
            state_dir: self.state_dir.clone(),
            released: false,
            image_id: created.image_id,
            unpacked: None,
            network: None,
        }))
    }
}

/// Where runsc pins an empty network namespace for its gofers (a bind mount in its state
/// directory), which it never removes: the engine unmounts it at shutdown, when the backend is
/// dropped, and (through the watchdog, where there is one: sandboxes are created ahead of time)
/// when the engine dies, or every engine home (every test's) would leave a mount, and a
/// namespace, on the host until it reboots. A sandbox started later pins a new one.
fn null_netns(state_dir: &Path) -> PathBuf {
    state_dir.join("null-netns")
}

fn unpin_null_netns(state_dir: &Path) {
    let Ok(path) =
        std::ffi::CString::new(null_netns(state_dir).into_os_string().into_encoded_bytes())
    else {
        return;
    };
    // Sandboxes started at once can stack several mounts there: each is removed, until none is
    // left (a bounded number of tries).
    for _ in 0..64 {
        // SAFETY: `path` is a valid NUL-terminated string that outlives the call; umount2 only
        // reads it. Failure (nothing mounted there) ends the loop.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
            break;
        }
    }
}

impl Drop for GvisorBackend {
    fn drop(&mut self) {
        unpin_null_netns(&self.state_dir);
    }
}

impl GvisorBackend {
    /// The snapshot in `dir` as runsc reads it (its compressed memory unpacked into a scratch
    /// directory among the bundles, which a crashed engine's leftovers are cleaned with).
    async fn unpack(&self, dir: &Path) -> Result<pages::Unpacked> {
        let scratch = self
            .bundles_dir
            .join(format!("unpacked-{:016x}", rand::random::<u64>()));
        let dir = dir.to_owned();
        let started = std::time::Instant::now();
        let chunks = self.chunks.clone();
        let unpacked =
            tokio::task::spawn_blocking(move || pages::unpack(&dir, scratch, chunks.as_deref()))
                .await
                .map_err(|e| Error::internal(format!("unpacking a snapshot stopped: {e}")))??;
        tracing::debug!(
            "unpacking the snapshot took {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(unpacked)
    }
}

/// Sandboxes a crashed engine left: stopped and deleted, with their bundles.
async fn clean_leftovers(runsc: &Runsc, state_dir: &Path, bundles_dir: &Path) {
    let listed = Command::new(&runsc.path)
        .args(global_args(runsc, state_dir))
        .args(["list", "--quiet"])
        .output()
        .await;
    if let Ok(output) = listed {
        for id in String::from_utf8_lossy(&output.stdout).lines() {
            let id = id.trim();
            if !id.is_empty() {
                tracing::info!(sandbox = id, "removing a sandbox left by an earlier engine");
                delete_container(runsc, state_dir, id).await;
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(bundles_dir) {
        for entry in entries.flatten() {
            let _ = std::fs::remove_dir_all(entry.path());
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
    let name = profile.as_str().to_owned();
    tokio::task::spawn_blocking(move || builder.built_or_build(&profile, progress.as_ref()))
        .await
        .map_err(|e| Error::internal(format!("the image build stopped: {e}")))?
        .map_err(|e| e.context(format!("the {name} image")))
}

#[async_trait]
impl SandboxBackend for GvisorBackend {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn file_roots(&self) -> &'static [&'static str] {
        // The sandbox's whole file system, as E2B's envd reaches it: the agent works as the
        // machine's user, so the image (root's) is read-only and nothing of the host is there.
        &["/"]
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshots: true,
            save_in_place: self.runsc.leave_running,
            network: self.runsc.network,
        }
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        self.launch(spec, &self.runsc, &["run".to_owned()], None)
            .await
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
        let unpacked = self.unpack(dir).await?;
        // Created sandboxes have no network: a machine with one is restored in its own.
        if runsc.digest == self.runsc.digest
            && spec.network.is_none()
            && self.precreated.enabled()
            && let Some(sandbox) = self.restore_into_created(spec, unpacked.path()).await
        {
            // `runsc restore --detach` returned once the restore had read what it needs.
            return Ok(sandbox);
        }
        let restore = [
            "restore".to_owned(),
            format!("--image-path={}", unpacked.path().display()),
        ];
        // `runsc restore` reads the snapshot while the engine goes on: an unpacked copy stays
        // until the sandbox ends.
        self.launch(spec, runsc, &restore, Some(unpacked)).await
    }

    fn describe(&self) -> String {
        self.runsc.describe()
    }

    fn compressible(&self, dir: &Path) -> bool {
        pages::compressible(dir)
    }

    fn compress_snapshot(&self, dir: &Path, effort: super::Effort) -> Result<()> {
        pages::compress(dir, effort)
    }

    async fn shutdown(&self) {
        self.precreated.clear().await;
        unpin_null_netns(&self.state_dir);
    }
}
