//! A pack: the chunks one save brought to the store, compressed with zstd in frames of up to
//! [`FRAME_BYTES`], followed by an index of them and a footer. Written under a temporary name,
//! fsynced and renamed into place, so a pack is either whole or absent; the index carries a
//! SHA-256 of its own, and every chunk read is checked against the hash that names it.
//!
//! ```text
//! "EVVMPACK" version:u32le | frame... | entry... | index_offset:u64le count:u32le sha256(entries) "EVVMPEND"
//! entry = hash[32] frame_offset:u64le frame_len:u32le offset_in_frame:u32le len:u32le
//! ```

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A chunk's name: the SHA-256 of its bytes.
pub(crate) type Hash = [u8; 32];

const MAGIC: &[u8; 8] = b"EVVMPACK";
const END: &[u8; 8] = b"EVVMPEND";
const VERSION: u32 = 1;
const HEADER: u64 = 12;
const ENTRY: usize = 32 + 8 + 4 + 4 + 4;
const FOOTER: usize = 8 + 4 + 32 + 8;
/// Chunks are grouped into frames of at most this many bytes before compression: zstd packs
/// 4 KiB pages one by one about 1.2 times bigger than a whole file, 64 KiB frames 1.07 times,
/// and a read decompresses one frame.
pub(crate) const FRAME_BYTES: usize = 64 * 1024;
/// At most this many chunks in one pack's index (a bound for reading a damaged footer).
const MAX_ENTRIES: u32 = 16 * 1024 * 1024;

/// Where a chunk lies in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub hash: Hash,
    pub frame_offset: u64,
    pub frame_len: u32,
    pub offset: u32,
    pub len: u32,
}

/// Writes one pack: chunks are added one by one and framed as they come, so that memory holds
/// one frame at most.
pub(crate) struct PackWriter {
    file: Option<BufWriter<File>>,
    temporary: PathBuf,
    path: PathBuf,
    position: u64,
    frame: Vec<u8>,
    framed: Vec<(Hash, u32, u32)>,
    entries: Vec<Entry>,
    level: i32,
}

