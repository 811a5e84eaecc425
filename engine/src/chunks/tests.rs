use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;

/// Memory of `pages` pages: page `i` holds `seed(i)` (0 gives a zero page).
fn memory(pages: usize, seed: impl Fn(usize) -> u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(pages * PAGE);
    for i in 0..pages {
        let value = seed(i);
        let mut page = vec![0u8; PAGE];
        if value != 0 {
            for (j, word) in page.chunks_exact_mut(8).enumerate() {
                word.copy_from_slice(
                    &(value.wrapping_mul(31).wrapping_add(j as u64)).to_le_bytes(),
                );
            }
        }
        bytes.extend_from_slice(&page);
    }
    bytes
}

/// A snapshot directory `dir` with these files, chunked into `store`.
fn save(store: &Arc<ChunkStore>, dir: &Path, pages: &[u8], state: &[u8]) -> Pinned {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("pages.img"), pages).unwrap();
    std::fs::write(dir.join("checkpoint.img"), state).unwrap();
    store
        .put_files(dir, &["pages.img".into(), "checkpoint.img".into()], 3)
        .unwrap()
}

fn read_back(store: &ChunkStore, dir: &Path, name: &str) -> Result<Vec<u8>> {
    let out = dir.join(format!(".out-{name}-{:x}", rand::random::<u64>()));
    let done = store.materialize(&dir.join(format!("{name}.chunks")), &out);
    let bytes = std::fs::read(&out);
    let _ = std::fs::remove_file(&out);
    done.map(|()| bytes.unwrap_or_default())
}

#[test]
fn snapshots_share_their_chunks_and_read_back_whole() {
    let home = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(home.path()).unwrap();
    // Big enough to be put back together by several threads.
    let base = memory(1200, |i| if i % 3 == 0 { 0 } else { i as u64 });
    let state: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let a = home.path().join("machines/a/snapshot");
    drop(save(&store, &a, &base, &state));
    assert!(!a.join("pages.img").exists());
    assert_eq!(read_back(&store, &a, "pages.img").unwrap(), base);
    assert_eq!(read_back(&store, &a, "checkpoint.img").unwrap(), state);
    let first = store.stats();
    assert_eq!(first.packs, 1);
    // Zero pages are one chunk: 800 distinct pages, four state pieces, and a few lists.
    assert!(first.chunks < 800 + 4 + 50, "{first:?}");
    let recipe = std::fs::metadata(a.join("pages.img.chunks")).unwrap().len();
    assert!(recipe < 1024, "a recipe of {recipe} bytes");
    // What it takes in the store: the one pack but its index, whatever the recipes say.
    let taken = store.referenced_bytes(std::slice::from_ref(&a));
    assert!(
        taken * 4 > first.bytes * 3 && taken <= first.bytes,
        "{taken} of {first:?}"
    );

    // The same memory with one page more near the start and two pages changed: a handful of
    // chunks more, however far the rest moved.
    let mut moved = memory(1, |_| 99_999);
    moved.extend_from_slice(&base);
    moved[300 * PAGE..301 * PAGE].fill(7);
    moved[500 * PAGE..501 * PAGE].fill(8);
    let b = home.path().join("machines/b/snapshot");
    drop(save(&store, &b, &moved, &state));
    let second = store.stats();
    assert_eq!(second.packs, 2);
    let added = second.chunks - first.chunks;
    assert!(added <= 3 + 8, "{added} chunks added");
    assert!(
        second.bytes - first.bytes < 40_000,
        "{second:?} after {first:?}"
    );
    assert_eq!(read_back(&store, &b, "pages.img").unwrap(), moved);

    // Opened again from the disk, the store knows the same chunks.
    let reopened = ChunkStore::open(home.path()).unwrap();
    assert_eq!(reopened.stats(), second);
    assert_eq!(read_back(&reopened, &a, "pages.img").unwrap(), base);
}

#[test]
fn a_damaged_chunk_refuses_only_the_snapshots_that_hold_it_and_collection_frees_the_rest() {
    let home = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(home.path()).unwrap();
    let shared = memory(64, |i| i as u64 + 1);
    let a = home.path().join("machines/a/snapshot");
    let b = home.path().join("machines/b/snapshot");
    drop(save(&store, &b, &shared, b"state b"));
    let mut own = shared.clone();
    own.extend_from_slice(&memory(1, |_| 777));
    drop(save(&store, &a, &own, b"state a"));
    // a's own page is alone in the second pack's first frame: damage it.
    let own_page: Hash = Sha256::digest(&own[64 * PAGE..]).into();
    let location = lock(&store.state).index[&own_page];
    let path = lock(&store.state).packs[&location.pack].path.clone();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[location.entry.frame_offset as usize + 8] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let err = read_back(&store, &a, "pages.img").unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::MachineCrashed);
    assert!(err.message().contains("damaged"), "{err}");
    assert_eq!(read_back(&store, &b, "pages.img").unwrap(), shared);

    // a deleted: its own chunks go, b's stay.
    let roots = [home.path().join("machines")];
    std::fs::remove_dir_all(home.path().join("machines/a")).unwrap();
    let collected = store.collect(&roots, u64::MAX).unwrap();
    assert_eq!(collected.recipes, 2);
    assert!(
        collected.packs_removed + collected.packs_rewritten >= 1,
        "{collected:?}"
    );
    assert!(collected.chunks_removed >= 2, "{collected:?}");
    assert!(!lock(&store.state).index.contains_key(&own_page));
    assert_eq!(read_back(&store, &b, "pages.img").unwrap(), shared);
    assert_eq!(read_back(&store, &b, "checkpoint.img").unwrap(), b"state b");
    // b deleted: nothing is left.
    std::fs::remove_dir_all(home.path().join("machines/b")).unwrap();
    store.collect(&roots, u64::MAX).unwrap();
    assert_eq!(store.stats(), ChunkStats::default());
    let left = std::fs::read_dir(home.path().join("chunks/packs"))
        .unwrap()
        .count();
    assert_eq!(left, 0);
}

