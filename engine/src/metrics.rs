//! The engine's metrics, in the Prometheus/OpenMetrics text format (`GET /metrics` on a server):
//! counters and latency histograms kept as things happen, gauges read when scraped.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::sync::lock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountLabel {
    account: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: String,
}

/// Latency buckets from 1 ms to about 65 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Everything the engine measures.
pub(crate) struct Metrics {
    registry: Registry,
    instructions: Family<Outcome, Counter>,
    instruction_seconds: Histogram,
    instructions_by_account: Family<AccountLabel, Counter>,
    restores: Family<Outcome, Counter>,
    restore_seconds: Histogram,
    swap_outs: Family<Outcome, Counter>,
    swap_out_seconds: Histogram,
    sandbox_starts: Family<Outcome, Counter>,
    file_bytes: Family<DirectionLabel, Counter>,
    machines: Family<StateLabel, Gauge>,
    machines_by_account: Family<AccountLabel, Gauge>,
    snapshot_bytes: Gauge,
    bucket_uploads: Family<Outcome, Counter>,
    bucket_upload_seconds: Histogram,
    bucket_downloads: Family<Outcome, Counter>,
    bucket_download_seconds: Histogram,
    /// Restores of a snapshot kept in the bucket, by where it came from (cache, bucket).
    restore_sources: Family<SourceLabel, Counter>,
    /// In a cluster: its nodes by state (alive, dead), and the leases this node holds.
    cluster_nodes: Family<StateLabel, Gauge>,
    node_leases: Gauge,
    /// Requests refused for a credential that is unknown, expired or wrong (not audited).
    refused_credentials: Counter,
    /// Audit entries, by outcome (stored; lost: the store refused them).
    audit_entries: Family<Outcome, Counter>,
    /// Account names by id, as the engine has seen them.
    account_names: Mutex<HashMap<i64, String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("evervm");
        let metrics = Self {
            registry: Registry::default(),
            instructions: Family::default(),
            instruction_seconds: latency(),
            instructions_by_account: Family::default(),
            restores: Family::default(),
            restore_seconds: latency(),
            swap_outs: Family::default(),
            swap_out_seconds: latency(),
            sandbox_starts: Family::default(),
            file_bytes: Family::default(),
            machines: Family::default(),
            machines_by_account: Family::default(),
            snapshot_bytes: Gauge::default(),
            bucket_uploads: Family::default(),
            bucket_upload_seconds: latency(),
            bucket_downloads: Family::default(),
            bucket_download_seconds: latency(),
            restore_sources: Family::default(),
            cluster_nodes: Family::default(),
            node_leases: Gauge::default(),
            refused_credentials: Counter::default(),
            audit_entries: Family::default(),
            account_names: Mutex::new(HashMap::new()),
        };
        registry.register(
            "instructions",
            "Instructions finished, by outcome (value, exception, timeout, interrupted, \
             machine_crashed, limit_exceeded)",
            metrics.instructions.clone(),
        );
        registry.register(
            "instruction_duration_seconds",
            "How long finished instructions ran in the interpreter",
            metrics.instruction_seconds.clone(),
        );
        registry.register(
            "account_instructions",
            "Instructions finished, by account",
            metrics.instructions_by_account.clone(),
        );
        registry.register(
            "restores",
            "Machines restored from their snapshots, by outcome (ok, failed)",
            metrics.restores.clone(),
        );
        registry.register(
            "restore_duration_seconds",
            "How long restoring a machine from its snapshot took",
            metrics.restore_seconds.clone(),
        );
        registry.register(
            "swap_outs",
            "Machines saved to disk and stopped, by outcome (ok, failed)",
            metrics.swap_outs.clone(),
        );
        registry.register(
            "swap_out_duration_seconds",
            "How long a swap-out took",
            metrics.swap_out_seconds.clone(),
        );
        registry.register(
            "sandbox_starts",
            "Fresh sandboxes started (booted, or restored from an image's base snapshot), by \
             outcome (ok, failed)",
            metrics.sandbox_starts.clone(),
        );
        registry.register(
            "file_bytes",
            "Bytes of files written into (in) and read out of (out) machines",
            metrics.file_bytes.clone(),
        );
        registry.register(
            "machines",
            "Machines by state (resident, swapped, damaged, stopped)",
            metrics.machines.clone(),
        );
        registry.register(
            "account_machines",
            "Machines by account",
            metrics.machines_by_account.clone(),
        );
        registry.register(
            "snapshot_bytes",
            "Bytes of the machines' snapshots and checkpoints on disk",
            metrics.snapshot_bytes.clone(),
        );
        registry.register(
            "bucket_uploads",
            "Snapshots uploaded to the bucket (--snapshots), by outcome (ok, failed)",
            metrics.bucket_uploads.clone(),
        );
        registry.register(
            "bucket_upload_duration_seconds",
            "How long uploading a snapshot to the bucket took",
            metrics.bucket_upload_seconds.clone(),
        );
        registry.register(
            "bucket_downloads",
            "Snapshots downloaded from the bucket, by outcome (ok, failed)",
            metrics.bucket_downloads.clone(),
        );
        registry.register(
            "bucket_download_duration_seconds",
            "How long downloading (and checking) a snapshot from the bucket took",
            metrics.bucket_download_seconds.clone(),
        );
        registry.register(
            "snapshot_fetches",
            "Snapshots kept in the bucket made ready for a restore, by source (cache: the copy \
             on the home's disk was current; bucket: downloaded)",
            metrics.restore_sources.clone(),
        );
        registry.register(
            "cluster_nodes",
            "In a cluster, its nodes by state (alive: renewed its leases within one lease's \
             length; dead)",
            metrics.cluster_nodes.clone(),
        );
        registry.register(
            "node_leases",
            "In a cluster, the machines this node holds the lease of (as its last heartbeat \
             renewed them)",
            metrics.node_leases.clone(),
        );
        registry.register(
            "refused_credentials",
            "Requests refused for their credential (unknown, revoked, expired or malformed \
             tokens): counted here, never written to the audit log",
            metrics.refused_credentials.clone(),
        );
        registry.register(
            "audit_entries",
            "Audit log entries, by outcome (stored; lost: the store refused them, and the \
             server's log says why)",
            metrics.audit_entries.clone(),
        );
        // Every label value from the start (at 0), so that a series never appears out of
        // nowhere and the families show before anything happened.
        for ok in [true, false] {
            metrics.restores.get_or_create(&outcome(ok)).inc_by(0);
            metrics.swap_outs.get_or_create(&outcome(ok)).inc_by(0);
            metrics.sandbox_starts.get_or_create(&outcome(ok)).inc_by(0);
            metrics.bucket_uploads.get_or_create(&outcome(ok)).inc_by(0);
            metrics
                .bucket_downloads
                .get_or_create(&outcome(ok))
                .inc_by(0);
        }
        for outcome in ["stored", "lost"] {
            metrics
                .audit_entries
                .get_or_create(&Outcome {
                    outcome: outcome.to_owned(),
                })
                .inc_by(0);
        }
        for source in ["cache", "bucket"] {
            metrics
                .restore_sources
                .get_or_create(&SourceLabel {
                    source: source.to_owned(),
                })
                .inc_by(0);
        }
        for direction in ["in", "out"] {
            metrics
                .file_bytes
                .get_or_create(&DirectionLabel {
                    direction: direction.to_owned(),
                })
                .inc_by(0);
        }
        for kind in [
            "value",
            "exception",
            "timeout",
            "interrupted",
            "machine_crashed",
            "limit_exceeded",
        ] {
            metrics
                .instructions
                .get_or_create(&Outcome {
                    outcome: kind.to_owned(),
                })
                .inc_by(0);
        }
        Self {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// Notes an account's name for the per-account metrics.
    pub(crate) fn know_account(&self, id: i64, name: &str) {
        let mut names = lock(&self.account_names);
        if names.get(&id).is_none_or(|known| known != name) {
            names.insert(id, name.to_owned());
        }
    }

    fn account(&self, id: i64) -> String {
        lock(&self.account_names)
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("id:{id}"))
    }

