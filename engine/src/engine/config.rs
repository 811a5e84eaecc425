//! The engine's settings: where it lives, which backend it runs machines on, how it swaps, and
//! the limits that keep any one caller from growing it without bound.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::guest::image::Profile;
use crate::network::{NetworkMode, NetworkPolicy, NetworkSettings};
use crate::packages::PackageSettings;

/// Which sandbox backend machines run on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The best one available on this host.
    #[default]
    Auto,
    /// A backend by name (`process`).
    Named(String),
}

impl BackendChoice {
    pub fn parse(name: &str) -> Self {
        if name.is_empty() || name == "auto" {
            BackendChoice::Auto
        } else {
            BackendChoice::Named(name.to_owned())
        }
    }
}

/// Limits per machine and per account. Every one is a server setting with a documented default
/// (README, "Limits"); going past one is an error of kind `LimitExceeded` that names it, except
/// for output, which is cut with a marker.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Output kept per instruction, in bytes (each line counts [`LINE_OVERHEAD_BYTES`] more,
    /// for what the engine keeps beside its text); past it the rest of the output is dropped
    /// and the stream and the result say so. `EVERVM_MAX_OUTPUT_MB`, 16 MiB.
    pub max_output_bytes: usize,
    /// Instructions waiting to run on one machine. `EVERVM_MAX_QUEUED`, 256.
    pub max_queued_instructions: usize,
    /// Operations (swap, fork, checkpoint, rollback) waiting on one machine, and file
    /// operations waiting on one machine (each). 16.
    pub max_waiting_operations: usize,
    /// The largest file written to or read from a machine, in bytes. `EVERVM_MAX_FILE_MB`, 256.
    pub max_file_bytes: u64,
    /// Machines one account may have. `EVERVM_MAX_MACHINES`, 1,000.
    pub max_machines_per_account: usize,
    /// Memory of one account's resident machines together (the sum of their `memory_mb`);
    /// past it the account's least recently used idle machines are swapped out, and when none
    /// can be, the instruction that needed one more is refused. `EVERVM_ACCOUNT_RESIDENT_MB`,
    /// 16,384.
    pub max_resident_mb_per_account: u64,
    /// Disk for one account's snapshots and checkpoints (MiB); a fork or a checkpoint past it is
    /// refused. `EVERVM_ACCOUNT_DISK_MB`, 20,480.
    pub max_disk_mb_per_account: u64,
    /// Instructions per second one account may start, sustained (0: no limit), and the burst
    /// above it. `EVERVM_INSTRUCTION_RATE` (500) and `EVERVM_INSTRUCTION_BURST` (1,000).
    pub instructions_per_second: f64,
    pub instruction_burst: u32,
    /// The `memory_mb` values machines may have (each is a pool shape and a base snapshot).
    /// `EVERVM_MEMORY_MB_ALLOWED`, `128,256,512,1024,2048,4096,8192`.
    pub allowed_memory_mb: Vec<u32>,
}

/// What the engine counts for each line of output beside its text (see
/// [`Limits::max_output_bytes`]).
pub const LINE_OVERHEAD_BYTES: usize = 32;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_output_bytes: 16 * 1024 * 1024,
            max_queued_instructions: 256,
            max_waiting_operations: 16,
            max_file_bytes: crate::files::DEFAULT_MAX_FILE_BYTES,
            max_machines_per_account: 1000,
            max_resident_mb_per_account: 16 * 1024,
            max_disk_mb_per_account: 20 * 1024,
            instructions_per_second: 500.0,
            instruction_burst: 1000,
            allowed_memory_mb: vec![128, 256, 512, 1024, 2048, 4096, 8192],
        }
    }
}

