//! Garbage collection of the chunk store, by reference from the recipes on disk.
//!
//! A pass marks every chunk a recipe under the given roots names (lists included), plus the
//! chunks of saves and copies under way, then removes packs none of whose chunks is live and
//! rewrites packs that are mostly dead (their live chunks into a new pack, written durably
//! before the old one goes). The decision is taken under the store's lock, together with the
//! pins saves take when they look a chunk up, so a save either sees a chunk the pass removes as
//! absent (and writes it anew) or has pinned it before the decision (and the pass keeps it).
//! A recipe installed while the scan runs belongs to a save or copy whose pins end after it was
//! installed; pins that end during the scan are remembered until the decision.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::pack::{self, Hash};
use super::{ChunkStore, Reader, recipe, register};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::lock;

/// A pack is rewritten when less than this share (in percent) of its chunks' bytes is live.
const REWRITE_BELOW_PERCENT: u64 = 50;
/// How deep under a root recipes are looked for (`machines/<m>/checkpoints/<c>/pages.img.chunks`).
const DEPTH: usize = 5;

/// What a collection pass did.
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
    /// Whether another pass was running already (this one did nothing).
    pub skipped: bool,
}

/// Ends the scan state however the pass ends.
struct Scanning<'s>(&'s ChunkStore);

impl Drop for Scanning<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.collecting = false;
        state.recent.clear();
    }
}

impl ChunkStore {
    /// One collection pass over the recipes under `roots`; at most `rewrite_budget` bytes of
    /// packs are rewritten in it (the rest waits for the next pass). An error reading a recipe
    /// or list other than its being gone or damaged ends the pass before anything is removed.
    pub fn collect(self: &Arc<Self>, roots: &[PathBuf], rewrite_budget: u64) -> Result<Collected> {
        let mut collected = Collected::default();
        {
            let mut state = lock(&self.state);
            if state.collecting {
                collected.skipped = true;
                return Ok(collected);
            }
            state.collecting = true;
            state.recent.clear();
        }
        let scanning = Scanning(self);
        let mut live: HashSet<Hash> = HashSet::new();
        let mut reader = Reader::default();
        for root in roots {
            self.mark_under(root, 0, &mut live, &mut reader, &mut collected)?;
        }
        // Every pack's index, read before the lock is taken (packs never change; one
        // registered meanwhile is left for the next pass).
        let known: Vec<(u64, std::path::PathBuf, u64)> = lock(&self.state)
            .packs
            .iter()
            .map(|(id, info)| (*id, info.path.clone(), info.bytes))
            .collect();
        let mut indexes = Vec::with_capacity(known.len());
        for (id, path, bytes) in known {
            match pack::read_index(&path) {
                Ok(entries) => indexes.push((id, path, bytes, entries)),
                Err(e) => tracing::warn!("leaving a snapshot pack alone: {e}"),
            }
        }
        // The decision, under the lock saves look chunks up under.
        let mut remove = Vec::new();
        let mut rewrite = Vec::new();
        {
            let mut state = lock(&self.state);
            live.extend(state.recent.iter().copied());
            live.extend(state.pins.keys().copied());
            collected.live_chunks = live.len() as u64;
            let mut budget = rewrite_budget;
            for (id, path, bytes, entries) in indexes {
                if !state.packs.contains_key(&id) {
                    continue;
                }
                let ours = |h: &Hash| {
                    state
                        .index
                        .get(h)
                        .is_some_and(|location| location.pack == id)
                };
                let total: u64 = entries.iter().map(|e| u64::from(e.len)).sum();
                let kept: u64 = entries
                    .iter()
                    .filter(|e| ours(&e.hash) && live.contains(&e.hash))
                    .map(|e| u64::from(e.len))
                    .sum();
                let dead: Vec<Hash> = entries
                    .iter()
                    .filter(|e| ours(&e.hash) && !live.contains(&e.hash))
                    .map(|e| e.hash)
                    .collect();
                if kept == 0 {
                    remove.push((id, path, bytes));
                } else if kept * 100 < total * REWRITE_BELOW_PERCENT && bytes <= budget {
                    budget -= bytes;
                    rewrite.push((id, path, bytes));
                } else {
                    continue;
                }
                collected.chunks_removed += dead.len() as u64;
                for hash in dead {
                    state.index.remove(&hash);
                }
                if kept == 0 {
                    state.packs.remove(&id);
                }
            }
        }
        drop(scanning);
        for (_, path, bytes) in remove {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    collected.packs_removed += 1;
                    collected.bytes_freed += bytes;
                }
                Err(e) => tracing::warn!("cannot remove the snapshot pack {}: {e}", path.display()),
            }
        }
        for (id, path, bytes) in rewrite {
            match self.rewrite(id, &path) {
                Ok(new_bytes) => {
                    collected.packs_rewritten += 1;
                    collected.bytes_freed += bytes.saturating_sub(new_bytes);
                }
                Err(e) => {
                    tracing::warn!("cannot rewrite the snapshot pack {}: {e}", path.display());
                }
            }
        }
        Ok(collected)
    }

    /// Marks the chunks of every recipe under `dir`.
    fn mark_under(
        &self,
        dir: &Path,
        depth: usize,
        live: &mut HashSet<Hash>,
        reader: &mut Reader,
        collected: &mut Collected,
    ) -> Result<()> {
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
            let path = entry.path();
            if kind.is_dir() && depth < DEPTH {
                self.mark_under(&path, depth + 1, live, reader, collected)?;
            } else if kind.is_file()
                && super::chunked_name(&entry.file_name().to_string_lossy()).is_some()
            {
                self.mark_recipe(&path, live, reader)?;
                collected.recipes += 1;
            }
        }
        Ok(())
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

fn scan_failed(path: &Path, e: &std::io::Error) -> Error {
    Error::internal(format!(
        "collecting snapshot chunks stopped: cannot read {}: {e}",
        path.display()
    ))
}
