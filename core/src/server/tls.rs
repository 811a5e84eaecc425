//! TLS for the server's listeners (`evervm serve --tls-cert FILE --tls-key FILE`): rustls with
//! the certificate chain and key read from PEM files, read again on SIGHUP (a renewed
//! certificate is served to the next connection; files that do not load leave the one in use).
//!
//! Handshakes run beside the accept loop, each bounded in time, at most
//! [`MAX_HANDSHAKES`] at once: a client that opens a connection and says nothing holds one
//! place for [`HANDSHAKE_TIMEOUT`], never the listener.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::error::{Error, Result};

/// The longest a client may take to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most handshakes under way at once on one listener; beyond, accepting waits.
pub const MAX_HANDSHAKES: usize = 256;
/// Connections handshaken and not yet taken by the server.
const READY_QUEUE: usize = 64;

/// A certificate and key, served by every listener made from it, reloaded on SIGHUP.
#[derive(Debug, Clone)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    config: Arc<RwLock<Arc<ServerConfig>>>,
}

impl Tls {
    /// Reads the certificate chain (PEM, the server's own first) and its private key (PEM:
    /// PKCS#8, PKCS#1 or SEC1). Errors name the file and what is wrong with it.
    pub fn load(cert: &Path, key: &Path) -> Result<Self> {
        let config = server_config(cert, key)?;
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            config: Arc::new(RwLock::new(Arc::new(config))),
        })
    }

    /// Reads the files again; on failure the certificate in use stays.
    pub fn reload(&self) -> Result<()> {
        let config = server_config(&self.cert, &self.key)?;
        *self
            .config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
        Ok(())
    }

    /// Reloads on every SIGHUP for as long as the runtime runs (Unix; elsewhere nothing).
    pub fn reload_on_sighup(&self) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut hangups = match signal(SignalKind::hangup()) {
                Ok(hangups) => hangups,
                Err(e) => {
                    tracing::warn!(
                        "cannot listen for SIGHUP ({e}): the certificate is not reloaded"
                    );
                    return;
                }
            };
            let tls = self.clone();
            tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    match tls.reload() {
                        Ok(()) => {
                            tracing::info!(cert = %tls.cert.display(), "reloaded the TLS certificate");
                        }
                        Err(e) => {
                            tracing::error!(
                                "SIGHUP: {e}; still serving the certificate loaded before"
                            );
                        }
                    }
                }
            });
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        let config = self
            .config
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        TlsAcceptor::from(config)
    }

    /// `listener`, with every connection handshaken before the server sees it.
    pub fn listener(&self, listener: TcpListener) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (ready, incoming) = mpsc::channel(READY_QUEUE);
        let tls = self.clone();
        let accepting = tokio::spawn(accept_loop(listener, tls, ready));
        Ok(TlsListener {
            incoming,
            local,
            accepting,
        })
    }
}

fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig> {
    let chain = evervm_engine::certificates::read_certificates(
        cert,
        "--tls-cert",
        "a PEM file with BEGIN CERTIFICATE blocks, the server's own first",
    )?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        Error::invalid(format!(
            "--tls-key {}: not a PEM private key ({e})",
            key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            Error::invalid(format!(
                "--tls-cert {} and --tls-key {}: {e} (is the key the certificate's?)",
                cert.display(),
                key.display()
            ))
        })?;
    // The server speaks HTTP/1.1 (its WebSockets too).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

async fn accept_loop(
    listener: TcpListener,
    tls: Tls,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(place) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait, as axum's own loop does.
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if ready.is_closed() {
            return;
        }
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let acceptor = tls.acceptor();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _place = place;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = ready.send((stream, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// A listener whose connections are TLS streams, for `axum::serve`.
#[derive(Debug)]
pub struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accept loop ended (its listener failed for good): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_a_certificate_and_key_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let why = Tls::load(&missing, &missing).unwrap_err().to_string();
        assert!(
            why.contains("--tls-cert") && why.contains("missing.pem"),
            "{why}"
        );
        let why = Tls::load(&empty, &empty).unwrap_err().to_string();
        assert!(why.contains("no certificate"), "{why}");
    }
}
