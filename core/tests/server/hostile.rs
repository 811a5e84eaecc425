//! Hostile WebSocket clients: a message over the size limit, a client that stops reading while
//! its instruction prints megabytes, and many idle connections to one machine. None of them may
//! stop the server from serving everyone else.

use super::*;

/// Lines the slow client's instruction prints, 100 bytes each: 10 MB of output, 17 MB of
/// messages, more than the kernel's socket buffers hold on either side.
const SLOW_LINES: usize = 100_000;

/// Idle connections opened to one machine.
const IDLE_CONNECTIONS: usize = 200;

/// Line `i` of the slow client's instruction.
fn slow_line(i: usize) -> String {
    format!("{i:07}{}", "x".repeat(93))
}

/// This process's resident memory (`VmRSS`), in bytes: the server and its engine run here.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

impl Server {
    /// Upgrade to `path` as alice over a socket with a small receive buffer, and read
    /// `connected`: a client that will be slow to read.
    async fn slow_ws(&self, path: &str) -> Ws {
        let address: std::net::SocketAddr =
            self.base.trim_start_matches("http://").parse().unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let stream = tokio::time::timeout(WAIT, socket.connect(address))
            .await
            .unwrap()
            .unwrap();
        let mut request = format!("{}{path}", self.ws_base)
            .into_client_request()
            .unwrap();
        let bearer = format!("Bearer {}", self.alice).parse().unwrap();
        request.headers_mut().insert("authorization", bearer);
        let stream = tokio_tungstenite::MaybeTlsStream::Plain(stream);
        let connecting = tokio_tungstenite::client_async(request, stream);
        let (mut ws, _) = tokio::time::timeout(WAIT, connecting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next_message(&mut ws).await["type"], "connected");
        ws
    }

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_that_stops_reading_blocks_nobody_and_loses_nothing() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let other = server.new_machine(json!({})).await;
    let mut slow = server.slow_ws(&format!("/v1/machine/{machine}/repl")).await;
    let before = resident_bytes();

    // The slow client asks for 10 MB of output and reads nothing.
    let code = format!("for i in range({SLOW_LINES}): print(f'{{i:07}}' + 'x' * 93)\n{SLOW_LINES}");
    exec_ws(&mut slow, &code, 0).await;
    // (It reads only the exec_received that says the instruction is accepted.)
    let received = json!({"type": "exec_received", "seq": 0, "request_id": 0});
    assert_eq!(next_message(&mut slow).await, received);

    // The instruction runs to its end anyway.
    let result = server.result(&machine, 0).await;
    assert_eq!(result["value"], SLOW_LINES.to_string(), "{result}");
    let stalled = resident_bytes();

    // Everyone else is served: the same machine over HTTP and over another connection, and
    // another machine.
    let seq = server.exec(&machine, "6 * 7").await;
    assert_eq!(server.result(&machine, seq).await["value"], "42");
    let mut second = server.repl(&machine).await;
    let (seq, result) = run_ws(&mut second, "print('hi')\n'same machine'", 0).await;
    assert_eq!(seq, 2);
    assert_eq!(result["value"], "'same machine'");
    let mut elsewhere = server.repl(&other).await;
    assert_eq!(
        run_ws(&mut elsewhere, "2 ** 10", 0).await.1["value"],
        "1024"
    );
    let seq = server.exec(&other, "'http too'").await;
    assert_eq!(server.result(&other, seq).await["value"], "'http too'");

    // The slow client reads at last: every line in order, then the result.
    let (output, result) = collect_instruction(&mut slow, 0).await;
    assert_eq!(result["value"], SLOW_LINES.to_string());
    assert_eq!(output.len(), SLOW_LINES);
    for (i, line) in output.iter().enumerate() {
        assert_eq!(*line, slow_line(i));
    }
    // And the connection goes on.
    let (seq, result) = run_ws(&mut slow, "'still here'", 1).await;
    assert_eq!((seq, &result["value"]), (3, &json!("'still here'")));
    let after = resident_bytes();
    // Reported, not asserted: memory depends on the allocator, the kernel, and the tests running
    // alongside in this process.
    eprintln!(
        "test process (server, engine, clients) resident memory: {:.1} MB before, {:.1} MB with the slow client's \
         {} MB of output unread, {:.1} MB after it read everything",
        mb(before),
        mb(stalled),
        SLOW_LINES / 10_000,
        mb(after)
    );

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_idle_connections_to_one_machine() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let mut idle = Vec::with_capacity(IDLE_CONNECTIONS);
    for _ in 0..IDLE_CONNECTIONS {
        idle.push(server.repl(&machine).await);
    }

    // The machine answers over HTTP while they all wait.
    let seq = server.exec(&machine, "n = 0\nn").await;
    assert_eq!(server.result(&machine, seq).await["value"], "0");

    // Every one of them still works, in turn, on the same interpreter.
    for (i, ws) in idle.iter_mut().enumerate() {
        let (seq, result) = run_ws(ws, "n += 1\nn", 0).await;
        assert_eq!(seq, i as i64 + 1);
        assert_eq!(result["value"], (i + 1).to_string());
    }

    // Half go away with a close handshake, half just drop their sockets; the server goes on.
    for (i, mut ws) in idle.into_iter().enumerate() {
        if i % 2 == 0 {
            ws.close(None).await.unwrap();
        }
    }
    let seq = server.exec(&machine, "n").await;
    let result = server.result(&machine, seq).await;
    assert_eq!(result["value"], IDLE_CONNECTIONS.to_string());
    let mut ws = server.repl(&machine).await;
    assert_eq!(
        run_ws(&mut ws, "n * 2", 0).await.1["value"],
        (2 * IDLE_CONNECTIONS).to_string()
    );
    let info = server.info(&machine).await;
    assert_eq!(info["has_pending_instruction"], false, "{info}");

    server.stop().await;
}
