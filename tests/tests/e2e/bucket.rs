//! Snapshots kept in a bucket (`--snapshots`, gVisor): a machine saved by one engine comes back
//! on another engine with an empty home that shares the database and the bucket, and so do its
//! checkpoints and forks; a home's out-of-date or damaged copy is replaced by the bucket's; a
//! deleted machine leaves nothing in the bucket. Needs the test PostgreSQL server and the test
//! bucket (`scripts/test.sh` starts both).

use evervm::engine::bucket::{Bucket, BucketSettings};
use evervm::engine::{Engine, EngineConfig};
use evervm_tests::{backends, bucket::scratch_bucket, postgres::ScratchPostgres};

use super::value;

/// What the tests share: a database and a bucket prefix of their own.
struct Shared {
    database: ScratchPostgres,
    bucket_url: String,
}

impl Shared {
    fn create() -> Option<Self> {
        if !backends().iter().any(|b| b == "gvisor") {
            eprintln!("skipping: the gVisor backend is not available here");
            return None;
        }
        let database = ScratchPostgres::create()?;
        let bucket_url = scratch_bucket()?;
        Some(Self {
            database,
            bucket_url,
        })
    }

    fn config(&self, home: &std::path::Path) -> EngineConfig {
        let mut config = super::gvisor_config(home);
        config.database =
            Some(evervm::engine::store::PostgresSettings::parse(&self.database.url).unwrap());
        config.snapshots = Some(BucketSettings::parse(&self.bucket_url).unwrap());
        config
    }

    /// An engine on `home` and a client of it as account `local`.
    async fn open(&self, home: &std::path::Path) -> (Engine, evervm::Client) {
        let engine = Engine::open(self.config(home)).await.unwrap();
        let account = engine.ensure_account("local").await.unwrap();
        let client = evervm::Client::from_engine(engine.clone(), account);
        (engine, client)
    }

    async fn bucket(&self) -> Bucket {
        Bucket::open(&BucketSettings::parse(&self.bucket_url).unwrap())
            .await
            .unwrap()
    }
}