impl Limits {
    /// The defaults, with what the environment sets (`EVERVM_MAX_OUTPUT_MB`, ...). A value that
    /// does not parse is ignored with a warning.
    pub fn from_env() -> Self {
        let mut limits = Self::default();
        let var = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
        let number = |key: &str| -> Option<u64> {
            let text = var(key)?;
            match text.trim().parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    tracing::warn!("ignoring {key}={text:?}: not a whole number");
                    None
                }
            }
        };
        if let Some(mb) = number("EVERVM_MAX_OUTPUT_MB") {
            limits.max_output_bytes = (mb as usize).saturating_mul(1024 * 1024);
        }
        if let Some(mb) = number("EVERVM_MAX_FILE_MB") {
            limits.max_file_bytes = mb.saturating_mul(1024 * 1024);
        }
        if let Some(n) = number("EVERVM_MAX_QUEUED") {
            limits.max_queued_instructions = n as usize;
        }
        if let Some(n) = number("EVERVM_MAX_MACHINES") {
            limits.max_machines_per_account = n as usize;
        }
        if let Some(n) = number("EVERVM_ACCOUNT_RESIDENT_MB") {
            limits.max_resident_mb_per_account = n;
        }
        if let Some(n) = number("EVERVM_ACCOUNT_DISK_MB") {
            limits.max_disk_mb_per_account = n;
        }
        if let Some(n) = number("EVERVM_INSTRUCTION_RATE") {
            limits.instructions_per_second = n as f64;
        }
        if let Some(n) = number("EVERVM_INSTRUCTION_BURST") {
            limits.instruction_burst = n as u32;
        }
        if let Some(text) = var("EVERVM_MEMORY_MB_ALLOWED") {
            match parse_memory_list(&text) {
                Some(list) => limits.allowed_memory_mb = list,
                None => tracing::warn!(
                    "ignoring EVERVM_MEMORY_MB_ALLOWED={text:?}: expected sizes in MiB separated \
                     by commas"
                ),
            }
        }
        limits
    }
}

/// `"256, 512,1024"` -> `[256, 512, 1024]`, sorted; `None` when any part is not a number or the
/// list is empty.
pub fn parse_memory_list(text: &str) -> Option<Vec<u32>> {
    let mut list = text
        .split(',')
        .map(|part| part.trim().parse::<u32>().ok())
        .collect::<Option<Vec<u32>>>()?;
    list.sort_unstable();
    list.dedup();
    (!list.is_empty()).then_some(list)
}

/// A test hook: called with a machine's name at a point named by the field it is in.
pub type Hook = Arc<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>;

