//! The `Engine` facade: every operation on machines is one method here. No HTTP, no FFI.
//!
//! `config.rs` holds the settings and limits, `home.rs` taking the home and choosing the
//! backend, `inner.rs` what every part shares, `machines.rs` creating, finding, running and
//! deleting machines, `forever.rs` swap, fork, checkpoints and rollback, `budget.rs` the swap
//! policy, `processes.rs` processes beside a machine's interpreter.

mod audit;
mod budget;
pub(crate) mod chunks;
mod config;
mod contexts;
mod files;
mod forever;
mod history;
pub use history::MAX_HISTORY_LIST;
mod home;
mod inner;
mod lifecycle;
mod machines;
mod node;
mod processes;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub use self::audit::{AuditCode, AuditSettings};
pub use self::config::{
    BackendChoice, EngineConfig, Hook, Hooks, LINE_OVERHEAD_BYTES, Limits, parse_memory_list,
};
pub(crate) use self::home::gvisor_config;
pub use self::home::{
    create_token_in_home, create_token_in_store, list_tokens_in_home, list_tokens_in_store,
    read_audit_in_store, reseal_secrets_in_store, revoke_token_in_home, revoke_token_in_store,
};
pub(crate) use self::inner::EngineInner;
pub use self::node::NodeSettings;
use crate::error::Result;
use crate::pool::{Pool, Shape};
use crate::sync::lock;
use crate::types::Account;

