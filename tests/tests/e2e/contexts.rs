//! Contexts in gVisor machines: more interpreters in one sandbox, each with its own globals and
//! working directory, kept with the machine when it is swapped out and restored, and copied with
//! it into a fork (the process backend's rules are tested in the engine's `engine.rs`).

use evervm::engine::{ExecRequest, ForkMachine, Outcome};
use evervm_tests::backends;

use crate::{new_machine, open_gvisor as open, value};

/// `code`'s value in `context` of machine `name`, or the name of the exception it raised.
async fn run_in(
    engine: &evervm::engine::Engine,
    account: &evervm::engine::Account,
    name: &str,
    context: &str,
    code: &str,
) -> Result<String, String> {
    let request = ExecRequest {
        context: Some(context.to_owned()),
        ..ExecRequest::new(code)
    };
    let seq = engine.exec(account, name, request).await.unwrap().seq;
    let result = engine.result(account, name, seq).await.unwrap();
    match result.outcome {
        Outcome::Value(value) => Ok(value.unwrap_or_default()),
        Outcome::Error { text, .. } => Err(result.exception.map_or(text, |e| e.name)),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn contexts_are_kept_through_swap_and_copied_into_forks() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (engine, client) = open(home.path()).await;
    let account = engine.ensure_account("local").await.unwrap();
    let m = new_machine(&client, None).await;
    let name = m.name().to_owned();
    value(&m, "x = 'default'").await;

    let made = engine
        .create_context(&account, &name, Some("/tmp"))
        .await
        .unwrap();
    let ctx = made.id.as_str();
    assert_eq!(
        run_in(
            &engine,
            &account,
            &name,
            ctx,
            "import os; x = 'ctx'; os.getcwd()"
        )
        .await,
        Ok("'/tmp'".to_owned())
    );
    // A context made in the home (`~`) starts there; one whose directory does not exist too.
    let homed = engine
        .create_context(&account, &name, Some("~"))
        .await
        .unwrap();
    let missing = engine
        .create_context(&account, &name, Some("/nowhere"))
        .await
        .unwrap();
    for id in [&homed.id, &missing.id] {
        let cwd = run_in(&engine, &account, &name, id, "import os; os.getcwd()").await;
        assert_eq!(cwd, Ok("'/home/user'".to_owned()));
    }
    engine
        .remove_context(&account, &name, &homed.id)
        .await
        .unwrap();
    engine
        .remove_context(&account, &name, &missing.id)
        .await
        .unwrap();

    // Swapped out and restored: every interpreter keeps its variables.
    m.swap_out().await.unwrap();
    assert_eq!(m.info().await.unwrap().state.as_deref(), Some("swapped"));
    assert_eq!(
        run_in(&engine, &account, &name, ctx, "x").await,
        Ok("'ctx'".to_owned())
    );
    assert_eq!(value(&m, "x").await, "'default'");

    // A fork has the context, with its variables, and its own copy of them.
    let fork = engine
        .fork_machine(&account, &name, ForkMachine::default())
        .await
        .unwrap()
        .name
        .to_string();
    let listed = engine.list_contexts(&account, &fork).await.unwrap();
    assert_eq!(
        listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["default", ctx]
    );
    assert_eq!(
        run_in(&engine, &account, &fork, ctx, "x = 'fork'; x").await,
        Ok("'fork'".to_owned())
    );
    assert_eq!(
        run_in(&engine, &account, &name, ctx, "x").await,
        Ok("'ctx'".to_owned())
    );

    // Restarted, its variables are gone, in the fork only.
    engine.restart_context(&account, &fork, ctx).await.unwrap();
    assert_eq!(
        run_in(&engine, &account, &fork, ctx, "x").await,
        Err("NameError".to_owned())
    );
    assert_eq!(
        run_in(&engine, &account, &name, ctx, "x").await,
        Ok("'ctx'".to_owned())
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn contexts_come_back_with_undo_points_and_checkpoints() {
    let home = tempfile::tempdir().unwrap();
    let Some((engine, client)) = crate::history::history_engine(home.path()).await else {
        return;
    };
    let account = engine.ensure_account("local").await.unwrap();
    let m = crate::history::machine_with_history(&client, 5).await;
    let name = m.name().to_owned();
    let ctx = engine
        .create_context(&account, &name, None)
        .await
        .unwrap()
        .id;
    let y = |code: &'static str| run_in(&engine, &account, &name, &ctx, code);
    assert_eq!(y("y = 1; y").await, Ok("1".to_owned()));
    engine
        .create_checkpoint(&account, &name, Some("one".to_owned()))
        .await
        .unwrap();

    // An undo takes back what an instruction in the context did, and keeps the context.
    assert_eq!(y("y = 2; y").await, Ok("2".to_owned()));
    m.undo().await.unwrap();
    assert_eq!(y("y").await, Ok("1".to_owned()));

    // A rollback to a checkpoint brings the context's state of then.
    assert_eq!(y("y = 3; y").await, Ok("3".to_owned()));
    engine.rollback(&account, &name, "one").await.unwrap();
    assert_eq!(y("y").await, Ok("1".to_owned()));
    let listed = engine.list_contexts(&account, &name).await.unwrap();
    assert!(listed.iter().any(|c| c.id == ctx), "{listed:?}");
    engine.shutdown().await;
}
