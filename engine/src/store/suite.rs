//! One test-suite for every store: what the engine relies on, checked the same way against
//! SQLite and PostgreSQL. PostgreSQL's run needs a server: `EVERVM_TEST_POSTGRES` is a
//! connection string to a database whose user may create databases (each run makes its own and
//! drops it); without it the run is skipped with a note, except in CI, where it fails.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::{
    CheckpointRecord, MachineRecord, Metadata, OutputBatches, PostgresSettings, PostgresStore,
    Store, StoreThread, Unfinished,
};
use crate::guest::image::Profile;
use crate::network::NetworkPolicy;
use crate::types::{
    Account, Durability, Env, EnvVar, ExecResult, FailureCause, MachineName, OutputChunk,
    OutputStream, Tags,
};
use crate::{Error, ErrorKind};

pub(super) fn record(name: &str, account: &Account) -> MachineRecord {
    MachineRecord {
        name: MachineName::parse(name).unwrap(),
        account_id: account.id,
        created_at: Utc::now(),
        tags: Tags::from([("team".to_owned(), "data".to_owned())]),
        memory_mb: 256,
        image: Profile::Minimal,
        backend: "process".into(),
        next_seq: 0,
        last_used_at: None,
        last_error: None,
        durability: Durability::Instruction,
        unsaved_since: None,
        snapshot_at: None,
        env: Env::from([(
            "A".to_owned(),
            EnvVar {
                value: "1".to_owned(),
                secret: true,
            },
        )]),
        expires_at: None,
        position: 0,
        network: NetworkPolicy::Public,
        snapshot_sha256: None,
        history: 5,
        parent: Some("m-parent".into()),
        forked_at: Some(3),
        env_error: None,
    }
}

fn kind(result: Result<impl std::fmt::Debug, Error>) -> ErrorKind {
    result.unwrap_err().kind()
}

/// Every check, in order, on an empty store.
async fn passes(store: Arc<dyn Metadata>) {
    tokens(&*store).await;
    machines(&*store).await;
    history(&*store).await;
    limits_hold_under_concurrency(store.clone()).await;
    deleting_takes_everything(&*store).await;
    super::suite_audit::audit(&*store).await;
}

async fn tokens(store: &dyn Metadata) {
    let token = store.create_token("alice", None).await.unwrap();
    let alice = store.authenticate(&token).await.unwrap();
    assert_eq!(alice.name, "alice");
    assert_eq!(store.ensure_account("alice").await.unwrap(), alice);
    let (id, _) = token.split_once('.').unwrap();
    assert_eq!(
        kind(store.authenticate(&format!("{id}.wrong")).await),
        ErrorKind::Unauthorized
    );
    assert_eq!(
        kind(store.authenticate("no-dot").await),
        ErrorKind::Unauthorized
    );
    let expired = store
        .create_token("alice", Some(Utc::now() - chrono::Duration::seconds(5)))
        .await
        .unwrap();
    let refused = store.authenticate(&expired).await.unwrap_err();
    assert!(refused.message().contains("expired"), "{refused}");
    let listed = store.tokens().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|t| t.account == "alice"));
    assert_eq!(store.count_tokens().await.unwrap(), 2);
    store.revoke_token(id).await.unwrap();
    assert_eq!(
        kind(store.authenticate(&token).await),
        ErrorKind::Unauthorized
    );
    assert_eq!(kind(store.revoke_token(id).await), ErrorKind::NotFound);
    assert_eq!(store.count_tokens().await.unwrap(), 1);
}

