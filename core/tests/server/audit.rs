//! The audit log over the API: an entry for every state-changing call of the API's list (REST,
//! WebSocket and MCP), with its account, token id, machine and outcome; none for a refused
//! token, which is counted instead; each account reads its own entries, the admin token all.

use sha2::{Digest, Sha256};

use super::*;

const ADMIN: &str = "admin-token-for-the-audit-test";

/// Alice's audit entries for `machine`, oldest first, as `(action, outcome, detail)`.
async fn entries_of(server: &Server, machine: &str) -> Vec<(String, String, Option<String>)> {
    let page = ok(server.req(GET, &format!("/v1/audit?machine={machine}&limit=1000"))).await;
    let mut entries: Vec<_> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["account"], "alice", "{e}");
            assert!(e["door"].is_string(), "{e}");
            (
                e["action"].as_str().unwrap().to_owned(),
                e["outcome"].as_str().unwrap().to_owned(),
                e["detail"].as_str().map(str::to_owned),
            )
        })
        .collect();
    entries.reverse();
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_changing_call_is_audited() {
    let home = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(&home)).await.unwrap();
    let alice = engine.create_token("alice").await.unwrap();
    let bob = engine.create_token("bob").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = evervm::server::router_with_tokens(engine.clone(), None, Some(ADMIN.into()));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let server = Server {
        base: format!("http://{address}"),
        ws_base: format!("ws://{address}"),
        alice: alice.clone(),
        bob,
        http: reqwest::Client::builder().timeout(WAIT).build().unwrap(),
        engine,
        _home: home,
    };
    let alice_id = alice.split_once('.').unwrap().0;

    let machine = server.new_machine(json!({"tags": {"team": "a"}})).await;
    let path = |rest: &str| format!("/v1/machine/{machine}{rest}");
    let seq = server.exec(&machine, "x = 41").await;
    server.result(&machine, seq).await;
    ok(server
        .req(Method::PUT, &path("/files/~/data.csv"))
        .body("a,b\n1,2\n"))
    .await;
    ok(server.req(POST, &path("/files/~/reports"))).await;
    ok(server.req(Method::DELETE, &path("/files/~/data.csv"))).await;
    let context = ok(server.req(POST, &path("/contexts")).json(&json!({}))).await;
    let context = context["id"].as_str().unwrap().to_owned();
    ok(server.req(POST, &path(&format!("/contexts/{context}/restart")))).await;
    ok(server.req(Method::DELETE, &path(&format!("/contexts/{context}")))).await;
    ok(server.req(POST, &path("/interrupt")).json(&json!({}))).await;
    // The process backend keeps no snapshots: these are refused, and recorded as refused.
    for (method, rest) in [
        (POST, "/swap"),
        (POST, "/checkpoints"),
        (POST, "/checkpoints/before/rollback"),
        (Method::DELETE, "/checkpoints/before"),
        (POST, "/rewind"),
        (POST, "/fork"),
    ] {
        let (status, body) = send(server.req(method, &path(rest)).json(&json!({}))).await;
        assert!(!status.is_success(), "{rest}: {body}");
    }
    let (status, _) = send(
        server
            .req(POST, &path("/install"))
            .json(&json!({"requirements": ["no such package!"]})),
    )
    .await;
    assert!(!status.is_success());
    // Over the WebSocket, each exec.
    let mut ws = server
        .ws(&path("/repl"), Some(&server.alice))
        .await
        .unwrap();
    assert_eq!(next_message(&mut ws).await["type"], "connected");
    let exec = json!({"type": "exec", "instruction": {"code": "x + 1"}, "request_id": 0});
    ws.send(Message::text(exec.to_string())).await.unwrap();
    loop {
        if next_message(&mut ws).await["type"] == "result" {
            break;
        }
    }
    drop(ws);
    // Bob cannot touch alice's machine: his attempt is recorded as his, refused.
    let (status, _) = send(server.bob(Method::DELETE, &path(""))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A refused token leaves no entry, only a count.
    for bad in [format!("{alice_id}.wrong"), "nope.nope".to_owned()] {
        let (status, _) = send(server.anon(Method::DELETE, &path("")).bearer_auth(&bad)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    ok(server.req(Method::DELETE, &path(""))).await;

    let code_hash = |code: &str| {
        let digest = Sha256::digest(code);
        let hex = digest.iter().fold(String::new(), |mut hex, b| {
            use std::fmt::Write;
            let _ = write!(hex, "{b:02x}");
            hex
        });
        format!("sha256:{hex}")
    };
    let entries = entries_of(&server, &machine).await;
    let actions: Vec<&str> = entries.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "machine.create",
            "exec",
            "file.write",
            "file.mkdir",
            "file.remove",
            "context.create",
            "context.restart",
            "context.remove",
            "machine.interrupt",
            "machine.swap",
            "checkpoint.create",
            "checkpoint.rollback",
            "checkpoint.delete",
            "machine.rewind",
            "machine.fork",
            "packages.install",
            "exec",
            "machine.delete",
        ]
    );
    let find = |action: &str| entries.iter().find(|(a, _, _)| a == action).unwrap();
    assert_eq!(
        find("exec").2.as_deref(),
        Some(code_hash("x = 41").as_str())
    );
    assert_eq!(entries[16].2.as_deref(), Some(code_hash("x + 1").as_str()));
    assert_eq!(find("file.write").2.as_deref(), Some("~/data.csv"));
    for (action, outcome, _) in &entries {
        let refused = matches!(
            action.as_str(),
            "machine.swap"
                | "checkpoint.create"
                | "checkpoint.rollback"
                | "checkpoint.delete"
                | "machine.rewind"
                | "machine.fork"
                | "packages.install"
        );
        assert_eq!(outcome != "ok", refused, "{action}: {outcome}");
    }
    // Every entry carries alice's token id, never the token.
    let raw = ok(server.req(GET, "/v1/audit?limit=1000")).await;
    let all = raw["entries"].as_array().unwrap();
    assert!(all.iter().all(|e| e["token_id"] == alice_id), "{raw}");
    assert!(
        !raw.to_string().contains(&alice),
        "a token's secret in the log"
    );
    let doors: std::collections::BTreeSet<&str> =
        all.iter().map(|e| e["door"].as_str().unwrap()).collect();
    assert_eq!(doors, ["api", "websocket"].into());

    // Alice reads only her own; asking for bob's is refused; the admin reads everyone's.
    fails(
        server.req(GET, "/v1/audit?account=bob"),
        StatusCode::FORBIDDEN,
        "PermissionDenied",
    )
    .await;
    let admin = ok(server.anon(GET, "/v1/audit?account=bob").bearer_auth(ADMIN)).await;
    let bobs = admin["entries"].as_array().unwrap();
    assert_eq!(bobs.len(), 1, "{admin}");
    assert_eq!(bobs[0]["action"], "machine.delete");
    assert_eq!(bobs[0]["outcome"], "404 Not Found");
    assert_eq!(bobs[0]["machine"], machine.as_str());
    fails(
        server
            .anon(GET, "/v1/audit")
            .bearer_auth("admin-token-for-the-audit-tes"),
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
    )
    .await;
    // Paging back by id, and filters.
    let first = ok(server.req(GET, "/v1/audit?limit=2")).await;
    let smallest = first["entries"][1]["id"].as_i64().unwrap();
    let next = ok(server.req(GET, &format!("/v1/audit?limit=2&before={smallest}"))).await;
    assert!(next["entries"][0]["id"].as_i64().unwrap() < smallest);
    let execs = ok(server.req(GET, "/v1/audit?action=exec&since=1h")).await;
    assert_eq!(execs["entries"].as_array().unwrap().len(), 2);
    fails(
        server.req(GET, "/v1/audit?limit=0"),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;
    fails(
        server.req(GET, "/v1/audit?since=yesterday"),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;

    // The refused tokens were counted: the two above and the wrong admin token.
    let metrics = server
        .anon(GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("evervm_refused_credentials_total 3"),
        "{metrics}"
    );
    server.stop().await;
}

/// A tool call over `/mcp` that changes state is recorded with the door `mcp`; one that reads
/// is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tool_calls_are_audited() {
    let server = Server::start().await;
    let call = |id: u32, name: &str, arguments: Value| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}});
        server
            .req(POST, "/mcp")
            .header("accept", "application/json, text/event-stream")
            .json(&body)
    };
    let created = call(1, "create-python-repl", json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::OK);
    let text = created.text().await.unwrap();
    let machine = server.list().await.pop().unwrap();
    assert!(text.contains(&machine), "{text}");
    let ran = call(
        2,
        "run-python-in-repl",
        json!({"replId": machine, "pythonCode": "6 * 7"}),
    )
    .send()
    .await
    .unwrap();
    let ran = ran.text().await.unwrap();
    assert!(ran.contains("42"), "{ran}");
    call(3, "list-python-repls", json!({}))
        .send()
        .await
        .unwrap();
    let page = ok(server.req(GET, "/v1/audit")).await;
    let entries: Vec<(&str, &str, &str)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["door"].as_str().unwrap(),
                e["action"].as_str().unwrap(),
                e["machine"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("mcp", "exec", machine.as_str()),
            ("mcp", "machine.create", machine.as_str())
        ]
    );
    server.stop().await;
}
