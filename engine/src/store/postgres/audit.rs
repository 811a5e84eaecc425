//! The audit log in the PostgreSQL store.

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;

use super::{PostgresStore, column, failed};
use crate::error::Result;
use crate::store::audit::{self, AuditEntry, AuditQuery, Parameter};
use crate::store::schema::Dialect;
use crate::store::stored;

impl PostgresStore {
    pub(super) async fn record_audit_rows(&self, entries: &[AuditEntry]) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let insert = tx
            .prepare_cached(&audit::insert(Dialect::Postgres))
            .await
            .map_err(failed)?;
        for e in entries {
            tx.execute(
                &insert,
                &[
                    &stored(e.at),
                    &e.node,
                    &e.door,
                    &e.account,
                    &e.token_id,
                    &e.action,
                    &e.machine,
                    &e.outcome,
                    &e.detail,
                ],
            )
            .await
            .map_err(failed)?;
        }
        tx.commit().await.map_err(failed)
    }

    pub(super) async fn audit_rows(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        let (sql, parameters) = audit::select(query, Dialect::Postgres);
        let values: Vec<Box<dyn ToSql + Sync + Send>> = parameters
            .into_iter()
            .map(|p| -> Box<dyn ToSql + Sync + Send> {
                match p {
                    Parameter::Text(text) => Box::new(text),
                    Parameter::Int(n) => Box::new(n),
                }
            })
            .collect();
        let references: Vec<&(dyn ToSql + Sync)> = values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let rows = self.query(&sql, &references).await?;
        rows.iter()
            .map(|row| {
                audit::entry(
                    column(row, 0)?,
                    &column::<String>(row, 1)?,
                    column(row, 2)?,
                    column(row, 3)?,
                    column(row, 4)?,
                    column(row, 5)?,
                    column(row, 6)?,
                    column(row, 7)?,
                    column(row, 8)?,
                    column(row, 9)?,
                )
            })
            .collect()
    }

    pub(super) async fn prune_audit_rows(&self, before: DateTime<Utc>, keep: u64) -> Result<usize> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        let removed = self
            .execute(&audit::prune(Dialect::Postgres), &[&stored(before), &keep])
            .await?;
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }
}
