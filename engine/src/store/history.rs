//! A machine's history: its instructions with their output and results, and its checkpoints.

use rusqlite::{OptionalExtension, params};

use super::{CheckpointRecord, Store, machine_gone, now, parse_time, stored};
use crate::error::{Error, Result};
use crate::types::{ExecResult, FailureCause, OutputChunk, OutputStream};

impl Store {
    // --- checkpoints ----------------------------------------------------------------------

    /// Records a checkpoint; refused when the machine already has one by that name.
    pub fn insert_checkpoint(
        &mut self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<()> {
        let inserted = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO checkpoints (machine, name, created_at, instruction_count)
                 VALUES (?1, ?2, ?3, ?4)",
                params![
                    machine,
                    checkpoint.name,
                    stored(checkpoint.created_at),
                    checkpoint.instruction_count
                ],
            )
            .map_err(|e| machine_gone(machine, e))?;
        if inserted == 0 {
            return Err(Error::new(
                crate::ErrorKind::Conflict,
                format!(
                    "machine {machine} already has a checkpoint named {:?}",
                    checkpoint.name
                ),
            ));
        }
        Ok(())
    }

    /// Records when a reserved checkpoint was taken and what it holds.
    pub fn complete_checkpoint(
        &mut self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<()> {
        let updated = self.conn.execute(
            "UPDATE checkpoints SET created_at = ?3, instruction_count = ?4
             WHERE machine = ?1 AND name = ?2",
            params![
                machine,
                checkpoint.name,
                stored(checkpoint.created_at),
                checkpoint.instruction_count
            ],
        )?;
        if updated == 0 {
            // The machine (and with it the reservation) was deleted meanwhile.
            return Err(Error::checkpoint_not_found(machine, &checkpoint.name));
        }
        Ok(())
    }

    /// The machine's checkpoints, oldest first.
    pub fn checkpoints(&self, machine: &str) -> Result<Vec<CheckpointRecord>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT name, created_at, instruction_count FROM checkpoints WHERE machine = ?1
             ORDER BY created_at, name",
        )?;
        let rows = statement.query_map(params![machine], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut checkpoints = Vec::new();
        for row in rows {
            let (name, created_at, instruction_count) = row?;
            checkpoints.push(CheckpointRecord {
                name,
                created_at: parse_time(&created_at)?,
                instruction_count,
            });
        }
        Ok(checkpoints)
    }

    /// Removes a checkpoint's row; false if there was none.
    pub fn delete_checkpoint(&mut self, machine: &str, name: &str) -> Result<bool> {
        let deleted = self.conn.execute(
            "DELETE FROM checkpoints WHERE machine = ?1 AND name = ?2",
            params![machine, name],
        )?;
        Ok(deleted > 0)
    }

    /// Marks the instructions run since a checkpoint as rolled back by it (they stay in the
    /// history). Returns how many were marked.
    pub fn mark_rolled_back(
        &mut self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<usize> {
        Ok(self.conn.execute(
            "UPDATE instructions SET rolled_back_to = ?3
             WHERE machine = ?1 AND seq >= ?2 AND rolled_back_to IS NULL",
            params![machine, checkpoint.instruction_count, checkpoint.name],
        )?)
    }

    /// The checkpoint an instruction was rolled back by, if any.
    pub fn rolled_back_to(&self, machine: &str, seq: i64) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT rolled_back_to FROM instructions WHERE machine = ?1 AND seq = ?2",
                params![machine, seq],
                |r| r.get(0),
            )
            .optional()?
            .flatten())
    }

    // --- instructions ---------------------------------------------------------------------

    /// Gives the next seq of the machine to a new instruction and stores it.
    pub fn insert_instruction(
        &mut self,
        machine: &str,
        code: &str,
        timeout_ms: u64,
    ) -> Result<i64> {
        let tx = self.conn.transaction()?;
        let seq: i64 = tx
            .query_row(
                "UPDATE machines SET next_seq = next_seq + 1, last_used_at = ?2 WHERE name = ?1
                 RETURNING next_seq - 1",
                params![machine, now()],
                |r| r.get(0),
            )
            .map_err(|e| machine_gone(machine, e))?;
        tx.execute(
            "INSERT INTO instructions (machine, seq, code, timeout_ms, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![machine, seq, code, timeout_ms as i64, now()],
        )?;
        tx.commit()?;
        Ok(seq)
    }

    /// Stores output of a running instruction (consecutive chunks, continuing what was stored
    /// before), so that a long instruction's output reaches the disk as it comes.
    pub(crate) fn append_output(
        &mut self,
        machine: &str,
        seq: i64,
        output: &OutputBatches,
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        insert_output(&tx, machine, seq, output)?;
        tx.commit()?;
        Ok(())
    }

    /// Stores the rest of an instruction's output (what [`Store::append_output`] did not) and
    /// its result, together.
    pub(crate) fn finish_instruction(
        &mut self,
        machine: &str,
        seq: i64,
        output: &OutputBatches,
        result: &ExecResult,
    ) -> Result<()> {
        let encoded = serde_json::to_string(result)
            .map_err(|e| Error::internal(format!("cannot encode a result: {e}")))?;
        let tx = self.conn.transaction()?;
        insert_output(&tx, machine, seq, output)?;
        tx.execute(
            "UPDATE instructions SET result = ?3, finished_at = ?4 WHERE machine = ?1 AND seq = ?2",
            params![machine, seq, encoded, now()],
        )?;
        tx.execute(
            "UPDATE machines SET last_used_at = ?2 WHERE name = ?1",
            params![machine, now()],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Whether the instruction exists, and its result if it finished.
    pub fn instruction_result(
        &self,
        machine: &str,
        seq: i64,
    ) -> Result<Option<Option<ExecResult>>> {
        let row: Option<Option<String>> = self
            .conn
            .query_row(
                "SELECT result FROM instructions WHERE machine = ?1 AND seq = ?2",
                params![machine, seq],
                |r| r.get(0),
            )
            .optional()?;
        match row {
            None => Ok(None),
            Some(None) => Ok(Some(None)),
            Some(Some(text)) => {
                let result = serde_json::from_str(&text).map_err(|e| {
                    Error::internal(format!(
                        "stored result of {machine}/{seq} is unreadable: {e}"
                    ))
                })?;
                Ok(Some(Some(result)))
            }
        }
    }

    pub fn instruction_output(&self, machine: &str, seq: i64) -> Result<Vec<OutputChunk>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT first_seq, chunks FROM outputs WHERE machine = ?1 AND instruction = ?2
             ORDER BY first_seq",
        )?;
        let rows = statement.query_map(params![machine, seq], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, rusqlite::types::Value>(1)?))
        })?;
        let mut chunks = Vec::new();
        for row in rows {
            let (first_seq, stored) = row?;
            decode_output(first_seq, stored, &mut chunks).map_err(|e| {
                Error::internal(format!(
                    "stored output of {machine}/{seq} is unreadable: {e}"
                ))
            })?;
        }
        Ok(chunks)
    }

    /// Instructions left without a result by an engine that stopped: they get an error result.
    pub fn fail_unfinished(&mut self, reason: &str) -> Result<usize> {
        let result = ExecResult::failure(FailureCause::MachineCrashed, reason);
        let encoded = serde_json::to_string(&result)
            .map_err(|e| Error::internal(format!("cannot encode a result: {e}")))?;
        let changed = self.conn.execute(
            "UPDATE instructions SET result = ?1, finished_at = ?2 WHERE result IS NULL",
            params![encoded, now()],
        )?;
        Ok(changed)
    }
}

