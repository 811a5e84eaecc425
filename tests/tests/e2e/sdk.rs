//! Compatibility: the ForeverVM Rust SDK (`forevervm-sdk` 0.1.35, unchanged) against an evervm
//! server.

use std::collections::HashMap;

use evervm_tests::{TestServer, backends};
use forevervm_sdk::api::api_types::{ExecResultType, Instruction};
use forevervm_sdk::api::http_api::{CreateMachineRequest, ListMachinesRequest};
use forevervm_sdk::api::id_types::{InstructionSeq, MachineName};
use forevervm_sdk::api::protocol::{MessageFromServer, StandardOutputStream};
use forevervm_sdk::api::token::ApiToken;
use forevervm_sdk::client::ForeverVMClient;
use futures::StreamExt;

fn sdk(server: &TestServer) -> ForeverVMClient {
    ForeverVMClient::new(
        url::Url::parse(&server.url).unwrap(),
        ApiToken::new(server.token.clone()).unwrap(),
    )
}

async fn new_machine(client: &ForeverVMClient) -> MachineName {
    client
        .create_machine(CreateMachineRequest::default())
        .await
        .unwrap()
        .machine_name
}

fn tags(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn run(client: &ForeverVMClient, machine: &MachineName, code: &str) -> ExecResultType {
    run_with_timeout(client, machine, code, 15).await
}

async fn run_with_timeout(
    client: &ForeverVMClient,
    machine: &MachineName,
    code: &str,
    timeout_seconds: i32,
) -> ExecResultType {
    let accepted = client
        .exec_instruction(
            machine,
            Instruction {
                code: code.to_owned(),
                timeout_seconds,
            },
        )
        .await
        .unwrap();
    let seq = accepted.instruction_seq.unwrap();
    let response = client.exec_result(machine, seq).await.unwrap();
    assert_eq!(response.instruction_id, seq);
    response.result.result
}

fn value(result: &ExecResultType) -> Option<&str> {
    match result {
        ExecResultType::Value { value, .. } => value.as_deref(),
        ExecResultType::Error { error } => panic!("unexpected error: {error}"),
    }
}

fn error(result: &ExecResultType) -> &str {
    match result {
        ExecResultType::Error { error } => error,
        ExecResultType::Value { value, .. } => panic!("expected an error, got value {value:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn whoami_create_with_tags_and_list_with_filters() {
    for backend in backends() {
        let server = TestServer::start(backend);
        let client = sdk(&server);
        assert_eq!(client.whoami().await.unwrap().account, "default");

        let mut names = Vec::new();
        for (env, team) in [("prod", "a"), ("dev", "a"), ("prod", "b")] {
            let created = client
                .create_machine(CreateMachineRequest {
                    tags: tags(&[("env", env), ("team", team)]),
                    memory_mb: Some(256),
                })
                .await
                .unwrap();
            names.push(created.machine_name);
        }
        let all = client
            .list_machines(ListMachinesRequest::default())
            .await
            .unwrap()
            .machines;
        let listed: Vec<_> = all.iter().map(|m| m.name.clone()).collect();
        let newest_first: Vec<_> = names.iter().rev().cloned().collect();
        assert_eq!(listed, newest_first, "newest first");
        assert_eq!(all[0].tags, tags(&[("env", "prod"), ("team", "b")]));
        assert!(
            all.iter()
                .all(|m| m.expires_at.is_none() && !m.has_pending_instruction)
        );

        let prod = client
            .list_machines(ListMachinesRequest {
                tags: tags(&[("env", "prod")]),
            })
            .await
            .unwrap()
            .machines;
        assert_eq!(
            prod.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
            [names[2].clone(), names[0].clone()]
        );
        let both = client
            .list_machines(ListMachinesRequest {
                tags: tags(&[("env", "prod"), ("team", "a")]),
            })
            .await
            .unwrap()
            .machines;
        assert_eq!(both.len(), 1);
        assert_eq!(both[0].name, names[0]);
        let none = client
            .list_machines(ListMachinesRequest {
                tags: tags(&[("env", "staging")]),
            })
            .await
            .unwrap()
            .machines;
        assert!(none.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_values_nulls_errors_and_state() {
    for backend in backends() {
        let server = TestServer::start(backend);
        let client = sdk(&server);
        let machine = new_machine(&client).await;
        let first = client
            .exec_instruction(&machine, Instruction::new("1 + 1"))
            .await
            .unwrap();
        assert_eq!(first.instruction_seq, Some(InstructionSeq(0)));
        let result = client
            .exec_result(&machine, InstructionSeq(0))
            .await
            .unwrap()
            .result;
        assert_eq!(
            result.result,
            ExecResultType::Value {
                value: Some("2".into()),
                data: None
            }
        );
        assert_eq!(value(&run(&client, &machine, "x = 40").await), None);
        assert_eq!(value(&run(&client, &machine, "None").await), None);
        assert_eq!(
            value(&run(&client, &machine, "print(123) or 567").await),
            Some("567")
        );
        assert_eq!(value(&run(&client, &machine, "x + 2").await), Some("42"));
        assert_eq!(
            value(&run(&client, &machine, "'done'").await),
            Some("'done'")
        );
        let failure = run(&client, &machine, "1 / 0").await;
        let text = error(&failure);
        assert!(
            text.contains("ZeroDivisionError") && text.contains("division by zero"),
            "{text}"
        );
        // A function and a class defined in one instruction are there in the next.
        run(
            &client,
            &machine,
            "def double(n):\n    return 2 * n\nclass Box:\n    size = 3",
        )
        .await;
        assert_eq!(
            value(&run(&client, &machine, "double(Box.size)").await),
            Some("6")
        );
        // A finished result can be fetched again, after the fact.
        let again = client
            .exec_result(&machine, InstructionSeq(0))
            .await
            .unwrap();
        assert_eq!(again.instruction_id, InstructionSeq(0));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn output_chunks_and_stream_result() {
    for backend in backends() {
        let server = TestServer::start(backend);
        let client = sdk(&server);
        let machine = new_machine(&client).await;
        let accepted = client
            .exec_instruction(
                &machine,
                Instruction::new("import sys\nfor i in range(5): print(i)\nprint('oops', file=sys.stderr)\n'end'"),
            )
            .await
            .unwrap();
        let mut stream = client
            .exec_result_stream(&machine, accepted.instruction_seq.unwrap())
            .await
            .unwrap();
        let mut lines = Vec::new();
        let mut result = None;
        while let Some(message) = stream.next().await {
            match message.unwrap() {
                MessageFromServer::Output { chunk, .. } => {
                    assert!(result.is_none(), "output after the result");
                    lines.push((chunk.stream, chunk.data, chunk.seq.0));
                }
                MessageFromServer::Result(response) => result = Some(response.result),
                other => panic!("unexpected message {other:?}"),
            }
        }
        let expected: Vec<_> = (0..5)
            .map(|i| (StandardOutputStream::Stdout, i.to_string(), i64::from(i)))
            .chain(std::iter::once((
                StandardOutputStream::Stderr,
                "oops".to_owned(),
                5,
            )))
            .collect();
        assert_eq!(lines, expected);
        assert_eq!(value(&result.unwrap().result), Some("'end'"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_new_machine_chunks_and_seqs_shared_with_http() {
    for backend in backends() {
        let server = TestServer::start(backend);
        let client = sdk(&server);
        let mut repl = client.repl(&MachineName("new".into())).await.unwrap();
        let machine = repl.machine_name.clone();
        assert_ne!(machine.0, "new");

        // Lines ready together come to this SDK as one chunk (it keeps only 50 unshown
        // chunks): a 500-line print arrives whole, a line per line once printed.
        let mut handle = repl
            .exec("for i in range(500): print(i)\nprint('end', end='')")
            .await
            .unwrap();
        let mut lines = Vec::new();
        while let Some(output) = handle.next().await {
            assert_eq!(output.stream, StandardOutputStream::Stdout);
            lines.extend(output.data.lines().map(str::to_owned));
        }
        let result = handle.result().await.unwrap();
        assert_eq!(value(&result.result), None);
        let expected: Vec<String> = (0..500)
            .map(|i| i.to_string())
            .chain(["end".to_owned()])
            .collect();
        assert_eq!(lines, expected);

        // The WebSocket took seq 0; HTTP gets 1; the WebSocket then 2.
        let http = client
            .exec_instruction(&machine, Instruction::new("y = 5"))
            .await
            .unwrap();
        assert_eq!(http.instruction_seq, Some(InstructionSeq(1)));
        assert_eq!(http.machine.as_ref(), Some(&machine));
        client
            .exec_result(&machine, InstructionSeq(1))
            .await
            .unwrap();
        let handle = repl.exec("y * 2").await.unwrap();
        assert_eq!(value(&handle.result().await.unwrap().result), Some("10"));
        // The SDK's handle does not show the seq; HTTP finds that instruction as seq 2.
        let by_http = client
            .exec_result(&machine, InstructionSeq(2))
            .await
            .unwrap();
        assert_eq!(value(&by_http.result.result), Some("10"));

        // State is the machine's, not the connection's.
        drop(repl);
        let mut second = client.repl(&machine).await.unwrap();
        assert_eq!(second.machine_name, machine);
        let handle = second.exec("y + 1").await.unwrap();
        assert_eq!(value(&handle.result().await.unwrap().result), Some("6"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_then_recovery() {
    for backend in backends() {
        let server = TestServer::start(backend);
        let client = sdk(&server);
        let machine = new_machine(&client).await;
        run(
            &client,
            &machine,
            "from time import sleep\nkept = 'still here'",
        )
        .await;
        let timed_out = run_with_timeout(&client, &machine, "sleep(30)", 1).await;
        assert!(error(&timed_out).contains("Timed out"), "{timed_out:?}");
        assert_eq!(
            value(&run(&client, &machine, "sleep(0.01)\nkept").await),
            Some("'still here'")
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_flag_stops_the_running_instruction() {
    // The Rust SDK always sends `interrupt: false`; the Python and JS SDKs send `true`, as here.
    for backend in backends() {
        let server = TestServer::start(backend);
        let client = sdk(&server);
        let machine = new_machine(&client).await;
        run(&client, &machine, "import time\nn = 1").await;
        let slow = client
            .exec_instruction(&machine, Instruction::new("time.sleep(60)"))
            .await
            .unwrap()
            .instruction_seq
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let http = reqwest::Client::new();
        let response: serde_json::Value = http
            .post(format!("{}/v1/machine/{machine}/exec", server.url))
            .bearer_auth(&server.token)
            .json(&serde_json::json!({"instruction": {"code": "n + 1"}, "interrupt": true}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(response["interrupted"], true);
        let interrupted = client.exec_result(&machine, slow).await.unwrap().result;
        assert!(
            error(&interrupted.result).contains("KeyboardInterrupt"),
            "{interrupted:?}"
        );
        assert!(interrupted.runtime_ms < 30_000);
        let seq = response["instruction_seq"].as_i64().unwrap();
        let next = client
            .exec_result(&machine, InstructionSeq(seq))
            .await
            .unwrap();
        assert_eq!(value(&next.result.result), Some("2"));
    }
}
