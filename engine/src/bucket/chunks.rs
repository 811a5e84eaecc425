//! Chunked snapshots in the bucket: a snapshot whose files are recipes ([`crate::chunks`])
//! goes up with only the chunks the bucket lacks, in one pack of its own
//! (`PREFIX/chunks/packs/ID.pack`, the home's pack format), and a file `chunk-packs` beside its
//! recipes naming every pack that holds one of its chunks. A download brings the chunks the
//! home lacks, a few frames per request, each chunk checked against its hash.
//!
//! Packs are collected by reference, in two steps a grace period apart, so that several nodes
//! uploading and collecting at once never lose a chunk a manifest names:
//! - an upload plans from a listing of packs and condemned packs, uses no condemned pack, and
//!   writes its manifest within half the grace period of that listing, or fails;
//! - a collection lists everything; a pack that no complete snapshot's `chunk-packs` names and
//!   that is older than the grace period is condemned (a marker under `chunks/condemned`);
//!   one condemned longer ago than the grace period and still unnamed is removed. A pack named
//!   again is pardoned.
//!
//! An upload that used a pack before its marker was written finished within half the grace
//! period of its listing, so before the removal lists; one that lists later sees the marker.
//! Clocks of nodes and the bucket may differ by up to half the grace period.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::{Bucket, parts_under};
use crate::chunks::pack::{self, Entry, Hash};
use crate::chunks::{ChunkStore, Pinned};
use crate::error::{Error, Result};

/// Where packs are, below the prefix.
const PACKS: &str = "chunks/packs";
/// Where condemned packs' markers are.
const CONDEMNED: &str = "chunks/condemned";
/// The object beside a chunked snapshot's recipes naming the packs its chunks are in.
pub(crate) const CHUNK_PACKS: &str = "chunk-packs";
/// At most this many bytes of a `chunk-packs` object are read (one line of 17 bytes a pack).
const CHUNK_PACKS_MAX: u64 = 4 * 1024 * 1024;
/// A download holds at most about this many bytes of chunks before they go to the store...
const BATCH_BYTES: usize = 32 * 1024 * 1024;
/// ... and asks for at most this many compressed bytes of frames in one request.
const REQUEST_BYTES: u64 = 8 * 1024 * 1024;
/// The grace period of collection when the settings name none.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(20 * 60);
/// The zstd level of packs sent to the bucket.
const LEVEL: i32 = 3;

/// What a node knows of the bucket's packs.
#[derive(Debug, Default)]
pub(crate) struct Known {
    /// Where each chunk of a pack whose index was read lies.
    index: HashMap<Hash, (u64, Entry)>,
    /// The packs whose index was read.
    packs: HashSet<u64>,
    condemned: HashSet<u64>,
    /// The packs each `chunk-packs` object names (objects never change once written).
    named: HashMap<String, Vec<u64>>,
}

/// What a collection of the bucket's packs did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketCollected {
    /// Complete chunked snapshots found.
    pub snapshots: u64,
    pub packs: u64,
    /// Packs a snapshot names.
    pub live_packs: u64,
    /// Packs condemned by this pass.
    pub condemned: u64,
    /// Packs removed by this pass, and their bytes.
    pub removed: u64,
    pub bytes_freed: u64,
}

/// What a collection does with each pack (see the module's description).
#[derive(Debug, Default, PartialEq, Eq)]
struct Decision {
    condemn: Vec<u64>,
    remove: Vec<u64>,
    pardon: Vec<u64>,
}

fn decide(
    packs: &BTreeMap<u64, (DateTime<Utc>, u64)>,
    condemned: &BTreeMap<u64, DateTime<Utc>>,
    live: &HashSet<u64>,
    now: DateTime<Utc>,
    grace: Duration,
) -> Decision {
    let grace = chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);
    let older = |at: &DateTime<Utc>| now.signed_duration_since(*at) > grace;
    let mut decision = Decision::default();
    for (id, (modified, _)) in packs {
        match (live.contains(id), condemned.get(id)) {
            (true, Some(_)) => decision.pardon.push(*id),
            (false, None) if older(modified) => decision.condemn.push(*id),
            (false, Some(marked)) if older(marked) => decision.remove.push(*id),
            // Named; or too young to condemn or to remove yet.
            _ => {}
        }
    }
    // Markers of packs that are gone.
    decision.pardon.extend(
        condemned
            .keys()
            .filter(|id| !packs.contains_key(id))
            .copied(),
    );
    decision
}

