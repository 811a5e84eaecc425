//! Content-defined cut points for snapshot files other than memory (runsc's `checkpoint.img`,
//! the kernel's state). That file is serialized anew by every save, so a change early in it
//! shifts everything after: cut at fixed offsets, every piece was new at every save (305 KB of
//! 305 KB per undo point on a pandas machine); cut where the content says, the pieces after a
//! change line up again. A gear hash (as FastCDC's) over the bytes since the last cut: a cut
//! where its top bits are zero, so about every 8 KiB, never before 2 KiB or after 64 KiB.

/// No cut before this many bytes...
const MIN: usize = 2 * 1024;
/// ... always one at this many (a frame of the pack).
pub(super) const MAX: usize = super::pack::FRAME_BYTES;
/// Cuts about every 2^BITS bytes.
const BITS: u32 = 13;

/// 256 fixed pseudo-random words (splitmix64 from a fixed seed): the same cuts on every host
/// and in every version, so that chunks keep deduplicating.
const GEAR: [u64; 256] = gear();

const fn gear() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut state: u64 = 0x0123_4567_89ab_cdef;
    let mut i = 0;
    while i < 256 {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        table[i] = z ^ (z >> 31);
        i += 1;
    }
    table
}

/// The length of the first chunk of `data`: `data` is at least [`MAX`] bytes long, or holds
/// the rest of the file.
pub(super) fn cut(data: &[u8]) -> usize {
    let end = data.len().min(MAX);
    if end <= MIN {
        return end;
    }
    let mask: u64 = ((1u64 << BITS) - 1) << (64 - BITS);
    let mut hash: u64 = 0;
    for (i, byte) in data.iter().enumerate().take(end).skip(MIN) {
        hash = (hash << 1).wrapping_add(GEAR[usize::from(*byte)]);
        if hash & mask == 0 {
            return i + 1;
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(data: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let len = cut(rest);
            out.push(&rest[..len]);
            rest = &rest[len..];
        }
        out
    }

    #[test]
    fn cuts_follow_the_content_so_an_insertion_changes_only_the_chunks_around_it() {
        let mut state = 7u64;
        let data: Vec<u8> = (0..300_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let before = chunks(&data);
        assert!(before.iter().all(|c| c.len() <= MAX));
        assert!(before[..before.len() - 1].iter().all(|c| c.len() > MIN));
        let average = data.len() / before.len();
        assert!((4 * 1024..16 * 1024).contains(&average), "{average}");
        // Ten bytes inserted near the start: all but a chunk or two are the same.
        let mut changed = data.clone();
        changed.splice(5_000..5_000, [1u8; 10]);
        let after = chunks(&changed);
        let known: std::collections::HashSet<&[u8]> = before.iter().copied().collect();
        let new = after.iter().filter(|c| !known.contains(*c)).count();
        assert!(new <= 2, "{new} of {} chunks new", after.len());
        // Short input is one chunk; zeros are cut at MAX.
        assert_eq!(cut(&[0u8; 100]), 100);
        assert_eq!(cut(&vec![0u8; 3 * MAX]), MAX);
    }
}
