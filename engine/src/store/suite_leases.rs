//! Nodes and leases, checked the same way against SQLite and PostgreSQL (see `suite.rs` for the
//! PostgreSQL server the tests need).

use std::sync::Arc;
use std::time::Duration;

use super::suite::{ScratchDatabase, record};
use super::{Lease, LeaseOutcome, Metadata, PostgresStore, Store, StoreThread};
use crate::ErrorKind;

const LONG: Duration = Duration::from_secs(600);

fn taken(outcome: LeaseOutcome) -> Lease {
    match outcome {
        LeaseOutcome::Taken(lease) => lease,
        LeaseOutcome::Held(lease) => panic!("expected the lease, {} holds it", lease.owner),
    }
}

fn held(outcome: LeaseOutcome) -> Lease {
    match outcome {
        LeaseOutcome::Held(lease) => lease,
        LeaseOutcome::Taken(lease) => panic!("expected it held, {} took it", lease.owner),
    }
}

/// Every lease rule, on an empty store.
async fn leases_hold(store: Arc<dyn Metadata>) {
    let account = store.ensure_account("leases").await.unwrap();
    store
        .insert_machine(&record("m-leased", &account), 100)
        .await
        .unwrap();
    store
        .register_node("node-a", "http://127.0.0.1:1")
        .await
        .unwrap();
    store
        .register_node("node-b", "http://127.0.0.1:2")
        .await
        .unwrap();
    let nodes = store.nodes().await.unwrap();
    assert_eq!(
        nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["node-a", "node-b"]
    );
    assert_eq!(nodes[1].address, "http://127.0.0.1:2");

    // A machine nobody runs is free; the first node to ask takes it, the other is told who.
    assert_eq!(store.lease("m-leased").await.unwrap(), None);
    let a = taken(store.take_lease("m-leased", "node-a", LONG).await.unwrap());
    assert_eq!((a.owner.as_str(), a.epoch), ("node-a", 1));
    let seen = held(store.take_lease("m-leased", "node-b", LONG).await.unwrap());
    assert_eq!(seen, a);
    // The owner asking again keeps its number.
    let again = taken(store.take_lease("m-leased", "node-a", LONG).await.unwrap());
    assert_eq!(again.epoch, 1);
    store.mark_saved_fenced(&again, None).await.unwrap();
    assert!(
        store
            .machine("m-leased")
            .await
            .unwrap()
            .unwrap()
            .snapshot_at
            .is_some()
    );

    // Heartbeats renew the node's leases, and only its own.
    assert_eq!(store.heartbeat("node-a", LONG).await.unwrap(), 1);
    assert_eq!(store.heartbeat("node-b", LONG).await.unwrap(), 0);

    // An expired lease goes to the next node that asks, with a higher number, and fences the
    // old owner: it can no longer record a snapshot, give the lease up, or take it back.
    let short = taken(
        store
            .take_lease("m-leased", "node-a", Duration::from_millis(1))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let b = taken(store.take_lease("m-leased", "node-b", LONG).await.unwrap());
    assert_eq!((b.owner.as_str(), b.epoch), ("node-b", 2));
    let refused = store
        .mark_saved_fenced(&short, Some("cd"))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Conflict, "{refused}");
    assert!(refused.message().contains("no longer holds"), "{refused}");
    assert!(!store.release_lease(&short).await.unwrap());
    assert_eq!(
        held(store.take_lease("m-leased", "node-a", LONG).await.unwrap()),
        b
    );
    store.mark_saved_fenced(&b, Some("ef")).await.unwrap();
    let pointer = store
        .machine("m-leased")
        .await
        .unwrap()
        .unwrap()
        .snapshot_sha256;
    assert_eq!(
        pointer.as_deref(),
        Some("ef"),
        "the refused save moved nothing"
    );

    // Given up, it is free again, and the next owner's number is higher still.
    assert!(store.release_lease(&b).await.unwrap());
    assert_eq!(store.lease("m-leased").await.unwrap(), None);
    let a2 = taken(store.take_lease("m-leased", "node-a", LONG).await.unwrap());
    assert_eq!(a2.epoch, 3);

    // A node removed (taken for dead) gives up its leases, and its heartbeat is refused.
    assert_eq!(store.remove_node("node-a").await.unwrap(), 1);
    assert_eq!(store.lease("m-leased").await.unwrap(), None);
    let gone = store.heartbeat("node-a", LONG).await.unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::Conflict, "{gone}");
    assert!(store.mark_saved_fenced(&a2, None).await.is_err());
    store
        .register_node("node-a", "http://127.0.0.1:1")
        .await
        .unwrap();

    // No lease for a machine that is not there; a deleted machine's lease goes with it.
    let missing = store
        .take_lease("m-none", "node-a", LONG)
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    let b2 = taken(store.take_lease("m-leased", "node-b", LONG).await.unwrap());
    store.delete_machine("m-leased").await.unwrap();
    assert!(store.mark_saved_fenced(&b2, None).await.is_err());
    assert!(!store.release_lease(&b2).await.unwrap());
    let too_long = store
        .take_lease("m-none", "node-a", Duration::from_secs(u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(too_long.kind(), ErrorKind::InvalidInput, "{too_long}");

    nodes_race_for_machines(store).await;
}

/// Eight nodes ask for the same machine at once, many times over, the machine free or its lease
/// expired: each time exactly one gets it, with a number one higher than the last owner's, and
/// every other sees the winner's lease.
async fn nodes_race_for_machines(store: Arc<dyn Metadata>) {
    const NODES: usize = 8;
    const ROUNDS: usize = 50;
    let account = store.ensure_account("racers").await.unwrap();
    store
        .insert_machine(&record("m-raced", &account), 100)
        .await
        .unwrap();
    for node in 0..NODES {
        store
            .register_node(&format!("racer-{node}"), "http://127.0.0.1:1")
            .await
            .unwrap();
    }
    store
        .register_node("stalled", "http://127.0.0.1:1")
        .await
        .unwrap();
    let mut last_epoch = 0;
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            // A node that took the machine and stalled: its lease runs out before the race.
            let stale = taken(
                store
                    .take_lease("m-raced", "stalled", Duration::from_millis(1))
                    .await
                    .unwrap(),
            );
            assert_eq!(stale.epoch, last_epoch + 1);
            last_epoch = stale.epoch;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut racing = tokio::task::JoinSet::new();
        for node in 0..NODES {
            let store = Arc::clone(&store);
            racing.spawn(async move {
                store
                    .take_lease("m-raced", &format!("racer-{node}"), LONG)
                    .await
                    .unwrap()
            });
        }
        let mut winners = Vec::new();
        let mut others = Vec::new();
        while let Some(outcome) = racing.join_next().await {
            match outcome.unwrap() {
                LeaseOutcome::Taken(lease) => winners.push(lease),
                LeaseOutcome::Held(lease) => others.push(lease),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let winner = winners.remove(0);
        assert_eq!(winner.epoch, last_epoch + 1, "round {round}");
        assert!(
            others.iter().all(|o| *o == winner),
            "round {round}: {others:?} against {winner:?}"
        );
        last_epoch = winner.epoch;
        assert!(store.release_lease(&winner).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_leases_hold() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("evervm.db")).unwrap();
    leases_hold(Arc::new(StoreThread::start(store).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leases_hold() {
    let Some(database) = ScratchDatabase::create().await else {
        return;
    };
    let store = PostgresStore::connect(&database.settings).await.unwrap();
    leases_hold(Arc::new(store)).await;
    database.drop_it().await;
}

/// What versions 7 to 10 added, taken away again: a store as version 6 left it.
const BACK_TO_6: &str = "
DROP TABLE audit;
ALTER TABLE machines DROP COLUMN history;
ALTER TABLE machines DROP COLUMN parent;
ALTER TABLE machines DROP COLUMN forked_at;
ALTER TABLE machines DROP COLUMN snapshot_sha256;
ALTER TABLE checkpoints DROP COLUMN sha256;
DROP INDEX IF EXISTS machines_by_owner;
ALTER TABLE machines DROP COLUMN owner;
ALTER TABLE machines DROP COLUMN owner_epoch;
ALTER TABLE machines DROP COLUMN lease_until;
DROP TABLE nodes;
UPDATE meta SET value = '6' WHERE key = 'schema_version';
";

/// A version 6 store's machine, found again after the upgrade, leases working.
async fn upgraded_from_6(store: Arc<dyn Metadata>) {
    let machine = store.machine("m-old").await.unwrap().unwrap();
    assert_eq!(machine.memory_mb, 256);
    // Version 9's columns, with what a machine before them had: no history, no parent.
    assert_eq!(
        (machine.history, machine.parent, machine.forked_at),
        (0, None, None)
    );
    assert_eq!(store.lease("m-old").await.unwrap(), None);
    store
        .register_node("node-a", "http://127.0.0.1:1")
        .await
        .unwrap();
    let lease = taken(store.take_lease("m-old", "node-a", LONG).await.unwrap());
    assert_eq!(lease.epoch, 1);
    store.mark_saved_fenced(&lease, Some("ab")).await.unwrap();
    let machine = store.machine("m-old").await.unwrap().unwrap();
    assert_eq!(machine.snapshot_sha256.as_deref(), Some("ab"));
    // Version 10's audit log.
    let entry = crate::store::AuditEntry::now("api", "exec", "ok");
    store.record_audit(vec![entry]).await.unwrap();
    let query = crate::store::AuditQuery {
        limit: 10,
        ..Default::default()
    };
    assert_eq!(store.audit_entries(&query).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_sqlite_home_is_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evervm.db");
    {
        let mut store = Store::open(&path).unwrap();
        let account = store.ensure_account("old").unwrap();
        store
            .insert_machine_within(&record("m-old", &account), 100)
            .unwrap();
    }
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(BACK_TO_6)
        .unwrap();
    let store = Store::open(&path).unwrap();
    upgraded_from_6(Arc::new(StoreThread::start(store).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_6_postgres_database_is_upgraded() {
    let Some(database) = ScratchDatabase::create().await else {
        return;
    };
    {
        let store = PostgresStore::connect(&database.settings).await.unwrap();
        let account = store.ensure_account("old").await.unwrap();
        store
            .insert_machine(&record("m-old", &account), 100)
            .await
            .unwrap();
        store.batch(BACK_TO_6).await.unwrap();
    }
    let store = PostgresStore::connect(&database.settings).await.unwrap();
    upgraded_from_6(Arc::new(store)).await;
    database.drop_it().await;
}