fn pack_id(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".pack")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// The pack ids a `chunk-packs` object names.
fn parse_named(text: &[u8]) -> Option<Vec<u64>> {
    std::str::from_utf8(text)
        .ok()?
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            (line.len() == 16)
                .then(|| u64::from_str_radix(line, 16).ok())
                .flatten()
        })
        .collect()
}

impl Bucket {
    fn pack_key(&self, id: u64) -> Result<ObjectPath> {
        self.area_root(&format!("{PACKS}/{id:016x}.pack"))
    }

    fn marker_key(&self, id: u64) -> Result<ObjectPath> {
        self.area_root(&format!("{CONDEMNED}/{id:016x}"))
    }

    /// The home's chunk store, which chunked snapshots need.
    fn chunk_store(&self) -> Result<Arc<ChunkStore>> {
        self.chunks.clone().ok_or_else(|| {
            Error::internal(format!(
                "a chunked snapshot cannot go through {} without a home's chunk store",
                self.url
            ))
        })
    }

    /// Brings what `known` holds up to date: the packs there are (the index of each new one
    /// read) and the condemned ones. The instant before it listed.
    async fn refresh(&self, known: &mut Known) -> Result<Instant> {
        let listed_at = Instant::now();
        let packs: HashMap<u64, u64> = self
            .objects_in(PACKS)
            .await?
            .into_iter()
            .filter_map(|(name, size)| Some((pack_id(&name)?, size)))
            .collect();
        let condemned: HashSet<u64> = self
            .objects_in(CONDEMNED)
            .await?
            .into_iter()
            .filter_map(|(name, _)| u64::from_str_radix(&name, 16).ok())
            .collect();
        known.index.retain(|_, (id, _)| packs.contains_key(id));
        known.packs.retain(|id| packs.contains_key(id));
        for (id, size) in packs {
            if known.packs.contains(&id) {
                continue;
            }
            match self.read_pack_index(id, size).await {
                Ok(entries) => {
                    for entry in entries {
                        known.index.entry(entry.hash).or_insert((id, entry));
                    }
                    known.packs.insert(id);
                }
                // Its chunks count as absent: an upload sends them again.
                Err(e) => tracing::warn!("leaving a chunk pack of the bucket out: {e}"),
            }
        }
        known.condemned = condemned;
        Ok(listed_at)
    }

    /// The objects right in AREA (not below it), by name, with their sizes.
    async fn objects_in(&self, area: &str) -> Result<Vec<(String, u64)>> {
        let root = self.area_root(area)?;
        let mut found = Vec::new();
        let mut listing = self.store.list(Some(&root));
        while let Some(object) = listing.next().await {
            let object = object.map_err(|e| self.failed(&format!("listing {area}"), &e))?;
            if let [name] = parts_under(&root, &object.location).as_slice() {
                found.push((name.clone(), object.size));
            }
        }
        Ok(found)
    }

    async fn read_pack_index(&self, id: u64, size: u64) -> Result<Vec<Entry>> {
        let key = self.pack_key(id)?;
        let name = PathBuf::from(format!("{}/{key}", self.url));
        let (header, footer) = (pack::HEADER_BYTES, pack::FOOTER_BYTES);
        if size < header + footer {
            return Err(Error::crashed(format!(
                "{} is too short to be a pack",
                name.display()
            )));
        }
        let ends = self
            .store
            .get_ranges(&key, &[0..header, size - footer..size])
            .await
            .map_err(|e| self.failed("reading a chunk pack's index", &e))?;
        let [start, end] = ends.as_slice() else {
            return Err(Error::internal(format!(
                "{} answered {} ranges for 2",
                self.url,
                ends.len()
            )));
        };
        let place = pack::index_place(&name, size, start, end)?;
        let index = self
            .store
            .get_range(&key, place.offset..place.offset + place.len)
            .await
            .map_err(|e| self.failed("reading a chunk pack's index", &e))?;
        pack::parse_index(&name, &place, &index)
    }

