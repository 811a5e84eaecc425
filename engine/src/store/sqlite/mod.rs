//! The SQLite store: one database (`evervm.db`, WAL) in the engine's home, used from a thread
//! of its own ([`StoreThread`]).

use std::path::Path;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{
    MACHINE_COLUMNS, MachineRecord, RawMachine, TokenRecord, machine_exists, machine_json,
    new_token, no_such_token, now, parse_time, split_token, stored, token_expiry,
    too_many_machines,
};
use crate::error::{Error, Result};
use crate::types::{Account, TokenInfo};

mod audit;
mod history;
mod leases;
mod metadata;
mod thread;
mod upgrade;

pub(crate) use thread::StoreThread;

/// How long a statement waits for another process's lock on the database before it fails.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The database. Not `Sync`: the engine keeps it behind a mutex.
pub struct Store {
    conn: Connection,
    /// What seals and opens machines' secret environment values (none: kept as given).
    keys: Option<std::sync::Arc<crate::secrets::SecretKeys>>,
}

/// Makes the database and its WAL files readable and writable by their owner only (tokens'
/// hashes and every machine's code and output are in them). Best effort: a failure is logged.
fn owner_only(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut paths = vec![path.to_owned()];
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        paths.push(name.into());
    }
    for file in paths.iter().filter(|p| p.exists()) {
        if let Err(e) = std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)) {
            tracing::warn!(path = %file.display(), "cannot make the database private: {e}");
        }
    }
}

/// The error for a write about a machine whose row is gone (deleted meanwhile).
fn machine_gone(machine: &str, e: rusqlite::Error) -> Error {
    match e {
        rusqlite::Error::QueryReturnedNoRows => Error::machine_not_found(machine),
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY =>
        {
            Error::machine_not_found(machine)
        }
        other => other.into(),
    }
}

impl Store {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    /// The database files are readable by their owner only.
    pub fn open(path: &Path) -> Result<Self> {
        let mut conn = Connection::open(path)
            .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
        // First, so that opening while another process (`evervm token create` beside a
        // server) holds the database waits instead of failing.
        // Long: a write that waits for another process's lock (a backup, `sqlite3` at the
        // console) is better late than an error; results are stored before they are reported.
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        upgrade::prepare(&mut conn, path)?;
        owner_only(path);
        Ok(Self { conn, keys: None })
    }

    /// Seals every machine's secret environment values anew with the current key of `keys` (those
    /// stored before a key was given, and those sealed with a previous one), in one transaction;
    /// how many machines changed. Refused, changing nothing, if a sealed value does not open.
    pub fn reseal_secret_env(&mut self, keys: &crate::secrets::SecretKeys) -> Result<usize> {
        let tx = self.conn.transaction()?;
        let rows: Vec<(String, String)> = {
            let mut statement = tx.prepare("SELECT name, env FROM machines ORDER BY position")?;
            let rows = statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<std::result::Result<_, _>>()?
        };
        let mut changed = 0;
        for (name, env) in rows {
            if let Some(sealed) = super::reseal_stored_env(&name, &env, keys)? {
                tx.execute(
                    "UPDATE machines SET env = ?2 WHERE name = ?1",
                    params![name, sealed],
                )?;
                changed += 1;
            }
        }
        tx.commit()?;
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

    /// Creates a token for the account, valid until `expires_at` (for ever when `None`);
    /// returns it as `id.secret`. Only its hash is stored.
    pub fn create_token(
        &mut self,
        account: &Account,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<String> {
        let (id, secret, hash) = new_token();
        self.conn.execute(
            "INSERT INTO tokens (id, account_id, secret_sha256, created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, account.id, hash, now(), token_expiry(expires_at)],
        )?;
        Ok(format!("{id}.{secret}"))
    }

    /// Every token (never its secret), oldest first.
    pub fn tokens(&self) -> Result<Vec<TokenInfo>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT t.id, a.name, t.created_at, t.expires_at FROM tokens t
             JOIN accounts a ON a.id = t.account_id ORDER BY t.created_at, t.id",
        )?;
        let rows = statement.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?;
        let mut tokens = Vec::new();
        for row in rows {
            let (id, account, created_at, expires_at) = row?;
            tokens.push(TokenInfo {
                id,
                account,
                created_at: parse_time(&created_at)?,
                expires_at: expires_at.as_deref().map(parse_time).transpose()?,
            });
        }
        Ok(tokens)
    }

    /// Revokes a token by its id (the part before the `.`): it stops working at once.
    pub fn revoke_token(&mut self, id: &str) -> Result<()> {
        let removed = self
            .conn
            .execute("DELETE FROM tokens WHERE id = ?1", params![id])?;
        if removed == 0 {
            return Err(no_such_token(id));
        }
        Ok(())
    }

    pub fn count_tokens(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM tokens", [], |r| r.get(0))?)
    }

