//! The PostgreSQL store (`--database postgres://...`): for nodes that share one service. A pool
//! of connections (deadpool-postgres over tokio-postgres); every operation one transaction;
//! the schema is made (or upgraded) under an advisory lock, so nodes starting together do not
//! race.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

mod audit;
mod leases;
mod open;
mod settings;
mod tls;

pub use settings::PostgresSettings;

use super::output::{StoredBatch, decode_output};
use super::schema;
use super::{
    CheckpointRecord, InstructionRow, Lease, LeaseOutcome, MACHINE_COLUMNS, MachineRecord,
    Metadata, NodeRecord, OutputBatches, RawMachine, TokenRecord, Unfinished, checkpoint_exists,
    decode_result, encode_result, machine_exists, machine_json, new_token, no_such_token, now,
    parse_time, stored, token_expiry, too_many_machines,
};
use crate::error::{Error, Result};
use crate::types::{Account, ExecResult, FailureCause, OutputChunk, TokenInfo};

/// Connections the pool keeps at most, by default.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long making a connection, or waiting for a free one, may take before the operation fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The advisory lock nodes hold while they make or upgrade the schema (any constant; "evervm").
const SCHEMA_LOCK: i64 = 0x6576_6572_766d;

/// The lock a server holds on its database for as long as it runs (any constant; "evervm-1"):
/// until nodes can share one (leases), a second server on the same database is refused.
const SERVER_LOCK: i64 = 0x6576_6572_766d_2d31;

/// The PostgreSQL store.
pub struct PostgresStore {
    pool: Pool,
    database: String,
    /// The connection that holds [`SERVER_LOCK`], taken out of the pool: the lock goes when it
    /// closes (the server stops, or dies and the database notices).
    held: std::sync::Mutex<Option<deadpool_postgres::ClientWrapper>>,
    /// What seals and opens machines' secret environment values (none: kept as given).
    keys: Option<std::sync::Arc<crate::secrets::SecretKeys>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

/// A database error, said plainly: which database, and what went wrong.
fn failed(e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(db) => Error::internal(format!(
            "PostgreSQL: {} ({})",
            db.message(),
            db.code().code()
        )),
        None => Error::internal(format!("PostgreSQL: {}", with_causes(&e))),
    }
}

/// An error's text followed by its causes' (a TLS handshake's says why the certificate was
/// refused only in its cause).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let next_text = next.to_string();
        if !text.contains(&next_text) {
            text.push_str(": ");
            text.push_str(&next_text);
        }
        cause = next.source();
    }
    text
}

/// The error for a write about a machine whose row is gone (deleted meanwhile).
fn machine_gone(machine: &str, e: tokio_postgres::Error) -> Error {
    if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) {
        Error::machine_not_found(machine)
    } else {
        failed(e)
    }
}

/// A column of a row, or an error naming it (never a panic, whatever the database holds).
fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    index: usize,
) -> Result<T> {
    row.try_get(index).map_err(|e| {
        Error::internal(format!(
            "PostgreSQL: column {index} of a stored row is unreadable: {e}"
        ))
    })
}

fn raw_machine(row: &tokio_postgres::Row) -> Result<RawMachine> {
    let memory_mb: i64 = column(row, 4)?;
    Ok(RawMachine {
        name: column(row, 0)?,
        account_id: column(row, 1)?,
        created_at: column(row, 2)?,
        tags: column(row, 3)?,
        memory_mb: u32::try_from(memory_mb)
            .map_err(|_| Error::internal(format!("a stored memory size of {memory_mb} MB")))?,
        backend: column(row, 5)?,
        next_seq: column(row, 6)?,
        last_used_at: column(row, 7)?,
        last_error: column(row, 8)?,
        image: column(row, 9)?,
        durability: column(row, 10)?,
        unsaved_since: column(row, 11)?,
        snapshot_at: column(row, 12)?,
        env: column(row, 13)?,
        expires_at: column(row, 14)?,
        position: column(row, 15)?,
        network: column(row, 16)?,
        snapshot_sha256: column(row, 17)?,
        history: column(row, 18)?,
        parent: column(row, 19)?,
        forked_at: column(row, 20)?,
    })
}

