//! Sandboxes created ahead of time: `runsc create` starts a sandbox's processes (the sentry, its
//! gofer, their seccomp filters) without loading anything into them, and a restore then pays only
//! `runsc restore --detach` into one of them. A restore needs a sandbox whose spec matches the
//! snapshot's exactly, so they are kept per image and memory size; a few at most, made again in
//! the background after each use.
//!
//! Such sandboxes are not our children once `runsc create` returns (their parent is gone), so
//! they are watched through a pidfd and their memory cgroup, and a small watchdog process deletes
//! them if the engine dies without doing so.

use std::collections::{HashSet, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{ChildStdin, ChildStdout, Command};

use super::bundle::{check_finished, remove_sandbox, spawn_runsc, write_bundle};
use super::runsc::{Runsc, global_args};
use crate::error::{Error, Result};
use crate::guest::image::Image;
use crate::sync::lock;

/// How long `runsc create` or `runsc restore --detach` may take before the attempt is given up.
const RUNSC_STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a replacement waits before it is created: the restore that used a sandbox and the
/// instruction after it get the host's cores first.
const REPLENISH_DELAY: Duration = Duration::from_millis(100);

/// The host processes of a sandbox that is not our child.
pub(super) struct Detached {
    /// The sandbox (`runsc boot`): the agent and all the machine's memory are in it.
    pub pid: u32,
    /// Its gofer, where runsc's state names one.
    pub gofer: Option<u32>,
    /// Readable once the sandbox process has exited (`None` where the kernel has no pidfds:
    /// `/proc` is asked instead).
    pidfd: Option<OwnedFd>,
    /// The sandbox's memory cgroup counter of OOM kills (`memory.oom_control` on cgroup v1,
    /// `memory.events` on v2), read when the sandbox ends to say why.
    oom_counter: Option<PathBuf>,
}

impl Detached {
    /// Watches the sandbox of a container just created: its pid from `pid_file`, its gofer from
    /// runsc's state in `state_dir`.
    fn watch(pid_file: &Path, state_dir: &Path, id: &str) -> Result<Self> {
        let text = std::fs::read_to_string(pid_file)
            .map_err(|e| Error::crashed(format!("runsc create wrote no pid file ({e})")))?;
        let pid: u32 = text.trim().parse().map_err(|_| {
            Error::crashed(format!("runsc create wrote {text:?} as the sandbox's pid"))
        })?;
        Ok(Self {
            pid,
            gofer: gofer_pid(state_dir, id),
            pidfd: pidfd_open(pid),
            oom_counter: memory_cgroup_oom_counter(pid),
        })
    }

    /// Whether the sandbox process has exited.
    pub fn exited(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut poll = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd that lives across the call; timeout 0 never blocks.
                let ready = unsafe { libc::poll(&raw mut poll, 1, 0) };
                ready > 0 && poll.revents & libc::POLLIN != 0
            }
            None => {
                std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).map_or(true, |stat| {
                    // The state follows the command name's closing parenthesis.
                    stat.rsplit_once(')')
                        .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
                })
            }
        }
    }

    /// Kills the sandbox process at once (runsc's own clean-up follows separately).
    pub fn kill(&self) {
        if let Some(fd) = &self.pidfd {
            // SAFETY: pidfd_send_signal takes a pidfd we own, a signal number and no siginfo;
            // it touches no memory of ours. A process that is gone only makes it fail.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }

    /// Why the sandbox ended, once it has: its cgroup says whether the kernel killed it for
    /// memory; its exit status is its former parent's to read, not ours.
    pub fn exit_reason(&self, memory_mb: u32) -> Option<crate::sandbox::ExitReason> {
        if !self.exited() {
            return None;
        }
        let oom_kills = self
            .oom_counter
            .as_deref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            });
        let text = match oom_kills {
            Some(n) if n > 0 => format!(
                "the sandbox was killed: its memory went past the limit ({memory_mb} MB and \
                 {} MB for the sandbox itself)",
                super::bundle::BACKSTOP_EXTRA_MB
            ),
            Some(_) => "the sandbox ended (its interpreter exited, or it was stopped)".to_owned(),
            None => "the sandbox ended (its memory went past the limit, its interpreter exited, \
                     or it was stopped)"
                .to_owned(),
        };
        Some(crate::sandbox::ExitReason { text })
    }
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it touches
    // no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The gofer's pid from runsc's state file (`<state>/<id>_sandbox:<id>.state`): best effort, it
