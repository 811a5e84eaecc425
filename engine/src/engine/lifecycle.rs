//! A machine's life: an expiry time given at creation after which the engine deletes it, and
//! lists in pages.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Engine, EngineInner};
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::types::{Account, ListCursor, MAX_LIFETIME, MAX_PAGE, MachinePage, Tags};

/// How often the engine looks for machines whose time has come: an expired machine is deleted
/// within about this long.
const EXPIRY_CHECK: Duration = Duration::from_secs(1);
/// Machines deleted per look (the rest wait for the next).
const EXPIRED_PER_CHECK: usize = 64;

/// Checks a new machine's expiry time: in the future, at most [`MAX_LIFETIME`] from now.
pub(super) fn check_expiry(expires_at: Option<DateTime<Utc>>) -> Result<Option<DateTime<Utc>>> {
    let Some(at) = expires_at else {
        return Ok(None);
    };
    let now = Utc::now();
    if at <= now {
        return Err(Error::invalid(format!(
            "expires_at {} is not in the future",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )));
    }
    let longest = chrono::Duration::from_std(MAX_LIFETIME).unwrap_or(chrono::Duration::MAX);
    if at - now > longest {
        return Err(Error::invalid(format!(
            "expires_at {} is more than {} days away",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            MAX_LIFETIME.as_secs() / 86_400
        )));
    }
    Ok(Some(at))
}

/// Until the engine is gone: deletes the machines whose expiry time has come.
pub(super) async fn delete_expired_machines(engine: Weak<EngineInner>) {
    loop {
        tokio::time::sleep(EXPIRY_CHECK).await;
        let Some(inner) = engine.upgrade() else {
            return;
        };
        if inner.closing() {
            return;
        }
        let expired = inner
            .store
            .expired_machines(Utc::now(), EXPIRED_PER_CHECK)
            .await;
        let engine_now = Engine { inner };
        match expired {
            Ok(expired) => {
                for (account_id, name) in expired {
                    let account = Account {
                        id: account_id,
                        name: String::new(),
                    };
                    match engine_now.delete_machine(&account, &name).await {
                        Ok(()) => tracing::info!(machine = %name, "deleted: its time was up"),
                        Err(e) if e.kind() == crate::ErrorKind::NotFound => {}
                        Err(e) => {
                            tracing::warn!(machine = %name, "deleting an expired machine: {e}");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("looking for expired machines failed: {e}"),
        }
    }
}

impl Engine {
    /// Every metric in the Prometheus (OpenMetrics) text format: counters and histograms kept
    /// as things happen, and machines by state and by account, and the bytes of snapshots, as
    /// they are now.
    pub async fn metrics_text(&self) -> Result<String> {
        let machines = self.inner.store.machine_accounts().await?;
        let cluster = match &self.inner.node {
            Some(node) => {
                let nodes = self.nodes().await?;
                let alive = nodes.iter().filter(|(_, alive)| *alive).count();
                Some(crate::metrics::Cluster {
                    alive: i64::try_from(alive).unwrap_or(i64::MAX),
                    dead: i64::try_from(nodes.len() - alive).unwrap_or(i64::MAX),
                    leases: i64::try_from(node.leases()).unwrap_or(i64::MAX),
                })
            }
            None => None,
        };
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut by_state: BTreeMap<&str, i64> = ["resident", "swapped", "damaged", "stopped"]
                .into_iter()
                .map(|state| (state, 0))
                .collect();
            let mut by_account: BTreeMap<String, i64> = BTreeMap::new();
            let mut snapshot_bytes = 0u64;
            for (name, account) in machines {
                let resident = lock(&inner.machines)
                    .get(&name)
                    .is_some_and(|handle| handle.resident());
                let facts = inner.disk_facts(&name);
                snapshot_bytes += facts.disk_bytes;
                let state = match (resident, &facts.snapshot) {
                    (true, _) => "resident",
                    (false, Some(Err(_))) => "damaged",
                    (false, Some(Ok(()))) => "swapped",
                    (false, None) => "stopped",
                };
                *by_state.entry(state).or_default() += 1;
                *by_account.entry(account).or_default() += 1;
            }
            let by_state: Vec<(&str, i64)> = by_state.into_iter().collect();
            let by_account: Vec<(String, i64)> = by_account.into_iter().collect();
            inner
                .metrics
                .encode(&by_state, &by_account, snapshot_bytes, cluster)
        })
        .await
        .map_err(|e| Error::internal(format!("reading the metrics stopped: {e}")))
    }

    /// A page of the account's machines that carry every tag of `filter`, newest first: at most
    /// `limit` (at most [`MAX_PAGE`]), starting after `cursor` (from the start when `None`).
    /// The order is stable: machines created meanwhile come before the first page, deleted
    /// ones are skipped, none is listed twice.
    pub async fn list_machines_page(
        &self,
        account: &Account,
        filter: &Tags,
        limit: usize,
        cursor: Option<ListCursor>,
    ) -> Result<MachinePage> {
        self.list_machines_page_in(account, filter, limit, cursor, false)
            .await
    }

    /// [`Self::list_machines_page`], oldest first when `oldest_first` (machines created
    /// meanwhile then come on a later page).
    pub async fn list_machines_page_in(
        &self,
        account: &Account,
        filter: &Tags,
        limit: usize,
        cursor: Option<ListCursor>,
        oldest_first: bool,
    ) -> Result<MachinePage> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(Error::invalid(format!(
                "limit {limit}: a page holds 1 to {MAX_PAGE} machines"
            )));
        }
        let account_id = account.id;
        let mut records = self.inner.store.machines(account_id).await?;
        // The store gives them newest first.
        records.sort_by_key(|r| std::cmp::Reverse(r.position));
        if oldest_first {
            records.reverse();
        }
        let after = |position: i64| {
            cursor.is_none_or(|c| {
                if oldest_first {
                    position > c.0
                } else {
                    position < c.0
                }
            })
        };
        let mut page: Vec<_> = records
            .into_iter()
            .filter(|r| after(r.position))
            .filter(|r| filter.iter().all(|(k, v)| r.tags.get(k) == Some(v)))
            .take(limit + 1)
            .collect();
        let more = page.len() > limit;
        page.truncate(limit);
        let next_cursor = more
            .then(|| page.last().map(|r| ListCursor(r.position)))
            .flatten();
        let machines = self.infos(page).await?;
        Ok(MachinePage {
            machines,
            next_cursor,
        })
    }
}
