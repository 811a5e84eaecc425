//! Faults on gVisor, made on purpose: a runsc that fails its checkpoint (and one that stops the
//! sandbox while failing), a full disk, a snapshot that cannot be committed, deletes in the
//! middle of forks and checkpoints. Each ends in a clear error, and a machine either keeps its
//! state or its next instruction says what was lost.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use evervm::engine::{
    Account, CreateMachine, Durability, Engine, EngineConfig, ErrorKind, ExecEvent, ExecRequest,
    ExecResult, Hook, MachineState, Outcome, OutputStream,
};
use evervm_tests::backends;
use futures::StreamExt;

fn gvisor_available() -> bool {
    if backends().iter().any(|b| b == "gvisor") {
        return true;
    }
    eprintln!("skipping: the gVisor backend is not available here");
    false
}

/// The runsc the engines of these tests use (`EVERVM_RUNSC`, else the newest that
/// `scripts/runsc.sh` built, else the one found last) and its platform, from the probe cache
/// every gVisor engine keeps; `runsc` on the PATH on ptrace otherwise.
fn real_runsc() -> (PathBuf, String) {
    let built = || {
        let dir = evervm::engine::guest::image::default_cache_dir().join("runsc");
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path().join("runsc"))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        found.pop()
    };
    let configured = std::env::var_os("EVERVM_RUNSC")
        .map(PathBuf::from)
        .or_else(built);
    let cache = evervm::engine::guest::image::default_cache_dir().join("runsc-probe.json");
    // Copies of runsc that other tests made in temporary directories don't count.
    let cached: Option<(PathBuf, String)> = std::fs::read(cache).ok().and_then(|bytes| {
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&bytes).ok()?;
        entries.iter().find_map(|e| {
            let path = PathBuf::from(e["path"].as_str()?);
            if path.starts_with(std::env::temp_dir())
                || configured.as_ref().is_some_and(|c| *c != path)
            {
                return None;
            }
            Some((path, e["platform"].as_str()?.to_owned()))
        })
    });
    cached.unwrap_or_else(|| (PathBuf::from("runsc"), "ptrace".to_owned()))
}

/// A runsc wrapper whose `checkpoint` fails on demand: while `<dir>/checkpoint` holds `keep`
/// it fails before doing anything (the sandbox runs on); `stop` checkpoints into a throwaway
/// directory (which stops the sandbox) and then fails. Everything else goes to the real runsc.
struct FaultyRunsc {
    dir: tempfile::TempDir,
}

impl FaultyRunsc {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (real, _) = real_runsc();
        let script = format!(
            r#"#!/bin/bash
control={control}
mode=$(cat "$control/checkpoint" 2>/dev/null)
checkpoint=0
for a in "$@"; do [ "$a" = checkpoint ] && checkpoint=1; done
if [ $checkpoint = 1 ] && [ "$mode" = keep ]; then
    echo "checkpoint refused by the test" >&2
    exit 1
fi
if [ $checkpoint = 1 ] && [ "$mode" = stop ]; then
    args=()
    for a in "$@"; do
        case "$a" in
            --image-path=*) args+=("--image-path=$control/throwaway") ;;
            *) args+=("$a") ;;
        esac
    done
    mkdir -p "$control/throwaway"
    {real} "${{args[@]}}" >/dev/null 2>&1
    echo "checkpoint failed after stopping the sandbox (the test)" >&2
    exit 1
fi
exec {real} "$@"
"#,
            control = dir.path().display(),
            real = real.display()
        );
        let path = dir.path().join("runsc");
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("runsc")
    }

    fn set(&self, mode: &str) {
        std::fs::write(self.dir.path().join("checkpoint"), mode).unwrap();
    }
}

fn config(home: &Path) -> EngineConfig {
    let mut config = crate::gvisor_config(home);
    config.pool_size = 0;
    if std::env::var_os("EVERVM_IMAGES").is_none() {
        config.images_dir = evervm::engine::guest::image::default_cache_dir().join("images");
    }
    config
}

