//! Engine behaviour on the process backend, without any server in between.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use evervm_engine::{
    CreateMachine, Engine, EngineConfig, ErrorKind, ExecEvent, ExecRequest, FailureCause, Outcome,
    Tags,
};
use futures::StreamExt;

async fn engine(dir: &tempfile::TempDir) -> Engine {
    let mut config = EngineConfig::new(dir.path());
    config.backend = evervm_engine::BackendChoice::parse("process");
    Engine::open(config).await.unwrap()
}

/// A new machine of `account` on which `setup` has run (and finished).
async fn machine_after(engine: &Engine, account: &evervm_engine::Account, setup: &str) -> String {
    let name = engine
        .create_machine(account, CreateMachine::default())
        .await
        .unwrap()
        .name
        .to_string();
    let seq = engine
        .exec(account, &name, ExecRequest::new(setup))
        .await
        .unwrap()
        .seq;
    value(&engine.result(account, &name, seq).await.unwrap());
    name
}

fn value(result: &evervm_engine::ExecResult) -> Option<String> {
    match &result.outcome {
        Outcome::Value(v) => v.clone(),
        Outcome::Error { text, .. } => panic!("unexpected error: {text}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn state_persists_and_output_streams() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let machine = engine
        .create_machine(&account, CreateMachine::default())
        .await
        .unwrap();
    let name = machine.name.as_str();

    let a = engine
        .exec(&account, name, ExecRequest::new("x = 40"))
        .await
        .unwrap();
    let b = engine
        .exec(
            &account,
            name,
            ExecRequest::new("for i in range(3): print(i)\nx + 2"),
        )
        .await
        .unwrap();
    assert_eq!((a.seq, b.seq), (0, 1));
    assert_eq!(
        value(&engine.result(&account, name, 0).await.unwrap()),
        None
    );
    let events: Vec<_> = engine
        .events(&account, name, 1)
        .await
        .unwrap()
        .collect()
        .await;
    let lines: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ExecEvent::Output(c) => Some(c.data.as_str()),
            ExecEvent::Result(_) => None,
        })
        .collect();
    assert_eq!(lines, ["0", "1", "2"]);
    match events.last().unwrap() {
        ExecEvent::Result(r) => assert_eq!(value(r).as_deref(), Some("42")),
        ExecEvent::Output(_) => panic!("stream did not end with a result"),
    }
    // Replayed from the store after the fact, identically.
    let replay: Vec<_> = engine
        .events(&account, name, 1)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(replay, events);
    let info = engine.machine_info(&account, name).await.unwrap();
    assert_eq!(info.instruction_count, 2);
    assert_eq!(info.backend, "process");
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_keeps_state_and_interrupt_cancels() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let name = engine
        .create_machine(&account, CreateMachine::default())
        .await
        .unwrap()
        .name
        .to_string();
    engine
        .exec(
            &account,
            &name,
            ExecRequest::new("from time import sleep\nkept = 7"),
        )
        .await
        .unwrap();
    let mut slow = ExecRequest::new("sleep(30)");
    slow.timeout = Duration::from_secs(1);
    let seq = engine.exec(&account, &name, slow).await.unwrap().seq;
    let result = engine.result(&account, &name, seq).await.unwrap();
    match &result.outcome {
        Outcome::Error { text, cause } => {
            assert!(text.contains("Timed out"), "{text}");
            assert_eq!(*cause, FailureCause::Timeout);
        }
        Outcome::Value(v) => panic!("expected a timeout, got {v:?}"),
    }
    let seq = engine
        .exec(&account, &name, ExecRequest::new("kept"))
        .await
        .unwrap()
        .seq;
    assert_eq!(
        value(&engine.result(&account, &name, seq).await.unwrap()).as_deref(),
        Some("7")
    );

    let running = engine
        .exec(
            &account,
            &name,
            ExecRequest::new("print('started', flush=True)\nsleep(30)"),
        )
        .await
        .unwrap()
        .seq;
    let queued = engine
        .exec(&account, &name, ExecRequest::new("'never'"))
        .await
        .unwrap()
        .seq;
    // Running once its first line has arrived.
    let mut events = engine.events(&account, &name, running).await.unwrap();
    assert!(matches!(events.next().await, Some(ExecEvent::Output(_))));
    let mut interrupting = ExecRequest::new("kept * 2");
    interrupting.interrupt = true;
    let accepted = engine.exec(&account, &name, interrupting).await.unwrap();
    assert!(accepted.interrupted);
    for seq in [running, queued] {
        let result = engine.result(&account, &name, seq).await.unwrap();
        assert!(
            matches!(
                result.outcome,
                Outcome::Error {
                    cause: FailureCause::Interrupted,
                    ..
                }
            ),
            "{result:?}"
        );
    }
    let result = engine.result(&account, &name, accepted.seq).await.unwrap();
    assert_eq!(value(&result).as_deref(), Some("14"));
}