#[test]
fn a_mostly_dead_pack_is_rewritten_and_its_live_chunks_stay_readable() {
    let home = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(home.path()).unwrap();
    let roots = [home.path().join("machines")];
    let big = memory(100, |i| i as u64 + 1);
    let a = home.path().join("machines/a/snapshot");
    drop(save(&store, &a, &big, b"a"));
    // b keeps ten of a's pages; a goes.
    let b = home.path().join("machines/b/snapshot");
    drop(save(&store, &b, &big[..10 * PAGE], b"b"));
    std::fs::remove_dir_all(home.path().join("machines/a")).unwrap();
    let before = store.stats();
    let collected = store.collect(&roots, u64::MAX).unwrap();
    assert_eq!(collected.packs_rewritten, 1, "{collected:?}");
    let after = store.stats();
    assert!(after.bytes < before.bytes / 2, "{after:?} after {before:?}");
    assert_eq!(
        read_back(&store, &b, "pages.img").unwrap(),
        &big[..10 * PAGE]
    );
    let reopened = ChunkStore::open(home.path()).unwrap();
    assert_eq!(
        read_back(&reopened, &b, "pages.img").unwrap(),
        &big[..10 * PAGE]
    );
}

/// A save: chunked in a scratch directory, renamed into place, then its pins dropped; the
/// snapshot it replaces removed.
fn replace(store: &Arc<ChunkStore>, root: &Path, machine: usize, round: usize) -> Vec<u8> {
    let dir = root.join(format!("m{machine}"));
    let staging = root.join(format!(".tmp-m{machine}-{round}"));
    // Each round shares most pages with the machine's last one and with the other machines.
    let pages = memory(40, |i| {
        if i % 4 == 0 {
            (round * 1000 + machine * 100 + i) as u64
        } else {
            i as u64 + 1
        }
    });
    let pinned = save(
        store,
        &staging,
        &pages,
        format!("{machine}/{round}").as_bytes(),
    );
    let old = root.join(format!(".old-m{machine}-{round}"));
    if dir.exists() {
        std::fs::rename(&dir, &old).unwrap();
    }
    std::fs::rename(&staging, &dir).unwrap();
    drop(pinned);
    let _ = std::fs::remove_dir_all(&old);
    pages
}

/// A thread that collects until `stop` (`collect` says whether a pass ended); how many passes
/// ended.
fn spawn_collector(
    store: &Arc<ChunkStore>,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    root: &Path,
    collect: impl Fn(&Arc<ChunkStore>, &PathBuf) -> bool + Send + 'static,
) -> std::thread::JoinHandle<usize> {
    let (store, stop, root) = (Arc::clone(store), Arc::clone(stop), root.to_owned());
    std::thread::spawn(move || {
        let mut passes = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            passes += usize::from(collect(&store, &root));
        }
        passes
    })
}

