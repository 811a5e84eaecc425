//! Chunks leaving and entering the store whole, for a bucket ([`crate::bucket`]): which chunks
//! a snapshot names, a pack of some of them written for an upload, and chunks a download
//! brought, checked and added in a pack of their own.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::pack::{Entry, Hash, PackWriter};
use super::{ChunkStore, Pinned, Reader, read_recipe, recipe, recipes_in, register};
use crate::error::{Error, Result};
use crate::sync::lock;

impl Pinned {
    /// The chunks pinned.
    pub(crate) fn hashes(&self) -> impl Iterator<Item = &Hash> {
        self.hashes.iter()
    }
}

impl ChunkStore {
    /// Pins each of `hashes` into `pinned` and gives back those the store lacks (a chunk it
    /// holds stays, pinned, until `pinned` is dropped).
    pub(crate) fn pin_lacking(&self, pinned: &mut Pinned, hashes: &[Hash]) -> Vec<Hash> {
        let mut state = lock(&self.state);
        let mut lacking = Vec::new();
        for hash in hashes {
            pinned.pin(&mut state, *hash);
            if !state.index.contains_key(hash) {
                lacking.push(*hash);
            }
        }
        lacking
    }

    /// The chunks of the lists the recipes in `dir` name (the hashes of the lists themselves).
    pub(crate) fn lists_in(dir: &Path) -> Result<Vec<Hash>> {
        let mut lists = Vec::new();
        for path in recipes_in(dir)? {
            lists.extend(read_recipe(&path)?.lists);
        }
        Ok(lists)
    }

    /// The data chunks the lists `lists` name (read from this store), each once.
    pub(crate) fn listed(&self, lists: &[Hash]) -> Result<Vec<Hash>> {
        let mut reader = Reader::default();
        let mut seen = HashSet::new();
        let mut hashes = Vec::new();
        for list in lists {
            for (hash, _) in recipe::decode_list(&self.read_chunk(list, &mut reader)?)? {
                if seen.insert(hash) {
                    hashes.push(hash);
                }
            }
        }
        Ok(hashes)
    }

    /// Writes the chunks `hashes` (read from this store, checked) into a new pack at `path`,
    /// compressed at zstd `level`; its entries and size (`None` when `hashes` is empty).
    pub(crate) fn export_pack(
        &self,
        hashes: &[Hash],
        path: PathBuf,
        level: i32,
    ) -> Result<Option<(Vec<Entry>, u64)>> {
        let mut writer = PackWriter::create(path, level)?;
        let mut reader = Reader::default();
        for hash in hashes {
            writer.add(*hash, &self.read_chunk(hash, &mut reader)?)?;
        }
        writer.finish()
    }

    /// Where an export's pack is written before it is sent (`<home>/chunks/packs/.tmp-...`
    /// is a pack being written; this is a finished one not for the store).
    pub(crate) fn export_path(&self) -> PathBuf {
        let id: u64 = rand::random();
        self.packs_dir
            .with_file_name(format!("outgoing-{id:016x}.pack"))
    }

    /// Adds chunks brought from elsewhere, each checked against its hash, in one new pack;
    /// those the store holds already are skipped. The caller has pinned them.
    pub(crate) fn import(&self, chunks: &[(Hash, Vec<u8>)], level: i32) -> Result<()> {
        let (pack_id, mut writer) = self.new_pack(level)?;
        let mut added = HashSet::new();
        for (hash, data) in chunks {
            if Sha256::digest(data).as_slice() != hash {
                return Err(Error::crashed(format!(
                    "the chunk {} brought from the bucket does not match its hash",
                    hex::encode(hash)
                )));
            }
            let known = lock(&self.state).index.contains_key(hash);
            if !known && added.insert(*hash) {
                writer.add(*hash, data)?;
            }
        }
        if let Some((entries, bytes)) = writer.finish()? {
            let path = self.packs_dir.join(format!("{pack_id:016x}.pack"));
            register(&mut lock(&self.state), pack_id, path, bytes, &entries);
        }
        Ok(())
    }
}