/// only counts the gofer's memory in the machine's.
fn gofer_pid(state_dir: &Path, id: &str) -> Option<u32> {
    let text = std::fs::read(state_dir.join(format!("{id}_sandbox:{id}.state"))).ok()?;
    let state: serde_json::Value = serde_json::from_slice(&text).ok()?;
    state
        .get("goferPid")
        .and_then(serde_json::Value::as_u64)
        .and_then(|pid| u32::try_from(pid).ok())
        .filter(|pid| *pid > 0)
}

/// The file that counts OOM kills in the memory cgroup `pid` is in.
fn memory_cgroup_oom_counter(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            let file = Path::new("/sys/fs/cgroup/memory")
                .join(path.trim_start_matches('/'))
                .join("memory.oom_control");
            return file.is_file().then_some(file);
        }
        if hierarchy == "0" && controllers.is_empty() {
            unified = Some(
                Path::new("/sys/fs/cgroup")
                    .join(path.trim_start_matches('/'))
                    .join("memory.events"),
            );
        }
    }
    unified.filter(|file| file.is_file())
}

/// A created sandbox waiting for a restore, with the pipes that are its stdin and stdout.
pub(super) struct Created {
    pub id: String,
    pub bundle: PathBuf,
    pub image_id: String,
    pub memory_mb: u32,
    pub reader: ChildStdout,
    pub writer: ChildStdin,
    pub processes: Detached,
}

/// `runsc create` for a bundle already written: the sandbox's stdin and stdout are pipes to us.
pub(super) async fn create(
    runsc: &Runsc,
    state_dir: &Path,
    bundle: &Path,
    id: &str,
) -> Result<(ChildStdout, ChildStdin, Detached)> {
    let pid_file = bundle.join("pid");
    let mut child = spawn_runsc(
        runsc,
        state_dir,
        bundle,
        &[
            "create".to_owned(),
            format!("--pid-file={}", pid_file.display()),
        ],
        id,
        false,
    )?;
    let (Some(reader), Some(writer)) = (child.stdout.take(), child.stdin.take()) else {
        let _ = child.kill().await;
        return Err(Error::internal("runsc create has no stdio pipes"));
    };
    let status = match tokio::time::timeout(RUNSC_STEP_TIMEOUT, child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(Error::internal(format!("waiting for runsc create: {e}"))),
        Err(_) => {
            let _ = child.kill().await;
            return Err(Error::crashed(format!(
                "runsc create did not finish within {} s",
                RUNSC_STEP_TIMEOUT.as_secs()
            )));
        }
    };
    if !status.success() {
        let log = std::fs::read_to_string(bundle.join("runsc.log")).unwrap_or_default();
        return Err(Error::crashed(format!(
            "runsc create failed ({status}): {}",
            log.lines().last().unwrap_or("").trim()
        )));
    }
    crate::sandbox::widen_pipe(&reader);
    let processes = Detached::watch(&pid_file, state_dir, id)?;
    Ok((reader, writer, processes))
}

