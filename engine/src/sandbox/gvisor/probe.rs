//! Finding a runsc that runs a sandbox here, and on which platform: by starting a real one,
//! once per binary and host (the answer is kept in the user's cache directory).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::bundle::{remove_sandbox, spawn_run, spawn_runsc, write_bundle};
use super::runsc::{INSTALL_HINT, Runsc, binary_digest, candidates};
use crate::error::{Error, Result};
use crate::guest::image::Image;

/// The runsc and platform that worked last time, so that a restart probes one platform, not
/// every one (a `kvm` probe on a host without working virtualisation waits for its timeout).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct ProbeCache {
    path: PathBuf,
    digest: String,
    platform: String,
    /// Whether `checkpoint --leave-running` works (`None` in files from before it was tried).
    #[serde(default)]
    leave_running: Option<bool>,
    /// Whether a snapshot restores into a created sandbox (`None` in files from before).
    #[serde(default)]
    restore_into_created: Option<bool>,
    /// Whether a sandbox with a network runs (`None` in files from before it was tried).
    #[serde(default)]
    network: Option<bool>,
}

impl ProbeCache {
    fn abilities(&self) -> Option<Abilities> {
        Some(Abilities {
            leave_running: self.leave_running?,
            restore_into_created: self.restore_into_created?,
            network: self.network?,
        })
    }
}

/// What a runsc can do beyond running a sandbox, found by trying it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Abilities {
    /// `runsc checkpoint --leave-running` saves a sandbox and leaves it running.
    leave_running: bool,
    /// `runsc restore --detach` restores a snapshot into a sandbox made by `runsc create`.
    restore_into_created: bool,
    /// A sandbox with a network runs.
    network: bool,
}

/// Finds the platform this runsc runs containers on here: `known` first (what worked last
/// time), then `kvm` (where /dev/kvm exists), `systrap` (where this runsc has it), `ptrace`.
pub(super) async fn probe_runsc(
    path: &Path,
    known: Option<(&str, Option<Abilities>)>,
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
    let compression_flag = has_compression_flag(path).await;
    let mut platforms = Vec::new();
    if let Some((platform, abilities)) = known {
        let mut runsc = Runsc {
            path: path.to_owned(),
            version: version.clone(),
            platform: platform.to_owned(),
            digest: digest.clone(),
            leave_running: false,
            restore_into_created: false,
            network: false,
            compression_flag,
        };
        // This binary ran sandboxes on this platform before: no need to start one now (a
        // failure later is reported by the sandbox that fails), unless what it can do beyond
        // that was never tried.
        let abilities = match abilities {
            Some(abilities) => abilities,
            None => probe_abilities(&runsc, image, state_dir, bundles_dir).await,
        };
        abilities.apply(&mut runsc);
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
        let mut runsc = Runsc {
            path: path.to_owned(),
            version: version.clone(),
            platform: platform.to_owned(),
            digest: digest.clone(),
            leave_running: false,
            restore_into_created: false,
            network: false,
            compression_flag,
        };
        match tokio::time::timeout(
            Duration::from_secs(10),
            probe_platform(&runsc, image, state_dir, bundles_dir),
        )
        .await
        {
            Ok(Ok(())) => {
                probe_abilities(&runsc, image, state_dir, bundles_dir)
                    .await
                    .apply(&mut runsc);
                return Ok(runsc);
            }
            Ok(Err(e)) => failures.push(format!("{platform}: {e}")),
            Err(_) => failures.push(format!("{platform}: no answer within 10 s")),
        }
    }
    Err(Error::unsupported(failures.join(", ")))
}

/// Whether this runsc's `checkpoint` has the `--compression` flag (from its usage text).
async fn has_compression_flag(path: &Path) -> bool {
    Command::new(path)
        .args(["checkpoint", "--help"])
        .output()
        .await
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stderr).contains("-compression")
                || String::from_utf8_lossy(&o.stdout).contains("-compression")
        })
}

/// Runs the agent in a sandbox on this platform and waits for it to be ready.
pub(super) async fn probe_platform(
    runsc: &Runsc,
    image: &Image,
    state_dir: &Path,
    bundles_dir: &Path,
) -> Result<()> {
    let id = format!("probe-{}-{}", runsc.platform, std::process::id());
    agent_starts(runsc, image, state_dir, bundles_dir, &id, None).await
}

