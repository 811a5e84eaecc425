//! Files over HTTP: raw bodies both ways, listings, the limits and errors a caller sees, and the
//! Rust client's file verbs against the server.

use super::*;

impl Server {
    /// Sends `head` (a request without its body, which asks to close the connection) on a new
    /// connection; the whole answer, as text.
    async fn raw_request(&self, head: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let address = self.base.trim_start_matches("http://");
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        socket.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(WAIT, socket.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// Runs `code` and returns its value's repr (failing the test on an error).
    async fn exec_value(&self, machine: &str, code: &str) -> String {
        let seq = self.exec(machine, code).await;
        let result = self.result(machine, seq).await;
        assert!(result["error"].is_null(), "{code}: {result}");
        result["value"].as_str().unwrap_or_default().to_owned()
    }
}

const PUT: Method = Method::PUT;
const DELETE: Method = Method::DELETE;
const HEAD: Method = Method::HEAD;

#[tokio::test(flavor = "multi_thread")]
async fn files_go_in_and_out_over_http() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let files = format!("/v1/machine/{machine}/files");

    // 8 MiB streamed in, read back byte for byte, with headers that describe it.
    let data: Vec<u8> = (0..8 * 1024 * 1024u32)
        .map(|i| (i * 7 % 256) as u8)
        .collect();
    let written = ok(server
        .req(PUT, &format!("{files}/~/in/data.bin?parents=true&mode=600"))
        .body(data.clone()))
    .await;
    assert_eq!(written["type"], "file");
    assert_eq!(written["size"], data.len());
    assert_eq!(written["mode"], 0o600);
    assert_eq!(written["name"], "data.bin");
    let home_file = written["path"].as_str().unwrap().to_owned();
    assert!(home_file.ends_with("/in/data.bin"), "{home_file}");

    let response = server
        .req(GET, &format!("{files}/~/in/data.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-length"], data.len().to_string().as_str());
    assert_eq!(headers["x-evervm-mode"], "600");
    assert!(headers.contains_key("last-modified"));
    assert_eq!(response.bytes().await.unwrap().as_ref(), data.as_slice());

    // The same file by its absolute path, HEAD and stat.
    let absolute = format!("{files}{home_file}");
    let head = server.req(HEAD, &absolute).send().await.unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    assert_eq!(
        head.headers()["content-length"],
        data.len().to_string().as_str()
    );
    let stat = ok(server.req(GET, &format!("{absolute}?stat=true"))).await;
    assert_eq!(
        (stat["type"].as_str(), stat["size"].as_u64()),
        (Some("file"), Some(data.len() as u64))
    );

    // The machine sees it, and what it writes can be listed and read.
    let seen = server
        .exec_value(&machine, "len(open('in/data.bin', 'rb').read())")
        .await;
    assert_eq!(seen, data.len().to_string());
    server
        .exec_value(&machine, "open('in/r.csv', 'w').write('a,b\\n1,2\\n')")
        .await;
    let listing = ok(server.req(GET, &format!("{files}?dir=~/in"))).await;
    let entries: Vec<(&str, u64)> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(entries, [("data.bin", data.len() as u64), ("r.csv", 8)]);
    assert_eq!(listing["directory"]["type"], "directory");
    assert_eq!(listing["truncated"], false);
    let csv = server
        .req(GET, &format!("{files}/~/in/r.csv"))
        .send()
        .await
        .unwrap();
    assert_eq!(csv.text().await.unwrap(), "a,b\n1,2\n");

    // Directories and removal.
    let made = ok(server.req(POST, &format!("{files}/~/x/y?parents=true"))).await;
    assert_eq!(made["type"], "directory");
    fails(
        server.req(DELETE, &format!("{files}/~/x")),
        StatusCode::CONFLICT,
        "Conflict",
    )
    .await;
    let removed = ok(server.req(DELETE, &format!("{files}/~/x?recursive=true"))).await;
    assert_eq!(removed["type"], "directory");
    fails(
        server.req(GET, &format!("{files}/~/x?stat=true")),
        StatusCode::NOT_FOUND,
        "FileNotFound",
    )
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_errors_are_clear() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let files = format!("/v1/machine/{machine}/files");
    server
        .exec_value(&machine, "import os; os.symlink('/etc', 'etc')")
        .await;
    for path in ["etc/passwd", "etc/passwd?stat=true"] {
        let message = fails(
            server.req(GET, &format!("{files}/{path}")),
            StatusCode::FORBIDDEN,
            "PermissionDenied",
        )
        .await;
        assert!(message.contains("outside"), "{message}");
    }
    fails(
        server.req(GET, &format!("{files}?dir=/etc")),
        StatusCode::FORBIDDEN,
        "PermissionDenied",
    )
    .await;
    fails(
        server.req(PUT, &format!("{files}/~/a?mode=99")).body("x"),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;
    // Over the limit by its declared length: refused before anything is sent.
    let limit = server.engine.limits().max_file_bytes;
    let answer = server
        .raw_request(&format!(
            "PUT {files}/~/big HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
             connection: close\r\ncontent-length: {}\r\n\r\n",
            server.alice,
            limit + 1
        ))
        .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("PayloadTooLarge"), "{answer}");
    fails(
        server.req(GET, &format!("{files}/~/missing")),
        StatusCode::NOT_FOUND,
        "FileNotFound",
    )
    .await;
    fails(
        server.req(GET, &format!("{files}/~")),
        StatusCode::CONFLICT,
        "Conflict",
    )
    .await;
    // Another account's machine does not exist for bob.
    fails(
        server.bob(GET, &format!("{files}?dir=~")),
        StatusCode::NOT_FOUND,
        "MachineNotFound",
    )
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_moves_files_through_the_server() {
    let server = Server::start().await;
    let client = evervm::Client::remote(&server.base, &server.alice).unwrap();
    let machine = client
        .create_machine(evervm::CreateMachineOptions::default())
        .await
        .unwrap();
    let local = tempfile::tempdir().unwrap();
    let source = local.path().join("table.csv");
    let table = (0..50_000u64).fold(String::new(), |mut table, i| {
        use std::fmt::Write;
        let _ = writeln!(table, "{i},{}", i * i);
        table
    });
    std::fs::write(&source, &table).unwrap();
    let uploaded = machine
        .upload(
            &source,
            "data/table.csv",
            evervm::WriteFileOptions {
                make_parents: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(uploaded.size, table.len() as u64);
    let target = local.path().join("back.csv");
    let downloaded = machine.download("~/data/table.csv", &target).await.unwrap();
    assert_eq!(downloaded.size, table.len() as u64);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), table);
    assert_eq!(
        machine.read_file("./data/../data/table.csv").await.unwrap(),
        table.as_bytes()
    );
    machine.write_file("note.txt", "hello").await.unwrap();
    let list = machine.list_files("~").await.unwrap();
    let names: Vec<&str> = list.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["data", "note.txt"]);
    let escape = machine.read_file("../x").await.unwrap_err();
    assert_eq!(
        escape.kind(),
        evervm::ErrorKind::PermissionDenied,
        "{escape}"
    );
    let missing = machine.stat_file("nothing").await.unwrap_err();
    assert_eq!(missing.kind(), evervm::ErrorKind::NotFound, "{missing}");
    server.stop().await;
}