async fn machines(store: &dyn Metadata) {
    let account = store.ensure_account("bob").await.unwrap();
    let mut first = record("m-first", &account);
    first.expires_at = Some(Utc::now() - chrono::Duration::seconds(1));
    store.insert_machine(&first, 10).await.unwrap();
    store
        .insert_machine(&record("m-second", &account), 10)
        .await
        .unwrap();
    assert_eq!(
        kind(store.insert_machine(&record("m-first", &account), 10).await),
        ErrorKind::Conflict,
    );
    let read = store.machine("m-first").await.unwrap().unwrap();
    assert_eq!(read.tags, first.tags);
    assert_eq!(read.env, first.env);
    assert_eq!(read.network, NetworkPolicy::Public);
    assert_eq!(read.durability, Durability::Instruction);
    assert_eq!(read.memory_mb, 256);
    assert_eq!(read.history, 5);
    assert_eq!(
        (read.parent.as_deref(), read.forked_at),
        (Some("m-parent"), Some(3))
    );
    // Times read back as written, to the microsecond.
    assert_eq!(
        read.created_at.timestamp_micros(),
        first.created_at.timestamp_micros()
    );
    assert!(store.machine("m-none").await.unwrap().is_none());
    let names: Vec<String> = store
        .machines(account.id)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name.to_string())
        .collect();
    assert_eq!(names, ["m-second", "m-first"], "newest first");
    assert_eq!(store.count_machines(account.id).await.unwrap(), 2);
    assert!(
        store
            .machine_accounts()
            .await
            .unwrap()
            .contains(&("m-first".to_owned(), "bob".to_owned()))
    );
    assert_eq!(
        store.expired_machines(Utc::now(), 10).await.unwrap(),
        [(account.id, "m-first".to_owned())]
    );
    store.mark_unsaved("m-first").await.unwrap();
    let unsaved = store.machine("m-first").await.unwrap().unwrap();
    assert!(unsaved.unsaved_since.is_some());
    store.mark_unsaved("m-first").await.unwrap();
    assert_eq!(
        store
            .machine("m-first")
            .await
            .unwrap()
            .unwrap()
            .unsaved_since,
        unsaved.unsaved_since,
        "the first mark stays"
    );
    store.mark_saved("m-first", Some("0123ab")).await.unwrap();
    let saved = store.machine("m-first").await.unwrap().unwrap();
    assert!(saved.unsaved_since.is_none() && saved.snapshot_at.is_some());
    assert_eq!(saved.snapshot_sha256.as_deref(), Some("0123ab"));
    store.mark_saved("m-first", None).await.unwrap();
    let local = store.machine("m-first").await.unwrap().unwrap();
    assert_eq!(local.snapshot_sha256, None, "a save to the local disk only");
    assert_eq!(
        store
            .note_snapshots_on_disk(&["m-first".to_owned(), "m-second".to_owned()])
            .await
            .unwrap(),
        1,
        "only the machine without a recorded snapshot"
    );
    store
        .set_last_error("m-second", Some("it broke"))
        .await
        .unwrap();
    assert_eq!(
        store
            .machine("m-second")
            .await
            .unwrap()
            .unwrap()
            .last_error
            .as_deref(),
        Some("it broke")
    );
    store.set_last_error("m-second", None).await.unwrap();
}

