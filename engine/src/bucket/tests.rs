//! The bucket against a real S3-compatible server: `EVERVM_TEST_S3` names a bucket on it
//! (`s3://BUCKET`), reached through the standard `AWS_*` environment; `scripts/test.sh`
//! starts SeaweedFS and sets both. Each test works under a prefix of its own.
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

fn settings() -> Option<BucketSettings> {
    let Ok(url) = std::env::var("EVERVM_TEST_S3") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the bucket's tests: set EVERVM_TEST_S3 (scripts/test.sh starts \
             an S3-compatible server)"
        );
        eprintln!("skipping: EVERVM_TEST_S3 is not set (scripts/test.sh sets it)");
        return None;
    };
    let prefix = format!("test-{:016x}", rand::random::<u64>());
    Some(BucketSettings::parse(&url).unwrap().with_prefix(&prefix))
}

/// A sealed snapshot in `dir`: a large file (uploaded in parts) and a small one.
fn sealed_snapshot(dir: &Path, seed: u8) -> SnapshotManifest {
    let staging = snapshot::staging_beside(dir).unwrap();
    let large: Vec<u8> = (0..(PART_BYTES * 2 + 12_345))
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    std::fs::write(staging.join("checkpoint.img"), &large).unwrap();
    std::fs::write(staging.join("pages.json"), format!("{{\"seed\": {seed}}}")).unwrap();
    snapshot::commit_to(dir, &staging, "test-runtime", None).unwrap()
}

fn anything(_: &str) -> bool {
    true
}

