//! Looking after an engine's home from this process, without a server: tokens and root
//! filesystem images. What `evervm token create` and `evervm image build` do, so that no surface
//! reaches into the engine for them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use evervm_engine::EngineConfig;
use evervm_engine::guest::image::{ImageBuilder, Profile, StderrProgress};

use crate::error::{Error, ErrorKind, Result};
pub use evervm_engine::TokenInfo;
pub use evervm_engine::doctor::{Check, Status as CheckStatus};
pub use evervm_engine::store::{AUDIT_PAGE_MAX, AuditEntry, AuditQuery};

/// The home when none is given: `$EVERVM_HOME`, else `$XDG_DATA_HOME/evervm`, else
/// `~/.local/share/evervm`.
pub fn default_home() -> PathBuf {
    EngineConfig::default_home()
}

/// The PostgreSQL store named by a connection string (`--database`), checked.
pub fn database(url: Option<&str>) -> Result<Option<evervm_engine::store::PostgresSettings>> {
    Ok(url
        .map(evervm_engine::store::PostgresSettings::parse)
        .transpose()?)
}

/// Creates a token for `account` (the account too, if it is new) in the store a server uses
/// (the home's database, or PostgreSQL at `database`) and returns it; it works for `valid_for`
/// (for ever when `None`). Works while a server runs on that store.
pub async fn create_token(
    home: &Path,
    database: Option<&str>,
    account: &str,
    valid_for: Option<Duration>,
) -> Result<String> {
    let expires_at = valid_for
        .map(|d| {
            chrono::Duration::from_std(d)
                .ok()
                .and_then(|d| chrono::Utc::now().checked_add_signed(d))
                .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "the expiry is too far away"))
        })
        .transpose()?;
    let database = self::database(database)?;
    Ok(evervm_engine::create_token_in_store(home, database.as_ref(), account, expires_at).await?)
}

/// Every token of the store (never its secret), oldest first.
pub async fn list_tokens(home: &Path, database: Option<&str>) -> Result<Vec<TokenInfo>> {
    let database = self::database(database)?;
    Ok(evervm_engine::list_tokens_in_store(home, database.as_ref()).await?)
}

/// Revokes a token by its id (the part before the `.`): a server on that store refuses it from
/// its next request on.
pub async fn revoke_token(home: &Path, database: Option<&str>, id: &str) -> Result<()> {
    let database = self::database(database)?;
    Ok(evervm_engine::revoke_token_in_store(home, database.as_ref(), id).await?)
}

/// The audit entries `query` asks for, newest first, from the store (the home's, or PostgreSQL
/// at `database`).
pub async fn read_audit(
    home: &Path,
    database: Option<&str>,
    query: AuditQuery,
) -> Result<Vec<AuditEntry>> {
    let database = self::database(database)?;
    Ok(evervm_engine::read_audit_in_store(home, database.as_ref(), query).await?)
}

/// A new random secret key for `EVERVM_SECRET_KEY`, as 64 hex digits.
pub fn generate_secret_key() -> Result<String> {
    Ok(evervm_engine::secrets::SecretKeys::generate()?)
}

/// Seals every machine's secret environment values in the store (the home's, or PostgreSQL at
/// `database`) with the key `EVERVM_SECRET_KEY` (or `EVERVM_SECRET_KEY_FILE`) gives, opening
/// those sealed before with the keys in `EVERVM_SECRET_KEY_PREVIOUS`: how many machines changed,
/// and the key's id.
pub async fn rotate_secret_key(home: &Path, database: Option<&str>) -> Result<(usize, String)> {
    let keys = evervm_engine::secrets::SecretKeys::from_env()?.ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            "no key to seal with: set EVERVM_SECRET_KEY (or EVERVM_SECRET_KEY_FILE) to the new \
             key and EVERVM_SECRET_KEY_PREVIOUS to the old ones",
        )
    })?;
    let id = keys.current_id().to_owned();
    let database = self::database(database)?;
    let changed = evervm_engine::reseal_secrets_in_store(home, database.as_ref(), keys).await?;
    Ok((changed, id))
}

/// `90s`, `15m`, `12h`, `30d` (a number and a unit) as a duration.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds_per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    match number.parse::<u64>() {
        Ok(n) if n > 0 && seconds_per > 0 => n
            .checked_mul(seconds_per)
            .map(Duration::from_secs)
            .ok_or_else(|| Error::new(ErrorKind::InvalidInput, format!("{text:?} is too long"))),
        _ => Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{text:?} is not a duration: write a number and s, m, h or d (`30d`)"),
        )),
    }
}

