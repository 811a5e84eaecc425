//! Processes beside the interpreter, on the process backend (the gVisor end-to-end tests and the
//! E2B SDK's tests cover them in a sandbox): real pids, output as it comes, stdin, signals to the
//! whole group, a process that runs while an instruction does, and refusals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use evervm_engine::{
    Account, CreateMachine, Engine, EngineConfig, ErrorKind, ExecRequest, Process, ProcessEnd,
    ProcessSpec, ProcessState, ProcessStream, ProcessUpdate,
};

async fn engine(dir: &tempfile::TempDir) -> (Engine, Account, String) {
    let mut config = EngineConfig::new(dir.path());
    config.backend = evervm_engine::BackendChoice::parse("process");
    config.pool_size = 0;
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = engine
        .create_machine(&account, CreateMachine::default())
        .await
        .unwrap()
        .name
        .to_string();
    (engine, account, name)
}

fn spec(argv: &[&str]) -> ProcessSpec {
    ProcessSpec {
        argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        ..ProcessSpec::default()
    }
}

/// Everything the process writes, by stream, and how it ended.
async fn finish(mut process: Process) -> (String, String, ProcessEnd) {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        match process.next().await {
            ProcessUpdate::Output(piece) => match piece.stream {
                ProcessStream::Stdout => stdout.extend_from_slice(&piece.data),
                ProcessStream::Stderr => stderr.extend_from_slice(&piece.data),
            },
            ProcessUpdate::Missed(n) => panic!("{n} pieces of output missed"),
            ProcessUpdate::Over(ProcessState::Ended { end, .. }) => {
                return (
                    String::from_utf8(stdout).unwrap(),
                    String::from_utf8(stderr).unwrap(),
                    end,
                );
            }
            ProcessUpdate::Over(other) => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_streams_its_output_and_ends_with_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir).await;
    let process = engine
        .start_process(
            &account,
            &name,
            spec(&["sh", "-c", "printf 'out'; echo err >&2; echo $$; exit 3"]),
        )
        .await
        .unwrap();
    let pid = process.pid;
    let (stdout, stderr, end) = finish(process).await;
    assert_eq!(
        stdout,
        format!("out{pid}\n"),
        "the pid is the process's own"
    );
    assert_eq!(stderr, "err\n");
    assert_eq!((end.exit_code, end.signal), (Some(3), None));
    let missing = engine
        .start_process(&account, &name, spec(&["no-such-command-anywhere"]))
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::InvalidInput, "{missing}");
    assert!(
        missing.to_string().contains("no-such-command-anywhere"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_is_fed_and_closed_and_a_signal_ends_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir).await;
    let cat = engine
        .start_process(
            &account,
            &name,
            ProcessSpec {
                stdin: true,
                ..spec(&["cat"])
            },
        )
        .await
        .unwrap();
    let pid = cat.pid;
    assert_eq!(engine.list_processes(&account, &name).await.unwrap(), [pid]);
    engine
        .process_input(&account, &name, pid, b"hello\n".to_vec())
        .await
        .unwrap();
    let follower = engine.connect_process(&account, &name, pid).await.unwrap();
    engine
        .process_input(&account, &name, pid, "wörld".as_bytes().to_vec())
        .await
        .unwrap();
    engine
        .close_process_stdin(&account, &name, pid)
        .await
        .unwrap();
    let (stdout, _, end) = finish(cat).await;
    assert_eq!((stdout.as_str(), end.exit_code), ("hello\nwörld", Some(0)));
    // One who connected later saw what came after (and may have seen what came just before).
    let (seen_by_follower, _, _) = finish(follower).await;
    assert!(seen_by_follower.ends_with("wörld"), "{seen_by_follower:?}");

    // A shell with a child: the signal reaches both (the child would keep the pipe open).
    let tree = engine
        .start_process(
            &account,
            &name,
            spec(&["sh", "-c", "sleep 60 & sleep 60; wait"]),
        )
        .await
        .unwrap();
    let pid = tree.pid;
    engine
        .signal_process(&account, &name, pid, libc::SIGTERM)
        .await
        .unwrap();
    let (_, _, end) = tokio::time::timeout(Duration::from_secs(20), finish(tree))
        .await
        .unwrap();
    assert_eq!((end.exit_code, end.signal), (None, Some(libc::SIGTERM)));
    let gone = engine
        .signal_process(&account, &name, pid, libc::SIGTERM)
        .await
        .unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    let unknown = engine
        .connect_process(&account, &name, 999_999)
        .await
        .unwrap_err();
    assert_eq!(unknown.kind(), ErrorKind::NotFound, "{unknown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_runs_while_an_instruction_does_and_its_timeout_kills_it() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir).await;
    // The instruction waits on a FIFO for what the process writes: were processes held back
    // behind instructions, it would time out instead.
    let fifo = "import os; os.mkfifo(os.path.expanduser('~/beside.txt')); 1";
    let made = engine
        .exec(&account, &name, ExecRequest::new(fifo))
        .await
        .unwrap();
    engine.result(&account, &name, made.seq).await.unwrap();
    let waits = "import os\nopen(os.path.expanduser('~/beside.txt')).read()";
    let mut request = ExecRequest::new(waits);
    request.timeout = Duration::from_secs(60);
    let seq = engine.exec(&account, &name, request).await.unwrap().seq;
    let echo = engine
        .start_process(
            &account,
            &name,
            spec(&[
                "sh",
                "-c",
                "echo beside > \"$HOME/beside.txt\" && echo done",
            ]),
        )
        .await
        .unwrap();
    let (stdout, _, end) = finish(echo).await;
    assert_eq!((stdout.as_str(), end.exit_code), ("done\n", Some(0)));
    let result = engine.result(&account, &name, seq).await.unwrap();
    assert!(
        matches!(&result.outcome, evervm_engine::Outcome::Value(Some(v)) if v == "'beside\\n'"),
        "{result:?}"
    );

    let sleeper = engine
        .start_process(
            &account,
            &name,
            ProcessSpec {
                timeout: Some(Duration::from_millis(500)),
                ..spec(&["sleep", "60"])
            },
        )
        .await
        .unwrap();
    let (_, _, end) = tokio::time::timeout(Duration::from_secs(20), finish(sleeper))
        .await
        .unwrap();
    assert_eq!(end.signal, Some(libc::SIGKILL));
}

/// The events a watch has reported so far, as (name, type).
fn watch_events(watch: &mut Process) -> Vec<(String, String)> {
    let mut events = Vec::new();
    while let Ok(piece) = watch.output.try_recv() {
        for line in String::from_utf8(piece.data.to_vec()).unwrap().lines() {
            let event: serde_json::Value = serde_json::from_str(line).unwrap();
            events.push((
                event["name"].as_str().unwrap().to_owned(),
                event["type"].as_str().unwrap().to_owned(),
            ));
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_reports_changes_before_the_operation_that_made_them_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir).await;
    engine
        .make_dir(&account, &name, "w/sub", true)
        .await
        .unwrap();
    let missing = engine
        .watch_dir(&account, &name, "nowhere", false)
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");

    let mut watch = engine.watch_dir(&account, &name, "w", true).await.unwrap();
    let write = |path: &'static str| {
        let engine = engine.clone();
        let (account, name) = (account.clone(), name.clone());
        async move {
            let data = futures::stream::iter([Ok(bytes::Bytes::from_static(b"x"))]);
            engine
                .write_file(
                    &account,
                    &name,
                    path,
                    Box::pin(data),
                    evervm_engine::WriteFileOptions::default(),
                )
                .await
                .unwrap();
        }
    };
    // A file the host writes is reported as E2B's envd reports an upload, never by its
    // temporary name; nothing waits: it is there when the write has answered.
    write("w/sub/a.txt").await;
    let created = [
        ("sub/a.txt", "create"),
        ("sub/a.txt", "chmod"),
        ("sub/a.txt", "write"),
    ];
    let expected: Vec<(String, String)> = created
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    assert_eq!(watch_events(&mut watch), expected);
    write("w/sub/a.txt").await;
    assert_eq!(
        watch_events(&mut watch)[0],
        ("sub/a.txt".to_owned(), "write".to_owned())
    );
    // A directory made inside is watched too (recursive), and a removal is reported.
    engine
        .make_dir(&account, &name, "w/new", false)
        .await
        .unwrap();
    write("w/new/b.txt").await;
    engine
        .remove_file(&account, &name, "w/sub/a.txt", false)
        .await
        .unwrap();
    let events = watch_events(&mut watch);
    assert!(
        events.contains(&("new".to_owned(), "create".to_owned())),
        "{events:?}"
    );
    assert!(
        events.contains(&("new/b.txt".to_owned(), "write".to_owned())),
        "{events:?}"
    );
    assert!(
        events.contains(&("sub/a.txt".to_owned(), "remove".to_owned())),
        "{events:?}"
    );
    engine.end_process(&account, &name, &watch).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), watch.next())
        .await
        .unwrap();
    assert!(
        matches!(ended, ProcessUpdate::Over(ProcessState::Ended { .. })),
        "{ended:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_on_a_terminal_sees_one_of_its_size_and_is_typed_to() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir).await;
    let size = |cols, rows| Some(evervm_engine::TerminalSize { cols, rows });
    let shell = engine
        .start_process(
            &account,
            &name,
            ProcessSpec {
                pty: size(80, 24),
                env: [("ABC".to_owned(), "123".to_owned())].into(),
                ..spec(&["sh"])
            },
        )
        .await
        .unwrap();
    let mut shell = shell;
    let pid = shell.pid;
    engine
        .process_input(&account, &name, pid, b"stty size; echo $ABC\n".to_vec())
        .await
        .unwrap();
    // The first line has run (its last output seen) before the terminal changes size.
    let mut before = String::new();
    while !before.contains("123\r\n") {
        match shell.next().await {
            ProcessUpdate::Output(piece) => before.push_str(&String::from_utf8_lossy(&piece.data)),
            other => panic!("{other:?} after {before:?}"),
        }
    }
    assert!(before.contains("24 80\r\n"), "{before:?}");
    engine
        .resize_terminal(&account, &name, pid, size(100, 30).unwrap())
        .await
        .unwrap();
    engine
        .process_input(&account, &name, pid, b"stty size; tty; exit 4\n".to_vec())
        .await
        .unwrap();
    let (output, stderr, end) = finish(shell).await;
    assert_eq!(stderr, "", "a terminal's output is one stream");
    assert_eq!(end.exit_code, Some(4));
    for seen in ["30 100\r\n", "/dev/pts/"] {
        assert!(output.contains(seen), "{seen:?} not in {output:?}");
    }
    let refused = engine
        .start_process(
            &account,
            &name,
            ProcessSpec {
                pty: size(0, 24),
                ..spec(&["sh"])
            },
        )
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
}