    /// Sends the chunks the snapshot in `dir` names that the bucket lacks (one new pack) and
    /// writes its `chunk-packs` under `root`. The instant the plan was made (its manifest must
    /// follow within half the grace period) and the home's chunks, pinned until it is sent.
    pub(super) async fn upload_chunks(
        &self,
        dir: &Path,
        root: &ObjectPath,
    ) -> Result<(Instant, Pinned)> {
        let store = self.chunk_store()?;
        let (pinned, hashes) = {
            let (store, dir) = (Arc::clone(&store), dir.to_path_buf());
            tokio::task::spawn_blocking(move || {
                let pinned = store.pin_dir(&dir)?;
                let hashes: Vec<Hash> = pinned.hashes().copied().collect();
                Ok::<_, Error>((pinned, hashes))
            })
            .await
            .map_err(|e| Error::internal(format!("reading a snapshot's chunks stopped: {e}")))??
        };
        let (planned, mut named, missing) = {
            let mut known = self.known.lock().await;
            let planned = self.refresh(&mut known).await?;
            let mut named = BTreeSet::new();
            let mut missing = Vec::new();
            for hash in hashes {
                match known.index.get(&hash) {
                    Some((id, _)) if !known.condemned.contains(id) => {
                        named.insert(*id);
                    }
                    _ => missing.push(hash),
                }
            }
            (planned, named, missing)
        };
        if !missing.is_empty() {
            let path = store.export_path();
            let exported = {
                let (store, path) = (Arc::clone(&store), path.clone());
                tokio::task::spawn_blocking(move || store.export_pack(&missing, path, LEVEL))
                    .await
                    .map_err(|e| Error::internal(format!("packing chunks stopped: {e}")))?
            };
            let sent = match exported {
                Ok(Some((entries, _))) => {
                    let id: u64 = rand::random();
                    let sent = self.upload_file(&path, &self.pack_key(id)?).await;
                    sent.map(|()| Some((id, entries)))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            let _ = tokio::fs::remove_file(&path).await;
            if let Some((id, entries)) = sent? {
                let mut known = self.known.lock().await;
                for entry in entries {
                    known.index.entry(entry.hash).or_insert((id, entry));
                }
                known.packs.insert(id);
                named.insert(id);
            }
        }
        let text = named.iter().fold(String::new(), |mut text, id| {
            use std::fmt::Write;
            let _ = writeln!(text, "{id:016x}");
            text
        });
        self.put_small(
            &root.clone().join(CHUNK_PACKS),
            text.into_bytes(),
            "storing which packs a snapshot uses",
        )
        .await?;
        Ok((planned, pinned))
    }

    /// Whether an upload planned at `planned` may still write its manifest.
    pub(super) fn plan_still_valid(&self, planned: Instant) -> bool {
        planned.elapsed() < self.grace / 2
    }

    /// Brings into the home's store the chunks that the recipes downloaded into `dir` name and
    /// that it lacks; every chunk the snapshot names stays pinned while the result is held.
    pub(super) async fn download_chunks(&self, dir: &Path) -> Result<Pinned> {
        let store = self.chunk_store()?;
        let lists = {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || ChunkStore::lists_in(&dir))
                .await
                .map_err(|e| Error::internal(format!("reading recipes stopped: {e}")))??
        };
        let mut pinned = Pinned::none(&store);
        let lacking = store.pin_lacking(&mut pinned, &lists);
        self.bring(&store, lacking).await?;
        let data = {
            let store = Arc::clone(&store);
            tokio::task::spawn_blocking(move || store.listed(&lists))
                .await
                .map_err(|e| Error::internal(format!("reading chunk lists stopped: {e}")))??
        };
        let lacking = store.pin_lacking(&mut pinned, &data);
        self.bring(&store, lacking).await?;
        Ok(pinned)
    }

    /// Downloads the chunks `hashes` into the home's store.
    async fn bring(&self, store: &Arc<ChunkStore>, hashes: Vec<Hash>) -> Result<()> {
        if hashes.is_empty() {
            return Ok(());
        }
        let mut by_pack: BTreeMap<u64, Vec<Entry>> = BTreeMap::new();
        {
            let mut known = self.known.lock().await;
            if hashes.iter().any(|h| !known.index.contains_key(h)) {
                self.refresh(&mut known).await?;
            }
            for hash in &hashes {
                let Some((id, entry)) = known.index.get(hash) else {
                    return Err(Error::crashed(format!(
                        "the snapshot needs the chunk {}, which the bucket {} does not hold",
                        hex::encode(hash),
                        self.url
                    )));
                };
                by_pack.entry(*id).or_default().push(*entry);
            }
        }
        let mut batch: Vec<(Hash, Vec<u8>)> = Vec::new();
        let mut batch_bytes = 0usize;
        for (id, entries) in by_pack {
            let key = self.pack_key(id)?;
            let name = PathBuf::from(format!("{}/{key}", self.url));
            let mut frames: BTreeMap<(u64, u32), Vec<Entry>> = BTreeMap::new();
            for entry in entries {
                frames
                    .entry((entry.frame_offset, entry.frame_len))
                    .or_default()
                    .push(entry);
            }
            let frames: Vec<_> = frames.into_iter().collect();
            // A few frames per request, within REQUEST_BYTES.
            let mut start = 0;
            while start < frames.len() {
                let mut end = start;
                let mut bytes = 0u64;
                while end < frames.len() && (end == start || bytes < REQUEST_BYTES) {
                    bytes += u64::from(frames[end].0.1);
                    end += 1;
                }
                let ranges: Vec<_> = frames[start..end]
                    .iter()
                    .map(|((offset, len), _)| *offset..offset + u64::from(*len))
                    .collect();
                let got = self
                    .store
                    .get_ranges(&key, &ranges)
                    .await
                    .map_err(|e| self.failed("reading snapshot chunks", &e))?;
                if got.len() != ranges.len() {
                    return Err(Error::internal(format!(
                        "{} answered {} ranges for {}",
                        self.url,
                        got.len(),
                        ranges.len()
                    )));
                }
                for (packed, (_, wanted)) in got.iter().zip(&frames[start..end]) {
                    let frame = pack::unpack_frame(&name, packed)?;
                    for entry in wanted {
                        let chunk = pack::chunk_in(&frame, &name, entry)?;
                        batch_bytes += chunk.len();
                        batch.push((entry.hash, chunk.to_vec()));
                    }
                }
                if batch_bytes >= BATCH_BYTES {
                    self.import(store, std::mem::take(&mut batch)).await?;
                    batch_bytes = 0;
                }
                start = end;
            }
        }
        self.import(store, batch).await
    }

    async fn import(&self, store: &Arc<ChunkStore>, batch: Vec<(Hash, Vec<u8>)>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let store = Arc::clone(store);
        tokio::task::spawn_blocking(move || store.import(&batch, LEVEL))
            .await
            .map_err(|e| Error::internal(format!("storing downloaded chunks stopped: {e}")))?
    }

    /// One collection pass over the bucket's packs (see the module's description). A pass that
    /// cannot read which packs a snapshot names removes nothing.
    pub async fn collect_chunks(&self) -> Result<BucketCollected> {
        let now = Utc::now();
        let mut packs: BTreeMap<u64, (DateTime<Utc>, u64)> = BTreeMap::new();
        let mut condemned: BTreeMap<u64, DateTime<Utc>> = BTreeMap::new();
        let mut manifests: HashSet<Vec<String>> = HashSet::new();
        let mut named_by: Vec<(Vec<String>, ObjectPath)> = Vec::new();
        let mut listing = self.store.list(Some(&self.root));
        while let Some(object) = listing.next().await {
            let object = object.map_err(|e| self.failed("listing the bucket", &e))?;
            let mut parts = parts_under(&self.root, &object.location);
            let Some(last) = parts.pop() else { continue };
            match (parts.as_slice(), last.as_str()) {
                ([chunks, packs_dir], name) if chunks == "chunks" && packs_dir == "packs" => {
                    if let Some(id) = pack_id(name) {
                        packs.insert(id, (object.last_modified, object.size));
                    }
                }
                ([chunks, markers], name) if chunks == "chunks" && markers == "condemned" => {
                    if let Ok(id) = u64::from_str_radix(name, 16) {
                        condemned.insert(id, object.last_modified);
                    }
                }
                (_, crate::snapshot::MANIFEST) => {
                    manifests.insert(parts);
                }
                (_, CHUNK_PACKS) => named_by.push((parts, object.location)),
                _ => {}
            }
        }
        let mut live = HashSet::new();
        let mut snapshots = 0;
        let mut known = self.known.lock().await;
        let mut still_named = HashMap::new();
        for (root, location) in named_by {
            if !manifests.contains(&root) {
                continue;
            }
            snapshots += 1;
            let key = location.to_string();
            let ids = match known.named.remove(&key) {
                Some(ids) => ids,
                None => self.read_named(&location).await?,
            };
            live.extend(ids.iter().copied());
            still_named.insert(key, ids);
        }
        known.named = still_named;
        drop(known);
        let decision = decide(&packs, &condemned, &live, now, self.grace);
        let mut collected = BucketCollected {
            snapshots,
            packs: packs.len() as u64,
            live_packs: packs.keys().filter(|id| live.contains(id)).count() as u64,
            ..BucketCollected::default()
        };
        for id in &decision.condemn {
            self.store
                .put(&self.marker_key(*id)?, PutPayload::default())
                .await
                .map_err(|e| self.failed("condemning a chunk pack", &e))?;
            collected.condemned += 1;
        }
        for id in &decision.remove {
            match self.store.delete(&self.pack_key(*id)?).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.failed("removing a chunk pack", &e)),
            }
            collected.removed += 1;
            collected.bytes_freed += packs.get(id).map_or(0, |(_, size)| *size);
        }
        for id in decision.remove.iter().chain(&decision.pardon) {
            match self.store.delete(&self.marker_key(*id)?).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.failed("removing a pack's marker", &e)),
            }
        }
        Ok(collected)
    }

    async fn read_named(&self, location: &ObjectPath) -> Result<Vec<u64>> {
        let got = self
            .store
            .get(location)
            .await
            .map_err(|e| self.failed("reading which packs a snapshot uses", &e))?;
        if got.meta.size > CHUNK_PACKS_MAX {
            return Err(Error::internal(format!(
                "{location} in {} is {} bytes, more than a list of packs can be",
                self.url, got.meta.size
            )));
        }
        let text = got
            .bytes()
            .await
            .map_err(|e| self.failed("reading which packs a snapshot uses", &e))?;
        parse_named(&text).ok_or_else(|| {
            Error::internal(format!(
                "{location} in {} is not a list of packs: collection stops",
                self.url
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_is_condemned_then_removed_a_grace_period_apart_and_pardoned_when_named() {
        let now = Utc::now();
        let ago = |secs: i64| now - chrono::Duration::seconds(secs);
        let grace = Duration::from_secs(100);
        let packs: BTreeMap<u64, (DateTime<Utc>, u64)> = [
            (1, (ago(500), 10)), // named: stays
            (2, (ago(500), 10)), // unnamed, old: condemned
            (3, (ago(50), 10)),  // unnamed, young (an upload under way): stays
            (4, (ago(500), 10)), // condemned long ago, unnamed: removed
            (5, (ago(500), 10)), // condemned lately: waits
            (6, (ago(500), 10)), // condemned, named again: pardoned
        ]
        .into_iter()
        .collect();
        let condemned: BTreeMap<u64, DateTime<Utc>> =
            [(4, ago(200)), (5, ago(50)), (6, ago(200)), (7, ago(10))]
                .into_iter()
                .collect();
        let live: HashSet<u64> = [1, 6].into_iter().collect();
        let decision = decide(&packs, &condemned, &live, now, grace);
        assert_eq!(
            decision,
            Decision {
                condemn: vec![2],
                remove: vec![4],
                pardon: vec![6, 7],
            }
        );
    }

    #[test]
    fn pack_names_and_lists_of_packs_parse_strictly() {
        assert_eq!(pack_id("00000000000000ff.pack"), Some(255));
        assert_eq!(pack_id("ff.pack"), None);
        assert_eq!(pack_id("00000000000000ff"), None);
        assert_eq!(
            parse_named(b"00000000000000ff\n0000000000000001\n"),
            Some(vec![255, 1])
        );
        assert_eq!(parse_named(b""), Some(vec![]));
        assert_eq!(parse_named(b"xyz\n"), None);
    }
}
