//! The evervm benchmark program: prints figures, asserts nothing.
//!
//! `cargo run --release -p evervm-examples --bin bench -- [--backend process] [--rounds 300]`
//!
//! Per backend: machine create latency (the API call, and create plus the first instruction,
//! which starts the sandbox), the round trip of `1+1` (p50/p99) in-process, over HTTP (exec then
//! long-poll result) and over a WebSocket session, and stdout throughput for 10 MB.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use evervm::{Client, CreateMachineOptions, ExecOptions, LocalOptions};
use evervm_tests::TestServer;

struct Args {
    backends: Vec<String>,
    rounds: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        backends: Vec::new(),
        rounds: 300,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--backend" => args
                .backends
                .push(it.next().context("--backend needs a name")?),
            "--rounds" => args.rounds = it.next().context("--rounds needs a number")?.parse()?,
            other => bail!("unknown argument {other:?}; use --backend NAME, --rounds N"),
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

async fn creates(client: &Client, count: usize) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut api = Vec::new();
    let mut first = Vec::new();
    for _ in 0..count {
        let started = Instant::now();
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        api.push(started.elapsed());
        machine.exec("1").await?;
        first.push(started.elapsed());
    }
    Ok((api, first))
}

async fn bench_backend(backend: &str, rounds: usize) -> Result<()> {
    println!("backend {backend}");
    let home = tempfile::tempdir()?;
    let local = Client::local(LocalOptions {
        home: Some(home.path().to_owned()),
        backend: Some(backend.to_owned()),
        account: None,
    })?;
    let (api, first) = creates(&local, 20).await?;
    report("create machine (API call)", api);
    report("create + first instruction (cold start)", first);
    report(
        "exec 1+1 round trip, in-process",
        round_trips(&local, rounds).await?,
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

    for (label, client) in [("in-process", &local), ("HTTP stream", &remote)] {
        let (elapsed, _) = throughput(client).await?;
        println!(
            "  stdout 10 MB ({label:<11})                 {:>8.1} MB/s  ({})",
            10.24 / elapsed.as_secs_f64(),
            ms(elapsed)
        );
    }
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
        bench_backend(backend, args.rounds).await?;
    }
    Ok(())
}
