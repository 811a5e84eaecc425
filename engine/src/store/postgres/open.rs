//! Opening the PostgreSQL store: reaching the server, the pool, the schema made or upgraded under
//! an advisory lock, and the hold one server takes on its database.

use deadpool_postgres::{Pool, Runtime};

use super::schema::{self, Dialect, VERSION};
use super::{
    CONNECT_TIMEOUT, PostgresSettings, PostgresStore, SCHEMA_LOCK, SERVER_LOCK, column, failed,
};
use crate::error::{Error, Result};

impl PostgresStore {
    /// Connects once and asks the server's version and whether the connection is encrypted,
    /// changing nothing (`evervm doctor`): `PostgreSQL 15.14, over TLSv1.3`.
    pub async fn reach(settings: &PostgresSettings) -> Result<String> {
        let database = settings.redacted();
        let ask = async {
            let (client, connection) = settings.connect_once().await?;
            let row = client
                .query_one(
                    "SELECT current_setting('server_version'), \
                     (SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl)",
                    &[],
                )
                .await;
            drop(client);
            let _ = connection.await;
            let row = row.map_err(|e| Error::internal(format!("{database}: {e}")))?;
            let version: String = column(&row, 0)?;
            Ok(match column::<Option<String>>(&row, 1)? {
                Some(tls) => format!("PostgreSQL {version}, over {tls}"),
                None => format!("PostgreSQL {version}, not encrypted"),
            })
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, ask).await {
            Ok(result) => result,
            Err(_) => Err(Error::internal(format!(
                "{database} did not answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Connects (a pool of up to `settings.pool_size` connections) and makes or upgrades the
    /// schema.
    pub async fn connect(settings: &PostgresSettings) -> Result<Self> {
        let database = settings.redacted();
        if !settings.tls.encrypts() && !settings.on_loopback() {
            tracing::warn!(
                "the PostgreSQL store {database} is reached without TLS: its traffic (tokens' \
                 hashes, code, output, secrets) crosses the network in the clear; add \
                 ?sslmode=verify-full&sslrootcert=CA.pem to --database"
            );
        }
        let manager = settings.manager()?;
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| Error::internal(format!("PostgreSQL pool for {database}: {e}")))?;
        let store = Self {
            pool,
            database,
            held: std::sync::Mutex::new(None),
            keys: None,
        };
        store.prepare().await.map_err(|e| {
            e.context(format!(
                "opening the PostgreSQL store {} (is the server running, and may this user \
                 create tables in that database?)",
                store.database
            ))
        })?;
        Ok(store)
    }

    /// Makes this the only server on the database while it lives: a second one is refused
    /// (nodes sharing one database are still to come).
    pub async fn hold_for_this_server(&self) -> Result<()> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&SERVER_LOCK])
            .await
            .map_err(failed)?;
        if !column::<bool>(&row, 0)? {
            return Err(Error::new(
                crate::ErrorKind::Conflict,
                format!(
                    "another evervm server uses the database {}: stop it, give this server a \
                     database of its own, or run both as nodes of one cluster (--advertise, \
                     with --snapshots)",
                    self.database
                ),
            ));
        }
        if let Ok(mut held) = self.held.lock() {
            *held = Some(deadpool_postgres::Object::take(client));
        }
        Ok(())
    }

    /// Makes the schema in a new database, upgrades an older one, refuses a newer one.
    async fn prepare(&self) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
            .await
            .map_err(failed)?;
        tx.batch_execute(&schema::base(Dialect::Postgres))
            .await
            .map_err(failed)?;
        let version = tx
            .query_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])
            .await
            .map_err(failed)?
            .map(|row| column::<String>(&row, 0))
            .transpose()?;
        match version {
            None => {
                tx.batch_execute(&schema::machine_rows(Dialect::Postgres))
                    .await
                    .map_err(failed)?;
                tx.batch_execute(&schema::audit(Dialect::Postgres))
                    .await
                    .map_err(failed)?;
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', $1)",
                    &[&VERSION.to_string()],
                )
                .await
                .map_err(failed)?;
            }
            Some(text) => {
                let version = text.parse::<i64>().unwrap_or(-1);
                if !(6..=VERSION).contains(&version) {
                    return Err(Error::internal(format!(
                        "the database has schema version {text}, this engine knows version \
                         {VERSION}: use the evervm release that wrote it"
                    )));
                }
                for (_, statements) in schema::migrations_after(version, Dialect::Postgres) {
                    tx.batch_execute(&statements).await.map_err(failed)?;
                }
                tx.execute(
                    "UPDATE meta SET value = $1 WHERE key = 'schema_version'",
                    &[&VERSION.to_string()],
                )
                .await
                .map_err(failed)?;
            }
        }
        tx.batch_execute(&schema::indexes(Dialect::Postgres))
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)
    }
}
