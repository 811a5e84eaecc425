//! A node that loses the database stops its machines before its leases run out, and another node
//! then runs them from their last snapshot (gVisor, PostgreSQL, the test bucket). The database is
//! reached through a proxy the test cuts.

use std::time::{Duration, Instant};

use evervm::engine::bucket::BucketSettings;
use evervm::engine::store::PostgresSettings;
use evervm::engine::{Engine, NodeSettings};
use evervm_tests::{backends, bucket::scratch_bucket, postgres::ScratchPostgres};

use super::value;

/// A TCP proxy to `target` on a loopback port; `cut` closes every connection and refuses new
/// ones.
struct Proxy {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    async fn start(target: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, watching) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if *watching.borrow() {
                    continue;
                }
                let mut watching = watching.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = watching.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { port, cut }
    }
}

/// `postgres://USER@HOST:PORT/DB` with the port replaced.
fn through_port(url: &str, port: u16) -> String {
    let mut parsed = url::Url::parse(url).unwrap();
    parsed.set_port(Some(port)).unwrap();
    parsed.to_string()
}

fn node_config(
    home: &std::path::Path,
    database: &str,
    bucket: &str,
    id: &str,
) -> evervm::engine::EngineConfig {
    let mut config = super::gvisor_config(home);
    config.database = Some(PostgresSettings::parse(database).unwrap());
    config.snapshots = Some(BucketSettings::parse(bucket).unwrap());
    // No one serves this address: the test talks to each engine in process.
    let mut node = NodeSettings::new(id, "http://127.0.0.1:9").unwrap();
    node.lease_ttl = Duration::from_secs(2);
    config.node = Some(node);
    config
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_cut_from_the_database_stops_its_machines_and_another_takes_them() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let Some(database) = ScratchPostgres::create() else {
        return;
    };
    let Some(bucket) = scratch_bucket() else {
        return;
    };
    let direct = url::Url::parse(&database.url).unwrap();
    let target = format!(
        "{}:{}",
        direct.host_str().unwrap(),
        direct.port().unwrap_or(5432)
    )
    .parse()
    .unwrap();
    let proxy = Proxy::start(target).await;
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let through_proxy = through_port(&database.url, proxy.port);
    let engine_a = Engine::open(node_config(home_a.path(), &through_proxy, &bucket, "cut-a"))
        .await
        .unwrap();
    let account = engine_a.ensure_account("local").await.unwrap();
    let client_a = evervm::Client::from_engine(engine_a.clone(), account.clone());
    let machine = super::new_machine(&client_a, Some("minimal")).await;
    let name = machine.name().to_owned();
    value(&machine, "x = 'saved'").await;
    machine.swap_out().await.unwrap();
    value(&machine, "x = 'unsaved'").await;
    assert!(engine_a.sandbox_pid(&name).is_some(), "it runs on A");

    // A loses the database. B asks for the machine from then on: it is refused while A's
    // lease may hold, and takes it once the lease ran out, from its last snapshot, saying what
    // was lost. By then A has stopped it.
    let engine_b = Engine::open(node_config(home_b.path(), &database.url, &bucket, "cut-b"))
        .await
        .unwrap();
    let client_b = evervm::Client::from_engine(engine_b.clone(), account);
    let on_b = client_b.machine(&name);
    proxy.cut.send_replace(true);
    let cut = Instant::now();
    let deadline = cut + Duration::from_secs(30);
    let run = loop {
        match on_b.exec("x").await {
            Ok(run) if run.result.error.is_none() => break run,
            Ok(run) => eprintln!("not yet: {:?}", run.result.error),
            Err(e) => eprintln!("not yet: {e}"),
        }
        assert!(Instant::now() < deadline, "B never took the machine");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        engine_a.sandbox_pid(&name).is_none(),
        "B runs the machine while A still does"
    );
    eprintln!(
        "B ran the machine {:.2} s after A lost the database (leases of 2 s)",
        cut.elapsed().as_secs_f64()
    );
    assert_eq!(run.result.value.as_deref(), Some("'saved'"), "{run:?}");
    let said: String = run.output.iter().map(|c| c.data.as_str()).collect();
    assert!(said.contains("not saved"), "B says what was lost: {said:?}");
    engine_b.shutdown().await;
    // A cannot save anything for the machine: its shutdown finds the database gone.
    engine_a.shutdown().await;
}

