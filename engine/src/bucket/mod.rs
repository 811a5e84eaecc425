//! Snapshots in an S3-compatible bucket (`--snapshots s3://BUCKET/PREFIX`), through the
//! `object_store` crate, with credentials and the endpoint from the standard `AWS_*`
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP` for a plain-HTTP endpoint).
//!
//! A snapshot is a directory of files with a manifest (see [`crate::snapshot`]). In the bucket
//! it is kept under its own checksum, `PREFIX/AREA/SHA256/FILE`, where AREA names what it is
//! (`machines/NAME/snapshot`, a checkpoint, a base snapshot): every upload writes new keys and
//! never overwrites an object another snapshot uses. The manifest goes last, so a snapshot
//! counts only once it is complete in the bucket: an upload that stops halfway leaves objects
//! without a manifest, which nothing reads, and the previous snapshot as it was. A download
//! checks the manifest against the checksum it was asked for, refuses objects that are not
//! snapshot files or that add up to more than the manifest says, and checks every byte against
//! the manifest's SHA-256 before the snapshot is used.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::chunks::{ChunkStore, Pinned};
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::{self, SnapshotManifest};

pub use chunks::{BucketCollected, DEFAULT_GRACE};

/// A snapshot downloaded: its manifest, and (a chunked one) its chunks in the home's store,
/// kept from collection until this is dropped (once the snapshot is installed).
pub struct Downloaded {
    pub manifest: SnapshotManifest,
    _pinned: Option<Pinned>,
}

/// Files up to this size go up in one request; larger ones in parts of this size.
const PART_BYTES: usize = 8 * 1024 * 1024;
/// Parts of one file in flight at once: an upload holds at most this many parts in memory.
const PARTS_IN_FLIGHT: usize = 2;
/// A manifest is a few hundred bytes; a larger object under its name is refused unread.
const MANIFEST_MAX_BYTES: u64 = 64 * 1024;
/// How long the first request to the bucket may take before the start fails.
const REACH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where snapshots are kept: a bucket and a prefix in it, and how to reach it.
#[derive(Clone)]
pub struct BucketSettings {
    bucket: String,
    prefix: String,
    /// The endpoint, when not the one of the environment (`AWS_ENDPOINT_URL`).
    endpoint: Option<String>,
    /// An access key and its secret, when not those of the environment.
    credentials: Option<(String, String)>,
    /// How often a failed request is tried again (`object_store`'s default when `None`).
    max_retries: Option<usize>,
    /// How long an unused chunk pack waits before it is condemned, and condemned before it is
    /// removed ([`chunks`]).
    chunk_grace: Duration,
}

impl std::fmt::Debug for BucketSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketSettings")
            .field("url", &self.url())
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl BucketSettings {
    /// From `s3://BUCKET` or `s3://BUCKET/PREFIX`.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "--snapshots {url:?}: {why}; expected s3://BUCKET/PREFIX (the endpoint and \
                 credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY)"
            ))
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3:// URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && bucket
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric());
        if !valid_bucket {
            return Err(bad(
                "a bucket name is 3 to 63 lowercase letters, digits, dots and hyphens",
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        let valid_prefix = prefix.is_empty()
            || prefix.split('/').all(|segment| {
                !segment.is_empty()
                    && segment != "."
                    && segment != ".."
                    && segment
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            });
        if !valid_prefix {
            return Err(bad(
                "the prefix is segments of letters, digits, '-', '_' and '.' separated by '/'",
            ));
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            endpoint: None,
            credentials: None,
            max_retries: None,
            chunk_grace: chunks::DEFAULT_GRACE,
        })
    }

    /// Reaches the bucket at `endpoint` (plain HTTP allowed) instead of the environment's.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = Some(endpoint.to_owned());
        self
    }

    /// Signs with this access key instead of the environment's (a session token in the
    /// environment, `AWS_SESSION_TOKEN`, still goes with it).
    #[must_use]
    pub fn with_credentials(mut self, access_key: &str, secret: &str) -> Self {
        self.credentials = Some((access_key.to_owned(), secret.to_owned()));
        self
    }

    /// Tries a failed request again at most `retries` times.
    #[must_use]
    pub fn with_max_retries(mut self, retries: usize) -> Self {
        self.max_retries = Some(retries);
        self
    }

    /// Collects unused chunk packs after `grace` (twice: condemned, then removed) instead of
    /// [`chunks::DEFAULT_GRACE`]; uploads must finish within half of it. For tests.
    #[must_use]
    pub fn with_chunk_grace(mut self, grace: Duration) -> Self {
        self.chunk_grace = grace;
        self
    }

    /// The same bucket, another prefix (a test's own corner of a shared bucket).
    #[must_use]
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        prefix.trim_matches('/').clone_into(&mut self.prefix);
        self
    }

    /// `s3://BUCKET/PREFIX`, for logs and errors.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// The bucket snapshots are kept in.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    root: ObjectPath,
    url: String,
    /// The home's chunk store, which chunked snapshots go up from and come down into.
    chunks: Option<Arc<ChunkStore>>,
    /// What this node knows of the bucket's chunk packs.
    known: Arc<tokio::sync::Mutex<chunks::Known>>,
    grace: Duration,
    /// Bytes of objects this node has stored in the bucket.
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Bucket {
    /// Connects to the bucket and checks that it answers (a list of the prefix) within 10 s.
    pub async fn open(settings: &BucketSettings) -> Result<Self> {
        let url = settings.url();
        // object_store's client brings no crypto of its own (Cargo.toml): ring, process-wide.
        // An error only says a provider is installed already, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&settings.bucket);
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.with_endpoint(endpoint).with_allow_http(true);
        }
        if let Some((key, secret)) = &settings.credentials {
            builder = builder
                .with_access_key_id(key)
                .with_secret_access_key(secret);
        }
        if let Some(max_retries) = settings.max_retries {
            builder = builder.with_retry(object_store::RetryConfig {
                max_retries,
                ..Default::default()
            });
        }
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            // Any region signs for an endpoint of one's own; AWS itself redirects a wrong one.
            builder = builder.with_region("us-east-1");
        }
        let store = builder.build().map_err(|e| {
            Error::invalid(format!(
                "--snapshots {url}: {e} (the endpoint and credentials come from \
                 AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            ))
        })?;
        let bucket = Self {
            store: Arc::new(store),
            root: ObjectPath::from(settings.prefix.as_str()),
            url,
            chunks: None,
            known: Arc::default(),
            grace: settings.chunk_grace,
            sent: Arc::default(),
        };
        let probe = bucket.store.list_with_delimiter(Some(&bucket.root));
        match tokio::time::timeout(REACH_TIMEOUT, probe).await {
            Ok(Ok(_)) => Ok(bucket),
            Ok(Err(e)) => Err(Error::internal(format!(
                "the snapshot bucket {} cannot be used: {e} (check AWS_ENDPOINT_URL, the \
                 credentials and that the bucket exists)",
                bucket.url
            ))),
            Err(_) => Err(Error::internal(format!(
                "the snapshot bucket {} did not answer within {} s (check AWS_ENDPOINT_URL)",
                bucket.url,
                REACH_TIMEOUT.as_secs()
            ))),
        }
    }

    /// The same bucket, chunked snapshots going up from and coming down into `chunks`.
    #[must_use]
    pub fn with_chunks(mut self, chunks: Arc<ChunkStore>) -> Self {
        self.chunks = Some(chunks);
        self
    }

    /// How many bytes of objects this node has stored in the bucket (snapshots, packs,
    /// manifests).
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stores a small object whole.
    async fn put_small(&self, key: &ObjectPath, bytes: Vec<u8>, doing: &str) -> Result<()> {
        let len = bytes.len() as u64;
        self.store
            .put(key, PutPayload::from(bytes))
            .await
            .map_err(|e| self.failed(doing, &e))?;
        self.sent
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `PREFIX/AREA`, AREA's segments checked as bucket key parts.
    fn area_root(&self, area: &str) -> Result<ObjectPath> {
        area.split('/')
            .try_fold(self.root.clone(), |path, segment| {
                let part = object_store::path::PathPart::parse(segment).map_err(|e| {
                    Error::internal(format!("{segment:?} cannot be part of a bucket key: {e}"))
                })?;
                Ok(path.join(part))
            })
    }

    /// The place of one snapshot: `PREFIX/AREA/SHA256`.
    fn snapshot_root(&self, area: &str, sha256: &str) -> Result<ObjectPath> {
        self.area_root(&format!("{area}/{sha256}"))
    }

    fn failed(&self, doing: &str, e: &object_store::Error) -> Error {
        Error::internal(format!("{doing} in the snapshot bucket {}: {e}", self.url))
    }

    /// Uploads the sealed snapshot in `dir` (manifest included) as AREA's snapshot of its
    /// checksum, the manifest last; its manifest. An upload of a snapshot the bucket already
    /// holds whole sends nothing; one that fails removes what it sent.
    pub async fn upload(&self, area: &str, dir: &Path) -> Result<SnapshotManifest> {
        let manifest_text = tokio::fs::read(dir.join(snapshot::MANIFEST))
            .await
            .map_err(|e| Error::internal(format!("reading {}'s manifest: {e}", dir.display())))?;
        let manifest = snapshot::parse_manifest(&manifest_text, &|_| true)?;
        let root = self.snapshot_root(area, &manifest.sha256)?;
        let manifest_key = root.clone().join(snapshot::MANIFEST);
        match self.store.head(&manifest_key).await {
            Ok(_) => return Ok(manifest),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.failed("looking for a snapshot", &e)),
        }
        let files = {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || snapshot::snapshot_files(&dir))
                .await
                .map_err(|e| Error::internal(format!("listing a snapshot stopped: {e}")))??
        };
        let chunked = files
            .iter()
            .any(|name| crate::chunks::chunked_name(name).is_some());
        let sent = async {
            let planned = if chunked {
                Some(self.upload_chunks(dir, &root).await?)
            } else {
                None
            };
            for name in &files {
                self.upload_file(&dir.join(name), &root.clone().join(name.as_str()))
                    .await?;
            }
            // A fork's mark (its first restore reseeds the interpreter) goes with it.
            if snapshot::needs_reseed(dir) {
                self.upload_file(
                    &dir.join(snapshot::RESEED),
                    &root.clone().join(snapshot::RESEED),
                )
                .await?;
            }
            if let Some((planned, _pinned)) = &planned
                && !self.plan_still_valid(*planned)
            {
                return Err(Error::internal(format!(
                    "the upload took longer than half the chunk grace period ({} s), so its \
                     chunks may have been collected meanwhile: it is tried again with the next \
                     save",
                    self.grace.as_secs() / 2
                )));
            }
            self.put_small(
                &manifest_key,
                manifest_text.clone(),
                "storing a snapshot's manifest",
            )
            .await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = sent {
            self.remove_under(&root).await;
            return Err(e.context(format!("uploading the snapshot {area}")));
        }
        Ok(manifest)
    }

    /// Streams one file to `key`: in one request when small, else in parts, a few at a time.
    async fn upload_file(&self, path: &Path, key: &ObjectPath) -> Result<()> {
        let read_failed = |e: std::io::Error| {
            Error::internal(format!("reading {} to upload it: {e}", path.display()))
        };
        let mut file = tokio::fs::File::open(path).await.map_err(read_failed)?;
        let size = file.metadata().await.map_err(read_failed)?.len();
        if size <= PART_BYTES as u64 {
            let mut data = Vec::with_capacity(size as usize);
            file.read_to_end(&mut data).await.map_err(read_failed)?;
            return self.put_small(key, data, "storing a snapshot file").await;
        }
        let upload = self
            .store
            .put_multipart(key)
            .await
            .map_err(|e| self.failed("starting an upload", &e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buffer = vec![0u8; 1024 * 1024];
        let streamed = async {
            loop {
                let read = file.read(&mut buffer).await.map_err(read_failed)?;
                if read == 0 {
                    return Ok(());
                }
                writer
                    .wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map_err(|e| self.failed("uploading a part", &e))?;
                writer.write(&buffer[..read]);
            }
        }
        .await;
        match streamed {
            Ok(()) => {
                writer
                    .finish()
                    .await
                    .map_err(|e| self.failed("completing an upload", &e))?;
                self.sent
                    .fetch_add(size, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let _ = writer.abort().await;
                Err(e)
            }
        }
    }

    /// Downloads AREA's snapshot with checksum `sha256` into `into` (an empty directory) and
    /// checks it: its manifest must be there, name that checksum and a runtime `restorable`
    /// accepts, every object must be a snapshot file, and the bytes must match. The chunks a
    /// chunked snapshot names and the home lacks are brought into the home's store.
    pub async fn download(
        &self,
        area: &str,
        sha256: &str,
        into: &Path,
        restorable: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Result<Downloaded> {
        let root = self.snapshot_root(area, sha256)?;
        let missing = |what: String| {
            Error::new(
                ErrorKind::MachineCrashed,
                format!(
                    "the snapshot {area} ({}) in {} {what}",
                    short(sha256),
                    self.url
                ),
            )
        };
        let manifest_key = root.clone().join(snapshot::MANIFEST);
        let got = match self.store.get(&manifest_key).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(missing(
                    "is not there (or its upload never finished)".into(),
                ));
            }
            Err(e) => return Err(self.failed("reading a snapshot's manifest", &e)),
        };
        if got.meta.size > MANIFEST_MAX_BYTES {
            return Err(missing(format!(
                "has a manifest of {} bytes, more than a manifest can be",
                got.meta.size
            )));
        }
        let manifest_text = got
            .bytes()
            .await
            .map_err(|e| self.failed("reading a snapshot's manifest", &e))?;
        let manifest = snapshot::parse_manifest(&manifest_text, &*restorable)
            .map_err(|e| missing(format!("cannot be used: {}", e.message())))?;
        if manifest.sha256 != sha256 {
            return Err(missing(format!(
                "has a manifest for another snapshot ({})",
                short(&manifest.sha256)
            )));
        }
        let mut objects = Vec::new();
        let mut reseed = None;
        let mut listing = self.store.list(Some(&root));
        while let Some(object) = listing.next().await {
            let object = object.map_err(|e| self.failed("listing a snapshot", &e))?;
            let name = parts_under(&root, &object.location);
            let [name] = name.as_slice() else {
                return Err(missing(format!(
                    "holds {}, which is no snapshot file",
                    object.location
                )));
            };
            if name == snapshot::MANIFEST {
                continue;
            }
            if name == snapshot::RESEED {
                reseed = Some(object.location);
                continue;
            }
            if name == chunks::CHUNK_PACKS {
                continue;
            }
            if !snapshot::is_snapshot_file(name) {
                return Err(missing(format!(
                    "holds {name:?}, which is no snapshot file"
                )));
            }
            objects.push((name.clone(), object.location, object.size));
        }
        let total: u64 = objects.iter().map(|(_, _, size)| size).sum();
        if total != manifest.bytes {
            return Err(missing(format!(
                "holds {total} bytes, its manifest says {}",
                manifest.bytes
            )));
        }
        for (name, key, _) in &objects {
            self.download_file(key, &into.join(name)).await?;
        }
        if reseed.is_some() {
            snapshot::mark_reseed(into)?;
        }
        crate::fsutil::write_durably(&into.join(snapshot::MANIFEST), &manifest_text)?;
        let checked = {
            let (into, manifest) = (into.to_path_buf(), manifest.clone());
            tokio::task::spawn_blocking(move || {
                snapshot::check_files(&into, &manifest)?;
                crate::fsutil::fsync_dir(&into)
            })
        };
        checked
            .await
            .map_err(|e| Error::internal(format!("checking a snapshot stopped: {e}")))?
            .map_err(|e| missing(format!("does not match its manifest: {}", e.message())))?;
        let chunked = objects
            .iter()
            .any(|(name, _, _)| crate::chunks::chunked_name(name).is_some());
        let pinned = if chunked {
            Some(
                self.download_chunks(into)
                    .await
                    .map_err(|e| missing(format!("cannot be put together: {}", e.message())))?,
            )
        } else {
            None
        };
        Ok(Downloaded {
            manifest,
            _pinned: pinned,
        })
    }

    /// Streams one object to a new file at `path` (owner-only, synced).
    async fn download_file(&self, key: &ObjectPath, path: &Path) -> Result<()> {
        let write_failed =
            |e: std::io::Error| Error::internal(format!("writing {}: {e}", path.display()));
        let got = self
            .store
            .get(key)
            .await
            .map_err(|e| self.failed("reading a snapshot file", &e))?;
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .await
            .map_err(write_failed)?;
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.failed("reading a snapshot file", &e))?;
            file.write_all(&chunk).await.map_err(write_failed)?;
        }
        file.sync_all().await.map_err(write_failed)
    }

    /// The checksums of AREA's snapshots that are whole in the bucket (their manifest is
    /// there).
    pub async fn snapshots(&self, area: &str) -> Result<Vec<String>> {
        let root = self.area_root(area)?;
        let mut whole = Vec::new();
        let mut listing = self.store.list(Some(&root));
        while let Some(object) = listing.next().await {
            let object = object.map_err(|e| self.failed("listing snapshots", &e))?;
            let parts = parts_under(&root, &object.location);
            if let [sha, name] = parts.as_slice()
                && name == snapshot::MANIFEST
            {
                whole.push(sha.clone());
            }
        }
        whole.sort();
        Ok(whole)
    }

    /// The areas right below AREA that hold a whole snapshot, with its checksum (one pair per
    /// snapshot).
    pub async fn whole_under(&self, area: &str) -> Result<Vec<(String, String)>> {
        let root = self.area_root(area)?;
        let mut whole = Vec::new();
        let mut listing = self.store.list(Some(&root));
        while let Some(object) = listing.next().await {
            let object = object.map_err(|e| self.failed("listing snapshots", &e))?;
            if let [child, sha, name] = parts_under(&root, &object.location).as_slice()
                && name == snapshot::MANIFEST
            {
                whole.push((child.clone(), sha.clone()));
            }
        }
        whole.sort();
        Ok(whole)
    }

    /// Removes AREA's snapshot with checksum `sha256` (what of it is there).
    pub async fn remove(&self, area: &str, sha256: &str) -> Result<()> {
        let root = self.snapshot_root(area, sha256)?;
        // The manifest first: from then on the snapshot no longer counts, whatever is left.
        match self
            .store
            .delete(&root.clone().join(snapshot::MANIFEST))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.failed("removing a snapshot", &e)),
        }
        self.remove_under(&root).await;
        Ok(())
    }

    /// Uploads one plain file (not a snapshot: a kept runsc binary, its description) to
    /// `AREA/NAME`.
    pub async fn put_file(&self, area: &str, name: &str, path: &Path) -> Result<()> {
        let key = self.area_root(&format!("{area}/{name}"))?;
        self.upload_file(path, &key).await
    }

    /// Downloads the plain file `AREA/NAME` into a new file at `path` (synced), refusing one
    /// larger than `max_bytes`; false when the bucket has no such file.
    pub async fn get_file(
        &self,
        area: &str,
        name: &str,
        path: &Path,
        max_bytes: u64,
    ) -> Result<bool> {
        let key = self.area_root(&format!("{area}/{name}"))?;
        match self.store.head(&key).await {
            Ok(meta) if meta.size > max_bytes => Err(Error::internal(format!(
                "{key} in {} holds {} bytes, more than the {max_bytes} it may",
                self.url, meta.size
            ))),
            Ok(_) => self.download_file(&key, path).await.map(|()| true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.failed("looking for a file", &e)),
        }
    }

    /// The names of the areas right below AREA (the digests under `runsc`, say).
    pub async fn areas_under(&self, area: &str) -> Result<Vec<String>> {
        let root = self.area_root(area)?;
        let listed = self
            .store
            .list_with_delimiter(Some(&root))
            .await
            .map_err(|e| self.failed("listing", &e))?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| parts_under(&root, p).into_iter().next())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Removes every snapshot of AREA and of the areas below it (a deleted machine's), as far as
    /// the bucket lets it.
    pub async fn remove_area(&self, area: &str) -> Result<()> {
        let root = self.area_root(area)?;
        self.remove_under(&root).await;
        Ok(())
    }

    /// Removes every object under `root`, as far as the bucket lets it (what is left is
    /// unreferenced: no manifest names it).
    async fn remove_under(&self, root: &ObjectPath) {
        let mut listing = self.store.list(Some(root));
        while let Some(object) = listing.next().await {
            match object {
                Ok(object) => {
                    if let Err(e) = self.store.delete(&object.location).await {
                        tracing::warn!("cannot remove {} from {}: {e}", object.location, self.url);
                    }
                }
                Err(e) => {
                    tracing::warn!("cannot list {root} in {}: {e}", self.url);
                    return;
                }
            }
        }
    }
}

/// The segments of `location` below `root` (none when it is not below it).
fn parts_under(root: &ObjectPath, location: &ObjectPath) -> Vec<String> {
    location
        .prefix_match(root)
        .map(|parts| parts.map(|p| p.as_ref().to_owned()).collect())
        .unwrap_or_default()
}

/// The first characters of a checksum, for messages.
fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

mod chunks;
mod kept;
pub use kept::{fetch_base, share_base, share_kept_runsc};

#[cfg(test)]
mod tests;
