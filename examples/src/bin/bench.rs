//! The evervm benchmark program: prints figures, asserts nothing.
//!
//! `cargo run --release -p evervm-examples --bin bench -- [--backend process] [--rounds 300]`
//!
//! Per backend: machine create latency (the API call; create plus the first instruction with the
//! pool of ready sandboxes cold and warm), the round trip of `1+1` (p50/p99) in-process, over
//! HTTP (exec then long-poll result) and over a WebSocket session, stdout throughput for 10 MB,
//! file write and read throughput for 100 MiB (in-process and over HTTP),
//! and the resident memory (PSS) of one idle machine's sandbox processes. On gVisor also: swap-out
//! time, snapshot bytes (fresh REPL, after `x = list(range(10**6))`, `data` after `import
//! pandas`), restore plus first instruction, fork latency, the cost of `durability =
//! instruction`, and a density run (`--density N` machines, default 300; 0 skips it): create N
//! machines and run an instruction in each, swap them all out, restore 50 at random and check
//! their state, with the peak memory of the engine and its sandboxes.
//!
//! `--only swap` (or `density`) runs just that part on gVisor; `--only images` machines on
//! each image (create, restore, a first `import pandas`) on gVisor; `--only exec` the in-process
//! round trip and stdout throughput on every backend given; `--only files` the file write and
//! read throughput (100 MiB, in-process and over HTTP) on every backend given; `--only network`
//! what a network costs on gVisor: create plus first instruction, restore plus first
//! instruction and the snapshot, for machines without a network and with `public`;
//! `--only packages --wheels DIR` what installed packages cost on gVisor: `install` time, and the
//! snapshot before and after, for each project of the wheels in DIR (served by the bench on
//! loopback as a package index; `pip download --only-binary=:all: --python-version 3.11
//! --platform manylinux2014_x86_64 -d DIR requests numpy` makes such a directory);
//! `--only chunks [--machines N]` what snapshots cost on gVisor: disk per swapped machine over
//! N fresh machines (default 1,000), compressed whole and chunked into the deduplicated store,
//! and swap-out and restore times from each kind of snapshot; `--only history` what undo points
//! cost: an instruction's time with and without, an undo, and the disk of 100 points on pandas;
//! `--only undo` 40 undos beside 40 restores of the same machine from a swap-out.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use evervm::engine::{BackendChoice, Engine, EngineConfig};
use evervm::{Client, CreateMachineOptions, ExecOptions};
use evervm_examples::measure::{ms, own_pss, percentile, pss_of, ready_machine, report};
use evervm_tests::TestServer;

struct Args {
    backends: Vec<String>,
    rounds: usize,
    /// Only the stdout throughput (for profiling).
    throughput_only: bool,
    /// Machines in the density run (0: none).
    density: usize,
    /// Only this part (`exec`, `swap`, `density`).
    only: Option<String>,
    /// Wheels for `--only packages`.
    wheels: Option<std::path::PathBuf>,
    /// Machines for `--only chunks`.
    machines: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        backends: Vec::new(),
        rounds: 300,
        throughput_only: false,
        density: 300,
        only: None,
        wheels: None,
        machines: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--backend" => args
                .backends
                .push(it.next().context("--backend needs a name")?),
            "--rounds" => args.rounds = it.next().context("--rounds needs a number")?.parse()?,
            "--throughput-only" => args.throughput_only = true,
            "--density" => args.density = it.next().context("--density needs a number")?.parse()?,
            "--machines" => {
                args.machines = it.next().context("--machines needs a number")?.parse()?;
            }
            "--wheels" => {
                args.wheels = Some(it.next().context("--wheels needs a directory")?.into());
            }
            "--only" => {
                args.only = Some(it.next().context(
                    "--only needs chunks, exec, files, history, images, network, packages, swap, density or undo",
                )?);
            }
            other => bail!(
                "unknown argument {other:?}; use --backend NAME, --rounds N, --throughput-only, \
                 --density N, --only chunks|exec|files|history|images|network|packages|swap|density|undo, \
                 --machines N, --wheels DIR"
            ),
        }
    }
    if args.backends.is_empty() {
        args.backends.push("process".into());
    }
    Ok(args)
}