/// The value of `evervm_snapshot_fetches_total{source="SOURCE"}` on the engine.
async fn fetches(engine: &Engine, source: &str) -> u64 {
    let text = engine.metrics_text().await.unwrap();
    let prefix = format!("evervm_snapshot_fetches_total{{source=\"{source}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in the metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_saved_on_one_home_comes_back_on_another() {
    let Some(shared) = Shared::create() else {
        return;
    };
    let bucket = shared.bucket().await;
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    // Home A: a machine with state, swapped out to the bucket.
    let (engine_a, client_a) = shared.open(home_a.path()).await;
    let machine = super::new_machine(&client_a, Some("minimal")).await;
    let name = machine.name().to_owned();
    value(
        &machine,
        "x = 41\nopen('/tmp/kept', 'w').write('on a')\nimport random",
    )
    .await;
    machine.swap_out().await.unwrap();
    let area = format!("machines/{name}/snapshot");
    let first = bucket.snapshots(&area).await.unwrap();
    assert_eq!(first.len(), 1, "one snapshot in the bucket: {first:?}");
    engine_a.shutdown().await;

    // Home B, empty: the machine comes back from the bucket with its state.
    let (engine_b, client_b) = shared.open(home_b.path()).await;
    let machine_b = client_b.machine(&name);
    assert_eq!(
        value(&machine_b, "x + 1, open('/tmp/kept').read()").await,
        "(42, 'on a')"
    );
    assert_eq!(fetches(&engine_b, "bucket").await, 1);
    // A new machine on B starts from the base snapshot A made and shared, not from one of
    // B's own.
    let fresh = super::new_machine(&client_b, Some("minimal")).await;
    assert_eq!(value(&fresh, "1 + 1").await, "2");
    fresh.delete().await.unwrap();
    let bases = bucket.snapshots("bases/minimal-512").await.unwrap();
    assert_eq!(bases.len(), 1, "one shared base snapshot: {bases:?}");
    let taken =
        std::fs::read_to_string(home_b.path().join("base/minimal-512/manifest.json")).unwrap();
    assert!(
        taken.contains(&bases[0]),
        "B's base is the shared one: {taken}"
    );
    value(&machine_b, "x = 43").await;
    machine_b.swap_out().await.unwrap();
    // The next restore on B uses its own copy; the replaced snapshot left the bucket.
    assert_eq!(value(&machine_b, "x").await, "43");
    assert_eq!(fetches(&engine_b, "cache").await, 1);
    assert_eq!(fetches(&engine_b, "bucket").await, 1);
    let second = bucket.snapshots(&area).await.unwrap();
    assert_eq!(second.len(), 1, "the old snapshot was removed: {second:?}");
    assert_ne!(second, first);
    machine_b.checkpoint(Some("at-43")).await.unwrap();
    value(&machine_b, "x = 44").await;
    // Shutting down saves it (44) to the bucket.
    engine_b.shutdown().await;

    // Back on A, whose copy is out of date (41): the bucket's (44) wins.
    let (engine_a, client_a) = shared.open(home_a.path()).await;
    let machine_a = client_a.machine(&name);
    assert_eq!(value(&machine_a, "x").await, "44");
    assert_eq!(fetches(&engine_a, "bucket").await, 1);
    // The checkpoint taken on B rolls back on A.
    machine_a.rollback("at-43").await.unwrap();
    assert_eq!(value(&machine_a, "x").await, "43");
    // A fork's snapshot is in the bucket under its own name.
    let fork = machine_a.fork(None).await.unwrap();
    assert_eq!(value(&fork, "x").await, "43");
    let fork_area = format!("machines/{}/snapshot", fork.name());
    assert_eq!(bucket.snapshots(&fork_area).await.unwrap().len(), 1);

    // A damaged copy on the home is found at the restore and replaced by the bucket's.
    machine_a.swap_out().await.unwrap();
    let dir = evervm::engine::snapshot::snapshot_dir(home_a.path(), &name);
    evervm_tests::damage_snapshot(&dir);
    let downloaded = fetches(&engine_a, "bucket").await;
    assert_eq!(value(&machine_a, "x").await, "43");
    assert_eq!(fetches(&engine_a, "bucket").await, downloaded + 1);

    // Deleted, it leaves nothing in the bucket.
    machine_a.delete().await.unwrap();
    assert_eq!(bucket.snapshots(&area).await.unwrap(), Vec::<String>::new());
    let checkpoint_area = format!("machines/{name}/checkpoints/at-43");
    assert_eq!(
        bucket.snapshots(&checkpoint_area).await.unwrap(),
        Vec::<String>::new()
    );
    fork.delete().await.unwrap();
    assert_eq!(
        bucket.snapshots(&fork_area).await.unwrap(),
        Vec::<String>::new()
    );
    engine_a.shutdown().await;

    // The runsc A keeps for its snapshots went to the bucket when A opened again, and a new
    // home gets it at its first start.
    let kept = bucket.areas_under("runsc").await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let home_c = tempfile::tempdir().unwrap();
    let (engine_c, _) = shared.open(home_c.path()).await;
    let fetched = home_c.path().join("runsc-bin").join(&kept[0]);
    assert!(fetched.join("runsc").is_file() && fetched.join("runsc.json").is_file());
    engine_c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_homes_copies_stay_within_the_cache_bound() {
    let Some(shared) = Shared::create() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let mut config = shared.config(home.path());
    // Smaller than any snapshot: every swapped machine's copy goes.
    config.snapshot_cache_mb = 1;
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("local").await.unwrap();
    let client = evervm::Client::from_engine(engine.clone(), account);
    let machine = super::new_machine(&client, Some("minimal")).await;
    value(&machine, "y = 'kept in the bucket'").await;
    machine.swap_out().await.unwrap();
    let dir = evervm::engine::snapshot::snapshot_dir(home.path(), machine.name());
    // The copy is removed in the background, soon after the save.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dir.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the home's copy of {} stayed past the bound",
            machine.name()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(value(&machine, "y").await, "'kept in the bucket'");
    assert_eq!(fetches(&engine, "bucket").await, 1);
    machine.delete().await.unwrap();
    engine.shutdown().await;
}
