//! Garbage collection of the chunk store, by reference from the recipes on disk.
//!
//! A pass marks every chunk a recipe under the given roots names (lists included), then
//! decides pack by pack: a pack none of whose chunks is live is removed, one that is mostly
//! dead rewritten (its live chunks into a new pack, written durably before the old one goes).
//! A chunk is live when a recipe names it, when a save or copy under way has pinned it, or when
//! one that ended during the pass had (`recent`): each pack's decision is taken under the
//! store's lock, together with the pins saves take when they look a chunk up, so a save either
//! sees a chunk the pass removes as absent (and writes it anew) or has pinned it before the
//! decision (and the pass keeps it). A recipe installed while the pass runs belongs to a save
//! or copy whose pins end after it was installed, so it does not matter where the scan had
//! looked by then.
//!
//! That makes a pass safe however long it takes, and so it is done in slices
//! ([`ChunkStore::collect_slice`]), each bounded in time: the engine runs one, lets saves and
//! restores have the disk for a while, and runs the next, until the pass is done. Between
//! slices a pass holds what it has marked and the directories and packs it has yet to visit.
//! Should saves end more chunks during one pass than [`RECENT_MAX`], the pass is given up
//! (nothing removed) and a new one starts later.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use super::pack::{self, Hash};
use super::{ChunkStore, Reader, recipe, register};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::lock;

/// A pack is rewritten when less than this share (in percent) of its chunks' bytes is live.
const REWRITE_BELOW_PERCENT: u64 = 50;
/// How deep under a root recipes are looked for (`machines/<m>/checkpoints/<c>/pages.img.chunks`).
const DEPTH: usize = 5;
/// At most this many chunks of saves that end during a pass are remembered (about 50 MB); past
/// it the pass is given up.
pub(super) const RECENT_MAX: usize = 1 << 20;

/// What a collection pass did (so far, for a slice of one still under way).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collected {
    /// Recipes read.
    pub recipes: u64,
    /// Chunks found live.
    pub live_chunks: u64,
    pub packs_removed: u64,
    pub packs_rewritten: u64,
    /// Chunks that left the store.
    pub chunks_removed: u64,
    /// Bytes on disk the store gave back.
    pub bytes_freed: u64,
    /// Whether another slice was running already (this one did nothing).
    pub skipped: bool,
    /// Whether the pass is over (a slice that leaves it under way says `false`).
    pub finished: bool,
    /// Whether the pass was given up: saves ended more chunks than it can remember meanwhile.
    pub given_up: bool,
}

/// Somewhere a pass has yet to look.
#[derive(Debug)]
enum Pending {
    /// A directory, at this depth under its root.
    Dir(PathBuf, usize),
    Recipe(PathBuf),
}

/// A collection pass under way.
#[derive(Debug)]
pub(super) struct Pass {
    pending: Vec<Pending>,
    live: HashSet<Hash>,
    /// The packs yet to be decided on, once every recipe is marked.
    packs: Option<Vec<u64>>,
    /// Bytes of packs the pass may still rewrite.
    rewrite_left: u64,
    collected: Collected,
}

/// How a slice ended.
enum Slice {
    /// Time is up; the pass goes on in the next slice.
    Paused,
    Finished,
    GivenUp,
}

impl ChunkStore {
    /// One whole collection pass over the recipes under `roots`, now: one already under way
    /// is finished first (it may have marked what has been deleted since), then a new one is
    /// made from start to end. At most `rewrite_budget` bytes of packs are rewritten (the rest
    /// waits for the next pass). Blocking; a slice running on another thread is waited for.
    pub fn collect(self: &Arc<Self>, roots: &[PathBuf], rewrite_budget: u64) -> Result<Collected> {
        let mut pass = lock(&self.pass);
        if pass.is_some() {
            self.go_on(&mut pass, roots, rewrite_budget, None)?;
        }
        self.go_on(&mut pass, roots, rewrite_budget, None)
    }

