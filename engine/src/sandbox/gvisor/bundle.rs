//! A sandbox's OCI bundle and the `runsc` processes that run, restore and delete it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::process::{Child, Command};

use super::runsc::{Runsc, global_args};
use crate::error::{Error, Result};
use crate::guest::ROOT_HELPER_FLAG;
use crate::guest::image::{AGENT_PATH, Image, MACHINE_UID, MPLCONFIGDIR, NSSWITCH_CONF_WITH_DNS};

/// The part of the cgroup limit above `memory_mb`: the sentry, its page tables and buffers.
pub(super) const BACKSTOP_EXTRA_MB: u64 = 192;

/// Stops and deletes a container, retrying: after a kill under load runsc can still list it.
pub(super) async fn delete_container(runsc: &Runsc, state_dir: &Path, id: &str) {
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

/// Deletes a sandbox's container and its bundle.
pub(super) async fn remove_sandbox(runsc: &Runsc, state_dir: &Path, id: &str, bundle: &Path) {
    delete_container(runsc, state_dir, id).await;
    let _ = tokio::fs::remove_dir_all(bundle).await;
}

/// Checks what a runsc command that has finished (`what`: "runsc checkpoint") reported.
pub(super) fn check_finished(what: &str, output: &std::process::Output) -> Result<()> {
    if output.status.success() {
        return Ok(());
    }
    Err(Error::crashed(format!(
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// What root inside a sandbox may do (a container's usual set; never `CAP_SYS_ADMIN`, `NET_ADMIN`
/// or `NET_RAW`). The agent drops them all when it becomes the machine's user; `sudo` gets them
/// through the agent's root helper.
const ROOT_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
];

/// The OCI runtime spec of one sandbox.
pub(super) fn bundle_spec(image: &Image, memory_mb: u32) -> serde_json::Value {
    let home = image.home();
    let address_space = u64::from(memory_mb) * 1024 * 1024;
    let backstop = (u64::from(memory_mb) + BACKSTOP_EXTRA_MB) * 1024 * 1024;
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        format!("HOME={home}"),
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
        // Each thread's own arena would reserve 64 MiB of address space, which RLIMIT_AS
        // counts: a few threads (IPython's, the agent's) would take a 512 MiB machine's room.
        "MALLOC_ARENA_MAX=2".to_owned(),
        "OMP_NUM_THREADS=1".to_owned(),
        // The agent answers health checks here (its own network stack: see `health.py`).
        format!("EVERVM_HEALTH_PORT={}", crate::guest::HEALTH_PORT),
    ];
    // Older OpenBLAS builds need these on some processors to compute right.
    for key in ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"] {
        if let Ok(value) = std::env::var(key) {
            env.push(format!("{key}={value}"));
        }
    }
    // The agent starts as root only to keep a root helper for `sudo` (images since it has one).
    let (uid, args, capabilities) = if image.has_root_helper() {
        let uid = MACHINE_UID.to_string();
        let args = vec!["/usr/bin/python3", "-I", AGENT_PATH, ROOT_HELPER_FLAG];
        let args: Vec<String> = args.into_iter().map(str::to_owned).chain([uid]).collect();
        (0, args, ROOT_CAPABILITIES)
    } else {
        let args = ["/usr/bin/python3", "-I", AGENT_PATH]
            .map(str::to_owned)
            .to_vec();
        (MACHINE_UID, args, &[][..])
    };
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": uid},
            "args": args,
            "env": env,
            "cwd": home,
            "capabilities": {
                "bounding": capabilities, "effective": capabilities, "inheritable": [],
                "permitted": capabilities, "ambient": []
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

/// Writes a sandbox's bundle; returns its directory. With `netns`, the sandbox joins that
/// network namespace (its veth is gVisor's) and resolves names with the machine's DNS server.
pub(super) fn write_bundle(
    bundles_dir: &Path,
    id: &str,
    image: &Image,
    memory_mb: u32,
    netns: Option<&Path>,
) -> Result<PathBuf> {
    let dir = bundles_dir.join(id);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    let mut spec = bundle_spec(image, memory_mb);
    if let Some(netns) = netns {
        let files = [
            ("resolv.conf", crate::network::MachineNetwork::resolv_conf()),
            ("nsswitch.conf", NSSWITCH_CONF_WITH_DNS.to_owned()),
        ];
        for (name, text) in files {
            let source = dir.join(name);
            std::fs::write(&source, text)
                .map_err(|e| Error::internal(format!("cannot write a bundle: {e}")))?;
            if let Some(mounts) = spec["mounts"].as_array_mut() {
                mounts.push(json!({
                    "destination": format!("/etc/{name}"), "type": "bind",
                    "source": source, "options": ["bind", "ro"]
                }));
            }
        }
        if let Some(namespaces) = spec["linux"]["namespaces"].as_array_mut() {
            for namespace in namespaces.iter_mut() {
                if namespace["type"] == "network" {
                    namespace["path"] = json!(netns);
                }
            }
        }
    }
    let spec = serde_json::to_vec_pretty(&spec)
        .map_err(|e| Error::internal(format!("cannot encode a bundle: {e}")))?;
    std::fs::write(dir.join("config.json"), spec)
        .map_err(|e| Error::internal(format!("cannot write a bundle: {e}")))?;
    Ok(dir)
}

/// Starts `runsc run` for a bundle, with the container's stdin and stdout piped to us.
pub(super) fn spawn_run(runsc: &Runsc, state_dir: &Path, bundle: &Path, id: &str) -> Result<Child> {
    spawn_runsc(runsc, state_dir, bundle, &["run".to_owned()], id, false)
}

/// runsc's network flag for a sandbox: its own netstack on the namespace's veth, or only
/// loopback.
pub(super) fn network_flag(networked: bool) -> &'static str {
    if networked {
        "--network=sandbox"
    } else {
        "--network=none"
    }
}

/// Starts `runsc <command...> --bundle=B ID` (`run`, or `restore --image-path=...`), with the
/// container's stdin and stdout piped to us.
pub(super) fn spawn_runsc(
    runsc: &Runsc,
    state_dir: &Path,
    bundle: &Path,
    command_args: &[String],
    id: &str,
    networked: bool,
) -> Result<Child> {
    let log = std::fs::File::create(bundle.join("runsc.log"))
        .map_err(|e| Error::internal(format!("cannot create a sandbox log: {e}")))?;
    let mut command = Command::new(&runsc.path);
    command
        .args(global_args(runsc, state_dir))
        .arg(network_flag(networked))
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
