//! Where the PostgreSQL store is: the connection string (with TLS as its `sslmode` says), the
//! pool's size, and one connection or a pool's manager made from them.

use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod};

use super::{DEFAULT_POOL_SIZE, tls, with_causes};
use crate::error::{Error, Result};

/// Where the PostgreSQL store is and how many connections it may hold.
#[derive(Clone)]
pub struct PostgresSettings {
    config: tokio_postgres::Config,
    /// TLS to the server (`sslmode`, `sslrootcert`).
    pub(super) tls: tls::PgTls,
    /// Connections at most.
    pub pool_size: usize,
}

impl std::fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("database", &self.redacted())
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

impl PostgresSettings {
    /// From a connection URL (`postgres://user:password@host:port/database`, or the key=value
    /// form), with the default pool size.
    /// `sslmode` (`disable`, the default; `prefer`, `require`, `verify-ca`, `verify-full`) and
    /// `sslrootcert` (a PEM file, or `system`) say how to use TLS, as libpq's do.
    pub fn parse(url: &str) -> Result<Self> {
        let (rest, tls) = tls::split_tls_options(url)?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
            Error::invalid(format!(
                "--database: not a PostgreSQL connection string ({e}); expected \
                 postgres://USER:PASSWORD@HOST:PORT/DATABASE"
            ))
        })?;
        config.ssl_mode(tls.tokio_mode());
        // The roots are read now: a missing file is an error at start, not at each connection.
        tls.connector()?;
        Ok(Self {
            config,
            tls,
            pool_size: DEFAULT_POOL_SIZE,
        })
    }

    /// Whether every host is this machine (a Unix socket, or a loopback address or name).
    pub(super) fn on_loopback(&self) -> bool {
        self.config.get_hosts().iter().all(|host| match host {
            tokio_postgres::config::Host::Unix(_) => true,
            tokio_postgres::config::Host::Tcp(name) => {
                name == "localhost"
                    || name
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
        })
    }

    /// The pool's manager, over TLS as the settings ask.
    pub(super) fn manager(&self) -> Result<Manager> {
        let recycling = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        Ok(match self.tls.connector()? {
            Some(tls) => Manager::from_config(self.config.clone(), tls, recycling),
            None => Manager::from_config(self.config.clone(), tokio_postgres::NoTls, recycling),
        })
    }

    /// One connection, its driver running on a task of its own.
    pub(super) async fn connect_once(
        &self,
    ) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
        let failed = |e: tokio_postgres::Error| {
            Error::internal(format!("{}: {}", self.redacted(), with_causes(&e)))
        };
        Ok(match self.tls.connector()? {
            Some(tls) => {
                let (client, connection) = self.config.connect(tls).await.map_err(failed)?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
            None => {
                let (client, connection) = self
                    .config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(failed)?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
        })
    }

    /// The database, without its password: for logs and errors.
    pub fn redacted(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|host| match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        format!(
            "postgres://{}@{}:{}/{}",
            self.config.get_user().unwrap_or(""),
            hosts.join(","),
            self.config.get_ports().first().copied().unwrap_or(5432),
            self.config.get_dbname().unwrap_or("")
        )
    }

    /// The same server and user, another database.
    #[must_use]
    pub fn with_database(mut self, name: &str) -> Self {
        self.config.dbname(name);
        self
    }
}
