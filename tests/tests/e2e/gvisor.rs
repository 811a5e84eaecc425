//! What only the gVisor backend promises: the sandbox sees the image, never the host's files;
//! code runs as `user`, and `sudo` makes it root inside the sandbox only; the `data` image has
//! numpy, pandas and matplotlib, and a figure comes back as `data.png`; a fork bomb or an endless
//! print loop hurts only its own machine.

use std::time::Duration;

use evervm::{Client, CreateMachineOptions, ExecOptions, LocalOptions};
use evervm_tests::backends;

use crate::{new_machine as machine, value};

async fn gvisor_client(home: &tempfile::TempDir) -> Option<Client> {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return None;
    }
    Some(
        Client::local(LocalOptions {
            home: Some(home.path().to_owned()),
            backend: Some("gvisor".to_owned()),
            account: None,
            pool_size: None,
        })
        .await
        .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_file_system_is_invisible() {
    let home = tempfile::tempdir().unwrap();
    let Some(client) = gvisor_client(&home).await else {
        return;
    };
    let secret = std::env::temp_dir().join(format!("evervm-host-secret-{}", std::process::id()));
    std::fs::write(&secret, "host only").unwrap();
    let m = machine(&client, None).await;
    let code = format!(
        "import os\n[os.path.exists({:?}), os.path.exists({:?}), os.path.exists('/root/.cargo')]",
        secret.display().to_string(),
        home.path().display().to_string()
    );
    assert_eq!(value(&m, &code).await, "[False, False, False]");
    assert_eq!(
        value(&m, "sorted(os.listdir('/'))").await,
        "['bin', 'boot', 'dev', 'etc', 'home', 'lib', 'lib64', 'opt', 'proc', 'root', 'run', 'sbin', 'sys', 'tmp', 'usr', \
         'var']"
    );
    assert_eq!(
        value(&m, "open('/etc/hostname').read()").await,
        "'machine\\n'"
    );
    assert_eq!(
        value(&m, "os.getuid(), os.getcwd()").await,
        "(1000, '/home/user')"
    );
    // Writes land in the machine's own overlay, never in the shared image on the host.
    value(
        &m,
        "open('/usr/lib/evervm-probe', 'w').write('x') if os.access('/usr/lib', os.W_OK) else None",
    )
    .await;
    value(&m, "open('/tmp/mine', 'w').write('kept')").await;
    assert_eq!(value(&m, "open('/tmp/mine').read()").await, "'kept'");
    let info = m.info().await.unwrap();
    assert_eq!(info.backend.as_deref(), Some("gvisor"));
    std::fs::remove_file(&secret).unwrap();
}

/// Runs `argv` in the machine through `subprocess`: (exit code, stdout, stderr).
const RUN: &str = "import subprocess\n\
    def run(*argv, input=None):\n\
    \x20   p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=60)\n\
    \x20   return (p.returncode, p.stdout, p.stderr)";

#[tokio::test(flavor = "multi_thread")]
async fn code_runs_as_user_and_sudo_is_root_inside_the_sandbox_only() {
    let home = tempfile::tempdir().unwrap();
    let Some(client) = gvisor_client(&home).await else {
        return;
    };
    let m = machine(&client, None).await;
    value(&m, RUN).await;
    assert_eq!(value(&m, "run('whoami')").await, "(0, 'user\\n', '')");
    assert_eq!(value(&m, "run('pwd')").await, "(0, '/home/user\\n', '')");
    // The interpreter holds no capability; root's come only through sudo.
    assert_eq!(
        value(
            &m,
            "[l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]"
        )
        .await,
        "['0000000000000000']"
    );
    assert_eq!(
        value(&m, "run('sudo', 'id', '-u')").await,
        "(0, '0\\n', '')"
    );
    assert_eq!(
        value(&m, "run('sudo', '-u', 'user', 'id', '-u')").await,
        "(0, '1000\\n', '')"
    );
    assert_eq!(
        value(&m, "run('sudo', 'sh', '-c', 'cat; exit 3', input='abc')").await,
        "(3, 'abc', '')"
    );
    assert_eq!(
        value(&m, "run('sudo', 'no-such-command')").await,
        "(127, '', 'sudo: no-such-command: command not found\\n')"
    );
    // Root writes the sandbox's copy of the image (its own overlay), never the host's image.
    let probe = "evervm-sudo-probe";
    assert_eq!(
        value(
            &m,
            &format!(
                "run('sudo', 'sh', '-c', 'echo root > /usr/lib/{probe} && cat /usr/lib/{probe}')"
            )
        )
        .await,
        "(0, 'root\\n', '')"
    );
    let images = std::env::var_os("EVERVM_IMAGES")
        .map_or_else(|| home.path().join("images"), std::path::PathBuf::from);
    for image in std::fs::read_dir(&images).unwrap().flatten() {
        let leaked = image.path().join("rootfs/usr/lib").join(probe);
        assert!(!leaked.exists(), "{} was written", leaked.display());
    }
    // A signal to sudo reaches the command, and sudo ends as the command did.
    assert_eq!(
        value(
            &m,
            "import signal\np = subprocess.Popen(['sudo', 'sh', '-c', 'echo up; exec sleep 60'], \
             stdout=subprocess.PIPE, text=True)\np.stdout.readline()\n\
             p.send_signal(signal.SIGTERM)\np.wait(timeout=20)"
        )
        .await,
        "-15"
    );
    // The helper is part of the machine: it is there again after a swap.
    m.swap_out().await.unwrap();
    assert_eq!(
        value(&m, "run('sudo', 'id', '-un')").await,
        "(0, 'root\\n', '')"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_data_image_plots_to_png() {
    let home = tempfile::tempdir().unwrap();
    let Some(client) = gvisor_client(&home).await else {
        return;
    };
    let m = machine(&client, Some("data")).await;
    // matplotlib uses the image's directory and its font cache, with nothing said on stderr.
    let first = m
        .exec(
            "import numpy, pandas, matplotlib, matplotlib.font_manager\n\
             (numpy.__version__ > '1', pandas.__version__ > '1', matplotlib.get_backend().lower(), \
             matplotlib.get_configdir())",
        )
        .await
        .unwrap();
    assert_eq!(
        first.result.value.as_deref(),
        Some("(True, True, 'agg', '/opt/evervm/matplotlib')")
    );
    assert_eq!(
        first.stderr(),
        "",
        "the first import of matplotlib is silent"
    );
    assert_eq!(
        value(
            &m,
            "df = pandas.DataFrame({'x': [1, 2, 3]})\nint(df.x.sum() + numpy.arange(4).sum())"
        )
        .await,
        "12"
    );
    let run = m
        .exec(
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('evervm')\nplt.show()",
        )
        .await
        .unwrap();
    assert!(run.result.error.is_none(), "{:?}", run.result.error);
    let data = run.result.data.expect("a figure comes back as data");
    let png = data["png"].as_str().expect("data.png is a string");
    let bytes = decode_base64(png);
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "data.png is a PNG");
    assert!(bytes.len() > 1000);
    // The figure was closed: the next instruction has no image.
    assert!(m.exec("1").await.unwrap().result.data.is_none());
    assert_eq!(m.info().await.unwrap().image.as_deref(), Some("data"));
}

fn decode_base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for byte in text.bytes().filter(|b| *b != b'=') {
        let value = ALPHABET.iter().position(|a| *a == byte).unwrap() as u32;
        bits = (bits << 6) | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_and_a_print_loop_hurt_only_their_machine() {
    let home = tempfile::tempdir().unwrap();
    let Some(client) = gvisor_client(&home).await else {
        return;
    };
    let bystander = machine(&client, None).await;
    value(&bystander, "kept = 'fine'").await;

    let printer = machine(&client, None).await;
    value(&printer, "before = 1").await;
    let options = ExecOptions {
        timeout: Duration::from_secs(3),
        interrupt: false,
        ..ExecOptions::default()
    };
    let run = printer
        .exec_with("while True:\n    print('x' * 100)", &options)
        .await
        .unwrap();
    assert!(run.result.timed_out(), "{:?}", run.result.error);
    assert!(!run.output.is_empty());
    assert_eq!(value(&printer, "before + 1").await, "2");

    let bomb = machine(&client, None).await;
    let run = bomb
        .exec_with(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            &ExecOptions {
                timeout: Duration::from_secs(5),
                interrupt: false,
                ..ExecOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(
        run.result.is_error(),
        "the fork bomb ended without an error"
    );
    bomb.delete().await.unwrap();

    assert_eq!(value(&bystander, "kept").await, "'fine'");
    let fresh = machine(&client, None).await;
    assert_eq!(value(&fresh, "6 * 7").await, "42");
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_the_address_space_limit_misses_is_stopped_by_the_backstop() {
    let home = tempfile::tempdir().unwrap();
    let Some(client) = gvisor_client(&home).await else {
        return;
    };
    let m = client
        .create_machine(CreateMachineOptions {
            memory_mb: Some(256),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap();
    value(&m, "before = 1").await;
    m.swap_out().await.unwrap();
    value(&m, "after = 2").await;
    // Files in /tmp live in the sandbox's memory, which RLIMIT_AS does not count.
    let run = m
        .exec_with(
            "block = b'x' * (16 << 20)\nfor i in range(96):\n    open(f'/tmp/fill{i}', 'wb').write(block)",
            &ExecOptions {
                timeout: Duration::from_secs(60),
                interrupt: false,
                ..ExecOptions::default()
            },
        )
        .await
        .unwrap();
    let error = run.result.error.clone().unwrap_or_default();
    assert_eq!(
        run.result.cause,
        Some(evervm::FailureCause::MachineCrashed),
        "{error}"
    );
    assert!(error.contains("memory"), "{error}");
    let info = m.info().await.unwrap();
    assert!(info.last_error.is_some_and(|e| e.contains("memory")));
    // The machine comes back from its last snapshot (taken at the swap), and says so.
    let run = m.exec("before, 'after' in globals()").await.unwrap();
    assert_eq!(run.result.value.as_deref(), Some("(1, False)"), "{run:?}");
    let note: Vec<&str> = run.output.iter().map(|c| c.data.as_str()).collect();
    assert!(
        note.iter()
            .any(|line| line.contains("sandbox stopped")
                && line.contains("restored from its snapshot")),
        "{note:?}"
    );
    // Only the first instruction after the crash carries the note.
    assert!(m.exec("6 * 7").await.unwrap().output.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn state_survives_swap_out_and_restore() {
    let home = tempfile::tempdir().unwrap();
    let Some(client) = gvisor_client(&home).await else {
        return;
    };
    let m = machine(&client, None).await;
    let bystander = machine(&client, None).await;
    value(&bystander, "mine = 'untouched'").await;
    value(
        &m,
        "import json, os, time\nx = 41\ndef f(n):\n    return n + x\nclass Point:\n    \
         def __init__(self, a):\n        self.a = a\np = Point(3)\n\
         g = (i * i for i in range(10))\nnext(g); next(g)\n\
         open('/tmp/t.txt', 'w').write('in tmp')\nopen(os.path.expanduser('~/h.txt'), 'w').write('in home')",
    )
    .await;
    m.swap_out().await.unwrap();
    let info = m.info().await.unwrap();
    assert_eq!(info.state.as_deref(), Some("swapped"));
    assert!(!info.running);
    assert!(info.disk_bytes.is_some_and(|b| b > 100_000), "{info:?}");
    let snapshot = home.path().join("machines").join(m.name()).join("snapshot");
    assert!(snapshot.join("manifest.json").is_file());

    let restored = value(
        &m,
        "(f(1), p.a, next(g), json.dumps([1]), open('/tmp/t.txt').read(), \
         open(os.path.expanduser('~/h.txt')).read(), abs(time.time() - __import__('time').time()) < 1)",
    )
    .await;
    assert_eq!(restored, "(42, 3, 4, '[1]', 'in tmp', 'in home', True)");
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let clock: f64 = value(&m, "time.time()").await.parse().unwrap();
    assert!(
        (clock - host_now).abs() < 5.0,
        "guest clock {clock}, host {host_now}"
    );
    assert_eq!(m.info().await.unwrap().state.as_deref(), Some("resident"));

    // A damaged snapshot is refused, with a clear error, for that machine only.
    m.swap_out().await.unwrap();
    evervm_tests::damage_snapshot(&snapshot);
    let refused = m.exec("x").await.unwrap();
    let error = refused.result.error.unwrap_or_default();
    assert!(
        error.contains("snapshot") && error.contains("do not match"),
        "{error}"
    );
    assert_eq!(
        refused.result.cause,
        Some(evervm::FailureCause::MachineCrashed)
    );
    let info = m.info().await.unwrap();
    assert_eq!(info.state.as_deref(), Some("damaged"));
    assert!(info.last_error.is_some_and(|e| e.contains("do not match")));
    assert_eq!(value(&bystander, "mine").await, "'untouched'");
    m.delete().await.unwrap();
    assert!(!snapshot.exists());
}

/// An engine on `home` with gVisor and a short idle time.
async fn gvisor_engine(home: &std::path::Path, idle: Option<Duration>) -> evervm::engine::Engine {
    let mut config = crate::gvisor_config(home);
    config.idle_swap = idle;
    evervm::engine::Engine::open(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_machines_swap_out_and_everything_survives_an_engine_restart() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let engine = gvisor_engine(home.path(), Some(Duration::from_secs(1))).await;
    let account = engine.ensure_account("local").await.unwrap();
    let client = Client::from_engine(engine.clone(), account.clone());
    let idle = machine(&client, None).await;
    value(&idle, "n = 7").await;
    let mut swapped = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if idle.info().await.unwrap().state.as_deref() == Some("swapped") {
            swapped = true;
            break;
        }
    }
    assert!(swapped, "an idle machine was not swapped out");
    assert_eq!(value(&idle, "n * 6").await, "42");

    let kept = machine(&client, None).await;
    value(
        &kept,
        "import os\nstate = [1, 2, 3]\nopen('/tmp/k', 'w').write('k')",
    )
    .await;
    engine.shutdown().await;
    // Every handle on the old engine goes, and with them its lock on the home.
    let (idle_name, kept_name) = (idle.name().to_owned(), kept.name().to_owned());
    drop((idle, kept, client, engine));

    let engine = gvisor_engine(home.path(), None).await;
    let client = Client::from_engine(engine.clone(), account);
    let kept = client.machine(&kept_name);
    assert_eq!(kept.info().await.unwrap().state.as_deref(), Some("swapped"));
    assert_eq!(
        value(&kept, "state + [4], open('/tmp/k').read()").await,
        "([1, 2, 3, 4], 'k')"
    );
    let idle = client.machine(&idle_name);
    assert_eq!(value(&idle, "n").await, "7");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn swapped_snapshots_are_compressed_in_the_background_and_still_restore_and_fork() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut config = crate::gvisor_config(home.path());
    config.compress_swaps = true;
    config.compress_after = Duration::from_secs(3);
    let engine = evervm::engine::Engine::open(config).await.unwrap();
    let account = engine.ensure_account("local").await.unwrap();
    let client = Client::from_engine(engine.clone(), account);
    let m = machine(&client, None).await;
    value(
        &m,
        "import random\nx = list(range(100000))\nr = random.random()",
    )
    .await;
    m.swap_out().await.unwrap();
    let snapshot = home.path().join("machines").join(m.name()).join("snapshot");
    if snapshot.join("pages.img").exists() || snapshot.join("pages.img.zst").exists() {
        let uncompressed = m.info().await.unwrap().disk_bytes.unwrap_or_default();
        // The compression is the engine's own background work, with nothing to subscribe to:
        // the test looks at the disk, for at most 20 s.
        let mut compressed = false;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Chunked into the home's store, or compressed whole where a bucket keeps it.
            if snapshot.join("pages.img.chunks").exists() || snapshot.join("pages.img.zst").exists()
            {
                compressed = true;
                break;
            }
        }
        assert!(
            compressed,
            "the swapped machine's snapshot was not compressed"
        );
        assert!(!snapshot.join("pages.img").exists());
        let now = m.info().await.unwrap().disk_bytes.unwrap_or_default();
        assert!(
            now > 0 && now * 2 < uncompressed,
            "{now} bytes compressed, {uncompressed} before"
        );
    } else {
        eprintln!(
            "skipping the compression checks: this runsc ({}) writes its snapshots compressed \
             itself",
            engine.backend_description()
        );
    }
    // The fork copies the compressed snapshot; both restore from it, each with its own state.
    let fork = m.fork(None).await.unwrap();
    let forked = value(&fork, "len(x), r").await;
    assert!(forked.starts_with("(100000, 0."), "{forked}");
    assert_eq!(value(&m, "len(x), r").await, forked);
    value(&fork, "x = None").await;
    assert_eq!(value(&m, "len(x)").await, "100000");
    // Nothing is left in the scratch directories once the sandboxes are gone.
    engine.shutdown().await;
    drop((m, fork, client, engine));
    let scratch: Vec<_> = std::fs::read_dir(home.path().join("sandboxes"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("unpacked-"))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_survive_an_upgrade_of_runsc() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let system_runsc = std::env::var_os("EVERVM_RUNSC")
        .map_or_else(|| "/usr/bin/runsc".into(), std::path::PathBuf::from);
    if !system_runsc.is_file() {
        eprintln!("skipping: no runsc at {}", system_runsc.display());
        return;
    }
    // Two "releases": the same program with different bytes, so different versions to evervm.
    let releases = tempfile::tempdir().unwrap();
    let release = |n: u8| {
        let path = releases.path().join(format!("runsc-{n}"));
        let mut bytes = std::fs::read(&system_runsc).unwrap();
        bytes.push(n);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path
    };
    let (old, new) = (release(1), release(2));
    let home = tempfile::tempdir().unwrap();
    let open = |runsc: std::path::PathBuf, platform: Option<String>| {
        let mut config = crate::gvisor_config(home.path());
        config.pool_size = 0;
        config.runsc = Some(runsc);
        config.runsc_platform = platform;
        evervm::engine::Engine::open(config)
    };
    let engine = open(old.clone(), None).await.unwrap();
    let platform = engine
        .backend_description()
        .rsplit("platform ")
        .next()
        .map(|p| p.trim_end_matches(')').to_owned());
    let account = engine.ensure_account("local").await.unwrap();
    let client = Client::from_engine(engine.clone(), account.clone());
    let m = machine(&client, None).await;
    value(&m, "kept = 'across the upgrade'").await;
    engine.shutdown().await;
    let name = m.name().to_owned();
    drop((m, client, engine));
    // The old release is gone from where it was installed.
    std::fs::remove_file(&old).unwrap();

    let engine = open(new, platform).await.unwrap();
    let client = Client::from_engine(engine.clone(), account);
    let m = client.machine(&name);
    assert_eq!(m.info().await.unwrap().state.as_deref(), Some("swapped"));
    assert_eq!(value(&m, "kept").await, "'across the upgrade'");
    // New machines run on the new release.
    let fresh = machine(&client, None).await;
    assert_eq!(value(&fresh, "1 + 1").await, "2");
    engine.shutdown().await;
    let kept: Vec<_> = std::fs::read_dir(home.path().join("runsc-bin"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(kept.len(), 2, "each release that wrote a snapshot is kept");

    // Without the release that wrote its snapshot the machine is damaged, and says why.
    let new_digest = engine.backend_description();
    drop((m, fresh, client, engine));
    for entry in kept {
        if !new_digest.contains(&entry.file_name().to_string_lossy().into_owned()) {
            std::fs::remove_dir_all(entry.path()).unwrap();
        }
    }
    let engine = open(releases.path().join("runsc-2"), None).await.unwrap();
    let client = Client::from_engine(
        engine.clone(),
        engine.ensure_account("local").await.unwrap(),
    );
    let info = client.machine(&name).info().await.unwrap();
    assert_eq!(info.state.as_deref(), Some("damaged"), "{info:?}");
    let reason = info.last_error.unwrap_or_default();
    assert!(reason.contains("does not have"), "{reason}");
    engine.shutdown().await;
}

/// The pinned current runsc that `scripts/runsc.sh` builds, if it is there.
fn current_runsc() -> Option<std::path::PathBuf> {
    let dir = evervm::engine::guest::image::default_cache_dir().join("runsc");
    let mut built: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path().join("runsc"))
        .filter(|p| p.is_file())
        .collect();
    built.sort();
    built.pop()
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_saved_by_debians_runsc_restore_fork_and_roll_back_on_the_current_one() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let debian = std::path::PathBuf::from("/usr/bin/runsc");
    let Some(current) = current_runsc() else {
        eprintln!("skipping: no runsc built by scripts/runsc.sh in ~/.cache/evervm/runsc");
        return;
    };
    if !debian.is_file() {
        eprintln!("skipping: Debian's runsc is not installed");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let open = |runsc: std::path::PathBuf| {
        let mut config = crate::gvisor_config(home.path());
        config.pool_size = 0;
        config.runsc = Some(runsc);
        evervm::engine::Engine::open(config)
    };
    let engine = open(debian).await.unwrap();
    let old_runtime = engine.backend_description();
    let account = engine.ensure_account("local").await.unwrap();
    let client = Client::from_engine(engine.clone(), account.clone());
    let m = machine(&client, None).await;
    value(&m, "x = 1").await;
    m.checkpoint(Some("one")).await.unwrap();
    value(&m, "x = 2").await;
    engine.shutdown().await;
    let name = m.name().to_owned();
    drop((m, client, engine));

    // The same home, upgraded to the current runsc.
    let engine = open(current).await.unwrap();
    assert_ne!(engine.backend_description(), old_runtime);
    let client = Client::from_engine(engine.clone(), account);
    let m = client.machine(&name);
    assert_eq!(
        value(&m, "x").await,
        "2",
        "restored by the runsc that saved it"
    );
    let fork = m.fork(None).await.unwrap();
    assert_eq!(value(&fork, "x").await, "2");
    m.rollback("one").await.unwrap();
    assert_eq!(value(&m, "x").await, "1");
    assert_eq!(value(&fork, "x").await, "2");
    let fresh = machine(&client, None).await;
    assert_eq!(value(&fresh, "import sys; sys.version_info[0]").await, "3");
    engine.shutdown().await;
}
