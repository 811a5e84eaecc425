//! Nodes and leases in the SQLite store. One server uses a SQLite home, so its leases are the
//! one node's; they follow the same rules as PostgreSQL's, and pass the same tests.

use rusqlite::{OptionalExtension, params};

use super::Store;
use crate::error::{Error, Result};
use crate::store::{
    Lease, LeaseOutcome, NodeRecord, after, lease_lost, node_gone, now, parse_time,
};

/// A lease's columns: owner, epoch, until.
fn lease_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, i64, String)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
}

fn to_lease(machine: &str, (owner, epoch, until): (String, i64, String)) -> Result<Lease> {
    Ok(Lease {
        machine: machine.to_owned(),
        owner,
        epoch,
        until: parse_time(&until)?,
    })
}

impl Store {
    pub fn register_node(&mut self, id: &str, address: &str) -> Result<()> {
        let at = now();
        self.conn.execute(
            "INSERT INTO nodes (id, address, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT (id) DO UPDATE SET address = ?2, started_at = ?3, heartbeat_at = ?3",
            params![id, address, at],
        )?;
        Ok(())
    }

    pub fn heartbeat(&mut self, id: &str, ttl: std::time::Duration) -> Result<usize> {
        let until = after(ttl)?;
        let tx = self.conn.transaction()?;
        let alive = tx.execute(
            "UPDATE nodes SET heartbeat_at = ?2 WHERE id = ?1",
            params![id, now()],
        )?;
        if alive == 0 {
            return Err(node_gone(id));
        }
        let renewed = tx.execute(
            "UPDATE machines SET lease_until = ?2 WHERE owner = ?1",
            params![id, until],
        )?;
        tx.commit()?;
        Ok(renewed)
    }

    pub fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let mut statement = self
            .conn
            .prepare("SELECT id, address, started_at, heartbeat_at FROM nodes ORDER BY id")?;
        let rows = statement.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, String>(3)?,
            ))
        })?;
        rows.map(|row| {
            let (id, address, started_at, heartbeat_at) = row?;
            Ok(NodeRecord {
                id,
                address,
                started_at: parse_time(&started_at)?,
                heartbeat_at: parse_time(&heartbeat_at)?,
            })
        })
        .collect()
    }

    pub fn remove_node(&mut self, id: &str) -> Result<usize> {
        let tx = self.conn.transaction()?;
        let released = tx.execute(
            "UPDATE machines SET owner = NULL, lease_until = NULL WHERE owner = ?1",
            params![id],
        )?;
        tx.execute("DELETE FROM nodes WHERE id = ?1", params![id])?;
        tx.commit()?;
        Ok(released)
    }

    pub fn take_lease(
        &mut self,
        machine: &str,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseOutcome> {
        let until = after(ttl)?;
        let taken = self
            .conn
            .query_row(
                "UPDATE machines SET
                     owner_epoch = CASE WHEN owner IS ?2 THEN owner_epoch
                                        ELSE owner_epoch + 1 END,
                     owner = ?2, lease_until = ?3
                 WHERE name = ?1 AND (owner IS NULL OR owner = ?2 OR lease_until < ?4)
                 RETURNING owner, owner_epoch, lease_until",
                params![machine, node, until, now()],
                lease_row,
            )
            .optional()?;
        if let Some(taken) = taken {
            return Ok(LeaseOutcome::Taken(to_lease(machine, taken)?));
        }
        match self.lease(machine)? {
            Some(held) => Ok(LeaseOutcome::Held(held)),
            None => Err(Error::machine_not_found(machine)),
        }
    }

    pub fn release_lease(&mut self, lease: &Lease) -> Result<bool> {
        let released = self.conn.execute(
            "UPDATE machines SET owner = NULL, lease_until = NULL
             WHERE name = ?1 AND owner = ?2 AND owner_epoch = ?3",
            params![lease.machine, lease.owner, lease.epoch],
        )?;
        Ok(released > 0)
    }

    pub fn lease(&self, machine: &str) -> Result<Option<Lease>> {
        self.conn
            .query_row(
                "SELECT owner, owner_epoch, lease_until FROM machines
                 WHERE name = ?1 AND owner IS NOT NULL AND lease_until IS NOT NULL",
                params![machine],
                lease_row,
            )
            .optional()?
            .map(|row| to_lease(machine, row))
            .transpose()
    }

    pub fn mark_saved_fenced(&mut self, lease: &Lease, sha256: Option<&str>) -> Result<()> {
        let saved = self.conn.execute(
            "UPDATE machines SET unsaved_since = NULL, snapshot_at = ?4, snapshot_sha256 = ?5
             WHERE name = ?1 AND owner = ?2 AND owner_epoch = ?3",
            params![lease.machine, lease.owner, lease.epoch, now(), sha256],
        )?;
        if saved == 0 {
            return Err(lease_lost(lease));
        }
        Ok(())
    }
}
