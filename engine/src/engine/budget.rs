//! Keeping memory for the machines that work: idle machines go to disk after a while, and the
//! least recently used go first when too many are resident.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;

use super::inner::EngineInner;
use crate::machine::MachineHandle;
use crate::sync::lock;

impl EngineInner {
    /// Swaps out the least recently used idle machines (in the background) while more are
    /// resident than `max_resident` allows or they hold more than `resident_memory_mb`.
    pub(crate) fn keep_within_budget(self: &Arc<Self>) {
        let (count_limit, memory_limit) =
            (self.config.max_resident, self.config.resident_memory_mb);
        if (count_limit.is_none() && memory_limit.is_none())
            || !self.backend.capabilities().snapshots
            || self.trimming.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let resident: Vec<Arc<MachineHandle>> = lock(&engine.machines)
                    .values()
                    .filter(|h| h.resident())
                    .cloned()
                    .collect();
                let measure = memory_limit.is_some();
                // Reading memory walks page tables: off the async workers.
                let measured = tokio::task::spawn_blocking(move || {
                    resident
                        .into_iter()
                        .map(|h| {
                            let bytes = if measure { h.resident_bytes() } else { 0 };
                            (h.idle_for(), bytes, h)
                        })
                        .collect::<Vec<_>>()
                })
                .await;
                let Ok(mut resident) = measured else { break };
                let mut over_count =
                    count_limit.map_or(0, |limit| resident.len().saturating_sub(limit));
                let total: u64 = resident.iter().map(|e| e.1).sum();
                let mut over_bytes =
                    memory_limit.map_or(0, |limit| total.saturating_sub(limit * 1024 * 1024));
                if (over_count == 0 && over_bytes == 0) || engine.closing() {
                    break;
                }
                // Least recently used first; a machine with work to do stays, and so does one
                // that backs off after failed swap-outs.
                resident.retain(|(_, _, h)| !h.has_pending_work() && h.may_try_swap());
                resident.sort_by_key(|entry| std::cmp::Reverse(entry.0));
                let mut victims = Vec::new();
                for (_, bytes, handle) in resident {
                    if over_count == 0 && over_bytes == 0 {
                        break;
                    }
                    over_count = over_count.saturating_sub(1);
                    over_bytes = over_bytes.saturating_sub(bytes);
                    victims.push(handle);
                }
                if victims.is_empty() {
                    break;
                }
                // A few at a time: a checkpoint waits on disk as much as on the processor.
                futures::stream::iter(victims)
                    .for_each_concurrent(4, |handle| async move {
                        if let Err(e) = handle.swap_out().await {
                            tracing::warn!(machine = %handle.name, "could not swap out to stay within the resident budget: {e}");
                        }
                    })
                    .await;
            }
            engine.trimming.store(false, Ordering::SeqCst);
        });
    }
}

/// How long the idle tender waits for one machine's compression before it goes on.
const COMPRESS_WAIT: Duration = Duration::from_secs(10);

/// Until the engine is gone: swaps out resident machines idle for `swap_after`, and compresses
/// the snapshots of swapped machines idle for `compress_after`. A machine whose swap-out failed
/// is tried again only after its back-off; a snapshot is compressed at most once.
pub(crate) async fn tend_idle_machines(
    engine: Weak<EngineInner>,
    swap_after: Option<Duration>,
    compress_after: Option<Duration>,
) {
    let Some(shortest) = swap_after.into_iter().chain(compress_after).min() else {
        return;
    };
    let period = (shortest / 4).clamp(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        tokio::time::sleep(period).await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if engine.closing() {
            return;
        }
        let (to_swap, to_compress): (Vec<_>, Vec<_>) = {
            let machines = lock(&engine.machines);
            let to_swap = swap_after.map_or_else(Vec::new, |idle| {
                machines
                    .values()
                    .filter(|h| h.idle_resident() && h.idle_for() >= idle && h.may_try_swap())
                    .cloned()
                    .collect::<Vec<Arc<MachineHandle>>>()
            });
            let to_compress = compress_after.map_or_else(Vec::new, |idle| {
                machines
                    .values()
                    .filter(|h| h.may_compress(idle))
                    .cloned()
                    .collect()
            });
            (to_swap, to_compress)
        };
        drop(engine);
        for handle in to_swap {
            if let Err(e) = handle.swap_out().await {
                tracing::warn!(machine = %handle.name, "could not swap out an idle machine: {e}");
            }
        }
        for handle in to_compress {
            // A machine that took an instruction meanwhile answers only after it: the others
            // are not held up for that (its compression still runs when its turn comes).
            if let Ok(Err(e)) = tokio::time::timeout(COMPRESS_WAIT, handle.compress()).await {
                tracing::warn!(machine = %handle.name, "could not compress a snapshot: {e}");
            }
        }
    }
}
