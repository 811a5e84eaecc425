//! The audit log: every state-changing call a server takes (who, when, through which door, on
//! which machine, how it went), kept in the store ([`crate::store::AuditEntry`]).
//!
//! Callers hand entries to a writer task through a bounded queue (a flood of calls waits for
//! room instead of growing memory) and go on; the writer stores what has queued up in one
//! transaction, so an instruction's own path never waits for the audit row's write. Reads and
//! shutdown first wait for every entry queued before them. The writer also keeps the log within
//! its bounds: entries older than the retention and beyond the newest `max_entries` are removed,
//! in batches, at start and every [`PRUNE_EVERY`].

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use super::Engine;
use crate::error::Result;
use crate::store::{AuditEntry, AuditQuery, Metadata};

/// What the audit log keeps of an instruction's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuditCode {
    /// Its SHA-256 (`sha256:<hex>`): enough to tell which code ran, without keeping it twice.
    #[default]
    Hash,
    /// The code itself.
    Keep,
}

impl AuditCode {
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim() {
            "hash" => Ok(Self::Hash),
            "keep" => Ok(Self::Keep),
            other => Err(crate::Error::invalid(format!(
                "{other:?} is not a way to keep code in the audit log: `hash` (the default) or \
                 `keep`"
            ))),
        }
    }
}

/// The audit log's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    /// What an `exec` entry keeps of the code (`EVERVM_AUDIT_CODE`: `hash` or `keep`).
    pub code: AuditCode,
    /// How long entries are kept (`EVERVM_AUDIT_RETENTION_DAYS`, default 90).
    pub retention: Duration,
    /// How many entries are kept at most, the newest (`EVERVM_AUDIT_MAX_ENTRIES`, default
    /// 1,000,000): the bound on the log's disk whatever callers do.
    pub max_entries: u64,
}

impl Default for AuditSettings {
    fn default() -> Self {
        Self {
            code: AuditCode::Hash,
            retention: Duration::from_secs(90 * 86_400),
            max_entries: 1_000_000,
        }
    }
}

impl AuditSettings {
    /// The defaults, changed by `EVERVM_AUDIT_CODE`, `EVERVM_AUDIT_RETENTION_DAYS` and
    /// `EVERVM_AUDIT_MAX_ENTRIES` where they are set (a value that is not understood is
    /// logged and ignored).
    pub fn from_env() -> Self {
        let mut settings = Self::default();
        if let Ok(text) = std::env::var("EVERVM_AUDIT_CODE")
            && !text.trim().is_empty()
        {
            match AuditCode::parse(&text) {
                Ok(code) => settings.code = code,
                Err(e) => tracing::warn!("ignoring EVERVM_AUDIT_CODE: {e}"),
            }
        }
        let positive = |key: &str| {
            let text = std::env::var(key).ok()?;
            match text.trim().parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    tracing::warn!("ignoring {key}={text:?}: expected a whole number above 0");
                    None
                }
            }
        };
        if let Some(days) = positive("EVERVM_AUDIT_RETENTION_DAYS") {
            settings.retention = Duration::from_secs(days.saturating_mul(86_400));
        }
        if let Some(entries) = positive("EVERVM_AUDIT_MAX_ENTRIES") {
            settings.max_entries = entries;
        }
        settings
    }
}

/// The most of a detail an entry keeps (kept code, a long list of requirements): the log's disk
/// is bounded by its count of entries times this.
pub(crate) const DETAIL_MAX_BYTES: usize = 16 * 1024;

/// `detail` cut to [`DETAIL_MAX_BYTES`] (at a character's boundary) when longer, saying so and
/// giving the whole text's SHA-256.
fn bound_detail(detail: &mut String) {
    if detail.len() <= DETAIL_MAX_BYTES {
        return;
    }
    let digest = hex::encode(Sha256::digest(detail.as_bytes()));
    let whole = detail.len();
    let mut cut = DETAIL_MAX_BYTES;
    while !detail.is_char_boundary(cut) {
        cut -= 1;
    }
    detail.truncate(cut);
    let _ = write!(detail, "\n[cut: {whole} bytes in all, sha256:{digest}]");
}

/// Entries waiting for the writer at most; further callers wait for room.
const QUEUE: usize = 4096;

/// Entries stored in one transaction at most.
const BATCH: usize = 512;

/// How often the writer removes entries past the log's bounds.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(600);

enum Job {
    Entry(Box<AuditEntry>),
    /// Answered once every entry queued before it is stored (or lost, and logged).
    Flush(oneshot::Sender<()>),
}

