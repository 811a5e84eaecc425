//! Host paths never reach a client: the engine's messages name files under its home (snapshots,
//! checkpoints, runsc binaries), its images directory and the user's home directory. Every text
//! the server sends that the engine wrote (error messages, failed instructions' texts, output,
//! `last_error`) goes through [`Redactor::text`]; the server's own log keeps the full paths.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use evervm_engine::{Engine, EngineConfig};

/// What a client sees instead of the engine's home.
pub(crate) const HOME: &str = "<evervm home>";
/// What a client sees instead of the images directory.
pub(crate) const IMAGES: &str = "<evervm images>";
/// What a client sees instead of the user's home directory.
pub(crate) const USER_HOME: &str = "~";

/// Replaces host path prefixes with placeholders.
#[derive(Debug, Clone, Default)]
pub(crate) struct Redactor {
    /// Prefix and placeholder, longest prefix first (the images directory usually lies in the
    /// home, and the home in the user's home directory).
    prefixes: Vec<(String, &'static str)>,
}

impl Redactor {
    /// For an engine: its home, the images directory the engine uses for that home, and `$HOME`.
    pub(crate) fn for_engine(engine: &Engine) -> Self {
        let home = engine.home();
        let images = EngineConfig::new(home).images_dir;
        let user_home = std::env::var_os("HOME").map(PathBuf::from);
        Self::new(home, &images, user_home.as_deref())
    }

    pub(crate) fn new(home: &Path, images: &Path, user_home: Option<&Path>) -> Self {
        let mut prefixes = Vec::new();
        let mut add = |path: &Path, placeholder: &'static str| {
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
            let canonical = std::fs::canonicalize(&absolute).ok();
            for path in [Some(path.to_owned()), Some(absolute), canonical]
                .into_iter()
                .flatten()
            {
                let text = path.to_string_lossy().trim_end_matches('/').to_owned();
                // `/` or a relative path would match everywhere.
                if text.len() > 1 && text.starts_with('/') {
                    prefixes.push((text, placeholder));
                }
            }
        };
        add(home, HOME);
        add(images, IMAGES);
        if let Some(user_home) = user_home {
            add(user_home, USER_HOME);
        }
        prefixes.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        prefixes.dedup_by(|a, b| a.0 == b.0);
        Self { prefixes }
    }

    /// `text` with every host path prefix replaced by its placeholder (only where the prefix
    /// ends at a path boundary: `/home/al` is not a prefix of `/home/alice`).
    pub(crate) fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !text.contains('/') {
            return Cow::Borrowed(text);
        }
        let mut current = Cow::Borrowed(text);
        for (prefix, placeholder) in &self.prefixes {
            if let Some(replaced) = replace_path_prefix(&current, prefix, placeholder) {
                current = Cow::Owned(replaced);
            }
        }
        current
    }

    /// Like [`Redactor::text`], in place.
    pub(crate) fn string(&self, text: &mut String) {
        if let Cow::Owned(redacted) = self.text(text) {
            *text = redacted;
        }
    }
}

/// `text` with `prefix` replaced wherever it is followed by the end, `/` or a character that
/// cannot continue a file name in a message; `None` when nothing was replaced.
fn replace_path_prefix(text: &str, prefix: &str, placeholder: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    let mut replaced = false;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        let boundary = after
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '+')));
        out.push_str(&rest[..at]);
        if boundary {
            out.push_str(placeholder);
            replaced = true;
        } else {
            out.push_str(prefix);
        }
        rest = after;
    }
    if !replaced {
        return None;
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Redactor {
        Redactor::new(
            Path::new("/srv/ev/home/"),
            Path::new("/srv/ev/home/images"),
            Some(Path::new("/home/alice")),
        )
    }

    #[test]
    fn host_paths_become_placeholders() {
        let r = redactor();
        assert_eq!(
            r.text("the snapshot of m is damaged: /srv/ev/home/machines/m/snapshot/checkpoint.img is truncated"),
            "the snapshot of m is damaged: <evervm home>/machines/m/snapshot/checkpoint.img is truncated"
        );
        assert_eq!(
            r.text("(/srv/ev/home/images/minimal-abc) and /srv/ev/home"),
            "(<evervm images>/minimal-abc) and <evervm home>"
        );
        assert_eq!(
            r.text("cannot run /home/alice/go/bin/runsc: /home/alice"),
            "cannot run ~/go/bin/runsc: ~"
        );
    }

    #[test]
    fn other_text_is_left_alone() {
        let r = redactor();
        for text in [
            "no machine named \"m\"",
            "/srv/ev/home2/x and /home/alicea and /srv/ev/homely",
            "a/b",
            "",
        ] {
            assert!(matches!(r.text(text), Cow::Borrowed(_)), "{text}");
            assert_eq!(r.text(text), text);
        }
        let mut mixed = "/srv/ev/home2 /srv/ev/home/x".to_owned();
        r.string(&mut mixed);
        assert_eq!(mixed, "/srv/ev/home2 <evervm home>/x");
    }

    #[test]
    fn the_root_and_relative_paths_are_never_prefixes() {
        let r = Redactor::new(Path::new("/"), Path::new("/"), Some(Path::new("/")));
        assert_eq!(r.text("/usr/bin/runsc"), "/usr/bin/runsc");
        assert!(
            r.prefixes
                .iter()
                .all(|(p, _)| p.len() > 1 && p.starts_with('/'))
        );
    }
}
