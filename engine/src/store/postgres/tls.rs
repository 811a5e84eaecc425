//! TLS to PostgreSQL, as libpq's `sslmode` and `sslrootcert` say, over rustls. tokio-postgres
//! knows only `disable`, `prefer` and `require` and verifies nothing itself: this module takes
//! both options out of the connection string and makes the connector that does what they ask.
//!
//! - `disable` (and no `sslmode`: evervm's default, as before): plain TCP.
//! - `prefer`, `require`: TLS when the server offers it (`require`: or no connection), the
//!   server's certificate not checked, as libpq does without a root certificate.
//! - `verify-ca`: TLS, the certificate chain checked against the roots.
//! - `verify-full`: and the certificate must name the host connected to.
//!
//! The roots are `sslrootcert=FILE` (PEM), or Mozilla's with `sslrootcert=system`; the verifying
//! modes need one of the two, as libpq's do.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::error::{Error, Result};

/// What `sslmode` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SslMode {
    #[default]
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Result<Self> {
        Ok(match text {
            "disable" | "allow" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(Error::invalid(format!(
                    "--database: sslmode={other} is not one of disable, prefer, require, \
                     verify-ca, verify-full"
                )));
            }
        })
    }
}

/// Where the roots of the verifying modes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// Mozilla's (`sslrootcert=system`).
    System,
    File(PathBuf),
}

/// The TLS a connection string asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PgTls {
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<RootCert>,
}

impl PgTls {
    /// Whether connections are encrypted (or may be: `prefer`).
    pub(crate) fn encrypts(&self) -> bool {
        self.mode != SslMode::Disable
    }

    /// tokio-postgres's own mode for this one (the verifying modes are `require` to it).
    pub(crate) fn tokio_mode(&self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Tokio;
        match self.mode {
            SslMode::Disable => Tokio::Disable,
            SslMode::Prefer => Tokio::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Tokio::Require,
        }
    }

    /// The connector: `None` for plain TCP.
    pub(crate) fn connector(&self) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>> {
        let verify = |name: bool| -> Result<rustls::ClientConfig> {
            let roots = match &self.root_cert {
                Some(RootCert::System) => crate::certificates::roots(None, "sslrootcert")?,
                Some(RootCert::File(path)) => {
                    crate::certificates::roots(Some(path), "--database: sslrootcert")?
                }
                None => {
                    return Err(Error::invalid(
                        "--database: sslmode=verify-ca and verify-full need the roots to check \
                         the server against: sslrootcert=FILE (PEM), or sslrootcert=system for \
                         Mozilla's",
                    ));
                }
            };
            let mut config = crate::certificates::client_config(roots.clone())?;
            if !name {
                let verifier = ChainOnly::new(roots)?;
                config
                    .dangerous()
                    .set_certificate_verifier(Arc::new(verifier));
            }
            Ok(config)
        };
        let config = match self.mode {
            SslMode::Disable => return Ok(None),
            SslMode::Prefer | SslMode::Require => {
                let mut config =
                    crate::certificates::client_config(rustls::RootCertStore::empty())?;
                config
                    .dangerous()
                    .set_certificate_verifier(Arc::new(Unchecked::new()));
                config
            }
            SslMode::VerifyCa => verify(false)?,
            SslMode::VerifyFull => verify(true)?,
        };
        Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
    }
}

/// Takes `sslmode` and `sslrootcert` out of a connection string (the URL's query, or the
/// key=value form): the rest, for tokio-postgres, and the TLS they ask for.
pub(crate) fn split_tls_options(text: &str) -> Result<(String, PgTls)> {
    let mut tls = PgTls::default();
    let mut take = |key: &str, value: &str| -> Result<bool> {
        match key {
            "sslmode" => tls.mode = SslMode::parse(value)?,
            "sslrootcert" => {
                tls.root_cert = Some(match value {
                    "system" => RootCert::System,
                    path => RootCert::File(PathBuf::from(path)),
                });
            }
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        match text.split_once('?') {
            None => text.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    let value = percent_decode(value);
                    if !take(key, &value)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        // key=value pairs separated by spaces (values with spaces are quoted: kept as they are).
        let mut kept = Vec::new();
        for pair in text.split_whitespace() {
            let taken = match pair.split_once('=') {
                Some((key, value)) => take(key.trim(), value.trim_matches('\''))?,
                None => false,
            };
            if !taken {
                kept.push(pair);
            }
        }
        kept.join(" ")
    };
    if tls.root_cert.is_some() && matches!(tls.mode, SslMode::Disable) {
        return Err(Error::invalid(
            "--database: sslrootcert is given but sslmode is not: add sslmode=verify-full",
        ));
    }
    Ok((rest, tls))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The handshake's signatures checked with ring's algorithms.
fn algorithms() -> rustls::crypto::WebPkiSupportedAlgorithms {
    rustls::crypto::ring::default_provider().signature_verification_algorithms
}

/// `require`: any certificate, as libpq takes it without a root certificate; the handshake's
/// signatures are still checked.
#[derive(Debug)]
struct Unchecked {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl Unchecked {
    fn new() -> Self {
        Self {
            algorithms: algorithms(),
        }
    }
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain checked against the roots, whatever name the certificate holds.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ChainOnly {
    fn new(roots: rustls::RootCertStore) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| Error::invalid(format!("--database: sslrootcert: {e}")))?;
        Ok(Self { inner })
    }
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_both_forms() {
        let (rest, tls) = split_tls_options(
            "postgres://u:p@db.example:5432/evervm?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u:p@db.example:5432/evervm?application_name=x"
        );
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert, Some(RootCert::File("/etc/ca.pem".into())));
        let (rest, tls) =
            split_tls_options("host=db user=u sslmode=require dbname=evervm").unwrap();
        assert_eq!(rest, "host=db user=u dbname=evervm");
        assert_eq!(tls.mode, SslMode::Require);
        let (rest, tls) = split_tls_options("postgres://u@h/db").unwrap();
        assert_eq!(
            (rest.as_str(), tls),
            ("postgres://u@h/db", PgTls::default())
        );
        assert!(split_tls_options("postgres://u@h/db?sslmode=sometimes").is_err());
        assert!(split_tls_options("postgres://u@h/db?sslrootcert=/x").is_err());
        // The verifying modes need roots.
        let (_, tls) = split_tls_options("postgres://u@h/db?sslmode=verify-full").unwrap();
        let missing = tls.connector().err().unwrap();
        assert!(missing.message().contains("sslrootcert"), "{missing}");
        let (_, tls) =
            split_tls_options("postgres://u@h/db?sslmode=verify-ca&sslrootcert=system").unwrap();
        assert!(tls.connector().unwrap().is_some());
    }
}