/// Builds the root filesystem image of `profile` (`minimal`, or `data` with numpy, pandas and
/// matplotlib) where the engine on `home` looks for images (`EVERVM_IMAGES`, else
/// `<home>/images`), with progress on stderr. Nothing is rebuilt unless an input changed.
/// Returns the image's root directory.
pub fn build_image(home: &Path, profile: &str) -> Result<PathBuf> {
    let profile = Profile::parse(profile)?;
    if let Profile::Custom(name) = &profile {
        return Err(crate::Error::new(
            crate::ErrorKind::InvalidInput,
            format!(
                "{name:?} is not a built-in profile (`minimal` or `data`); a custom image is \
                 built from its profile file: `evervm image build FILE.toml`"
            ),
        ));
    }
    let builder = ImageBuilder::new(EngineConfig::new(home).images_dir);
    let image = builder.ensure(&profile, &StderrProgress::default())?;
    Ok(image.root)
}

/// Builds the custom image a profile file describes (see
/// [`evervm_engine::guest::image::custom`]) where the engine on `home` looks for images, and
/// writes its lock file beside the profile. Returns the image's id and the lock file's path.
pub async fn build_custom_image(home: &Path, profile_file: &Path) -> Result<(String, PathBuf)> {
    use evervm_engine::guest::image::custom;
    let config = EngineConfig::new(home);
    let builder = ImageBuilder::new(config.images_dir.clone());
    let (image, _lock) = custom::build(
        &builder,
        &config.packages,
        config.home.join("wheels"),
        profile_file,
    )
    .await?;
    Ok((image.id, custom::lock_path(profile_file)))
}

/// What `evervm doctor` finds: whether this host can serve machines on `backend` (`auto` and
/// `gvisor` need gVisor, `process` the namespaces), each need checked by trying it, with the fix
/// for each that fails. `database` and `snapshots` are checked when given.
pub async fn doctor(
    home: Option<PathBuf>,
    backend: Option<&str>,
    database_url: Option<&str>,
    snapshots: Option<&str>,
) -> Result<Vec<Check>> {
    let config = engine_config(home, backend, database_url, snapshots)?;
    Ok(evervm_engine::doctor::doctor(&config).await)
}

/// An engine's settings from the environment and what a server's command line gives: its home,
/// backend (`auto` when `None`), PostgreSQL and snapshot bucket.
pub(crate) fn engine_config(
    home: Option<PathBuf>,
    backend: Option<&str>,
    database_url: Option<&str>,
    snapshots: Option<&str>,
) -> Result<EngineConfig> {
    let mut config = EngineConfig::new(home.unwrap_or_else(EngineConfig::default_home));
    config.backend = evervm_engine::BackendChoice::parse(backend.unwrap_or("auto"));
    config.database = database(database_url)?;
    if let Some(url) = snapshots {
        config.snapshots = Some(evervm_engine::bucket::BucketSettings::parse(url)?);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_are_made_in_the_home_and_bad_input_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let token = create_token(home.path(), None, "alice", None)
            .await
            .unwrap();
        assert!(token.contains('.'), "{token}");
        assert!(home.path().join("evervm.db").exists());
        let bad = create_token(home.path(), None, "no spaces", None)
            .await
            .unwrap_err();
        assert_eq!(bad.kind(), crate::ErrorKind::InvalidInput);
        let bad = build_image(home.path(), "huge").unwrap_err();
        assert_eq!(bad.kind(), crate::ErrorKind::InvalidInput, "{bad}");
        let expiring = create_token(home.path(), None, "bob", Some(Duration::from_secs(3600)))
            .await
            .unwrap();
        let listed = list_tokens(home.path(), None).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert!(
            listed
                .iter()
                .any(|t| t.account == "bob" && t.expires_at.is_some())
        );
        let (id, _) = expiring.split_once('.').unwrap();
        revoke_token(home.path(), None, id).await.unwrap();
        assert_eq!(list_tokens(home.path(), None).await.unwrap().len(), 1);
        // The operator's token commands are in the audit log, the tokens' secrets are not.
        let query = AuditQuery {
            limit: 10,
            ..Default::default()
        };
        let audit = read_audit(home.path(), None, query).await.unwrap();
        let actions: Vec<(&str, Option<&str>)> = audit
            .iter()
            .map(|e| (e.action.as_str(), e.account.as_deref()))
            .collect();
        assert_eq!(
            actions,
            [
                ("token.revoke", Some("bob")),
                ("token.create", Some("bob")),
                ("token.create", Some("alice"))
            ]
        );
        assert!(audit.iter().all(|e| e.door == "cli"));
        assert_eq!(
            audit[0].detail.as_deref(),
            Some(format!("token {id}").as_str())
        );
        let (_, secret) = token.split_once('.').unwrap();
        assert!(!format!("{audit:?}").contains(secret));
        let bad = revoke_token(home.path(), None, id).await.unwrap_err();
        assert_eq!(bad.kind(), crate::ErrorKind::NotFound, "{bad}");
        let bad = create_token(home.path(), Some("postgres://x@host:port/db"), "a", None)
            .await
            .unwrap_err();
        assert_eq!(bad.kind(), crate::ErrorKind::InvalidInput, "{bad}");
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        let bad = parse_duration("soon").unwrap_err();
        assert_eq!(bad.kind(), crate::ErrorKind::InvalidInput, "{bad}");
    }
}
