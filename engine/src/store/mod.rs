//! Metadata store: accounts, tokens (hashed), machines, instructions, results and output, in one
//! SQLite database (`evervm.db`, WAL) under the engine's home.

use std::path::Path;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::guest::image::Profile;
use crate::types::{
    Account, Durability, ExecResult, FailureCause, MachineName, OutputChunk, OutputStream, Tags,
};

const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = r"
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS accounts (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    secret_sha256 TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS machines (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    created_at TEXT NOT NULL,
    tags TEXT NOT NULL,
    memory_mb INTEGER NOT NULL,
    image TEXT NOT NULL DEFAULT 'minimal',
    backend TEXT NOT NULL,
    next_seq INTEGER NOT NULL DEFAULT 0,
    last_used_at TEXT,
    last_error TEXT,
    durability TEXT NOT NULL DEFAULT 'idle'
);
CREATE TABLE IF NOT EXISTS instructions (
    machine TEXT NOT NULL,
    seq INTEGER NOT NULL,
    code TEXT NOT NULL,
    timeout_ms INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    result TEXT,
    finished_at TEXT,
    rolled_back_to TEXT,
    PRIMARY KEY (machine, seq)
);
-- Named, kept snapshots of a machine (the files are under machines/<name>/checkpoints/).
CREATE TABLE IF NOT EXISTS checkpoints (
    machine TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    instruction_count INTEGER NOT NULL,
    PRIMARY KEY (machine, name)
);
-- Output is stored in batches of consecutive chunks (a JSON array of [stream, data] pairs whose
-- seqs start at first_seq): one row per line would make large outputs slow to store.
CREATE TABLE IF NOT EXISTS outputs (
    machine TEXT NOT NULL,
    instruction INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    chunks TEXT NOT NULL,
    PRIMARY KEY (machine, instruction, first_seq)
);
";

/// A machine's row.
#[derive(Debug, Clone)]
pub struct MachineRecord {
    pub name: MachineName,
    pub account_id: i64,
    pub created_at: DateTime<Utc>,
    pub tags: Tags,
    pub memory_mb: u32,
    pub image: Profile,
    pub backend: String,
    pub next_seq: i64,
    pub last_used_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub durability: Durability,
}

/// A checkpoint's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The machine's instruction count when the checkpoint was taken.
    pub instruction_count: i64,
}

/// The database. Not `Sync`: the engine keeps it behind a mutex.
pub struct Store {
    conn: Connection,
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn parse_time(text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| Error::internal(format!("stored time {text:?} is invalid: {e}")))
}

fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn random_alnum(len: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

impl Store {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)
            .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
        // First, so that opening while another process (`evervm token create` beside a
        // server) holds the database waits instead of failing.
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(SCHEMA)?;
        let version: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        match version {
            None => {
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )?;
            }
            Some(v) if v == SCHEMA_VERSION.to_string() => {}
            Some(v) if v == "1" || v == "2" => {
                // Version 2 added the machines' image profile; version 3 their durability and
                // the marks rollbacks leave on instructions (the checkpoints table is created
                // above).
                let mut steps = String::from("BEGIN;");
                if v == "1" {
                    steps +=
                        "ALTER TABLE machines ADD COLUMN image TEXT NOT NULL DEFAULT 'minimal';";
                }
                steps += "ALTER TABLE machines ADD COLUMN durability TEXT NOT NULL DEFAULT 'idle';
                     ALTER TABLE instructions ADD COLUMN rolled_back_to TEXT;
                     UPDATE meta SET value = '3' WHERE key = 'schema_version';
                     COMMIT;";
                conn.execute_batch(&steps)?;
            }
            Some(v) => {
                return Err(Error::internal(format!(
                    "{} has schema version {v}, this engine knows version {SCHEMA_VERSION}: \
                     use the evervm release that wrote it",
                    path.display()
                )));
            }
        }
        Ok(Self { conn })
    }

    // --- accounts and tokens --------------------------------------------------------------

    /// The account with this name, created if it does not exist.
    pub fn ensure_account(&mut self, name: &str) -> Result<Account> {
        self.conn.execute(
            "INSERT OR IGNORE INTO accounts (name, created_at) VALUES (?1, ?2)",
            params![name, now()],
        )?;
        let id = self.conn.query_row(
            "SELECT id FROM accounts WHERE name = ?1",
            params![name],
            |r| r.get(0),
        )?;
        Ok(Account {
            id,
            name: name.to_owned(),
        })
    }

    /// Creates a token for the account; returns it as `id.secret`. Only its hash is stored.
    pub fn create_token(&mut self, account: &Account) -> Result<String> {
        let id = random_alnum(12);
        let secret = random_alnum(40);
        self.conn.execute(
            "INSERT INTO tokens (id, account_id, secret_sha256, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![id, account.id, hash_secret(&secret), now()],
        )?;
        Ok(format!("{id}.{secret}"))
    }

    pub fn count_tokens(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM tokens", [], |r| r.get(0))?)
    }

    /// The account a token belongs to.
    pub fn authenticate(&self, token: &str) -> Result<Account> {
        let Some((id, secret)) = token.split_once('.') else {
            return Err(Error::unauthorized(
                "the token is malformed: expected <id>.<secret>",
            ));
        };
        let row: Option<(String, i64, String)> = self
            .conn
            .query_row(
                "SELECT t.secret_sha256, a.id, a.name FROM tokens t
                 JOIN accounts a ON a.id = t.account_id WHERE t.id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((stored_hash, account_id, name)) = row else {
            return Err(Error::unauthorized("unknown token"));
        };
        let given = hash_secret(secret);
        // Constant-time comparison of the two hex digests.
        let same = stored_hash.len() == given.len()
            && stored_hash
                .bytes()
                .zip(given.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(Error::unauthorized("unknown token"));
        }
        Ok(Account {
            id: account_id,
            name,
        })
    }

    // --- machines -------------------------------------------------------------------------

    pub fn insert_machine(&mut self, record: &MachineRecord) -> Result<()> {
        let tags = serde_json::to_string(&record.tags)
            .map_err(|e| Error::internal(format!("cannot encode tags: {e}")))?;
        self.conn.execute(
            "INSERT INTO machines (name, account_id, created_at, tags, memory_mb, image, backend,
             next_seq, durability) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?8)",
            params![
                record.name.as_str(),
                record.account_id,
                record
                    .created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                tags,
                record.memory_mb,
                record.image.as_str(),
                record.backend,
                record.durability.as_str()
            ],
        )?;
        Ok(())
    }

    fn machine_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawMachine> {
        Ok(RawMachine {
            name: row.get(0)?,
            account_id: row.get(1)?,
            created_at: row.get(2)?,
            tags: row.get(3)?,
            memory_mb: row.get(4)?,
            backend: row.get(5)?,
            next_seq: row.get(6)?,
            last_used_at: row.get(7)?,
            last_error: row.get(8)?,
            image: row.get(9)?,
            durability: row.get(10)?,
        })
    }

    const MACHINE_COLUMNS: &'static str = "name, account_id, created_at, tags, memory_mb, \
        backend, next_seq, last_used_at, last_error, image, durability";

    pub fn machine(&self, name: &str) -> Result<Option<MachineRecord>> {
        let raw = self
            .conn
            .query_row(
                &format!(
                    "SELECT {} FROM machines WHERE name = ?1",
                    Self::MACHINE_COLUMNS
                ),
                params![name],
                Self::machine_from_row,
            )
            .optional()?;
        raw.map(RawMachine::into_record).transpose()
    }

    /// The account's machines, newest first.
    pub fn machines(&self, account_id: i64) -> Result<Vec<MachineRecord>> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {} FROM machines WHERE account_id = ?1 ORDER BY position DESC",
            Self::MACHINE_COLUMNS
        ))?;
        let rows = statement.query_map(params![account_id], Self::machine_from_row)?;
        let mut machines = Vec::new();
        for row in rows {
            machines.push(row?.into_record()?);
        }
        Ok(machines)
    }

    pub fn set_last_error(&mut self, name: &str, error: Option<&str>) -> Result<()> {
        self.conn.execute(
            "UPDATE machines SET last_error = ?2 WHERE name = ?1",
            params![name, error],
        )?;
        Ok(())
    }

    pub fn delete_machine(&mut self, name: &str) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute("DELETE FROM outputs WHERE machine = ?1", params![name])?;
        tx.execute("DELETE FROM instructions WHERE machine = ?1", params![name])?;
        tx.execute("DELETE FROM checkpoints WHERE machine = ?1", params![name])?;
        tx.execute("DELETE FROM machines WHERE name = ?1", params![name])?;
        tx.commit()?;
        Ok(())
    }

    // --- checkpoints ----------------------------------------------------------------------

    /// Records a checkpoint; refused when the machine already has one by that name.
    pub fn insert_checkpoint(
        &mut self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<()> {
        let inserted = self.conn.execute(
            "INSERT OR IGNORE INTO checkpoints (machine, name, created_at, instruction_count)
             VALUES (?1, ?2, ?3, ?4)",
            params![
                machine,
                checkpoint.name,
                checkpoint
                    .created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                checkpoint.instruction_count
            ],
        )?;
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
        self.conn.execute(
            "UPDATE checkpoints SET created_at = ?3, instruction_count = ?4
             WHERE machine = ?1 AND name = ?2",
            params![
                machine,
                checkpoint.name,
                checkpoint
                    .created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                checkpoint.instruction_count
            ],
        )?;
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
        let seq: i64 = tx.query_row(
            "UPDATE machines SET next_seq = next_seq + 1, last_used_at = ?2 WHERE name = ?1
             RETURNING next_seq - 1",
            params![machine, now()],
            |r| r.get(0),
        )?;
        tx.execute(
            "INSERT INTO instructions (machine, seq, code, timeout_ms, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![machine, seq, code, timeout_ms as i64, now()],
        )?;
        tx.commit()?;
        Ok(seq)
    }

    /// Stores an instruction's output and result together.
    pub fn finish_instruction(
        &mut self,
        machine: &str,
        seq: i64,
        output: &[OutputChunk],
        result: &ExecResult,
    ) -> Result<()> {
        let encoded = serde_json::to_string(result)
            .map_err(|e| Error::internal(format!("cannot encode a result: {e}")))?;
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT OR REPLACE INTO outputs (machine, instruction, first_seq, chunks)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            for batch in output_batches(output) {
                let first_seq = batch.first().map_or(0, |c| c.seq);
                let pairs: Vec<(&str, &str)> = batch
                    .iter()
                    .map(|c| (c.stream.as_str(), c.data.as_str()))
                    .collect();
                let encoded = serde_json::to_string(&pairs)
                    .map_err(|e| Error::internal(format!("cannot encode output: {e}")))?;
                insert.execute(params![machine, seq, first_seq, encoded])?;
            }
        }
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
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut chunks = Vec::new();
        for row in rows {
            let (first_seq, encoded) = row?;
            let pairs: Vec<(String, String)> = serde_json::from_str(&encoded).map_err(|e| {
                Error::internal(format!(
                    "stored output of {machine}/{seq} is unreadable: {e}"
                ))
            })?;
            for (offset, (stream, data)) in pairs.into_iter().enumerate() {
                let stream = OutputStream::from_str_opt(&stream).unwrap_or(OutputStream::Stdout);
                chunks.push(OutputChunk {
                    seq: first_seq + offset as i64,
                    stream,
                    data,
                });
            }
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

struct RawMachine {
    name: String,
    account_id: i64,
    created_at: String,
    tags: String,
    memory_mb: u32,
    backend: String,
    next_seq: i64,
    last_used_at: Option<String>,
    last_error: Option<String>,
    image: String,
    durability: String,
}

impl RawMachine {
    fn into_record(self) -> Result<MachineRecord> {
        let tags: Tags = serde_json::from_str(&self.tags).map_err(|e| {
            Error::internal(format!("stored tags of {} are unreadable: {e}", self.name))
        })?;
        Ok(MachineRecord {
            name: MachineName::parse(&self.name)?,
            account_id: self.account_id,
            created_at: parse_time(&self.created_at)?,
            tags,
            memory_mb: self.memory_mb,
            image: Profile::parse(&self.image)?,
            backend: self.backend,
            next_seq: self.next_seq,
            last_used_at: self.last_used_at.as_deref().map(parse_time).transpose()?,
            last_error: self.last_error,
            durability: Durability::parse(&self.durability)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store with account `a` and the named machines.
    fn store_with(dir: &tempfile::TempDir, machines: &[&str]) -> (Store, Account) {
        let mut store = Store::open(&dir.path().join("db")).unwrap();
        let account = store.ensure_account("a").unwrap();
        for name in machines {
            store
                .insert_machine(&MachineRecord {
                    name: MachineName::parse(name).unwrap(),
                    account_id: account.id,
                    created_at: Utc::now(),
                    tags: Tags::new(),
                    memory_mb: 256,
                    image: Profile::Minimal,
                    backend: "process".into(),
                    next_seq: 0,
                    last_used_at: None,
                    last_error: None,
                    durability: Durability::Idle,
                })
                .unwrap();
        }
        (store, account)
    }

    #[test]
    fn tokens_authenticate_only_with_the_right_secret() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("db")).unwrap();
        let account = store.ensure_account("alice").unwrap();
        let token = store.create_token(&account).unwrap();
        assert_eq!(store.authenticate(&token).unwrap(), account);
        let (id, _) = token.split_once('.').unwrap();
        assert!(store.authenticate(&format!("{id}.wrong")).is_err());
        assert!(store.authenticate("nodot").is_err());
        let stored: String = store
            .conn
            .query_row("SELECT secret_sha256 FROM tokens", [], |r| r.get(0))
            .unwrap();
        assert!(!token.contains(&stored), "the secret itself is not stored");
    }

    #[test]
    fn output_round_trips_through_batches() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = store_with(&dir, &["m"]);
        let seq = store.insert_instruction("m", "print()", 1000).unwrap();
        let output: Vec<OutputChunk> = (0..10_000)
            .map(|i| OutputChunk {
                seq: i,
                stream: if i % 3 == 0 {
                    OutputStream::Stderr
                } else {
                    OutputStream::Stdout
                },
                data: format!("line {i} \u{e9}\n\"quoted\""),
            })
            .collect();
        let result = ExecResult::failure(FailureCause::Exception, "x");
        store
            .finish_instruction("m", seq, &output, &result)
            .unwrap();
        assert_eq!(store.instruction_output("m", seq).unwrap(), output);
        assert_eq!(
            store.instruction_result("m", seq).unwrap(),
            Some(Some(result))
        );
    }

    #[test]
    fn seqs_count_from_zero_per_machine() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, account) = store_with(&dir, &["m1", "m2"]);
        assert_eq!(store.insert_instruction("m1", "1", 1000).unwrap(), 0);
        assert_eq!(store.insert_instruction("m1", "2", 1000).unwrap(), 1);
        assert_eq!(store.insert_instruction("m2", "3", 1000).unwrap(), 0);
        let names: Vec<_> = store
            .machines(account.id)
            .unwrap()
            .into_iter()
            .map(|m| m.name.to_string())
            .collect();
        assert_eq!(names, ["m2", "m1"]);
    }
}
