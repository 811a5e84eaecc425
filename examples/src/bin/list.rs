//! How long listing machines and reading one machine's info take on a home with many machines
//! (10,000 by default), in-process and over HTTP. The machines are written straight into a
//! fresh home (a row each, and for gVisor-like homes a small snapshot each), so the run measures
//! the engine's bookkeeping, not sandboxes.
//!
//! ```text
//! cargo run --release -p evervm-examples --bin list -- [--machines N] [--rounds N]
//! ```

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use evervm::engine::snapshot::SnapshotManifest;
use evervm::engine::store::{MachineRecord, Store};
use evervm::engine::{
    BackendChoice, Durability, Engine, EngineConfig, MachineName, Tags, guest::image::Profile,
};
use evervm_examples::measure::report;

struct Args {
    machines: usize,
    rounds: usize,
}

fn args() -> Result<Args> {
    let mut args = Args {
        machines: 10_000,
        rounds: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--machines" => {
                args.machines = it.next().context("--machines needs a number")?.parse()?;
            }
            "--rounds" => args.rounds = it.next().context("--rounds needs a number")?.parse()?,
            other => anyhow::bail!("unknown argument {other:?}; use --machines N, --rounds N"),
        }
    }
    Ok(args)
}

/// Writes `count` machines of one account into `home`: rows, and a snapshot directory each
/// (a manifest and a 4 KiB image, not fsynced: a fixture).
fn populate(home: &std::path::Path, count: usize, runtime: &str) -> Result<Vec<String>> {
    let mut store = Store::open(&home.join("evervm.db"))?;
    let account = store.ensure_account("bench")?;
    let mut names = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("bench{i:08}");
        let mut tags = Tags::new();
        tags.insert("team".to_owned(), format!("t{}", i % 10));
        store.insert_machine(&MachineRecord {
            name: MachineName::parse(&name)?,
            account_id: account.id,
            created_at: chrono::Utc::now(),
            tags,
            memory_mb: 512,
            image: Profile::Minimal,
            backend: "process".to_owned(),
            next_seq: 0,
            last_used_at: None,
            last_error: None,
            durability: Durability::Idle,
            unsaved_since: None,
            snapshot_at: Some(chrono::Utc::now()),
            env: evervm::engine::Env::new(),
            expires_at: None,
            position: 0,
            network: evervm::NetworkPolicy::None,
            snapshot_sha256: None,
            history: 0,
            parent: None,
            forked_at: None,
            env_error: None,
        })?;
        let dir = evervm::engine::snapshot::snapshot_dir(home, &name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("checkpoint.img"), [7u8; 4096])?;
        let manifest = SnapshotManifest {
            format: 1,
            engine_version: "bench".to_owned(),
            runtime: runtime.to_owned(),
            image_id: None,
            sha256: String::new(),
            bytes: 4096,
            created_at: chrono::Utc::now().to_rfc3339(),
        };
        std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&manifest)?)?;
        names.push(name);
    }
    Ok(names)
}

async fn timed<T, F: std::future::Future<Output = T>>(samples: &mut Vec<Duration>, f: F) -> T {
    let started = Instant::now();
    let out = f.await;
    samples.push(started.elapsed());
    out
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = args()?;
    let home = tempfile::tempdir()?;
    let started = Instant::now();
    // The process backend: this measures the engine's bookkeeping, which is the same on every
    // backend (the snapshots' runtime is the process backend's, so they read as usable).
    let names = populate(home.path(), args.machines, "process")?;
    println!(
        "{} machines written in {:.1} s",
        names.len(),
        started.elapsed().as_secs_f64()
    );
    let mut config = EngineConfig::new(home.path());
    config.backend = BackendChoice::parse("process");
    config.pool_size = 0;
    config.limits.max_machines_per_account = args.machines + 1;
    let engine = Engine::open(config).await?;
    let account = engine.ensure_account("bench").await?;

    let mut first = Vec::new();
    let listed = timed(&mut first, engine.list_machines(&account, &Tags::new())).await?;
    anyhow::ensure!(listed.len() == args.machines, "listed {}", listed.len());
    report("list, first call (reads every snapshot)", first);

    let mut list = Vec::new();
    for _ in 0..args.rounds {
        timed(&mut list, engine.list_machines(&account, &Tags::new())).await?;
    }
    report(&format!("list all {} machines", args.machines), list);

    let filter: Tags = [("team".to_owned(), "t3".to_owned())].into();
    let mut filtered = Vec::new();
    for _ in 0..args.rounds {
        timed(&mut filtered, engine.list_machines(&account, &filter)).await?;
    }
    report("list with a tag filter (a tenth match)", filtered);

    let mut info = Vec::new();
    for i in 0..args.rounds * 10 {
        let name = &names[(i * 7919) % names.len()];
        timed(&mut info, engine.machine_info(&account, name)).await?;
    }
    report("info of one machine (reads its snapshot)", info);

    // Over HTTP: the whole JSON list.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let token = engine.create_token("bench").await?;
    let server = tokio::spawn(evervm::server::serve_with_shutdown(
        engine.clone(),
        listener,
        std::future::pending(),
    ));
    let http = reqwest::Client::new();
    let mut over_http = Vec::new();
    let mut bytes = 0;
    for _ in 0..args.rounds {
        let body = timed(&mut over_http, async {
            http.get(format!("http://{address}/v1/machine/list"))
                .bearer_auth(&token)
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await
        })
        .await?;
        bytes = body.len();
    }
    report(
        &format!("GET /v1/machine/list ({} KiB)", bytes / 1024),
        over_http,
    );
    server.abort();
    Ok(())
}