impl PostgresStore {
    /// Seals every machine's secret environment values anew with the current key of `keys` (see
    /// the SQLite store's), in one transaction; how many machines changed.
    pub async fn reseal_secret_env(&self, keys: &crate::secrets::SecretKeys) -> Result<usize> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let rows = tx
            .query(
                "SELECT name, env FROM machines ORDER BY position FOR UPDATE",
                &[],
            )
            .await
            .map_err(failed)?;
        let mut changed = 0;
        for row in &rows {
            let name: String = column(row, 0)?;
            let env: String = column(row, 1)?;
            if let Some(sealed) = super::reseal_stored_env(&name, &env, keys)? {
                tx.execute(
                    "UPDATE machines SET env = $2 WHERE name = $1",
                    &[&name, &sealed],
                )
                .await
                .map_err(failed)?;
                changed += 1;
            }
        }
        tx.commit().await.map_err(failed)?;
        Ok(changed)
    }

    /// The store, sealing and opening secret environment values with `keys`.
    #[must_use]
    pub fn with_secret_keys(
        self,
        keys: Option<std::sync::Arc<crate::secrets::SecretKeys>>,
    ) -> Self {
        Self { keys, ..self }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|e| Error::internal(format!("PostgreSQL at {}: {e}", self.database)))
    }

    /// A machine's environment column as stored, for tests.
    #[cfg(test)]
    pub(crate) async fn stored_env(&self, machine: &str) -> Result<String> {
        let row = self
            .query_opt("SELECT env FROM machines WHERE name = $1", &[&machine])
            .await?
            .ok_or_else(|| Error::machine_not_found(machine))?;
        column(&row, 0)
    }

    /// Runs statements as they are: for tests that take a database back to an older schema.
    #[cfg(test)]
    pub(crate) async fn batch(&self, sql: &str) -> Result<()> {
        let client = self.client().await?;
        client.batch_execute(sql).await.map_err(failed)
    }

    /// Runs one statement outside a transaction; how many rows it changed.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let client = self.client().await?;
        client.execute(sql, params).await.map_err(failed)
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let client = self.client().await?;
        client.query(sql, params).await.map_err(failed)
    }

    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>> {
        let client = self.client().await?;
        client.query_opt(sql, params).await.map_err(failed)
    }
}

/// Inserts encoded output batches (replacing a batch stored before with the same first seq);
/// refused, as a missing machine, when the instruction's machine is gone.
async fn insert_output(
    tx: &deadpool_postgres::Transaction<'_>,
    machine: &str,
    seq: i64,
    output: &OutputBatches,
) -> Result<()> {
    let insert = tx
        .prepare_cached(
            "INSERT INTO outputs (machine, instruction, first_seq, chunks) VALUES ($1, $2, $3, $4)
             ON CONFLICT (machine, instruction, first_seq) DO UPDATE SET chunks = EXCLUDED.chunks",
        )
        .await
        .map_err(failed)?;
    for (first_seq, encoded) in &output.0 {
        tx.execute(&insert, &[&machine, &seq, first_seq, encoded])
            .await
            .map_err(|e| machine_gone(machine, e))?;
    }
    Ok(())
}

