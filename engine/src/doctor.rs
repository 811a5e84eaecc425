//! `evervm doctor`: whether this host can serve machines, each need checked by trying it where
//! that is possible (a real gVisor sandbox, a real `unshare`), and the fix named for each that
//! fails. The sandbox it starts lives in a directory of its own, removed afterwards, so a server
//! running on the home is not disturbed; like a server's start, it builds the `minimal` image
//! that sandbox runs when the images directory has none.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::engine::{BackendChoice, EngineConfig};
use crate::guest::image::{ImageBuilder, Profile, StderrProgress};
use crate::sandbox::gvisor::GvisorBackend;

/// Below this much free space in the home, machines cannot be swapped out for long.
const DISK_FAIL_BYTES: u64 = 512 << 20;
/// Below this, a few large snapshots fill the disk.
const DISK_WARN_BYTES: u64 = 5 << 30;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, with a limit worth knowing (a feature that will not be available, a low margin).
    Warn,
    /// The server cannot serve (on the backend asked for) until this is fixed.
    Fail,
}

/// One checked need: what was found, and what to do when it is not right.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn not_ok(
        name: &'static str,
        status: Status,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name,
            status,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Every check, in the order a reader fixes things: the home, its disk, the sandbox runtime, the
/// kernel's features, the images, then the shared services the configuration names.
pub async fn doctor(config: &EngineConfig) -> Vec<Check> {
    let process_only = matches!(&config.backend, BackendChoice::Named(name) if name == "process");
    let mut checks = vec![check_home(&config.home), check_disk(&config.home)];
    let runsc = check_runsc(config, process_only).await;
    let sandboxes_run = runsc.status != Status::Fail;
    checks.push(runsc);
    checks.push(check_cgroups());
    checks.push(check_namespaces(process_only));
    checks.push(check_network_tools());
    if sandboxes_run || !process_only {
        checks.push(check_images(config));
    }
    checks.push(check_secret_key(config));
    if let Some(database) = &config.database {
        checks.push(check_database(database).await);
    }
    if let Some(snapshots) = &config.snapshots {
        checks.push(match crate::bucket::Bucket::open(snapshots).await {
            Ok(bucket) => Check::ok("bucket", format!("{} answers", bucket.url())),
            Err(e) => Check::not_ok(
                "bucket",
                Status::Fail,
                e.message().to_owned(),
                "start the S3 server or correct --snapshots and AWS_ENDPOINT_URL, \
                 AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY",
            ),
        });
    }
    checks
}

