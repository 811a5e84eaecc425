//! The snapshot chunk store: content-addressed, deduplicated storage for snapshot files.
//!
//! A snapshot's big files (runsc's `pages.img`, `checkpoint.img`, ...) are cut into chunks,
//! each named by its SHA-256 and stored once per home however many snapshots hold it: a
//! machine's successive snapshots, its checkpoints and forks, every machine made from one base.
//! Memory (`pages.img`) is cut into 4 KiB pages (runsc writes the present pages back to back, so
//! a page appearing shifts every later page by exactly one page, and page-sized chunks still
//! match: over two snapshots of one machine, pages deduplicate to about a third of what 64 KiB
//! or content-defined chunks give); other files where their content says ([`cdc`]: about 8 KiB,
//! at most 64 KiB). The file itself is replaced
//! in the snapshot directory by its recipe ([`recipe`]), which the snapshot's manifest covers
//! like any file.
//!
//! Chunks new to the store are written by each save into one pack ([`pack`]), compressed in
//! frames, durably and before the recipes that name them. Which chunks exist is an index in
//! memory, read from the packs' own indexes when the store opens.
//!
//! Garbage is collected by reference ([`collect`]): the chunks every recipe under the home
//! names are live, and so are those of saves and copies under way (pinned while they run, and
//! remembered while a collection scans), so that a chunk a manifest names is never removed.

mod cdc;
mod collect;
pub(crate) mod pack;
pub(crate) mod recipe;
#[cfg(test)]
mod tests;
mod transfer;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub use collect::Collected;
use pack::{Entry, Hash, PackWriter};
use recipe::Recipe;

use crate::error::{Error, Result};
use crate::sync::lock;

/// Memory files are cut into pages of this size.
const PAGE: usize = 4096;
/// Files at least this big are put back together by several threads...
const PARALLEL_FROM: u64 = 4 * 1024 * 1024;
/// ... at most this many.
const MAX_THREADS: usize = 4;
/// A file being put back together is written in pieces of about this size.
const WRITE_BYTES: usize = 1024 * 1024;

/// A stretch of a file being put back together: where it starts, and its chunks.
type Stretch = (u64, Vec<(Hash, u32)>);

/// How a chunk is found: its pack and where in it; and its share of its frame's bytes on disk.
#[derive(Debug, Clone, Copy)]
struct Location {
    pack: u64,
    entry: Entry,
    cost: u32,
}

/// Each entry's share of its compressed frame (by its part of the frame's raw bytes).
fn costs(entries: &[Entry]) -> Vec<u32> {
    let mut raw: HashMap<u64, u64> = HashMap::new();
    for entry in entries {
        *raw.entry(entry.frame_offset).or_insert(0) += u64::from(entry.len);
    }
    entries
        .iter()
        .map(|entry| {
            let total = raw.get(&entry.frame_offset).copied().unwrap_or(1).max(1);
            let share = u64::from(entry.frame_len) * u64::from(entry.len) / total;
            u32::try_from(share).unwrap_or(u32::MAX)
        })
        .collect()
}

#[derive(Debug)]
struct PackInfo {
    path: PathBuf,
    /// The pack's size on disk.
    bytes: u64,
    chunks: u64,
}

#[derive(Debug, Default)]
struct State {
    index: HashMap<Hash, Location>,
    packs: HashMap<u64, PackInfo>,
    /// Chunks that saves and copies under way refer to, with how many of them do.
    pins: HashMap<Hash, u32>,
    /// Whether a collection is scanning the recipes now; while it is, the chunks of saves and
    /// copies that end are remembered in `recent` (their recipes may have been installed where
    /// the scan had already looked).
    collecting: bool,
    recent: HashSet<Hash>,
    /// Whether more chunks ended than `recent` may hold ([`collect::RECENT_MAX`]): the pass
    /// under way is given up.
    recent_overflowed: bool,
}