/// The way to the writer task.
pub(crate) struct AuditLog {
    queue: mpsc::Sender<Job>,
    pub(crate) code: AuditCode,
}

impl AuditLog {
    /// Starts the writer on `store`, which marks the entries it stores with `node`.
    pub(crate) fn start(
        store: Arc<dyn Metadata>,
        node: Option<String>,
        settings: &AuditSettings,
        metrics: Arc<dyn Fn(bool, usize) + Send + Sync>,
    ) -> Self {
        let (queue, jobs) = mpsc::channel(QUEUE);
        tokio::spawn(write(store, node, settings.clone(), jobs, metrics));
        Self {
            queue,
            code: settings.code,
        }
    }

    pub(crate) async fn record(&self, mut entry: AuditEntry) {
        if let Some(detail) = &mut entry.detail {
            bound_detail(detail);
        }
        if self.queue.send(Job::Entry(Box::new(entry))).await.is_err() {
            tracing::error!("the audit log's writer has stopped: an entry is lost");
        }
    }

    /// Waits until every entry queued before is stored.
    pub(crate) async fn flush(&self) {
        let (done, stored) = oneshot::channel();
        if self.queue.send(Job::Flush(done)).await.is_ok() {
            let _ = stored.await;
        }
    }
}

async fn write(
    store: Arc<dyn Metadata>,
    node: Option<String>,
    settings: AuditSettings,
    mut jobs: mpsc::Receiver<Job>,
    metrics: Arc<dyn Fn(bool, usize) + Send + Sync>,
) {
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => job,
                None => return,
            },
            _ = prune.tick() => {
                prune_log(&*store, &settings).await;
                continue;
            }
        };
        let mut entries = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                Job::Entry(mut entry) => {
                    entry.node.clone_from(&node);
                    entries.push(*entry);
                }
                Job::Flush(done) => flushes.push(done),
            }
            if entries.len() < BATCH {
                next = jobs.try_recv().ok();
            }
        }
        if !entries.is_empty() {
            let count = entries.len();
            match store.record_audit(entries).await {
                Ok(()) => metrics(true, count),
                Err(e) => {
                    metrics(false, count);
                    tracing::error!("the audit log could not store {count} entries: {e}");
                }
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// Removes the entries past the log's bounds, a batch at a time.
async fn prune_log(store: &dyn Metadata, settings: &AuditSettings) {
    let Some(before) = chrono::Duration::from_std(settings.retention)
        .ok()
        .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
    else {
        return;
    };
    let mut removed = 0;
    loop {
        match store.prune_audit(before, settings.max_entries).await {
            Ok(n) => {
                removed += n;
                if i64::try_from(n).unwrap_or(i64::MAX) < crate::store::PRUNE_BATCH {
                    break;
                }
                tokio::task::yield_now().await;
            }
            Err(e) => {
                tracing::warn!("pruning the audit log failed (next try in 10 minutes): {e}");
                break;
            }
        }
    }
    if removed > 0 {
        tracing::info!("removed {removed} audit entries past the log's bounds");
    }
}

impl Engine {
    /// Records a call in the audit log (queued: stored within moments, in order).
    pub async fn record_audit(&self, entry: AuditEntry) {
        self.inner.audit.record(entry).await;
    }

    /// What the audit log keeps of an instruction's `code`: its SHA-256 or the code itself
    /// (`EVERVM_AUDIT_CODE`).
    pub fn audit_detail_for_code(&self, code: &str) -> String {
        match self.inner.audit.code {
            AuditCode::Hash => format!("sha256:{}", hex::encode(Sha256::digest(code.as_bytes()))),
            AuditCode::Keep => code.to_owned(),
        }
    }

    /// The audit entries `query` asks for, newest first, with every entry recorded before
    /// this call among them.
    pub async fn audit_entries(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.inner.audit.flush().await;
        self.inner.store.audit_entries(query).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_details_are_cut_at_a_character_and_say_so() {
        let mut short = "print(1)".to_owned();
        bound_detail(&mut short);
        assert_eq!(short, "print(1)");
        let mut long = "é".repeat(DETAIL_MAX_BYTES);
        bound_detail(&mut long);
        assert!(long.len() < DETAIL_MAX_BYTES + 120, "{}", long.len());
        assert!(long.contains(&format!(
            "[cut: {} bytes in all, sha256:",
            2 * DETAIL_MAX_BYTES
        )));
    }
}
