//! Ready sandboxes: started ahead of time per image and memory size, so that a new machine does
//! not pay the cold start. On a backend with snapshots they are restored from a base snapshot
//! of the image, taken once the agent is ready (for the `data` profile, after numpy, pandas and
//! matplotlib are imported), so a new machine pays neither a boot nor the imports.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::guest::channel::{AgentEvent, AgentOutcome, AgentRequest};
use crate::guest::connection::AgentConnection;
use crate::guest::image::Profile;
use crate::sandbox::{Sandbox, SandboxNetwork, SandboxSpec};
use crate::snapshot::{self, SnapshotManifest};
use crate::sync::lock;

/// A running sandbox with its agent ready.
pub(crate) struct Resident {
    pub sandbox: Box<dyn Sandbox>,
    pub agent: AgentConnection,
}

impl Resident {
    /// Stops what runs in the sandbox at once; [`Self::kill`] removes the rest later.
    pub fn stop_now(&mut self) {
        self.sandbox.stop_now();
    }

    /// Stops the sandbox; returns why it had ended, if it had.
    pub async fn kill(mut self) -> Option<crate::sandbox::ExitReason> {
        let reason = self.sandbox.exit_reason();
        let _ = self.sandbox.kill().await;
        reason.or_else(|| self.sandbox.exit_reason())
    }
}

/// The pool's key: sandboxes are interchangeable when these match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub profile: Profile,
    pub memory_mb: u32,
}

#[derive(Default)]
pub(crate) struct Pool {
    ready: Mutex<HashMap<Shape, Vec<Resident>>>,
    /// Sandboxes being started for the pool, per shape.
    starting: Mutex<HashMap<Shape, usize>>,
    /// Base snapshots checked (or made) by this engine, per shape: each shape's own lock is
    /// held while its base is made, so one shape's build never holds up another's.
    bases: Mutex<HashMap<Shape, Arc<tokio::sync::Mutex<Option<SnapshotManifest>>>>>,
}

/// What a base snapshot of the `data` profile imports when the operator asks
/// (`EVERVM_BASE_PREIMPORT`): into `sys.modules` only, so that a new machine's globals are still
/// empty and its own `import pandas` is instant.
const DATA_WARM_UP: &str = "for _m in ('numpy', 'pandas', 'matplotlib', 'matplotlib.pyplot'):\n    \
                            __import__(_m)\ndel _m";

/// `<home>/base/<profile>-<memory_mb>` (`-imported` when it imported the `data` image's
/// libraries): the base snapshot new machines of a shape start from.
pub(crate) fn base_dir(
    home: &std::path::Path,
    shape: &Shape,
    imported: bool,
) -> std::path::PathBuf {
    let suffix = if imported { "-imported" } else { "" };
    home.join("base").join(format!(
        "{}-{}{suffix}",
        shape.profile.as_str(),
        shape.memory_mb
    ))
}

/// Whether the shape's base snapshot imports the data libraries (the operator asked).
fn imports_libraries(engine: &EngineInner, shape: &Shape) -> bool {
    shape.profile == Profile::Data && engine.config.base_preimport
}

pub(crate) fn sandbox_id() -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("evm-{n:016x}")
}

/// A ready sandbox: restored from the shape's base snapshot where the backend has snapshots
/// (the base is made first if needed), else booted.
pub(crate) async fn start_sandbox(engine: &EngineInner, shape: &Shape) -> Result<Resident> {
    let started = start_sandbox_unmeasured(engine, shape).await;
    engine.metrics.sandbox_started(started.is_ok());
    started
}

async fn start_sandbox_unmeasured(engine: &EngineInner, shape: &Shape) -> Result<Resident> {
    if !engine.backend.capabilities().snapshots {
        return boot_sandbox(engine, shape, None).await;
    }
    match restore_base(engine, shape).await {
        Ok(resident) => Ok(resident),
        Err(e) => {
            tracing::warn!(
                profile = shape.profile.as_str(),
                "no base snapshot ({e}); booting a sandbox instead"
            );
            boot_sandbox(engine, shape, None).await
        }
    }
}

/// A sandbox restored from the shape's base snapshot, its random generators reseeded.
async fn restore_base(engine: &EngineInner, shape: &Shape) -> Result<Resident> {
    let (dir, manifest) = ensure_base(engine, shape).await?;
    let spec = SandboxSpec {
        id: sandbox_id(),
        memory_mb: shape.memory_mb,
        profile: shape.profile.clone(),
        image_id: manifest.image_id.clone(),
        network: None,
    };
    let sandbox = engine
        .backend
        .restore(&spec, &dir, &manifest.runtime)
        .await?;
    connect_restored(engine, sandbox, true).await
}

