//! The engine's home: taking it (one engine at a time), the sandbox backend it runs machines on,
//! and what other processes may do in it beside a running engine (create tokens).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::config::{BackendChoice, EngineConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::guest::image::StderrProgress;
use crate::sandbox::SandboxBackend;
use crate::sandbox::gvisor::{GvisorBackend, GvisorConfig};
use crate::sandbox::process::{ProcessBackend, ProcessBackendConfig};
use crate::store::Store;

/// Creates the home (readable by its owner only: it holds every machine's memory and the
/// tokens' hashes), or tightens an existing one's mode.
pub(super) fn create_home(home: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(home).map_err(|e| {
        Error::internal(format!(
            "cannot create the evervm home {}: {e}",
            home.display()
        ))
    })?;
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
        Error::internal(format!(
            "cannot make the evervm home {} private: {e}",
            home.display()
        ))
    })
}

/// Takes the home's lock file, or says which process holds it.
pub(super) fn lock_home(home: &Path) -> Result<File> {
    let path = home.join("evervm.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
    // A lock just released can still be held for a moment by a child forked meanwhile (it holds
    // the descriptor until its exec closes it): try again briefly before naming the holder.
    let mut locked = file.try_lock();
    for _ in 0..40 {
        if !matches!(locked, Err(std::fs::TryLockError::WouldBlock)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
        locked = file.try_lock();
    }
    match locked {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let holder = if holder.is_empty() {
                "another process".to_owned()
            } else {
                format!("process {holder}")
            };
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "the evervm home {} is in use by {holder}: stop that engine or use another \
                     home (--home or EVERVM_HOME)",
                    home.display()
                ),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Error::internal(format!(
                "cannot lock {}: {e}",
                path.display()
            )));
        }
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(file)
}

fn process_backend(config: &EngineConfig) -> Result<Arc<dyn SandboxBackend>> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let as_root = unsafe { libc::geteuid() } == 0;
    // Machines run as `nobody` under root and must reach their working directory, which a home
    // below /root would not allow.
    let work_root = if as_root {
        let digest = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(
                config.home.as_os_str().as_encoded_bytes(),
            ))
        };
        std::env::temp_dir().join(format!("evervm-process-{}", &digest[..12]))
    } else {
        config.home.join("work")
    };
    let backend_config = ProcessBackendConfig::detect(work_root)?;
    Ok(Arc::new(ProcessBackend::new(backend_config)?))
}

/// The gVisor backend's settings for an engine's: sandboxes under `home`, the engine's images,
/// runsc, platform and network settings (each given one over the environment's).
pub(crate) fn gvisor_config(config: &EngineConfig, home: PathBuf) -> GvisorConfig {
    let mut gvisor = GvisorConfig::new(home, config.images_dir.clone());
    gvisor.runsc = config.runsc.clone().or(gvisor.runsc);
    gvisor.platform = config.runsc_platform.clone().or(gvisor.platform);
    gvisor.network = config.network.clone();
    gvisor
}

async fn gvisor_backend(
    config: &EngineConfig,
    chunks: &Arc<crate::chunks::ChunkStore>,
) -> Result<Arc<dyn SandboxBackend>> {
    let mut gvisor = gvisor_config(config, config.home.clone());
    gvisor.chunks = Some(Arc::clone(chunks));
    Ok(Arc::new(
        GvisorBackend::open(gvisor, Arc::new(StderrProgress::default())).await?,
    ))
}

/// The configured backend; for `auto`, gVisor where it runs here, else the process backend.
pub(super) async fn choose_backend(
    config: &EngineConfig,
    chunks: &Arc<crate::chunks::ChunkStore>,
) -> Result<Arc<dyn SandboxBackend>> {
    match &config.backend {
        BackendChoice::Auto => match gvisor_backend(config, chunks).await {
            Ok(backend) => Ok(backend),
            Err(e) => {
                tracing::warn!(
                    "gVisor is not available ({e}); machines run on the process backend, which \
                     is not a security boundary"
                );
                process_backend(config)
            }
        },
        BackendChoice::Named(name) => match name.as_str() {
            "process" => process_backend(config),
            "gvisor" => gvisor_backend(config, chunks).await,
            other => Err(Error::invalid(format!(
                "unknown backend {other:?}: use `gvisor`, `process` or `auto`"
            ))),
        },
    }
}

