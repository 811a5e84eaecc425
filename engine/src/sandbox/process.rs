//! The process backend: the agent in a plain `python3` child, confined with Linux namespaces.
//!
//! The child runs as the unprivileged user `nobody` when the engine runs as root, inside new
//! user, pid, mount, network, IPC and UTS namespaces (made by util-linux `unshare`): it has no
//! network but a downed `lo`, sees only its own processes, and its address space is limited by
//! `RLIMIT_AS` from `memory_mb`, so an allocation past the limit raises `MemoryError`. Each machine
//! gets a private working directory (also its `HOME`).
//!
//! This is a fallback for development hosts without gVisor. The child shares the host kernel and
//! sees the host's file system with the rights of `nobody`: it is **not** a boundary for hostile
//! code. It cannot snapshot, so its state lives only as long as the process.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;
use tokio::process::{Child, Command};

use super::{Capabilities, Sandbox, SandboxBackend, SandboxSpec};
use crate::error::{Error, Result};
use crate::guest::AGENT_SOURCE;
use crate::guest::connection::{ChannelReader, ChannelWriter};

/// The uid and gid of `nobody`, used for machines when the engine runs as root.
const NOBODY: u32 = 65534;

/// Settings of the process backend.
#[derive(Debug, Clone)]
pub struct ProcessBackendConfig {
    /// The Python interpreter to run the agent with.
    pub python: PathBuf,
    /// util-linux `unshare`.
    pub unshare: PathBuf,
    /// Where the machines' working directories live.
    pub work_root: PathBuf,
}

impl ProcessBackendConfig {
    /// Finds `python3` and `unshare`, preferring the system interpreter over shims.
    pub fn detect(work_root: PathBuf) -> Result<Self> {
        let python = std::env::var_os("EVERVM_PYTHON")
            .map(PathBuf::from)
            .or_else(|| {
                ["/usr/bin/python3", "/usr/local/bin/python3"]
                    .iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
            })
            .or_else(|| find_on_path("python3"))
            .ok_or_else(|| {
                Error::unsupported(
                    "the process backend needs python3: install it (apt-get install python3) \
                     or set EVERVM_PYTHON",
                )
            })?;
        let unshare = ["/usr/bin/unshare", "/bin/unshare"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .or_else(|| find_on_path("unshare"))
            .ok_or_else(|| {
                Error::unsupported(
                    "the process backend needs `unshare`: install util-linux (apt-get install util-linux)",
                )
            })?;
        Ok(Self {
            python,
            unshare,
            work_root,
        })
    }
}

pub(crate) fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// util-linux `unshare`'s arguments for a machine's namespaces (user, pid, mount, network, IPC,
/// UTS), its pid 1 a child that dies with it.
pub(crate) const NAMESPACE_ARGS: [&str; 10] = [
    "--user",
    "--map-root-user",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
    "--net",
    "--ipc",
    "--uts",
    "--mount",
];

/// The process backend.
#[derive(Debug)]
pub struct ProcessBackend {
    config: ProcessBackendConfig,
    run_as_nobody: bool,
    /// The agent's program, as a file every sandbox runs (it is longer than one argument may be).
    agent_file: PathBuf,
}

impl ProcessBackend {
    pub fn new(config: ProcessBackendConfig) -> Result<Self> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let run_as_nobody = unsafe { libc::geteuid() } == 0;
        std::fs::create_dir_all(&config.work_root).map_err(|e| {
            Error::internal(format!("cannot create {}: {e}", config.work_root.display()))
        })?;
        if run_as_nobody {
            // The sandbox user must be able to reach its own directory below this one.
            std::fs::set_permissions(&config.work_root, std::fs::Permissions::from_mode(0o711))?;
        }
        // Named by its content, so that engines of different versions sharing a root never run
        // each other's agent.
        use sha2::Digest as _;
        let digest = hex::encode(sha2::Sha256::digest(AGENT_SOURCE));
        let agent_file = config
            .work_root
            .join(format!(".agent-{}.py", &digest[..16]));
        if !agent_file.is_file() {
            crate::fsutil::write_durably(&agent_file, AGENT_SOURCE.as_bytes())?;
        }
        std::fs::set_permissions(&agent_file, std::fs::Permissions::from_mode(0o644))?;
        Ok(Self {
            config,
            run_as_nobody,
            agent_file,
        })
    }

    fn work_dir(&self, id: &str) -> PathBuf {
        self.config.work_root.join(id)
    }

    fn prepare_work_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        if self.run_as_nobody {
            std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY))?;
        }
        Ok(())
    }
}

#[async_trait]
impl SandboxBackend for ProcessBackend {
    fn name(&self) -> &'static str {
        "process"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshots: false,
            save_in_place: false,
            network: false,
        }
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        let work_dir = self.work_dir(&spec.id);
        self.prepare_work_dir(&work_dir)?;
        let memory_bytes = u64::from(spec.memory_mb) * 1024 * 1024;

        let mut command = Command::new(&self.config.unshare);
        command
            .args(NAMESPACE_ARGS)
            .arg("--")
            .arg(&self.config.python)
            .arg("-I")
            .arg(&self.agent_file)
            .current_dir(&work_dir)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &work_dir)
            .env("LANG", "C.UTF-8")
            .env("PYTHONIOENCODING", "utf-8")
            .env("MPLBACKEND", "Agg")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if self.run_as_nobody {
            command.uid(NOBODY).gid(NOBODY);
        }
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls (setrlimit, prctl) on plain stack values.
        unsafe {
            command.pre_exec(move || {
                let address_space = libc::rlimit {
                    rlim_cur: memory_bytes,
                    rlim_max: memory_bytes,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &raw const address_space) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let no_core = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &raw const no_core);
                // If the engine dies, the sandbox dies with it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|e| {
            Error::crashed(format!(
                "cannot start {}: {e}",
                self.config.unshare.display()
            ))
        })?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            let _ = child.kill().await;
            return Err(Error::internal("the sandbox process has no stdio pipes"));
        };
        super::widen_pipe(&stdout);
        Ok(Box::new(ProcessSandbox {
            child,
            channel: Some((Box::new(stdout), Box::new(stdin))),
            work_dir,
        }))
    }
}

struct ProcessSandbox {
    child: Child,
    channel: Option<(ChannelReader, ChannelWriter)>,
    work_dir: PathBuf,
}

#[async_trait]
impl Sandbox for ProcessSandbox {
    fn take_channel(&mut self) -> Option<(ChannelReader, ChannelWriter)> {
        self.channel.take()
    }

    async fn kill(&mut self) -> Result<()> {
        // Killing `unshare` makes it kill the namespace's init (--kill-child), and with it every
        // process in the pid namespace.
        let killed = match self.child.kill().await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
            Err(e) => Err(Error::internal(format!("cannot kill the sandbox: {e}"))),
        };
        match tokio::fs::remove_dir_all(&self.work_dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("cannot remove {}: {e}", self.work_dir.display()),
        }
        killed
    }

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    fn exit_reason(&mut self) -> Option<super::ExitReason> {
        use std::os::unix::process::ExitStatusExt;
        let status = self.child.try_wait().ok().flatten()?;
        let text = match (status.code(), status.signal()) {
            (_, Some(libc::SIGKILL)) => {
                "the sandbox was killed by signal 9 (most likely out of memory)".to_owned()
            }
            (_, Some(signal)) => format!("the sandbox was killed by signal {signal}"),
            (Some(code), None) => format!("the sandbox exited with status {code}"),
            (None, None) => "the sandbox ended".to_owned(),
        };
        Some(super::ExitReason { text })
    }
}
