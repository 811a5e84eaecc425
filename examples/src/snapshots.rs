//! What snapshots cost on disk and in time, for the benchmark's `--only chunks` (gVisor): many
//! fresh machines swapped out, each snapshot compressed whole (as before the chunk store) and
//! chunked into the store, side by side in one run; and restore plus the first instruction
//! from an uncompressed, a whole-compressed and a chunked snapshot.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
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

/// How many memory files (`pages.img`) are under `dir` whole (not chunked).
fn memory_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                memory_files(&entry.path())
            } else {
                usize::from(entry.file_name() == "pages.img")
            }
        })
        .sum()
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
            // Nothing to free: the time it takes to read every recipe (the engine spreads a
            // pass over slices of about 200 ms).
            let started = Instant::now();
            let collected = engine.collect_snapshot_chunks().await?;
            println!(
                "  {:<26} {} recipes read in {:.0} ms, {} chunks live",
                "a whole collection pass",
                collected.recipes,
                started.elapsed().as_secs_f64() * 1e3,
                collected.live_chunks
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

/// `n += 1`, half a second, then an undo plus the next instruction's result, timed.
async fn timed_undo(machine: &evervm::Machine) -> Result<Duration> {
    machine.exec("n += 1").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    machine.undo().await?;
    let run = machine.exec("n").await?;
    let elapsed = started.elapsed();
    if run.result.error.is_some() {
        anyhow::bail!("an undo broke the machine: {:?}", run.result);
    }
    Ok(elapsed)
}

/// An undo beside what it cannot beat, in one run: 40 undos (each plus the next instruction's
/// result, half a second after the instruction undone) and 40 restores of the same machine
/// from a swap-out (plus the first instruction's result).
#[allow(clippy::print_stdout)]
pub async fn undo_figures() -> Result<()> {
    let home = tempfile::tempdir()?;
    let (engine, client) = engine(home.path(), Kept::Chunked).await?;
    let machine = client
        .create_machine(CreateMachineOptions {
            history: Some(100),
            ..CreateMachineOptions::default()
        })
        .await?;
    machine.exec("n = 0").await?;
    let (mut undos, mut restores) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        undos.push(timed_undo(&machine).await?);
        machine.swap_out().await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        machine.exec("n").await?;
        restores.push(started.elapsed());
    }
    report("undo + the next instruction's result", undos);
    report("restore + the first instruction's result", restores);
    machine.delete().await?;
    engine.shutdown().await;
    Ok(())
}

