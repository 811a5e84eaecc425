//! The same behaviours through `evervm::Client`, in both transports: remote (a server over HTTP
//! and WebSocket) and local (the engine in this process).

use std::time::Duration;

use evervm::{
    Client, CreateMachineOptions, ErrorKind, ExecEvent, ExecOptions, FailureCause, LocalOptions,
    OutputStream, Tags,
};
use evervm_tests::{TestServer, backends};
use futures::StreamExt;

/// Whatever a client needs kept alive (its server, or its home).
type Keep = Box<dyn std::any::Any + Send>;

/// A remote and a local client for every backend.
async fn clients() -> Vec<(String, Client, Keep)> {
    let mut all: Vec<(String, Client, Keep)> = Vec::new();
    for backend in backends() {
        let server = TestServer::start(backend);
        all.push((
            format!("remote/{backend}"),
            server.client(),
            Box::new(server),
        ));
        let home = tempfile::tempdir().unwrap();
        let local = Client::local(LocalOptions {
            home: Some(home.path().to_owned()),
            backend: Some(backend.clone()),
            account: None,
            pool_size: None,
        })
        .await
        .unwrap();
        all.push((format!("local/{backend}"), local, Box::new(home)));
    }
    all
}

fn tags(pairs: &[(&str, &str)]) -> Tags {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_tags_info_and_delete() {
    for (label, client, _keep) in clients().await {
        let a = client
            .create_machine(CreateMachineOptions {
                tags: tags(&[("role", "worker"), ("n", "1")]),
                memory_mb: Some(1024),
                image: None,
                ..CreateMachineOptions::default()
            })
            .await
            .unwrap();
        let b = client
            .create_machine(CreateMachineOptions {
                tags: tags(&[("role", "worker"), ("n", "2")]),
                memory_mb: None,
                image: None,
                ..CreateMachineOptions::default()
            })
            .await
            .unwrap();
        let names = |list: Vec<evervm::MachineInfo>| -> Vec<String> {
            list.into_iter().map(|m| m.name).collect()
        };
        assert_eq!(
            names(
                client
                    .list_machines(&tags(&[("role", "worker")]))
                    .await
                    .unwrap()
            ),
            [b.name(), a.name()],
            "{label}"
        );
        assert_eq!(
            names(client.list_machines(&tags(&[("n", "1")])).await.unwrap()),
            [a.name()],
            "{label}"
        );
        let info = a.info().await.unwrap();
        assert_eq!(info.memory_mb, Some(1024), "{label}");
        assert_eq!(
            info.tags,
            tags(&[("role", "worker"), ("n", "1")]),
            "{label}"
        );
        assert_eq!(info.instruction_count, Some(0), "{label}");
        assert!(info.backend.is_some(), "{label}");

        a.exec("x = 1").await.unwrap();
        if info.backend.as_deref() == Some("process") {
            let err = a.swap_out().await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unsupported, "{label}: {err}");
        }
        assert_eq!(
            a.info().await.unwrap().instruction_count,
            Some(1),
            "{label}"
        );
        a.delete().await.unwrap();
        assert_eq!(
            a.info().await.unwrap_err().kind(),
            ErrorKind::NotFound,
            "{label}"
        );
        assert_eq!(
            a.exec("x").await.unwrap_err().kind(),
            ErrorKind::NotFound,
            "{label}"
        );
        assert_eq!(
            names(client.list_machines(&Tags::new()).await.unwrap()),
            [b.name()],
            "{label}"
        );
        assert!(!client.whoami().await.unwrap().is_empty(), "{label}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_values_errors_output_and_replay() {
    for (label, client, _keep) in clients().await {
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        let first = machine.exec("1 + 1").await.unwrap();
        assert_eq!(
            (first.seq, first.result.value.as_deref()),
            (0, Some("2")),
            "{label}"
        );
        let statement = machine.exec("x = 20").await.unwrap();
        assert_eq!(statement.result.value, None, "{label}");
        assert!(!statement.result.is_error(), "{label}");
        let error = machine.exec("x / 0").await.unwrap();
        let text = error.result.error.as_deref().unwrap();
        assert!(
            text.contains("ZeroDivisionError: division by zero"),
            "{label}: {text}"
        );
        assert_eq!(error.result.cause, Some(FailureCause::Exception), "{label}");

        let (seq, mut events) = machine
            .stream(
                "import sys\nfor i in range(3): print(i)\nprint('warn', file=sys.stderr)\nx * 2",
                &ExecOptions::default(),
            )
            .await
            .unwrap();
        let mut seen = Vec::new();
        while let Some(event) = events.next().await {
            seen.push(event.unwrap());
        }
        let expected_lines = [
            (OutputStream::Stdout, "0"),
            (OutputStream::Stdout, "1"),
            (OutputStream::Stdout, "2"),
            (OutputStream::Stderr, "warn"),
        ];
        for (i, (stream, data)) in expected_lines.iter().enumerate() {
            match &seen[i] {
                ExecEvent::Output(chunk) => {
                    assert_eq!(
                        (chunk.seq, chunk.stream, chunk.data.as_str()),
                        (i as i64, *stream, *data),
                        "{label}"
                    );
                }
                other => panic!("{label}: expected output, got {other:?}"),
            }
        }
        match seen.last().unwrap() {
            ExecEvent::Result(result) => assert_eq!(result.value.as_deref(), Some("40"), "{label}"),
            other => panic!("{label}: expected the result last, got {other:?}"),
        }
        // After the fact: the same events, replayed from the store, and the result.
        let replay: Vec<_> = machine
            .events(seq)
            .await
            .unwrap()
            .map(Result::unwrap)
            .collect()
            .await;
        assert_eq!(replay, seen, "{label}");
        assert_eq!(
            machine.result(seq).await.unwrap().value.as_deref(),
            Some("40"),
            "{label}"
        );
        assert_eq!(
            machine.result(999).await.unwrap_err().kind(),
            ErrorKind::NotFound,
            "{label}"
        );
        // Output written below Python (fd 1 and 2, a subprocess) is captured too, and cannot
        // disturb the agent's channel.
        let low = machine
            .exec(
                "import os, subprocess\nos.write(1, b'raw fd write\\n')\n\
                 subprocess.run(['echo', 'from a subprocess'])\nos.write(2, b'\\x00\\xff binary\\n')\n'ok'",
            )
            .await
            .unwrap();
        let lines: Vec<&str> = low.output.iter().map(|c| c.data.as_str()).collect();
        assert!(lines.contains(&"raw fd write"), "{label}: {lines:?}");
        assert!(lines.contains(&"from a subprocess"), "{label}: {lines:?}");
        assert_eq!(low.result.value.as_deref(), Some("'ok'"), "{label}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_share_seqs_and_state() {
    for (label, client, _keep) in clients().await {
        let mut session = client.connect_new().await.unwrap();
        let machine = client.machine(session.machine_name());
        let mut printed = Vec::new();
        let run = session
            .exec(
                "for i in range(5): print(i)",
                &ExecOptions::default(),
                |c| {
                    printed.push(c.data.clone());
                },
            )
            .await
            .unwrap();
        assert_eq!(run.seq, 0, "{label}");
        assert_eq!(printed, ["0", "1", "2", "3", "4"], "{label}");
        assert_eq!(run.stdout(), "0\n1\n2\n3\n4\n", "{label}");
        let direct = machine.exec("z = 9").await.unwrap();
        assert_eq!(direct.seq, 1, "{label}");
        let again = session
            .exec("z", &ExecOptions::default(), |_| {})
            .await
            .unwrap();
        assert_eq!(
            (again.seq, again.result.value.as_deref()),
            (2, Some("9")),
            "{label}"
        );
        drop(session);
        let mut second = machine.connect().await.unwrap();
        let seen = second
            .exec("z + 1", &ExecOptions::default(), |_| {})
            .await
            .unwrap();
        assert_eq!(seen.result.value.as_deref(), Some("10"), "{label}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_recovery_and_interrupt() {
    for (label, client, _keep) in clients().await {
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        machine.exec("import time\nkept = 3").await.unwrap();
        let timed_out = machine
            .exec_with(
                "time.sleep(30)",
                &ExecOptions {
                    timeout: Duration::from_secs(1),
                    interrupt: false,
                    ..ExecOptions::default()
                },
            )
            .await
            .unwrap();
        assert!(
            timed_out.result.timed_out(),
            "{label}: {:?}",
            timed_out.result
        );
        assert!(
            timed_out
                .result
                .error
                .as_deref()
                .unwrap()
                .contains("Timed out"),
            "{label}"
        );
        assert_eq!(
            machine.exec("kept").await.unwrap().result.value.as_deref(),
            Some("3"),
            "{label}"
        );

        let slow = machine
            .start(
                "print('started', flush=True)\ntime.sleep(60)",
                &ExecOptions::default(),
            )
            .await
            .unwrap();
        let queued = machine
            .start("'queued'", &ExecOptions::default())
            .await
            .unwrap();
        // Running once its first line has arrived.
        let mut events = machine.events(slow.seq).await.unwrap();
        assert!(events.next().await.is_some(), "{label}");
        assert!(machine.interrupt().await.unwrap(), "{label}");
        for seq in [slow.seq, queued.seq] {
            let result = machine.result(seq).await.unwrap();
            assert_eq!(
                result.cause,
                Some(FailureCause::Interrupted),
                "{label}: {result:?}"
            );
        }
        assert!(
            !machine.interrupt().await.unwrap(),
            "{label}: nothing left to interrupt"
        );
        assert_eq!(
            machine
                .exec("kept * 2")
                .await
                .unwrap()
                .result
                .value
                .as_deref(),
            Some("6"),
            "{label}"
        );
    }
}
