//! Reading a wheel on the host: its core metadata (name, version, dependencies), bounded, with
//! nothing in it run.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// The largest METADATA file read.
const MAX_METADATA_BYTES: u64 = 4 * 1024 * 1024;
/// Most entries in a wheel.
pub(crate) const MAX_WHEEL_ENTRIES: usize = 200_000;

/// What a wheel says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Metadata {
    pub name: String,
    pub version: String,
    /// `Requires-Dist` lines, as written (PEP 508, markers included).
    pub requires_dist: Vec<String>,
    pub requires_python: Option<String>,
}

impl Metadata {
    /// Reads `{name}-{version}.dist-info/METADATA` from the wheel at `path`.
    pub fn read(path: &Path, wheel_name: &str) -> Result<Self> {
        let bad = |what: String| Error::invalid(format!("the wheel {wheel_name} {what}"));
        let file = std::fs::File::open(path)
            .map_err(|e| Error::internal(format!("opening the wheel {wheel_name}: {e}")))?;
        let mut archive = zip::ZipArchive::new(file)
            .map_err(|e| bad(format!("is not a readable zip archive: {e}")))?;
        if archive.len() > MAX_WHEEL_ENTRIES {
            return Err(bad(format!("has more than {MAX_WHEEL_ENTRIES} entries")));
        }
        let metadata_name = archive
            .file_names()
            .filter_map(std::result::Result::ok)
            .find(|name| {
                name.strip_suffix(".dist-info/METADATA")
                    .is_some_and(|dir| !dir.contains('/'))
            })
            .map(std::borrow::Cow::into_owned)
            .ok_or_else(|| bad("has no .dist-info/METADATA".into()))?;
        let entry = archive
            .by_name(&metadata_name)
            .map_err(|e| bad(format!("has an unreadable METADATA: {e}")))?;
        let mut text = String::new();
        entry
            .take(MAX_METADATA_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("has an unreadable METADATA: {e}")))?;
        Self::parse(&text).ok_or_else(|| bad("has METADATA without Name and Version".into()))
    }

    /// The headers of core metadata (RFC 822 style; the body after the first blank line is the
    /// description). Continuation lines are folded.
    pub fn parse(text: &str) -> Option<Self> {
        let mut headers: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if line.is_empty() {
                break;
            }
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = headers.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            if let Some((key, value)) = line.split_once(':') {
                headers.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
        }
        let first = |key: &str| {
            headers
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        Some(Metadata {
            name: first("name").filter(|n| !n.is_empty())?,
            version: first("version").filter(|v| !v.is_empty())?,
            requires_dist: headers
                .iter()
                .filter(|(k, _)| k == "requires-dist")
                .map(|(_, v)| v.clone())
                .collect(),
            requires_python: first("requires-python").filter(|v| !v.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_headers_are_read() {
        let text = "Metadata-Version: 2.1\nName: requests\nVersion: 2.32.3\n\
                    Requires-Python: >=3.8\nRequires-Dist: charset-normalizer (<4,>=2)\n\
                    Requires-Dist: PySocks (!=1.5.7,>=1.5.6) ; extra == 'socks'\n\
                    Summary: a long\n  summary\n\nRequires-Dist: not-a-header\n";
        let metadata = Metadata::parse(text).unwrap();
        assert_eq!(metadata.name, "requests");
        assert_eq!(metadata.version, "2.32.3");
        assert_eq!(metadata.requires_python.as_deref(), Some(">=3.8"));
        assert_eq!(metadata.requires_dist.len(), 2);
        assert!(Metadata::parse("Name: a\n").is_none());
    }
}
