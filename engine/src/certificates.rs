//! PEM certificates read from a file, for every TLS setup that trusts or presents one: the
//! clients' CA files, the server's certificate chain, the PostgreSQL store's root certificate.

use std::path::Path;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::error::{Error, Result};

/// The certificates in the PEM file at `path`, refused with `what` (`"the CA file"`) and the
/// path named when it cannot be read or holds none (`expected` says what it should hold).
pub fn read_certificates(
    path: &Path,
    what: &str,
    expected: &str,
) -> Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<std::result::Result<Vec<_>, _>>)
        .map_err(|e| {
            Error::invalid(format!(
                "{what} {}: not PEM certificates ({e})",
                path.display()
            ))
        })?;
    if certificates.is_empty() {
        return Err(Error::invalid(format!(
            "{what} {}: no certificate in it ({expected})",
            path.display()
        )));
    }
    Ok(certificates)
}

/// The roots a TLS client trusts: the certificates of `ca_file` (PEM; `what` names it in
/// errors) and no others, or Mozilla's when `None`.
pub fn roots(ca_file: Option<&Path>, what: &str) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(path) => {
            let expected = "a PEM file with BEGIN CERTIFICATE blocks";
            for certificate in read_certificates(path, what, expected)? {
                roots.add(certificate).map_err(|e| {
                    Error::invalid(format!(
                        "{what} {}: a certificate in it cannot be trusted: {e}",
                        path.display()
                    ))
                })?;
            }
        }
    }
    Ok(roots)
}

/// A TLS client configuration on ring (whatever the process's default provider) trusting
/// `roots`.
pub fn client_config(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