/// What history costs (gVisor, chunks at the home): the time of an instruction back to back and
/// one second apart, with and without a history; an undo plus the next instruction; and the
/// disk 100 undo points take on a machine that imported pandas and holds a 10 MB DataFrame,
/// against one whole snapshot of it.
#[allow(clippy::print_stdout)]
pub async fn history_figures() -> Result<()> {
    let home = tempfile::tempdir()?;
    let (engine, client) = engine(home.path(), Kept::Chunked).await?;
    println!("history (undo points after every instruction, chunked into the home's store)");
    for history in [None, Some(100)] {
        let machine = client
            .create_machine(CreateMachineOptions {
                history,
                image: Some("minimal".into()),
                ..CreateMachineOptions::default()
            })
            .await?;
        machine.exec("n = 0").await?;
        let label = if history.is_some() {
            "history 100"
        } else {
            "no history"
        };
        let mut back_to_back = Vec::new();
        for _ in 0..30 {
            let started = Instant::now();
            machine.exec("n += 1").await?;
            back_to_back.push(started.elapsed());
        }
        report(&format!("`n += 1` back to back, {label}"), back_to_back);
        let mut apart = Vec::new();
        for _ in 0..15 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let started = Instant::now();
            machine.exec("n += 1").await?;
            apart.push(started.elapsed());
        }
        report(&format!("`n += 1` 1 s apart, {label}"), apart);
        if history.is_some() {
            let mut undos = Vec::new();
            for _ in 0..20 {
                undos.push(timed_undo(&machine).await?);
            }
            report("undo + the next instruction's result", undos);
        }
        machine.delete().await?;
    }
    engine.collect_snapshot_chunks().await?;

    // 100 instructions of history on a machine with pandas and a 10 MB DataFrame.
    let data_home = tempfile::tempdir()?;
    let mut config = EngineConfig::new(data_home.path());
    config.backend = BackendChoice::parse("gvisor");
    config.pool_size = 1;
    config.idle_swap = None;
    config.compress_after = Duration::ZERO;
    let data_engine = Engine::open(config).await?;
    let account = data_engine.ensure_account("bench").await?;
    let data_client = Client::from_engine(data_engine.clone(), account);
    let machine = data_client
        .create_machine(CreateMachineOptions {
            history: Some(100),
            image: Some("data".into()),
            ..CreateMachineOptions::default()
        })
        .await?;
    machine
        .exec(
            "import numpy as np, pandas as pd\n\
             df = pd.DataFrame(np.random.default_rng(1).random((131072, 10)))\n\
             df.memory_usage().sum()",
        )
        .await?;
    let before = snapshot_usage(data_home.path()).0;
    let started = Instant::now();
    for i in 0..100 {
        machine
            .exec(&format!(
                "df.iat[{i}, 0] = -1.0; total = float(df[0].sum())"
            ))
            .await?;
    }
    let elapsed = started.elapsed();
    let history = machine.history(Some(1000)).await?;
    let kept = history.instructions.iter().filter(|i| i.undo_point).count();
    // The newest points are chunked a moment after they are saved (runsc writes them whole).
    let at_once = snapshot_usage(data_home.path()).0;
    let waited = Instant::now();
    while memory_files(&data_home.path().join("machines")) > 0
        && waited.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = snapshot_usage(data_home.path()).0;
    println!(
        "  right after the 100th instruction {:.1} MB on disk; once the points are chunked \
         ({:.1} s later, {} memory files left whole):",
        (at_once - before) as f64 / 1e6,
        waited.elapsed().as_secs_f64(),
        memory_files(&data_home.path().join("machines"))
    );
    // Its whole snapshot, uncompressed (as runsc writes it) and compressed whole (zstd 3): a
    // fork's, put back together once the engine has stopped (its saves are chunked).
    let fork = machine.fork(None).await?;
    let fork_dir = data_home
        .path()
        .join("machines")
        .join(fork.name())
        .join("snapshot");
    data_engine.shutdown().await;
    let whole = whole_snapshot_bytes(data_home.path(), &fork_dir)?;
    println!(
        "  100 instructions on pandas + a 10 MB DataFrame: {kept} undo points, {:.1} MB on disk \
         ({:.1} MB for the first point and the base); one snapshot of it is {:.1} MB \
         uncompressed, {:.1} MB compressed whole; {:.1} s for the 100",
        (after - before) as f64 / 1e6,
        before as f64 / 1e6,
        whole.0 as f64 / 1e6,
        whole.1 as f64 / 1e6,
        elapsed.as_secs_f64()
    );
    engine.shutdown().await;
    Ok(())
}

/// The whole snapshot in `dir` (under `home`, whose engine has stopped): its size as runsc
/// writes it (memory and kernel state, chunked files put back together), and compressed with
/// zstd 3.
fn whole_snapshot_bytes(home: &Path, dir: &Path) -> Result<(u64, u64)> {
    let chunks = evervm::engine::chunks::ChunkStore::open(home)?;
    let scratch = tempfile::tempdir()?;
    let (mut plain, mut packed) = (0u64, 0u64);
    for name in ["pages.img", "checkpoint.img"] {
        let bytes = if dir.join(name).is_file() {
            std::fs::read(dir.join(name))?
        } else {
            let recipe = std::fs::read_dir(dir)?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .and_then(|n| {
                            evervm::engine::chunks::chunked_name(&n.to_string_lossy())
                                .map(|plain| plain == name)
                        })
                        .unwrap_or(false)
                })
                .with_context(|| format!("{} holds no {name}", dir.display()))?;
            let out = scratch.path().join(name);
            chunks.materialize(&recipe, &out)?;
            std::fs::read(out)?
        };
        plain += bytes.len() as u64;
        packed += zstd::bulk::compress(&bytes, 3).map_or(0, |c| c.len()) as u64;
    }
    Ok((plain, packed))
}