/// Connects to the agent of a restored sandbox; with `reseed`, has it reseed its random
/// generators first (which also proves it alive).
pub(crate) async fn connect_restored(
    engine: &EngineInner,
    mut sandbox: Box<dyn Sandbox>,
    reseed: bool,
) -> Result<Resident> {
    let Some((reader, writer)) = sandbox.take_channel() else {
        let _ = sandbox.kill().await;
        return Err(Error::internal("the restored sandbox has no agent channel"));
    };
    let mut agent = AgentConnection::resume(reader, writer);
    if reseed && let Err(e) = agent.reseed(engine.config.ready_timeout).await {
        let reason = sandbox.exit_reason();
        let _ = sandbox.kill().await;
        return Err(match reason {
            Some(reason) => e.context(reason),
            None => e,
        });
    }
    Ok(Resident { sandbox, agent })
}

/// The shape's base snapshot: checked once per engine (checksum, runtime, and that it was taken
/// on the image new sandboxes run), made when missing or stale.
async fn ensure_base(
    engine: &EngineInner,
    shape: &Shape,
) -> Result<(std::path::PathBuf, SnapshotManifest)> {
    let slot = Arc::clone(lock(&engine.pool.bases).entry(shape.clone()).or_default());
    let mut base = slot.lock().await;
    let dir = base_dir(&engine.config.home, shape, imports_libraries(engine, shape));
    if let Some(manifest) = base.as_ref() {
        return Ok((dir, manifest.clone()));
    }
    let current = engine.backend.current_image(shape.profile.clone()).await?;
    let found = {
        let dir = dir.clone();
        let describe = engine.backend.describe();
        tokio::task::spawn_blocking(move || {
            let restorable = |runtime: &str| runtime == describe;
            let found = snapshot::verify_dir(&dir, &restorable);
            (found, snapshot::needs_reseed(&dir))
        })
        .await
        .map_err(|e| Error::internal(format!("checking the base snapshot stopped: {e}")))?
    };
    let manifest = match found {
        (Ok(Some(manifest)), true) if manifest.image_id == current => manifest,
        _ => match shared_base(engine, &dir, current.as_deref()).await {
            Some(manifest) => manifest,
            None => {
                let made = make_base(engine, shape, &dir).await?;
                if let Some(bucket) = &engine.bucket {
                    crate::bucket::share_base(bucket, &dir).await;
                }
                made
            }
        },
    };
    *base = Some(manifest.clone());
    Ok((dir, manifest))
}

/// A base snapshot for `dir` that another node made and shared through the bucket (made with
/// this node's runsc from this image), downloaded; `None` without one.
async fn shared_base(
    engine: &EngineInner,
    dir: &std::path::Path,
    image_id: Option<&str>,
) -> Option<SnapshotManifest> {
    let bucket = engine.bucket.as_ref()?;
    let describe = engine.backend.describe();
    let restorable: Arc<dyn Fn(&str) -> bool + Send + Sync> =
        Arc::new(move |runtime: &str| runtime == describe);
    match crate::bucket::fetch_base(bucket, dir, image_id, restorable).await {
        Ok(Some(manifest)) => {
            tracing::info!(dir = %dir.display(), "took a base snapshot another node shared");
            Some(manifest)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!("cannot look for a shared base snapshot: {e}");
            None
        }
    }
}