impl PackWriter {
    /// Starts the pack that will be `path` once finished.
    pub(crate) fn create(path: PathBuf, level: i32) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = path.with_file_name(format!(".tmp-{name}"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(|e| failed(&temporary, "create", &e))?;
        let mut writer = Self {
            file: Some(BufWriter::with_capacity(256 * 1024, file)),
            temporary,
            path,
            position: 0,
            frame: Vec::with_capacity(FRAME_BYTES),
            framed: Vec::new(),
            entries: Vec::new(),
            level,
        };
        let mut header = Vec::with_capacity(HEADER as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        writer.write(&header)?;
        Ok(writer)
    }

    /// Adds a chunk of at most [`FRAME_BYTES`].
    pub(crate) fn add(&mut self, hash: Hash, data: &[u8]) -> Result<()> {
        if data.len() > FRAME_BYTES {
            return Err(Error::internal(format!(
                "a chunk of {} bytes is bigger than a frame",
                data.len()
            )));
        }
        if self.frame.len() + data.len() > FRAME_BYTES {
            self.flush_frame()?;
        }
        let offset = u32::try_from(self.frame.len()).unwrap_or(u32::MAX);
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.frame.extend_from_slice(data);
        self.framed.push((hash, offset, len));
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Err(failed(&self.temporary, "write", &"it is finished"));
        };
        file.write_all(bytes)
            .map_err(|e| failed(&self.temporary, "write", &e))?;
        self.position += bytes.len() as u64;
        Ok(())
    }

    fn flush_frame(&mut self) -> Result<()> {
        if self.framed.is_empty() {
            return Ok(());
        }
        let packed = compress(&self.frame, self.level)
            .map_err(|e| failed(&self.temporary, "compress", &e))?;
        let frame_offset = self.position;
        let frame_len = u32::try_from(packed.len()).unwrap_or(u32::MAX);
        self.write(&packed)?;
        for (hash, offset, len) in self.framed.drain(..) {
            self.entries.push(Entry {
                hash,
                frame_offset,
                frame_len,
                offset,
                len,
            });
        }
        self.frame.clear();
        Ok(())
    }

    /// Writes the index and footer, syncs the pack and renames it into place (then syncs the
    /// directory). Returns its entries and its size; with no chunk added, nothing is kept.
    pub(crate) fn finish(mut self) -> Result<Option<(Vec<Entry>, u64)>> {
        self.flush_frame()?;
        if self.entries.is_empty() {
            let _ = std::fs::remove_file(&self.temporary);
            return Ok(None);
        }
        let index_offset = self.position;
        let mut index = Vec::with_capacity(self.entries.len() * ENTRY);
        for entry in &self.entries {
            encode_entry(entry, &mut index);
        }
        let mut footer = Vec::with_capacity(FOOTER);
        footer.extend_from_slice(&index_offset.to_le_bytes());
        footer.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        footer.extend_from_slice(&Sha256::digest(&index));
        footer.extend_from_slice(END);
        self.write(&index)?;
        self.write(&footer)?;
        let temporary = self.temporary.clone();
        let file = self
            .file
            .take()
            .ok_or_else(|| failed(&temporary, "write", &"it is finished"))?
            .into_inner()
            .map_err(|e| failed(&temporary, "write", e.error()))?;
        file.sync_all()
            .map_err(|e| failed(&temporary, "sync", &e))?;
        std::fs::rename(&temporary, &self.path).map_err(|e| failed(&temporary, "rename", &e))?;
        if let Some(dir) = self.path.parent() {
            crate::fsutil::fsync_dir(dir)?;
        }
        let size = self.position;
        self.temporary = PathBuf::new();
        Ok(Some((std::mem::take(&mut self.entries), size)))
    }
}

impl Drop for PackWriter {
    fn drop(&mut self) {
        // An unfinished pack (a failed save) leaves nothing behind.
        if !self.temporary.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

fn encode_entry(entry: &Entry, out: &mut Vec<u8>) {
    out.extend_from_slice(&entry.hash);
    out.extend_from_slice(&entry.frame_offset.to_le_bytes());
    out.extend_from_slice(&entry.frame_len.to_le_bytes());
    out.extend_from_slice(&entry.offset.to_le_bytes());
    out.extend_from_slice(&entry.len.to_le_bytes());
}

fn failed(path: &Path, doing: &str, e: &dyn std::fmt::Display) -> Error {
    Error::internal(format!("cannot {doing} the pack {}: {e}", path.display()))
}

fn damaged(path: &Path, why: &str) -> Error {
    Error::crashed(format!(
        "the snapshot pack {} is damaged: {why}",
        path.display()
    ))
}

fn compress(data: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    let mut encoder = zstd::stream::Encoder::new(Vec::with_capacity(data.len() / 2), level)?;
    encoder.include_checksum(true)?;
    encoder.write_all(data)?;
    encoder.finish()
}

fn le_u32(bytes: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    u32::from_le_bytes(word)
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

/// Reads and checks a pack's index: its footer, version and the index's own checksum, and that
/// every entry lies within the pack's frames.
pub(crate) fn read_index(path: &Path) -> Result<Vec<Entry>> {
    let file = File::open(path).map_err(|e| failed(path, "open", &e))?;
    let size = file.metadata().map_err(|e| failed(path, "read", &e))?.len();
    if size < HEADER + FOOTER as u64 {
        return Err(damaged(path, "shorter than its header and footer"));
    }
    let mut header = [0u8; HEADER as usize];
    file.read_exact_at(&mut header, 0)
        .map_err(|e| failed(path, "read", &e))?;
    let mut footer = [0u8; FOOTER];
    file.read_exact_at(&mut footer, size - FOOTER as u64)
        .map_err(|e| failed(path, "read", &e))?;
    let place = index_place(path, size, &header, &footer)?;
    let mut index = vec![0u8; usize::try_from(place.len).unwrap_or(usize::MAX)];
    file.read_exact_at(&mut index, place.offset)
        .map_err(|e| failed(path, "read", &e))?;
    parse_index(path, &place, &index)
}

/// The bytes at the start of a pack ([`index_place`] checks them).
pub(crate) const HEADER_BYTES: u64 = HEADER;
/// The bytes at the end of a pack ([`index_place`] reads them).
pub(crate) const FOOTER_BYTES: u64 = FOOTER as u64;

/// Where a pack's index lies, and the checksum it must have.
#[derive(Debug, Clone)]
pub(crate) struct IndexPlace {
    pub offset: u64,
    pub len: u64,
    sha256: [u8; 32],
}

/// Where the index of the pack `path` (of `size` bytes) lies, from its first [`HEADER_BYTES`]
/// and its last [`FOOTER_BYTES`]: checks the magic, the version and that the footer fits.
pub(crate) fn index_place(
    path: &Path,
    size: u64,
    header: &[u8],
    footer: &[u8],
) -> Result<IndexPlace> {
    if size < HEADER + FOOTER as u64 || header.len() != HEADER as usize || footer.len() != FOOTER {
        return Err(damaged(path, "shorter than its header and footer"));
    }
    if &header[..8] != MAGIC {
        return Err(damaged(path, "not a pack"));
    }
    let version = le_u32(&header[8..]);
    if version != VERSION {
        return Err(damaged(
            path,
            &format!("pack format {version}, this engine reads {VERSION}"),
        ));
    }
    if &footer[FOOTER - 8..] != END {
        return Err(damaged(path, "its footer is missing (a cut-off write?)"));
    }
    let offset = le_u64(footer);
    let count = le_u32(&footer[8..]);
    let len = u64::from(count) * ENTRY as u64;
    if count > MAX_ENTRIES
        || offset < HEADER
        || offset.checked_add(len) != Some(size - FOOTER as u64)
    {
        return Err(damaged(path, "its footer does not match its size"));
    }
    let mut sha256 = [0u8; 32];
    sha256.copy_from_slice(&footer[12..44]);
    Ok(IndexPlace {
        offset,
        len,
        sha256,
    })
}

/// The entries of a pack's `index` (the bytes at `place`), checked against the index's
/// checksum and against the pack's frames.
pub(crate) fn parse_index(path: &Path, place: &IndexPlace, index: &[u8]) -> Result<Vec<Entry>> {
    if index.len() as u64 != place.len || Sha256::digest(index).as_slice() != place.sha256 {
        return Err(damaged(path, "its index checksum differs"));
    }
    let mut entries = Vec::with_capacity(index.len() / ENTRY);
    for raw in index.chunks_exact(ENTRY) {
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&raw[..32]);
        let entry = Entry {
            hash,
            frame_offset: le_u64(&raw[32..]),
            frame_len: le_u32(&raw[40..]),
            offset: le_u32(&raw[44..]),
            len: le_u32(&raw[48..]),
        };
        let frame_end = entry.frame_offset.checked_add(u64::from(entry.frame_len));
        if entry.frame_offset < HEADER
            || frame_end.is_none_or(|end| end > place.offset)
            || u64::from(entry.offset) + u64::from(entry.len) > FRAME_BYTES as u64
        {
            return Err(damaged(path, "an index entry points outside its frames"));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Reads and decompresses the frame `entry` lies in (zstd checks the frame's own checksum).
pub(crate) fn read_frame(file: &File, path: &Path, entry: &Entry) -> Result<Vec<u8>> {
    read_frame_with(file, path, entry, &mut None)
}

/// [`read_frame`] with a decompression context kept between frames (made on first use).
pub(crate) fn read_frame_with(
    file: &File,
    path: &Path,
    entry: &Entry,
    decompressor: &mut Option<zstd::bulk::Decompressor<'static>>,
) -> Result<Vec<u8>> {
    let mut packed = vec![0u8; entry.frame_len as usize];
    file.read_exact_at(&mut packed, entry.frame_offset)
        .map_err(|e| damaged(path, &format!("a frame cannot be read ({e})")))?;
    let context = match decompressor {
        Some(context) => context,
        None => decompressor.insert(zstd::bulk::Decompressor::new().map_err(|e| {
            Error::internal(format!("cannot make a zstd decompression context: {e}"))
        })?),
    };
    context
        .decompress(&packed, FRAME_BYTES)
        .map_err(|e| damaged(path, &format!("a frame does not decompress ({e})")))
}

/// Decompresses one frame of the pack `path`.
pub(crate) fn unpack_frame(path: &Path, packed: &[u8]) -> Result<Vec<u8>> {
    zstd::bulk::decompress(packed, FRAME_BYTES)
        .map_err(|e| damaged(path, &format!("a frame does not decompress ({e})")))
}

/// The chunk `entry` names out of its decompressed `frame`.
pub(crate) fn chunk_in<'f>(frame: &'f [u8], path: &Path, entry: &Entry) -> Result<&'f [u8]> {
    let start = entry.offset as usize;
    frame
        .get(start..start + entry.len as usize)
        .ok_or_else(|| damaged(path, "a chunk lies beyond its frame"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(data: &[u8]) -> Hash {
        Sha256::digest(data).into()
    }

    #[test]
    fn a_pack_reads_back_and_damage_to_its_index_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.pack");
        let mut writer = PackWriter::create(path.clone(), 3).unwrap();
        let chunks: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 4096]).collect();
        for chunk in &chunks {
            writer.add(hash(chunk), chunk).unwrap();
        }
        let big = vec![9u8; FRAME_BYTES];
        writer.add(hash(&big), &big).unwrap();
        assert!(writer.add([0; 32], &vec![0; FRAME_BYTES + 1]).is_err());
        let (entries, size) = writer.finish().unwrap().unwrap();
        assert_eq!(entries.len(), 41);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        assert!(size < 20_000, "{size}");
        assert_eq!(read_index(&path).unwrap(), entries);
        let file = File::open(&path).unwrap();
        for (entry, chunk) in entries.iter().zip(chunks.iter().chain([&big])) {
            let frame = read_frame(&file, &path, entry).unwrap();
            assert_eq!(chunk_in(&frame, &path, entry).unwrap(), chunk.as_slice());
        }
        // Nothing temporary is left; an empty pack is not kept at all.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
        let empty = PackWriter::create(dir.path().join("b.pack"), 3).unwrap();
        assert!(empty.finish().unwrap().is_none());
        assert!(!dir.path().join("b.pack").exists());

        // A flipped byte in a frame fails its read; in the index, the whole pack is refused.
        let mut bytes = std::fs::read(&path).unwrap();
        let frame_byte = entries[0].frame_offset as usize + 20;
        bytes[frame_byte] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        assert!(read_frame(&file, &path, &entries[0]).is_err());
        bytes[frame_byte] ^= 0x40;
        let index_byte = bytes.len() - FOOTER - 10;
        bytes[index_byte] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = read_index(&path).unwrap_err();
        assert!(err.message().contains("index checksum"), "{err}");
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let err = read_index(&path).unwrap_err();
        assert!(err.message().contains("footer"), "{err}");
    }
}