/// Downloads AREA's snapshot `sha256` into a new directory `into`.
async fn download_into(
    bucket: &Bucket,
    area: &str,
    sha256: &str,
    into: &Path,
    restorable: Arc<dyn Fn(&str) -> bool + Send + Sync>,
) -> Result<SnapshotManifest> {
    std::fs::create_dir(into).unwrap();
    bucket
        .download(area, sha256, into, restorable)
        .await
        .map(|downloaded| downloaded.manifest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_goes_up_and_comes_back_checked() {
    let Some(settings) = settings() else { return };
    let bucket = Bucket::open(&settings).await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let dir = local.path().join("snapshot");
    let manifest = sealed_snapshot(&dir, 1);
    let area = "machines/m-one/snapshot";
    assert_eq!(bucket.upload(area, &dir).await.unwrap(), manifest);
    assert_eq!(
        bucket.snapshots(area).await.unwrap(),
        vec![manifest.sha256.clone()]
    );
    // Once there, the same snapshot is not sent again.
    assert_eq!(bucket.upload(area, &dir).await.unwrap(), manifest);

    let into = local.path().join("downloaded");
    let got = download_into(&bucket, area, &manifest.sha256, &into, Arc::new(anything))
        .await
        .unwrap();
    assert_eq!(got, manifest);
    for name in ["checkpoint.img", "pages.json", snapshot::MANIFEST] {
        assert_eq!(
            std::fs::read(into.join(name)).unwrap(),
            std::fs::read(dir.join(name)).unwrap(),
            "{name}"
        );
    }
    snapshot::verify_dir(&into, &anything).unwrap().unwrap();

    // A runtime this engine does not have is refused, and so is a checksum not there.
    let refused = download_into(
        &bucket,
        area,
        &manifest.sha256,
        &local.path().join("refused"),
        Arc::new(|_: &str| false),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::MachineCrashed, "{refused}");
    let absent = download_into(
        &bucket,
        area,
        &"0".repeat(64),
        &local.path().join("absent"),
        Arc::new(anything),
    )
    .await
    .unwrap_err();
    assert!(absent.message().contains("is not there"), "{absent}");

    bucket.remove(area, &manifest.sha256).await.unwrap();
    assert!(bucket.snapshots(area).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_object_in_the_bucket_is_refused() {
    let Some(settings) = settings() else { return };
    let bucket = Bucket::open(&settings).await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let dir = local.path().join("snapshot");
    let manifest = sealed_snapshot(&dir, 2);
    let area = "machines/m-two/snapshot";
    bucket.upload(area, &dir).await.unwrap();
    let root = bucket.snapshot_root(area, &manifest.sha256).unwrap();

    // Same size, other bytes: caught by the checksum.
    let key = root.clone().join("pages.json");
    let original = bucket.store.get(&key).await.unwrap().bytes().await.unwrap();
    let mut changed = original.to_vec();
    changed[0] ^= 1;
    bucket
        .store
        .put(&key, PutPayload::from(changed))
        .await
        .unwrap();
    let e = download_into(
        &bucket,
        area,
        &manifest.sha256,
        &local.path().join("a"),
        Arc::new(anything),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MachineCrashed, "{e}");
    assert!(e.message().contains("does not match"), "{e}");
    bucket
        .store
        .put(&key, PutPayload::from(original))
        .await
        .unwrap();

    // An object that is no snapshot file, or bytes beyond the manifest's: refused unread.
    let stray = root.clone().join(".hidden");
    bucket
        .store
        .put(&stray, PutPayload::from(vec![0u8; 10]))
        .await
        .unwrap();
    let e = download_into(
        &bucket,
        area,
        &manifest.sha256,
        &local.path().join("b"),
        Arc::new(anything),
    )
    .await
    .unwrap_err();
    assert!(e.message().contains("no snapshot file"), "{e}");
    bucket.store.delete(&stray).await.unwrap();
    let extra = root.clone().join("extra.img");
    bucket
        .store
        .put(&extra, PutPayload::from(vec![0u8; 10]))
        .await
        .unwrap();
    let e = download_into(
        &bucket,
        area,
        &manifest.sha256,
        &local.path().join("c"),
        Arc::new(anything),
    )
    .await
    .unwrap_err();
    assert!(e.message().contains("its manifest says"), "{e}");
    bucket.remove(area, &manifest.sha256).await.unwrap();
}

/// A proxy to `upstream` that passes `budget` bytes from clients in all, then cuts every
/// connection: an object store that goes away halfway through an upload.
/// Its address, and the bytes it has still to pass.
async fn cutting_proxy(
    upstream: std::net::SocketAddr,
    budget: usize,
) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let left = Arc::new(AtomicUsize::new(budget));
    let remaining = Arc::clone(&left);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let left = Arc::clone(&left);
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let down = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                });
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(read) = client_read.read(&mut buffer).await {
                    let allowed = left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                            Some(l.saturating_sub(read))
                        })
                        .unwrap_or(0)
                        .min(read);
                    if read == 0
                        || server_write.write_all(&buffer[..allowed]).await.is_err()
                        || allowed < read
                    {
                        break;
                    }
                }
                down.abort();
            });
        }
    });
    (format!("http://{address}"), remaining)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_halfway_leaves_the_previous_snapshot_intact() {
    let Some(settings) = settings() else { return };
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("scripts/test.sh sets it");
    let upstream: std::net::SocketAddr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("AWS_ENDPOINT_URL is http://ADDRESS:PORT");
    let bucket = Bucket::open(&settings).await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let area = "machines/m-three/snapshot";
    let first = sealed_snapshot(&local.path().join("first"), 3);
    bucket
        .upload(area, &local.path().join("first"))
        .await
        .unwrap();

    // The next snapshot goes through a connection that dies after about half of it.
    let (proxy, left) = cutting_proxy(upstream, PART_BYTES + PART_BYTES / 2).await;
    let cut = Bucket::open(&settings.clone().with_endpoint(&proxy).with_max_retries(0))
        .await
        .unwrap();
    let second = sealed_snapshot(&local.path().join("second"), 4);
    let e = cut
        .upload(area, &local.path().join("second"))
        .await
        .unwrap_err();
    assert!(e.message().contains("snapshot bucket"), "{e}");
    // It failed because the connection died halfway, after 12 MiB of the snapshot went up.
    assert_eq!(
        left.load(Ordering::SeqCst),
        0,
        "the upload stopped before the cut: {e}"
    );

    // Only the first counts, and it comes back whole; the second is not there.
    assert_eq!(
        bucket.snapshots(area).await.unwrap(),
        vec![first.sha256.clone()]
    );
    let got = download_into(
        &bucket,
        area,
        &first.sha256,
        &local.path().join("restored"),
        Arc::new(anything),
    )
    .await
    .unwrap();
    assert_eq!(got, first);
    let missing = download_into(
        &bucket,
        area,
        &second.sha256,
        &local.path().join("other"),
        Arc::new(anything),
    )
    .await
    .unwrap_err();
    assert!(missing.message().contains("is not there"), "{missing}");
    bucket.remove(area, &first.sha256).await.unwrap();
    bucket.remove(area, &second.sha256).await.unwrap();
}