/// Inserts encoded output batches; refused (as a missing machine) when the instruction's machine
/// is gone.
fn insert_output(
    tx: &rusqlite::Transaction<'_>,
    machine: &str,
    seq: i64,
    output: &OutputBatches,
) -> Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT OR REPLACE INTO outputs (machine, instruction, first_seq, chunks)
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (first_seq, encoded) in &output.0 {
        insert
            .execute(params![machine, seq, first_seq, encoded])
            .map_err(|e| machine_gone(machine, e))?;
    }
    Ok(())
}

/// Output chunks as the store keeps them: consecutive batches of at most 4096 chunks or about
/// 1 MiB, each encoded by [`encode_output`] with the seq of its first chunk. Encoded where the
/// output is (one copy into a few buffers), not chunk by chunk on the store's thread.
#[derive(Debug, Default)]
pub(crate) struct OutputBatches(Vec<(i64, Vec<u8>)>);

impl OutputBatches {
    pub(crate) fn encode(output: &[OutputChunk]) -> Result<Self> {
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
            decode_output(
                *first_seq,
                rusqlite::types::Value::Blob(bytes.clone()),
                &mut chunks,
            )
            .unwrap();
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

/// A batch of chunks as stored: per chunk one byte for the stream (0 stdout, 1 stderr, 2 a rich result), the
/// length of its text (4 bytes, little-endian), and the text. Far cheaper to write and read than
/// JSON, whose escaping costs more than the disk for large outputs.
fn encode_output(batch: &[OutputChunk]) -> Result<Vec<u8>> {
    let size = batch.iter().map(|c| 5 + c.data.len()).sum();
    let mut encoded = Vec::with_capacity(size);
    for chunk in batch {
        encoded.push(match chunk.stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
            OutputStream::Display => 2,
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
fn decode_output(
    first_seq: i64,
    stored: rusqlite::types::Value,
    chunks: &mut Vec<OutputChunk>,
) -> std::result::Result<(), String> {
    use rusqlite::types::Value;
    match stored {
        Value::Blob(bytes) => {
            let mut rest = bytes.as_slice();
            let mut seq = first_seq;
            while let [stream, a, b, c, d, tail @ ..] = rest {
                let stream = match stream {
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
                chunks.push(OutputChunk { seq, stream, data });
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
        Value::Text(text) => {
            let pairs: Vec<(String, String)> =
                serde_json::from_str(&text).map_err(|e| e.to_string())?;
            for (offset, (stream, data)) in pairs.into_iter().enumerate() {
                let stream = OutputStream::from_str_opt(&stream).unwrap_or(OutputStream::Stdout);
                chunks.push(OutputChunk {
                    seq: first_seq + offset as i64,
                    stream,
                    data,
                });
            }
            Ok(())
        }
        other => Err(format!("a value of type {}", other.data_type())),
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
        }
    }

    #[test]
    fn output_batches_read_back_as_written_and_old_json_batches_still_read() {
        let batch = [
            chunk(7, OutputStream::Stdout, "héllo"),
            chunk(8, OutputStream::Stderr, ""),
            chunk(9, OutputStream::Stdout, "\"quoted\"\u{0}"),
        ];
        let mut read = Vec::new();
        decode_output(
            7,
            rusqlite::types::Value::Blob(encode_output(&batch).unwrap()),
            &mut read,
        )
        .unwrap();
        assert_eq!(read, batch);
        let json = r#"[["stdout","a"],["stderr","b"]]"#.to_owned();
        let mut read = Vec::new();
        decode_output(3, rusqlite::types::Value::Text(json), &mut read).unwrap();
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
            let refused = decode_output(0, rusqlite::types::Value::Blob(bytes.clone()), &mut read);
            assert!(refused.is_err(), "{bytes:?} was read as {read:?}");
        }
    }
}
