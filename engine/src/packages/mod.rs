//! Packages at runtime: `install(["requests==2.32.3"])` puts PyPI packages into a machine that
//! has no network of its own.
//!
//! The engine does the fetching, never the machine's code and never package code on the host:
//! it asks the machine what it runs (its Python, platform and C library, what is installed), then
//! resolves the requirements against a package index's JSON API (PEP 691) to binary wheels only
//! (a project with no wheel for the machine is refused: building an sdist would run its code),
//! downloads each into a cache on disk, checks it against the index's sha256 (and against a hash
//! the caller pinned), reads its dependencies from the wheel's own metadata, and sends the wheels
//! into the machine, where the agent unpacks them into the user's site-packages of the machine's
//! home and makes them importable at once. The packages are then files in the machine like any
//! other, so they are in its snapshots: they survive swap, restart and fork.
//!
//! Resolution is greedy, like pip before its resolver: the newest version that satisfies every
//! requirement seen so far; a later requirement that the chosen version does not satisfy is an
//! error naming both (pin a version to settle it). What the machine already has and satisfies a
//! requirement is kept (and its own dependencies are not looked at again).
//!
//! The same wheels make custom images (`image build`), unpacked on the host into the image.

#[cfg(feature = "runtime")]
pub(crate) mod index;
#[cfg(feature = "runtime")]
pub(crate) mod resolve;
#[cfg(feature = "runtime")]
pub(crate) mod tags;
#[cfg(feature = "runtime")]
pub(crate) mod wheel;

#[cfg(feature = "runtime")]
pub use index::PackageSettings;
#[cfg(feature = "runtime")]
pub use resolve::ReportedEnvironment;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Most requirements in one install.
pub const MAX_REQUIREMENTS: usize = 64;
/// The longest requirement.
pub const MAX_REQUIREMENT_BYTES: usize = 512;

/// A package an install put into the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InstalledPackage {
    /// The project's name as its metadata spells it.
    pub name: String,
    pub version: String,
    /// The wheel's file name.
    pub wheel: String,
    /// The wheel's sha256, as checked.
    pub sha256: String,
    /// The wheel's size in bytes.
    pub bytes: u64,
}

/// A requirement the machine already satisfied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SatisfiedPackage {
    pub name: String,
    pub version: String,
}

/// What an install did (the answer of `POST /v1/machine/{name}/install`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InstallReport {
    /// What it put into the machine, dependencies included, in install order.
    pub installed: Vec<InstalledPackage>,
    /// What the machine had already.
    pub satisfied: Vec<SatisfiedPackage>,
}

impl InstallReport {
    /// The report as pip-like lines, for `%pip install` and the CLI.
    pub fn summary(&self) -> String {
        let mut text = String::new();
        for package in &self.satisfied {
            text += &[
                "Requirement already satisfied: ",
                &package.name,
                " ",
                &package.version,
                "\n",
            ]
            .concat();
        }
        if self.installed.is_empty() {
            if self.satisfied.is_empty() {
                text.push_str("Nothing to install\n");
            }
        } else {
            let names: Vec<String> = self
                .installed
                .iter()
                .map(|p| format!("{}-{}", p.name, p.version))
                .collect();
            text += &["Successfully installed ", &names.join(" "), "\n"].concat();
        }
        text
    }
}

/// Checks the shape of an install's requirements (their syntax is checked by the engine).
pub fn validate_requirements(requirements: &[String]) -> Result<()> {
    if requirements.is_empty() {
        return Err(Error::invalid("install needs at least one requirement"));
    }
    if requirements.len() > MAX_REQUIREMENTS {
        return Err(Error::invalid(format!(
            "install takes at most {MAX_REQUIREMENTS} requirements, not {}",
            requirements.len()
        )));
    }
    for requirement in requirements {
        if requirement.trim().is_empty() || requirement.len() > MAX_REQUIREMENT_BYTES {
            return Err(Error::invalid(format!(
                "a requirement must be 1 to {MAX_REQUIREMENT_BYTES} bytes, like \
                 \"requests==2.32.3\""
            )));
        }
    }
    Ok(())
}

/// The requirements of a REPL line `%pip install ...` (or `!pip install`), if the code is only
/// such lines; options other than the requirements are refused by the caller's checks later.
pub fn pip_install_line(code: &str) -> Option<std::result::Result<Vec<String>, String>> {
    let mut requirements = Vec::new();
    let mut any = false;
    for line in code.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let rest = ["%pip3 ", "%pip ", "!pip3 ", "!pip "]
            .iter()
            .find_map(|magic| line.strip_prefix(magic))?;
        let mut words = rest.split_whitespace();
        if words.next() != Some("install") {
            return Some(Err(format!(
                "only `%pip install REQUIREMENT...` is supported in a machine, not {line:?}"
            )));
        }
        for word in words {
            if word.starts_with('-') {
                return Some(Err(format!(
                    "`%pip install` takes requirements only (like requests==2.32.3), not the \
                     option {word}"
                )));
            }
            requirements.push(unquote(word).to_owned());
        }
        any = true;
    }
    any.then_some(Ok(requirements))
}

fn unquote(word: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = word.strip_prefix(quote).and_then(|w| w.strip_suffix(quote)) {
            return inner;
        }
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_lines_are_recognised() {
        assert_eq!(
            pip_install_line("%pip install requests==2.32.3 'idna>=3'\n"),
            Some(Ok(vec!["requests==2.32.3".into(), "idna>=3".into()]))
        );
        assert_eq!(
            pip_install_line("# deps\n!pip install a\n%pip install b"),
            Some(Ok(vec!["a".into(), "b".into()]))
        );
        assert_eq!(pip_install_line("import pip\n%pip install a"), None);
        assert_eq!(pip_install_line("x = 1"), None);
        assert!(matches!(
            pip_install_line("%pip install -U a"),
            Some(Err(e)) if e.contains("-U")
        ));
        assert!(matches!(pip_install_line("%pip list"), Some(Err(_))));
    }

    #[test]
    fn requirement_lists_are_bounded() {
        assert!(validate_requirements(&[]).is_err());
        assert!(validate_requirements(&["a".into()]).is_ok());
        assert!(validate_requirements(&[" ".into()]).is_err());
        assert!(validate_requirements(&["a".repeat(MAX_REQUIREMENT_BYTES + 1)]).is_err());
        assert!(validate_requirements(&vec!["a".to_string(); MAX_REQUIREMENTS + 1]).is_err());
    }
}
