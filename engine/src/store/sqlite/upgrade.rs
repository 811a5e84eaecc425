//! A SQLite home's schema: made from the shared one ([`crate::store::schema`]), and upgraded
//! from every version before 6 by steps only SQLite homes need.

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result};
use crate::store::schema::{self, Dialect, VERSION};

/// The version the SQLite-only steps end at; the shared migrations go on from there.
const LEGACY_END: i64 = 6;

/// Creates the schema on a new database and brings an older one up to [`VERSION`].
pub(super) fn prepare(conn: &mut Connection, path: &std::path::Path) -> Result<()> {
    conn.execute_batch(&schema::base(Dialect::Sqlite))?;
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let version = match version {
        None => {
            conn.execute_batch(&schema::machine_rows(Dialect::Sqlite))?;
            conn.execute_batch(&schema::audit(Dialect::Sqlite))?;
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
    conn.execute_batch(&schema::indexes(Dialect::Sqlite))?;
    Ok(())
}

/// One transaction from `from` to [`VERSION`] (the SQLite-only steps up to version 6, then the
/// shared migrations); nothing changes if any step fails.
fn migrate(conn: &mut Connection, from: i64) -> Result<()> {
    // Tables are rebuilt below: foreign keys are checked once at the end instead.
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let migrated = (|| -> Result<()> {
        let tx = conn.transaction()?;
        if from < LEGACY_END {
            legacy_steps(&tx, from)?;
        }
        for (_, statements) in schema::migrations_after(from.max(LEGACY_END), Dialect::Sqlite) {
            tx.execute_batch(&statements)?;
        }
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

/// From `from` (1 to 5) to version 6.
fn legacy_steps(tx: &rusqlite::Transaction<'_>, from: i64) -> Result<()> {
    {
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
            to_version_4(tx)?;
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
    }
    Ok(())
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
        // The history tables as version 4 made them (unchanged since; a later version that
        // changes them keeps a copy of these here).
        tx.execute_batch(&schema::machine_rows(Dialect::Sqlite))?;
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
