//! What the nodes of a cluster share in the bucket besides machines: the runsc binaries kept for
//! the snapshots they wrote (`runsc/DIGEST/{runsc,runsc.json}`), so that a node restores a
//! snapshot another node's runsc wrote, and the base snapshots pooled sandboxes start from
//! (`bases/NAME/SHA256`), so that a new node does not boot and warm up its own.

use std::path::Path;

use super::Bucket;
use crate::error::{Error, Result};
use crate::snapshot::{self, SnapshotManifest};

/// Where kept runsc binaries are in the bucket.
const RUNSC_AREA: &str = "runsc";
/// Larger than any runsc binary (about 60 MB).
const RUNSC_MAX_BYTES: u64 = 512 * 1024 * 1024;
const RUNSC_DESCRIPTION_MAX_BYTES: u64 = 64 * 1024;

/// Makes the home's kept runsc binaries (`<home>/runsc-bin/DIGEST/`) and the bucket's the same
/// set: the home's missing from the bucket are uploaded (the description last: it marks one
/// whole), the bucket's missing from the home downloaded and checked against their digest.
/// Called before the backend starts, which loads them.
pub async fn share_kept_runsc(bucket: &Bucket, home: &Path) -> Result<()> {
    let kept_dir = home.join("runsc-bin");
    let in_bucket = bucket.areas_under(RUNSC_AREA).await?;
    let local: Vec<String> = std::fs::read_dir(&kept_dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().join("runsc.json").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for digest in &local {
        let dir = kept_dir.join(digest);
        let area = format!("{RUNSC_AREA}/{digest}");
        if in_bucket.contains(digest) {
            continue;
        }
        bucket.put_file(&area, "runsc", &dir.join("runsc")).await?;
        bucket
            .put_file(&area, "runsc.json", &dir.join("runsc.json"))
            .await?;
        tracing::info!(digest, "shared a kept runsc through the bucket");
    }
    for digest in in_bucket.iter().filter(|d| !local.contains(d)) {
        if let Err(e) = fetch_runsc(bucket, &kept_dir, digest).await {
            tracing::warn!(digest, "cannot fetch a kept runsc from the bucket: {e}");
        }
    }
    Ok(())
}

/// Downloads one kept runsc into `<kept_dir>/DIGEST/`, checked against its digest.
async fn fetch_runsc(bucket: &Bucket, kept_dir: &Path, digest: &str) -> Result<()> {
    let area = format!("{RUNSC_AREA}/{digest}");
    let dir = kept_dir.join(digest);
    let scratch = kept_dir.join(format!(".tmp-{digest}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", scratch.display())))?;
    let fetched = async {
        let description = scratch.join("runsc.json");
        if !bucket
            .get_file(
                &area,
                "runsc.json",
                &description,
                RUNSC_DESCRIPTION_MAX_BYTES,
            )
            .await?
        {
            // Not whole in the bucket (its upload never finished).
            return Ok(false);
        }
        let binary = scratch.join("runsc");
        if !bucket
            .get_file(&area, "runsc", &binary, RUNSC_MAX_BYTES)
            .await?
        {
            return Ok(false);
        }
        let found = crate::sandbox::gvisor::binary_digest(&binary)?;
        if found != digest {
            return Err(Error::internal(format!(
                "the runsc kept in the bucket as {digest} has the digest {found}: not used"
            )));
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755))?;
        crate::fsutil::fsync_dir(&scratch)?;
        std::fs::rename(&scratch, &dir)?;
        crate::fsutil::fsync_dir(kept_dir)?;
        Ok::<_, Error>(true)
    }
    .await;
    if !matches!(fetched, Ok(true)) {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    if fetched? {
        tracing::info!(digest, "fetched a kept runsc from the bucket");
    }
    Ok(())
}

/// The area of a base snapshot (`dir` is `<home>/base/NAME`).
fn base_area(dir: &Path) -> Option<String> {
    dir.file_name()
        .map(|name| format!("bases/{}", name.to_string_lossy()))
}

/// Downloads into `dir` a base snapshot another node made, when the bucket has one that
/// `restorable` accepts and that was made from image `image_id`; its manifest.
pub async fn fetch_base(
    bucket: &Bucket,
    dir: &Path,
    image_id: Option<&str>,
    restorable: std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>,
) -> Result<Option<SnapshotManifest>> {
    let Some(area) = base_area(dir) else {
        return Ok(None);
    };
    for sha256 in bucket.snapshots(&area).await? {
        let staging = snapshot::staging_beside(dir)?;
        let downloaded = bucket
            .download(&area, &sha256, &staging, restorable.clone())
            .await;
        match downloaded {
            Ok(downloaded) if downloaded.manifest.image_id.as_deref() == image_id => {
                let target = dir.to_path_buf();
                let installed = {
                    let staging = staging.clone();
                    tokio::task::spawn_blocking(move || snapshot::install_at(&staging, &target))
                        .await
                        .map_err(|e| Error::internal(format!("installing stopped: {e}")))?
                };
                if installed.is_err() {
                    let _ = std::fs::remove_dir_all(&staging);
                }
                installed?;
                return Ok(Some(downloaded.manifest));
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(
                area,
                "a base snapshot in the bucket is not for this node: {e}"
            ),
        }
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(None)
}

/// Uploads a base snapshot this node made, for the others.
pub async fn share_base(bucket: &Bucket, dir: &Path) {
    let Some(area) = base_area(dir) else {
        return;
    };
    if let Err(e) = bucket.upload(&area, dir).await {
        tracing::warn!(
            area,
            "cannot share the base snapshot through the bucket: {e}"
        );
    }
}
