//! A database of its own on the test PostgreSQL server (`EVERVM_TEST_POSTGRES`, which
//! `scripts/test.sh` starts), dropped when the test ends.

/// A scratch database: its connection string, dropped with it.
pub struct ScratchPostgres {
    server: String,
    name: String,
    /// The database's connection string, for `--database`.
    pub url: String,
}

impl ScratchPostgres {
    /// A new database, or `None` (with a note) when no test server is configured outside CI.
    pub fn create() -> Option<Self> {
        let Ok(server) = std::env::var("EVERVM_TEST_POSTGRES") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the PostgreSQL tests: set EVERVM_TEST_POSTGRES (scripts/test.sh \
                 starts a server)"
            );
            eprintln!("skipping: EVERVM_TEST_POSTGRES is not set (scripts/test.sh sets it)");
            return None;
        };
        let name = format!("evervm_test_{:016x}", rand::random::<u64>());
        run_sql(&server, &format!("CREATE DATABASE {name}"));
        let url = match server.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{name}"),
            None => panic!("EVERVM_TEST_POSTGRES is not a postgres:// URL: {server}"),
        };
        Some(Self { server, name, url })
    }
}

impl Drop for ScratchPostgres {
    fn drop(&mut self) {
        run_sql(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// Runs `sql` on the server at `url` (on a runtime of its own: callers may be sync tests).
fn run_sql(url: &str, sql: &str) {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("the test PostgreSQL server answers");
            tokio::spawn(connection);
            client
                .batch_execute(&sql)
                .await
                .expect("the statement runs");
        });
    })
    .join()
    .expect("the statement's thread");
}
