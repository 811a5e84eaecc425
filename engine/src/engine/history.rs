//! Machines' history: undo points kept after their latest instructions, listed with the
//! instructions, and rewinding to one of them (see `machine/history.rs` for how points are
//! taken).

use super::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::types::{
    Account, ExecResult, HistoryEntry, Lineage, LineageCheckpoint, LineageNode, MachineHistory,
    Outcome, Rewound, TakenBack,
};

/// The most instructions one history listing holds.
pub const MAX_HISTORY_LIST: usize = 1000;
/// Values and errors in a history listing are cut to about this many characters.
const SHORT: usize = 200;

impl Engine {
    /// The most undo points a machine may keep here.
    pub fn max_history(&self) -> u32 {
        self.inner.config.max_history
    }

    /// The undo points a new machine keeps: `requested`, or the engine's default; refused
    /// above the engine's maximum, or where the backend cannot save a machine and leave it
    /// running.
    pub(super) fn history_for(&self, requested: Option<u32>) -> Result<u32> {
        let config = &self.inner.config;
        let history = requested.unwrap_or(config.default_history);
        if history > config.max_history {
            return Err(Error::invalid(format!(
                "history {history} is more undo points than this server keeps per machine \
                 ({}, EVERVM_HISTORY_MAX)",
                config.max_history
            )));
        }
        if history > 0 && !self.inner.backend.capabilities().save_in_place {
            if requested.is_none() {
                // The server's default does not apply where it cannot be kept.
                return Ok(0);
            }
            return Err(Error::unsupported(format!(
                "history needs a backend that saves a machine and leaves it running, which {} \
                 cannot (the gVisor backend with a current runsc can: scripts/runsc.sh)",
                self.inner.backend.describe()
            )));
        }
        Ok(history)
    }

    /// Makes one of the machine's undo points its state: the state after instruction `to`, or
    /// with `to = -1` the state before its last instruction (an undo). Waits for its running
    /// instruction first; the instructions after the point stay in its history, marked
    /// rewound.
    pub async fn rewind(&self, account: &Account, name: &str, to: i64) -> Result<Rewound> {
        let record = self.record(account, name).await?;
        if record.history == 0 {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "machine {name} keeps no undo points: create it with a history (history = N)"
                ),
            ));
        }
        let handle = self.handle(account, name).await?;
        let rewound = handle.rewind(to).await?;
        self.inner.forget_disk_facts(name);
        Ok(rewound)
    }

    /// The machine's latest `limit` instructions (at most [`MAX_HISTORY_LIST`]), oldest first,
    /// each with a short result and whether it can be rewound to.
    pub async fn history(
        &self,
        account: &Account,
        name: &str,
        limit: usize,
    ) -> Result<MachineHistory> {
        let record = self.record(account, name).await?;
        // An undo point being taken (just after an instruction's result) is waited for, so
        // that the listing says what an undo would find.
        if let Some(handle) = self.cached_handle(account, name)? {
            let mut taking = handle.taking_point.subscribe();
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                taking.wait_for(|busy| !*busy),
            )
            .await;
        }
        let limit = limit.clamp(1, MAX_HISTORY_LIST);
        let from = (record.next_seq - i64::try_from(limit).unwrap_or(i64::MAX)).max(0);
        let rows = self
            .inner
            .store
            .instructions_from(record.name.as_str(), from, limit)
            .await?;
        let points = crate::machine::bucketed::points(&self.inner, record.name.as_str()).await?;
        Ok(MachineHistory {
            keeps: record.history,
            initial_point: points.first() == Some(&-1),
            instructions: rows
                .into_iter()
                .map(|row| {
                    let (value, error) = summary(row.result.as_ref());
                    HistoryEntry {
                        seq: row.seq,
                        code: row.code,
                        value,
                        error,
                        finished: row.result.is_some(),
                        rewound: row.rolled_back_to.is_some(),
                        undo_point: points.contains(&row.seq),
                    }
                })
                .collect(),
        })
    }
}