async fn round_trips(client: &Client, rounds: usize) -> Result<Vec<Duration>> {
    let machine = ready_machine(client).await?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let accepted = machine.start("1+1", &ExecOptions::default()).await?;
        let result = machine.result(accepted.seq).await?;
        samples.push(started.elapsed());
        if result.value.as_deref() != Some("2") {
            bail!("1+1 gave {result:?}");
        }
    }
    Ok(samples)
}

async fn session_round_trips(client: &Client, rounds: usize) -> Result<Vec<Duration>> {
    let mut session = client.connect_new().await?;
    let options = ExecOptions::default();
    session.exec("1+1", &options, |_| {}).await?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let run = session.exec("1+1", &options, |_| {}).await?;
        samples.push(started.elapsed());
        if run.result.value.as_deref() != Some("2") {
            bail!("1+1 gave {:?}", run.result);
        }
    }
    Ok(samples)
}

/// Streaming 10 MB of stdout (100-byte lines) through a client: the whole instruction as the
/// client saw it, and the guest's own time for the write (until the channel took the last byte).
struct Throughput {
    elapsed: Duration,
    guest: Duration,
}

impl Throughput {
    fn mb_per_s(&self) -> f64 {
        10.24 / self.elapsed.as_secs_f64()
    }

    /// `label: X MB/s (whole, guest)` as one bench line.
    fn print(&self, label: &str) {
        println!(
            "  stdout 10 MB ({label:<11})                 {:>8.1} MB/s  ({}; the guest's \
             write {:.1} ms)",
            self.mb_per_s(),
            ms(self.elapsed),
            self.guest.as_secs_f64() * 1e3
        );
    }
}

async fn throughput(client: &Client) -> Result<Throughput> {
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    machine
        .exec("import sys, time\nline = 'x' * 99 + '\\n'")
        .await?;
    let options = ExecOptions {
        timeout: Duration::from_secs(300),
        interrupt: false,
        ..ExecOptions::default()
    };
    let started = Instant::now();
    let run = machine
        .exec_with(
            "t = time.perf_counter()\nsys.stdout.write(line * 102400)\nsys.stdout.flush()\n\
             time.perf_counter() - t",
            &options,
        )
        .await?;
    let elapsed = started.elapsed();
    if run.output.len() != 102_400 {
        bail!("expected 102400 lines, got {}", run.output.len());
    }
    let guest: f64 = run
        .result
        .value
        .as_deref()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("the guest's time came back as {:?}", run.result))?;
    Ok(Throughput {
        elapsed,
        guest: Duration::from_secs_f64(guest),
    })
}

/// Bytes of the file the file figures write and read.
const FILE_BYTES: usize = 100 * 1024 * 1024;

/// Writing a 100 MiB file into a machine (1 MiB pieces from memory) and reading it back; MB/s
/// for each, printed as `label`.
async fn file_throughput(client: &Client, label: &str) -> Result<()> {
    use futures::StreamExt;
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    machine.exec("1").await?;
    let piece = bytes::Bytes::from(vec![7u8; 1024 * 1024]);
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    for round in 0..3 {
        let pieces = futures::stream::iter(
            std::iter::repeat_n(piece.clone(), FILE_BYTES / piece.len()).map(Ok),
        )
        .boxed();
        let path = format!("bench-{round}.bin");
        let started = Instant::now();
        let info = machine
            .write_file_stream(
                &path,
                pieces,
                Some(FILE_BYTES as u64),
                evervm::WriteFileOptions::default(),
            )
            .await?;
        writes.push(started.elapsed());
        if info.size != FILE_BYTES as u64 {
            bail!("wrote {} bytes, expected {FILE_BYTES}", info.size);
        }
        let started = Instant::now();
        let mut read = machine.read_file_stream(&path).await?;
        let mut received = 0;
        while let Some(part) = read.data.next().await {
            received += part?.len();
        }
        reads.push(started.elapsed());
        if received != FILE_BYTES {
            bail!("read {received} bytes, expected {FILE_BYTES}");
        }
        machine.remove_file(&path, false).await?;
    }
    let best = |times: &[Duration]| {
        let fastest = times.iter().min().copied().unwrap_or_default();
        FILE_BYTES as f64 / 1e6 / fastest.as_secs_f64().max(1e-9)
    };
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        FILE_BYTES as f64 / 1e6 / times[times.len() / 2].as_secs_f64().max(1e-9)
    };
    println!(
        "  file 100 MiB write ({label:<11})                {:>8.1} MB/s  (median of 3; best {:.1})",
        median(&mut writes.clone()),
        best(&writes)
    );
    println!(
        "  file 100 MiB read  ({label:<11})                {:>8.1} MB/s  (median of 3; best {:.1})",
        median(&mut reads.clone()),
        best(&reads)
    );
    machine.delete().await?;
    Ok(())
}