/// Figures about the store, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkStats {
    pub packs: u64,
    pub chunks: u64,
    /// The packs' size on disk.
    pub bytes: u64,
}

/// One home's chunk store (`<home>/chunks`).
#[derive(Debug)]
pub struct ChunkStore {
    packs_dir: PathBuf,
    state: Mutex<State>,
    /// The collection pass under way, between its slices; held while a slice runs.
    pass: Mutex<Option<collect::Pass>>,
    /// At most this many chunks are remembered in `recent` ([`collect::RECENT_MAX`]).
    recent_max: usize,
}

/// The chunks a save or a copy refers to, kept from collection until it is dropped (after
/// the snapshot that names them is installed, or the save has failed).
#[must_use = "the chunks stay pinned only while this is held"]
pub struct Pinned {
    store: Arc<ChunkStore>,
    hashes: HashSet<Hash>,
}

impl Pinned {
    /// Nothing pinned yet.
    pub(crate) fn none(store: &Arc<ChunkStore>) -> Self {
        Self {
            store: Arc::clone(store),
            hashes: HashSet::new(),
        }
    }

    fn pin(&mut self, state: &mut State, hash: Hash) {
        if self.hashes.insert(hash) {
            *state.pins.entry(hash).or_insert(0) += 1;
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mut state = lock(&self.store.state);
        for hash in self.hashes.drain() {
            if let Some(count) = state.pins.get_mut(&hash) {
                *count -= 1;
                if *count == 0 {
                    state.pins.remove(&hash);
                }
            }
            if state.collecting {
                if state.recent.len() < self.store.recent_max {
                    state.recent.insert(hash);
                } else {
                    state.recent_overflowed = true;
                }
            }
        }
    }
}

/// Frames a read keeps decompressed: a restored snapshot's pages come from a few packs at
/// once (the base's, the machine's own, the zero page's), lists between them.
const FRAMES_KEPT: usize = 16;

/// Decompressed frames a read has seen lately (most recent first), the packs it has open, and
/// the chunks it has checked.
#[derive(Default)]
struct Reader {
    files: HashMap<u64, (File, PathBuf)>,
    frames: std::collections::VecDeque<Frame>,
    /// How many frames it has read from disk: each one's number tells its loads apart.
    loads: u64,
    /// Chunks checked against their hash, with the frame load they were found in: met again in
    /// that same load, they are not hashed again.
    checked: HashMap<Hash, ((u64, u64), u64)>,
    /// One decompression context for every frame it reads.
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

/// A decompressed frame: its pack and offset, which of the reader's loads it is, its bytes.
struct Frame {
    key: (u64, u64),
    load: u64,
    bytes: Vec<u8>,
}

impl ChunkStore {
    /// Opens (or makes) the store under `home`: removes packs a crash left unfinished and reads
    /// the index of every pack. A pack whose index is damaged is left out, with a warning: the
    /// snapshots that need its chunks are refused when they are restored, and no others.
    pub fn open(home: &Path) -> Result<Arc<Self>> {
        use std::os::unix::fs::PermissionsExt;
        let dir = home.join("chunks");
        let packs_dir = dir.join("packs");
        std::fs::create_dir_all(&packs_dir)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", packs_dir.display())))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        // Packs written for an upload that a crash stopped.
        for entry in std::fs::read_dir(&dir)?.flatten() {
            if entry.file_name().to_string_lossy().starts_with("outgoing-") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let mut state = State::default();
        for entry in std::fs::read_dir(&packs_dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(".tmp-") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(id) = name
                .strip_suffix(".pack")
                .and_then(|id| u64::from_str_radix(id, 16).ok())
            else {
                continue;
            };
            match pack::read_index(&path) {
                Ok(entries) => {
                    let bytes = entry.metadata().map_or(0, |m| m.len());
                    register(&mut state, id, path, bytes, &entries);
                }
                Err(e) => tracing::warn!("leaving a snapshot pack out: {e}"),
            }
        }
        Ok(Arc::new(Self {
            packs_dir,
            state: Mutex::new(state),
            pass: Mutex::new(None),
            recent_max: collect::RECENT_MAX,
        }))
    }

    /// How many packs and chunks the store holds and their size on disk.
    pub fn stats(&self) -> ChunkStats {
        let state = lock(&self.state);
        ChunkStats {
            packs: state.packs.len() as u64,
            chunks: state.index.len() as u64,
            bytes: state.packs.values().map(|p| p.bytes).sum(),
        }
    }

    fn new_pack(&self, level: i32) -> Result<(u64, PackWriter)> {
        let id: u64 = rand::random();
        let path = self.packs_dir.join(format!("{id:016x}.pack"));
        Ok((id, PackWriter::create(path, level)?))
    }

    /// Replaces each named file in `dir` by its recipe (`NAME.chunks`), its chunks written to
    /// the store first (those it lacks, compressed at zstd `level`, in one new pack). `dir` is
    /// a snapshot being built, which the caller seals (syncing its files); the returned pins
    /// keep its chunks from collection until the snapshot is installed. On failure the files
    /// stay as they were.
    pub fn put_files(self: &Arc<Self>, dir: &Path, names: &[String], level: i32) -> Result<Pinned> {
        let mut pinned = Pinned::none(self);
        let (pack_id, mut writer) = self.new_pack(level)?;
        let mut in_pack: HashSet<Hash> = HashSet::new();
        let mut recipes = Vec::new();
        for name in names {
            let path = dir.join(name);
            let file = File::open(&path)
                .map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))?;
            let mut input = BufReader::with_capacity(1024 * 1024, file);
            let read_failed =
                |e: std::io::Error| Error::internal(format!("cannot read {}: {e}", path.display()));
            let mut chunks = Vec::new();
            let mut size = 0u64;
            let mut new_bytes = 0u64;
            let mut emit = |data: &[u8]| -> Result<()> {
                size += data.len() as u64;
                let hash: Hash = Sha256::digest(data).into();
                if self.keep(&mut pinned, &mut writer, &mut in_pack, hash, data)? {
                    new_bytes += data.len() as u64;
                }
                chunks.push((hash, data.len() as u32));
                Ok(())
            };
            if name == "pages.img" {
                // Memory: page by page.
                let mut buffer = vec![0u8; PAGE];
                loop {
                    let len = read_full(&mut input, &mut buffer).map_err(read_failed)?;
                    if len == 0 {
                        break;
                    }
                    emit(&buffer[..len])?;
                }
            } else {
                // The rest: where the content says ([`cdc`]).
                let mut buffer = vec![0u8; 2 * cdc::MAX];
                let (mut start, mut end, mut ended) = (0, 0, false);
                loop {
                    if !ended && end - start < cdc::MAX {
                        buffer.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                        let read =
                            read_full(&mut input, &mut buffer[end..]).map_err(read_failed)?;
                        ended = read == 0 || end + read < buffer.len();
                        end += read;
                    }
                    if start == end {
                        break;
                    }
                    let len = cdc::cut(&buffer[start..end]);
                    emit(&buffer[start..start + len])?;
                    start += len;
                }
            }
            let mut lists = Vec::new();
            let mut new_list_bytes = 0;
            for list in recipe::split_lists(&chunks) {
                let bytes = recipe::encode_list(list);
                let hash: Hash = Sha256::digest(&bytes).into();
                if self.keep(&mut pinned, &mut writer, &mut in_pack, hash, &bytes)? {
                    new_list_bytes += bytes.len();
                }
                lists.push(hash);
            }
            tracing::debug!(
                "chunked {name}: {size} bytes, {new_bytes} of them new to the store; {} lists, \
                 {new_list_bytes} bytes of them new",
                lists.len()
            );
            recipes.push((name, Recipe { size, lists }));
        }
        if let Some((entries, bytes)) = writer.finish()? {
            tracing::debug!(
                "chunks new to the store: {} in a pack of {bytes} bytes",
                entries.len()
            );
            let path = self.packs_dir.join(format!("{pack_id:016x}.pack"));
            register(&mut lock(&self.state), pack_id, path, bytes, &entries);
        }
        // Not synced one by one: sealing the snapshot syncs every file in it.
        for (name, recipe) in &recipes {
            use std::os::unix::fs::OpenOptionsExt;
            let target = dir.join(format!("{name}{}", recipe::SUFFIX));
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&target)
                .and_then(|mut file| std::io::Write::write_all(&mut file, &recipe.encode()));
            written
                .map_err(|e| Error::internal(format!("cannot write {}: {e}", target.display())))?;
        }
        for (name, _) in &recipes {
            std::fs::remove_file(dir.join(name))
                .map_err(|e| Error::internal(format!("cannot remove {name} once chunked: {e}")))?;
        }
        Ok(pinned)
    }

