//! Secret environment values sealed in both stores: never in the database as given, opened for
//! the server that has the key, refused by name for one that lacks it, sealed anew by a
//! rotation that loses nothing.

use std::sync::Arc;

use super::suite::{ScratchDatabase, record};
use super::{Metadata, PostgresStore, Store, StoreThread};
use crate::secrets::SecretKeys;

const OLD: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const NEW: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

fn keys(current: &str, previous: &[&str]) -> Arc<SecretKeys> {
    Arc::new(SecretKeys::parse(current, previous).unwrap())
}

/// `with_keys` opens a store on the same database with other keys; `raw_env` reads a machine's
/// environment column as stored.
async fn sealing_holds<S, R>(with_keys: S, raw_env: R, reseal: impl AsyncFn(&SecretKeys) -> usize)
where
    S: AsyncFn(Option<Arc<SecretKeys>>) -> Arc<dyn Metadata>,
    R: AsyncFn(&str) -> String,
{
    let old = with_keys(Some(keys(OLD, &[]))).await;
    let account = old.ensure_account("secrets").await.unwrap();
    old.insert_machine(&record("m-sealed", &account), 100)
        .await
        .unwrap();
    // The suite's record holds A=1, secret.
    let stored = raw_env("m-sealed").await;
    assert!(stored.contains("evervm-sealed:v1:"), "{stored}");
    assert!(!stored.contains(r#""value":"1""#), "{stored}");
    let machine = old.machine("m-sealed").await.unwrap().unwrap();
    assert_eq!(machine.env["A"].value, "1");
    assert_eq!(machine.env_error, None);

    // No key, or another key: the machine reads, its secret is empty and the reason named.
    for other in [None, Some(keys(NEW, &[]))] {
        let store = with_keys(other).await;
        let machine = store.machine("m-sealed").await.unwrap().unwrap();
        assert_eq!(machine.env["A"].value, "", "no garbage in its place");
        let why = machine.env_error.unwrap();
        assert!(why.contains("secret key"), "{why}");
    }
    old.insert_machine(&record("m-other", &account), 100)
        .await
        .unwrap();

    // Rotation with the old key among the previous ones: everything sealed with the new one.
    let rotated = keys(NEW, &[OLD]);
    assert_eq!(reseal(&rotated).await, 2);
    assert_eq!(reseal(&rotated).await, 0, "nothing left to seal");
    let new_only = with_keys(Some(keys(NEW, &[]))).await;
    let machine = new_only.machine("m-sealed").await.unwrap().unwrap();
    assert_eq!(machine.env["A"].value, "1");
    assert_eq!(machine.env_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_seals_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evervm.db");
    let open = |keys: Option<Arc<SecretKeys>>| {
        let path = path.clone();
        async move {
            let store = Store::open(&path).unwrap().with_secret_keys(keys);
            Arc::new(StoreThread::start(store).unwrap()) as Arc<dyn Metadata>
        }
    };
    let raw = |name: &str| {
        let (path, name) = (path.clone(), name.to_owned());
        async move {
            rusqlite::Connection::open(&path)
                .unwrap()
                .query_row("SELECT env FROM machines WHERE name = ?1", [name], |r| {
                    r.get(0)
                })
                .unwrap()
        }
    };
    let reseal = |keys: &SecretKeys| {
        let mut store = Store::open(&path).unwrap();
        let changed = store.reseal_secret_env(keys).unwrap();
        async move { changed }
    };
    sealing_holds(open, raw, reseal).await;
    // Without the key that sealed them, a rotation changes nothing and says why.
    let mut store = Store::open(&path).unwrap();
    let lacking = SecretKeys::parse(OLD, &[]).unwrap();
    let refused = store.reseal_secret_env(&lacking).unwrap_err();
    assert!(refused.message().contains("secret key"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_seals_secrets() {
    let Some(database) = ScratchDatabase::create().await else {
        return;
    };
    let settings = database.settings.clone();
    let open = |keys: Option<Arc<SecretKeys>>| {
        let settings = settings.clone();
        async move {
            let store = PostgresStore::connect(&settings).await.unwrap();
            Arc::new(store.with_secret_keys(keys)) as Arc<dyn Metadata>
        }
    };
    let raw = |name: &str| {
        let (settings, name) = (settings.clone(), name.to_owned());
        async move {
            let store = PostgresStore::connect(&settings).await.unwrap();
            store.stored_env(&name).await.unwrap()
        }
    };
    let reseal = async |keys: &SecretKeys| {
        let store = PostgresStore::connect(&settings).await.unwrap();
        store.reseal_secret_env(keys).await.unwrap()
    };
    sealing_holds(open, raw, reseal).await;
    database.drop_it().await;
}
