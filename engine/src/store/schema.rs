//! The one schema both databases are made from: tables written once, with a few words that each
//! database spells its own way ([`Dialect`]), and the migrations past version 6 in the same
//! form. SQLite homes from before version 6 are upgraded by steps of their own
//! (`sqlite/upgrade.rs`); PostgreSQL stores began at version 6.
//!
//! Version 4 gave every row that belongs to a machine a foreign key with `ON DELETE CASCADE`, so
//! that no instruction, output or checkpoint outlives its machine (a delete racing an insert
//! can no longer leave orphans: the insert fails instead). Version 5 gave machines their
//! environment (`env`, JSON) and an expiry time (`expires_at`). Version 6 gave them a network
//! policy (`network`, JSON). Version 7 made nodes share a database: a table of `nodes`, and on
//! every machine the lease of the node that runs it (`owner`, `owner_epoch`, `lease_until`).
//! Version 8 recorded which snapshot in the bucket (`--snapshots s3://...`) is a machine's
//! (`machines.snapshot_sha256`) and a checkpoint's (`checkpoints.sha256`): the pointer a node
//! restores from, moved only once the snapshot is whole in the bucket. Version 9 gave machines
//! a history (`history`: how many undo points they keep) and a lineage (`parent`, the machine a
//! fork was made from, and `forked_at`, the instruction of the parent's it was made after).
//! Version 10 gave the store an audit log (`audit`): who changed what, when, and how it went.

/// The schema version this engine writes.
pub(super) const VERSION: i64 = 10;

/// Changes after version 6: `(the version it makes, statements)`, applied in order to both
/// databases, in the template's words. A new database is made from the tables below, which are
/// always the latest version's.
pub(super) const MIGRATIONS: &[(i64, &str)] =
    &[(7, LEASES_7), (8, BUCKET_8), (9, HISTORY_9), (10, AUDIT_10)];

/// Version 7: nodes, and machines' leases.
const LEASES_7: &str = "
ALTER TABLE machines ADD COLUMN owner TEXT;
ALTER TABLE machines ADD COLUMN owner_epoch {int} NOT NULL DEFAULT 0;
ALTER TABLE machines ADD COLUMN lease_until TEXT;
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    started_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL
);
";

/// Version 8: which snapshot in the bucket is a machine's and a checkpoint's.
const BUCKET_8: &str = "
ALTER TABLE machines ADD COLUMN snapshot_sha256 TEXT;
ALTER TABLE checkpoints ADD COLUMN sha256 TEXT;
";

/// Version 9: undo points kept per machine, and where a fork came from.
const HISTORY_9: &str = "
ALTER TABLE machines ADD COLUMN history {int} NOT NULL DEFAULT 0;
ALTER TABLE machines ADD COLUMN parent TEXT;
ALTER TABLE machines ADD COLUMN forked_at {int};
";

/// Version 10: the audit log. Its rows belong to no machine (they outlive the machines they
/// name) and are removed by age and count only ([`super::audit`]).
const AUDIT_10: &str = "
CREATE TABLE IF NOT EXISTS audit (
    id {serial},
    at TEXT NOT NULL,
    node TEXT,
    door TEXT NOT NULL,
    account TEXT,
    token_id TEXT,
    action TEXT NOT NULL,
    machine TEXT,
    outcome TEXT NOT NULL,
    detail TEXT
);
";

/// The database a statement is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    Sqlite,
    Postgres,
}

/// Tables that do not belong to a machine, and machines.
const BASE: &str = r#"
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS accounts (
    id {id},
    name TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    account_id {int} NOT NULL REFERENCES accounts(id),
    secret_sha256 TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT
);
-- A machine's last three columns are the lease of the node that runs it: the node, the lease's
-- number (one more at every change of owner: a write that carries an older one is refused) and
-- until when it holds. The last is the checksum of its snapshot in the bucket, when snapshots are
-- kept in one. Then how many undo points it keeps, and the machine it was forked from and after
-- which of that machine's instructions. (SQLite keeps a table's text: comments stay outside it.)
CREATE TABLE IF NOT EXISTS machines (
    position {serial},
    name TEXT NOT NULL UNIQUE,
    account_id {int} NOT NULL REFERENCES accounts(id),
    created_at TEXT NOT NULL,
    tags TEXT NOT NULL,
    memory_mb {int} NOT NULL,
    image TEXT NOT NULL DEFAULT 'minimal',
    backend TEXT NOT NULL,
    next_seq {int} NOT NULL DEFAULT 0,
    last_used_at TEXT,
    last_error TEXT,
    durability TEXT NOT NULL DEFAULT 'idle',
    unsaved_since TEXT,
    snapshot_at TEXT,
    env TEXT NOT NULL DEFAULT '{}',
    expires_at TEXT,
    network TEXT NOT NULL DEFAULT '{"mode":"none"}',
    owner TEXT,
    owner_epoch {int} NOT NULL DEFAULT 0,
    lease_until TEXT,
    snapshot_sha256 TEXT,
    history {int} NOT NULL DEFAULT 0,
    parent TEXT,
    forked_at {int}
);
-- The evervm servers sharing this database: where the others reach each one, and when it last
-- said it was alive.
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    started_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL
);
"#;