/// An in-process client on a fresh home with this pool size.
async fn local(backend: &str, pool_size: usize) -> Result<(Client, Engine, tempfile::TempDir)> {
    let home = tempfile::tempdir()?;
    let mut config = EngineConfig::new(home.path());
    config.backend = BackendChoice::parse(backend);
    config.pool_size = pool_size;
    // The store: PostgreSQL when `EVERVM_DATABASE` names one, else the home's SQLite.
    if let Ok(url) = std::env::var("EVERVM_DATABASE") {
        config.database = Some(evervm::engine::store::PostgresSettings::parse(&url)?);
    }
    let engine = Engine::open(config).await?;
    let account = engine.ensure_account("bench").await?;
    Ok((Client::from_engine(engine.clone(), account), engine, home))
}

async fn wait_for_pool(engine: &Engine, size: usize) {
    for _ in 0..600 {
        if engine.pooled_sandboxes() >= size {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Create latency (the API call) and create plus the first instruction.
async fn creates(
    client: &Client,
    engine: &Engine,
    pool: usize,
    count: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut api = Vec::new();
    let mut first = Vec::new();
    for _ in 0..count {
        wait_for_pool(engine, pool).await;
        let started = Instant::now();
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        api.push(started.elapsed());
        machine.exec("1").await?;
        first.push(started.elapsed());
        machine.delete().await?;
    }
    Ok((api, first))
}

async fn bench_backend(backend: &str, rounds: usize) -> Result<()> {
    println!("backend {backend}");
    let count = if backend == "gvisor" { 10 } else { 20 };
    let (cold, cold_engine, _cold_home) = local(backend, 0).await?;
    let (api, first) = creates(&cold, &cold_engine, 0, count).await?;
    report("create machine (API call)", api);
    report("create + first instruction, pool cold", first);
    let (warm, warm_engine, _warm_home) = local(backend, 2).await?;
    let (_, first) = creates(&warm, &warm_engine, 2, count).await?;
    report("create + first instruction, pool warm", first);
    warm_engine.shutdown().await;
    report(
        "exec 1+1 round trip, in-process",
        round_trips(&cold, rounds).await?,
    );

    let server = TestServer::start(backend);
    let remote = server.client();
    report(
        "exec 1+1 round trip, HTTP (exec + result)",
        round_trips(&remote, rounds).await?,
    );
    report(
        "exec 1+1 round trip, WebSocket session",
        session_round_trips(&remote, rounds).await?,
    );

    for (label, client) in [("in-process", &cold), ("HTTP stream", &remote)] {
        throughput(client).await?.print(label);
    }
    for (label, client) in [("in-process", &cold), ("HTTP", &remote)] {
        file_throughput(client, label).await?;
    }
    drop(server);
    cold_engine.shutdown().await;

    // One idle machine, nothing else, on a fresh home: the memory its sandbox holds.
    let (client, engine, home) = local(backend, 0).await?;
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    machine.exec("x = 1 + 1").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let needle = match backend {
        "gvisor" => home.path().join("runsc").display().to_string(),
        _ => "evervm guest agent".to_owned(),
    };
    let pss = pss_of(&needle);
    // The machine's own processes (on gVisor the sandbox and its gofer), as its info reports
    // them; the rest of the home's processes are the engine's (the sandboxes it creates ahead
    // of time for restores, their watchdog).
    let own = machine.info().await?.resident_bytes.unwrap_or(0);
    if own > 0 {
        println!(
            "  resident memory of one idle machine (PSS, all its processes) {:>6.1} MB",
            own as f64 / 1e6
        );
    }
    if pss > own && backend == "gvisor" {
        println!(
            "  beside it: sandboxes created ahead of time (PSS)            {:>6.1} MB",
            (pss - own) as f64 / 1e6
        );
    }
    engine.shutdown().await;
    Ok(())
}

/// Everything about swap, fork and durability (gVisor).
async fn forever_figures(density: usize, only: Option<&str>) -> Result<()> {
    if only.is_none_or(|o| o == "swap") {
        let (client, engine, home) = local("gvisor", 2).await?;
        swap_figures(&client, home.path()).await?;
        fork_figures(&client, &engine).await?;
        durability_figures(&client).await?;
        engine.shutdown().await;
    }
    if density > 0 && only.is_none_or(|o| o == "density") {
        density_run(density).await?;
    }
    Ok(())
}

/// Fork (the API call) and fork plus the fork's first instruction.
async fn fork_figures(client: &Client, engine: &Engine) -> Result<()> {
    let parent = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    parent.exec("x = list(range(1000))").await?;
    let mut calls = Vec::new();
    let mut firsts = Vec::new();
    for _ in 0..10 {
        wait_for_pool(engine, 2).await;
        tokio::time::sleep(IDLE_BEFORE_RESTORE).await;
        let started = Instant::now();
        let fork = parent.fork(None).await?;
        calls.push(started.elapsed());
        let run = fork.exec("len(x)").await?;
        firsts.push(started.elapsed());
        if run.result.value.as_deref() != Some("1000") {
            bail!("a fork's len(x) gave {:?}", run.result);
        }
        fork.delete().await?;
    }
    report("fork (API call: parent saved, copy linked)", calls);
    report("fork + first instruction in the fork", firsts);
    Ok(())
}

/// What `durability = instruction` costs per instruction, against `idle`.
async fn durability_figures(client: &Client) -> Result<()> {
    let mut per_mode = Vec::new();
    for durability in ["idle", "instruction"] {
        let machine = client
            .create_machine(CreateMachineOptions {
                durability: Some(durability.to_owned()),
                ..CreateMachineOptions::default()
            })
            .await?;
        machine.exec("n = 0").await?;
        let mut samples = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            machine.exec("n += 1").await?;
            samples.push(started.elapsed());
            // A client's think time: the restore after the snapshot happens meanwhile.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        samples.sort();
        per_mode.push(percentile(&samples, 50.0));
        report(
            &format!("instruction `n += 1`, durability {durability}"),
            samples,
        );
        machine.delete().await?;
    }
    if let [idle, instruction] = per_mode[..] {
        println!(
            "  durability instruction costs per instruction (p50)     {:>8}",
            ms(instruction.saturating_sub(idle))
        );
    }
    Ok(())
}

/// Machines on each image (gVisor): create plus the first instruction (pool warm), restore plus
/// the first instruction of a fresh machine, its snapshot, and on `data` a machine's first
/// `import pandas`; `data` with and without its base snapshot importing the libraries
/// (`EVERVM_BASE_PREIMPORT`).
async fn image_figures() -> Result<()> {
    for (image, preimport) in [("minimal", false), ("data", false), ("data", true)] {
        let home = tempfile::tempdir()?;
        let mut config = EngineConfig::new(home.path());
        config.backend = BackendChoice::parse("gvisor");
        config.pool_size = 2;
        config.idle_swap = None;
        config.default_image = evervm::engine::guest::image::Profile::parse(image)?;
        config.base_preimport = preimport;
        let engine = Engine::open(config).await?;
        let account = engine.ensure_account("bench").await?;
        let client = Client::from_engine(engine.clone(), account);
        let label = if preimport {
            format!("{image} (base imports numpy, pandas, matplotlib)")
        } else {
            image.to_owned()
        };
        println!("image {label}");
        let (_, firsts) = creates(&client, &engine, 2, 10).await?;
        report("create + first instruction (pool warm)", firsts);
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        restores_and_snapshot(&machine, home.path(), "fresh machine").await?;
        if image == "data" {
            let mut imports = Vec::new();
            for _ in 0..5 {
                wait_for_pool(&engine, 2).await;
                let fresh = client
                    .create_machine(CreateMachineOptions::default())
                    .await?;
                fresh.exec("1").await?;
                let started = Instant::now();
                let run = fresh.exec("import pandas, matplotlib.pyplot").await?;
                imports.push(started.elapsed());
                if let Some(error) = run.result.error {
                    bail!("import pandas failed: {error}");
                }
                fresh.delete().await?;
            }
            report("first `import pandas, matplotlib.pyplot`", imports);
        }
        engine.shutdown().await;
    }
    Ok(())
}

/// Ten swaps of a fresh machine, each followed by an instruction (timed: restore plus first
/// instruction), then the size of its snapshot on disk (under `home`).
async fn restores_and_snapshot(
    machine: &evervm::Machine,
    home: &std::path::Path,
    what: &str,
) -> Result<()> {
    machine.exec("x = 1").await?;
    let mut restores = Vec::new();
    for _ in 0..10 {
        machine.swap_out().await?;
        tokio::time::sleep(IDLE_BEFORE_RESTORE).await;
        let started = Instant::now();
        machine.exec("x + 1").await?;
        restores.push(started.elapsed());
    }
    report(&format!("restore + first instruction ({what})"), restores);
    machine.swap_out().await?;
    let snapshot = home.join("machines").join(machine.name()).join("snapshot");
    println!(
        "  snapshot of a {what} on disk{:>w$.2} MB",
        dir_bytes(&snapshot) as f64 / 1e6,
        w = 41usize.saturating_sub(what.len())
    );
    Ok(())
}

/// What a network costs a machine on gVisor: create plus first instruction (a machine with a
/// network boots a sandbox of its own, with its namespaces, proxy and DNS; one without takes a
/// ready one from the pool), restore plus first instruction, and its snapshot.
async fn network_figures() -> Result<()> {
    let home = tempfile::tempdir()?;
    let mut config = EngineConfig::new(home.path());
    config.backend = BackendChoice::parse("gvisor");
    config.pool_size = 2;
    config.idle_swap = None;
    config.default_image = evervm::engine::guest::image::Profile::Minimal;
    let engine = Engine::open(config).await?;
    let account = engine.ensure_account("bench").await?;
    let client = Client::from_engine(engine.clone(), account);
    for network in [evervm::NetworkPolicy::None, evervm::NetworkPolicy::Public] {
        println!("network {} (minimal image)", network.mode());
        let options = CreateMachineOptions {
            network: Some(network.clone()),
            ..CreateMachineOptions::default()
        };
        let mut firsts = Vec::new();
        for _ in 0..10 {
            wait_for_pool(&engine, 2).await;
            let started = Instant::now();
            let machine = client.create_machine(options.clone()).await?;
            machine.exec("1 + 1").await?;
            firsts.push(started.elapsed());
            machine.delete().await?;
        }
        report("create + first instruction", firsts);
        let machine = client.create_machine(options).await?;
        restores_and_snapshot(&machine, home.path(), "fresh machine").await?;
        machine.delete().await?;
    }
    engine.shutdown().await;
    Ok(())
}

/// What installed packages cost a machine on gVisor (minimal image): the install itself (the
/// wheels already in the engine's cache after the first machine), and the snapshot before and
/// after it.
async fn package_figures(wheels: &std::path::Path) -> Result<()> {
    let routes = evervm_tests::package_index::routes_for_wheels(wheels)
        .with_context(|| format!("reading wheels from {}", wheels.display()))?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let index = evervm_tests::package_index::serve(listener, routes, "127.0.0.1");
    let mut projects: Vec<String> = std::fs::read_dir(wheels)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter_map(|n| n.strip_suffix(".whl").map(str::to_owned))
        .filter_map(|n| n.split('-').next().map(str::to_owned))
        .collect();
    projects.sort();
    projects.dedup();
    let home = tempfile::tempdir()?;
    let mut config = EngineConfig::new(home.path());
    config.backend = BackendChoice::parse("gvisor");
    config.pool_size = 1;
    config.idle_swap = None;
    config.default_image = evervm::engine::guest::image::Profile::Minimal;
    config.packages.index_url = index.url.clone();
    let engine = Engine::open(config).await?;
    let client = Client::from_engine(engine.clone(), engine.ensure_account("bench").await?);
    let snapshot_mb = |machine: &evervm::Machine| {
        dir_bytes(
            &home
                .path()
                .join("machines")
                .join(machine.name())
                .join("snapshot"),
        ) as f64
            / 1e6
    };
    println!("packages (minimal image, wheels from {})", wheels.display());
    for project in projects {
        for pass in ["first, downloading", "again, from the cache"] {
            let machine = client
                .create_machine(CreateMachineOptions::default())
                .await?;
            machine.exec("x = 1").await?;
            machine.swap_out().await?;
            let before = snapshot_mb(&machine);
            let started = Instant::now();
            let report = machine.install(&[project.as_str()]).await?;
            let took = started.elapsed();
            machine.swap_out().await?;
            let after = snapshot_mb(&machine);
            let wheels_mb: f64 = report.installed.iter().map(|p| p.bytes as f64).sum::<f64>() / 1e6;
            println!(
                "  install {project} ({pass}): {} packages, {wheels_mb:.2} MB of wheels, {:.0} ms; \
                 snapshot {before:.2} -> {after:.2} MB",
                report.installed.len(),
                took.as_secs_f64() * 1e3
            );
            machine.delete().await?;
        }
    }
    println!("  index requests: {}", index.requests());
    engine.shutdown().await;
    Ok(())
}

/// Memory of the engine process plus every sandbox process of `home` (PSS, bytes).
fn engine_memory(home: &std::path::Path) -> u64 {
    own_pss() + pss_of(&home.join("runsc").display().to_string())
}

/// Create `count` machines and run an instruction in each, swap them all out, restore 50 at
/// random and check their state; peak memory of the engine and its sandboxes meanwhile.
async fn density_run(count: usize) -> Result<()> {
    println!("density run: {count} machines (gvisor)");
    let home = tempfile::tempdir()?;
    let mut config = EngineConfig::new(home.path());
    config.backend = BackendChoice::parse("gvisor");
    config.pool_size = 2;
    config.idle_swap = Some(Duration::from_secs(2));
    config.max_resident = Some(16);
    let engine = Engine::open(config).await?;
    let client = Client::from_engine(engine.clone(), engine.ensure_account("bench").await?);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let peak = std::sync::Arc::clone(&peak);
        let home = home.path().to_owned();
        tokio::spawn(async move {
            loop {
                let now = engine_memory(&home);
                peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let started = Instant::now();
    let mut machines = Vec::with_capacity(count);
    let mut firsts = Vec::with_capacity(count);
    for i in 0..count {
        let t = Instant::now();
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        machine.exec(&format!("mine = {i} * 7")).await?;
        firsts.push(t.elapsed());
        machines.push(machine);
    }
    let created = started.elapsed();
    report("create + first instruction (while others swap)", firsts);
    // Everything idle goes to disk after 2 s.
    let waited = Instant::now();
    loop {
        let resident = client
            .list_machines(&evervm::Tags::new())
            .await?
            .iter()
            .filter(|m| m.running)
            .count();
        if resident == 0 || waited.elapsed() > Duration::from_secs(300) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let disk: u64 = client
        .list_machines(&evervm::Tags::new())
        .await?
        .iter()
        .filter_map(|m| m.disk_bytes)
        .sum();
    let after_swap = engine_memory(home.path());
    let mut restores = Vec::new();
    let mut seed = u64::from(std::process::id()) * 2_654_435_761;
    for _ in 0..50 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let i = (seed % count as u64) as usize;
        let t = Instant::now();
        let run = machines[i].exec("mine").await?;
        restores.push(t.elapsed());
        if run.result.value != Some((i * 7).to_string()) {
            bail!("machine {i} lost its state: {:?}", run.result);
        }
    }
    report("restore + first instruction, 50 random machines", restores);
    sampler.abort();
    println!(
        "  {count} machines created and run in {:.1} s; all swapped after {:.1} s more",
        created.as_secs_f64(),
        waited.elapsed().as_secs_f64()
    );
    println!(
        "  disk: {:.1} MB in all, {:.2} MB per machine",
        disk as f64 / 1e6,
        disk as f64 / 1e6 / count as f64
    );
    println!(
        "  memory (engine + sandboxes, PSS): peak {:.0} MB, with every machine swapped {:.0} MB",
        peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6,
        after_swap as f64 / 1e6
    );
    engine.shutdown().await;
    Ok(())
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    })
}

/// How long a machine waits on disk before the instruction that restores it: a machine swaps
/// out because it was idle, and in that time the engine's background work (the sandbox a restore
/// goes into, created ahead of time) is done.
const IDLE_BEFORE_RESTORE: Duration = Duration::from_millis(400);

/// Swap-out time, snapshot size, and restore plus the first instruction.
async fn swap_figures(client: &Client, home: &std::path::Path) -> Result<()> {
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    machine.exec("x = 1").await?;
    let snapshot = home.join("machines").join(machine.name()).join("snapshot");
    let mut swaps = Vec::new();
    let mut restores = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        machine.swap_out().await?;
        swaps.push(started.elapsed());
        tokio::time::sleep(IDLE_BEFORE_RESTORE).await;
        let started = Instant::now();
        let run = machine.exec("x + 1").await?;
        restores.push(started.elapsed());
        if run.result.value.as_deref() != Some("2") {
            bail!("after a restore x + 1 gave {:?}", run.result);
        }
    }
    report("swap out (checkpoint to disk)", swaps);
    report("restore + first instruction", restores);
    machine.swap_out().await?;
    println!(
        "  snapshot of a fresh REPL on disk                       {:>8.2} MB",
        dir_bytes(&snapshot) as f64 / 1e6
    );
    machine.exec("big = list(range(10**6))").await?;
    machine.swap_out().await?;
    println!(
        "  snapshot after x = list(range(10**6))                  {:>8.2} MB",
        dir_bytes(&snapshot) as f64 / 1e6
    );
    let data = client
        .create_machine(CreateMachineOptions {
            image: Some("data".to_owned()),
            ..CreateMachineOptions::default()
        })
        .await?;
    data.exec("import pandas").await?;
    let mut swaps = Vec::new();
    let mut restores = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        data.swap_out().await?;
        swaps.push(started.elapsed());
        tokio::time::sleep(IDLE_BEFORE_RESTORE).await;
        let started = Instant::now();
        data.exec("pandas.__name__").await?;
        restores.push(started.elapsed());
    }
    report("data profile: swap out", swaps);
    report("data profile: restore + first instruction", restores);
    data.swap_out().await?;
    println!(
        "  snapshot, data profile after import pandas             {:>8.2} MB",
        dir_bytes(&home.join("machines").join(data.name()).join("snapshot")) as f64 / 1e6
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    // The engine's own timings (`RUST_LOG=evervm_engine=debug`) to stderr, when asked for.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    println!(
        "evervm bench: {} rounds, {} cores",
        args.rounds,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    for backend in &args.backends {
        if args.only.as_deref() == Some("files") {
            let (client, engine, _home) = local(backend, 0).await?;
            let server = TestServer::start(backend);
            println!("backend {backend}");
            file_throughput(&client, "in-process").await?;
            file_throughput(&server.client(), "HTTP").await?;
            drop(server);
            engine.shutdown().await;
            continue;
        }
        if args.only.as_deref() == Some("exec") {
            let (client, engine, _home) = local(backend, 0).await?;
            println!("backend {backend}");
            report(
                "exec 1+1 round trip, in-process",
                round_trips(&client, args.rounds).await?,
            );
            throughput(&client).await?.print("in-process");
            engine.shutdown().await;
            continue;
        }
        if args.only.as_deref() == Some("images") {
            if backend == "gvisor" {
                image_figures().await?;
            }
            continue;
        }
        if args.only.as_deref() == Some("packages") {
            let wheels = args
                .wheels
                .as_deref()
                .context("--only packages needs --wheels DIR")?;
            if backend == "gvisor" {
                package_figures(wheels).await?;
            }
            continue;
        }
        if args.only.as_deref() == Some("chunks") {
            if backend == "gvisor" {
                evervm_examples::snapshots::chunk_figures(args.machines).await?;
            }
            continue;
        }
        if args.only.as_deref() == Some("history") {
            if backend == "gvisor" {
                evervm_examples::snapshots::history_figures().await?;
            }
            continue;
        }
        if args.only.as_deref() == Some("undo") {
            if backend == "gvisor" {
                evervm_examples::snapshots::undo_figures().await?;
            }
            continue;
        }
        if args.only.as_deref() == Some("network") {
            if backend == "gvisor" {
                network_figures().await?;
            }
            continue;
        }
        if args.only.is_some() {
            if backend == "gvisor" {
                forever_figures(args.density, args.only.as_deref()).await?;
            }
            continue;
        }
        if args.throughput_only {
            let (client, engine, _home) = local(backend, 0).await?;
            for _ in 0..args.rounds.min(20) {
                let run = throughput(&client).await?;
                println!(
                    "{backend}: stdout 10 MB in-process {:>8.1} MB/s (the guest's write {:.1} ms)",
                    run.mb_per_s(),
                    run.guest.as_secs_f64() * 1e3
                );
            }
            engine.shutdown().await;
        } else {
            bench_backend(backend, args.rounds).await?;
            if backend == "gvisor" {
                forever_figures(args.density, None).await?;
            }
        }
    }
    Ok(())
}