    pub(crate) fn instruction_finished(&self, account_id: i64, outcome: &str, seconds: f64) {
        self.instructions
            .get_or_create(&Outcome {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.instruction_seconds.observe(seconds);
        self.instructions_by_account
            .get_or_create(&AccountLabel {
                account: self.account(account_id),
            })
            .inc();
    }

    pub(crate) fn refused_credential(&self) {
        self.refused_credentials.inc();
    }

    /// What counts audit entries, for the audit log's writer.
    pub(crate) fn audit_counter(&self) -> std::sync::Arc<dyn Fn(bool, usize) + Send + Sync> {
        let family = self.audit_entries.clone();
        std::sync::Arc::new(move |stored: bool, count: usize| {
            family
                .get_or_create(&Outcome {
                    outcome: if stored { "stored" } else { "lost" }.to_owned(),
                })
                .inc_by(count as u64);
        })
    }

    pub(crate) fn restored(&self, ok: bool, seconds: f64) {
        counted_and_timed(&self.restores, &self.restore_seconds, ok, seconds);
    }

    pub(crate) fn swapped_out(&self, ok: bool, seconds: f64) {
        counted_and_timed(&self.swap_outs, &self.swap_out_seconds, ok, seconds);
    }

    pub(crate) fn bucket_upload(&self, ok: bool, seconds: f64) {
        counted_and_timed(
            &self.bucket_uploads,
            &self.bucket_upload_seconds,
            ok,
            seconds,
        );
    }

    pub(crate) fn bucket_download(&self, ok: bool, seconds: f64) {
        counted_and_timed(
            &self.bucket_downloads,
            &self.bucket_download_seconds,
            ok,
            seconds,
        );
    }

    /// A snapshot kept in the bucket was made ready from `source` (`cache` or `bucket`).
    pub(crate) fn snapshot_fetched(&self, source: &str) {
        self.restore_sources
            .get_or_create(&SourceLabel {
                source: source.to_owned(),
            })
            .inc();
    }

    pub(crate) fn sandbox_started(&self, ok: bool) {
        self.sandbox_starts.get_or_create(&outcome(ok)).inc();
    }

    /// Bytes of a file moved `in` (written) or `out` (read).
    pub(crate) fn file_bytes(&self, direction: &str, bytes: u64) {
        self.file_bytes
            .get_or_create(&DirectionLabel {
                direction: direction.to_owned(),
            })
            .inc_by(bytes);
    }

    /// The text of every metric, with the gauges set from what the engine holds now.
    pub(crate) fn encode(
        &self,
        by_state: &[(&str, i64)],
        by_account: &[(String, i64)],
        snapshot_bytes: u64,
        cluster: Option<Cluster>,
    ) -> String {
        if let Some(cluster) = cluster {
            for (state, count) in [("alive", cluster.alive), ("dead", cluster.dead)] {
                self.cluster_nodes
                    .get_or_create(&StateLabel {
                        state: state.to_owned(),
                    })
                    .set(count);
            }
            self.node_leases.set(cluster.leases);
        }
        for (state, count) in by_state {
            self.machines
                .get_or_create(&StateLabel {
                    state: (*state).to_owned(),
                })
                .set(*count);
        }
        self.machines_by_account.clear();
        for (account, count) in by_account {
            self.machines_by_account
                .get_or_create(&AccountLabel {
                    account: account.clone(),
                })
                .set(*count);
        }
        self.snapshot_bytes
            .set(i64::try_from(snapshot_bytes).unwrap_or(i64::MAX));
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

/// What a node of a cluster reports in its metrics.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cluster {
    pub(crate) alive: i64,
    pub(crate) dead: i64,
    pub(crate) leases: i64,
}

/// One more of `counter`'s outcome, and its time in `histogram` when it went well.
fn counted_and_timed(
    counter: &Family<Outcome, Counter>,
    histogram: &Histogram,
    ok: bool,
    seconds: f64,
) {
    counter.get_or_create(&outcome(ok)).inc();
    if ok {
        histogram.observe(seconds);
    }
}

fn outcome(ok: bool) -> Outcome {
    Outcome {
        outcome: if ok { "ok" } else { "failed" }.to_owned(),
    }
}