async fn history(store: &dyn Metadata) {
    let account = store.ensure_account("carol").await.unwrap();
    store
        .insert_machine(&record("m-history", &account), 10)
        .await
        .unwrap();
    assert_eq!(
        store
            .insert_instruction("m-history", "1 + 1", 1000)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .insert_instruction("m-history", "print()", 1000)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        kind(store.insert_instruction("m-gone", "1", 1000).await),
        ErrorKind::NotFound
    );
    assert_eq!(
        store.instruction_result("m-history", 1).await.unwrap(),
        Some(None)
    );
    assert_eq!(
        store.instruction_result("m-history", 9).await.unwrap(),
        None
    );
    // Output in pieces (as a long instruction stores it), then the rest with the result.
    let output: Vec<OutputChunk> = (0..10_000)
        .map(|i| OutputChunk {
            seq: i,
            stream: match i % 3 {
                0 => OutputStream::Stderr,
                1 => OutputStream::Stdout,
                _ => OutputStream::Display,
            },
            data: format!("line {i} \u{e9}\n\"quoted\"\u{0}"),
            partial: i % 3 == 1 && i % 5 == 0,
        })
        .collect();
    let (early, rest) = output.split_at(6000);
    store
        .append_output("m-history", 1, OutputBatches::encode(early).unwrap())
        .await
        .unwrap();
    let result = ExecResult::failure(FailureCause::Exception, "ZeroDivisionError");
    store
        .finish_instruction(
            "m-history",
            1,
            OutputBatches::encode(rest).unwrap(),
            result.clone(),
        )
        .await
        .unwrap();
    assert_eq!(
        store.instruction_output("m-history", 1).await.unwrap(),
        output
    );
    assert_eq!(
        store.instruction_result("m-history", 1).await.unwrap(),
        Some(Some(result))
    );
    assert!(
        store
            .machine("m-history")
            .await
            .unwrap()
            .unwrap()
            .last_used_at
            .is_some()
    );
    // Output for a machine that is gone is refused as such.
    assert_eq!(
        kind(
            store
                .append_output("m-gone", 0, OutputBatches::encode(early).unwrap())
                .await
        ),
        ErrorKind::NotFound
    );

    // Checkpoints: reserved, completed, listed, a second one by the same name refused.
    let checkpoint = CheckpointRecord {
        name: "before".into(),
        created_at: Utc::now(),
        instruction_count: 1,
        sha256: None,
    };
    store
        .insert_checkpoint("m-history", &checkpoint)
        .await
        .unwrap();
    assert_eq!(
        kind(store.insert_checkpoint("m-history", &checkpoint).await),
        ErrorKind::Conflict
    );
    assert_eq!(
        kind(store.insert_checkpoint("m-gone", &checkpoint).await),
        ErrorKind::NotFound
    );
    let completed = CheckpointRecord {
        instruction_count: 2,
        sha256: Some("cafe".into()),
        ..checkpoint.clone()
    };
    store
        .complete_checkpoint("m-history", &completed)
        .await
        .unwrap();
    let listed = store.checkpoints("m-history").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].instruction_count, 2);
    assert_eq!(listed[0].sha256.as_deref(), Some("cafe"));
    assert_eq!(
        store
            .mark_rolled_back(
                "m-history",
                &CheckpointRecord {
                    instruction_count: 1,
                    ..checkpoint.clone()
                }
            )
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .rolled_back_to("m-history", 1)
            .await
            .unwrap()
            .as_deref(),
        Some("before")
    );
    assert_eq!(store.rolled_back_to("m-history", 0).await.unwrap(), None);
    // A rewind marks what ran after its point and before the first unrun instruction, and
    // nothing already taken back; the history lists instructions with their marks.
    assert_eq!(
        store
            .mark_rewound("m-history", -1, 1, "rewind to -1")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .mark_rewound("m-history", -1, 100, "rewind to -1")
            .await
            .unwrap(),
        0
    );
    let rows = store.instructions_from("m-history", 0, 10).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(rows[0].code, "1 + 1");
    assert_eq!(rows[0].rolled_back_to.as_deref(), Some("rewind to -1"));
    assert_eq!(rows[1].rolled_back_to.as_deref(), Some("before"));
    assert!(rows[0].result.is_none() && rows[1].result.is_some());
    assert_eq!(
        store.taken_back("m-history", 10).await.unwrap(),
        [(0, "rewind to -1".to_owned()), (1, "before".to_owned())]
    );
    let later = store.instructions_from("m-history", 1, 1).await.unwrap();
    assert_eq!(later.iter().map(|r| r.seq).collect::<Vec<_>>(), [1]);
    assert!(
        store
            .delete_checkpoint("m-history", "before")
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_checkpoint("m-history", "before")
            .await
            .unwrap()
    );
    assert_eq!(
        kind(store.complete_checkpoint("m-history", &completed).await),
        ErrorKind::NotFound
    );

    // An engine that stopped leaves unfinished instructions: they get an error result. A node
    // fails only those of its machines, or of one machine but the ones it runs itself.
    let kept = store
        .insert_instruction("m-history", "2", 1000)
        .await
        .unwrap();
    assert_eq!(
        store
            .fail_unfinished("gone", Unfinished::OwnedBy("node-none".into()))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .fail_unfinished(
                "the node stopped",
                Unfinished::OfMachine {
                    machine: "m-history".into(),
                    except: vec![kept],
                }
            )
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store.instruction_result("m-history", kept).await.unwrap(),
        Some(None),
        "the listed one is left alone"
    );
    let Some(Some(failed)) = store.instruction_result("m-history", 0).await.unwrap() else {
        panic!("instruction 0 has no result");
    };
    assert!(format!("{failed:?}").contains("the node stopped"));
    assert_eq!(
        store
            .fail_unfinished("the engine stopped", Unfinished::All)
            .await
            .unwrap(),
        1
    );
    let Some(Some(failed)) = store.instruction_result("m-history", kept).await.unwrap() else {
        panic!("instruction {kept} has no result");
    };
    assert!(format!("{failed:?}").contains("the engine stopped"));
    store.flush().await.unwrap();
}

