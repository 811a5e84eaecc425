//! How a file is put back together from chunks. A chunked file `NAME` in a snapshot directory
//! is replaced by `NAME.chunks`, its recipe: the file's size and the hashes of a few list
//! chunks, each listing the data chunks (hash and length) of one stretch of the file, in order.
//!
//! The lists are cut where a data chunk's hash says so (content-defined), not every N entries:
//! when a page appears or disappears early in a memory file, every later page moves, but the
//! lists after the change still end at the same pages and stay the same chunks. Two snapshots of
//! one machine, or two machines from one base, then share most of their lists as well as most
//! of their pages, and a recipe stays a few kilobytes.
//!
//! ```text
//! recipe = "EVVMRCPE" version:u32le size:u64le count:u32le list_hash[32]...
//! list   = (hash[32] len:u32le)...
//! ```

use super::pack::Hash;
use crate::error::{Error, Result};

/// What a recipe's file name ends with.
pub(crate) const SUFFIX: &str = ".chunks";
const MAGIC: &[u8; 8] = b"EVVMRCPE";
const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8 + 4;
const LIST_ENTRY: usize = 32 + 4;
/// A list ends after a chunk whose hash's first two bytes are 0 modulo this (about 64 entries,
/// 256 KiB of memory, per list on average)...
const LIST_CUT: u16 = 64;
/// ... and at this many entries at most.
const LIST_MAX: usize = 256;

/// A decoded recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recipe {
    pub size: u64,
    pub lists: Vec<Hash>,
}

impl Recipe {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.lists.len() * 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.lists.len() as u32).to_le_bytes());
        for list in &self.lists {
            out.extend_from_slice(list);
        }
        out
    }

    /// Decodes a recipe, refusing one of another format or with a length that does not match.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let refused = |why: &str| Error::crashed(format!("a chunk recipe is unusable: {why}"));
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(refused("not a recipe"));
        }
        let mut word = [0u8; 4];
        word.copy_from_slice(&bytes[8..12]);
        let version = u32::from_le_bytes(word);
        if version != VERSION {
            return Err(refused(&format!(
                "recipe format {version}, this engine reads {VERSION}"
            )));
        }
        let mut size = [0u8; 8];
        size.copy_from_slice(&bytes[12..20]);
        word.copy_from_slice(&bytes[20..24]);
        let count = u32::from_le_bytes(word) as usize;
        let body = &bytes[HEADER..];
        if body.len() != count.saturating_mul(32) {
            return Err(refused("its length does not match its count"));
        }
        let lists = body
            .chunks_exact(32)
            .map(|raw| {
                let mut hash = [0u8; 32];
                hash.copy_from_slice(raw);
                hash
            })
            .collect();
        Ok(Self {
            size: u64::from_le_bytes(size),
            lists,
        })
    }
}

/// Whether a list ends after the chunk named `hash`.
fn cuts_after(hash: &Hash) -> bool {
    u16::from_le_bytes([hash[0], hash[1]]).is_multiple_of(LIST_CUT)
}

/// Splits a file's chunks (hash, length) into lists (see the module's documentation).
pub(crate) fn split_lists(chunks: &[(Hash, u32)]) -> Vec<&[(Hash, u32)]> {
    let mut lists = Vec::new();
    let mut start = 0;
    for (i, (hash, _)) in chunks.iter().enumerate() {
        if cuts_after(hash) || i + 1 - start >= LIST_MAX {
            lists.push(&chunks[start..=i]);
            start = i + 1;
        }
    }
    if start < chunks.len() {
        lists.push(&chunks[start..]);
    }
    lists
}

pub(crate) fn encode_list(chunks: &[(Hash, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks.len() * LIST_ENTRY);
    for (hash, len) in chunks {
        out.extend_from_slice(hash);
        out.extend_from_slice(&len.to_le_bytes());
    }
    out
}

pub(crate) fn decode_list(bytes: &[u8]) -> Result<Vec<(Hash, u32)>> {
    if !bytes.len().is_multiple_of(LIST_ENTRY) {
        return Err(Error::crashed(
            "a chunk list is unusable: its length is not a whole number of entries",
        ));
    }
    Ok(bytes
        .chunks_exact(LIST_ENTRY)
        .map(|raw| {
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&raw[..32]);
            let mut len = [0u8; 4];
            len.copy_from_slice(&raw[32..]);
            (hash, u32::from_le_bytes(len))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn chunk(i: u32) -> (Hash, u32) {
        (Sha256::digest(i.to_le_bytes()).into(), 4096)
    }

    #[test]
    fn lists_cut_at_the_same_chunks_after_a_shift() {
        let chunks: Vec<_> = (0..5000).map(chunk).collect();
        let lists = split_lists(&chunks);
        assert!(lists.len() > 40 && lists.len() < 160, "{}", lists.len());
        assert_eq!(lists.concat(), chunks);
        // One page more near the start: all but the first list or two are the same.
        let mut shifted = chunks.clone();
        shifted.insert(10, chunk(1_000_000));
        let before: std::collections::HashSet<Vec<u8>> =
            lists.iter().map(|l| encode_list(l)).collect();
        let after = split_lists(&shifted);
        let new = after
            .iter()
            .filter(|l| !before.contains(&encode_list(l)))
            .count();
        assert!(new <= 2, "{new} of {} lists changed", after.len());
        assert_eq!(decode_list(&encode_list(&chunks)).unwrap(), chunks);
        assert!(decode_list(&[0; 35]).is_err());
    }

    #[test]
    fn a_recipe_round_trips_and_a_bad_one_is_refused() {
        let recipe = Recipe {
            size: 12_345,
            lists: vec![[1; 32], [2; 32]],
        };
        let bytes = recipe.encode();
        assert_eq!(Recipe::decode(&bytes).unwrap(), recipe);
        assert!(Recipe::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut other = bytes.clone();
        other[8] = 9;
        let err = Recipe::decode(&other).unwrap_err();
        assert!(err.message().contains("format 9"), "{err}");
        assert!(Recipe::decode(b"EVVMPACK").is_err());
    }
}
