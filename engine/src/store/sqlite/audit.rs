//! The audit log in the SQLite store.

use chrono::{DateTime, Utc};
use rusqlite::params;

use super::Store;
use crate::error::Result;
use crate::store::audit::{self, AuditEntry, AuditQuery, Parameter};
use crate::store::schema::Dialect;
use crate::store::stored;

impl Store {
    /// Stores entries in one transaction.
    pub fn record_audit(&mut self, entries: &[AuditEntry]) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(&audit::insert(Dialect::Sqlite))?;
            for e in entries {
                insert.execute(params![
                    stored(e.at),
                    e.node,
                    e.door,
                    e.account,
                    e.token_id,
                    e.action,
                    e.machine,
                    e.outcome,
                    e.detail
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The entries `query` asks for, newest first.
    pub fn audit_entries(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        let (sql, parameters) = audit::select(query, Dialect::Sqlite);
        let values: Vec<rusqlite::types::Value> = parameters
            .into_iter()
            .map(|p| match p {
                Parameter::Text(text) => rusqlite::types::Value::Text(text),
                Parameter::Int(n) => rusqlite::types::Value::Integer(n),
            })
            .collect();
        let mut statement = self.conn.prepare(&sql)?;
        let rows = statement.query_map(rusqlite::params_from_iter(values), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            ))
        })?;
        let mut entries = Vec::new();
        for row in rows {
            let (id, at, node, door, account, token_id, action, machine, outcome, detail) = row?;
            entries.push(audit::entry(
                id, &at, node, door, account, token_id, action, machine, outcome, detail,
            )?);
        }
        Ok(entries)
    }

    /// Removes up to a batch of entries older than `before` or beyond the newest `keep`.
    pub fn prune_audit(&mut self, before: DateTime<Utc>, keep: u64) -> Result<usize> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        Ok(self.conn.execute(
            &audit::prune(Dialect::Sqlite),
            params![stored(before), keep],
        )?)
    }
}