/// Machines created at once for one account never pass its limit; instructions at once get
/// distinct seqs.
async fn limits_hold_under_concurrency(store: Arc<dyn Metadata>) {
    let account = store.ensure_account("dave").await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..12 {
        let (store, account) = (store.clone(), account.clone());
        tasks.spawn(async move {
            store
                .insert_machine(&record(&format!("m-race-{i}"), &account), 5)
                .await
        });
    }
    let mut created = 0;
    while let Some(outcome) = tasks.join_next().await {
        match outcome.unwrap() {
            Ok(()) => created += 1,
            Err(e) => assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}"),
        }
    }
    assert_eq!(created, 5);
    assert_eq!(store.count_machines(account.id).await.unwrap(), 5);
    let name = store.machines(account.id).await.unwrap()[0]
        .name
        .to_string();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (store, name) = (store.clone(), name.clone());
        tasks.spawn(async move { store.insert_instruction(&name, "x", 10).await });
    }
    let mut seqs = Vec::new();
    while let Some(seq) = tasks.join_next().await {
        seqs.push(seq.unwrap().unwrap());
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (0..20).collect::<Vec<i64>>());
}

async fn deleting_takes_everything(store: &dyn Metadata) {
    let account = store.ensure_account("erin").await.unwrap();
    store
        .insert_machine(&record("m-doomed", &account), 10)
        .await
        .unwrap();
    let seq = store
        .insert_instruction("m-doomed", "print(1)", 10)
        .await
        .unwrap();
    store
        .finish_instruction(
            "m-doomed",
            seq,
            OutputBatches::encode(&[OutputChunk {
                seq: 0,
                stream: OutputStream::Stdout,
                data: "1\n".into(),
                partial: false,
            }])
            .unwrap(),
            ExecResult::failure(FailureCause::Exception, "x"),
        )
        .await
        .unwrap();
    let checkpoint = CheckpointRecord {
        sha256: None,
        name: "c".into(),
        created_at: Utc::now(),
        instruction_count: 1,
    };
    store
        .insert_checkpoint("m-doomed", &checkpoint)
        .await
        .unwrap();
    store.delete_machine("m-doomed").await.unwrap();
    assert!(store.machine("m-doomed").await.unwrap().is_none());
    assert_eq!(
        store.instruction_result("m-doomed", seq).await.unwrap(),
        None
    );
    assert!(
        store
            .instruction_output("m-doomed", seq)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.checkpoints("m-doomed").await.unwrap().is_empty());
    // The name can be used again.
    store
        .insert_machine(&record("m-doomed", &account), 10)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("evervm.db")).unwrap();
    passes(Arc::new(StoreThread::start(store).unwrap())).await;
}

/// A database of its own on the test server, dropped when the test ends.
pub(super) struct ScratchDatabase {
    admin: tokio_postgres::Client,
    name: String,
    pub(super) settings: PostgresSettings,
}