    /// Pins `hash` for this save and, when the store lacks it, adds it to the save's pack;
    /// whether it did.
    fn keep(
        &self,
        pinned: &mut Pinned,
        writer: &mut PackWriter,
        in_pack: &mut HashSet<Hash>,
        hash: Hash,
        data: &[u8],
    ) -> Result<bool> {
        let known = {
            let mut state = lock(&self.state);
            pinned.pin(&mut state, hash);
            state.index.contains_key(&hash)
        };
        let added = !known && in_pack.insert(hash);
        if added {
            writer.add(hash, data)?;
        }
        Ok(added)
    }

    /// Pins every chunk the recipes in `dir` name (a snapshot about to be copied), so that a
    /// collection cannot take them while the copy is made.
    pub fn pin_dir(self: &Arc<Self>, dir: &Path) -> Result<Pinned> {
        let mut pinned = Pinned::none(self);
        let mut reader = Reader::default();
        for path in recipes_in(dir)? {
            for hash in self.hashes_of(&path, &mut reader)? {
                pinned.pin(&mut lock(&self.state), hash);
            }
        }
        Ok(pinned)
    }

    /// What the snapshots in `dirs` take in the store: the compressed bytes of the distinct
    /// chunks their recipes name (each counted once however many of them name it). A recipe or
    /// list that cannot be read counts nothing.
    pub fn referenced_bytes(&self, dirs: &[PathBuf]) -> u64 {
        let mut seen: HashSet<Hash> = HashSet::new();
        let mut reader = Reader::default();
        let mut bytes = 0u64;
        let mut count = |hash: Hash, seen: &mut HashSet<Hash>| {
            if seen.insert(hash) {
                let state = lock(&self.state);
                bytes += state.index.get(&hash).map_or(0, |l| u64::from(l.cost));
            }
        };
        for dir in dirs {
            let Ok(recipes) = recipes_in(dir) else {
                continue;
            };
            for path in recipes {
                let Ok(described) = read_recipe(&path) else {
                    continue;
                };
                for list in described.lists {
                    if seen.contains(&list) {
                        continue;
                    }
                    count(list, &mut seen);
                    let Ok(chunks) = self
                        .read_chunk(&list, &mut reader)
                        .and_then(|b| recipe::decode_list(&b))
                    else {
                        continue;
                    };
                    for (hash, _) in chunks {
                        count(hash, &mut seen);
                    }
                }
            }
        }
        bytes
    }