pub(super) fn validate_account_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "account name {name:?} must be 1 to 64 letters, digits, '_' or '-'"
        )))
    }
}

/// Creates a token for an account directly in a home's database, without taking the engine's
/// lock, so that it works while a server runs on that home. It works until `expires_at` (for
/// ever when `None`).
pub fn create_token_in_home(
    home: &Path,
    account_name: &str,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<String> {
    validate_account_name(account_name)?;
    if expires_at.is_some_and(|t| t <= chrono::Utc::now()) {
        return Err(Error::invalid("a token's expiry must be in the future"));
    }
    create_home(home)?;
    let mut store = Store::open(&home.join("evervm.db"))?;
    let account = store.ensure_account(account_name)?;
    let token = store.create_token(&account, expires_at)?;
    store.record_audit(&[token_created(account_name, &token, expires_at)])?;
    Ok(token)
}

/// The audit entry of a token made by the operator's command.
fn token_created(
    account: &str,
    token: &str,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
) -> crate::store::AuditEntry {
    let id = token.split_once('.').map_or("", |(id, _)| id);
    let expiry = expires_at.map_or_else(
        || "never expires".to_owned(),
        |t| {
            format!(
                "expires {}",
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        },
    );
    crate::store::AuditEntry {
        account: Some(account.to_owned()),
        detail: Some(format!("token {id}, {expiry}")),
        ..crate::store::AuditEntry::now("cli", "token.create", "ok")
    }
}

/// The audit entry of a token revoked by the operator's command.
fn token_revoked(account: Option<String>, id: &str) -> crate::store::AuditEntry {
    crate::store::AuditEntry {
        account,
        detail: Some(format!("token {id}")),
        ..crate::store::AuditEntry::now("cli", "token.revoke", "ok")
    }
}

/// The account a token belongs to, for the audit entry of its revocation.
fn token_account(tokens: &[crate::types::TokenInfo], id: &str) -> Option<String> {
    tokens
        .iter()
        .find(|t| t.id == id)
        .map(|t| t.account.clone())
}

/// Creates a token in the store a server uses: PostgreSQL at `database` when given, else the
/// home's SQLite database (as [`create_token_in_home`]).
pub async fn create_token_in_store(
    home: &Path,
    database: Option<&crate::store::PostgresSettings>,
    account_name: &str,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<String> {
    let Some(database) = database else {
        let (home, account) = (home.to_owned(), account_name.to_owned());
        return tokio::task::spawn_blocking(move || {
            create_token_in_home(&home, &account, expires_at)
        })
        .await
        .map_err(|e| Error::internal(format!("creating a token stopped: {e}")))?;
    };
    validate_account_name(account_name)?;
    if expires_at.is_some_and(|t| t <= chrono::Utc::now()) {
        return Err(Error::invalid("a token's expiry must be in the future"));
    }
    let store = crate::store::PostgresStore::connect(database).await?;
    let token = crate::store::Metadata::create_token(&store, account_name, expires_at).await?;
    crate::store::Metadata::record_audit(
        &store,
        vec![token_created(account_name, &token, expires_at)],
    )
    .await?;
    Ok(token)
}

/// Every token of a store (never its secret), oldest first: PostgreSQL at `database` when
/// given, else the home's.
pub async fn list_tokens_in_store(
    home: &Path,
    database: Option<&crate::store::PostgresSettings>,
) -> Result<Vec<crate::types::TokenInfo>> {
    match database {
        Some(database) => {
            let store = crate::store::PostgresStore::connect(database).await?;
            crate::store::Metadata::tokens(&store).await
        }
        None => {
            let home = home.to_owned();
            tokio::task::spawn_blocking(move || list_tokens_in_home(&home))
                .await
                .map_err(|e| Error::internal(format!("listing tokens stopped: {e}")))?
        }
    }
}

/// Revokes a token of a store by its id: PostgreSQL at `database` when given, else the home's.
pub async fn revoke_token_in_store(
    home: &Path,
    database: Option<&crate::store::PostgresSettings>,
    id: &str,
) -> Result<()> {
    match database {
        Some(database) => {
            use crate::store::Metadata;
            let store = crate::store::PostgresStore::connect(database).await?;
            let account = token_account(&store.tokens().await?, id);
            store.revoke_token(id).await?;
            store.record_audit(vec![token_revoked(account, id)]).await
        }
        None => {
            let (home, id) = (home.to_owned(), id.to_owned());
            tokio::task::spawn_blocking(move || revoke_token_in_home(&home, &id))
                .await
                .map_err(|e| Error::internal(format!("revoking a token stopped: {e}")))?
        }
    }
}

/// Seals every machine's secret environment values in a store anew with the current key of
/// `keys` (PostgreSQL at `database` when given, else the home's SQLite database, also while a
/// server runs there); how many machines changed. Recorded in the audit log.
pub async fn reseal_secrets_in_store(
    home: &Path,
    database: Option<&crate::store::PostgresSettings>,
    keys: std::sync::Arc<crate::secrets::SecretKeys>,
) -> Result<usize> {
    let entry = |changed: usize, key: &str| crate::store::AuditEntry {
        detail: Some(format!("{changed} machines sealed with key {key}")),
        ..crate::store::AuditEntry::now("cli", "secret-key.rotate", "ok")
    };
    match database {
        Some(database) => {
            let store = crate::store::PostgresStore::connect(database).await?;
            let changed = store.reseal_secret_env(&keys).await?;
            crate::store::Metadata::record_audit(&store, vec![entry(changed, keys.current_id())])
                .await?;
            Ok(changed)
        }
        None => {
            let path = existing_database(home)?;
            tokio::task::spawn_blocking(move || {
                let mut store = Store::open(&path)?;
                let changed = store.reseal_secret_env(&keys)?;
                store.record_audit(&[entry(changed, keys.current_id())])?;
                Ok(changed)
            })
            .await
            .map_err(|e| Error::internal(format!("sealing secrets stopped: {e}")))?
        }
    }
}

/// The home's database, refused when there is none (a command that reads it must not make one).
fn existing_database(home: &Path) -> Result<std::path::PathBuf> {
    let path = home.join("evervm.db");
    if path.exists() {
        return Ok(path);
    }
    Err(Error::new(
        crate::ErrorKind::NotFound,
        format!(
            "{} has no database: no server has run on this home (give --home or --database)",
            home.display()
        ),
    ))
}

/// The audit entries `query` asks for, newest first, from a store: PostgreSQL at `database`
/// when given, else the home's SQLite database (also while a server runs there).
pub async fn read_audit_in_store(
    home: &Path,
    database: Option<&crate::store::PostgresSettings>,
    query: crate::store::AuditQuery,
) -> Result<Vec<crate::store::AuditEntry>> {
    match database {
        Some(database) => {
            let store = crate::store::PostgresStore::connect(database).await?;
            crate::store::Metadata::audit_entries(&store, &query).await
        }
        None => {
            let path = existing_database(home)?;
            tokio::task::spawn_blocking(move || Store::open(&path)?.audit_entries(&query))
                .await
                .map_err(|e| Error::internal(format!("reading the audit log stopped: {e}")))?
        }
    }
}

/// Every token of a home (never its secret), oldest first; works while a server runs there.
pub fn list_tokens_in_home(home: &Path) -> Result<Vec<crate::types::TokenInfo>> {
    let store = Store::open(&home.join("evervm.db"))?;
    store.tokens()
}

/// Revokes a token of a home by its id (the part before the `.`): requests with it are refused
/// from then on, also by a server running on that home.
pub fn revoke_token_in_home(home: &Path, id: &str) -> Result<()> {
    let mut store = Store::open(&home.join("evervm.db"))?;
    let account = token_account(&store.tokens()?, id);
    store.revoke_token(id)?;
    store.record_audit(&[token_revoked(account, id)])
}
