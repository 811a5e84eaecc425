//! The snapshot chunk store on gVisor: swapped machines' snapshots share their chunks, restore
//! whole, a damaged chunk refuses only the machines whose snapshots hold it, and deleting a
//! machine frees the chunks no other snapshot holds.

use std::path::Path;
use std::time::Duration;

use evervm::Client;

use crate::value;

/// An engine that chunks every swap-out at once (see [`crate::engine_saving_in_place`]).
async fn chunking_engine(home: &Path) -> Option<(evervm::engine::Engine, Client)> {
    let mut config = crate::gvisor_config(home);
    config.compress_swaps = true;
    config.compress_after = Duration::ZERO;
    crate::engine_saving_in_place(config).await
}

fn snapshot(home: &Path, machine: &evervm::Machine) -> std::path::PathBuf {
    home.join("machines").join(machine.name()).join("snapshot")
}

/// The packs in the store, oldest first.
fn packs(home: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(home.join("chunks/packs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .map(|e| (e.metadata().unwrap().modified().unwrap(), e.path()))
        .collect();
    found.sort();
    found.into_iter().map(|(_, path)| path).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn swapped_machines_share_chunks_restore_whole_and_damage_stays_with_its_owner() {
    let home = tempfile::tempdir().unwrap();
    let Some((engine, client)) = chunking_engine(home.path()).await else {
        return;
    };
    let first = crate::new_machine(&client, None).await;
    value(&first, "a = 'first'; data = list(range(50000))").await;
    first.swap_out().await.unwrap();
    let dir = snapshot(home.path(), &first);
    assert!(dir.join("pages.img.chunks").is_file(), "not chunked");
    assert!(!dir.join("pages.img").exists());
    let seeded = engine.snapshot_chunk_stats();
    assert!(seeded.bytes > 200_000, "{seeded:?}");
    // Its disk counts the chunks its recipes name, not the recipes alone (quotas rely on it).
    let disk = first.info().await.unwrap().disk_bytes.unwrap_or_default();
    assert!(
        disk * 2 > seeded.bytes && disk <= seeded.bytes + 100_000,
        "{disk} of {seeded:?}"
    );

    // Two more machines like it: each brings a small part of what the first did.
    let mut others = Vec::new();
    let mut third_packs = Vec::new();
    for name in ["second", "third"] {
        let m = crate::new_machine(&client, None).await;
        value(&m, &format!("a = {name:?}; data = list(range(50000))")).await;
        let before = packs(home.path());
        m.swap_out().await.unwrap();
        third_packs = packs(home.path())
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        others.push(m);
    }
    let three = engine.snapshot_chunk_stats();
    let added = three.bytes - seeded.bytes;
    assert!(
        added < seeded.bytes / 2,
        "two more machines added {added} bytes to the first's {}",
        seeded.bytes
    );

    // The third machine's own chunks are in the pack its swap-out wrote: damaged, only it is
    // refused; the others restore whole, each with its own state.
    assert_eq!(third_packs.len(), 1, "{third_packs:?}");
    let mut bytes = std::fs::read(&third_packs[0]).unwrap();
    bytes[40] ^= 0x55;
    std::fs::write(&third_packs[0], &bytes).unwrap();
    let refused = others[1].exec("a").await;
    let err = match refused {
        Err(e) => e.to_string(),
        Ok(run) => run.result.error.unwrap_or_default(),
    };
    assert!(err.contains("damaged"), "{err}");
    assert_eq!(value(&first, "a, len(data)").await, "('first', 50000)");
    assert_eq!(
        value(&others[0], "a, sum(data)").await,
        "('second', 1249975000)"
    );

    // Deleting machines gives their chunks back, all but what the others still hold.
    first.swap_out().await.unwrap();
    others[0].swap_out().await.unwrap();
    let before = engine.snapshot_chunk_stats();
    others[1].delete().await.unwrap();
    others[0].delete().await.unwrap();
    let collected = engine.collect_snapshot_chunks().await.unwrap();
    let after = engine.snapshot_chunk_stats();
    assert!(
        after.bytes < before.bytes && collected.bytes_freed > 0,
        "{collected:?}: {before:?} -> {after:?}"
    );
    assert_eq!(value(&first, "a, len(data)").await, "('first', 50000)");
    first.delete().await.unwrap();
    engine.collect_snapshot_chunks().await.unwrap();
    assert_eq!(engine.snapshot_chunk_stats().chunks, 0);
    engine.shutdown().await;
}