/// `runsc restore --detach` of the snapshot in `images` into the created container `id`.
pub(super) async fn restore_detached(
    runsc: &Runsc,
    state_dir: &Path,
    bundle: &Path,
    id: &str,
    images: &Path,
) -> Result<()> {
    let restore = Command::new(&runsc.path)
        .args(global_args(runsc, state_dir))
        .arg("restore")
        .arg("--detach")
        .arg(format!("--image-path={}", images.display()))
        .arg(format!("--bundle={}", bundle.display()))
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(RUNSC_STEP_TIMEOUT, restore)
        .await
        .map_err(|_| {
            Error::crashed(format!(
                "runsc restore did not finish within {} s",
                RUNSC_STEP_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| Error::internal(format!("cannot run runsc restore: {e}")))?;
    check_finished("runsc restore", &output)
}

/// The kind of sandbox a snapshot can be restored into.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Shape {
    image_id: String,
    memory_mb: u32,
}

/// The created sandboxes of one engine.
pub(super) struct Precreated {
    runsc: Runsc,
    state_dir: PathBuf,
    bundles_dir: PathBuf,
    /// This engine's created sandboxes are named `<prefix><n>`: the watchdog deletes those and
    /// only those (another engine may already use the home when it runs).
    prefix: String,
    next: AtomicU64,
    /// At most this many wait at once (0: none are made).
    capacity: usize,
    /// Oldest first.
    ready: Mutex<VecDeque<Created>>,
    creating: Mutex<HashSet<Shape>>,
    /// Told whenever a creation ends (for [`Precreated::clear`] to wait on).
    created_or_failed: tokio::sync::Notify,
    /// Set by [`Precreated::clear`]: nothing is made after it.
    closed: AtomicBool,
    /// The watchdog's stdin: it acts when this closes, that is when the engine is gone.
    watchdog: Mutex<Option<ChildStdin>>,
}

/// The watchdog: a shell that waits for its stdin to close (the engine is gone), then kills
/// the processes of the sandboxes this engine created (their bundles, `.../<prefix>N`, are on
/// their command lines; the pattern is bracketed so that grep does not find itself, and the
/// watchdog's own arguments hold the prefix without the slash) and deletes runsc's state of them.
/// It sweeps twice: a `runsc create` cut short by the engine's death may leave its sandbox a
/// moment later. Arguments: the prefix (`pre-...`), then the runsc command.
const WATCHDOG: &str = r#"prefix=$1; pin=$2; shift 2
read -r _
sweep() {
  grep -l -s -e "/[p]${prefix#p}" /proc/[0-9]*/cmdline |
    while IFS=/ read -r _ _ pid _; do kill -9 "$pid" 2>/dev/null; done
  "$@" list --quiet 2>/dev/null | while read -r id; do
    case $id in "$prefix"*) "$@" delete --force "$id" >/dev/null 2>&1 ;; esac
  done
}
sweep "$@"; sleep 1; sweep "$@"
i=0; while [ $i -lt 64 ] && umount -l "$pin" 2>/dev/null; do i=$((i+1)); done"#;

impl Precreated {
    /// Keeps up to `capacity` created sandboxes of `runsc` (0: none, and no watchdog).
    pub fn new(runsc: Runsc, state_dir: PathBuf, bundles_dir: PathBuf, capacity: usize) -> Self {
        use rand::Rng;
        let instance: u32 = rand::rng().random();
        let prefix = format!("pre-{instance:08x}-");
        let watchdog = if capacity > 0 {
            spawn_watchdog(&runsc, &state_dir, &prefix)
        } else {
            None
        };
        Self {
            runsc,
            state_dir,
            bundles_dir,
            prefix,
            next: AtomicU64::new(0),
            capacity: if watchdog.is_some() { capacity } else { 0 },
            ready: Mutex::new(VecDeque::new()),
            creating: Mutex::new(HashSet::new()),
            created_or_failed: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            watchdog: Mutex::new(watchdog),
        }
    }

    /// Whether sandboxes are created ahead of time (the runsc can restore into them, the
    /// engine keeps some, and the watchdog runs).
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// A created sandbox for `image_id` and `memory_mb`, if one is waiting (and still alive).
    pub fn take(self: &Arc<Self>, image_id: &str, memory_mb: u32) -> Option<Created> {
        let (found, dead) = {
            let mut ready = lock(&self.ready);
            let (alive, dead): (VecDeque<Created>, VecDeque<Created>) =
                ready.drain(..).partition(|c| !c.processes.exited());
            *ready = alive;
            let found = ready
                .iter()
                .position(|c| c.image_id == image_id && c.memory_mb == memory_mb)
                .and_then(|index| ready.remove(index));
            (found, dead)
        };
        for created in dead {
            tracing::info!(
                sandbox = created.id,
                "a created sandbox had ended; removing it"
            );
            self.discard(created);
        }
        found
    }

    /// Makes sure a sandbox for `image` and `memory_mb` is waiting, or soon will be: created in
    /// the background (after [`REPLENISH_DELAY`]), the oldest other one removed if the engine
    /// keeps as many as it may.
    pub fn replenish(self: &Arc<Self>, image: Image, memory_mb: u32) {
        if self.capacity == 0 || self.closed.load(Ordering::SeqCst) {
            return;
        }
        let shape = Shape {
            image_id: image.id.clone(),
            memory_mb,
        };
        let waiting = lock(&self.ready)
            .iter()
            .any(|c| c.image_id == shape.image_id && c.memory_mb == memory_mb);
        if waiting || !lock(&self.creating).insert(shape.clone()) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(REPLENISH_DELAY).await;
            let made = this.create(&image, memory_mb).await;
            match made {
                Ok(created) if this.closed.load(Ordering::SeqCst) => {
                    this.delete(created).await;
                }
                Ok(created) => {
                    let evicted = {
                        let mut ready = lock(&this.ready);
                        let evicted = if ready.len() >= this.capacity {
                            ready.pop_front()
                        } else {
                            None
                        };
                        ready.push_back(created);
                        evicted
                    };
                    if let Some(evicted) = evicted {
                        this.discard(evicted);
                    }
                }
                Err(e) => tracing::warn!("could not create a sandbox ahead of time: {e}"),
            }
            lock(&this.creating).remove(&shape);
            this.created_or_failed.notify_waiters();
        });
    }

    async fn create(&self, image: &Image, memory_mb: u32) -> Result<Created> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::internal("the engine is shutting down"));
        }
        // Of one width: runsc takes an id that is the prefix of others as ambiguous (`pre-..-1`
        // beside `pre-..-14` made a checkpoint fail under load).
        let id = format!(
            "{}{:012}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let bundle = write_bundle(&self.bundles_dir, &id, image, memory_mb, None)?;
        match create(&self.runsc, &self.state_dir, &bundle, &id).await {
            Ok((reader, writer, processes)) => Ok(Created {
                id,
                bundle,
                image_id: image.id.clone(),
                memory_mb,
                reader,
                writer,
                processes,
            }),
            Err(e) => {
                remove_sandbox(&self.runsc, &self.state_dir, &id, &bundle).await;
                Err(e)
            }
        }
    }

    /// Deletes a created sandbox in the background.
    pub fn discard(self: &Arc<Self>, created: Created) {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.delete(created).await });
    }

    async fn delete(&self, created: Created) {
        created.processes.kill();
        remove_sandbox(&self.runsc, &self.state_dir, &created.id, &created.bundle).await;
    }

    /// Deletes every waiting sandbox, and those being made once they are (at shutdown); none
    /// are made after this.
    pub async fn clear(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Each creation ends within its runsc step timeout: wait at most that long in all.
        let _ = tokio::time::timeout(RUNSC_STEP_TIMEOUT, async {
            loop {
                let ended = self.created_or_failed.notified();
                if lock(&self.creating).is_empty() {
                    break;
                }
                ended.await;
            }
        })
        .await;
        let waiting: Vec<Created> = lock(&self.ready).drain(..).collect();
        for created in waiting {
            self.delete(created).await;
        }
        // Closing its stdin lets the watchdog sweep what is left and exit.
        lock(&self.watchdog).take();
    }
}

impl Drop for Precreated {
    /// An engine dropped without [`Precreated::clear`]: the waiting sandboxes are killed at
    /// once (the watchdog removes runsc's state of them).
    fn drop(&mut self) {
        if let Ok(ready) = self.ready.get_mut() {
            for created in ready.iter() {
                created.processes.kill();
            }
        }
    }
}

/// Starts the watchdog (its own process group, so that a Ctrl-C meant for the engine does not
/// stop it before it has swept). `None` (and so no created sandboxes) where it cannot start.
fn spawn_watchdog(runsc: &Runsc, state_dir: &Path, prefix: &str) -> Option<ChildStdin> {
    let spawned = Command::new("/bin/sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("evervm-watchdog")
        .arg(prefix)
        .arg(super::null_netns(state_dir))
        .arg(&runsc.path)
        .args(global_args(runsc, state_dir))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(false)
        .spawn();
    match spawned {
        Ok(mut child) => child.stdin.take(),
        Err(e) => {
            tracing::warn!("no sandboxes are created ahead of time: cannot start /bin/sh ({e})");
            None
        }
    }
}