#[async_trait]
impl Metadata for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn ensure_account(&self, name: &str) -> Result<Account> {
        self.execute(
            "INSERT INTO accounts (name, created_at) VALUES ($1, $2)
             ON CONFLICT (name) DO NOTHING",
            &[&name, &now()],
        )
        .await?;
        let row = self
            .query_opt("SELECT id FROM accounts WHERE name = $1", &[&name])
            .await?
            .ok_or_else(|| Error::internal(format!("account {name} vanished as it was made")))?;
        Ok(Account {
            id: column(&row, 0)?,
            name: name.to_owned(),
        })
    }

    async fn create_token(
        &self,
        account: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<String> {
        let account = self.ensure_account(account).await?;
        let (id, secret, hash) = new_token();
        self.execute(
            "INSERT INTO tokens (id, account_id, secret_sha256, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5)",
            &[&id, &account.id, &hash, &now(), &token_expiry(expires_at)],
        )
        .await?;
        Ok(format!("{id}.{secret}"))
    }

    async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        let rows = self
            .query(
                "SELECT t.id, a.name, t.created_at, t.expires_at FROM tokens t
                 JOIN accounts a ON a.id = t.account_id ORDER BY t.created_at, t.id",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(TokenInfo {
                    id: column(row, 0)?,
                    account: column(row, 1)?,
                    created_at: parse_time(&column::<String>(row, 2)?)?,
                    expires_at: column::<Option<String>>(row, 3)?
                        .as_deref()
                        .map(parse_time)
                        .transpose()?,
                })
            })
            .collect()
    }

    async fn revoke_token(&self, id: &str) -> Result<()> {
        if self
            .execute("DELETE FROM tokens WHERE id = $1", &[&id])
            .await?
            == 0
        {
            return Err(no_such_token(id));
        }
        Ok(())
    }

    async fn count_tokens(&self) -> Result<i64> {
        let row = self.query_opt("SELECT COUNT(*) FROM tokens", &[]).await?;
        row.map_or(Ok(0), |row| column(&row, 0))
    }

    async fn token_record(&self, id: &str) -> Result<Option<TokenRecord>> {
        let Some(row) = self
            .query_opt(
                "SELECT t.secret_sha256, a.id, a.name, t.expires_at FROM tokens t
                 JOIN accounts a ON a.id = t.account_id WHERE t.id = $1",
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(TokenRecord {
            secret_sha256: column(&row, 0)?,
            account: Account {
                id: column(&row, 1)?,
                name: column(&row, 2)?,
            },
            expires_at: column(&row, 3)?,
        }))
    }

    async fn insert_machine(&self, record: &MachineRecord, limit: usize) -> Result<()> {
        let (tags, env, network) = machine_json(record, self.keys.as_deref())?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        // The account's row, locked: machines created at once for one account are counted one
        // after the other, on every node.
        tx.query_opt(
            "SELECT id FROM accounts WHERE id = $1 FOR UPDATE",
            &[&record.account_id],
        )
        .await
        .map_err(failed)?;
        let count: i64 = column(
            &tx.query_one(
                "SELECT COUNT(*) FROM machines WHERE account_id = $1",
                &[&record.account_id],
            )
            .await
            .map_err(failed)?,
            0,
        )?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if count >= limit {
            return Err(too_many_machines(count, limit));
        }
        tx.execute(
            "INSERT INTO machines (name, account_id, created_at, tags, memory_mb, image, backend,
             next_seq, durability, snapshot_at, env, expires_at, network, snapshot_sha256,
             history, parent, forked_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            &[
                &record.name.as_str(),
                &record.account_id,
                &stored(record.created_at),
                &tags,
                &i64::from(record.memory_mb),
                &record.image.as_str(),
                &record.backend,
                &record.durability.as_str(),
                &record.snapshot_at.map(stored),
                &env,
                &record.expires_at.map(stored),
                &network,
                &record.snapshot_sha256,
                &i64::from(record.history),
                &record.parent,
                &record.forked_at,
            ],
        )
        .await
        .map_err(|e| {
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
                machine_exists(&record.name)
            } else {
                failed(e)
            }
        })?;
        tx.commit().await.map_err(failed)
    }

    async fn machine(&self, name: &str) -> Result<Option<MachineRecord>> {
        self.query_opt(
            &format!("SELECT {MACHINE_COLUMNS} FROM machines WHERE name = $1"),
            &[&name],
        )
        .await?
        .map(|row| raw_machine(&row)?.into_record(self.keys.as_deref()))
        .transpose()
    }

    async fn machines(&self, account_id: i64) -> Result<Vec<MachineRecord>> {
        self.query(
            &format!(
                "SELECT {MACHINE_COLUMNS} FROM machines WHERE account_id = $1 \
                 ORDER BY position DESC"
            ),
            &[&account_id],
        )
        .await?
        .iter()
        .map(|row| raw_machine(row)?.into_record(self.keys.as_deref()))
        .collect()
    }

    async fn machine_accounts(&self) -> Result<Vec<(String, String)>> {
        self.query(
            "SELECT m.name, a.name FROM machines m JOIN accounts a ON a.id = m.account_id",
            &[],
        )
        .await?
        .iter()
        .map(|row| Ok((column(row, 0)?, column(row, 1)?)))
        .collect()
    }

    async fn expired_machines(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(
            "SELECT account_id, name FROM machines WHERE expires_at IS NOT NULL
             AND expires_at <= $1 ORDER BY expires_at LIMIT $2",
            &[&stored(now), &limit],
        )
        .await?
        .iter()
        .map(|row| Ok((column(row, 0)?, column(row, 1)?)))
        .collect()
    }

    async fn mark_unsaved(&self, name: &str) -> Result<()> {
        self.execute(
            "UPDATE machines SET unsaved_since = COALESCE(unsaved_since, $2) WHERE name = $1",
            &[&name, &now()],
        )
        .await?;
        Ok(())
    }

    async fn mark_saved(&self, name: &str, sha256: Option<&str>) -> Result<()> {
        self.execute(
            "UPDATE machines SET unsaved_since = NULL, snapshot_at = $2, snapshot_sha256 = $3
             WHERE name = $1",
            &[&name, &now(), &sha256],
        )
        .await?;
        Ok(())
    }

    async fn note_snapshots_on_disk(&self, names: &[String]) -> Result<usize> {
        let changed = self
            .execute(
                "UPDATE machines SET snapshot_at = $2 WHERE name = ANY($1) AND snapshot_at IS NULL",
                &[&names, &now()],
            )
            .await?;
        Ok(usize::try_from(changed).unwrap_or(usize::MAX))
    }

    async fn count_machines(&self, account_id: i64) -> Result<usize> {
        let row = self
            .query_opt(
                "SELECT COUNT(*) FROM machines WHERE account_id = $1",
                &[&account_id],
            )
            .await?;
        let count: i64 = row.map_or(Ok(0), |row| column(&row, 0))?;
        Ok(usize::try_from(count).unwrap_or(usize::MAX))
    }

    async fn set_last_error(&self, name: &str, error: Option<&str>) -> Result<()> {
        self.execute(
            "UPDATE machines SET last_error = $2 WHERE name = $1",
            &[&name, &error],
        )
        .await?;
        Ok(())
    }

    async fn delete_machine(&self, name: &str) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        for table in [
            "DELETE FROM outputs WHERE machine = $1",
            "DELETE FROM instructions WHERE machine = $1",
            "DELETE FROM checkpoints WHERE machine = $1",
            "DELETE FROM machines WHERE name = $1",
        ] {
            tx.execute(table, &[&name]).await.map_err(failed)?;
        }
        tx.commit().await.map_err(failed)
    }

    async fn insert_checkpoint(&self, machine: &str, checkpoint: &CheckpointRecord) -> Result<()> {
        let client = self.client().await?;
        let inserted = client
            .execute(
                "INSERT INTO checkpoints (machine, name, created_at, instruction_count, sha256)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (machine, name) DO NOTHING",
                &[
                    &machine,
                    &checkpoint.name,
                    &stored(checkpoint.created_at),
                    &checkpoint.instruction_count,
                    &checkpoint.sha256,
                ],
            )
            .await
            .map_err(|e| machine_gone(machine, e))?;
        if inserted == 0 {
            return Err(checkpoint_exists(machine, &checkpoint.name));
        }
        Ok(())
    }

    async fn complete_checkpoint(
        &self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<()> {
        let updated = self
            .execute(
                "UPDATE checkpoints SET created_at = $3, instruction_count = $4, sha256 = $5
                 WHERE machine = $1 AND name = $2",
                &[
                    &machine,
                    &checkpoint.name,
                    &stored(checkpoint.created_at),
                    &checkpoint.instruction_count,
                    &checkpoint.sha256,
                ],
            )
            .await?;
        if updated == 0 {
            return Err(Error::checkpoint_not_found(machine, &checkpoint.name));
        }
        Ok(())
    }

    async fn checkpoints(&self, machine: &str) -> Result<Vec<CheckpointRecord>> {
        self.query(
            "SELECT name, created_at, instruction_count, sha256 FROM checkpoints WHERE machine = $1
             ORDER BY created_at, name",
            &[&machine],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(CheckpointRecord {
                name: column(row, 0)?,
                created_at: parse_time(&column::<String>(row, 1)?)?,
                instruction_count: column(row, 2)?,
                sha256: column(row, 3)?,
            })
        })
        .collect()
    }

    async fn delete_checkpoint(&self, machine: &str, name: &str) -> Result<bool> {
        Ok(self
            .execute(
                "DELETE FROM checkpoints WHERE machine = $1 AND name = $2",
                &[&machine, &name],
            )
            .await?
            > 0)
    }

    async fn mark_rolled_back(
        &self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<usize> {
        let marked = self
            .execute(
                "UPDATE instructions SET rolled_back_to = $3
                 WHERE machine = $1 AND seq >= $2 AND rolled_back_to IS NULL",
                &[&machine, &checkpoint.instruction_count, &checkpoint.name],
            )
            .await?;
        Ok(usize::try_from(marked).unwrap_or(usize::MAX))
    }

    async fn rolled_back_to(&self, machine: &str, seq: i64) -> Result<Option<String>> {
        let row = self
            .query_opt(
                "SELECT rolled_back_to FROM instructions WHERE machine = $1 AND seq = $2",
                &[&machine, &seq],
            )
            .await?;
        Ok(row
            .map(|row| column::<Option<String>>(&row, 0))
            .transpose()?
            .flatten())
    }

    async fn mark_rewound(
        &self,
        machine: &str,
        after: i64,
        before: i64,
        label: &str,
    ) -> Result<usize> {
        let marked = self
            .execute(
                "UPDATE instructions SET rolled_back_to = $4
                 WHERE machine = $1 AND seq > $2 AND seq < $3 AND rolled_back_to IS NULL",
                &[&machine, &after, &before, &label],
            )
            .await?;
        Ok(usize::try_from(marked).unwrap_or(usize::MAX))
    }

    async fn taken_back(&self, machine: &str, limit: usize) -> Result<Vec<(i64, String)>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                "SELECT seq, rolled_back_to FROM instructions
                 WHERE machine = $1 AND rolled_back_to IS NOT NULL ORDER BY seq LIMIT $2",
                &[&machine, &limit],
            )
            .await?;
        rows.iter()
            .map(|row| Ok((column(row, 0)?, column(row, 1)?)))
            .collect()
    }

    async fn instructions_from(
        &self,
        machine: &str,
        from_seq: i64,
        limit: usize,
    ) -> Result<Vec<InstructionRow>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                "SELECT seq, code, result, rolled_back_to FROM instructions
                 WHERE machine = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
                &[&machine, &from_seq, &limit],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let seq: i64 = column(row, 0)?;
                let result: Option<String> = column(row, 2)?;
                Ok(InstructionRow {
                    seq,
                    code: column(row, 1)?,
                    result: result
                        .map(|text| super::decode_result(machine, seq, &text))
                        .transpose()?,
                    rolled_back_to: column(row, 3)?,
                })
            })
            .collect()
    }

    async fn insert_instruction(&self, machine: &str, code: &str, timeout_ms: u64) -> Result<i64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let row = tx
            .query_opt(
                "UPDATE machines SET next_seq = next_seq + 1, last_used_at = $2 WHERE name = $1
                 RETURNING next_seq - 1",
                &[&machine, &now()],
            )
            .await
            .map_err(failed)?
            .ok_or_else(|| Error::machine_not_found(machine))?;
        let seq: i64 = column(&row, 0)?;
        let timeout_ms = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
        tx.execute(
            "INSERT INTO instructions (machine, seq, code, timeout_ms, created_at)
             VALUES ($1, $2, $3, $4, $5)",
            &[&machine, &seq, &code, &timeout_ms, &now()],
        )
        .await
        .map_err(|e| machine_gone(machine, e))?;
        tx.commit().await.map_err(failed)?;
        Ok(seq)
    }

    async fn append_output(&self, machine: &str, seq: i64, output: OutputBatches) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        insert_output(&tx, machine, seq, &output).await?;
        tx.commit().await.map_err(failed)
    }

    async fn finish_instruction(
        &self,
        machine: &str,
        seq: i64,
        output: OutputBatches,
        result: ExecResult,
    ) -> Result<()> {
        let encoded = encode_result(&result)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        insert_output(&tx, machine, seq, &output).await?;
        let at = now();
        tx.execute(
            "UPDATE instructions SET result = $3, finished_at = $4 WHERE machine = $1 AND seq = $2",
            &[&machine, &seq, &encoded, &at],
        )
        .await
        .map_err(failed)?;
        tx.execute(
            "UPDATE machines SET last_used_at = $2 WHERE name = $1",
            &[&machine, &at],
        )
        .await
        .map_err(failed)?;
        tx.commit().await.map_err(failed)
    }

    async fn instruction_result(
        &self,
        machine: &str,
        seq: i64,
    ) -> Result<Option<Option<ExecResult>>> {
        let Some(row) = self
            .query_opt(
                "SELECT result FROM instructions WHERE machine = $1 AND seq = $2",
                &[&machine, &seq],
            )
            .await?
        else {
            return Ok(None);
        };
        match column::<Option<String>>(&row, 0)? {
            None => Ok(Some(None)),
            Some(text) => Ok(Some(Some(decode_result(machine, seq, &text)?))),
        }
    }

    async fn instruction_output(&self, machine: &str, seq: i64) -> Result<Vec<OutputChunk>> {
        let rows = self
            .query(
                "SELECT first_seq, chunks FROM outputs WHERE machine = $1 AND instruction = $2
                 ORDER BY first_seq",
                &[&machine, &seq],
            )
            .await?;
        let mut chunks = Vec::new();
        for row in &rows {
            let first_seq: i64 = column(row, 0)?;
            let bytes: &[u8] = column(row, 1)?;
            decode_output(first_seq, StoredBatch::Binary(bytes), &mut chunks).map_err(|e| {
                Error::internal(format!(
                    "stored output of {machine}/{seq} is unreadable: {e}"
                ))
            })?;
        }
        Ok(chunks)
    }

    async fn fail_unfinished(&self, reason: &str, scope: Unfinished) -> Result<usize> {
        let encoded = encode_result(&ExecResult::failure(FailureCause::MachineCrashed, reason))?;
        let at = now();
        let changed = match &scope {
            Unfinished::All => {
                self.execute(
                    "UPDATE instructions SET result = $1, finished_at = $2 WHERE result IS NULL",
                    &[&encoded, &at],
                )
                .await?
            }
            Unfinished::OwnedBy(node) => {
                self.execute(
                    "UPDATE instructions SET result = $1, finished_at = $2 WHERE result IS NULL
                     AND machine IN (SELECT name FROM machines WHERE owner = $3)",
                    &[&encoded, &at, node],
                )
                .await?
            }
            Unfinished::OfMachine { machine, except } => {
                self.execute(
                    "UPDATE instructions SET result = $1, finished_at = $2 WHERE result IS NULL
                     AND machine = $3 AND NOT (seq = ANY($4))",
                    &[&encoded, &at, machine, except],
                )
                .await?
            }
        };
        Ok(usize::try_from(changed).unwrap_or(usize::MAX))
    }

    async fn register_node(&self, id: &str, address: &str) -> Result<()> {
        self.register_node_row(id, address).await
    }

    async fn heartbeat(&self, id: &str, ttl: Duration) -> Result<usize> {
        self.heartbeat_rows(id, ttl).await
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.node_rows().await
    }

    async fn remove_node(&self, id: &str) -> Result<usize> {
        self.remove_node_row(id).await
    }

    async fn take_lease(&self, machine: &str, node: &str, ttl: Duration) -> Result<LeaseOutcome> {
        self.take_lease_row(machine, node, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool> {
        self.release_lease_row(lease).await
    }

    async fn lease(&self, machine: &str) -> Result<Option<Lease>> {
        self.lease_row(machine).await
    }

    async fn mark_saved_fenced(&self, lease: &Lease, sha256: Option<&str>) -> Result<()> {
        self.mark_saved_fenced_row(lease, sha256).await
    }

    async fn record_audit(&self, entries: Vec<super::AuditEntry>) -> Result<()> {
        self.record_audit_rows(&entries).await
    }

    async fn audit_entries(&self, query: &super::AuditQuery) -> Result<Vec<super::AuditEntry>> {
        self.audit_rows(query).await
    }

    async fn prune_audit(&self, before: DateTime<Utc>, keep: u64) -> Result<usize> {
        self.prune_audit_rows(before, keep).await
    }

    async fn flush(&self) -> Result<()> {
        // Every operation is finished when it answers.
        Ok(())
    }

    async fn hand_over(&self) {
        let held = self.held.lock().ok().and_then(|mut held| held.take());
        if let Some(client) = held {
            // Unlocked now, not when the server notices the connection closed: the next
            // server may be opening already.
            if let Err(e) = client
                .execute("SELECT pg_advisory_unlock($1)", &[&SERVER_LOCK])
                .await
            {
                tracing::warn!("PostgreSQL: cannot give up this server's hold: {e}");
            }
        }
    }
}