/// Points where tests can make the engine wait or act, to reach an interleaving on purpose
/// instead of hoping for it with sleeps. Empty in production.
#[doc(hidden)]
#[derive(Clone, Default)]
pub struct Hooks {
    /// A machine's task took an instruction to run and has not yet sent it to the sandbox.
    pub before_run: Option<Hook>,
    /// A lookup read a machine's record and has not yet made the machine's handle.
    pub before_handle: Option<Hook>,
    /// A swap-out has written its checkpoint and has not yet committed it as the snapshot.
    pub before_commit: Option<Hook>,
    /// A base snapshot is about to be made (called with `<profile>-<memory_mb>`).
    pub before_base: Option<Hook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("before_run", &self.before_run.is_some())
            .field("before_handle", &self.before_handle.is_some())
            .field("before_commit", &self.before_commit.is_some())
            .field("before_base", &self.before_base.is_some())
            .finish()
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where the database, images and machines live.
    pub home: PathBuf,
    pub backend: BackendChoice,
    /// `memory_mb` of machines created without one.
    pub default_memory_mb: u32,
    /// Undo points kept by machines created without a `history` (`EVERVM_HISTORY`, 0: none).
    pub default_history: u32,
    /// The most undo points a machine may keep (`EVERVM_HISTORY_MAX`, default 100).
    pub max_history: u32,
    /// The image of machines created without one: `data` (numpy, pandas, matplotlib,
    /// requests, ...) unless `EVERVM_DEFAULT_IMAGE` says `minimal`.
    pub default_image: Profile,
    /// Whether the `data` image's base snapshot imports numpy, pandas and matplotlib (into
    /// `sys.modules` only): a machine's first `import pandas` is then instant, but every new
    /// machine and every restore of a fresh one carries them. `EVERVM_BASE_PREIMPORT=1`; off by
    /// default, so that machines on `data` start as fast as on `minimal`.
    pub base_preimport: bool,
    /// How long a new sandbox may take to report ready.
    pub ready_timeout: Duration,
    /// How long past its timeout (or an interrupt) an instruction may take to stop before its
    /// sandbox is stopped.
    pub timeout_grace: Duration,
    /// Ready sandboxes kept per image and memory size (0: none); `EVERVM_POOL_SIZE`.
    pub pool_size: usize,
    /// Where root filesystem images are kept: `EVERVM_IMAGES`, else `<home>/images`.
    pub images_dir: PathBuf,
    /// A resident machine idle this long is swapped out to disk (backends with snapshots);
    /// `EVERVM_IDLE_SWAP_SECS`, 60 s by default, 0 for never.
    pub idle_swap: Option<Duration>,
    /// At most this many machines resident at once; past it the least recently used idle ones
    /// are swapped out (backends with snapshots). `EVERVM_MAX_RESIDENT`; unlimited when `None`.
    pub max_resident: Option<usize>,
    /// At most this much memory (MiB, measured: the sandboxes' proportional set size) held by
    /// resident machines; past it the least recently used idle ones are swapped out.
    /// `EVERVM_RESIDENT_MEMORY_MB`; unlimited when `None`.
    pub resident_memory_mb: Option<u64>,
    /// Whether swapped machines' snapshots are compressed where the backend can (the current
    /// runsc): about 4-10 times smaller on disk, about 15 ms slower to restore a fresh REPL.
    /// Saves that are restored soon (base snapshots, forks and checkpoints, durable saves) are
    /// written uncompressed (a fork or checkpoint of a swapped machine copies its snapshot as it
    /// is, and a fork idle for long is compressed like any machine). `EVERVM_COMPRESS_SWAPS`
    /// (`0` for no), on by default.
    pub compress_swaps: bool,
    /// Whether compressed snapshots go into the home's chunk store (deduplicated against every
    /// other snapshot; see [`crate::chunks`]) rather than each compressed whole. Only without
    /// a bucket for now: a bucket keeps whole compressed snapshots. `EVERVM_CHUNK_SNAPSHOTS`
    /// (`0` for no), on by default.
    pub chunk_snapshots: bool,
    /// How long a machine stays swapped before its snapshot is compressed, in the background: a
    /// machine that comes back soon after its swap-out restores uncompressed (faster), one idle
    /// for long takes little disk. `EVERVM_COMPRESS_AFTER_SECS` (default 600; 0: at the
    /// swap-out itself).
    pub compress_after: Duration,
    /// The runsc binary for the gVisor backend; `EVERVM_RUNSC` (or a search) when `None`.
    pub runsc: Option<PathBuf>,
    /// The gVisor platform; `EVERVM_RUNSC_PLATFORM` (or a probe) when `None`.
    pub runsc_platform: Option<String>,
    /// Limits per machine and per account.
    pub limits: Limits,
    /// The network of machines created without one: `none` unless `EVERVM_NETWORK_DEFAULT` says
    /// `public`.
    pub network_default: NetworkPolicy,
    /// The most network a machine may be given (`EVERVM_NETWORK_MAX`: `none`, `allow` or
    /// `public`, the default): a machine asking for more is refused.
    pub network_max: NetworkMode,
    /// How machines' networks are made (DNS servers, connection limits).
    pub network: NetworkSettings,
    /// Where `install` fetches wheels from, and its bounds.
    pub packages: PackageSettings,
    /// The PostgreSQL store (`--database`, `EVERVM_DATABASE`); SQLite in the home when `None`.
    pub database: Option<crate::store::PostgresSettings>,
    /// The bucket machines' snapshots and checkpoints are kept in (`--snapshots s3://...`,
    /// `EVERVM_SNAPSHOTS`): a save counts once it is whole there, and the home keeps copies of
    /// recently used ones. On the home's disk only when `None`.
    pub snapshots: Option<crate::bucket::BucketSettings>,
    /// How much of the home's disk the copies of swapped machines' snapshots kept from the
    /// bucket may take (MiB, `EVERVM_SNAPSHOT_CACHE_MB`, default 10240): past it the least
    /// recently used are removed from the disk (the bucket keeps them). Only with `snapshots`.
    pub snapshot_cache_mb: u64,
    /// This engine as a node of a cluster (`--advertise`, `--node-id`): it shares the database
    /// and the bucket with other nodes, owns the machines it runs through leases, and the server
    /// forwards requests for the others' machines. Needs `database` and `snapshots`.
    pub node: Option<super::node::NodeSettings>,
    /// What the audit log keeps, and for how long.
    pub audit: super::audit::AuditSettings,
    /// The keys machines' secret environment values are sealed with in the store; `None`: the
    /// keys `EVERVM_SECRET_KEY` (or `EVERVM_SECRET_KEY_FILE`) and `EVERVM_SECRET_KEY_PREVIOUS`
    /// give, or none (kept as given).
    pub secret_keys: Option<std::sync::Arc<crate::secrets::SecretKeys>>,
    #[doc(hidden)]
    pub hooks: Hooks,
}