fn check_home(home: &Path) -> Check {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(home) else {
        let parent = nearest_existing(home);
        return match parent.as_deref().map(writable) {
            Some(true) => Check::ok(
                "home",
                format!("{} (made at the first start)", home.display()),
            ),
            _ => Check::not_ok(
                "home",
                Status::Fail,
                format!("{} does not exist and cannot be made here", home.display()),
                "choose a home you may write: --home DIR or EVERVM_HOME",
            ),
        };
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mode = meta.mode() & 0o777;
    if !meta.is_dir() {
        return Check::not_ok(
            "home",
            Status::Fail,
            format!("{} is not a directory", home.display()),
            "choose a directory: --home DIR or EVERVM_HOME",
        );
    }
    if meta.uid() != uid {
        return Check::not_ok(
            "home",
            Status::Fail,
            format!(
                "{} belongs to uid {}, not to this user ({uid})",
                home.display(),
                meta.uid()
            ),
            format!("chown -R {uid} {}", home.display()),
        );
    }
    if mode & 0o022 != 0 {
        return Check::not_ok(
            "home",
            Status::Fail,
            format!(
                "{} is writable by others (mode {mode:o}): its database holds token hashes and \
                 machines' state",
                home.display()
            ),
            format!("chmod 700 {}", home.display()),
        );
    }
    if !writable(home) {
        return Check::not_ok(
            "home",
            Status::Fail,
            format!("{} cannot be written", home.display()),
            "check the file system is mounted read-write and not full",
        );
    }
    Check::ok("home", format!("{} (mode {mode:o})", home.display()))
}

fn check_disk(home: &Path) -> Check {
    let Some(existing) = nearest_existing(home) else {
        return Check::not_ok(
            "disk",
            Status::Warn,
            "no part of the home's path exists",
            "choose a home: --home DIR",
        );
    };
    match crate::fsutil::free_bytes(&existing) {
        Ok(free) if free < DISK_FAIL_BYTES => Check::not_ok(
            "disk",
            Status::Fail,
            format!("{} free under {}", human(free), existing.display()),
            "free space there, or put the home on a larger disk (snapshots of idle machines \
             are kept there)",
        ),
        Ok(free) if free < DISK_WARN_BYTES => Check::not_ok(
            "disk",
            Status::Warn,
            format!("{} free under {}", human(free), existing.display()),
            "a machine's snapshot takes 10-200 MB: give the home a few GB",
        ),
        Ok(free) => Check::ok(
            "disk",
            format!("{} free under {}", human(free), existing.display()),
        ),
        Err(e) => Check::not_ok(
            "disk",
            Status::Warn,
            e.message().to_owned(),
            "check the home's file system",
        ),
    }
}

/// Starts a real sandbox exactly as the server would (the engine's own probe), in a directory
/// of its own so that a server running on the home is not disturbed.
async fn check_runsc(config: &EngineConfig, process_only: bool) -> Check {
    let scratch = std::env::temp_dir().join(format!("evervm-doctor-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let mut gvisor = crate::engine::gvisor_config(config, scratch.clone());
    gvisor.precreated = 0;
    let opened = GvisorBackend::open(gvisor, Arc::new(StderrProgress::default())).await;
    let _ = std::fs::remove_dir_all(&scratch);
    let severity = if process_only {
        Status::Warn
    } else {
        Status::Fail
    };
    match opened {
        Ok(backend) => {
            let runsc = backend.runsc();
            let linking = match elf_is_static(&runsc.path) {
                Some(true) => "static",
                Some(false) => "dynamically linked",
                None => "not an ELF file I can read",
            };
            let saves = if runsc.leave_running {
                "saves in place"
            } else {
                "stops to save (an old runsc: forks and checkpoints pause the machine)"
            };
            Check::ok(
                "runsc",
                format!(
                    "{}: {}, platform {}, {linking}, {saves}; a sandbox ran",
                    runsc.path.display(),
                    runsc.version,
                    runsc.platform
                ),
            )
        }
        Err(e) => Check::not_ok(
            "runsc",
            severity,
            format!("no gVisor sandbox runs here: {}", e.message()),
            "scripts/runsc.sh builds the pinned runsc into ~/.cache/evervm/runsc/ (or \
             `apt-get install runsc`, or EVERVM_RUNSC=PATH); gVisor needs root",
        ),
    }
}

fn check_cgroups() -> Check {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").ok();
    match v2 {
        Some(controllers) if controllers.split_whitespace().any(|c| c == "memory") => {
            Check::ok("cgroups", "cgroup v2 with the memory controller")
        }
        Some(_) => Check::not_ok(
            "cgroups",
            Status::Warn,
            "cgroup v2 without the memory controller: a machine's memory is limited by \
             RLIMIT_AS only",
            "enable the memory controller (systemd does by default; in a container, give it \
             its own cgroup namespace)",
        ),
        None if Path::new("/sys/fs/cgroup/memory").is_dir() => {
            Check::ok("cgroups", "cgroup v1 with the memory controller")
        }
        None => Check::not_ok(
            "cgroups",
            Status::Warn,
            "no cgroup file system at /sys/fs/cgroup: a machine's memory is limited by \
             RLIMIT_AS only",
            "mount cgroup2 at /sys/fs/cgroup",
        ),
    }
}

/// The namespaces the process backend makes, made for real by util-linux `unshare`.
fn check_namespaces(process_only: bool) -> Check {
    let severity = if process_only {
        Status::Fail
    } else {
        Status::Warn
    };
    let made = std::process::Command::new("unshare")
        .args(crate::sandbox::process::NAMESPACE_ARGS)
        .args(["--", "true"])
        .stdin(std::process::Stdio::null())
        .output();
    match made {
        Ok(out) if out.status.success() => Check::ok(
            "namespaces",
            "user, pid, mount, network, IPC and UTS namespaces can be made",
        ),
        Ok(out) => Check::not_ok(
            "namespaces",
            severity,
            format!(
                "unshare failed: {} (the process backend cannot run)",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            "allow user namespaces: sysctl kernel.unprivileged_userns_clone=1 and \
             user.max_user_namespaces > 0",
        ),
        Err(e) => Check::not_ok(
            "namespaces",
            severity,
            format!("cannot run unshare: {e}"),
            "apt-get install util-linux",
        ),
    }
}

fn check_network_tools() -> Check {
    let missing: Vec<&str> = ["ip", "nft"]
        .into_iter()
        .filter(|tool| crate::sandbox::process::find_on_path(tool).is_none())
        .collect();
    if missing.is_empty() {
        Check::ok(
            "network",
            "ip and nft found (machines may be given a network)",
        )
    } else {
        Check::not_ok(
            "network",
            Status::Warn,
            format!(
                "{} not found: machines without a network run, machines with one do not",
                missing.join(" and ")
            ),
            "apt-get install iproute2 nftables",
        )
    }
}

fn check_images(config: &EngineConfig) -> Check {
    let builder = ImageBuilder::new(config.images_dir.clone());
    let mut built = Vec::new();
    let mut missing = Vec::new();
    for profile in [Profile::Minimal, config.default_image.clone()] {
        if built
            .iter()
            .chain(&missing)
            .any(|p: &String| p == profile.as_str())
        {
            continue;
        }
        match builder.find_built(&profile) {
            Ok(Some(_)) => built.push(profile.as_str().to_owned()),
            _ => missing.push(profile.as_str().to_owned()),
        }
    }
    if missing.is_empty() {
        Check::ok(
            "images",
            format!(
                "{} built in {}",
                built.join(", "),
                config.images_dir.display()
            ),
        )
    } else {
        Check::not_ok(
            "images",
            Status::Warn,
            format!(
                "{} not built yet in {}: the first machine on it waits for the build (about a \
                 minute, with Debian's and PyPI's packages downloaded)",
                missing.join(", "),
                config.images_dir.display()
            ),
            missing
                .iter()
                .map(|p| format!("evervm image build --profile {p}"))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }
}

/// The key secrets are sealed with: given and usable, given and broken (the server would not
/// start), or none (said, not failed: sealing is the operator's choice).
fn check_secret_key(config: &EngineConfig) -> Check {
    let keys = match &config.secret_keys {
        Some(keys) => Ok(Some(std::sync::Arc::clone(keys))),
        None => crate::secrets::SecretKeys::from_env(),
    };
    match keys {
        Ok(Some(keys)) => Check::ok(
            "secrets",
            format!(
                "secrets are sealed in the store with key {}",
                keys.current_id()
            ),
        ),
        Ok(None) => Check::ok(
            "secrets",
            "none given: machines' secret environment values are stored as given (set \
             EVERVM_SECRET_KEY to seal them)",
        ),
        Err(e) => Check::not_ok(
            "secrets",
            Status::Fail,
            e.message().to_owned(),
            "set EVERVM_SECRET_KEY to 64 hex digits (`evervm secret-key generate`), or unset it",
        ),
    }
}

async fn check_database(database: &crate::store::PostgresSettings) -> Check {
    match crate::store::PostgresStore::reach(database).await {
        Ok(version) => Check::ok(
            "database",
            format!("{} answers ({version})", database.redacted()),
        ),
        Err(e) => Check::not_ok(
            "database",
            Status::Fail,
            e.message().to_owned(),
            "start PostgreSQL or correct --database (postgres://USER:PASSWORD@HOST:PORT/DB)",
        ),
    }
}

/// Whether an ELF file names no program interpreter (a static executable); `None` when it is not
/// an ELF file this reads (64-bit, little-endian).
pub fn elf_is_static(path: &Path) -> Option<bool> {
    use std::io::{Read, Seek, SeekFrom};
    const PT_INTERP: u32 = 3;
    let mut file = std::fs::File::open(path).ok()?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at =
        |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    let phoff = u64::from_le_bytes(header.get(32..40)?.try_into().ok()?);
    let phentsize = usize::from(u16_at(&header, 54)?);
    let phnum = usize::from(u16_at(&header, 56)?);
    if phentsize < 4 || phnum > 4096 {
        return None;
    }
    file.seek(SeekFrom::Start(phoff)).ok()?;
    let mut table = vec![0u8; phentsize.checked_mul(phnum)?];
    file.read_exact(&mut table).ok()?;
    Some(!table.chunks_exact(phentsize).any(|entry| {
        entry
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            == Some(PT_INTERP)
    }))
}

fn nearest_existing(path: &Path) -> Option<PathBuf> {
    path.ancestors().find(|p| p.exists()).map(Path::to_owned)
}

fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".evervm-doctor-{}", std::process::id()));
    let made = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    made
}

fn human(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_binary_is_read_as_elf_and_a_text_file_is_not() {
        let exe = std::env::current_exe().unwrap();
        assert!(
            elf_is_static(&exe).is_some(),
            "{} read as ELF",
            exe.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t");
        std::fs::write(&text, "#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(elf_is_static(&text), None);
        // A header claiming a program table far past the file's end is not read.
        let mut forged = b"\x7fELF\x02\x01".to_vec();
        forged.resize(64, 0);
        forged[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        forged[54] = 56;
        forged[56] = 1;
        std::fs::write(&text, &forged).unwrap();
        assert_eq!(elf_is_static(&text), None);
    }

    #[test]
    fn a_home_writable_by_others_fails_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let check = check_home(dir.path());
        assert_eq!(check.status, Status::Fail);
        assert!(
            check
                .fix
                .as_deref()
                .is_some_and(|f| f.starts_with("chmod 700"))
        );
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(check_home(dir.path()).status, Status::Ok);
        let absent = check_home(&dir.path().join("new"));
        assert_eq!(absent.status, Status::Ok, "{}", absent.detail);
    }
}
