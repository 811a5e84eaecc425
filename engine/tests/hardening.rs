//! Races and limits on the process backend: interleavings are reached on purpose through the
//! engine's test hooks, never hoped for with sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use evervm_engine::{
    Account, CreateMachine, Engine, ErrorKind, ExecEvent, ExecRequest, FailureCause, Hook, Outcome,
};
use futures::StreamExt;

mod common;
use common::{config, events, new_machine, run};

/// The engine and account a hook acts on, set once the engine is open.
type Target = Arc<OnceLock<(Engine, Account)>>;

/// A hook that runs `action` once, the first time it fires after `armed` is set.
fn hook_once<F, Fut>(target: &Target, armed: &Arc<AtomicBool>, action: F) -> Hook
where
    F: Fn(Engine, Account, String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let target = Arc::clone(target);
    let armed = Arc::clone(armed);
    let action = Arc::new(action);
    Arc::new(move |name: String| {
        let target = Arc::clone(&target);
        let armed = Arc::clone(&armed);
        let action = Arc::clone(&action);
        Box::pin(async move {
            if armed.swap(false, Ordering::SeqCst)
                && let Some((engine, account)) = target.get()
            {
                action(engine.clone(), account.clone(), name).await;
            }
        })
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupt_as_an_instruction_starts_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let target: Target = Arc::default();
    let armed = Arc::new(AtomicBool::new(false));
    let mut config = config(&dir);
    // The interrupt arrives after the instruction became the running one and before it reaches
    // the sandbox: where an engine that clears the request afterwards used to lose it.
    config.hooks.before_run = Some(hook_once(
        &target,
        &armed,
        |engine, account, name| async move {
            assert!(engine.interrupt(&account, &name).await.unwrap());
        },
    ));
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let _ = target.set((engine.clone(), account.clone()));
    let name = new_machine(&engine, &account).await;
    run(&engine, &account, &name, "import time").await;
    armed.store(true, Ordering::SeqCst);
    let mut slow = ExecRequest::new("time.sleep(60)");
    slow.timeout = Duration::from_secs(20);
    let seq = engine.exec(&account, &name, slow).await.unwrap().seq;
    let result = engine.result(&account, &name, seq).await.unwrap();
    match result.outcome {
        Outcome::Error { cause, text } => assert_eq!(cause, FailureCause::Interrupted, "{text}"),
        Outcome::Value(v) => panic!("expected an interrupt, got {v:?}"),
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_racing_a_delete_never_brings_the_machine_back() {
    let dir = tempfile::tempdir().unwrap();
    // A machine made by an earlier engine: the next one has no handle for it yet, so its first
    // lookup reads the store and makes one.
    let name = {
        let engine = Engine::open(config(&dir)).await.unwrap();
        let account = engine.ensure_account("test").await.unwrap();
        let name = new_machine(&engine, &account).await;
        engine.shutdown().await;
        name
    };
    let target: Target = Arc::default();
    let armed = Arc::new(AtomicBool::new(true));
    let mut config = config(&dir);
    // Between the lookup's read of the record and its making of the handle, a delete of the
    // same machine runs (given up to 3 s to finish: an engine that orders the two never lets it
    // finish inside the lookup).
    config.hooks.before_handle = Some(hook_once(
        &target,
        &armed,
        |engine, account, name| async move {
            let delete = tokio::spawn(async move { engine.delete_machine(&account, &name).await });
            let finished = tokio::time::timeout(Duration::from_secs(3), delete).await;
            if let Ok(deleted) = finished {
                deleted.unwrap().unwrap();
            }
        },
    ));
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let _ = target.set((engine.clone(), account.clone()));
    let accepted = engine
        .exec(&account, &name, ExecRequest::new("1 + 1"))
        .await;
    match &accepted {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
    }
    // Once the delete is done, nothing of the machine is left.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let gone = engine.machine_info(&account, &name).await;
        if gone.is_err() && !engine.loaded_machines().contains(&name) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the machine is still there: {gone:?}, loaded {:?}",
            engine.loaded_machines()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        engine
            .machine_info(&account, &name)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    let again = engine.exec(&account, &name, ExecRequest::new("2")).await;
    assert_eq!(again.unwrap_err().kind(), ErrorKind::NotFound);
    assert!(!engine.loaded_machines().contains(&name));
    engine.shutdown().await;
}

/// Rows the store still holds for a machine, in every table that belongs to one.
fn rows_of(home: &std::path::Path, machine: &str) -> i64 {
    let conn = rusqlite::Connection::open(home.join("evervm.db")).unwrap();
    [
        "machines WHERE name",
        "instructions WHERE machine",
        "outputs WHERE machine",
        "checkpoints WHERE machine",
    ]
    .iter()
    .map(|table| {
        conn.query_row(
            &format!("SELECT COUNT(*) FROM {table} = ?1"),
            [machine],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    })
    .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_machine_mid_instruction_ends_it_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(&dir)).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = new_machine(&engine, &account).await;
    run(&engine, &account, &name, "import time").await;
    let seq = engine
        .exec(
            &account,
            &name,
            ExecRequest::new("print('started', flush=True)\ntime.sleep(60)"),
        )
        .await
        .unwrap()
        .seq;
    let queued = engine
        .exec(&account, &name, ExecRequest::new("'never runs'"))
        .await
        .unwrap()
        .seq;
    let mut events = engine.events(&account, &name, seq).await.unwrap();
    let queued_result = engine.result(&account, &name, queued);
    // Wait for the instruction to be running: its first line arrived.
    match events.next().await {
        Some(ExecEvent::Output(chunk)) => assert_eq!(chunk.data, "started"),
        other => panic!("expected the first line, got {other:?}"),
    }
    let (deleted, queued_result) =
        tokio::join!(engine.delete_machine(&account, &name), queued_result);
    deleted.unwrap();
    let rest: Vec<ExecEvent> = events.collect().await;
    match rest.last() {
        Some(ExecEvent::Result(result)) => match &result.outcome {
            Outcome::Error { cause, text } => {
                assert_eq!(*cause, FailureCause::MachineDeleted, "{text}");
                assert!(text.contains("deleted"), "{text}");
            }
            Outcome::Value(v) => panic!("expected an interrupt, got {v:?}"),
        },
        other => panic!("the stream did not end with a result: {other:?}"),
    }
    match queued_result {
        Ok(result) => assert!(
            matches!(
                result.outcome,
                Outcome::Error {
                    cause: FailureCause::MachineDeleted,
                    ..
                }
            ),
            "{result:?}"
        ),
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
    }
    assert_eq!(rows_of(dir.path(), &name), 0);
    assert!(!dir.path().join("machines").join(&name).exists());
    assert!(!engine.loaded_machines().contains(&name));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_are_errors_that_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir);
    config.limits.max_queued_instructions = 3;
    config.limits.max_machines_per_account = 2;
    config.limits.instructions_per_second = 0.01;
    config.limits.instruction_burst = 8;
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();

    // Memory sizes outside the server's set.
    let odd = engine
        .create_machine(
            &account,
            CreateMachine {
                memory_mb: Some(300),
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(odd.kind(), ErrorKind::InvalidInput);
    assert!(odd.message().contains("512"), "{odd}");

    // Machines per account.
    let name = new_machine(&engine, &account).await;
    engine
        .create_machine(&account, CreateMachine::default())
        .await
        .unwrap();
    let third = engine
        .create_machine(&account, CreateMachine::default())
        .await
        .unwrap_err();
    assert_eq!(third.kind(), ErrorKind::LimitExceeded);
    assert!(third.message().contains("EVERVM_MAX_MACHINES"), "{third}");
    // Another account has its own.
    let other = engine.ensure_account("other").await.unwrap();
    engine
        .create_machine(&other, CreateMachine::default())
        .await
        .unwrap();

    // Queued instructions per machine: one runs, three wait, the next is refused.
    let mut slow = ExecRequest::new("import time\nprint('running', flush=True)\ntime.sleep(60)");
    slow.timeout = Duration::from_secs(90);
    let running = engine.exec(&account, &name, slow).await.unwrap().seq;
    let mut events = engine.events(&account, &name, running).await.unwrap();
    assert!(matches!(events.next().await, Some(ExecEvent::Output(_))));
    for _ in 0..3 {
        engine
            .exec(&account, &name, ExecRequest::new("1"))
            .await
            .unwrap();
    }
    let full = engine
        .exec(&account, &name, ExecRequest::new("1"))
        .await
        .unwrap_err();
    assert_eq!(full.kind(), ErrorKind::LimitExceeded);
    assert!(full.message().contains("EVERVM_MAX_QUEUED"), "{full}");
    assert!(engine.interrupt(&account, &name).await.unwrap());

    // Instructions per second: of the burst of 8, five are spent (the one refused for the full
    // queue counted too), three more pass, then the account has to wait.
    for _ in 0..3 {
        engine
            .exec(&account, &name, ExecRequest::new("1"))
            .await
            .unwrap();
    }
    let fast = engine
        .exec(&account, &name, ExecRequest::new("1"))
        .await
        .unwrap_err();
    assert_eq!(fast.kind(), ErrorKind::LimitExceeded);
    assert!(fast.message().contains("EVERVM_INSTRUCTION_RATE"), "{fast}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_account_past_its_resident_memory_is_refused_with_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir);
    config.limits.max_resident_mb_per_account = 700;
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let first = new_machine(&engine, &account).await;
    run(&engine, &account, &first, "1").await;
    let second = new_machine(&engine, &account).await;
    // The process backend cannot swap the first one out to make room.
    let refused = run(&engine, &account, &second, "1").await;
    match refused.outcome {
        Outcome::Error { cause, text } => {
            assert_eq!(cause, FailureCause::LimitExceeded, "{text}");
            assert!(text.contains("EVERVM_ACCOUNT_RESIDENT_MB"), "{text}");
        }
        Outcome::Value(v) => panic!("expected the limit, got {v:?}"),
    }
    // Another account is not held back by this one.
    let other = engine.ensure_account("other").await.unwrap();
    let theirs = engine
        .create_machine(&other, CreateMachine::default())
        .await
        .unwrap()
        .name
        .to_string();
    let result = run(&engine, &other, &theirs, "6 * 7").await;
    assert_eq!(result.outcome, Outcome::Value(Some("42".to_owned())));
    // With the first machine gone, the second one runs.
    engine.delete_machine(&account, &first).await.unwrap();
    let result = run(&engine, &account, &second, "6 * 7").await;
    assert_eq!(result.outcome, Outcome::Value(Some("42".to_owned())));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_that_lost_its_state_in_a_restart_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(&dir)).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = new_machine(&engine, &account).await;
    run(&engine, &account, &name, "x = 1").await;
    // The process backend cannot save a machine: a restart loses its interpreter.
    engine.shutdown().await;
    let engine = Engine::open(config(&dir)).await.unwrap();
    let first = events(
        &engine,
        &account,
        &name,
        ExecRequest::new("'x' in globals()"),
    )
    .await;
    match first.first() {
        Some(ExecEvent::Output(note)) => {
            assert!(
                note.data
                    .contains("the engine stopped while the machine was running")
                    && note.data.contains("earlier state was lost"),
                "{}",
                note.data
            );
        }
        other => panic!("expected a note first, got {other:?}"),
    }
    match first.last() {
        Some(ExecEvent::Result(result)) => {
            assert_eq!(result.outcome, Outcome::Value(Some("False".to_owned())));
        }
        other => panic!("{other:?}"),
    }
    // Said once.
    let again = run(&engine, &account, &name, "1").await;
    assert_eq!(again.outcome, Outcome::Value(Some("1".to_owned())));
    let later = events(&engine, &account, &name, ExecRequest::new("2")).await;
    assert_eq!(later.len(), 1, "{later:?}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_home_and_its_database_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut config = config(&dir);
    config.home.clone_from(&home);
    let engine = Engine::open(config).await.unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&home.join("evervm.db")), 0o600);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_locked_by_another_process_makes_work_wait_not_fail() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(&dir)).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = new_machine(&engine, &account).await;
    run(&engine, &account, &name, "x = 20").await;
    // Another process (a backup, `sqlite3` at a console) holds the database for a while.
    let holder = rusqlite::Connection::open(dir.path().join("evervm.db")).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let work = {
        let (engine, account, name) = (engine.clone(), account.clone(), name.clone());
        tokio::spawn(async move { run(&engine, &account, &name, "x + 22").await })
    };
    tokio::time::sleep(Duration::from_secs(7)).await;
    holder.execute_batch("COMMIT").unwrap();
    let result = work.await.unwrap();
    assert_eq!(result.outcome, Outcome::Value(Some("42".to_owned())));
    // Stored, too.
    let seq = engine
        .machine_info(&account, &name)
        .await
        .unwrap()
        .instruction_count
        - 1;
    let stored = engine.result(&account, &name, seq).await.unwrap();
    assert_eq!(stored, result);
    engine.shutdown().await;
}