fn faulty_config(home: &Path, runsc: &FaultyRunsc) -> EngineConfig {
    let mut config = config(home);
    config.runsc = Some(runsc.path());
    config.runsc_platform = Some(real_runsc().1);
    config
}

/// A gVisor engine on a fresh home with the account `test`; `None` where gVisor is missing.
async fn gvisor_engine() -> Option<(tempfile::TempDir, Engine, Account)> {
    if !gvisor_available() {
        return None;
    }
    let home = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(home.path())).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    Some((home, engine, account))
}

async fn machine(engine: &Engine, account: &Account, options: CreateMachine) -> String {
    engine
        .create_machine(account, options)
        .await
        .unwrap()
        .name
        .to_string()
}

/// Runs `code` and returns its result and its stderr lines.
async fn run(
    engine: &Engine,
    account: &Account,
    name: &str,
    code: &str,
) -> (ExecResult, Vec<String>) {
    let seq = engine
        .exec(account, name, ExecRequest::new(code))
        .await
        .unwrap()
        .seq;
    let events: Vec<ExecEvent> = engine
        .events(account, name, seq)
        .await
        .unwrap()
        .collect()
        .await;
    let mut stderr = Vec::new();
    let mut result = None;
    for event in events {
        match event {
            ExecEvent::Output(c) if c.stream == OutputStream::Stderr => stderr.push(c.data),
            ExecEvent::Output(_) => {}
            ExecEvent::Result(r) => result = Some(r),
        }
    }
    (result.unwrap(), stderr)
}

async fn value(engine: &Engine, account: &Account, name: &str, code: &str) -> String {
    let (result, _) = run(engine, account, name, code).await;
    match result.outcome {
        Outcome::Value(v) => v.unwrap_or_default(),
        Outcome::Error { text, .. } => panic!("{code:?} failed: {text}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_checkpoint_leaves_the_machine_running_with_its_state() {
    if !gvisor_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let runsc = FaultyRunsc::new();
    let engine = Engine::open(faulty_config(home.path(), &runsc))
        .await
        .unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "x = 41").await;

    runsc.set("keep");
    let failed = engine.swap_out(&account, &name).await.unwrap_err();
    assert!(failed.message().contains("checkpoint"), "{failed}");
    let info = engine.machine_info(&account, &name).await.unwrap();
    assert_eq!(info.state, MachineState::Resident);
    let shown = info.last_error.unwrap_or_default();
    assert!(shown.contains("could not save the machine"), "{shown}");
    // Nothing was lost, and nothing says so.
    let (result, stderr) = run(&engine, &account, &name, "x + 1").await;
    assert_eq!(result.outcome, Outcome::Value(Some("42".to_owned())));
    assert!(stderr.is_empty(), "{stderr:?}");

    // `durability = instruction`: a save that fails is reported as not saved.
    let durable = machine(
        &engine,
        &account,
        CreateMachine {
            durability: Some(Durability::Instruction),
            ..CreateMachine::default()
        },
    )
    .await;
    let (result, stderr) = run(&engine, &account, &durable, "n = 1").await;
    assert_eq!(result.saved, Some(false), "{result:?}");
    assert!(
        stderr.iter().any(|l| l.contains("could not be saved")),
        "{stderr:?}"
    );
    assert_eq!(value(&engine, &account, &durable, "n").await, "1");

    runsc.set("off");
    engine.swap_out(&account, &name).await.unwrap();
    let info = engine.machine_info(&account, &name).await.unwrap();
    assert_eq!(info.state, MachineState::Swapped);
    assert_eq!(info.last_error, None);
    assert_eq!(value(&engine, &account, &name, "x + 1").await, "42");
    let (result, _) = run(&engine, &account, &durable, "n + 1").await;
    assert_eq!(result.saved, Some(true), "{result:?}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_that_stops_the_sandbox_says_what_was_lost() {
    if !gvisor_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let runsc = FaultyRunsc::new();
    let engine = Engine::open(faulty_config(home.path(), &runsc))
        .await
        .unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "x = 1").await;
    engine.swap_out(&account, &name).await.unwrap();
    value(&engine, &account, &name, "y = 2").await;

    runsc.set("stop");
    engine.swap_out(&account, &name).await.unwrap_err();
    let info = engine.machine_info(&account, &name).await.unwrap();
    let shown = info.last_error.unwrap_or_default();
    assert!(shown.contains("swap-out failed"), "{shown}");
    runsc.set("off");
    // The next instruction says that it came back from the last snapshot, and it did.
    let (result, stderr) = run(&engine, &account, &name, "[x, 'y' in globals()]").await;
    assert_eq!(
        result.outcome,
        Outcome::Value(Some("[1, False]".to_owned()))
    );
    assert!(
        stderr.first().is_some_and(|l| l
            .starts_with("[evervm] this machine's sandbox stopped (a swap-out failed")
            && l.contains("restored from its snapshot")),
        "{stderr:?}"
    );
    engine.shutdown().await;
}

/// A small file system of its own (tmpfs), unmounted when dropped; `None` where mounting is
/// not allowed (not root).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(megabytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if mounted {
            Some(Self { dir })
        } else {
            eprintln!("skipping: cannot mount a tmpfs here (needs root)");
            None
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn filler(&self) -> PathBuf {
        self.dir.path().join("filler")
    }

    /// Fills the disk until at most `leave` bytes are free.
    fn fill(&self, leave: u64) {
        fill(self.dir.path(), leave);
    }

    fn free(&self) {
        let _ = std::fs::remove_file(self.filler());
    }
}