/// Starts a 256 MB sandbox `id` of `image` (in the network namespace `netns`, if given), waits
/// for its agent to be ready, and removes it; the error ends with the last line of runsc's log.
async fn agent_starts(
    runsc: &Runsc,
    image: &Image,
    state_dir: &Path,
    bundles_dir: &Path,
    id: &str,
    netns: Option<&Path>,
) -> Result<()> {
    let bundle = write_bundle(bundles_dir, id, image, 256, netns)?;
    let run = ["run".to_owned()];
    let result = async {
        let mut child = spawn_runsc(runsc, state_dir, &bundle, &run, id, netns.is_some())?;
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
    remove_sandbox(runsc, state_dir, id, &bundle).await;
    result
}

impl Abilities {
    fn apply(self, runsc: &mut Runsc) {
        runsc.leave_running = self.leave_running;
        runsc.restore_into_created = self.restore_into_created;
        runsc.network = self.network;
    }
}

/// What this runsc can do, tried on real sandboxes: whether `runsc checkpoint --leave-running`
/// saves one and leaves it running (Debian's 2022 runsc destroys the sandbox and times out
/// instead), and whether that snapshot restores into a created sandbox (Debian's answers
/// "container already exists").
async fn probe_abilities(
    runsc: &Runsc,
    image: &Image,
    state_dir: &Path,
    bundles_dir: &Path,
) -> Abilities {
    let id = format!("probe-lr-{}-{}", runsc.platform, std::process::id());
    let Ok(bundle) = write_bundle(bundles_dir, &id, image, 256, None) else {
        return Abilities::default();
    };
    let images = bundle.join("checkpoint");
    let abilities = async {
        let mut child = spawn_run(runsc, state_dir, &bundle, &id).ok()?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return None;
        };
        let mut agent = crate::guest::connection::AgentConnection::establish(
            Box::new(stdout),
            Box::new(stdin),
            Duration::from_secs(10),
        )
        .await
        .ok()?;
        let checkpoint = Command::new(&runsc.path)
            .args(super::runsc::global_args(runsc, state_dir))
            .arg("checkpoint")
            .arg("--leave-running")
            .arg(format!("--image-path={}", images.display()))
            .arg(&id)
            .output();
        let saved = tokio::time::timeout(Duration::from_secs(10), checkpoint)
            .await
            .ok()?
            .ok()?;
        let leave_running = saved.status.success()
            && child.try_wait().ok().flatten().is_none()
            && agent.probe(Duration::from_secs(5)).await.is_ok();
        let _ = child.kill().await;
        let restore_into_created = leave_running
            && probe_restore_into_created(runsc, image, state_dir, bundles_dir, &images).await;
        Some(Abilities {
            leave_running,
            restore_into_created,
            network: false,
        })
    }
    .await
    .unwrap_or_default();
    remove_sandbox(runsc, state_dir, &id, &bundle).await;
    let abilities = Abilities {
        network: probe_network(runsc, image, state_dir, bundles_dir).await,
        ..abilities
    };
    tracing::info!(
        runsc = %runsc.path.display(),
        "checkpoint --leave-running {}; restore into created sandboxes {}; sandboxes with a network {}",
        if abilities.leave_running { "works" } else { "does not work" },
        if abilities.restore_into_created { "works" } else { "does not work" },
        if abilities.network { "work" } else { "do not work" },
    );
    abilities
}

/// Whether a sandbox with a network runs its agent: made in a machine network's namespaces.
async fn probe_network(runsc: &Runsc, image: &Image, state_dir: &Path, bundles_dir: &Path) -> bool {
    let Ok(tools) = crate::network::Tools::find() else {
        return false;
    };
    let Ok(namespaces) = crate::network::create_namespaces(&tools).await else {
        return false;
    };
    let id = format!("probe-net-{}-{}", runsc.platform, std::process::id());
    let netns = namespaces.sandbox_path();
    let works = agent_starts(runsc, image, state_dir, bundles_dir, &id, Some(&netns)).await;
    drop(namespaces);
    works.is_ok()
}

/// Whether the snapshot in `images` (of a 256 MB sandbox of `image`) restores into a sandbox
/// made by `runsc create`, with an agent that answers.
async fn probe_restore_into_created(
    runsc: &Runsc,
    image: &Image,
    state_dir: &Path,
    bundles_dir: &Path,
    images: &Path,
) -> bool {
    let id = format!("probe-rc-{}-{}", runsc.platform, std::process::id());
    let Ok(bundle) = write_bundle(bundles_dir, &id, image, 256, None) else {
        return false;
    };
    let works = async {
        let (reader, writer, _) = super::precreated::create(runsc, state_dir, &bundle, &id)
            .await
            .ok()?;
        super::precreated::restore_detached(runsc, state_dir, &bundle, &id, images)
            .await
            .ok()?;
        let mut agent =
            crate::guest::connection::AgentConnection::resume(Box::new(reader), Box::new(writer));
        Some(agent.probe(Duration::from_secs(5)).await.is_ok())
    }
    .await
    .unwrap_or(false);
    remove_sandbox(runsc, state_dir, &id, &bundle).await;
    works
}

/// The first runsc that runs a sandbox here: `configured` (`EVERVM_RUNSC`) or those on `PATH`
/// and in the usual places, binaries that worked before first; on `platform` when given, else
/// the platform that worked last time, else the first that works now.
pub(super) async fn find_runsc(
    configured: Option<&Path>,
    platform: Option<&str>,
    image: &Image,
    state_dir: &Path,
    bundles_dir: &Path,
) -> Result<Runsc> {
    let paths = candidates(configured);
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
    // In the order of preference: the cache only saves probing a binary that ran before.
    let mut failures = Vec::new();
    for path in paths {
        let digest = binary_digest(&path).ok();
        let seen = cached
            .iter()
            .find(|c| c.path == path && digest.as_ref() == Some(&c.digest));
        let known = match (platform, seen) {
            (Some(platform), seen) => {
                Some((platform.to_owned(), seen.and_then(ProbeCache::abilities)))
            }
            (None, Some(seen)) => Some((seen.platform.clone(), seen.abilities())),
            (None, None) => None,
        };
        let known = known.as_ref().map(|(p, l)| (p.as_str(), *l));
        match probe_runsc(&path, known, image, state_dir, bundles_dir).await {
            Ok(runsc) => {
                let cache = ProbeCache {
                    path: runsc.path.clone(),
                    digest: runsc.digest.clone(),
                    platform: runsc.platform.clone(),
                    leave_running: Some(runsc.leave_running),
                    restore_into_created: Some(runsc.restore_into_created),
                    network: Some(runsc.network),
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
                return Ok(runsc);
            }
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    Err(Error::unsupported(format!(
        "no runsc here can run a sandbox ({}); {INSTALL_HINT}",
        failures.join("; ")
    )))
}
