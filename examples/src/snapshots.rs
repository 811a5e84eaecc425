//! What snapshots cost on disk and in time, for the benchmark's `--only chunks` (gVisor): many
//! fresh machines swapped out, each snapshot compressed whole (as before the chunk store) and
//! chunked into the store, side by side in one run; and restore plus the first instruction
//! from an uncompressed, a whole-compressed and a chunked snapshot.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use evervm::engine::{BackendChoice, Engine, EngineConfig};
use evervm::{Client, CreateMachineOptions};

use crate::measure::report;

/// How a swapped machine's snapshot is kept.
#[derive(Clone, Copy)]
enum Kept {
    Uncompressed,
    Whole,
    Chunked,
}

impl Kept {
    fn label(self) -> &'static str {
        match self {
            Kept::Uncompressed => "uncompressed",
            Kept::Whole => "compressed whole (zstd)",
            Kept::Chunked => "chunked (deduplicated)",
        }
    }
}

async fn engine(home: &Path, kept: Kept) -> Result<(Engine, Client)> {
    let mut config = EngineConfig::new(home);
    config.backend = BackendChoice::parse("gvisor");
    config.pool_size = 2;
    config.idle_swap = None;
    config.compress_swaps = !matches!(kept, Kept::Uncompressed);
    config.chunk_snapshots = matches!(kept, Kept::Chunked);
    // At the swap-out itself, not ten minutes later.
    config.compress_after = Duration::ZERO;
    let engine = Engine::open(config).await?;
    let account = engine.ensure_account("bench").await?;
    Ok((engine.clone(), Client::from_engine(engine, account)))
}

/// Bytes the files under `dir` take on disk (allocated blocks, so a small file counts for its
/// whole block), and their sizes.
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut allocated = 0;
    let mut apparent = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            let (a, b) = disk_usage(&entry.path());
            allocated += a + meta.blocks() * 512;
            apparent += b;
        } else {
            allocated += meta.blocks() * 512;
            apparent += meta.len();
        }
    }
    (allocated, apparent)
}

/// What the home keeps for machines' snapshots: their directories and the chunk store.
fn snapshot_usage(home: &Path) -> (u64, u64) {
    let (a1, b1) = disk_usage(&home.join("machines"));
    let (a2, b2) = disk_usage(&home.join("chunks"));
    (a1 + a2, b1 + b2)
}

/// `machines` fresh machines (each ran `x = i`) swapped out, per way of keeping snapshots:
/// disk in all, and per machine over the second half (the marginal cost, once the first
/// machines have brought what they all share); then restores of one machine.
#[allow(clippy::print_stdout)]
pub async fn chunk_figures(machines: usize) -> Result<()> {
    println!("snapshots of {machines} fresh machines made from one base, swapped out");
    for kept in [Kept::Whole, Kept::Chunked] {
        let home = tempfile::tempdir()?;
        let (engine, client) = engine(home.path(), kept).await?;
        let started = Instant::now();
        let mut at_half = (0, 0);
        for i in 0..machines {
            let machine = client
                .create_machine(CreateMachineOptions::default())
                .await?;
            machine.exec(&format!("x = {i}")).await?;
            machine.swap_out().await?;
            if i + 1 == machines / 2 {
                at_half = snapshot_usage(home.path());
            }
        }
        let elapsed = started.elapsed();
        let (allocated, apparent) = snapshot_usage(home.path());
        let second_half = (machines - machines / 2).max(1) as f64;
        println!(
            "  {:<26} {:>8.1} MB on disk ({:.1} MB of files), marginal per machine {:>7.1} KB \
             on disk ({:.1} KB of files); {:.1} s for all",
            kept.label(),
            allocated as f64 / 1e6,
            apparent as f64 / 1e6,
            (allocated - at_half.0) as f64 / second_half / 1e3,
            (apparent - at_half.1) as f64 / second_half / 1e3,
            elapsed.as_secs_f64()
        );
        if let Kept::Chunked = kept {
            let stats = engine.snapshot_chunk_stats();
            println!(
                "  {:<26} {} chunks in {} packs, {:.1} MB",
                "chunk store",
                stats.chunks,
                stats.packs,
                stats.bytes as f64 / 1e6
            );
        }
        engine.shutdown().await;
    }
    for kept in [Kept::Uncompressed, Kept::Whole, Kept::Chunked] {
        let home = tempfile::tempdir()?;
        let (engine, client) = engine(home.path(), kept).await?;
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        machine.exec("x = list(range(100000))").await?;
        let mut restores = Vec::new();
        let mut swaps = Vec::new();
        for _ in 0..15 {
            let started = Instant::now();
            machine.swap_out().await?;
            swaps.push(started.elapsed());
            // The sandbox a restore goes into is created ahead of time meanwhile.
            tokio::time::sleep(Duration::from_millis(400)).await;
            let started = Instant::now();
            machine.exec("len(x)").await?;
            restores.push(started.elapsed());
        }
        report(&format!("swap-out, {}", kept.label()), swaps);
        report(&format!("restore + first, {}", kept.label()), restores);
        engine.shutdown().await;
    }
    Ok(())
}