/// Writes `<root>/filler` until the file system holding `root` has at most `leave` bytes free.
fn fill(root: &Path, leave: u64) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("filler"))
        .unwrap();
    let block = vec![0x5au8; 64 * 1024];
    loop {
        let free = evervm::engine::fsutil::free_bytes(root).unwrap();
        if free <= leave {
            break;
        }
        let size = block.len().min((free - leave) as usize).max(1);
        if file.write_all(&block[..size]).is_err() {
            break;
        }
    }
    let _ = file.sync_all();
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_keeps_machines_in_memory_and_says_why() {
    if !gvisor_available() {
        return;
    }
    let Some(disk) = SmallDisk::mount(512) else {
        return;
    };
    let armed = Arc::new(AtomicBool::new(false));
    let mut config = config(&disk.home());
    // Fills the disk after the checkpoint is written and before it is committed. The stopped
    // sandbox's bundle and runsc state are removed in the background after a checkpoint, which
    // frees room: the disk is filled once they are gone (this test runs one machine).
    let hook: Hook = {
        let armed = Arc::clone(&armed);
        let root = disk.dir.path().to_owned();
        let bundles = disk.home().join("sandboxes");
        Arc::new(move |_| {
            let armed = Arc::clone(&armed);
            let (root, bundles) = (root.clone(), bundles.clone());
            Box::pin(async move {
                if armed.swap(false, Ordering::SeqCst) {
                    tokio::task::spawn_blocking(move || {
                        let deadline = std::time::Instant::now() + Duration::from_secs(10);
                        while std::fs::read_dir(&bundles).is_ok_and(|mut d| d.next().is_some())
                            && std::time::Instant::now() < deadline
                        {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        fill(&root, 0);
                    })
                    .await
                    .unwrap();
                }
            })
        })
    };
    config.hooks.before_commit = Some(hook);
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "x = 'kept'").await;

    // No room for a checkpoint: refused before runsc starts one (which would take the sandbox
    // down with it).
    disk.fill(8 << 20);
    let refused = engine.swap_out(&account, &name).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LimitExceeded, "{refused}");
    assert!(refused.message().contains("MiB free"), "{refused}");
    let info = engine.machine_info(&account, &name).await.unwrap();
    assert_eq!(info.state, MachineState::Resident);
    assert!(
        info.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("stays in memory"),
        "{info:?}"
    );
    assert_eq!(value(&engine, &account, &name, "x").await, "'kept'");
    disk.free();

    // The checkpoint is written, then the disk fills before it is committed: the machine comes
    // back from the checkpoint it just wrote, and the last snapshot stays as it was.
    engine.swap_out(&account, &name).await.unwrap();
    value(&engine, &account, &name, "x = 'newer'").await;
    armed.store(true, Ordering::SeqCst);
    engine.swap_out(&account, &name).await.unwrap_err();
    let info = engine.machine_info(&account, &name).await.unwrap();
    assert_eq!(info.state, MachineState::Resident);
    let (result, stderr) = run(&engine, &account, &name, "x").await;
    assert_eq!(result.outcome, Outcome::Value(Some("'newer'".to_owned())));
    assert!(stderr.is_empty(), "{stderr:?}");
    disk.free();
    engine.swap_out(&account, &name).await.unwrap();
    assert_eq!(value(&engine, &account, &name, "x").await, "'newer'");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_names_that_look_like_scratch_names_survive_restarts() {
    let Some((home, engine, account)) = gvisor_engine().await else {
        return;
    };
    let name = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "x = 1").await;
    engine
        .create_checkpoint(&account, &name, Some("a.old".to_owned()))
        .await
        .unwrap();
    value(&engine, &account, &name, "x = 2").await;
    engine
        .create_checkpoint(&account, &name, Some("a".to_owned()))
        .await
        .unwrap();
    value(&engine, &account, &name, "x = 3").await;
    engine
        .create_checkpoint(&account, &name, Some("x.tmp-1".to_owned()))
        .await
        .unwrap();
    engine.rollback(&account, &name, "a.old").await.unwrap();
    assert_eq!(value(&engine, &account, &name, "x").await, "1");
    engine.shutdown().await;

    let engine = Engine::open(config(home.path())).await.unwrap();
    let names: Vec<String> = engine
        .list_checkpoints(&account, &name)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["a.old", "a", "x.tmp-1"]);
    for (checkpoint, x) in [("x.tmp-1", "3"), ("a", "2"), ("a.old", "1")] {
        engine.rollback(&account, &name, checkpoint).await.unwrap();
        assert_eq!(
            value(&engine, &account, &name, "x").await,
            x,
            "{checkpoint}"
        );
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_machine_during_its_fork_and_checkpoint_leaves_nothing() {
    let Some((home, engine, account)) = gvisor_engine().await else {
        return;
    };
    let name = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "import time\nx = 5").await;
    // The fork and the checkpoint wait for this instruction; the delete comes meanwhile.
    let running = engine
        .exec(
            &account,
            &name,
            ExecRequest::new("print('running', flush=True)\ntime.sleep(2)"),
        )
        .await
        .unwrap()
        .seq;
    let mut events = engine.events(&account, &name, running).await.unwrap();
    assert!(matches!(events.next().await, Some(ExecEvent::Output(_))));
    let (fork, checkpoint, deleted) = tokio::join!(
        engine.fork_machine(&account, &name, evervm::engine::ForkMachine::default()),
        engine.create_checkpoint(&account, &name, Some("during".to_owned())),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            engine.delete_machine(&account, &name).await
        }
    );
    deleted.unwrap();
    if let Err(e) = &checkpoint {
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
    assert_eq!(
        engine
            .machine_info(&account, &name)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    assert!(!home.path().join("machines").join(&name).exists());
    let conn = rusqlite::Connection::open(home.path().join("evervm.db")).unwrap();
    for table in ["instructions", "outputs", "checkpoints"] {
        let rows: i64 = conn
            .query_row(
                &format!("SELECT COUNT(*) FROM {table} WHERE machine = ?1"),
                [&name],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 0, "{table} still has rows of the deleted machine");
    }
    match fork {
        // A fork that finished is a machine of its own, with the parent's state.
        Ok(child) => {
            let child = child.name.to_string();
            assert_eq!(value(&engine, &account, &child, "x").await, "5");
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn making_one_base_snapshot_does_not_hold_up_another() {
    if !gvisor_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let released_by_test = Arc::new(AtomicBool::new(false));
    let mut config = config(home.path());
    // The `data` base waits until the test lets it go (or a minute).
    config.hooks.before_base = Some({
        let release = Arc::clone(&release);
        let released_by_test = Arc::clone(&released_by_test);
        Arc::new(move |shape: String| {
            let release = Arc::clone(&release);
            let released_by_test = Arc::clone(&released_by_test);
            Box::pin(async move {
                if shape.starts_with("data-") {
                    let notified =
                        tokio::time::timeout(Duration::from_secs(60), release.notified()).await;
                    released_by_test.store(notified.is_ok(), Ordering::SeqCst);
                }
            })
        })
    });
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let data = machine(
        &engine,
        &account,
        CreateMachine {
            image: Some("data".to_owned()),
            ..CreateMachine::default()
        },
    )
    .await;
    let data_run = {
        let (engine, account, data) = (engine.clone(), account.clone(), data.clone());
        tokio::spawn(async move { value(&engine, &account, &data, "import pandas\n1").await })
    };
    // Another shape gets its base (and its machine runs) while the `data` one is held.
    let small = machine(
        &engine,
        &account,
        CreateMachine {
            image: Some("minimal".to_owned()),
            memory_mb: Some(256),
            ..CreateMachine::default()
        },
    )
    .await;
    assert_eq!(value(&engine, &account, &small, "6 * 7").await, "42");
    release.notify_one();
    assert_eq!(data_run.await.unwrap(), "1");
    assert!(
        released_by_test.load(Ordering::SeqCst),
        "the other shape waited for the held base snapshot"
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_whose_snapshot_was_deleted_is_damaged_not_silently_fresh() {
    let Some((home, engine, account)) = gvisor_engine().await else {
        return;
    };
    let name = machine(&engine, &account, CreateMachine::default()).await;
    let other = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "x = 1").await;
    value(&engine, &account, &other, "y = 2").await;
    engine.swap_out(&account, &name).await.unwrap();
    engine.swap_out(&account, &other).await.unwrap();
    std::fs::remove_dir_all(home.path().join("machines").join(&name).join("snapshot")).unwrap();
    let (result, _) = run(&engine, &account, &name, "x").await;
    match result.outcome {
        Outcome::Error { text, .. } => assert!(text.contains("missing"), "{text}"),
        Outcome::Value(v) => panic!("ran on a fresh interpreter: {v:?}"),
    }
    let info = engine.machine_info(&account, &name).await.unwrap();
    assert_eq!(info.state, MachineState::Damaged);
    assert!(info.last_error.unwrap_or_default().contains("missing"));
    // Another machine is not affected.
    assert_eq!(value(&engine, &account, &other, "y").await, "2");
    engine.delete_machine(&account, &name).await.unwrap();
    engine.shutdown().await;
}

/// Asserts that an instruction ended with `MachineCrashed` and an error text holding `needle`.
fn assert_crashed(outcome: &Outcome, needle: &str) {
    match outcome {
        Outcome::Error { text, cause } => {
            assert_eq!(
                *cause,
                evervm::engine::FailureCause::MachineCrashed,
                "{text}"
            );
            assert!(text.contains(needle), "{text}");
        }
        Outcome::Value(v) => panic!("expected a crash, got {v:?}"),
    }
}

/// Kills (SIGKILL) every process whose command line mentions `needle`; how many there were.
fn kill_processes_mentioning(needle: &str) -> usize {
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) && pid != std::process::id() as i32 {
            // SAFETY: kill has no memory effects; a pid that is gone only makes it fail.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    killed
}

#[tokio::test(flavor = "multi_thread")]
async fn runsc_killed_under_a_busy_machine_costs_only_that_machine() {
    let Some((home, engine, account)) = gvisor_engine().await else {
        return;
    };
    let busy = machine(&engine, &account, CreateMachine::default()).await;
    let calm = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &busy, "saved = 'before'").await;
    engine.swap_out(&account, &busy).await.unwrap();
    value(&engine, &account, &calm, "kept = 'calm'").await;
    // The calm machine is on disk: every runsc process of this home is the busy one's.
    engine.swap_out(&account, &calm).await.unwrap();
    let mut request = ExecRequest::new(
        "lost = 'after'\nn = 0\nprint('busy', flush=True)\nwhile True:\n    n += 1",
    );
    request.timeout = Duration::from_secs(120);
    let seq = engine.exec(&account, &busy, request).await.unwrap().seq;
    let mut events = engine.events(&account, &busy, seq).await.unwrap();
    assert!(matches!(events.next().await, Some(ExecEvent::Output(_))));
    let killed = kill_processes_mentioning(&home.path().join("runsc").display().to_string());
    assert!(killed > 0, "no runsc process of this home was found");
    let result = loop {
        match events.next().await {
            Some(ExecEvent::Result(result)) => break result,
            Some(ExecEvent::Output(_)) => {}
            None => panic!("no result"),
        }
    };
    assert_crashed(&result.outcome, "MachineCrashed");
    // It comes back from its last snapshot, and says so.
    let (result, stderr) = run(&engine, &account, &busy, "[saved, 'lost' in globals()]").await;
    assert_eq!(
        result.outcome,
        Outcome::Value(Some("['before', False]".to_owned()))
    );
    assert!(
        stderr
            .first()
            .is_some_and(|l| l.contains("restored from its snapshot")),
        "{stderr:?}"
    );
    // The other machine lost nothing.
    assert_eq!(value(&engine, &account, &calm, "kept").await, "'calm'");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_account_past_its_disk_quota_cannot_fork_or_checkpoint() {
    if !gvisor_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut config = config(home.path());
    config.limits.max_disk_mb_per_account = 1;
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "x = bytes(2 * 1024 * 1024)").await;
    // The first copy is allowed: nothing is on disk yet.
    engine
        .create_checkpoint(&account, &name, Some("first".to_owned()))
        .await
        .unwrap();
    let refused = engine
        .create_checkpoint(&account, &name, Some("second".to_owned()))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LimitExceeded, "{refused}");
    assert!(
        refused.message().contains("EVERVM_ACCOUNT_DISK_MB"),
        "{refused}"
    );
    let refused = engine
        .fork_machine(&account, &name, evervm::engine::ForkMachine::default())
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LimitExceeded, "{refused}");
    // The machine itself goes on, and swaps (its own state is never refused).
    assert_eq!(value(&engine, &account, &name, "len(x)").await, "2097152");
    engine.swap_out(&account, &name).await.unwrap();
    // Deleting the checkpoint makes room again.
    engine
        .delete_checkpoint(&account, &name, "first")
        .await
        .unwrap();
    engine.delete_machine(&account, &name).await.unwrap();
    engine.shutdown().await;
}

/// An engine on `config` whose runsc saves sandboxes in place (a current one); `None`, with the
/// reason printed, where it cannot.
async fn engine_saving_in_place(config: EngineConfig) -> Option<Engine> {
    if !gvisor_available() {
        return None;
    }
    let engine = Engine::open(config).await.unwrap();
    if engine.saves_in_place() {
        return Some(engine);
    }
    eprintln!(
        "skipping: {} cannot save a sandbox and leave it running (nor choose to compress)",
        engine.backend_description()
    );
    engine.shutdown().await;
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_and_durable_saves_leave_the_machine_running() {
    let home = tempfile::tempdir().unwrap();
    let Some(engine) = engine_saving_in_place(config(home.path())).await else {
        return;
    };
    let account = engine.ensure_account("test").await.unwrap();
    let parent = machine(&engine, &account, CreateMachine::default()).await;
    // A thread that keeps counting in the parent while it is forked.
    value(
        &engine,
        &account,
        &parent,
        "import threading, time\nticks = []\n\
         def tick():\n    while True:\n        ticks.append(time.monotonic()); time.sleep(0.005)\n\
         threading.Thread(target=tick, daemon=True).start()\nx = 'parent'",
    )
    .await;
    let pid = engine.sandbox_pid(&parent).unwrap();
    let fork = engine
        .fork_machine(&account, &parent, evervm::engine::ForkMachine::default())
        .await
        .unwrap()
        .name
        .to_string();
    // The parent's sandbox is the same process: it was saved in place, never stopped.
    assert_eq!(engine.sandbox_pid(&parent), Some(pid));
    assert_eq!(value(&engine, &account, &fork, "x").await, "'parent'");
    let before = value(&engine, &account, &parent, "len(ticks)").await;
    let after = value(&engine, &account, &parent, "time.sleep(0.1); len(ticks)").await;
    assert!(
        after.parse::<u64>().unwrap() > before.parse::<u64>().unwrap(),
        "the parent's thread goes on: {before} then {after}"
    );
    // A checkpoint does not stop it either.
    engine
        .create_checkpoint(&account, &parent, Some("kept".to_owned()))
        .await
        .unwrap();
    assert_eq!(engine.sandbox_pid(&parent), Some(pid));

    // `durability = instruction`: saved after every instruction, in place.
    let durable = machine(
        &engine,
        &account,
        CreateMachine {
            durability: Some(Durability::Instruction),
            ..CreateMachine::default()
        },
    )
    .await;
    let (first, _) = run(&engine, &account, &durable, "n = 1").await;
    assert_eq!(first.saved, Some(true));
    let pid = engine.sandbox_pid(&durable).unwrap();
    for i in 2..5 {
        let (result, _) = run(&engine, &account, &durable, "n += 1; n").await;
        assert_eq!(result.saved, Some(true));
        assert_eq!(result.outcome, Outcome::Value(Some(i.to_string())));
        assert_eq!(
            engine.sandbox_pid(&durable),
            Some(pid),
            "not stopped and restored"
        );
    }
    engine.shutdown().await;
}

/// Where runsc lets the engine choose: a swap-out writes a compressed snapshot (it may stay on
/// disk for long), a fork's save does not (the fork is restored soon); with `compress_swaps`
/// off, neither is.
#[tokio::test(flavor = "multi_thread")]
async fn swap_outs_are_compressed_and_forks_are_not() {
    for compress_swaps in [true, false] {
        let home = tempfile::tempdir().unwrap();
        let mut config = config(home.path());
        config.compress_swaps = compress_swaps;
        // Compressed at the swap-out itself (not later, in the background).
        config.compress_after = Duration::ZERO;
        let Some(engine) = engine_saving_in_place(config).await else {
            return;
        };
        let account = engine.ensure_account("test").await.unwrap();
        let name = machine(&engine, &account, CreateMachine::default()).await;
        value(&engine, &account, &name, "x = list(range(10**6))").await;
        let fork = engine
            .fork_machine(&account, &name, evervm::engine::ForkMachine::default())
            .await
            .unwrap()
            .name
            .to_string();
        engine.swap_out(&account, &name).await.unwrap();
        let swapped = engine
            .machine_info(&account, &name)
            .await
            .unwrap()
            .disk_bytes;
        let forked = engine
            .machine_info(&account, &fork)
            .await
            .unwrap()
            .disk_bytes;
        if compress_swaps {
            assert!(
                swapped * 3 < forked,
                "swapped {swapped} bytes, forked {forked}"
            );
        } else {
            assert!(
                swapped * 3 > forked * 2,
                "swapped {swapped} bytes, forked {forked}"
            );
        }
        // Both restore.
        assert_eq!(value(&engine, &account, &name, "len(x)").await, "1000000");
        assert_eq!(value(&engine, &account, &fork, "len(x)").await, "1000000");
        engine.shutdown().await;
    }
}

/// The sandboxes a gVisor engine on `home` created ahead of time (used or waiting), by the pid
/// files `runsc create` wrote into their bundles.
fn created_sandboxes(home: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(home.join("sandboxes")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pre-"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("pid")).ok())
        .filter_map(|pid| pid.trim().parse().ok())
        .collect()
}

/// Waits (up to 20 s) for a sandbox created ahead of time that is not in `known`; its pid. The
/// engine creates them in the background and tells no one: their pid files are what shows it.
async fn new_created_sandbox(home: &Path, known: &[u32]) -> u32 {
    for _ in 0..200 {
        if let Some(pid) = created_sandboxes(home)
            .into_iter()
            .find(|pid| !known.contains(pid))
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no sandbox was created ahead of time in 20 s (known: {known:?})");
}

fn process_exists(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, s)| s.trim().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn restores_go_into_sandboxes_created_ahead_of_time() {
    let home = tempfile::tempdir().unwrap();
    let Some(engine) = engine_saving_in_place(config(home.path())).await else {
        return;
    };
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine(&engine, &account, CreateMachine::default()).await;
    value(&engine, &account, &name, "x = 'kept'").await;
    engine.swap_out(&account, &name).await.unwrap();
    // The restore goes into the sandbox that was waiting for it: the machine's sandbox is that
    // process.
    let mut known: Vec<u32> = engine.sandbox_pid(&name).into_iter().collect();
    let waiting = new_created_sandbox(home.path(), &known).await;
    assert_eq!(value(&engine, &account, &name, "x").await, "'kept'");
    assert_eq!(engine.sandbox_pid(&name), Some(waiting));
    known.push(waiting);

    // A replacement is created; if it dies before it is used, the next restore does without.
    let replacement = new_created_sandbox(home.path(), &known).await;
    known.push(replacement);
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(replacement as i32, libc::SIGKILL) };
    engine.swap_out(&account, &name).await.unwrap();
    assert!(!process_exists(waiting), "the swapped-out sandbox is gone");
    assert_eq!(value(&engine, &account, &name, "x").await, "'kept'");
    let restored = engine.sandbox_pid(&name).unwrap();
    assert!(!known.contains(&restored), "{restored} in {known:?}");

    // A sandbox restored this way that is killed is noticed like any other: the machine comes
    // back from its snapshot and says so.
    engine.swap_out(&account, &name).await.unwrap();
    let waiting = new_created_sandbox(home.path(), &known).await;
    assert_eq!(value(&engine, &account, &name, "x").await, "'kept'");
    assert_eq!(engine.sandbox_pid(&name), Some(waiting));
    known.push(waiting);
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(waiting as i32, libc::SIGKILL) };
    let (result, _) = run(&engine, &account, &name, "x").await;
    assert_crashed(&result.outcome, "the sandbox ended");
    let (result, stderr) = run(&engine, &account, &name, "x").await;
    assert_eq!(result.outcome, Outcome::Value(Some("'kept'".to_owned())));
    assert!(
        stderr
            .first()
            .is_some_and(|l| l.contains("restored from its snapshot")),
        "{stderr:?}"
    );

    // Shutdown leaves none of them running.
    let waiting = new_created_sandbox(home.path(), &known).await;
    engine.shutdown().await;
    assert!(
        !process_exists(waiting),
        "a created sandbox outlived shutdown"
    );
}