#[test]
fn collection_racing_saves_never_loses_a_live_chunk() {
    let home = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(home.path()).unwrap();
    let root: PathBuf = home.path().join("machines");
    std::fs::create_dir_all(&root).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Whole passes, and passes in the smallest slices there are (one recipe or pack each), so
    // that saves begin and end in the middle of them.
    let collector = spawn_collector(&store, &stop, &root, |store, root| {
        store.collect(std::slice::from_ref(root), u64::MAX).unwrap();
        true
    });
    let slicer = spawn_collector(&store, &stop, &root, |store, root| {
        store
            .collect_slice(std::slice::from_ref(root), u64::MAX, Duration::ZERO)
            .unwrap()
            .finished
    });
    let savers: Vec<_> = (0..2)
        .map(|t| {
            let store = Arc::clone(&store);
            let root = root.clone();
            std::thread::spawn(move || {
                let mut last = std::collections::HashMap::new();
                for round in 0..120 {
                    let machine = t * 3 + round % 3;
                    let pages = replace(&store, &root, machine, round);
                    last.insert(machine, pages);
                    // Every machine's current snapshot reads back whole, at every step.
                    for (m, pages) in &last {
                        let dir = root.join(format!("m{m}"));
                        assert_eq!(&read_back(&store, &dir, "pages.img").unwrap(), pages);
                    }
                }
                last
            })
        })
        .collect();
    let mut last = std::collections::HashMap::new();
    for saver in savers {
        last.extend(saver.join().unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let passes = collector.join().unwrap();
    assert!(passes > 3, "only {passes} collections ran");
    let sliced = slicer.join().unwrap();
    assert!(sliced > 3, "only {sliced} sliced collections ran");
    store
        .collect(std::slice::from_ref(&root), u64::MAX)
        .unwrap();
    for (m, pages) in &last {
        let dir = root.join(format!("m{m}"));
        assert_eq!(&read_back(&store, &dir, "pages.img").unwrap(), pages);
    }
    // What the six machines hold now is about all the store keeps.
    let stats = store.stats();
    assert!(stats.chunks < 6 * 10 + 30 + 6 * 4 + 50, "{stats:?}");
}

#[test]
fn a_pass_in_slices_keeps_what_is_saved_between_them_and_frees_what_was_deleted_before() {
    let home = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(home.path()).unwrap();
    let root: PathBuf = home.path().join("machines");
    let roots = [root.clone()];
    // m0's pages and state are its own, in a pack of their own.
    let m0_pages = memory(20, |i| 10_000 + i as u64);
    drop(save(&store, &root.join("m0"), &m0_pages, b"m0 alone"));
    for machine in 1..4 {
        replace(&store, &root, machine, 0);
    }
    // Slices of one step each: the pass is under way after the first.
    let first = store
        .collect_slice(&roots, u64::MAX, Duration::ZERO)
        .unwrap();
    assert!(!first.finished && !first.skipped, "{first:?}");
    assert!(store.collecting());
    let mut saved = Vec::new();
    let mut slices = 1;
    loop {
        // A new snapshot for a machine the scan has (or has not yet) looked at, and one gone.
        if slices < 4 {
            saved.push((slices, replace(&store, &root, slices, slices)));
        }
        if slices == 2 {
            std::fs::remove_dir_all(root.join("m0")).unwrap();
        }
        let slice = store
            .collect_slice(&roots, u64::MAX, Duration::ZERO)
            .unwrap();
        slices += 1;
        if slice.finished {
            assert!(!slice.given_up, "{slice:?}");
            break;
        }
        assert!(slices < 1000, "the pass does not end");
    }
    assert!(!store.collecting());
    assert!(slices > 4, "a pass of {slices} slices");
    for (machine, pages) in &saved {
        let dir = root.join(format!("m{machine}"));
        assert_eq!(&read_back(&store, &dir, "pages.img").unwrap(), pages);
    }
    // A whole pass now has freed what m0 alone held.
    let whole = store.collect(&roots, u64::MAX).unwrap();
    assert!(whole.finished && whole.recipes == 6, "{whole:?}");
    let m0_state: Hash = Sha256::digest(b"m0 alone").into();
    assert!(!lock(&store.state).index.contains_key(&m0_state));
    for (machine, pages) in &saved {
        let dir = root.join(format!("m{machine}"));
        assert_eq!(&read_back(&store, &dir, "pages.img").unwrap(), pages);
    }
}

#[test]
fn a_pass_gives_up_when_saves_end_more_chunks_than_it_can_remember() {
    let home = tempfile::tempdir().unwrap();
    let mut store = ChunkStore::open(home.path()).unwrap();
    Arc::get_mut(&mut store).unwrap().recent_max = 10;
    let root: PathBuf = home.path().join("machines");
    let roots = [root.clone()];
    drop(save(
        &store,
        &root.join("m0"),
        &memory(20, |i| 10_000 + i as u64),
        b"m0 alone",
    ));
    let first = store
        .collect_slice(&roots, u64::MAX, Duration::ZERO)
        .unwrap();
    assert!(!first.finished, "{first:?}");
    // Forty pages and their list end while the pass runs: more than ten.
    std::fs::remove_dir_all(root.join("m0")).unwrap();
    let new = replace(&store, &root, 1, 1);
    let before = store.stats();
    let ended = loop {
        let slice = store
            .collect_slice(&roots, u64::MAX, Duration::ZERO)
            .unwrap();
        if slice.finished {
            break slice;
        }
    };
    assert!(ended.given_up && ended.packs_removed == 0, "{ended:?}");
    assert_eq!(store.stats(), before);
    let m0_state: Hash = Sha256::digest(b"m0 alone").into();
    assert!(lock(&store.state).index.contains_key(&m0_state));
    // The next pass starts over and frees m0's own chunks.
    let again = store.collect(&roots, u64::MAX).unwrap();
    assert!(!again.given_up && again.chunks_removed > 0, "{again:?}");
    assert!(!lock(&store.state).index.contains_key(&m0_state));
    assert_eq!(
        read_back(&store, &root.join("m1"), "pages.img").unwrap(),
        new
    );
}