#[tokio::test]
async fn bad_urls_and_an_unreachable_bucket_are_clear_errors() {
    for bad in [
        "s3:/x",
        "http://bucket/x",
        "s3://UPPER",
        "s3://ab",
        "s3://b-b/../x",
        "s3://b-b/a//b",
    ] {
        let e = BucketSettings::parse(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}: {e}");
        assert!(e.message().contains("s3://BUCKET/PREFIX"), "{e}");
    }
    let fine = BucketSettings::parse("s3://snapshots.example/evervm/prod/").unwrap();
    assert_eq!(fine.url(), "s3://snapshots.example/evervm/prod");
    // Nothing listens on port 1 of loopback.
    let nowhere = fine
        .with_endpoint("http://127.0.0.1:1")
        .with_credentials("key", "secret")
        .with_max_retries(0);
    let e = Bucket::open(&nowhere).await.unwrap_err();
    assert!(
        e.message().contains("s3://snapshots.example/evervm/prod"),
        "{e}"
    );
    assert!(!e.message().contains("secret"), "{e}");
}

/// A sealed chunked snapshot in `dir` whose memory (`pages.img`) is `pages`, its chunks in
/// `chunks`.
fn chunked_snapshot(dir: &Path, chunks: &Arc<ChunkStore>, pages: &[u8]) -> SnapshotManifest {
    let staging = snapshot::staging_beside(dir).unwrap();
    std::fs::write(staging.join("pages.img"), pages).unwrap();
    std::fs::write(staging.join("pages.json"), b"{}").unwrap();
    let names = vec!["pages.img".to_owned()];
    let _pinned = chunks.put_files(&staging, &names, 1).unwrap();
    snapshot::commit_to(dir, &staging, "test-runtime", None).unwrap()
}