/// The evervm engine. Cheap to clone; all clones share one engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("home", &self.inner.config.home)
            .field("backend", &self.inner.backend.name())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Opens the engine on its home, creating the home on first use (for gVisor, the first
    /// start also builds the root filesystem image, with progress on stderr). The tokio runtime
    /// it is called in then runs the machines.
    pub async fn open(config: EngineConfig) -> Result<Self> {
        home::create_home(&config.home)?;
        let lock_file = home::lock_home(&config.home)?;
        if config.node.is_some() && (config.database.is_none() || config.snapshots.is_none()) {
            return Err(crate::Error::invalid(
                "a node of a cluster shares a PostgreSQL database (--database) and a bucket                  (--snapshots) with the others: give both, or leave out --advertise",
            ));
        }
        // One server per database, unless the servers sharing it are nodes of one cluster.
        let keys = match &config.secret_keys {
            Some(keys) => Some(Arc::clone(keys)),
            None => crate::secrets::SecretKeys::from_env()?,
        };
        let store = crate::store::open(
            config.database.as_ref(),
            &config.home,
            config.node.is_none(),
            keys,
        )
        .await?;
        let bucket = match &config.snapshots {
            Some(settings) => Some(crate::bucket::Bucket::open(settings).await?),
            None => None,
        };
        let home = config.home.clone();
        let with_snapshots = tokio::task::spawn_blocking(move || {
            crate::snapshot::recover(&home);
            crate::snapshot::machines_with_snapshots(&home)
        })
        .await
        .map_err(|e| crate::Error::internal(format!("looking for snapshots stopped: {e}")))?;
        store.note_snapshots_on_disk(&with_snapshots).await?;
        let unfinished = store
            .fail_unfinished(
                "MachineCrashed: the engine stopped before this instruction finished",
                // A node's, only of the machines it ran: the other nodes run theirs.
                match &config.node {
                    Some(node) => crate::store::Unfinished::OwnedBy(node.id.clone()),
                    None => crate::store::Unfinished::All,
                },
            )
            .await?;
        if let Some(bucket) = &bucket {
            // Before the backend starts: it loads the kept binaries.
            crate::bucket::share_kept_runsc(bucket, &config.home).await?;
        }
        let chunks = {
            let home = config.home.clone();
            tokio::task::spawn_blocking(move || crate::chunks::ChunkStore::open(&home))
                .await
                .map_err(|e| {
                    crate::Error::internal(format!("opening the chunk store stopped: {e}"))
                })??
        };
        let backend = home::choose_backend(&config, &chunks).await?;
        if unfinished > 0 {
            tracing::warn!("{unfinished} instructions were left unfinished by the last engine");
        }
        // Chunked snapshots go up and come down through the home's store.
        let bucket = bucket.map(|bucket| bucket.with_chunks(Arc::clone(&chunks)));
        let inner = EngineInner::new(config, store, bucket, backend, chunks, lock_file);
        if inner.backend.capabilities().snapshots {
            inner.hold_reserve();
        }
        let engine = Self {
            inner: Arc::new(inner),
        };
        engine.join_cluster().await?;
        Pool::refill(&engine.inner, &engine.default_shape());
        tokio::spawn(lifecycle::delete_expired_machines(Arc::downgrade(
            &engine.inner,
        )));
        if engine.inner.backend.capabilities().snapshots {
            tokio::spawn(chunks::collect_in_background(Arc::downgrade(&engine.inner)));
        }
        let config = &engine.inner.config;
        let compress_after = (config.compress_swaps && !config.compress_after.is_zero())
            .then_some(config.compress_after);
        if engine.inner.backend.capabilities().snapshots
            && (config.idle_swap.is_some() || compress_after.is_some())
        {
            tokio::spawn(budget::tend_idle_machines(
                Arc::downgrade(&engine.inner),
                config.idle_swap,
                compress_after,
            ));
            if compress_after.is_some() {
                tokio::spawn(Self::adopt_uncompressed_snapshots(Arc::downgrade(
                    &engine.inner,
                )));
            }
        }
        Ok(engine)
    }

    fn default_shape(&self) -> Shape {
        Shape {
            profile: self.inner.config.default_image.clone(),
            memory_mb: self.inner.config.default_memory_mb,
        }
    }

    /// The backend and its exact version (for gVisor: the runsc and its platform).
    pub fn backend_description(&self) -> String {
        self.inner.backend.describe()
    }

    /// How many ready sandboxes the pool holds now.
    pub fn pooled_sandboxes(&self) -> usize {
        self.inner.pool.len()
    }

    pub fn home(&self) -> &Path {
        &self.inner.config.home
    }

    /// The sandbox backend in use (`process`, `gvisor`).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// Names of the machines that have a handle in this engine now (resident or not), sorted:
    /// for tests that check nothing lingers after a delete.
    #[doc(hidden)]
    pub fn loaded_machines(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.inner.machines).keys().cloned().collect();
        names.sort();
        names
    }

    /// Whether new machines are saved in place (forks and durable saves leave them running).
    pub fn saves_in_place(&self) -> bool {
        self.inner.backend.capabilities().save_in_place
    }

    /// The host process at the root of a machine's sandbox, while it has one: for tests that
    /// check a machine was not stopped and restored.
    #[doc(hidden)]
    pub fn sandbox_pid(&self, name: &str) -> Option<u32> {
        lock(&self.inner.machines)
            .get(name)
            .and_then(|h| h.sandbox_pid())
    }

    /// The limits this engine enforces.
    pub fn limits(&self) -> &Limits {
        &self.inner.config.limits
    }

    /// The network of a machine created without one (`--network-default`).
    pub fn network_default(&self) -> &crate::network::NetworkPolicy {
        &self.inner.config.network_default
    }

    // --- accounts -------------------------------------------------------------------------

    /// The account with this name, created if needed.
    pub async fn ensure_account(&self, name: &str) -> Result<Account> {
        home::validate_account_name(name)?;
        let name = name.to_owned();
        let account = self.inner.store.ensure_account(&name).await?;
        self.inner.metrics.know_account(account.id, &account.name);
        Ok(account)
    }

    /// Creates a token (`id.secret`) for the named account, creating the account if needed.
    pub async fn create_token(&self, account_name: &str) -> Result<String> {
        home::validate_account_name(account_name)?;
        let name = account_name.to_owned();
        self.inner.store.create_token(&name, None).await
    }

    /// How many tokens exist (a fresh home has none).
    pub async fn token_count(&self) -> Result<i64> {
        self.inner.store.count_tokens().await
    }

    /// The account a token belongs to.
    pub async fn authenticate(&self, token: &str) -> Result<Account> {
        let token = token.to_owned();
        let account = self
            .inner
            .store
            .authenticate(&token)
            .await
            .inspect_err(|e| self.count_refusal(e))?;
        self.inner.metrics.know_account(account.id, &account.name);
        Ok(account)
    }

    /// A credential that stands for `token` for one purpose only, `scope` (such as
    /// `e2b-sandbox:<id>`): `<token id>.<MAC>`. It is useless for anything else, never
    /// reveals the token, and stops working when the token is revoked or expires.
    pub async fn scoped_credential(&self, token: &str, scope: &str) -> Result<String> {
        let (id, secret) = crate::store::split_token(token)?;
        let record = self.token_record(id).await?;
        record.check(secret)?;
        Ok(record.scoped_credential(id, scope))
    }

    /// The account a credential from [`Engine::scoped_credential`] acts for, if it was made
    /// for `scope`.
    pub async fn authenticate_scoped(&self, credential: &str, scope: &str) -> Result<Account> {
        let (id, mac) =
            crate::store::split_token(credential).inspect_err(|e| self.count_refusal(e))?;
        let record = self
            .token_record(id)
            .await
            .inspect_err(|e| self.count_refusal(e))?;
        record
            .check_scoped(scope, mac)
            .inspect_err(|e| self.count_refusal(e))?;
        self.inner
            .metrics
            .know_account(record.account.id, &record.account.name);
        Ok(record.account)
    }

    /// Counts a credential refused (not audited: a flood of bad tokens must not fill the log).
    fn count_refusal(&self, error: &crate::Error) {
        if error.kind() == crate::ErrorKind::Unauthorized {
            self.inner.metrics.refused_credential();
        }
    }

    async fn token_record(&self, id: &str) -> Result<crate::store::TokenRecord> {
        self.inner
            .store
            .token_record(id)
            .await?
            .ok_or_else(|| crate::Error::unauthorized("unknown token"))
    }

    /// Stops the engine: resident machines are swapped out to disk where the backend can, every
    /// sandbox stops, and the home is released for the next engine. Afterwards every operation
    /// on machines is refused.
    pub async fn shutdown(&self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        let handles: Vec<_> = lock(&self.inner.machines).drain().map(|(_, h)| h).collect();
        let snapshots = self.inner.backend.capabilities().snapshots;
        for handle in handles {
            // Resident machines go to disk, so the next engine finds them as they were.
            if snapshots
                && handle.resident()
                && let Err(e) = handle.swap_out().await
            {
                tracing::warn!(machine = %handle.name, "could not swap out at shutdown: {e}");
            }
            handle.stop().await;
        }
        self.leave_cluster().await;
        self.inner.pool.drain().await;
        self.inner.backend.shutdown().await;
        // Everything stored before the home is handed over.
        self.inner.audit.flush().await;
        let _ = self.inner.store.flush().await;
        self.inner.store.hand_over().await;
        lock(&self.inner.home_lock).take();
    }
}
