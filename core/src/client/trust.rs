//! Which servers a remote client trusts over https: by default the roots every client is built
//! with (Mozilla's, as browsers); with a CA file (`EVERVM_CA_FILE`, `ca_file=`, `--ca-file`),
//! the certificates in it and no others, as `curl --cacert` does. The same TLS setup serves the
//! client's HTTP requests and its WebSocket sessions, so both verify alike.

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The environment variable naming a CA file (PEM) that remote clients trust instead of the
/// default roots.
pub const CA_FILE_ENV: &str = "EVERVM_CA_FILE";

/// Whom a remote client trusts.
#[derive(Debug, Clone, Default)]
pub enum Trust {
    /// The default roots.
    #[default]
    DefaultRoots,
    /// Only the certificates in this PEM file.
    CaFile(PathBuf),
}

impl Trust {
    /// `ca_file` when given, else the file `EVERVM_CA_FILE` names when set, else the default
    /// roots.
    pub fn from_option_or_env(ca_file: Option<PathBuf>) -> Self {
        ca_file
            .or_else(|| {
                std::env::var_os(CA_FILE_ENV)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .map_or(Trust::DefaultRoots, Trust::CaFile)
    }

    /// The TLS configuration for this trust; `None` for the default roots (each library's own).
    pub(crate) fn client_config(&self) -> Result<Option<Arc<rustls::ClientConfig>>> {
        match self {
            Trust::DefaultRoots => Ok(None),
            Trust::CaFile(_) => self.rustls_config().map(Some),
        }
    }

    /// A rustls configuration for this trust, the default roots being Mozilla's.
    pub fn rustls_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let ca_file = match self {
            Trust::DefaultRoots => None,
            Trust::CaFile(path) => Some(path.as_path()),
        };
        let roots = evervm_engine::certificates::roots(ca_file, "the CA file")?;
        let config = evervm_engine::certificates::client_config(roots)
            .map_err(|e| Error::transport(e.message().to_owned()))?;
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_is_missing_or_holds_no_certificate_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Trust::CaFile(dir.path().join("absent.pem"));
        let error = missing.client_config().unwrap_err().to_string();
        assert!(error.contains("absent.pem"), "{error}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = Trust::CaFile(empty)
            .client_config()
            .unwrap_err()
            .to_string();
        assert!(error.contains("no certificate in it"), "{error}");
        assert!(Trust::DefaultRoots.client_config().unwrap().is_none());
    }
}
