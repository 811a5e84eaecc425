//! Output as the store keeps it: batches of consecutive chunks in a compact binary form.

use crate::error::{Error, Result};
use crate::types::{OutputChunk, OutputStream};

/// A stored batch as read back: binary (every store writes these) or the JSON array of
/// `[stream, data]` pairs that SQLite stores from before the binary form hold.
pub(super) enum StoredBatch<'a> {
    Binary(&'a [u8]),
    Json(&'a str),
}

/// Output chunks as the store keeps them: consecutive batches of at most 4096 chunks or about
/// 1 MiB, each encoded by [`encode_output`] with the seq of its first chunk. Encoded where the
/// output is (one copy into a few buffers), not chunk by chunk on the store's thread.
#[derive(Debug, Default)]
pub struct OutputBatches(pub(super) Vec<(i64, Vec<u8>)>);

impl OutputBatches {
    pub fn encode(output: &[OutputChunk]) -> Result<Self> {
        output_batches(output)
            .map(|batch| Ok((batch.first().map_or(0, |c| c.seq), encode_output(batch)?)))
            .collect::<Result<_>>()
            .map(Self)
    }

    /// The chunks back (for tests).
    #[cfg(test)]
    pub(crate) fn decode(&self) -> Vec<OutputChunk> {
        let mut chunks = Vec::new();
        for (first_seq, bytes) in &self.0 {
            decode_output(*first_seq, StoredBatch::Binary(bytes), &mut chunks).unwrap();
        }
        chunks
    }
}

/// Splits output into batches of at most 4096 chunks or about 1 MiB.
fn output_batches(output: &[OutputChunk]) -> impl Iterator<Item = &[OutputChunk]> {
    const MAX_CHUNKS: usize = 4096;
    const MAX_BYTES: usize = 1024 * 1024;
    let mut rest = output;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut end = 0;
        while end < rest.len() && end < MAX_CHUNKS && (end == 0 || bytes < MAX_BYTES) {
            bytes += rest[end].data.len();
            end += 1;
        }
        let (batch, remaining) = rest.split_at(end);
        rest = remaining;
        Some(batch)
    })
}

/// Added to a chunk's stream byte when its line did not end with a newline.
const PARTIAL_FLAG: u8 = 4;

/// A batch of chunks as stored: per chunk one byte for the stream (0 stdout, 1 stderr, 2 a rich
/// result; plus [`PARTIAL_FLAG`] for a line that did not end), the
/// length of its text (4 bytes, little-endian), and the text. Far cheaper to write and read than
/// JSON, whose escaping costs more than the disk for large outputs.
fn encode_output(batch: &[OutputChunk]) -> Result<Vec<u8>> {
    debug_assert!(
        batch
            .iter()
            .all(|c| !c.partial || c.stream != OutputStream::Display)
    );
    let size = batch.iter().map(|c| 5 + c.data.len()).sum();
    let mut encoded = Vec::with_capacity(size);
    for chunk in batch {
        let stream = match chunk.stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
            OutputStream::Display => 2,
        };
        encoded.push(if chunk.partial {
            stream | PARTIAL_FLAG
        } else {
            stream
        });
        let len = u32::try_from(chunk.data.len()).map_err(|_| {
            Error::internal(format!("an output chunk of {} bytes", chunk.data.len()))
        })?;
        encoded.extend_from_slice(&len.to_le_bytes());
        encoded.extend_from_slice(chunk.data.as_bytes());
    }
    Ok(encoded)
}

/// Appends the chunks of one stored batch (binary as [`encode_output`] writes it, or the JSON
/// array of `[stream, data]` pairs that stores before it hold) to `chunks`.
pub(super) fn decode_output(
    first_seq: i64,
    stored: StoredBatch<'_>,
    chunks: &mut Vec<OutputChunk>,
) -> std::result::Result<(), String> {
    match stored {
        StoredBatch::Binary(bytes) => {
            let mut rest = bytes;
            let mut seq = first_seq;
            while let [stream, a, b, c, d, tail @ ..] = rest {
                let partial = stream & PARTIAL_FLAG != 0;
                let stream = match stream & !PARTIAL_FLAG {
                    0 => OutputStream::Stdout,
                    1 => OutputStream::Stderr,
                    2 => OutputStream::Display,
                    other => return Err(format!("unknown stream {other}")),
                };
                let len = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
                let (text, tail) = tail
                    .split_at_checked(len)
                    .ok_or_else(|| format!("a chunk of {len} bytes runs past the end"))?;
                let data = std::str::from_utf8(text)
                    .map_err(|e| format!("a chunk is not UTF-8: {e}"))?
                    .to_owned();
                chunks.push(OutputChunk {
                    seq,
                    stream,
                    data,
                    partial,
                });
                seq = seq
                    .checked_add(1)
                    .ok_or_else(|| format!("chunk numbers past {seq}"))?;
                rest = tail;
            }
            if !rest.is_empty() {
                return Err(format!("{} stray bytes at the end", rest.len()));
            }
            Ok(())
        }
        StoredBatch::Json(text) => {
            let pairs: Vec<(String, String)> =
                serde_json::from_str(text).map_err(|e| e.to_string())?;
            for (offset, (stream, data)) in pairs.into_iter().enumerate() {
                let stream = OutputStream::from_str_opt(&stream).unwrap_or(OutputStream::Stdout);
                chunks.push(OutputChunk {
                    seq: first_seq + offset as i64,
                    stream,
                    data,
                    partial: false,
                });
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seq: i64, stream: OutputStream, data: &str) -> OutputChunk {
        OutputChunk {
            seq,
            stream,
            data: data.to_owned(),
            partial: false,
        }
    }

    #[test]
    fn output_batches_read_back_as_written_and_old_json_batches_still_read() {
        let batch = [
            chunk(7, OutputStream::Stdout, "héllo"),
            chunk(8, OutputStream::Stderr, ""),
            chunk(9, OutputStream::Stdout, "\"quoted\"\u{0}"),
            OutputChunk {
                partial: true,
                ..chunk(10, OutputStream::Stderr, "no newline")
            },
        ];
        let mut read = Vec::new();
        decode_output(
            7,
            StoredBatch::Binary(&encode_output(&batch).unwrap()),
            &mut read,
        )
        .unwrap();
        assert_eq!(read, batch);
        let json = r#"[["stdout","a"],["stderr","b"]]"#.to_owned();
        let mut read = Vec::new();
        decode_output(3, StoredBatch::Json(&json), &mut read).unwrap();
        assert_eq!(
            read,
            [
                chunk(3, OutputStream::Stdout, "a"),
                chunk(4, OutputStream::Stderr, "b")
            ]
        );
    }

    #[test]
    fn damaged_output_batches_are_refused() {
        let mut good = encode_output(&[chunk(0, OutputStream::Stdout, "abc")]).unwrap();
        let cut = good[..good.len() - 1].to_vec();
        let mut stray = good.clone();
        stray.push(0);
        let bad_stream = {
            good[0] = 9;
            good
        };
        let not_utf8 = vec![0, 1, 0, 0, 0, 0xff];
        for bytes in [cut, stray, bad_stream, not_utf8] {
            let mut read = Vec::new();
            let refused = decode_output(0, StoredBatch::Binary(&bytes), &mut read);
            assert!(refused.is_err(), "{bytes:?} was read as {read:?}");
        }
    }
}
