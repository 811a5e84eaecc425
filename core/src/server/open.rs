//! Opening an engine to serve it: what `evervm serve` does, without reaching into the engine.

use std::future::Future;
use std::path::{Path, PathBuf};

use evervm_engine::{BackendChoice, Engine};

use crate::error::{Error, ErrorKind, Result};

/// How to open the engine that a server exposes.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// The engine's home (default: [`crate::admin::default_home`]).
    pub home: Option<PathBuf>,
    /// The sandbox backend: `auto` (the default: gVisor, and no server at all where gVisor does
    /// not run), `gvisor`, or `process`, which is no security boundary and serves only when
    /// named here.
    pub backend: Option<String>,
    /// The network of machines created without one: `none` or `public`
    /// (`EVERVM_NETWORK_DEFAULT`; `none` when `None`).
    pub network_default: Option<String>,
    /// The most network a machine may ask for: `none`, `allow` or `public`
    /// (`EVERVM_NETWORK_MAX`; `public` when `None`).
    pub network_max: Option<String>,
    /// The PostgreSQL store's connection string (`--database`, `EVERVM_DATABASE`); the home's
    /// SQLite database when `None`.
    pub database: Option<String>,
    /// The bucket for machines' snapshots and checkpoints (`--snapshots s3://BUCKET/PREFIX`,
    /// `EVERVM_SNAPSHOTS`; endpoint and credentials from the standard `AWS_*` environment); the
    /// home's disk only when `None`.
    pub snapshots: Option<String>,
    /// Where the other nodes of a cluster reach this server (`--advertise http://HOST:PORT`,
    /// `EVERVM_ADVERTISE`): given, the server is a node of a cluster sharing `database` and
    /// `snapshots` with the others.
    pub advertise: Option<String>,
    /// This node's id (`--node-id`, `EVERVM_NODE_ID`; the host's name when `None`).
    pub node_id: Option<String>,
}

/// Why a server does not start on the process backend unless it is asked for by name.
pub const PROCESS_FALLBACK_REFUSED: &str = "gVisor is not available on this host (the warning \
     above says why), and the process backend is not a security boundary: code in a machine \
     shares the host's kernel and can read the host's world-readable files. Install runsc \
     (scripts/setup.sh does), or, for development only, pass `--backend process` (or set \
     EVERVM_BACKEND=process) to serve on the process backend anyway";

/// An engine opened for serving: [`open`] it, install [`super::shutdown_signal`], say that it
/// is up, then [`Server::serve_with_shutdown`].
pub struct Server {
    engine: Engine,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("home", &self.engine.home())
            .field("backend", &self.engine.backend_name())
            .finish()
    }
}

/// Opens the engine to serve. With backend `auto` a host without a working gVisor is refused
/// (`Unsupported`, the message says what to do) rather than served on the process backend, which
/// an in-process client may fall back to but a server must not.
pub async fn open(options: ServeOptions) -> Result<Server> {
    let backend = options.backend.as_deref().unwrap_or("auto");
    let mut config = crate::admin::engine_config(
        options.home,
        Some(backend),
        options.database.as_deref(),
        options.snapshots.as_deref(),
    )?;
    if let Some(advertise) = options.advertise.as_deref() {
        let id = match options.node_id {
            Some(id) => id,
            None => host_name()?,
        };
        config.node = Some(evervm_engine::NodeSettings::new(&id, advertise)?);
    } else if options.node_id.is_some() {
        return Err(Error::invalid(
            "--node-id names a node of a cluster: give --advertise too (where the other nodes \
             reach this one)",
        ));
    }
    if let Some(default) = options.network_default.as_deref() {
        config.network_default = match crate::types::NetworkMode::parse(default)? {
            crate::types::NetworkMode::None => crate::types::NetworkPolicy::None,
            crate::types::NetworkMode::Public => crate::types::NetworkPolicy::Public,
            crate::types::NetworkMode::Allow => {
                return Err(Error::invalid(
                    "the default network is `none` or `public`: an allow list is given per \
                     machine",
                ));
            }
        };
    }
    if let Some(max) = options.network_max.as_deref() {
        config.network_max = crate::types::NetworkMode::parse(max)?;
    }
    if config.network_default.mode() > config.network_max {
        return Err(Error::invalid(format!(
            "the default network `{}` is more than the most allowed, `{}`",
            config.network_default.mode(),
            config.network_max
        )));
    }
    let process_named =
        matches!(config.backend, BackendChoice::Named(ref name) if name == "process");
    let engine = Engine::open(config).await?;
    if engine.backend_name() == "process" && !process_named {
        engine.shutdown().await;
        return Err(Error::new(ErrorKind::Unsupported, PROCESS_FALLBACK_REFUSED));
    }
    Ok(Server { engine })
}

impl Server {
    /// The engine's home.
    pub fn home(&self) -> &Path {
        self.engine.home()
    }

    /// The backend in use (`gvisor`, `process`).
    pub fn backend_name(&self) -> &'static str {
        self.engine.backend_name()
    }

    /// The backend and its exact version (for gVisor: the runsc and its platform).
    pub fn backend_description(&self) -> String {
        self.engine.backend_description()
    }

    /// On a home without any token (the first start): a new token for the account `default`.
    pub async fn first_token(&self) -> Result<Option<String>> {
        if self.engine.token_count().await? > 0 {
            return Ok(None);
        }
        Ok(Some(self.engine.create_token("default").await?))
    }

    /// Serves on `listener` until `signal` completes, then stops the engine (machines are saved
    /// to disk where the backend can). See [`super::serve_with_shutdown`].
    pub async fn serve_with_shutdown<F>(
        self,
        listener: tokio::net::TcpListener,
        signal: F,
    ) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        super::serve_with_shutdown(self.engine, listener, signal).await
    }

    /// Serves the API on `listener` and, given `e2b`, E2B's API on that one (see
    /// [`super::e2b`]), both over `tls` when given, until `signal` completes; then stops the
    /// engine.
    pub async fn serve_listeners<F>(
        self,
        listener: tokio::net::TcpListener,
        e2b: Option<super::e2b::E2bListener>,
        tls: Option<super::tls::Tls>,
        signal: F,
    ) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        super::serve_listeners(self.engine, listener, e2b, tls, signal).await
    }

    /// Stops the engine without serving.
    pub async fn shutdown(self) {
        self.engine.shutdown().await;
    }
}

/// This host's name, the default id of a node.
fn host_name() -> Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map_err(|e| {
            Error::invalid(format!(
                "cannot read this host's name ({e}): give --node-id"
            ))
        })?;
    Ok(name.trim().to_owned())
}
