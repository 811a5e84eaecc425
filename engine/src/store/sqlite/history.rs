//! A machine's history: its instructions with their output and results, and its checkpoints.

use rusqlite::{OptionalExtension, params};

use super::{Store, machine_gone};
use crate::error::{Error, Result};
use crate::store::output::{StoredBatch, decode_output};
use crate::store::{
    CheckpointRecord, InstructionRow, OutputBatches, Unfinished, checkpoint_exists, decode_result,
    encode_result, now, parse_time, stored,
};
use crate::types::{ExecResult, FailureCause, OutputChunk};

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
                "INSERT OR IGNORE INTO checkpoints
                 (machine, name, created_at, instruction_count, sha256)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    machine,
                    checkpoint.name,
                    stored(checkpoint.created_at),
                    checkpoint.instruction_count,
                    checkpoint.sha256
                ],
            )
            .map_err(|e| machine_gone(machine, e))?;
        if inserted == 0 {
            return Err(checkpoint_exists(machine, &checkpoint.name));
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
            "UPDATE checkpoints SET created_at = ?3, instruction_count = ?4, sha256 = ?5
             WHERE machine = ?1 AND name = ?2",
            params![
                machine,
                checkpoint.name,
                stored(checkpoint.created_at),
                checkpoint.instruction_count,
                checkpoint.sha256
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
            "SELECT name, created_at, instruction_count, sha256 FROM checkpoints
             WHERE machine = ?1 ORDER BY created_at, name",
        )?;
        let rows = statement.query_map(params![machine], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?;
        let mut checkpoints = Vec::new();
        for row in rows {
            let (name, created_at, instruction_count, sha256) = row?;
            checkpoints.push(CheckpointRecord {
                name,
                created_at: parse_time(&created_at)?,
                instruction_count,
                sha256,
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

    /// Marks the instructions with `after < seq < before` not yet taken back as taken back by
    /// `label`; how many were marked.
    pub fn mark_rewound(
        &mut self,
        machine: &str,
        after: i64,
        before: i64,
        label: &str,
    ) -> Result<usize> {
        Ok(self.conn.execute(
            "UPDATE instructions SET rolled_back_to = ?4
             WHERE machine = ?1 AND seq > ?2 AND seq < ?3 AND rolled_back_to IS NULL",
            params![machine, after, before, label],
        )?)
    }

    /// The instructions a rewind or rollback took back, oldest first, at most `limit`.
    pub fn taken_back(&self, machine: &str, limit: usize) -> Result<Vec<(i64, String)>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT seq, rolled_back_to FROM instructions
             WHERE machine = ?1 AND rolled_back_to IS NOT NULL ORDER BY seq LIMIT ?2",
        )?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = statement.query_map(params![machine, limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// The machine's instructions from `from_seq` on, oldest first, at most `limit`.
    pub fn instructions_from(
        &self,
        machine: &str,
        from_seq: i64,
        limit: usize,
    ) -> Result<Vec<InstructionRow>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT seq, code, result, rolled_back_to FROM instructions
             WHERE machine = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        )?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = statement.query_map(params![machine, from_seq, limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?;
        let mut found = Vec::new();
        for row in rows {
            let (seq, code, result, rolled_back_to) = row?;
            found.push(InstructionRow {
                seq,
                code,
                result: result
                    .map(|text| decode_result(machine, seq, &text))
                    .transpose()?,
                rolled_back_to,
            });
        }
        Ok(found)
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
        let encoded = encode_result(result)?;
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
            Some(Some(text)) => Ok(Some(Some(decode_result(machine, seq, &text)?))),
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
            let batch = match &stored {
                rusqlite::types::Value::Blob(bytes) => StoredBatch::Binary(bytes),
                rusqlite::types::Value::Text(text) => StoredBatch::Json(text),
                other => {
                    return Err(Error::internal(format!(
                        "stored output of {machine}/{seq} is a value of type {}",
                        other.data_type()
                    )));
                }
            };
            decode_output(first_seq, batch, &mut chunks).map_err(|e| {
                Error::internal(format!(
                    "stored output of {machine}/{seq} is unreadable: {e}"
                ))
            })?;
        }
        Ok(chunks)
    }

    /// Instructions left without a result by an engine that stopped: they get an error result.
    pub fn fail_unfinished(&mut self, reason: &str, scope: &Unfinished) -> Result<usize> {
        let encoded = encode_result(&ExecResult::failure(FailureCause::MachineCrashed, reason))?;
        let at = now();
        let changed = match scope {
            Unfinished::All => self.conn.execute(
                "UPDATE instructions SET result = ?1, finished_at = ?2 WHERE result IS NULL",
                params![encoded, at],
            )?,
            Unfinished::OwnedBy(node) => self.conn.execute(
                "UPDATE instructions SET result = ?1, finished_at = ?2 WHERE result IS NULL
                 AND machine IN (SELECT name FROM machines WHERE owner = ?3)",
                params![encoded, at, node],
            )?,
            Unfinished::OfMachine { machine, except } => {
                let tx = self.conn.transaction()?;
                let unfinished: Vec<i64> = {
                    let mut select = tx.prepare_cached(
                        "SELECT seq FROM instructions WHERE machine = ?1 AND result IS NULL",
                    )?;
                    select
                        .query_map(params![machine], |r| r.get(0))?
                        .collect::<rusqlite::Result<_>>()?
                };
                let mut changed = 0;
                for seq in unfinished.iter().filter(|seq| !except.contains(seq)) {
                    changed += tx.execute(
                        "UPDATE instructions SET result = ?1, finished_at = ?2
                         WHERE machine = ?3 AND seq = ?4 AND result IS NULL",
                        params![encoded, at, machine, seq],
                    )?;
                }
                tx.commit()?;
                changed
            }
        };
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