    /// Every chunk (lists and data) the recipe at `path` names.
    fn hashes_of(&self, path: &Path, reader: &mut Reader) -> Result<Vec<Hash>> {
        let recipe = read_recipe(path)?;
        let mut hashes = Vec::new();
        for list in recipe.lists {
            let bytes = self.read_chunk(&list, reader)?;
            hashes.extend(recipe::decode_list(&bytes)?.into_iter().map(|(h, _)| h));
            hashes.push(list);
        }
        Ok(hashes)
    }

    /// Writes the file the recipe at `recipe` describes to `out` (a new file), checking every
    /// chunk against its hash. A missing or damaged chunk is an error naming it: the snapshot
    /// is refused, and no other.
    pub fn materialize(&self, recipe: &Path, out: &Path) -> Result<()> {
        let described = read_recipe(recipe)?;
        let mut reader = Reader::default();
        // The lists first (a few dozen small chunks): where each stretch of the file starts.
        let mut stretches = Vec::with_capacity(described.lists.len());
        let mut size = 0u64;
        for list in &described.lists {
            let chunks = recipe::decode_list(&self.read_chunk(list, &mut reader)?)?;
            let start = size;
            size += chunks.iter().map(|(_, len)| u64::from(*len)).sum::<u64>();
            stretches.push((start, chunks));
        }
        if size != described.size {
            return Err(Error::crashed(format!(
                "{} describes {} bytes, its chunks hold {size}",
                recipe.display(),
                described.size
            )));
        }
        let write_failed =
            |e: std::io::Error| Error::internal(format!("cannot write {}: {e}", out.display()));
        let file = File::create_new(out)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", out.display())))?;
        file.set_len(size).map_err(write_failed)?;
        // Stretches are filled in parallel (decompressing and hashing is the work), each
        // thread writing its own part of the file.
        let threads = if size < PARALLEL_FROM {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS))
        };
        let per_thread = size.div_ceil(threads as u64).max(1);
        let mut groups: Vec<Vec<Stretch>> = vec![Vec::new(); threads];
        for (start, chunks) in stretches {
            let group = usize::try_from(start / per_thread)
                .unwrap_or(0)
                .min(threads - 1);
            groups[group].push((start, chunks));
        }
        let fill = |group: Vec<Stretch>| -> Result<()> {
            use std::os::unix::fs::FileExt;
            let mut reader = Reader::default();
            let mut buffer = Vec::with_capacity(WRITE_BYTES);
            for (start, chunks) in group {
                let mut at = start;
                for (hash, len) in chunks {
                    let before = buffer.len();
                    self.read_chunk_into(&hash, &mut reader, &mut buffer)?;
                    if buffer.len() - before != len as usize {
                        return Err(Error::crashed(format!(
                            "the chunk {} is {} bytes, its list says {len}",
                            hex::encode(hash),
                            buffer.len() - before
                        )));
                    }
                    if buffer.len() >= WRITE_BYTES {
                        file.write_all_at(&buffer, at).map_err(write_failed)?;
                        at += buffer.len() as u64;
                        buffer.clear();
                    }
                }
                file.write_all_at(&buffer, at).map_err(write_failed)?;
                buffer.clear();
            }
            Ok(())
        };
        let mut groups = groups.into_iter();
        let first = groups.next().unwrap_or_default();
        std::thread::scope(|scope| {
            let others: Vec<_> = groups.map(|group| scope.spawn(|| fill(group))).collect();
            let mut done = fill(first);
            for other in others {
                let joined = other
                    .join()
                    .unwrap_or_else(|_| Err(Error::internal("a snapshot reader stopped")));
                done = done.and(joined);
            }
            done
        })
    }

    /// The chunk named `hash`, checked against it.
    fn read_chunk(&self, hash: &Hash, reader: &mut Reader) -> Result<Vec<u8>> {
        let mut chunk = Vec::new();
        self.read_chunk_into(hash, reader, &mut chunk)?;
        Ok(chunk)
    }

    /// Appends the chunk named `hash` to `out`, checked against it (once per frame read: a
    /// chunk met again in a frame the reader holds, such as the zero page, is not hashed again).
    fn read_chunk_into(&self, hash: &Hash, reader: &mut Reader, out: &mut Vec<u8>) -> Result<()> {
        // A collection may move a chunk to a new pack between the look-up and the read: look
        // again once when its pack is gone.
        for attempt in 0..2 {
            let location = lock(&self.state).index.get(hash).copied().ok_or_else(|| {
                Error::crashed(format!(
                    "the snapshot needs the chunk {}, which the store does not hold (its pack \
                     was damaged or removed): roll back to a checkpoint or delete the machine",
                    hex::encode(hash)
                ))
            })?;
            let key = (location.pack, location.entry.frame_offset);
            if let Some(at) = reader.frames.iter().position(|frame| frame.key == key) {
                if at > 0
                    && let Some(hit) = reader.frames.remove(at)
                {
                    reader.frames.push_front(hit);
                }
            } else {
                if let std::collections::hash_map::Entry::Vacant(vacant) =
                    reader.files.entry(location.pack)
                {
                    let Some(path) = lock(&self.state)
                        .packs
                        .get(&location.pack)
                        .map(|p| p.path.clone())
                    else {
                        continue;
                    };
                    match File::open(&path) {
                        Ok(file) => {
                            vacant.insert((file, path));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempt == 0 => {
                            continue;
                        }
                        Err(e) => {
                            // Not damage: a collection must not take this for a missing chunk.
                            return Err(Error::internal(format!(
                                "cannot open the snapshot pack {}: {e}",
                                path.display()
                            )));
                        }
                    }
                }
                let Some((file, path)) = reader.files.get(&location.pack) else {
                    continue;
                };
                let bytes =
                    pack::read_frame_with(file, path, &location.entry, &mut reader.decompressor)?;
                reader.loads += 1;
                reader.frames.truncate(FRAMES_KEPT - 1);
                reader.frames.push_front(Frame {
                    key,
                    load: reader.loads,
                    bytes,
                });
            }
            let (Some(frame), Some((_, path))) =
                (reader.frames.front(), reader.files.get(&location.pack))
            else {
                continue;
            };
            let chunk = pack::chunk_in(&frame.bytes, path, &location.entry)?;
            let seen = (key, frame.load);
            if reader.checked.get(hash) != Some(&seen) {
                if Sha256::digest(chunk).as_slice() != hash {
                    return Err(Error::crashed(format!(
                        "the chunk {} in {} is damaged (its bytes do not match its hash)",
                        hex::encode(hash),
                        path.display()
                    )));
                }
                reader.checked.insert(*hash, seen);
            }
            out.extend_from_slice(chunk);
            return Ok(());
        }
        Err(Error::crashed(format!(
            "the chunk {} moved while it was read",
            hex::encode(hash)
        )))
    }
}

