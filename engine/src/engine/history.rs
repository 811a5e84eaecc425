//! Machines' history: undo points kept after their latest instructions, listed with the
//! instructions, and rewinding to one of them (see `machine/history.rs` for how points are
//! taken).

use super::Engine;
use crate::error::{Error, Result};
use crate::types::{
    Account, ExecResult, HistoryEntry, MachineHistory, MachineName, Outcome, Rewound,
};

/// The most instructions one history listing holds.
pub const MAX_HISTORY_LIST: usize = 1000;
/// Values and errors in a history listing are cut to about this many characters.
const SHORT: usize = 200;

impl Engine {
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
            return Err(Error::invalid(format!(
                "machine {name} keeps no undo points: create it with a history (history = N)"
            )));
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
        let (home, machine) = (
            self.inner.config.home.clone(),
            MachineName::clone(&record.name),
        );
        let points =
            tokio::task::spawn_blocking(move || crate::snapshot::points(&home, machine.as_str()))
                .await
                .map_err(|e| Error::internal(format!("listing undo points stopped: {e}")))?;
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
