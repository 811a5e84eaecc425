//! Nodes and leases in the PostgreSQL store: every node of a cluster shares these rows. Taking
//! a lease is one conditional `UPDATE`, so of nodes racing for a machine exactly one gets it;
//! the epoch it returns fences every later write of that node for the machine.

use tokio_postgres::types::ToSql;

use super::{PostgresStore, column, failed};
use crate::error::{Error, Result};
use crate::store::{
    Lease, LeaseOutcome, NodeRecord, after, lease_lost, node_gone, now, parse_time,
};

/// A lease from its columns: owner, epoch, until.
fn to_lease(machine: &str, row: &tokio_postgres::Row) -> Result<Lease> {
    Ok(Lease {
        machine: machine.to_owned(),
        owner: column(row, 0)?,
        epoch: column(row, 1)?,
        until: parse_time(&column::<String>(row, 2)?)?,
    })
}

impl PostgresStore {
    pub(super) async fn register_node_row(&self, id: &str, address: &str) -> Result<()> {
        self.execute(
            "INSERT INTO nodes (id, address, started_at, heartbeat_at) VALUES ($1, $2, $3, $3)
             ON CONFLICT (id) DO UPDATE SET address = $2, started_at = $3, heartbeat_at = $3",
            &[&id, &address, &now()],
        )
        .await?;
        Ok(())
    }

    pub(super) async fn heartbeat_rows(&self, id: &str, ttl: std::time::Duration) -> Result<usize> {
        let until = after(ttl)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let alive = tx
            .execute(
                "UPDATE nodes SET heartbeat_at = $2 WHERE id = $1",
                &[&id, &now()],
            )
            .await
            .map_err(failed)?;
        if alive == 0 {
            return Err(node_gone(id));
        }
        let renewed = tx
            .execute(
                "UPDATE machines SET lease_until = $2 WHERE owner = $1",
                &[&id, &until],
            )
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        Ok(usize::try_from(renewed).unwrap_or(usize::MAX))
    }

    pub(super) async fn node_rows(&self) -> Result<Vec<NodeRecord>> {
        self.query(
            "SELECT id, address, started_at, heartbeat_at FROM nodes ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(NodeRecord {
                id: column(row, 0)?,
                address: column(row, 1)?,
                started_at: parse_time(&column::<String>(row, 2)?)?,
                heartbeat_at: parse_time(&column::<String>(row, 3)?)?,
            })
        })
        .collect()
    }

    pub(super) async fn remove_node_row(&self, id: &str) -> Result<usize> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let released = tx
            .execute(
                "UPDATE machines SET owner = NULL, lease_until = NULL WHERE owner = $1",
                &[&id],
            )
            .await
            .map_err(failed)?;
        tx.execute("DELETE FROM nodes WHERE id = $1", &[&id])
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        Ok(usize::try_from(released).unwrap_or(usize::MAX))
    }

    pub(super) async fn take_lease_row(
        &self,
        machine: &str,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseOutcome> {
        let until = after(ttl)?;
        let params: [&(dyn ToSql + Sync); 4] = [&machine, &node, &until, &now()];
        let taken = self
            .query_opt(
                "UPDATE machines SET
                     owner_epoch = CASE WHEN owner IS NOT DISTINCT FROM $2 THEN owner_epoch
                                        ELSE owner_epoch + 1 END,
                     owner = $2, lease_until = $3
                 WHERE name = $1 AND (owner IS NULL OR owner = $2 OR lease_until < $4)
                 RETURNING owner, owner_epoch, lease_until",
                &params,
            )
            .await?;
        if let Some(row) = taken {
            return Ok(LeaseOutcome::Taken(to_lease(machine, &row)?));
        }
        match self.lease_row(machine).await? {
            Some(held) => Ok(LeaseOutcome::Held(held)),
            None => Err(Error::machine_not_found(machine)),
        }
    }

    pub(super) async fn release_lease_row(&self, lease: &Lease) -> Result<bool> {
        let released = self
            .execute(
                "UPDATE machines SET owner = NULL, lease_until = NULL
                 WHERE name = $1 AND owner = $2 AND owner_epoch = $3",
                &[&lease.machine, &lease.owner, &lease.epoch],
            )
            .await?;
        Ok(released > 0)
    }

    pub(super) async fn lease_row(&self, machine: &str) -> Result<Option<Lease>> {
        self.query_opt(
            "SELECT owner, owner_epoch, lease_until FROM machines
             WHERE name = $1 AND owner IS NOT NULL AND lease_until IS NOT NULL",
            &[&machine],
        )
        .await?
        .map(|row| to_lease(machine, &row))
        .transpose()
    }

    pub(super) async fn mark_saved_fenced_row(
        &self,
        lease: &Lease,
        sha256: Option<&str>,
    ) -> Result<()> {
        let saved = self
            .execute(
                "UPDATE machines SET unsaved_since = NULL, snapshot_at = $4, snapshot_sha256 = $5
                 WHERE name = $1 AND owner = $2 AND owner_epoch = $3",
                &[&lease.machine, &lease.owner, &lease.epoch, &now(), &sha256],
            )
            .await?;
        if saved == 0 {
            return Err(lease_lost(lease));
        }
        Ok(())
    }
}