    /// A slice of a collection pass over the recipes under `roots`: goes on with the pass under
    /// way, or starts one, and works on it for about `work` (a recipe or a pack at a time, so a
    /// rewrite may take it over). At most `rewrite_budget` bytes of packs are rewritten in a
    /// pass. An error reading a recipe or list other than its being gone or damaged gives the
    /// pass up before anything else is removed.
    pub fn collect_slice(
        self: &Arc<Self>,
        roots: &[PathBuf],
        rewrite_budget: u64,
        work: Duration,
    ) -> Result<Collected> {
        let mut pass = match self.pass.try_lock() {
            Ok(pass) => pass,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Ok(Collected {
                    skipped: true,
                    ..Collected::default()
                });
            }
        };
        self.go_on(
            &mut pass,
            roots,
            rewrite_budget,
            Some(Instant::now() + work),
        )
    }

    /// Whether a collection pass is under way (between two of its slices, or in one).
    pub fn collecting(&self) -> bool {
        match self.pass.try_lock() {
            Ok(pass) => pass.is_some(),
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().is_some(),
            Err(TryLockError::WouldBlock) => true,
        }
    }

    /// Works on the pass in `slot` (starting one if there is none) until `deadline`, or to its
    /// end without one.
    fn go_on(
        self: &Arc<Self>,
        slot: &mut MutexGuard<'_, Option<Pass>>,
        roots: &[PathBuf],
        rewrite_budget: u64,
        deadline: Option<Instant>,
    ) -> Result<Collected> {
        let pass = match slot.as_mut() {
            Some(pass) => pass,
            None => {
                {
                    let mut state = lock(&self.state);
                    state.collecting = true;
                    state.recent.clear();
                    state.recent_overflowed = false;
                }
                slot.insert(Pass {
                    pending: roots
                        .iter()
                        .rev()
                        .map(|root| Pending::Dir(root.clone(), 0))
                        .collect(),
                    live: HashSet::new(),
                    packs: None,
                    rewrite_left: rewrite_budget,
                    collected: Collected::default(),
                })
            }
        };
        let worked = self.work_on(pass, deadline);
        let mut collected = pass.collected;
        match worked {
            Ok(Slice::Paused) => return Ok(collected),
            Ok(Slice::Finished) => collected.finished = true,
            Ok(Slice::GivenUp) => {
                tracing::warn!(
                    "collecting snapshot chunks: saves ended more than {} chunks during one pass; \
                     gave it up, the next one starts over",
                    self.recent_max
                );
                collected.finished = true;
                collected.given_up = true;
            }
            Err(_) => {}
        }
        **slot = None;
        let mut state = lock(&self.state);
        state.collecting = false;
        state.recent = HashSet::new();
        state.recent_overflowed = false;
        drop(state);
        worked.map(|_| collected)
    }

    fn work_on(self: &Arc<Self>, pass: &mut Pass, deadline: Option<Instant>) -> Result<Slice> {
        let time_up = || deadline.is_some_and(|deadline| Instant::now() >= deadline);
        let mut reader = Reader::default();
        // Each slice does at least one thing, so that passes end however short slices are.
        while pass.packs.is_none() {
            match pass.pending.pop() {
                Some(Pending::Dir(dir, depth)) => list_into(&dir, depth, &mut pass.pending)?,
                Some(Pending::Recipe(path)) => {
                    self.mark_recipe(&path, &mut pass.live, &mut reader)?;
                    pass.collected.recipes += 1;
                }
                None => {
                    // Every pack known now (one registered later is left for the next pass).
                    let packs = lock(&self.state).packs.keys().copied().collect();
                    pass.packs = Some(packs);
                    pass.collected.live_chunks = pass.live.len() as u64;
                }
            }
            if time_up() {
                return Ok(Slice::Paused);
            }
        }
        while let Some(id) = pass.packs.as_mut().and_then(Vec::pop) {
            if !self.decide(id, pass) {
                return Ok(Slice::GivenUp);
            }
            if time_up() {
                return Ok(Slice::Paused);
            }
        }
        Ok(Slice::Finished)
    }

    /// Removes pack `id` if none of its chunks is live, rewrites it if few are (and the pass
    /// may still rewrite); `false` if the pass must be given up.
    fn decide(self: &Arc<Self>, id: u64, pass: &mut Pass) -> bool {
        let Some(path) = lock(&self.state).packs.get(&id).map(|p| p.path.clone()) else {
            return true;
        };
        // Read before the lock is taken: packs never change.
        let entries = match pack::read_index(&path) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!("leaving a snapshot pack alone: {e}");
                return true;
            }
        };
        let (remove, bytes) = {
            let mut state = lock(&self.state);
            if state.recent_overflowed {
                return false;
            }
            let Some(bytes) = state.packs.get(&id).map(|p| p.bytes) else {
                return true;
            };
            let ours = |h: &Hash| {
                state
                    .index
                    .get(h)
                    .is_some_and(|location| location.pack == id)
            };
            let live = |h: &Hash| {
                pass.live.contains(h) || state.recent.contains(h) || state.pins.contains_key(h)
            };
            let total: u64 = entries.iter().map(|e| u64::from(e.len)).sum();
            let kept: u64 = entries
                .iter()
                .filter(|e| ours(&e.hash) && live(&e.hash))
                .map(|e| u64::from(e.len))
                .sum();
            let remove = kept == 0;
            if !remove && (kept * 100 >= total * REWRITE_BELOW_PERCENT || bytes > pass.rewrite_left)
            {
                return true;
            }
            let dead: Vec<Hash> = entries
                .iter()
                .filter(|e| ours(&e.hash) && !live(&e.hash))
                .map(|e| e.hash)
                .collect();
            pass.collected.chunks_removed += dead.len() as u64;
            for hash in dead {
                state.index.remove(&hash);
            }
            if remove {
                state.packs.remove(&id);
            }
            (remove, bytes)
        };
        if remove {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    pass.collected.packs_removed += 1;
                    pass.collected.bytes_freed += bytes;
                }
                Err(e) => tracing::warn!("cannot remove the snapshot pack {}: {e}", path.display()),
            }
        } else {
            pass.rewrite_left -= bytes;
            match self.rewrite(id, &path) {
                Ok(new_bytes) => {
                    pass.collected.packs_rewritten += 1;
                    pass.collected.bytes_freed += bytes.saturating_sub(new_bytes);
                }
                Err(e) => {
                    tracing::warn!("cannot rewrite the snapshot pack {}: {e}", path.display());
                }
            }
        }
        true
    }

    fn mark_recipe(
        &self,
        path: &Path,
        live: &mut HashSet<Hash>,
        reader: &mut Reader,
    ) -> Result<()> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(scan_failed(path, &e)),
        };
        let described = match recipe::Recipe::decode(&bytes) {
            Ok(described) => described,
            Err(e) => {
                // Its snapshot is refused anyway (the manifest's checksum covers the recipe).
                tracing::warn!("skipping a damaged recipe {}: {e}", path.display());
                return Ok(());
            }
        };
        for list in described.lists {
            if !live.insert(list) {
                // Seen in another recipe: its chunks are marked already.
                continue;
            }
            match self.read_chunk(&list, reader) {
                Ok(bytes) => match recipe::decode_list(&bytes) {
                    Ok(chunks) => live.extend(chunks.into_iter().map(|(hash, _)| hash)),
                    Err(e) => tracing::warn!("skipping a damaged list in {}: {e}", path.display()),
                },
                // The list itself is missing or damaged: the snapshot is refused anyway.
                Err(e) if e.kind() == ErrorKind::MachineCrashed => {
                    tracing::warn!("skipping a list of {}: {e}", path.display());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Moves the live chunks of pack `id` into a new pack and removes the old one; the new
    /// pack's size.
    fn rewrite(&self, id: u64, path: &Path) -> Result<u64> {
        let entries = pack::read_index(path)?;
        let file = File::open(path)
            .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
        let (new_id, mut writer) = self.new_pack(3)?;
        let mut frame: Option<(u64, Vec<u8>)> = None;
        for entry in &entries {
            let wanted = lock(&self.state)
                .index
                .get(&entry.hash)
                .is_some_and(|location| location.pack == id);
            if !wanted {
                continue;
            }
            if frame
                .as_ref()
                .is_none_or(|(at, _)| *at != entry.frame_offset)
            {
                frame = Some((entry.frame_offset, pack::read_frame(&file, path, entry)?));
            }
            if let Some((_, bytes)) = &frame {
                writer.add(entry.hash, pack::chunk_in(bytes, path, entry)?)?;
            }
        }
        let new_path = self.packs_dir.join(format!("{new_id:016x}.pack"));
        let finished = writer.finish()?;
        let new_bytes = finished.as_ref().map_or(0, |(_, bytes)| *bytes);
        {
            let mut state = lock(&self.state);
            if let Some((new_entries, bytes)) = finished {
                register(&mut state, new_id, new_path, bytes, &[]);
                let new_costs = super::costs(&new_entries);
                for (entry, cost) in new_entries.into_iter().zip(new_costs) {
                    if let Some(location) = state.index.get_mut(&entry.hash)
                        && location.pack == id
                    {
                        location.pack = new_id;
                        location.entry = entry;
                        location.cost = cost;
                    }
                    if let Some(info) = state.packs.get_mut(&new_id) {
                        info.chunks += 1;
                    }
                }
            }
            state.index.retain(|_, location| location.pack != id);
            state.packs.remove(&id);
        }
        std::fs::remove_file(path)
            .map_err(|e| Error::internal(format!("cannot remove {}: {e}", path.display())))?;
        Ok(new_bytes)
    }
}

/// Puts what `dir` holds that a pass looks at (directories to `DEPTH`, recipes) on `pending`.
fn list_into(dir: &Path, depth: usize, pending: &mut Vec<Pending>) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // Gone meanwhile (a machine deleted, a snapshot replaced).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(scan_failed(dir, &e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| scan_failed(dir, &e))?;
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth < DEPTH {
            pending.push(Pending::Dir(entry.path(), depth + 1));
        } else if kind.is_file()
            && super::chunked_name(&entry.file_name().to_string_lossy()).is_some()
        {
            pending.push(Pending::Recipe(entry.path()));
        }
    }
    Ok(())
}

fn scan_failed(path: &Path, e: &std::io::Error) -> Error {
    Error::internal(format!(
        "collecting snapshot chunks stopped: cannot read {}: {e}",
        path.display()
    ))
}
