//! Metadata store: accounts, tokens (hashed), machines, instructions, results and output, in one
//! SQLite database (`evervm.db`, WAL) under the engine's home.

use std::path::Path;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::guest::image::Profile;
use crate::network::NetworkPolicy;
use crate::types::{Account, Durability, Env, MachineName, Tags, TokenInfo};

mod history;
mod schema;
mod thread;

pub(crate) use history::OutputBatches;
pub(crate) use thread::{Pending, StoreThread};

/// How long a statement waits for another process's lock on the database before it fails.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

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
    /// Set while the machine may hold state that is not on disk (it ran an instruction since
    /// its last save): a machine found with it after a restart lost that state, and says so.
    pub unsaved_since: Option<DateTime<Utc>>,
    /// When its snapshot was last written (`None`: it never had one). A machine that had one
    /// and finds none on disk is damaged, not silently fresh.
    pub snapshot_at: Option<DateTime<Utc>>,
    /// Environment variables its interpreter starts with (secrets included).
    pub env: Env,
    /// When it is deleted (`None`: never).
    pub expires_at: Option<DateTime<Utc>>,
    /// What it may reach over the network.
    pub network: NetworkPolicy,
    /// Its place in the order machines were created (set by the store; 0 before it is stored).
    pub position: i64,
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

/// A time as the database keeps it.
fn stored(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn now() -> String {
    stored(Utc::now())
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
        schema::prepare(&mut conn, path)?;
        owner_only(path);
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

    /// Creates a token for the account, valid until `expires_at` (for ever when `None`);
    /// returns it as `id.secret`. Only its hash is stored.
    pub fn create_token(
        &mut self,
        account: &Account,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<String> {
        let id = random_alnum(12);
        let secret = random_alnum(40);
        self.conn.execute(
            "INSERT INTO tokens (id, account_id, secret_sha256, created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                id,
                account.id,
                hash_secret(&secret),
                now(),
                expires_at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            ],
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
            return Err(Error::new(
                crate::ErrorKind::NotFound,
                format!("no token with the id {id:?} (`evervm token list` shows them)"),
            ));
        }
        Ok(())
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
        let row: Option<(String, i64, String, Option<String>)> = self
            .conn
            .query_row(
                "SELECT t.secret_sha256, a.id, a.name, t.expires_at FROM tokens t
                 JOIN accounts a ON a.id = t.account_id WHERE t.id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let Some((stored_hash, account_id, name, expires_at)) = row else {
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
        if let Some(expires_at) = expires_at.as_deref().map(parse_time).transpose()?
            && expires_at <= Utc::now()
        {
            return Err(Error::unauthorized(format!(
                "the token expired at {}: create a new one (`evervm token create`)",
                expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )));
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
        let env = serde_json::to_string(&record.env)
            .map_err(|e| Error::internal(format!("cannot encode the environment: {e}")))?;
        let network = serde_json::to_string(&record.network)
            .map_err(|e| Error::internal(format!("cannot encode the network policy: {e}")))?;
        self.conn.execute(
            "INSERT INTO machines (name, account_id, created_at, tags, memory_mb, image, backend,
             next_seq, durability, snapshot_at, env, expires_at, network)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?8, ?9, ?10, ?11, ?12)",
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
                network
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
            unsaved_since: row.get(11)?,
            snapshot_at: row.get(12)?,
            env: row.get(13)?,
            expires_at: row.get(14)?,
            position: row.get(15)?,
            network: row.get(16)?,
        })
    }

    const MACHINE_COLUMNS: &'static str = "name, account_id, created_at, tags, memory_mb, \
        backend, next_seq, last_used_at, last_error, image, durability, unsaved_since, \
        snapshot_at, env, expires_at, position, network";

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

    /// Notes that the machine's whole state is in its snapshot, written now.
    pub fn mark_saved(&mut self, name: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE machines SET unsaved_since = NULL, snapshot_at = ?2 WHERE name = ?1",
            params![name, now()],
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
    unsaved_since: Option<String>,
    snapshot_at: Option<String>,
    env: String,
    expires_at: Option<String>,
    position: i64,
    network: String,
}

impl RawMachine {
    fn into_record(self) -> Result<MachineRecord> {
        let tags: Tags = serde_json::from_str(&self.tags).map_err(|e| {
            Error::internal(format!("stored tags of {} are unreadable: {e}", self.name))
        })?;
        // The error names no part of the text: it may hold secrets.
        let env: Env = serde_json::from_str(&self.env).map_err(|_| {
            Error::internal(format!(
                "the stored environment of {} is unreadable",
                self.name
            ))
        })?;
        let network: NetworkPolicy = serde_json::from_str(&self.network).map_err(|e| {
            Error::internal(format!(
                "the stored network policy of {} is unreadable: {e}",
                self.name
            ))
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
            unsaved_since: self.unsaved_since.as_deref().map(parse_time).transpose()?,
            snapshot_at: self.snapshot_at.as_deref().map(parse_time).transpose()?,
            env,
            expires_at: self.expires_at.as_deref().map(parse_time).transpose()?,
            position: self.position,
            network,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ExecResult, FailureCause, OutputChunk, OutputStream};

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
                    unsaved_since: None,
                    snapshot_at: None,
                    env: Env::new(),
                    expires_at: None,
                    position: 0,
                    network: NetworkPolicy::None,
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
        let token = store.create_token(&account, None).unwrap();
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
    fn tokens_expire_and_revoked_tokens_stop_working() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("db")).unwrap();
        let account = store.ensure_account("alice").unwrap();
        let lasting = store.create_token(&account, None).unwrap();
        let soon = Utc::now() + chrono::Duration::milliseconds(1500);
        let expiring = store.create_token(&account, Some(soon)).unwrap();
        assert_eq!(store.authenticate(&expiring).unwrap(), account);
        let listed = store.tokens().unwrap();
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|t| t.account == "alice"));
        assert!(listed.iter().any(|t| t.expires_at.is_some()));
        // Expiry is wall-clock time: there is no event to wait for.
        std::thread::sleep(std::time::Duration::from_millis(1600));
        let expired = store.authenticate(&expiring).unwrap_err();
        assert!(expired.message().contains("expired"), "{expired}");
        let (id, _) = lasting.split_once('.').unwrap();
        store.revoke_token(id).unwrap();
        assert!(store.authenticate(&lasting).is_err());
        let gone = store.revoke_token(id).unwrap_err();
        assert_eq!(gone.kind(), crate::ErrorKind::NotFound);
        assert_eq!(store.tokens().unwrap().len(), 1);
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
            .finish_instruction("m", seq, &OutputBatches::encode(&output).unwrap(), &result)
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