impl EngineConfig {
    pub fn new(home: impl Into<PathBuf>) -> Self {
        let home = home.into();
        let images_dir = std::env::var_os("EVERVM_IMAGES")
            .filter(|d| !d.is_empty())
            .map_or_else(|| home.join("images"), PathBuf::from);
        let idle_swap = match std::env::var("EVERVM_IDLE_SWAP_SECS")
            .ok()
            .and_then(|n| n.parse::<u64>().ok())
        {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => Some(Duration::from_secs(60)),
        };
        let pool_size = std::env::var("EVERVM_POOL_SIZE")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2);
        let positive = |key: &str| {
            std::env::var(key)
                .ok()
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        let default_image = match std::env::var("EVERVM_DEFAULT_IMAGE") {
            Ok(name) if !name.trim().is_empty() => {
                Profile::parse(name.trim()).unwrap_or_else(|e| {
                    tracing::warn!("ignoring EVERVM_DEFAULT_IMAGE={name:?}: {e}");
                    Profile::Data
                })
            }
            _ => Profile::Data,
        };
        Self {
            home,
            images_dir,
            backend: BackendChoice::Auto,
            default_memory_mb: 512,
            default_history: positive("EVERVM_HISTORY")
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            max_history: positive("EVERVM_HISTORY_MAX")
                .map_or(100, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            default_image,
            base_preimport: matches!(
                std::env::var("EVERVM_BASE_PREIMPORT").as_deref(),
                Ok("1" | "true" | "yes")
            ),
            ready_timeout: Duration::from_secs(30),
            timeout_grace: Duration::from_secs(5),
            pool_size,
            idle_swap,
            max_resident: positive("EVERVM_MAX_RESIDENT").map(|n| n as usize),
            resident_memory_mb: positive("EVERVM_RESIDENT_MEMORY_MB"),
            compress_swaps: !matches!(
                std::env::var("EVERVM_COMPRESS_SWAPS").as_deref(),
                Ok("0" | "false" | "no")
            ),
            chunk_snapshots: !matches!(
                std::env::var("EVERVM_CHUNK_SNAPSHOTS").as_deref(),
                Ok("0" | "false" | "no")
            ),
            compress_after: Duration::from_secs(
                std::env::var("EVERVM_COMPRESS_AFTER_SECS")
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(600),
            ),
            runsc: None,
            runsc_platform: None,
            limits: Limits::from_env(),
            network_default: match std::env::var("EVERVM_NETWORK_DEFAULT").as_deref() {
                Ok("public") => NetworkPolicy::Public,
                Ok("none" | "") | Err(_) => NetworkPolicy::None,
                Ok(other) => {
                    tracing::warn!(
                        "ignoring EVERVM_NETWORK_DEFAULT={other:?}: use `none` or `public`"
                    );
                    NetworkPolicy::None
                }
            },
            network_max: match std::env::var("EVERVM_NETWORK_MAX") {
                Ok(mode) if !mode.trim().is_empty() => {
                    NetworkMode::parse(mode.trim()).unwrap_or_else(|e| {
                        // A typo must not open more than meant: the least, then.
                        tracing::warn!("EVERVM_NETWORK_MAX={mode:?}: {e}; machines get none");
                        NetworkMode::None
                    })
                }
                _ => NetworkMode::Public,
            },
            network: NetworkSettings::from_env(),
            packages: PackageSettings::from_env(),
            database: None,
            snapshots: None,
            snapshot_cache_mb: positive("EVERVM_SNAPSHOT_CACHE_MB").unwrap_or(10 * 1024),
            node: None,
            audit: super::audit::AuditSettings::from_env(),
            secret_keys: None,
            hooks: Hooks::default(),
        }
    }

    /// `$EVERVM_HOME`, else `$XDG_DATA_HOME/evervm`, else `~/.local/share/evervm`.
    pub fn default_home() -> PathBuf {
        if let Some(home) = std::env::var_os("EVERVM_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(home);
        }
        if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(data).join("evervm");
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        home.join(".local/share/evervm")
    }
}
