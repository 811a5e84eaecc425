//! Looking after an engine's home from this process, without a server: tokens and root
//! filesystem images. What `evervm token create` and `evervm image build` do, so that no surface
//! reaches into the engine for them.

use std::path::{Path, PathBuf};

use evervm_engine::EngineConfig;
use evervm_engine::guest::image::{ImageBuilder, Profile, StderrProgress};

use crate::error::Result;

/// The home when none is given: `$EVERVM_HOME`, else `$XDG_DATA_HOME/evervm`, else
/// `~/.local/share/evervm`.
pub fn default_home() -> PathBuf {
    EngineConfig::default_home()
}

/// Creates a token for `account` (the account too, if it is new) in the home's database and
/// returns it. Works while a server runs on that home.
pub fn create_token(home: &Path, account: &str) -> Result<String> {
    Ok(evervm_engine::create_token_in_home(home, account)?)
}

/// Builds the root filesystem image of `profile` (`minimal`, or `data` with numpy, pandas and
/// matplotlib) where the engine on `home` looks for images (`EVERVM_IMAGES`, else
/// `<home>/images`), with progress on stderr. Nothing is rebuilt unless an input changed.
/// Returns the image's root directory.
pub fn build_image(home: &Path, profile: &str) -> Result<PathBuf> {
    let profile = Profile::parse(profile)?;
    let builder = ImageBuilder::new(EngineConfig::new(home).images_dir);
    let image = builder.ensure(profile, &StderrProgress::default())?;
    Ok(image.root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_made_in_the_home_and_bad_input_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let token = create_token(home.path(), "alice").unwrap();
        assert!(token.contains('.'), "{token}");
        assert!(home.path().join("evervm.db").exists());
        let bad = create_token(home.path(), "no spaces").unwrap_err();
        assert_eq!(bad.kind(), crate::ErrorKind::InvalidInput);
        let bad = build_image(home.path(), "huge").unwrap_err();
        assert_eq!(bad.kind(), crate::ErrorKind::InvalidInput, "{bad}");
    }
}