    /// The account a token belongs to.
    pub fn token_record(&self, id: &str) -> Result<Option<TokenRecord>> {
        Ok(self
            .conn
            .query_row(
                "SELECT t.secret_sha256, a.id, a.name, t.expires_at FROM tokens t
                 JOIN accounts a ON a.id = t.account_id WHERE t.id = ?1",
                params![id],
                |r| {
                    Ok(TokenRecord {
                        secret_sha256: r.get(0)?,
                        account: Account {
                            id: r.get(1)?,
                            name: r.get(2)?,
                        },
                        expires_at: r.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    /// The account a token belongs to.
    pub fn authenticate(&self, token: &str) -> Result<Account> {
        let (id, secret) = split_token(token)?;
        let record = self
            .token_record(id)?
            .ok_or_else(|| Error::unauthorized("unknown token"))?;
        record.check(secret)?;
        Ok(record.account)
    }

    // --- machines -------------------------------------------------------------------------

    /// Stores a new machine's row, unless its account already has `limit` machines.
    pub fn insert_machine_within(&mut self, record: &MachineRecord, limit: usize) -> Result<()> {
        let count = self.count_machines(record.account_id)?;
        if count >= limit {
            return Err(too_many_machines(count, limit));
        }
        self.insert_machine(record)
    }

    pub fn insert_machine(&mut self, record: &MachineRecord) -> Result<()> {
        let (tags, env, network) = machine_json(record, self.keys.as_deref())?;
        self.conn.execute(
            "INSERT INTO machines (name, account_id, created_at, tags, memory_mb, image, backend,
             next_seq, durability, snapshot_at, env, expires_at, network, snapshot_sha256,
             history, parent, forked_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            params![
                record.name.as_str(),
                record.account_id,
                stored(record.created_at),
                tags,
                record.memory_mb,
                record.image.as_str(),
                record.backend,
                record.durability.as_str(),
                record.snapshot_at.map(stored),
                env,
                record.expires_at.map(stored),
                network,
                record.snapshot_sha256,
                i64::from(record.history),
                record.parent,
                record.forked_at
            ],
        )
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE =>
            {
                machine_exists(&record.name)
            }
            other => other.into(),
        })?;
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
            unsaved_since: row.get(11)?,
            snapshot_at: row.get(12)?,
            env: row.get(13)?,
            expires_at: row.get(14)?,
            position: row.get(15)?,
            network: row.get(16)?,
            snapshot_sha256: row.get(17)?,
            history: row.get(18)?,
            parent: row.get(19)?,
            forked_at: row.get(20)?,
        })
    }

    pub fn machine(&self, name: &str) -> Result<Option<MachineRecord>> {
        let raw = self
            .conn
            .query_row(
                &format!("SELECT {MACHINE_COLUMNS} FROM machines WHERE name = ?1"),
                params![name],
                Self::machine_from_row,
            )
            .optional()?;
        raw.map(|raw| raw.into_record(self.keys.as_deref()))
            .transpose()
    }

    /// The account's machines, newest first.
    pub fn machines(&self, account_id: i64) -> Result<Vec<MachineRecord>> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {MACHINE_COLUMNS} FROM machines WHERE account_id = ?1 ORDER BY position DESC"
        ))?;
        let rows = statement.query_map(params![account_id], Self::machine_from_row)?;
        let mut machines = Vec::new();
        for row in rows {
            machines.push(row?.into_record(self.keys.as_deref())?);
        }
        Ok(machines)
    }

    /// Every machine's name with its account's name.
    pub fn machine_accounts(&self) -> Result<Vec<(String, String)>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT m.name, a.name FROM machines m JOIN accounts a ON a.id = m.account_id",
        )?;
        let rows = statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Machines whose expiry time has come (`(account id, name)`), at most `limit`.
    pub fn expired_machines(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<(i64, String)>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT account_id, name FROM machines WHERE expires_at IS NOT NULL
             AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2",
        )?;
        let rows = statement.query_map(params![stored(now), limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Notes that the machine may now hold state that is not on disk (unless already noted).
    pub fn mark_unsaved(&mut self, name: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE machines SET unsaved_since = COALESCE(unsaved_since, ?2) WHERE name = ?1",
            params![name, now()],
        )?;
        Ok(())
    }

    /// Notes that the machine's whole state is in its snapshot, written now, and which one is
    /// in the bucket.
    pub fn mark_saved(&mut self, name: &str, sha256: Option<&str>) -> Result<()> {
        self.conn.execute(
            "UPDATE machines SET unsaved_since = NULL, snapshot_at = ?2, snapshot_sha256 = ?3
             WHERE name = ?1",
            params![name, now(), sha256],
        )?;
        Ok(())
    }

    /// Notes a snapshot found on disk for each named machine that has none recorded (machines
    /// from before the store recorded them).
    pub fn note_snapshots_on_disk(&mut self, names: &[String]) -> Result<usize> {
        let tx = self.conn.transaction()?;
        let mut noted = 0;
        {
            let mut update = tx.prepare_cached(
                "UPDATE machines SET snapshot_at = ?2 WHERE name = ?1 AND snapshot_at IS NULL",
            )?;
            let at = now();
            for name in names {
                noted += update.execute(params![name, at])?;
            }
        }
        tx.commit()?;
        Ok(noted)
    }

    /// How many machines the account has.
    pub fn count_machines(&self, account_id: i64) -> Result<usize> {
        let count: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM machines WHERE account_id = ?1",
            params![account_id],
            |r| r.get(0),
        )?;
        Ok(count as usize)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    // What every store must do is in `store/suite.rs`; this is what only SQLite shows.
    #[test]
    fn the_secret_itself_is_never_stored() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("db")).unwrap();
        let account = store.ensure_account("alice").unwrap();
        let token = store.create_token(&account, None).unwrap();
        assert_eq!(store.authenticate(&token).unwrap(), account);
        let stored: String = store
            .conn
            .query_row("SELECT secret_sha256 FROM tokens", [], |r| r.get(0))
            .unwrap();
        assert!(!token.contains(&stored), "the secret itself is not stored");
    }
}
