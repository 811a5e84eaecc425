//! What keeping snapshots in a bucket and running nodes costs (gVisor): prints figures, asserts
//! nothing.
//!
//! `cargo run --release -p evervm-examples --bin cluster_bench -- --database postgres://... \
//!  --snapshots s3://BUCKET/PREFIX [--rounds 300]` (the bucket's endpoint and keys from the
//! standard `AWS_*` environment; `scripts/postgres.sh` and `scripts/seaweedfs.sh` start a
//! PostgreSQL and a SeaweedFS on loopback).
//!
//! - Swap-out and restore plus first instruction of one machine (fresh, and holding
//!   `list(range(10**6))`), ten each: with the home's copy current (the cache), and with it
//!   removed so that every restore downloads from the bucket; the size of the snapshot.
//! - Two nodes in this process sharing the database and the bucket: the `1+1` round trip over
//!   HTTP (exec, then long-poll the result) through the node that runs the machine, and through
//!   the other node, which forwards both requests.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use evervm::engine::bucket::BucketSettings;
use evervm::engine::store::PostgresSettings;
use evervm::engine::{BackendChoice, Engine, EngineConfig, NodeSettings};
use evervm::{Client, CreateMachineOptions};
use evervm_examples::measure::report;

struct Args {
    database: String,
    snapshots: String,
    rounds: usize,
}

fn parse_args() -> Result<Args> {
    let (mut database, mut snapshots, mut rounds) = (None, None, 300);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--database" => database = Some(it.next().context("--database needs a URL")?),
            "--snapshots" => snapshots = Some(it.next().context("--snapshots needs a URL")?),
            "--rounds" => rounds = it.next().context("--rounds needs a number")?.parse()?,
            other => bail!(
                "unknown argument {other:?}; use --database URL --snapshots s3://BUCKET/PREFIX \
                 [--rounds N]"
            ),
        }
    }
    Ok(Args {
        database: database.context("--database postgres://... is needed")?,
        snapshots: snapshots.context("--snapshots s3://... is needed")?,
        rounds,
    })
}

fn config(home: &std::path::Path, args: &Args) -> Result<EngineConfig> {
    let mut config = EngineConfig::new(home);
    config.backend = BackendChoice::parse("gvisor");
    config.idle_swap = None;
    config.pool_size = 1;
    config.default_image = evervm::engine::guest::image::Profile::Minimal;
    config.database = Some(PostgresSettings::parse(&args.database)?);
    config.snapshots = Some(BucketSettings::parse(&args.snapshots)?);
    Ok(config)
}

/// Swap-out and restore plus first instruction, ten each, from the cache and from the bucket.
async fn bucket_figures(args: &Args) -> Result<()> {
    let home = tempfile::tempdir()?;
    let engine = Engine::open(config(home.path(), args)?).await?;
    let account = engine.ensure_account("bench").await?;
    let client = Client::from_engine(engine.clone(), account);
    for (what, setup) in [
        ("fresh machine", "x = 1"),
        ("list(range(10**6))", "x = list(range(10**6))"),
    ] {
        println!("snapshots in the bucket: {what}");
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        machine.exec(setup).await?;
        let dir = evervm::engine::snapshot::snapshot_dir(home.path(), machine.name());
        let (mut swaps, mut cached, mut downloaded) = (Vec::new(), Vec::new(), Vec::new());
        for from_bucket in [false, true] {
            for _ in 0..10 {
                let started = Instant::now();
                machine.swap_out().await?;
                swaps.push(started.elapsed());
                if from_bucket {
                    evervm::engine::snapshot::remove_copy(home.path(), machine.name())?;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                let started = Instant::now();
                let run = machine.exec("len(str(x))").await?;
                let took = started.elapsed();
                if let Some(error) = run.result.error {
                    bail!("the restored machine failed: {error}");
                }
                if from_bucket {
                    downloaded.push(took);
                } else {
                    cached.push(took);
                }
            }
        }
        report("swap-out (upload included)", swaps);
        report("restore + first instruction, from the cache", cached);
        report("restore + first instruction, from the bucket", downloaded);
        machine.swap_out().await?;
        println!(
            "  snapshot{:>44.2} MB",
            evervm::engine::snapshot::dir_bytes(&dir) as f64 / 1e6
        );
        machine.delete().await?;
    }
    engine.shutdown().await;
    Ok(())
}

/// A node of a cluster serving on loopback in this process.
struct Node {
    engine: Engine,
    url: String,
    _home: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

async fn start_node(id: &str, args: &Args) -> Result<Node> {
    let home = tempfile::tempdir()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let mut config = config(home.path(), args)?;
    config.node = Some(NodeSettings::new(id, &url)?);
    let engine = Engine::open(config).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = engine.clone();
    let served = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = evervm::server::serve_with_shutdown(serving, listener, shutdown).await {
            eprintln!("a node stopped serving: {e}");
        }
    });
    Ok(Node {
        engine,
        url,
        _home: home,
        stop,
        served,
    })
}

/// `1+1` over HTTP through one server on the same database and bucket that is no node (what the
/// store costs), then through each of two nodes, the machine on the first.
async fn forwarding_figures(args: &Args) -> Result<()> {
    {
        let home = tempfile::tempdir()?;
        let server = evervm_tests::TestServer::start_with("gvisor", {
            let config = config(home.path(), args)?;
            move |c: &mut EngineConfig| {
                c.database = config.database;
                c.snapshots = config.snapshots;
                c.default_image = config.default_image;
                c.idle_swap = None;
                c.pool_size = 1;
            }
        });
        let token =
            evervm::admin::create_token(server.home(), Some(&args.database), "bench", None).await?;
        let client = Client::remote(&server.url, &token)?;
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        machine.exec("1").await?;
        println!("one server, no cluster (PostgreSQL and the bucket)");
        report(
            "exec 1+1 over HTTP",
            http_round_trips(&machine, args.rounds).await?,
        );
        machine.delete().await?;
    }
    let a = start_node("bench-a", args).await?;
    let b = start_node("bench-b", args).await?;
    let token = a.engine.create_token("bench").await?;
    let (on_a, through_b) = (
        Client::remote(&a.url, &token)?,
        Client::remote(&b.url, &token)?,
    );
    let machine = on_a.create_machine(CreateMachineOptions::default()).await?;
    machine.exec("1").await?;
    let forwarded = through_b.machine(machine.name());
    println!("two nodes on loopback (PostgreSQL and the bucket shared)");
    for (label, machine) in [
        ("exec 1+1 over HTTP, through its node", &machine),
        ("exec 1+1 over HTTP, through the other node", &forwarded),
    ] {
        report(label, http_round_trips(machine, args.rounds).await?);
    }
    machine.delete().await?;
    for node in [a, b] {
        let _ = node.stop.send(());
        let _ = node.served.await;
    }
    Ok(())
}

/// `rounds` runs of `1+1`, each timed.
async fn http_round_trips(machine: &evervm::Machine, rounds: usize) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let run = machine.exec("1+1").await?;
        times.push(started.elapsed());
        if run.result.value.as_deref() != Some("2") {
            bail!("1+1 gave {:?}", run.result);
        }
    }
    Ok(times)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    println!(
        "evervm cluster bench: {} rounds, {} cores",
        args.rounds,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    bucket_figures(&args).await?;
    forwarding_figures(&args).await?;
    Ok(())
}