/// The tables of a machine's history (since version 4; checkpoints' `sha256` since version 8).
const MACHINE_ROWS: &str = r"
CREATE TABLE IF NOT EXISTS instructions (
    machine TEXT NOT NULL REFERENCES machines(name) ON DELETE CASCADE,
    seq {int} NOT NULL,
    code TEXT NOT NULL,
    timeout_ms {int} NOT NULL,
    created_at TEXT NOT NULL,
    result TEXT,
    finished_at TEXT,
    rolled_back_to TEXT,
    PRIMARY KEY (machine, seq)
);
-- Named, kept snapshots of a machine (sha256: its snapshot in the bucket, when there is one).
CREATE TABLE IF NOT EXISTS checkpoints (
    machine TEXT NOT NULL REFERENCES machines(name) ON DELETE CASCADE,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    instruction_count {int} NOT NULL,
    sha256 TEXT,
    PRIMARY KEY (machine, name)
);
-- Output is stored in batches of consecutive chunks whose seqs start at first_seq (a blob of
-- stream byte, 4-byte length and text per chunk; SQLite stores from before that hold a JSON
-- array of [stream, data] pairs): one row per line would make large outputs slow to store.
CREATE TABLE IF NOT EXISTS outputs (
    machine TEXT NOT NULL,
    instruction {int} NOT NULL,
    first_seq {int} NOT NULL,
    chunks {bytes} NOT NULL,
    PRIMARY KEY (machine, instruction, first_seq),
    FOREIGN KEY (machine, instruction) REFERENCES instructions(machine, seq) ON DELETE CASCADE
);
";

/// Indexes on columns of the latest version.
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS machines_by_expiry ON machines(expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS machines_by_owner ON machines(owner) WHERE owner IS NOT NULL;
CREATE INDEX IF NOT EXISTS audit_by_time ON audit(at);
CREATE INDEX IF NOT EXISTS audit_by_account ON audit(account, id);
CREATE INDEX IF NOT EXISTS audit_by_machine ON audit(machine, id) WHERE machine IS NOT NULL;
";

/// `template` in `dialect`'s words.
pub(super) fn render(template: &str, dialect: Dialect) -> String {
    let words: [(&str, &str); 4] = match dialect {
        Dialect::Sqlite => [
            ("{id}", "INTEGER PRIMARY KEY"),
            ("{serial}", "INTEGER PRIMARY KEY AUTOINCREMENT"),
            ("{int}", "INTEGER"),
            // SQLite keeps what it is given: the column holds blobs (and old JSON text).
            ("{bytes}", "TEXT"),
        ],
        Dialect::Postgres => [
            (
                "{id}",
                "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            ),
            (
                "{serial}",
                "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            ),
            ("{int}", "BIGINT"),
            ("{bytes}", "BYTEA"),
        ],
    };
    words
        .iter()
        .fold(template.to_owned(), |text, (word, spelled)| {
            text.replace(word, spelled)
        })
}

/// The tables of accounts, tokens and machines.
pub(super) fn base(dialect: Dialect) -> String {
    render(BASE, dialect)
}

/// The tables of machines' history.
pub(super) fn machine_rows(dialect: Dialect) -> String {
    render(MACHINE_ROWS, dialect)
}

/// The audit log's table (a new database's; older ones get it from migration 10).
pub(super) fn audit(dialect: Dialect) -> String {
    render(AUDIT_10, dialect)
}

/// The indexes of the latest version.
pub(super) fn indexes(dialect: Dialect) -> String {
    render(INDEXES, dialect)
}

/// The migrations from `version` to [`VERSION`], rendered.
pub(super) fn migrations_after(version: i64, dialect: Dialect) -> Vec<(i64, String)> {
    MIGRATIONS
        .iter()
        .filter(|(to, _)| *to > version)
        .map(|(to, statements)| (*to, render(statements, dialect)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_spelled_in_both_dialects() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            for text in [
                base(dialect),
                machine_rows(dialect),
                audit(dialect),
                indexes(dialect),
            ] {
                for word in ["{id}", "{serial}", "{int}", "{bytes}"] {
                    assert!(!text.contains(word), "{word} left in {dialect:?}");
                }
            }
        }
        assert!(base(Dialect::Postgres).contains("BIGINT GENERATED BY DEFAULT AS IDENTITY"));
        // JSON defaults are left alone.
        assert!(base(Dialect::Sqlite).contains(r#"DEFAULT '{"mode":"none"}'"#));
        // Migrations go up one version at a time, from 7 to this engine's.
        for (i, (to, _)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*to, 7 + i as i64);
        }
        assert_eq!(MIGRATIONS.last().map_or(6, |(to, _)| *to), VERSION);
    }
}