/// Boots a sandbox, warms it up, and checkpoints it into `dir`.
async fn make_base(
    engine: &EngineInner,
    shape: &Shape,
    dir: &std::path::Path,
) -> Result<SnapshotManifest> {
    if let Some(hook) = &engine.config.hooks.before_base {
        hook(format!("{}-{}", shape.profile.as_str(), shape.memory_mb)).await;
    }
    let started = std::time::Instant::now();
    let mut fresh = boot_sandbox(engine, shape, None).await?;
    if imports_libraries(engine, shape) {
        let warm_up = AgentRequest::Exec {
            id: -1,
            code: DATA_WARM_UP.to_owned(),
            timeout_ms: 300_000,
            dialect: crate::Dialect::Python,
            context: None,
        };
        let warmed = async {
            fresh.agent.send(&warm_up).await?;
            loop {
                match fresh.agent.next_event().await? {
                    AgentEvent::Result {
                        outcome: AgentOutcome::Error { text, .. },
                        ..
                    } => return Err(Error::crashed(format!("the warm-up failed: {text}"))),
                    AgentEvent::Result { .. } => return Ok(()),
                    _ => {}
                }
            }
        }
        .await;
        if let Err(e) = warmed {
            fresh.kill().await;
            return Err(e);
        }
    }
    let staging = snapshot::staging_beside(dir)?;
    let runtime = fresh
        .sandbox
        .runtime()
        .unwrap_or_else(|| engine.backend.describe());
    let image_id = fresh.sandbox.image_id();
    if let Err(e) = fresh.sandbox.checkpoint(&staging).await {
        let _ = std::fs::remove_dir_all(&staging);
        fresh.kill().await;
        return Err(e);
    }
    drop(fresh);
    let target = dir.to_owned();
    let manifest = tokio::task::spawn_blocking(move || {
        snapshot::mark_reseed(&staging)?;
        snapshot::commit_to(&target, &staging, &runtime, image_id)
    })
    .await
    .map_err(|e| Error::internal(format!("saving the base snapshot stopped: {e}")))??;
    tracing::info!(
        profile = shape.profile.as_str(),
        memory_mb = shape.memory_mb,
        bytes = manifest.bytes,
        "made a base snapshot in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(manifest)
}

/// A sandbox with a network, booted for one machine: never pooled and never from a base
/// snapshot (those have no network).
pub(crate) async fn start_networked(
    engine: &EngineInner,
    shape: &Shape,
    network: SandboxNetwork,
) -> Result<Resident> {
    let started = boot_sandbox(engine, shape, Some(network)).await;
    engine.metrics.sandbox_started(started.is_ok());
    started
}

/// Boots one sandbox and waits for its agent.
async fn boot_sandbox(
    engine: &EngineInner,
    shape: &Shape,
    network: Option<SandboxNetwork>,
) -> Result<Resident> {
    let spec = SandboxSpec {
        id: sandbox_id(),
        memory_mb: shape.memory_mb,
        profile: shape.profile.clone(),
        image_id: None,
        network,
    };
    let mut sandbox = engine.backend.start(&spec).await?;
    let Some((reader, writer)) = sandbox.take_channel() else {
        let _ = sandbox.kill().await;
        return Err(Error::internal("the sandbox has no agent channel"));
    };
    match AgentConnection::establish(reader, writer, engine.config.ready_timeout).await {
        Ok(agent) => Ok(Resident { sandbox, agent }),
        Err(e) => {
            let reason = sandbox.exit_reason();
            let _ = sandbox.kill().await;
            Err(match reason {
                Some(reason) => e.context(reason),
                None => e,
            })
        }
    }
}

impl Pool {
    /// A ready sandbox of this shape: from the pool when it has one, else started now. Either
    /// way the pool is topped up in the background.
    pub(crate) async fn take(engine: &Arc<EngineInner>, shape: &Shape) -> Result<Resident> {
        let pooled = {
            let mut ready = lock(&engine.pool.ready);
            ready.get_mut(shape).and_then(Vec::pop)
        };
        Self::refill(engine, shape);
        if let Some(mut resident) = pooled {
            if resident.sandbox.exit_reason().is_none() {
                return Ok(resident);
            }
            let _ = resident.sandbox.kill().await;
        }
        start_sandbox(engine, shape).await
    }

    /// Starts sandboxes until the pool holds `pool_size` of this shape.
    pub(crate) fn refill(engine: &Arc<EngineInner>, shape: &Shape) {
        let target = engine.config.pool_size;
        let wanted = {
            let ready = lock(&engine.pool.ready).get(shape).map_or(0, Vec::len);
            let mut starting = lock(&engine.pool.starting);
            let in_flight = starting.entry(shape.clone()).or_insert(0);
            let wanted = target.saturating_sub(ready + *in_flight);
            *in_flight += wanted;
            wanted
        };
        for _ in 0..wanted {
            let engine = Arc::clone(engine);
            let shape = shape.clone();
            tokio::spawn(async move {
                let shape = &shape;
                let started = start_sandbox(&engine, shape).await;
                if let Some(n) = lock(&engine.pool.starting).get_mut(shape) {
                    *n = n.saturating_sub(1);
                }
                match started {
                    Ok(resident) if !engine.closing() => {
                        lock(&engine.pool.ready)
                            .entry(shape.clone())
                            .or_default()
                            .push(resident);
                    }
                    Ok(resident) => {
                        resident.kill().await;
                    }
                    Err(e) => tracing::warn!("could not start a sandbox for the pool: {e}"),
                }
            });
        }
    }

    /// Stops every pooled sandbox.
    pub(crate) async fn drain(&self) {
        let all: Vec<Resident> = lock(&self.ready)
            .drain()
            .flat_map(|(_, residents)| residents)
            .collect();
        for resident in all {
            resident.kill().await;
        }
    }

    /// How many ready sandboxes the pool holds.
    pub(crate) fn len(&self) -> usize {
        lock(&self.ready).values().map(Vec::len).sum()
    }
}