/// Adds a finished pack's chunks to the index (a chunk already in another pack keeps its place).
fn register(state: &mut State, id: u64, path: PathBuf, bytes: u64, entries: &[Entry]) {
    for (entry, cost) in entries.iter().zip(costs(entries)) {
        state.index.entry(entry.hash).or_insert(Location {
            pack: id,
            entry: *entry,
            cost,
        });
    }
    state.packs.insert(
        id,
        PackInfo {
            path,
            bytes,
            chunks: entries.len() as u64,
        },
    );
}

/// Fills `buffer` from `input` as far as it goes; the number of bytes read (0 at the end).
fn read_full(input: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match input.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// At most this size is read as a recipe (a 64 GiB file's recipe is about 1.2 MB).
const RECIPE_MAX: u64 = 16 * 1024 * 1024;

fn read_recipe(path: &Path) -> Result<Recipe> {
    let unreadable = |e: &dyn std::fmt::Display| {
        Error::crashed(format!("the recipe {} cannot be read: {e}", path.display()))
    };
    let file = File::open(path).map_err(|e| unreadable(&e))?;
    let mut bytes = Vec::new();
    file.take(RECIPE_MAX)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(&e))?;
    Recipe::decode(&bytes).map_err(|e| unreadable(&e))
}

/// Whether `name` is a recipe; the name of the file it stands for.
pub fn chunked_name(name: &str) -> Option<&str> {
    name.strip_suffix(recipe::SUFFIX)
}

/// The recipes in a snapshot directory.
fn recipes_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if chunked_name(&name).is_some() && !name.starts_with('.') {
            found.push(entry.path());
        }
    }
    Ok(found)
}