#[tokio::test(flavor = "multi_thread")]
async fn tags_filter_and_accounts_are_separate() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let alice = engine.ensure_account("alice").await.unwrap();
    let bob = engine.ensure_account("bob").await.unwrap();
    let tags = |pairs: &[(&str, &str)]| -> Tags {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let first = engine
        .create_machine(
            &alice,
            CreateMachine {
                tags: tags(&[("env", "a"), ("team", "x")]),
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap();
    let second = engine
        .create_machine(
            &alice,
            CreateMachine {
                tags: tags(&[("env", "b"), ("team", "x")]),
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap();
    let names = async |filter: Tags| -> Vec<String> {
        engine
            .list_machines(&alice, &filter)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name.to_string())
            .collect()
    };
    assert_eq!(
        names(tags(&[("team", "x")])).await,
        [second.name.to_string(), first.name.to_string()]
    );
    assert_eq!(
        names(tags(&[("team", "x"), ("env", "a")])).await,
        [first.name.to_string()]
    );
    assert!(names(tags(&[("env", "c")])).await.is_empty());
    assert!(
        engine
            .list_machines(&bob, &Tags::new())
            .await
            .unwrap()
            .is_empty()
    );
    let err = engine
        .exec(&bob, first.name.as_str(), ExecRequest::new("1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let bad = engine
        .create_machine(
            &alice,
            CreateMachine {
                tags: tags(&[("bad key", "v")]),
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_engine_on_the_same_home_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _engine = engine(&dir).await;
    let mut config = EngineConfig::new(dir.path());
    config.backend = evervm_engine::BackendChoice::parse("process");
    let err = Engine::open(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert!(
        err.to_string().contains(&std::process::id().to_string()),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupt_right_after_exec_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine_after(&engine, &account, "import time\nkept = 5").await;
    for _ in 0..5 {
        let seq = engine
            .exec(&account, &name, ExecRequest::new("time.sleep(20)"))
            .await
            .unwrap()
            .seq;
        assert!(engine.interrupt(&account, &name).await.unwrap());
        let result = engine.result(&account, &name, seq).await.unwrap();
        match result.outcome {
            Outcome::Error { cause, text } => {
                assert_eq!(cause, FailureCause::Interrupted, "{text}");
                assert!(
                    text.contains("KeyboardInterrupt") || text.contains("interrupted"),
                    "{text}"
                );
            }
            Outcome::Value(v) => panic!("expected an interrupt, got {v:?}"),
        }
    }
    // The sandbox was never stopped: the state is still there.
    let seq = engine
        .exec(&account, &name, ExecRequest::new("kept"))
        .await
        .unwrap()
        .seq;
    assert_eq!(
        value(&engine.result(&account, &name, seq).await.unwrap()).as_deref(),
        Some("5")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupting_a_print_loop_never_breaks_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine_after(&engine, &account, "import sys\nkept = 'alive'").await;
    for round in 0..6 {
        let code = if round % 2 == 0 {
            "while True:\n    print('x' * 50)"
        } else {
            "while True:\n    sys.stderr.write('y' * 300 + '\\n')"
        };
        let seq = engine
            .exec(&account, &name, ExecRequest::new(code))
            .await
            .unwrap()
            .seq;
        tokio::time::sleep(Duration::from_millis(200 + 37 * round)).await;
        engine.interrupt(&account, &name).await.unwrap();
        let result = engine.result(&account, &name, seq).await.unwrap();
        assert!(
            matches!(
                result.outcome,
                Outcome::Error {
                    cause: FailureCause::Interrupted,
                    ..
                }
            ),
            "round {round}: {result:?}"
        );
    }
    let seq = engine
        .exec(&account, &name, ExecRequest::new("kept"))
        .await
        .unwrap()
        .seq;
    assert_eq!(
        value(&engine.result(&account, &name, seq).await.unwrap()).as_deref(),
        Some("'alive'")
    );
    assert!(
        engine
            .machine_info(&account, &name)
            .await
            .unwrap()
            .last_error
            .is_none()
    );
}

/// Runs `request` on the machine and waits for its result.
async fn run(
    engine: &Engine,
    account: &evervm_engine::Account,
    name: &str,
    request: ExecRequest,
) -> evervm_engine::ExecResult {
    let seq = engine.exec(account, name, request).await.unwrap().seq;
    engine.result(account, name, seq).await.unwrap()
}

/// The cause of a failed instruction; `None` for one that gave a value.
fn failure(result: &evervm_engine::ExecResult) -> Option<FailureCause> {
    match result.outcome {
        Outcome::Error { cause, .. } => Some(cause),
        Outcome::Value(_) => None,
    }
}

/// The agent times instructions with SIGALRM; code that takes the signal for itself keeps its own
/// timers, and its instructions still time out and can still be interrupted.
#[tokio::test(flavor = "multi_thread")]
async fn code_that_takes_sigalrm_keeps_its_timers_and_its_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine_after(
        &engine,
        &account,
        "import signal, time\nfired = []\n\
         signal.signal(signal.SIGALRM, lambda *_: fired.append(1))",
    )
    .await;
    let timer = "signal.setitimer(signal.ITIMER_REAL, 0.05)\ntime.sleep(0.3)\nfired";
    let result = run(&engine, &account, &name, ExecRequest::new(timer)).await;
    assert_eq!(value(&result).as_deref(), Some("[1]"));
    let mut slow = ExecRequest::new("time.sleep(30)");
    slow.timeout = Duration::from_secs(1);
    let result = run(&engine, &account, &name, slow).await;
    assert_eq!(failure(&result), Some(FailureCause::Timeout), "{result:?}");
    let seq = engine
        .exec(&account, &name, ExecRequest::new("time.sleep(30)"))
        .await
        .unwrap()
        .seq;
    assert!(engine.interrupt(&account, &name).await.unwrap());
    let result = engine.result(&account, &name, seq).await.unwrap();
    assert_eq!(
        failure(&result),
        Some(FailureCause::Interrupted),
        "{result:?}"
    );
    let result = run(&engine, &account, &name, ExecRequest::new("len(fired)")).await;
    assert_eq!(value(&result).as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn environment_reaches_the_interpreter_and_secrets_stay_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let var = |value: &str, secret: bool| evervm_engine::EnvVar {
        value: value.to_owned(),
        secret,
    };
    let env: evervm_engine::Env = [
        ("REGION".to_owned(), var("eu-north", false)),
        ("API_TOKEN".to_owned(), var("tok-12345", true)),
    ]
    .into();
    let info = engine
        .create_machine(
            &account,
            CreateMachine {
                env,
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap();
    let name = info.name.as_str();
    assert_eq!(info.env.get("REGION").map(String::as_str), Some("eu-north"));
    assert_eq!(info.secret_env, ["API_TOKEN"]);
    let seq = engine
        .exec(
            &account,
            name,
            ExecRequest::new(
                "import os, subprocess\n(os.environ['REGION'], os.environ['API_TOKEN'], \
                 subprocess.run(['sh', '-c', 'echo $REGION'], capture_output=True, \
                 text=True).stdout.strip(), os.getcwd() == os.path.expanduser('~'))",
            ),
        )
        .await
        .unwrap()
        .seq;
    assert_eq!(
        value(&engine.result(&account, name, seq).await.unwrap()).as_deref(),
        Some("('eu-north', 'tok-12345', 'eu-north', True)")
    );
    let shown = format!(
        "{:?} {:?}",
        engine.machine_info(&account, name).await.unwrap(),
        engine.list_machines(&account, &Tags::new()).await.unwrap()
    );
    assert!(shown.contains("API_TOKEN"), "{shown}");
    assert!(!shown.contains("tok-12345"), "{shown}");

    let bad = |name: &str| -> evervm_engine::Env { [(name.to_owned(), var("x", false))].into() };
    for wrong in ["1ABC", "A-B", "", "A B"] {
        let refused = engine
            .create_machine(
                &account,
                CreateMachine {
                    env: bad(wrong),
                    ..CreateMachine::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{wrong:?}");
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_expire_and_lists_page_through_a_thousand() {
    let dir = tempfile::tempdir().unwrap();
    // A thousand machines, written to the store the engine opens (no sandboxes started).
    {
        let mut store = evervm_engine::store::Store::open(&dir.path().join("evervm.db")).unwrap();
        let account = store.ensure_account("test").unwrap();
        for i in 0..1000 {
            let mut tags = Tags::new();
            tags.insert(
                "parity".into(),
                if i % 2 == 0 { "even" } else { "odd" }.into(),
            );
            store
                .insert_machine(&evervm_engine::store::MachineRecord {
                    name: evervm_engine::MachineName::parse(&format!("m{i:04}")).unwrap(),
                    account_id: account.id,
                    created_at: chrono::Utc::now(),
                    tags,
                    memory_mb: 512,
                    image: evervm_engine::guest::image::Profile::Minimal,
                    backend: "process".into(),
                    next_seq: 0,
                    last_used_at: None,
                    last_error: None,
                    durability: evervm_engine::Durability::Idle,
                    unsaved_since: None,
                    snapshot_at: None,
                    env: evervm_engine::Env::new(),
                    expires_at: None,
                    position: 0,
                    network: evervm_engine::network::NetworkPolicy::None,
                    snapshot_sha256: None,
                    history: 0,
                    parent: None,
                    forked_at: None,
                    env_error: None,
                })
                .unwrap();
        }
    }
    let mut config = EngineConfig::new(dir.path());
    config.backend = evervm_engine::BackendChoice::parse("process");
    config.limits.max_machines_per_account = 2000;
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = engine
            .list_machines_page(&account, &Tags::new(), 300, cursor)
            .await
            .unwrap();
        pages += 1;
        seen.extend(page.machines.iter().map(|m| m.name.to_string()));
        // A machine created between pages comes before the first page: never in a later one.
        if pages == 1 {
            engine
                .create_machine(&account, CreateMachine::default())
                .await
                .unwrap();
        }
        match page.next_cursor {
            Some(next) => cursor = Some(evervm_engine::ListCursor::parse(&next.encode()).unwrap()),
            None => break,
        }
    }
    assert_eq!(pages, 4);
    let expected: Vec<String> = (0..1000).rev().map(|i| format!("m{i:04}")).collect();
    assert_eq!(seen, expected, "every machine once, newest first");
    let odd = engine
        .list_machines_page(
            &account,
            &Tags::from([("parity".into(), "odd".into())]),
            1000,
            None,
        )
        .await
        .unwrap();
    assert_eq!((odd.machines.len(), odd.next_cursor), (500, None));
    assert!(
        engine
            .list_machines_page(&account, &Tags::new(), 0, None)
            .await
            .is_err()
    );
    assert!(evervm_engine::ListCursor::parse("nonsense").is_err());

    // A machine given a second to live is deleted soon after, with its history.
    let brief = engine
        .create_machine(
            &account,
            CreateMachine {
                expires_at: Some(chrono::Utc::now() + chrono::Duration::seconds(1)),
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap();
    assert!(brief.expires_at.is_some());
    let name = brief.name.to_string();
    // Its deletion ends the instruction it runs: the result is the event to wait for (the
    // instruction's own timeout, far beyond the expiry, bounds the wait).
    let seq = engine
        .exec(
            &account,
            &name,
            ExecRequest {
                timeout: std::time::Duration::from_secs(60),
                ..ExecRequest::new("import time; time.sleep(120)")
            },
        )
        .await
        .unwrap()
        .seq;
    let ended = engine.result(&account, &name, seq).await.unwrap();
    match ended.outcome {
        Outcome::Error { text, cause } => {
            assert_eq!(cause, FailureCause::MachineDeleted, "{text}");
            assert!(text.contains("deleted"), "{text}");
        }
        Outcome::Value(value) => panic!("the instruction finished: {value:?}"),
    }
    // Its deletion is under way or done: nothing reaches it any more.
    let gone = engine
        .exec(&account, &name, ExecRequest::new("1"))
        .await
        .unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound);
    let past = engine
        .create_machine(
            &account,
            CreateMachine {
                expires_at: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(past.kind(), ErrorKind::InvalidInput);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn info_says_how_the_interpreter_began() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine_after(&engine, &account, "x = 1").await;
    let info = engine.machine_info(&account, &name).await.unwrap();
    assert_eq!(
        info.interpreter,
        Some(evervm_engine::InterpreterStart::Booted)
    );
    assert!(info.interpreter_started_at.is_some());
    // A crash: the next interpreter is a restart after it.
    let seq = engine
        .exec(&account, &name, ExecRequest::new("import os; os._exit(3)"))
        .await
        .unwrap()
        .seq;
    engine.result(&account, &name, seq).await.unwrap();
    let seq = engine
        .exec(&account, &name, ExecRequest::new("1"))
        .await
        .unwrap()
        .seq;
    engine.result(&account, &name, seq).await.unwrap();
    let info = engine.machine_info(&account, &name).await.unwrap();
    assert_eq!(
        info.interpreter,
        Some(evervm_engine::InterpreterStart::RestartedAfterCrash { snapshot_at: None })
    );
    engine.shutdown().await;
}

/// What each failure reports as data: (code, name, qualname, module, value; a value ending in
/// `*` is a prefix).
const RAISED: &[(&str, &str, &str, &str, &str)] = &[
    (
        "1/0",
        "ZeroDivisionError",
        "ZeroDivisionError",
        "builtins",
        "division by zero",
    ),
    (
        "def f():\n    class FinalAnswer(Exception):\n        pass\n    raise FinalAnswer('done')\nf()",
        "FinalAnswer",
        "f.<locals>.FinalAnswer",
        "__main__",
        "done",
    ),
    (
        "import json\njson.loads('{')",
        "JSONDecodeError",
        "JSONDecodeError",
        "json.decoder",
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ),
    (
        "raise ValueError('first\\nsecond')",
        "ValueError",
        "ValueError",
        "builtins",
        "first\nsecond",
    ),
    (
        "e = KeyError('k')\ne.add_note('a note')\nraise e",
        "KeyError",
        "KeyError",
        "builtins",
        "'k'",
    ),
    (
        "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Odd()",
        "Odd",
        "Odd",
        "__main__",
        "<exception str() failed>",
    ),
    (
        "x = (",
        "SyntaxError",
        "SyntaxError",
        "builtins",
        "'(' was never closed (<instruction *",
    ),
    (
        "raise SystemExit(3)",
        "SystemExit",
        "SystemExit",
        "builtins",
        "3",
    ),
    (
        "raise ExceptionGroup('two', [ValueError(1), TypeError(2)])",
        "ExceptionGroup",
        "ExceptionGroup",
        "builtins",
        "two (2 sub-exceptions)",
    ),
    (
        "try:\n    1/0\nexcept Exception as e:\n    raise LookupError('outer') from e",
        "LookupError",
        "LookupError",
        "builtins",
        "outer",
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn exceptions_are_reported_as_data_from_the_object() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine_after(&engine, &account, "None").await;
    for (code, name_, qualname, module, message) in RAISED {
        let seq = engine
            .exec(&account, &name, ExecRequest::new(*code))
            .await
            .unwrap()
            .seq;
        let result = engine.result(&account, &name, seq).await.unwrap();
        let Outcome::Error { text, cause } = &result.outcome else {
            panic!("{code:?} did not fail: {result:?}");
        };
        assert_eq!(*cause, FailureCause::Exception, "{code:?}");
        let exception = result.exception.as_ref().unwrap();
        let value = match message.strip_suffix('*') {
            Some(prefix) if exception.value.starts_with(prefix) => *message,
            _ => exception.value.as_str(),
        };
        assert_eq!(
            (
                exception.name.as_str(),
                exception.qualname.as_str(),
                exception.module.as_str(),
                value
            ),
            (*name_, *qualname, *module, *message),
            "{code:?}"
        );
        assert!(text.contains(name_), "{code:?}: the traceback {text:?}");
    }
    // The machine carried on; and a value has no exception.
    let seq = engine
        .exec(&account, &name, ExecRequest::new("2 + 2"))
        .await
        .unwrap()
        .seq;
    let result = engine.result(&account, &name, seq).await.unwrap();
    assert_eq!(value(&result).as_deref(), Some("4"));
    assert!(result.exception.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn jupyter_cells_run_as_an_ipython_kernel_runs_them() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("test").await.unwrap();
    let name = machine_after(&engine, &account, "shared = 20").await;
    let cell = |code: &str| {
        let mut request = ExecRequest::new(code);
        request.dialect = evervm_engine::Dialect::Jupyter;
        request
    };
    let run_cell = |request: ExecRequest| {
        let (engine, account, name) = (&engine, &account, &name);
        async move {
            let seq = engine.exec(account, name, request).await.unwrap().seq;
            let events: Vec<ExecEvent> = engine
                .events(account, name, seq)
                .await
                .unwrap()
                .collect()
                .await;
            let mut stdout = String::new();
            let mut result = None;
            for event in events {
                match event {
                    ExecEvent::Output(chunk)
                        if chunk.stream == evervm_engine::OutputStream::Stdout =>
                    {
                        stdout.push_str(&chunk.data);
                        stdout.push('\n');
                    }
                    ExecEvent::Result(r) => result = Some(r),
                    ExecEvent::Output(_) => {}
                }
            }
            (stdout, result.unwrap())
        }
    };
    // A cell whose lines all start indented runs; the machine's namespace is shared.
    let (_, indented) = run_cell(cell("\n    x = shared + 1\n    x * 2")).await;
    assert_eq!(value(&indented).as_deref(), Some("42"));
    // Shell escapes and magics.
    let (printed, _) = run_cell(cell("!echo from-the-shell")).await;
    // IPython runs it on a pty, as in a kernel: the line ends with CR LF.
    assert_eq!(printed.trim_end(), "from-the-shell");
    let (_, moved) = run_cell(cell("%cd /tmp\nimport os\nos.getcwd()")).await;
    assert_eq!(value(&moved).as_deref(), Some("'/tmp'"));
    // `_` and `Out` are IPython's.
    let (_, underscore) = run_cell(cell("_")).await;
    assert_eq!(value(&underscore).as_deref(), Some("'/tmp'"));
    // display() is a rich result in order with the output.
    let (_, shown) = run_cell(cell(
        "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))",
    ))
    .await;
    assert_eq!(shown.results.len(), 1);
    assert_eq!(shown.results[0].get("text/html"), Some("<b>hi</b>"));
    // Errors: IPython's traceback, the exception as data.
    let (_, failed) = run_cell(cell("def f():\n    return 1 / 0\nf()")).await;
    let Outcome::Error { text, cause } = &failed.outcome else {
        panic!("no error: {failed:?}");
    };
    assert_eq!(*cause, FailureCause::Exception);
    assert!(
        text.contains("ZeroDivisionError") && text.contains("return 1 / 0"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "no colours: {text:?}");
    assert_eq!(failed.exception.as_ref().unwrap().name, "ZeroDivisionError");
    // A syntax error is reported before the cell runs.
    let (_, syntax) = run_cell(cell("x = (")).await;
    assert_eq!(syntax.exception.as_ref().unwrap().name, "SyntaxError");
    // A plain instruction afterwards sees the same namespace.
    let (_, plain) = run_cell(ExecRequest::new("x")).await;
    assert_eq!(value(&plain).as_deref(), Some("21"));
}

/// An instruction's output lines and its result.
async fn run_with_output(
    engine: &Engine,
    account: &evervm_engine::Account,
    name: &str,
    request: ExecRequest,
) -> (Vec<String>, evervm_engine::ExecResult) {
    let seq = engine.exec(account, name, request).await.unwrap().seq;
    let mut events = engine.events(account, name, seq).await.unwrap();
    let mut lines = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            ExecEvent::Output(chunk) => lines.push(chunk.data),
            ExecEvent::Result(result) => return (lines, result),
        }
    }
    panic!("the instruction's events ended without a result");
}

/// An instruction in `context` (none: the machine's own interpreter).
fn in_context(code: &str, context: Option<&str>) -> ExecRequest {
    ExecRequest {
        context: context.map(str::to_owned),
        ..ExecRequest::new(code)
    }
}

/// Contexts are interpreters of their own in one machine: their own globals and working
/// directory, the machine's files; restarted, their variables are gone; one that exits starts
/// again with its next instruction, saying so; one that ignores its timeout's interrupt is killed;
/// removed, it is gone, and an instruction for it says so.
#[tokio::test(flavor = "multi_thread")]
async fn contexts_are_interpreters_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir).await;
    let account = engine.ensure_account("local").await.unwrap();
    let name = machine_after(
        &engine,
        &account,
        "x = 'default'; open('shared.txt', 'w').write('s')",
    )
    .await;
    let somewhere = tempfile::tempdir().unwrap();
    let somewhere_path = somewhere.path().to_str().unwrap().to_owned();

    let made = engine
        .create_context(&account, &name, Some(&somewhere_path))
        .await
        .unwrap();
    assert_eq!(made.cwd, somewhere_path);
    assert!(made.pid.is_some());
    let ctx = Some(made.id.as_str());
    let listed = engine.list_contexts(&account, &name).await.unwrap();
    assert_eq!(
        listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["default", made.id.as_str()]
    );

    // Its own globals and working directory; the machine's files (by absolute path).
    let home = value(
        &run(
            &engine,
            &account,
            &name,
            in_context("import os; os.getcwd()", None),
        )
        .await,
    )
    .unwrap();
    let seen = run(&engine, &account, &name, in_context("x", ctx)).await;
    assert_eq!(
        seen.exception.as_ref().map(|e| e.name.as_str()),
        Some("NameError")
    );
    let code = format!(
        "import os; x = 'ctx'; print('hello'); \
         (os.getcwd(), open(os.path.join({home}, 'shared.txt')).read())"
    );
    let (output, result) = run_with_output(&engine, &account, &name, in_context(&code, ctx)).await;
    assert_eq!(
        value(&result).unwrap(),
        format!("({somewhere_path:?}, 's')").replace('"', "'")
    );
    assert_eq!(output, ["hello"]);
    assert_eq!(
        value(&run(&engine, &account, &name, in_context("x", None)).await).unwrap(),
        "'default'"
    );
    assert_eq!(
        value(&run(&engine, &account, &name, in_context("x", ctx)).await).unwrap(),
        "'ctx'"
    );

    // A timeout interrupts it and keeps its state; code that ignores the interrupt loses it.
    let slow = ExecRequest {
        timeout: Duration::from_secs(1),
        ..in_context("import time; time.sleep(30)", ctx)
    };
    assert_eq!(
        failure(&run(&engine, &account, &name, slow).await),
        Some(FailureCause::Timeout)
    );
    assert_eq!(
        value(&run(&engine, &account, &name, in_context("x", ctx)).await).unwrap(),
        "'ctx'"
    );
    let stubborn = ExecRequest {
        timeout: Duration::from_secs(1),
        ..in_context(
            "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)",
            ctx,
        )
    };
    let killed = run(&engine, &account, &name, stubborn).await;
    assert_eq!(failure(&killed), Some(FailureCause::Timeout));
    assert_eq!(
        killed.exception.as_ref().map(|e| e.name.as_str()),
        Some("ContextKilled")
    );
    let (output, result) = run_with_output(&engine, &account, &name, in_context("x", ctx)).await;
    assert_eq!(
        result.exception.as_ref().map(|e| e.name.as_str()),
        Some("NameError")
    );
    assert!(
        output.iter().any(|line| line.contains("started again")),
        "{output:?}"
    );

    // An exit ends the instruction and says so.
    let exited = run(
        &engine,
        &account,
        &name,
        in_context("import os; os._exit(3)", ctx),
    )
    .await;
    assert_eq!(
        exited.exception.as_ref().map(|e| e.name.as_str()),
        Some("ContextExited")
    );

    // Restarted: its variables are gone, its working directory is the one it was made with.
    run(&engine, &account, &name, in_context("x = 1", ctx)).await;
    let restarted = engine
        .restart_context(&account, &name, &made.id)
        .await
        .unwrap();
    assert_eq!(restarted.id, made.id);
    let after = run(
        &engine,
        &account,
        &name,
        in_context("import os; os.getcwd()", ctx),
    )
    .await;
    assert_eq!(value(&after).unwrap(), format!("'{somewhere_path}'"));
    let gone = run(&engine, &account, &name, in_context("x", ctx)).await;
    assert_eq!(
        gone.exception.as_ref().map(|e| e.name.as_str()),
        Some("NameError")
    );

    // The default context is not restarted or removed; an unknown one is not found.
    let refused = engine
        .remove_context(&account, &name, "default")
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput);
    let missing = engine
        .restart_context(&account, &name, "nope")
        .await
        .unwrap_err();
    assert_eq!(
        (missing.kind(), missing.resource()),
        (ErrorKind::NotFound, Some("context"))
    );
    let bad = engine
        .exec(&account, &name, in_context("1", Some("a/b")))
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidInput);

    // Removed: gone from the list, and an instruction for it says so.
    engine
        .remove_context(&account, &name, &made.id)
        .await
        .unwrap();
    assert_eq!(
        engine.list_contexts(&account, &name).await.unwrap().len(),
        1
    );
    let orphan = run(&engine, &account, &name, in_context("1", ctx)).await;
    assert_eq!(
        orphan.exception.as_ref().map(|e| e.name.as_str()),
        Some("ContextNotFound")
    );
    assert_eq!(
        value(&run(&engine, &account, &name, in_context("x", None)).await).unwrap(),
        "'default'"
    );
    engine.shutdown().await;
}
