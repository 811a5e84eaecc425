//! The engine's side of the snapshot chunk store ([`crate::chunks`]): which saves are chunked,
//! copies that keep their chunks from collection, and collection in the background.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Engine, EngineInner};
use crate::chunks::{ChunkStats, ChunkStore, Collected};
use crate::error::{Error, Result};

/// How often the engine looks whether snapshots changed and collects chunks if they did.
const COLLECT_EVERY: Duration = Duration::from_secs(30);
/// A collection works in slices of about this long...
const COLLECT_SLICE: Duration = Duration::from_millis(200);
/// ... this far apart, leaving the disk and a core to saves and restores in between.
const BETWEEN_SLICES: Duration = Duration::from_secs(1);
/// At most this many bytes of packs are rewritten per pass (the rest waits for the next).
const REWRITE_PER_PASS: u64 = 256 * 1024 * 1024;
/// How often each node collects the bucket's unused chunk packs (any node's saves and
/// deletions make them; passes of several nodes at once are safe).
const COLLECT_BUCKET_EVERY: Duration = Duration::from_secs(10 * 60);

impl EngineInner {
    /// The chunk store, when swapped machines' snapshots go into it: where snapshots are
    /// compressed at all.
    pub(crate) fn chunking(&self) -> Option<Arc<ChunkStore>> {
        (self.config.compress_swaps && self.config.chunk_snapshots)
            .then(|| Arc::clone(&self.chunks))
    }

    /// The chunk store, when saves are chunked as they are made: with a bucket, so that a save
    /// sends only the chunks the bucket lacks.
    pub(crate) fn chunking_saves(&self) -> Option<Arc<ChunkStore>> {
        self.bucket.as_ref().and(self.chunking())
    }

    /// Notes that snapshots may have been replaced or removed: the next collection looks.
    pub(crate) fn snapshots_changed(&self) {
        self.chunks_dirty.store(true, Ordering::SeqCst);
    }

    fn collection_roots(&self) -> [std::path::PathBuf; 2] {
        let home = &self.config.home;
        [home.join("machines"), home.join("base")]
    }

    /// One whole collection pass over every snapshot under the home, now (blocking).
    pub(crate) fn collect_chunks(&self) -> Result<Collected> {
        self.chunks_dirty.store(false, Ordering::SeqCst);
        let collected = self
            .chunks
            .collect(&self.collection_roots(), REWRITE_PER_PASS);
        self.collected(&collected);
        collected
    }

    /// One slice of the collection pass under way, or of a new one (blocking).
    fn collect_chunks_slice(&self) -> Result<Collected> {
        if !self.chunks.collecting() {
            self.chunks_dirty.store(false, Ordering::SeqCst);
        }
        let collected =
            self.chunks
                .collect_slice(&self.collection_roots(), REWRITE_PER_PASS, COLLECT_SLICE);
        self.collected(&collected);
        collected
    }

    fn collected(&self, collected: &Result<Collected>) {
        match collected {
            Ok(done) if done.finished && done.bytes_freed > 0 => tracing::debug!(
                "collected snapshot chunks: {} recipes read, {} packs removed, {} rewritten, {} \
                 bytes freed",
                done.recipes,
                done.packs_removed,
                done.packs_rewritten,
                done.bytes_freed
            ),
            Ok(done) if done.given_up => self.snapshots_changed(),
            Ok(_) => {}
            Err(_) => self.snapshots_changed(),
        }
    }
}

/// Copies a whole snapshot (see [`crate::snapshot::copy`]) with its chunks pinned meanwhile:
/// a collection running while the copy is installed never takes them (blocking).
pub(crate) fn copy_snapshot(
    chunks: &Arc<ChunkStore>,
    from: &Path,
    to: &Path,
    reseed: bool,
) -> Result<()> {
    let _pinned = chunks.pin_dir(from)?;
    crate::snapshot::copy(from, to, reseed)
}

/// Until the engine is gone: collects chunks when snapshots changed (looking every
/// [`COLLECT_EVERY`]), a slice at a time, and the bucket's every [`COLLECT_BUCKET_EVERY`].
pub(super) async fn collect_in_background(engine: Weak<EngineInner>) {
    let mut bucket_collected = tokio::time::Instant::now();
    let mut under_way = false;
    loop {
        tokio::time::sleep(if under_way {
            BETWEEN_SLICES
        } else {
            COLLECT_EVERY
        })
        .await;
        let Some(inner) = engine.upgrade() else {
            return;
        };
        if inner.closing() {
            return;
        }
        if let Some(bucket) = &inner.bucket
            && bucket_collected.elapsed() >= COLLECT_BUCKET_EVERY
        {
            bucket_collected = tokio::time::Instant::now();
            match bucket.collect_chunks().await {
                Ok(done) if done.removed > 0 => tracing::debug!(
                    "collected the bucket's chunk packs: {} removed, {} bytes freed",
                    done.removed,
                    done.bytes_freed
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!("collecting the bucket's chunk packs failed: {e}"),
            }
        }
        if !inner.chunks.collecting() && !inner.chunks_dirty.load(Ordering::SeqCst) {
            under_way = false;
            continue;
        }
        let collected = tokio::task::spawn_blocking(move || inner.collect_chunks_slice()).await;
        under_way = match collected {
            Ok(Ok(done)) => !done.finished,
            Ok(Err(e)) => {
                tracing::warn!("collecting snapshot chunks failed (tried again later): {e}");
                false
            }
            Err(_) => false,
        };
    }
}

impl Engine {
    /// Collects the snapshot chunks no snapshot names any more, now (the engine also does it in
    /// the background when snapshots change).
    pub async fn collect_snapshot_chunks(&self) -> Result<Collected> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.collect_chunks())
            .await
            .map_err(|e| Error::internal(format!("collecting snapshot chunks stopped: {e}")))?
    }

    /// Collects the bucket's chunk packs no snapshot names any more (one pass: unused packs
    /// are condemned, those condemned a grace period ago removed); `None` without a bucket.
    pub async fn collect_bucket_chunks(&self) -> Result<Option<crate::bucket::BucketCollected>> {
        match &self.inner.bucket {
            Some(bucket) => bucket.collect_chunks().await.map(Some),
            None => Ok(None),
        }
    }

    /// How many bytes this node has stored in the bucket; `None` without a bucket.
    pub fn bucket_bytes_sent(&self) -> Option<u64> {
        self.inner
            .bucket
            .as_ref()
            .map(crate::bucket::Bucket::bytes_sent)
    }

    /// How many packs and chunks the snapshot chunk store holds, and their size on disk.
    pub fn snapshot_chunk_stats(&self) -> ChunkStats {
        self.inner.chunks.stats()
    }
}