impl ScratchDatabase {
    /// `None` (with a note) when no test server is configured outside CI.
    pub(super) async fn create() -> Option<Self> {
        let Ok(url) = std::env::var("EVERVM_TEST_POSTGRES") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the PostgreSQL store's tests: set EVERVM_TEST_POSTGRES \
                 (scripts/test.sh starts a server)"
            );
            eprintln!("skipping: EVERVM_TEST_POSTGRES is not set (scripts/test.sh sets it)");
            return None;
        };
        let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let name = format!("evervm_test_{:016x}", rand::random::<u64>());
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let settings = PostgresSettings::parse(&url).unwrap().with_database(&name);
        Some(Self {
            admin,
            name,
            settings,
        })
    }

    pub(super) async fn drop_it(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_suite() {
    let Some(database) = ScratchDatabase::create().await else {
        return;
    };
    let store = PostgresStore::connect(&database.settings).await.unwrap();
    passes(Arc::new(store)).await;
    // A second store on the same database finds the schema made and its rows.
    let again = PostgresStore::connect(&database.settings).await.unwrap();
    assert!(again.machine("m-history").await.unwrap().is_some());
    database.drop_it().await;
}

/// TLS to PostgreSQL as `sslmode` says: `verify-full` against the server's CA is TLS (the server
/// says so); other roots, or a name its certificate does not hold, are refused; `verify-ca`
/// takes any name; `require` encrypts without checking; `disable` does not encrypt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_is_verified_as_sslmode_says() {
    let (Ok(url), Ok(ca)) = (
        std::env::var("EVERVM_TEST_POSTGRES"),
        std::env::var("EVERVM_TEST_POSTGRES_CA"),
    ) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the PostgreSQL TLS test: set EVERVM_TEST_POSTGRES and \
             EVERVM_TEST_POSTGRES_CA (scripts/test.sh does)"
        );
        eprintln!("skipping: EVERVM_TEST_POSTGRES_CA is not set (scripts/test.sh sets it)");
        return;
    };
    let reach = async |url: &str, query: String| {
        let settings = PostgresSettings::parse(&format!("{url}?{query}"))?;
        PostgresStore::reach(&settings).await
    };
    let verify_full = format!("sslmode=verify-full&sslrootcert={ca}");
    let reached = reach(&url, verify_full.clone()).await.unwrap();
    assert!(reached.contains(", over TLS"), "{reached}");
    let plain = reach(&url, "sslmode=disable".into()).await.unwrap();
    assert!(plain.ends_with("not encrypted"), "{plain}");
    let unchecked = reach(&url, "sslmode=require".into()).await.unwrap();
    assert!(unchecked.contains(", over TLS"), "{unchecked}");
    // Roots that are not the server's CA.
    let refused = reach(&url, "sslmode=verify-full&sslrootcert=system".into())
        .await
        .unwrap_err();
    assert!(refused.message().contains("certificate"), "{refused}");
    // A name the certificate (for 127.0.0.1) does not hold: refused by verify-full only.
    let by_name = url.replacen("127.0.0.1", "localhost", 1);
    assert_ne!(by_name, url);
    let refused = reach(&by_name, verify_full).await.unwrap_err();
    assert!(refused.message().contains("certificate"), "{refused}");
    let chain_only = reach(&by_name, format!("sslmode=verify-ca&sslrootcert={ca}"))
        .await
        .unwrap();
    assert!(chain_only.contains(", over TLS"), "{chain_only}");
    // A root certificate file that is not there is an error at once, naming it.
    let missing = PostgresSettings::parse(&format!(
        "{url}?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"
    ))
    .unwrap_err();
    assert!(
        missing.message().contains("/nonexistent/ca.pem"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_per_database() {
    let Some(database) = ScratchDatabase::create().await else {
        return;
    };
    let first = PostgresStore::connect(&database.settings).await.unwrap();
    first.hold_for_this_server().await.unwrap();
    let second = PostgresStore::connect(&database.settings).await.unwrap();
    let refused = second.hold_for_this_server().await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Conflict, "{refused}");
    assert!(
        refused.message().contains("another evervm server"),
        "{refused}"
    );
    // Tools on the same database (`evervm token`) need no hold and still work.
    second.create_token("ops", None).await.unwrap();
    // Once the first server is gone, the database is free.
    drop(first);
    let mut held = second.hold_for_this_server().await;
    for _ in 0..50 {
        if held.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        held = second.hold_for_this_server().await;
    }
    held.unwrap();
    drop(second);
    database.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_make_the_schema_once() {
    let Some(database) = ScratchDatabase::create().await else {
        return;
    };
    let mut starting = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let settings = database.settings.clone();
        starting.spawn(async move { PostgresStore::connect(&settings).await.map(|_| ()) });
    }
    while let Some(started) = starting.join_next().await {
        started.unwrap().unwrap();
    }
    database.drop_it().await;
}

#[tokio::test]
async fn an_unreachable_postgres_is_a_clear_error() {
    // Nothing listens on port 1 of loopback.
    let mut settings =
        PostgresSettings::parse("postgres://evervm:secret@127.0.0.1:1/evervm").unwrap();
    settings.pool_size = 1;
    let started = std::time::Instant::now();
    let e = PostgresStore::connect(&settings).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(30));
    let text = e.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(
        !text.contains("secret"),
        "the password is never shown: {text}"
    );
    let bad = PostgresSettings::parse("postgres://evervm@127.0.0.1:port/evervm").unwrap_err();
    assert!(bad.message().contains("postgres://USER"), "{bad}");
}
