//! The evervm benchmark program: prints figures, asserts nothing.
//!
//! `cargo run --release -p evervm-examples --bin bench -- [--backend process] [--rounds 300]`
//!
//! Per backend: machine create latency (the API call; create plus the first instruction with the
//! pool of ready sandboxes cold and warm), the round trip of `1+1` (p50/p99) in-process, over
//! HTTP (exec then long-poll result) and over a WebSocket session, stdout throughput for 10 MB,
//! and the resident memory (PSS) of one idle machine's sandbox processes.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use evervm::engine::{BackendChoice, Engine, EngineConfig};
use evervm::{Client, CreateMachineOptions, ExecOptions};
use evervm_tests::TestServer;

struct Args {
    backends: Vec<String>,
    rounds: usize,
    /// Only the stdout throughput (for profiling).
    throughput_only: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        backends: Vec::new(),
        rounds: 300,
        throughput_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--backend" => args
                .backends
                .push(it.next().context("--backend needs a name")?),
            "--rounds" => args.rounds = it.next().context("--rounds needs a number")?.parse()?,
            "--throughput-only" => args.throughput_only = true,
            other => bail!(
                "unknown argument {other:?}; use --backend NAME, --rounds N, --throughput-only"
            ),
        }
    }
    if args.backends.is_empty() {
        args.backends.push("process".into());
    }
    Ok(args)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "  {label:<42} p50 {:>10}  p99 {:>10}  (n={})",
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
        samples.len()
    );
}

async fn round_trips(client: &Client, rounds: usize) -> Result<Vec<Duration>> {
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    machine.exec("1+1").await?;
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

/// Seconds to stream 10 MB of stdout (100-byte lines) through this client, and lines seen.
async fn throughput(client: &Client) -> Result<(Duration, usize)> {
    let machine = client
        .create_machine(CreateMachineOptions::default())
        .await?;
    machine.exec("import sys\nline = 'x' * 99 + '\\n'").await?;
    let options = ExecOptions {
        timeout: Duration::from_secs(300),
        interrupt: false,
    };
    let started = Instant::now();
    let run = machine
        .exec_with("sys.stdout.write(line * 102400)\nNone", &options)
        .await?;
    let elapsed = started.elapsed();
    if run.output.len() != 102_400 {
        bail!("expected 102400 lines, got {}", run.output.len());
    }
    Ok((elapsed, run.output.len()))
}

/// An in-process client on a fresh home with this pool size.
async fn local(backend: &str, pool_size: usize) -> Result<(Client, Engine, tempfile::TempDir)> {
    let home = tempfile::tempdir()?;
    let mut config = EngineConfig::new(home.path());
    config.backend = BackendChoice::parse(backend);
    config.pool_size = pool_size;
    let engine = Engine::open(config).await?;
    let account = engine.ensure_account("bench")?;
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

/// Proportional set size of every process whose command line names `needle`, in bytes.
fn pss_of(needle: &str) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains(needle) {
            continue;
        }
        let Ok(rollup) = std::fs::read_to_string(path.join("smaps_rollup")) else {
            continue;
        };
        for line in rollup.lines() {
            if let Some(kb) = line.strip_prefix("Pss:") {
                total += kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0)
                    * 1024;
            }
        }
    }
    total
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
        let (elapsed, _) = throughput(client).await?;
        println!(
            "  stdout 10 MB ({label:<11})                 {:>8.1} MB/s  ({})",
            10.24 / elapsed.as_secs_f64(),
            ms(elapsed)
        );
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
    if pss > 0 {
        println!(
            "  resident memory of one idle machine (PSS, all its processes) {:>6.1} MB",
            pss as f64 / 1e6
        );
    }
    if backend == "gvisor" {
        swap_figures(&client, home.path()).await?;
    }
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
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    println!(
        "evervm bench: {} rounds, {} cores",
        args.rounds,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    for backend in &args.backends {
        if args.throughput_only {
            let (client, engine, _home) = local(backend, 0).await?;
            for _ in 0..args.rounds.min(20) {
                let (elapsed, _) = throughput(&client).await?;
                println!(
                    "{backend}: stdout 10 MB in-process {:>8.1} MB/s",
                    10.24 / elapsed.as_secs_f64()
                );
            }
            engine.shutdown().await;
        } else {
            bench_backend(backend, args.rounds).await?;
        }
    }
    Ok(())
}