/// 512 pages of bytes that do not compress, the same for the same seed.
fn memory(seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..512 * 4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A chunk store on `home` and the bucket of `settings` with it.
async fn chunked_bucket(settings: &BucketSettings, home: &Path) -> (Arc<ChunkStore>, Bucket) {
    let store = ChunkStore::open(home).unwrap();
    let bucket = Bucket::open(settings)
        .await
        .unwrap()
        .with_chunks(Arc::clone(&store));
    (store, bucket)
}

/// The packs in the bucket and their sizes.
async fn packs_of(bucket: &Bucket) -> std::collections::BTreeMap<String, u64> {
    let root = bucket.area_root("chunks/packs").unwrap();
    let mut found = std::collections::BTreeMap::new();
    let mut listing = bucket.store.list(Some(&root));
    while let Some(object) = listing.next().await {
        let object = object.unwrap();
        found.insert(object.location.to_string(), object.size);
    }
    found
}

/// What `pages.img` of the chunked snapshot in `dir` holds, put back together from `chunks`.
fn memory_of(dir: &Path, chunks: &ChunkStore) -> Vec<u8> {
    let out = dir.with_extension("pages");
    chunks
        .materialize(&dir.join("pages.img.chunks"), &out)
        .unwrap();
    std::fs::read(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_snapshot_sends_only_the_chunks_the_bucket_lacks() {
    let Some(settings) = settings() else { return };
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store_a, bucket) = chunked_bucket(&settings, home_a.path()).await;
    let area = "machines/m-chunked/snapshot";
    let first_memory = memory(1);
    let first = chunked_snapshot(&home_a.path().join("first"), &store_a, &first_memory);
    bucket
        .upload(area, &home_a.path().join("first"))
        .await
        .unwrap();
    let after_first = packs_of(&bucket).await;
    assert_eq!(after_first.len(), 1, "{after_first:?}");
    let first_bytes: u64 = after_first.values().sum();
    assert!(first_bytes > 2_000_000, "{first_bytes}");

    // Three pages changed: one small pack more.
    let mut second_memory = first_memory.clone();
    for page in [3usize, 200, 511] {
        second_memory[page * 4096..(page + 1) * 4096].fill(page as u8);
    }
    let second = chunked_snapshot(&home_a.path().join("second"), &store_a, &second_memory);
    bucket
        .upload(area, &home_a.path().join("second"))
        .await
        .unwrap();
    let after_second = packs_of(&bucket).await;
    assert_eq!(after_second.len(), 2, "{after_second:?}");
    let sent = after_second.values().sum::<u64>() - first_bytes;
    assert!(
        sent < 64 * 1024,
        "the second save sent {sent} bytes of chunks"
    );

    // Another home brings both back, whole, from the bucket alone; a plain bucket (no
    // chunk store) refuses a chunked snapshot with a clear error.
    let (store_b, other) = chunked_bucket(&settings, home_b.path()).await;
    for (manifest, expected, name) in [
        (&second, &second_memory, "second"),
        (&first, &first_memory, "first"),
    ] {
        let into = home_b.path().join(name);
        let got = download_into(&other, area, &manifest.sha256, &into, Arc::new(anything))
            .await
            .unwrap();
        assert_eq!(&got, manifest);
        assert!(memory_of(&into, &store_b) == *expected, "{name}");
    }
    let plain = Bucket::open(&settings).await.unwrap();
    let refused = download_into(
        &plain,
        area,
        &first.sha256,
        &home_b.path().join("plain"),
        Arc::new(anything),
    )
    .await
    .unwrap_err();
    assert!(refused.message().contains("chunk store"), "{refused}");
    bucket.remove_area("machines").await.unwrap();
    bucket.remove_area("chunks").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_packs_are_condemned_then_removed_and_never_used_once_condemned() {
    let Some(settings) = settings() else { return };
    let grace = std::time::Duration::from_secs(4);
    let settings = settings.with_chunk_grace(grace);
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, bucket) = chunked_bucket(&settings, home_a.path()).await;
    let area = "machines/m-collected/snapshot";
    let pages = memory(2);
    let first = chunked_snapshot(&home_a.path().join("first"), &store, &pages);
    bucket
        .upload(area, &home_a.path().join("first"))
        .await
        .unwrap();
    let packs = packs_of(&bucket).await;
    assert_eq!(packs.len(), 1);

    // Named by a whole snapshot: never condemned, however old.
    tokio::time::sleep(grace + std::time::Duration::from_millis(500)).await;
    let kept = bucket.collect_chunks().await.unwrap();
    assert_eq!((kept.snapshots, kept.live_packs, kept.condemned), (1, 1, 0));

    // Unnamed: condemned by one pass, and an upload after that sends its chunks again.
    bucket.remove(area, &first.sha256).await.unwrap();
    let condemned = bucket.collect_chunks().await.unwrap();
    assert_eq!((condemned.condemned, condemned.removed), (1, 0));
    bucket
        .upload(area, &home_a.path().join("first"))
        .await
        .unwrap();
    assert_eq!(packs_of(&bucket).await.len(), 2);
    let waiting = bucket.collect_chunks().await.unwrap();
    assert_eq!((waiting.condemned, waiting.removed), (0, 0));

    // A grace period later the condemned pack goes; the snapshot still comes back whole.
    tokio::time::sleep(grace + std::time::Duration::from_millis(500)).await;
    let removed = bucket.collect_chunks().await.unwrap();
    assert_eq!((removed.removed, removed.live_packs), (1, 1), "{removed:?}");
    assert!(
        !packs_of(&bucket)
            .await
            .contains_key(packs.keys().next().unwrap())
    );
    let (store_b, other) = chunked_bucket(&settings, home_b.path()).await;
    let into = home_b.path().join("back");
    download_into(&other, area, &first.sha256, &into, Arc::new(anything))
        .await
        .unwrap();
    assert!(memory_of(&into, &store_b) == pages);
    bucket.remove_area("machines").await.unwrap();
    bucket.remove_area("chunks").await.unwrap();
}