/// History in a cluster: points taken on node A are in the bucket; once A swapped the machine
/// out, node B lists them, undoes to one and forks at another. A save of a machine that changed
/// one variable sends the bucket only the chunks it lacks.
#[tokio::test(flavor = "multi_thread")]
async fn undo_points_taken_on_one_node_serve_a_rewind_on_another() {
    let Some(database) = ScratchPostgres::create() else {
        return;
    };
    let Some(bucket) = scratch_bucket() else {
        return;
    };
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = |home: &std::path::Path, id: &str| {
        let mut config = node_config(home, &database.url, &bucket, id);
        // Saves chunked as they are made, whatever the test machine's defaults.
        config.compress_swaps = true;
        config.chunk_snapshots = true;
        config
    };
    let Some((engine_a, client_a)) =
        super::engine_saving_in_place(config(home_a.path(), "history-a")).await
    else {
        return;
    };
    let Some((engine_b, client_b)) =
        super::engine_saving_in_place(config(home_b.path(), "history-b")).await
    else {
        return;
    };

    // What a swap-out sends once the bucket holds the machine's previous snapshot (10 MB
    // whole; about 230 KB chunked, measured).
    let plain = super::new_machine(&client_a, Some("minimal")).await;
    value(
        &plain,
        "import json\nrows = [json.dumps({'i': i}) for i in range(1000)]",
    )
    .await;
    plain.swap_out().await.unwrap();
    value(&plain, "x = 1").await;
    plain.swap_out().await.unwrap();
    let before = engine_a.bucket_bytes_sent().unwrap();
    value(&plain, "x = 2").await;
    plain.swap_out().await.unwrap();
    let sent = engine_a.bucket_bytes_sent().unwrap() - before;
    eprintln!("figure: a swap-out after `x = 2` sent {sent} bytes to the bucket");
    assert!(sent <= 1024 * 1024, "a swap-out sent {sent} bytes");

    let machine = client_a
        .create_machine(evervm::CreateMachineOptions {
            history: Some(5),
            image: Some("minimal".into()),
            ..evervm::CreateMachineOptions::default()
        })
        .await
        .unwrap();
    let name = machine.name().to_owned();
    for code in ["n = 1", "n = 2", "n = 3"] {
        value(&machine, code).await;
    }
    machine.swap_out().await.unwrap();
    assert!(engine_a.sandbox_pid(&name).is_none());

    // B sees A's points, undoes the last instruction and forks at the first.
    let on_b = client_b.machine(&name);
    let history = on_b.history(None).await.unwrap();
    let kept = super::history::seqs_where(&history, |i| i.undo_point);
    assert_eq!(kept, [0, 1, 2], "{history:?}");
    assert!(history.initial_point);
    let undone = on_b.undo().await.unwrap();
    assert_eq!(undone.to, 1);
    assert_eq!(value(&on_b, "n").await, "2");
    assert!(engine_b.sandbox_pid(&name).is_some(), "it runs on B now");
    let fork = on_b.fork_at(0, None).await.unwrap();
    assert_eq!(value(&fork, "n").await, "1");

    // Deleted, the machine leaves no point in the bucket.
    fork.delete().await.unwrap();
    on_b.delete().await.unwrap();
    plain.delete().await.unwrap();
    let store = evervm::engine::bucket::Bucket::open(&BucketSettings::parse(&bucket).unwrap())
        .await
        .unwrap();
    assert!(
        store
            .whole_under(&format!("machines/{name}/history"))
            .await
            .unwrap()
            .is_empty()
    );
    engine_b.shutdown().await;
    engine_a.shutdown().await;
}
