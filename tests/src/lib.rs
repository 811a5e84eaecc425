//! Test harness shared by the end-to-end suites: which backends this host can run, and a real
//! evervm server on a loopback port with its own home.

// Test support: a failed set-up should stop the test at once.
#![allow(clippy::expect_used, clippy::panic)]

pub mod bucket;
pub mod package_index;
pub mod postgres;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;

use evervm::engine::{BackendChoice, Engine, EngineConfig, create_token_in_home};

/// Every backend, best first.
pub const ALL_BACKENDS: [&str; 2] = ["gvisor", "process"];

/// The backends `EVERVM_TEST_BACKENDS` (comma-separated) names, if it is set.
pub fn backends_from_env() -> Option<Vec<String>> {
    let list = std::env::var("EVERVM_TEST_BACKENDS").ok()?;
    Some(
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// Keeps the backends that pass `probe`, printing why each other one is skipped. In CI (which
/// installs gVisor) a gVisor that does not work is a failure, never a skip.
pub fn available_backends(probe: impl Fn(&str) -> Result<(), String>) -> Vec<String> {
    let mut found = Vec::new();
    for backend in ALL_BACKENDS {
        match probe(backend) {
            Ok(()) => found.push(backend.to_owned()),
            Err(reason) if backend == "gvisor" && std::env::var_os("CI").is_some() => {
                panic!("gVisor must be available in CI, but: {reason}")
            }
            Err(reason) => eprintln!("skipping the {backend} backend: {reason}"),
        }
    }
    found
}

/// The backends the suites run on: `EVERVM_TEST_BACKENDS`, otherwise every backend this host
/// can run.
pub fn backends() -> &'static [String] {
    static BACKENDS: OnceLock<Vec<String>> = OnceLock::new();
    BACKENDS.get_or_init(|| backends_from_env().unwrap_or_else(|| available_backends(probe)))
}

/// Runs one instruction on the backend, on a thread of its own (callers may be inside a runtime).
fn probe(backend: &str) -> Result<(), String> {
    let backend = backend.to_owned();
    std::thread::spawn(move || probe_on_this_thread(&backend))
        .join()
        .unwrap_or_else(|_| Err("the probe panicked".to_owned()))
}

fn probe_on_this_thread(backend: &str) -> Result<(), String> {
    let home = tempfile::tempdir().map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut config = EngineConfig::new(home.path());
        config.backend = BackendChoice::parse(backend);
        let engine = Engine::open(config).await.map_err(|e| e.to_string())?;
        let account = engine
            .ensure_account("probe")
            .await
            .map_err(|e| e.to_string())?;
        let client = evervm::Client::from_engine(engine.clone(), account);
        let machine = client
            .create_machine(evervm::CreateMachineOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let run = machine.exec("1 + 1").await.map_err(|e| e.to_string())?;
        engine.shutdown().await;
        match run.result.value.as_deref() {
            Some("2") => Ok(()),
            _ => Err(format!("a probe instruction gave {:?}", run.result)),
        }
    })
}

/// An evervm server on `127.0.0.1:<free port>` with a fresh home, running on its own thread
/// and runtime, stopped when dropped.
pub struct TestServer {
    pub url: String,
    pub address: SocketAddr,
    /// A token of the account `default`.
    pub token: String,
    pub backend: String,
    home: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(backend: &str) -> Self {
        Self::start_with(backend, |_| {})
    }

    /// [`TestServer::start`], with the engine's settings changed by `adjust` first.
    pub fn start_with(
        backend: &str,
        adjust: impl FnOnce(&mut EngineConfig) + Send + 'static,
    ) -> Self {
        let home = tempfile::tempdir().expect("a temporary home");
        let token = create_token_in_home(home.path(), "default", None).expect("a token");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let home_path = home.path().to_owned();
        let backend_name = backend.to_owned();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async move {
                let mut config = EngineConfig::new(home_path);
                config.backend = BackendChoice::parse(&backend_name);
                adjust(&mut config);
                let engine = Engine::open(config).await.expect("the engine opens");
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("a loopback port");
                let address = listener.local_addr().expect("an address");
                ready_tx.send(address).expect("the test waits");
                let shutdown = async {
                    let _ = stopped.await;
                };
                evervm::server::serve_with_shutdown(engine.clone(), listener, shutdown)
                    .await
                    .expect("the server runs");
                engine.shutdown().await;
            });
        });
        let address = ready_rx.recv().expect("the server starts");
        Self {
            url: format!("http://{address}"),
            address,
            token,
            backend: backend.to_owned(),
            home,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// A token of another account.
    pub fn token_for(&self, account: &str) -> String {
        create_token_in_home(self.home.path(), account, None).expect("a token")
    }

    pub fn client(&self) -> evervm::Client {
        evervm::Client::remote(&self.url, &self.token).expect("a client")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Flips a byte in the middle of the largest file of the snapshot in `dir` (whatever the
/// backend and its compression named it), as a disk error would. Panics where there is none: a
/// test that damages a snapshot must have one.
pub fn damage_snapshot(dir: &std::path::Path) -> std::path::PathBuf {
    let largest = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .flatten()
        .filter(|e| e.file_name() != "manifest.json")
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max()
        .map_or_else(
            || panic!("no snapshot file in {}", dir.display()),
            |(_, path)| path,
        );
    let mut bytes = std::fs::read(&largest)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", largest.display()));
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&largest, &bytes)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", largest.display()));
    largest
}