/// A result's value, or its error's last line, shortened.
fn summary(result: Option<&ExecResult>) -> (Option<String>, Option<String>) {
    match result.map(|r| &r.outcome) {
        Some(Outcome::Value(value)) => (value.as_deref().map(shorten), None),
        Some(Outcome::Error { text, .. }) => {
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            (None, Some(shorten(last.trim())))
        }
        None => (None, None),
    }
}

fn shorten(text: &str) -> String {
    match text.char_indices().nth(SHORT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The most machines a lineage holds, and the deepest chain of parents it follows.
const MAX_LINEAGE: usize = 1000;

impl Engine {
    /// The tree of forks `name` belongs to (see [`Lineage`]), with each machine's checkpoints
    /// and the instructions rewinds and rollbacks took back. Only the account's machines.
    pub async fn lineage(&self, account: &Account, name: &str) -> Result<Lineage> {
        let record = self.record(account, name).await?;
        let family = self.inner.store.machines(account.id).await?;
        let by_name: std::collections::HashMap<&str, &crate::store::MachineRecord> =
            family.iter().map(|m| (m.name.as_str(), m)).collect();
        // Up to the oldest ancestor still here.
        let mut root = record.name.as_str().to_owned();
        for _ in 0..MAX_LINEAGE {
            match by_name.get(root.as_str()).and_then(|m| m.parent.as_deref()) {
                Some(parent) if by_name.contains_key(parent) => root = parent.to_owned(),
                _ => break,
            }
        }
        // Then down, parents before children.
        let mut order = vec![root.clone()];
        let mut at = 0;
        while at < order.len() && order.len() < MAX_LINEAGE {
            let parent = order[at].clone();
            let mut children: Vec<&crate::store::MachineRecord> = family
                .iter()
                .filter(|m| m.parent.as_deref() == Some(parent.as_str()))
                .collect();
            children.sort_by_key(|m| m.position);
            order.extend(children.into_iter().map(|m| m.name.to_string()));
            at += 1;
        }
        order.truncate(MAX_LINEAGE);
        let mut machines = Vec::with_capacity(order.len());
        for name in order {
            let Some(m) = by_name.get(name.as_str()) else {
                continue;
            };
            let checkpoints = self.inner.store.checkpoints(&name).await?;
            let taken = self.inner.store.taken_back(&name, MAX_TAKEN_BACK).await?;
            machines.push(LineageNode {
                name: name.clone(),
                created_at: m.created_at,
                parent: m.parent.clone(),
                forked_at: m.forked_at,
                instruction_count: m.next_seq,
                checkpoints: checkpoints
                    .into_iter()
                    .map(|c| LineageCheckpoint {
                        name: c.name,
                        instruction_count: c.instruction_count,
                    })
                    .collect(),
                taken_back: runs(&taken),
            });
        }
        Ok(Lineage { root, machines })
    }
}

/// At most this many taken-back instructions are read per machine for a lineage.
const MAX_TAKEN_BACK: usize = 100_000;

/// Consecutive seqs taken back by the same thing, as runs.
fn runs(taken: &[(i64, String)]) -> Vec<TakenBack> {
    let mut runs: Vec<TakenBack> = Vec::new();
    for (seq, by) in taken {
        match runs.last_mut() {
            Some(run) if run.last + 1 == *seq && run.by == *by => run.last = *seq,
            _ => runs.push(TakenBack {
                first: *seq,
                last: *seq,
                by: by.clone(),
            }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_back_instructions_group_into_runs() {
        let taken = [
            (3, "rewind to 2".to_owned()),
            (4, "rewind to 2".to_owned()),
            (5, "before".to_owned()),
            (7, "before".to_owned()),
        ];
        let grouped = runs(&taken);
        let found: Vec<(i64, i64, &str)> = grouped
            .iter()
            .map(|r| (r.first, r.last, r.by.as_str()))
            .collect();
        assert_eq!(
            found,
            [(3, 4, "rewind to 2"), (5, 5, "before"), (7, 7, "before")]
        );
    }
}
