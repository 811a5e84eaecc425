//! Hostile WebSocket clients: a message over the size limit. It may not stop the server from
//! serving everyone else.

use super::*;

impl Server {
    /// A WebSocket on `machine` as alice, `connected` read.
    async fn repl(&self, machine: &str) -> Ws {
        let path = format!("/v1/machine/{machine}/repl");
        let mut ws = self.ws(&path, Some(&self.alice)).await.unwrap();
        let connected = json!({"type": "connected", "machine_name": machine});
        assert_eq!(next_message(&mut ws).await, connected);
        ws
    }
}

/// Runs `code` on a connection as request `request_id`; its seq and its result.
async fn run_ws(ws: &mut Ws, code: &str, request_id: u32) -> (i64, Value) {
    exec_ws(ws, code, request_id).await;
    let received = next_message(ws).await;
    assert_eq!(received["type"], "exec_received", "{received}");
    assert_eq!(received["request_id"], request_id, "{received}");
    let seq = received["seq"].as_i64().unwrap();
    let (_, result) = collect_instruction(ws, seq).await;
    (seq, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_websocket_message_closes_only_its_connection() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let mut bystander = server.repl(&machine).await;
    let mut hostile = server.repl(&machine).await;

    // An exec over the server's 2 MiB message limit, in one frame.
    let code = "#".repeat(3 * 1024 * 1024);
    let exec = json!({"type": "exec", "instruction": {"code": code}, "request_id": 0});
    hostile
        .send(Message::Text(exec.to_string().into()))
        .await
        .unwrap();

    // The server says why, then closes with 1009 (message too big) and a reason.
    let too_large = json!({"type": "error", "code": "PayloadTooLarge", "id": null});
    assert_eq!(next_message(&mut hostile).await, too_large);
    let frame = tokio::time::timeout(WAIT, hostile.next()).await.unwrap();
    let Some(Ok(Message::Close(Some(close)))) = frame else {
        panic!("expected a close frame, got {frame:?}");
    };
    assert_eq!(u16::from(close.code), 1009, "{close:?}");
    assert!(close.reason.contains("limit"), "{close:?}");
    closes(&mut hostile).await;

    // Nothing ran; the other connection, HTTP and other machines go on.
    assert_eq!(server.info(&machine).await["instruction_count"], 0);
    let (seq, result) = run_ws(&mut bystander, "1 + 1", 0).await;
    assert_eq!((seq, &result["value"]), (0, &json!("2")));
    let seq = server.exec(&machine, "40 + 2").await;
    assert_eq!(server.result(&machine, seq).await["value"], "42");
    let other = server.new_machine(json!({})).await;
    let mut ws = server.repl(&other).await;
    assert_eq!(run_ws(&mut ws, "'ok'", 0).await.1["value"], "'ok'");

    server.stop().await;
}
