//! The database's schema and the migrations from every earlier version.
//!
//! Version 4 gave every row that belongs to a machine a foreign key with `ON DELETE CASCADE`, so
//! that no instruction, output or checkpoint outlives its machine (a delete racing an insert
//! can no longer leave orphans: the insert fails instead). Version 5 gave machines their
//! environment (`env`, JSON) and an expiry time (`expires_at`). Version 6 gave them a network
//! policy (`network`, JSON).

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result};

pub(super) const VERSION: i64 = 6;

/// Tables that do not depend on a machine: created as they are in every version.
const BASE: &str = r#"
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
    created_at TEXT NOT NULL,
    expires_at TEXT
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
    durability TEXT NOT NULL DEFAULT 'idle',
    unsaved_since TEXT,
    snapshot_at TEXT,
    env TEXT NOT NULL DEFAULT '{}',
    expires_at TEXT,
    network TEXT NOT NULL DEFAULT '{"mode":"none"}'
);
"#;

/// The tables of a machine's history, as of version 4.
const MACHINE_ROWS: &str = r"
CREATE TABLE IF NOT EXISTS instructions (
    machine TEXT NOT NULL REFERENCES machines(name) ON DELETE CASCADE,
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
    machine TEXT NOT NULL REFERENCES machines(name) ON DELETE CASCADE,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    instruction_count INTEGER NOT NULL,
    PRIMARY KEY (machine, name)
);
-- Output is stored in batches of consecutive chunks whose seqs start at first_seq (a blob of
-- stream byte, 4-byte length and text per chunk; stores before that hold a JSON array of
-- [stream, data] pairs): one row per line would make large outputs slow to store.
CREATE TABLE IF NOT EXISTS outputs (
    machine TEXT NOT NULL,
    instruction INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    chunks TEXT NOT NULL,
    PRIMARY KEY (machine, instruction, first_seq),
    FOREIGN KEY (machine, instruction) REFERENCES instructions(machine, seq) ON DELETE CASCADE
);
";

/// Creates the schema on a new database and brings an older one up to [`VERSION`].
pub(super) fn prepare(conn: &mut Connection, path: &std::path::Path) -> Result<()> {
    conn.execute_batch(BASE)?;
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let version = match version {
        None => {
            conn.execute_batch(MACHINE_ROWS)?;
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                params![VERSION.to_string()],
            )?;
            return indexes(conn);
        }
        Some(v) => v.parse::<i64>().unwrap_or(-1),
    };
    if version == VERSION {
        return indexes(conn);
    }
    if !(1..VERSION).contains(&version) {
        return Err(Error::internal(format!(
            "{} has schema version {version}, this engine knows version {VERSION}: use the \
             evervm release that wrote it",
            path.display()
        )));
    }
    migrate(conn, version).map_err(|e| {
        e.context(format!(
            "upgrading {} from schema {version}",
            path.display()
        ))
    })?;
    indexes(conn)
}

/// Indexes on columns of the latest version (made after any upgrade has added them).
fn indexes(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS machines_by_expiry ON machines(expires_at)
         WHERE expires_at IS NOT NULL;",
    )?;
    Ok(())
}

/// One transaction from `from` to [`VERSION`]; nothing changes if any step fails.
fn migrate(conn: &mut Connection, from: i64) -> Result<()> {
    // Tables are rebuilt below: foreign keys are checked once at the end instead.
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let migrated = (|| -> Result<()> {
        let tx = conn.transaction()?;
        if from < 2 {
            tx.execute_batch(
                "ALTER TABLE machines ADD COLUMN image TEXT NOT NULL DEFAULT 'minimal';",
            )?;
        }
        if from < 3 {
            // The checkpoints table came with version 3; instructions got their rollback mark.
            tx.execute_batch(
                "ALTER TABLE machines ADD COLUMN durability TEXT NOT NULL DEFAULT 'idle';
                 ALTER TABLE instructions ADD COLUMN rolled_back_to TEXT;
                 CREATE TABLE IF NOT EXISTS checkpoints (
                     machine TEXT NOT NULL, name TEXT NOT NULL, created_at TEXT NOT NULL,
                     instruction_count INTEGER NOT NULL, PRIMARY KEY (machine, name));",
            )?;
        }
        if from < 4 {
            to_version_4(&tx)?;
        }
        if from < 5 {
            // Version 5: machines have an environment and may expire.
            tx.execute_batch(
                "ALTER TABLE machines ADD COLUMN env TEXT NOT NULL DEFAULT '{}';
                 ALTER TABLE machines ADD COLUMN expires_at TEXT;",
            )?;
        }
        // Version 6: machines have a network policy (every earlier machine had none).
        tx.execute_batch(
            "ALTER TABLE machines ADD COLUMN network TEXT NOT NULL DEFAULT '{\"mode\":\"none\"}';",
        )?;
        tx.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'schema_version'",
            params![VERSION.to_string()],
        )?;
        let violations: i64 =
            tx.query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
                r.get(0)
            })?;
        if violations > 0 {
            return Err(Error::internal(format!(
                "{violations} rows break a foreign key after the upgrade"
            )));
        }
        tx.commit()?;
        Ok(())
    })();
    conn.pragma_update(None, "foreign_keys", "ON")?;
    migrated
}

/// Version 4: tokens may expire; machines say whether they may hold unsaved state and when their
/// snapshot was written (the engine fills that in for existing snapshots when it opens); the
/// machine's rows get foreign keys; rows whose machine is gone (left by a delete that raced an
/// insert) are dropped on the way.
fn to_version_4(tx: &rusqlite::Transaction<'_>) -> Result<()> {
    {
        tx.execute_batch(
            "ALTER TABLE tokens ADD COLUMN expires_at TEXT;
             ALTER TABLE machines ADD COLUMN unsaved_since TEXT;
             ALTER TABLE machines ADD COLUMN snapshot_at TEXT;",
        )?;
        tx.execute_batch(
            "ALTER TABLE instructions RENAME TO old_instructions;
             ALTER TABLE checkpoints RENAME TO old_checkpoints;
             ALTER TABLE outputs RENAME TO old_outputs;",
        )?;
        tx.execute_batch(MACHINE_ROWS)?;
        tx.execute_batch(
            "INSERT INTO instructions (machine, seq, code, timeout_ms, created_at, result,
                 finished_at, rolled_back_to)
             SELECT machine, seq, code, timeout_ms, created_at, result, finished_at,
                 rolled_back_to
             FROM old_instructions WHERE machine IN (SELECT name FROM machines);
             INSERT INTO checkpoints (machine, name, created_at, instruction_count)
             SELECT machine, name, created_at, instruction_count
             FROM old_checkpoints WHERE machine IN (SELECT name FROM machines);
             INSERT INTO outputs (machine, instruction, first_seq, chunks)
             SELECT o.machine, o.instruction, o.first_seq, o.chunks FROM old_outputs o
             WHERE EXISTS (SELECT 1 FROM instructions i
                           WHERE i.machine = o.machine AND i.seq = o.instruction);
             DROP TABLE old_instructions;
             DROP TABLE old_checkpoints;
             DROP TABLE old_outputs;",
        )?;
    }
    Ok(())
}
