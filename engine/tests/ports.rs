//! Connections to ports inside a machine (the tunnels behind E2B's `get_host`), on the process
//! backend (the E2B SDK's tests cover them in a gVisor sandbox, across a swap): bytes both ways
//! intact under back-pressure, a closed port, the limit on open connections and a dropped
//! connection freeing its place.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use evervm_engine::{Account, Engine, ErrorKind, Outcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn engine(dir: &tempfile::TempDir) -> (Engine, Account, String) {
    let engine = Engine::open(common::config(dir)).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = common::new_machine(&engine, &account).await;
    (engine, account, name)
}

/// Starts an echo server in the machine's interpreter and gives its port.
async fn echo_server(engine: &Engine, account: &Account, name: &str) -> u16 {
    // One thread, whatever the number of connections: a thread each would meet the
    // process backend's address-space limit (each thread's malloc arena reserves 64 MiB).
    let code = r#"
import selectors, socket, threading
def _serve(listener):
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    pending = {}
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                conn.setblocking(False)
                pending[conn] = b""
                sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(sock)
                pending.pop(sock, None)
                sock.close()
                continue
            sock.setblocking(True)
            sock.sendall(data)
            sock.setblocking(False)
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(128)
threading.Thread(target=_serve, args=(listener,), daemon=True).start()
listener.getsockname()[1]
"#;
    run(engine, account, name, code).await.parse().unwrap()
}

/// Runs `code` and gives its value.
async fn run(engine: &Engine, account: &Account, name: &str, code: &str) -> String {
    match common::run(engine, account, name, code).await.outcome {
        Outcome::Value(Some(v)) => v,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_go_both_ways_intact_through_a_slow_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir).await;
    let port = echo_server(&engine, &account, &name).await;
    let stream = engine.connect_port(&account, &name, port).await.unwrap();
    let (mut reader, mut writer) = tokio::io::split(stream);
    // 5 MiB, far beyond the window, written while the other end reads slowly.
    let sent: Vec<u8> = (0..5 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let expected = sent.clone();
    let writing = tokio::spawn(async move {
        writer.write_all(&sent).await.unwrap();
        writer.shutdown().await.unwrap();
        writer
    });
    let mut received = Vec::new();
    let mut buffer = vec![0u8; 4096];
    loop {
        let n = reader.read(&mut buffer).await.unwrap();
        if n == 0 {
            break;
        }
        received.extend_from_slice(&buffer[..n]);
        if received.len() < 256 * 1024 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    let _writer = writing.await.unwrap();
    assert_eq!(received.len(), expected.len());
    assert!(received == expected, "the echoed bytes differ");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_port_is_not_found_and_open_connections_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir).await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let error = engine
        .connect_port(&account, &name, closed)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");
    assert_eq!(error.resource(), Some("port"));
    let error = engine.connect_port(&account, &name, 0).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");

    let port = echo_server(&engine, &account, &name).await;
    let mut open = Vec::new();
    for _ in 0..64 {
        open.push(engine.connect_port(&account, &name, port).await.unwrap());
    }
    let error = engine
        .connect_port(&account, &name, port)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::LimitExceeded, "{error}");
    // A dropped connection frees its place (once the agent heard of it).
    drop(open.pop());
    let mut again = None;
    for _ in 0..50 {
        match engine.connect_port(&account, &name, port).await {
            Ok(stream) => {
                again = Some(stream);
                break;
            }
            Err(e) if e.kind() == ErrorKind::LimitExceeded => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let mut stream = again.expect("a dropped connection's place was never freed");
    stream.write_all(b"ping").await.unwrap();
    let mut answer = [0u8; 4];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"ping");
    // The interpreter still answers while connections are open.
    assert_eq!(run(&engine, &account, &name, "1 + 1").await, "2");
}
