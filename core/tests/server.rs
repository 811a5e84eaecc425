//! The server over real HTTP and WebSocket connections, with a real engine on the `process`
//! backend.

#![cfg(feature = "server")]
// Test code: a failed step should stop the test at once, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "server/audit.rs"]
mod audit;
#[path = "server/contexts.rs"]
mod contexts;
#[path = "server/files.rs"]
mod files;
#[path = "server/hostile.rs"]
mod hostile;

use std::time::Duration;

use evervm_engine::{BackendChoice, Engine, EngineConfig};
use futures::{SinkExt, StreamExt};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// How long any single wait in these tests may take before the test fails.
const WAIT: Duration = Duration::from_secs(30);

const GET: Method = Method::GET;
const POST: Method = Method::POST;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn engine_config(home: &tempfile::TempDir) -> EngineConfig {
    let mut config = EngineConfig::new(home.path());
    config.backend = BackendChoice::parse("process");
    config
}

/// A server on a loopback port with its own home, and tokens for `alice` and `bob`.
struct Server {
    base: String,
    ws_base: String,
    alice: String,
    bob: String,
    http: reqwest::Client,
    engine: Engine,
    _home: tempfile::TempDir,
}

impl Server {
    async fn start() -> Self {
        let home = tempfile::tempdir().unwrap();
        let engine = Engine::open(engine_config(&home)).await.unwrap();
        let alice = engine.create_token("alice").await.unwrap();
        let bob = engine.create_token("bob").await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = evervm::server::router(engine.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base: format!("http://{address}"),
            ws_base: format!("ws://{address}"),
            alice,
            bob,
            http: reqwest::Client::builder().timeout(WAIT).build().unwrap(),
            engine,
            _home: home,
        }
    }

    async fn stop(self) {
        self.engine.shutdown().await;
    }

    /// A request without a token.
    fn anon(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// A request as `alice`.
    fn req(&self, method: Method, path: &str) -> RequestBuilder {
        self.anon(method, path).bearer_auth(&self.alice)
    }

    /// A request as `bob`.
    fn bob(&self, method: Method, path: &str) -> RequestBuilder {
        self.anon(method, path).bearer_auth(&self.bob)
    }

    async fn new_machine(&self, body: Value) -> String {
        let answer = ok(self.req(POST, "/v1/machine/new").json(&body)).await;
        answer["machine_name"].as_str().unwrap().to_owned()
    }

    async fn list(&self) -> Vec<String> {
        names(&ok(self.req(GET, "/v1/machine/list")).await)
    }

    async fn info(&self, machine: &str) -> Value {
        ok(self.req(GET, &format!("/v1/machine/{machine}"))).await
    }

    fn exec_request(&self, machine: &str, body: &Value) -> RequestBuilder {
        self.req(POST, &format!("/v1/machine/{machine}/exec"))
            .json(body)
    }

    async fn exec(&self, machine: &str, code: &str) -> i64 {
        let body = json!({"instruction": {"code": code}});
        let answer = ok(self.exec_request(machine, &body)).await;
        answer["instruction_seq"].as_i64().unwrap()
    }

    async fn result(&self, machine: &str, seq: i64) -> Value {
        let path = format!("/v1/machine/{machine}/exec/{seq}/result");
        let answer = ok(self.req(GET, &path)).await;
        assert_eq!(answer["instruction_id"], seq);
        answer["result"].clone()
    }

    /// Waits for the first output line of instruction `seq` (over stream-result): the instruction
    /// is running in the machine. An interrupt sent earlier, while the instruction is still on
    /// its way to the interpreter, can be lost by the engine (reported as an engine issue).
    async fn started_running(&self, machine: &str, seq: i64) {
        let path = format!("/v1/machine/{machine}/exec/{seq}/stream-result");
        let response = self.req(GET, &path).send().await.unwrap();
        let mut body = response.bytes_stream();
        let mut bytes = Vec::new();
        while !bytes.contains(&b'\n') {
            let chunk = tokio::time::timeout(WAIT, body.next()).await.unwrap();
            bytes.extend_from_slice(&chunk.unwrap().unwrap());
        }
        let line: Value =
            serde_json::from_slice(&bytes[..bytes.iter().position(|b| *b == b'\n').unwrap()])
                .unwrap();
        assert_eq!(line["type"], "output", "{line}");
    }

    /// Upgrade to `path`, giving `token` in the `Authorization` header.
    async fn ws(&self, path: &str, token: Option<&str>) -> Result<Ws, Box<dyn std::error::Error>> {
        let mut request = format!("{}{path}", self.ws_base).into_client_request()?;
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse()?;
            request.headers_mut().insert("authorization", value);
        }
        let connecting = tokio_tungstenite::connect_async(request);
        let (socket, _) = tokio::time::timeout(WAIT, connecting).await??;
        Ok(socket)
    }
}

/// Sends a request; the status and the body as JSON (every answer of the API is JSON).
async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status}: body is not JSON ({e}): {text:?}"));
    (status, body)
}

/// Sends a request that must succeed; its body.
async fn ok(request: RequestBuilder) -> Value {
    let (status, body) = send(request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// Sends a request that must fail with `status` and `code`, `id: null` and a message; the
/// message.
async fn fails(request: RequestBuilder, status: StatusCode, code: &str) -> String {
    let (got, body) = send(request).await;
    assert_eq!((got, body["code"].as_str()), (status, Some(code)), "{body}");
    assert!(body["id"].is_null(), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(!message.is_empty(), "{body}");
    message.to_owned()
}

fn names(list: &Value) -> Vec<String> {
    let machines = list["machines"].as_array().unwrap();
    machines
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn next_message(ws: &mut Ws) -> Value {
    let frame = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    match frame.unwrap().unwrap() {
        Message::Text(text) => serde_json::from_str(&text).unwrap(),
        other => panic!("the server sent a frame other than text: {other:?}"),
    }
}

/// Asserts that the server closes the connection next.
async fn closes(ws: &mut Ws) {
    let next = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    let closing = matches!(next, None | Some(Ok(Message::Close(_)) | Err(_)));
    assert!(closing, "{next:?}");
}

async fn send_ws(ws: &mut Ws, message: &Value) {
    let text = message.to_string();
    ws.send(Message::Text(text.into())).await.unwrap();
}

async fn exec_ws(ws: &mut Ws, code: &str, request_id: u32) {
    let exec = json!({"type": "exec", "instruction": {"code": code}, "request_id": request_id});
    send_ws(ws, &exec).await;
}

/// Reads messages until the result of instruction `seq`; the outputs' data and the result.
async fn collect_instruction(ws: &mut Ws, seq: i64) -> (Vec<String>, Value) {
    let mut output = Vec::new();
    loop {
        let message = next_message(ws).await;
        assert_eq!(message["instruction_id"], seq, "{message}");
        match message["type"].as_str().unwrap() {
            "output" => {
                let chunk = message["chunk"].as_object().unwrap();
                assert_eq!(chunk.len(), 3, "{message}");
                assert_eq!(chunk["seq"], output.len() as i64, "{message}");
                output.push(chunk["data"].as_str().unwrap().to_owned());
            }
            "result" => return (output, message["result"].clone()),
            other => panic!("unexpected {other}: {message}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_routes_auth_and_unknown_routes() {
    let server = Server::start().await;

    let whoami = ok(server.req(GET, "/v1/whoami")).await;
    assert_eq!(whoami, json!({"account": "alice"}));
    // A doubled leading slash, as the Python and JS SDKs send for a base URL ending in '/'.
    assert_eq!(ok(server.req(GET, "//v1/whoami")).await["account"], "alice");
    assert_eq!(ok(server.bob(GET, "/v1/whoami")).await["account"], "bob");
    // The ForeverVM headers are accepted and ignored.
    let tagged_request = server
        .req(GET, "/v1/whoami")
        .header("x-forevervm-sdk", "rust")
        .header("x-forevervm-runner", "npx");
    ok(tagged_request).await;

    let unauthorized = StatusCode::UNAUTHORIZED;
    fails(server.anon(GET, "/v1/whoami"), unauthorized, "Unauthorized").await;
    for bad in ["nodot", "abc.def", ""] {
        let request = server
            .anon(GET, "/v1/whoami")
            .header("authorization", format!("Bearer {bad}"));
        fails(request, unauthorized, "Unauthorized").await;
    }
    let wrong_secret = format!("{}.wrong", server.alice.split_once('.').unwrap().0);
    let request = server
        .anon(GET, "/v1/machine/list")
        .bearer_auth(wrong_secret);
    fails(request, unauthorized, "Unauthorized").await;
    let request = server
        .anon(POST, "/v1/machine/new")
        .basic_auth("alice", Some("x"));
    fails(request, unauthorized, "Unauthorized").await;

    // A refused request with a body (left unread) closes its connection, and says so; one
    // without a body keeps it.
    let refused = server
        .anon(POST, "/v1/machine/new")
        .json(&json!({"tags": {"a": "b"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), unauthorized);
    assert_eq!(refused.headers()["connection"], "close");
    let refused = server.anon(GET, "/v1/whoami").send().await.unwrap();
    assert_eq!(refused.status(), unauthorized);
    assert!(refused.headers().get("connection").is_none());

    let not_found = StatusCode::NOT_FOUND;
    fails(server.req(GET, "/v1/nothing-here"), not_found, "NotFound").await;
    fails(server.anon(GET, "/nothing"), not_found, "NotFound").await;
    let put = server.req(Method::PUT, "/v1/whoami");
    fails(put, StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed").await;

    let health = ok(server.anon(GET, "/healthz")).await;
    assert_eq!(
        health,
        json!({"status": "ok", "backend": "process", "backend_version": "process"})
    );

    let signup = server
        .anon(POST, "/internal/signup")
        .json(&json!({"email": "a@b.c", "account_name": "carol"}));
    fails(signup, StatusCode::NOT_IMPLEMENTED, "Unsupported").await;

    let response = server.anon(GET, "/openapi.json").send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert_eq!(content_type, "application/json");
    let document: Value = response.json().await.unwrap();
    assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
    let described = document["paths"].as_object().unwrap();
    for path in [
        "/healthz",
        "/openapi.json",
        "/internal/signup",
        "/v1/whoami",
        "/v1/machine/new",
        "/v1/machine/list",
        "/v1/machine/{machine_name}",
        "/v1/machine/{machine_name}/interrupt",
        "/v1/machine/{machine_name}/exec",
        "/v1/machine/{machine_name}/exec/{instruction_seq}/result",
        "/v1/machine/{machine_name}/exec/{instruction_seq}/stream-result",
        "/v1/machine/{machine_name}/repl",
    ] {
        assert!(described.contains_key(path), "{path} not in openapi.json");
    }
    assert!(document["components"]["schemas"]["Error"].is_object());

    server.stop().await;
}

/// The router and `openapi.json` agree on the methods of every path: a documented method is
/// routed (any answer but 405), any other answers 405. (The unit tests of `openapi.rs` check the
/// paths themselves and the bodies.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_methods_are_the_routers() {
    let server = Server::start().await;
    let document = ok(server.anon(GET, "/openapi.json")).await;
    let described = document["paths"].as_object().unwrap();
    let methods = [GET, POST, Method::PUT, Method::PATCH, Method::DELETE];
    for (path, item) in described {
        // Any value for a path parameter: the method is routed before parameters are read.
        let concrete = path
            .split('/')
            .map(|part| if part.starts_with('{') { "0" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        for method in &methods {
            let documented = item.get(method.as_str().to_lowercase()).is_some();
            let status = server
                .anon(method.clone(), &concrete)
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(
                status != StatusCode::METHOD_NOT_ALLOWED,
                documented,
                "{method} {path}: {status}"
            );
        }
    }
    server.stop().await;
}

/// Hostile requests the fuzzer does not make, each answered with a status `openapi.json`
/// documents for the operation: no token (401), a path parameter that is not UTF-8 (400), a body
/// over the limit (413).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_documents_the_answers_to_hostile_requests() {
    let server = Server::start().await;
    let document = ok(server.anon(GET, "/openapi.json")).await;
    let too_large = "x".repeat(2 * 1024 * 1024 + 1);
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let methods = ["get", "put", "post", "delete", "patch"];
            let Some(method) = methods
                .contains(&method.as_str())
                .then(|| Method::from_bytes(method.to_uppercase().as_bytes()).unwrap())
            else {
                continue;
            };
            let documented = |status: StatusCode| {
                let found = operation["responses"].get(status.as_str()).is_some();
                assert!(found, "{method} {path}: {status} is not documented");
            };
            let mut probes = Vec::new();
            let concrete = path.replace("{instruction_seq}", "0");
            let concrete = concrete
                .split('/')
                .map(|part| if part.starts_with('{') { "m" } else { part })
                .collect::<Vec<_>>()
                .join("/");
            if operation["security"] != json!([]) {
                probes.push((
                    server.anon(method.clone(), &concrete),
                    StatusCode::UNAUTHORIZED,
                ));
            }
            if path.contains('{') {
                let invalid = path
                    .split('/')
                    .map(|part| if part.starts_with('{') { "%FF" } else { part })
                    .collect::<Vec<_>>()
                    .join("/");
                probes.push((
                    server.req(method.clone(), &invalid),
                    StatusCode::BAD_REQUEST,
                ));
            }
            // JSON bodies have the body limit (a file's bytes have the file limit, tested in
            // `files.rs`).
            let json_body = operation["requestBody"]["content"]
                .get("application/json")
                .is_some();
            if json_body && path != "/internal/signup" {
                let request = server
                    .req(method.clone(), &concrete)
                    .body(too_large.clone());
                probes.push((request, StatusCode::PAYLOAD_TOO_LARGE));
            }
            for (request, expected) in probes {
                let (status, body) = send(request).await;
                assert_eq!(status, expected, "{method} {path}: {body}");
                documented(status);
            }
        }
    }
    server.stop().await;
}

/// Bodies schemathesis found mishandled (`tests/api/`), each as it is answered now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_found_by_the_api_fuzzer() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let bad = StatusCode::BAD_REQUEST;

    // serde reads a struct from an array of its fields: `[null, null]` made a machine.
    let bodies = ["[null, null]", "[]", "[{}]", "5", "\"{}\"", "true"];
    let optional_body_routes = [
        "/v1/machine/new".to_owned(),
        "/v1/machine/list".to_owned(),
        format!("/v1/machine/{machine}/fork"),
        format!("/v1/machine/{machine}/checkpoints"),
        format!("/v1/machine/{machine}/exec"),
    ];
    for path in &optional_body_routes {
        for body in bodies {
            let request = server.req(POST, path).body(body);
            let message = fails(request, bad, "BadRequest").await;
            assert!(message.contains("JSON object"), "{path} {body}: {message}");
        }
    }
    assert_eq!(server.list().await, std::slice::from_ref(&machine));

    // JSON Schema counts 512.0 as an integer, so the server does too; a fraction is refused.
    let answer = ok(server
        .req(POST, "/v1/machine/new")
        .body(r#"{"memory_mb": 1024.0}"#))
    .await;
    let name = answer["machine_name"].as_str().unwrap();
    assert_eq!(server.info(name).await["memory_mb"], 1024);
    let fraction = server
        .req(POST, "/v1/machine/new")
        .body(r#"{"memory_mb": 366.5}"#);
    fails(fraction, bad, "BadRequest").await;
    let whole = json!({"instruction": {"code": "6 * 7", "timeout_seconds": 7.0}});
    let seq = ok(server.exec_request(&machine, &whole)).await["instruction_seq"]
        .as_i64()
        .unwrap();
    assert_eq!(server.result(&machine, seq).await["value"], "42");
    let fraction = json!({"instruction": {"code": "1", "timeout_seconds": 7.5}});
    fails(server.exec_request(&machine, &fraction), bad, "BadRequest").await;

    // The document now says what the engine refuses: NUL in code (400), code over 1 MiB (413).
    let nul = json!({"instruction": {"code": "1\u{0}"}});
    fails(server.exec_request(&machine, &nul), bad, "BadRequest").await;
    let large = json!({"instruction": {"code": "x".repeat(1024 * 1024 + 1)}});
    let too_large = StatusCode::PAYLOAD_TOO_LARGE;
    fails(
        server.exec_request(&machine, &large),
        too_large,
        "PayloadTooLarge",
    )
    .await;

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_create_list_info_delete() {
    let server = Server::start().await;
    assert!(server.list().await.is_empty());

    // `{}`, an empty body without Content-Type, and `null` are all accepted.
    let first = server.new_machine(json!({})).await;
    let answer = ok(server.req(POST, "/v1/machine/new")).await;
    let second = answer["machine_name"].as_str().unwrap().to_owned();
    let third = server.new_machine(Value::Null).await;
    let tags = json!({"tags": {"team": "red", "env": "test"}, "memory_mb": 256});
    let tagged = server.new_machine(tags).await;
    let other = server.new_machine(json!({"tags": {"team": "blue"}})).await;
    for name in [&first, &second, &third, &tagged, &other] {
        assert_eq!(name.len(), 16, "{name}");
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric()), "{name}");
    }

    // Newest first, over GET and POST (with and without a body).
    let all = [&other, &tagged, &third, &second, &first].map(String::clone);
    assert_eq!(server.list().await, all);
    assert_eq!(names(&ok(server.req(GET, "//v1/machine/list")).await), all);
    assert_eq!(names(&ok(server.req(POST, "/v1/machine/list")).await), all);
    let empty_filter = server.req(POST, "/v1/machine/list").json(&json!({}));
    assert_eq!(names(&ok(empty_filter).await), all);
    let filtered = async |tags: Value| {
        let request = server
            .req(POST, "/v1/machine/list")
            .json(&json!({"tags": tags}));
        ok(request).await
    };
    assert_eq!(
        names(&filtered(json!({"team": "red"})).await),
        [tagged.as_str()]
    );
    let both = json!({"team": "red", "env": "test"});
    assert_eq!(names(&filtered(both).await), [tagged.as_str()]);
    let mismatch = json!({"team": "red", "env": "prod"});
    assert!(names(&filtered(mismatch).await).is_empty());
    assert_eq!(
        names(&filtered(json!({"team": "blue"})).await),
        [other.as_str()]
    );

    // The list's objects, as the ForeverVM CLI reads them.
    let listed = &filtered(json!({"team": "red"})).await["machines"][0];
    let keys = [
        "name",
        "created_at",
        "running",
        "has_pending_instruction",
        "expires_at",
    ];
    for key in keys {
        assert!(listed.get(key).is_some(), "{key} missing: {listed}");
    }
    assert!(listed["expires_at"].is_null());
    assert_eq!(listed["tags"], json!({"team": "red", "env": "test"}));
    let list = ok(server.req(GET, "/v1/machine/list")).await;
    assert_eq!(list["machines"][4]["tags"], json!({}));

    // Info has every evervm field.
    let info = server.info(&tagged).await;
    assert_eq!(info["name"], tagged.as_str());
    assert_eq!(info["memory_mb"], 256);
    assert_eq!(info["backend"], "process");
    // A new machine takes a sandbox in the background: it is `stopped` until it has one.
    let resident = info["state"] == "resident";
    assert!(resident || info["state"] == "stopped", "{info}");
    assert_eq!(info["running"], resident);
    assert_eq!(info["has_pending_instruction"], false);
    assert_eq!(info["instruction_count"], 0);
    assert!(info["created_at"].as_str().unwrap().ends_with('Z'));

    // Bad requests: 400 JSON naming the problem, and nothing created.
    let bad_request = StatusCode::BAD_REQUEST;
    let create = |body: &str| server.req(POST, "/v1/machine/new").body(body.to_owned());
    let message = fails(
        create(r#"{"tags": {"bad key": "x"}}"#),
        bad_request,
        "BadRequest",
    )
    .await;
    assert!(message.contains("bad key"), "{message}");
    fails(create(r#"{"tags": "#), bad_request, "BadRequest").await;
    let message = fails(create(r#"{"memory_mb": -5}"#), bad_request, "BadRequest").await;
    assert!(message.contains("memory_mb"), "{message}");
    fails(create(r#"{"memory_mb": 1}"#), bad_request, "BadRequest").await;
    fails(create(r#""text""#), bad_request, "BadRequest").await;
    let bad_filter = server.req(POST, "/v1/machine/list").body("[1,2]");
    fails(bad_filter, bad_request, "BadRequest").await;
    assert_eq!(server.list().await, all);

    // Another account sees none of these machines.
    assert!(names(&ok(server.bob(GET, "/v1/machine/list")).await).is_empty());
    let base = format!("/v1/machine/{first}");
    for request in [
        server.bob(GET, &base),
        server.bob(Method::DELETE, &base),
        server.bob(POST, &format!("{base}/interrupt")),
        server
            .bob(POST, &format!("{base}/exec"))
            .json(&json!({"instruction": {"code": "1"}})),
        server.bob(GET, &format!("{base}/exec/0/result")),
        server.bob(GET, &format!("{base}/exec/0/stream-result")),
    ] {
        fails(request, StatusCode::NOT_FOUND, "MachineNotFound").await;
    }
    let unknown = server.req(GET, "/v1/machine/NoSuchMachine0000");
    fails(unknown, StatusCode::NOT_FOUND, "MachineNotFound").await;

    // Interrupt with nothing running, delete, and gone.
    let interrupted = ok(server.req(POST, &format!("{base}/interrupt"))).await;
    assert_eq!(interrupted, json!({"interrupted": false}));
    let deleted = ok(server.req(Method::DELETE, &base)).await;
    assert_eq!(deleted, json!({"deleted": true}));
    fails(
        server.req(GET, &base),
        StatusCode::NOT_FOUND,
        "MachineNotFound",
    )
    .await;
    assert_eq!(server.list().await, all[..4]);

    server.stop().await;
}

/// The lines of an NDJSON body, read as they come; checks that every line ends in `\n`.
async fn ndjson(response: reqwest::Response) -> Vec<Value> {
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert_eq!(content_type, "application/x-ndjson");
    let mut body = response.bytes_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.next()).await.unwrap() {
        bytes.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.ends_with('\n'), "{text:?}");
    text.split_terminator('\n')
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_result_and_stream_result() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let base = format!("/v1/machine/{machine}");

    // Exec answers at once, `interrupted` included.
    let body = json!({"instruction": {"code": "for i in range(5): print(i)"}});
    let answer = ok(server.exec_request(&machine, &body)).await;
    let expected = json!({"instruction_seq": 0, "machine": machine, "interrupted": false});
    assert_eq!(answer, expected);
    assert_eq!(server.result(&machine, 0).await["value"], Value::Null);

    // Stream-result: NDJSON, every line ending in '\n', five chunks then the result.
    let stream = server.req(GET, &format!("{base}/exec/0/stream-result"));
    let lines = ndjson(stream.send().await.unwrap()).await;
    assert_eq!(lines.len(), 6, "{lines:?}");
    for (i, line) in lines[..5].iter().enumerate() {
        let chunk = json!({"stream": "stdout", "data": i.to_string(), "seq": i});
        let output = json!({"type": "output", "chunk": chunk, "instruction_id": 0});
        assert_eq!(line, &output);
    }
    assert_eq!(lines[5]["type"], "result");
    assert_eq!(lines[5]["instruction_id"], 0);
    assert_eq!(lines[5]["result"]["value"], Value::Null);

    // Value, statement, and error forms.
    let seq = server.exec(&machine, "x = 20").await;
    assert_eq!(seq, 1);
    let result = server.result(&machine, seq).await;
    let result = result.as_object().unwrap();
    let keys: Vec<&str> = result.keys().map(String::as_str).collect();
    assert_eq!(keys, ["data", "runtime_ms", "value"], "{result:?}");
    assert!(result["value"].is_null() && result["data"].is_null());
    assert!(result["runtime_ms"].is_u64());

    let seq = server.exec(&machine, "print(123) or x + 1").await;
    assert_eq!(server.result(&machine, seq).await["value"], "21");
    let seq = server.exec(&machine, "'done'").await;
    assert_eq!(server.result(&machine, seq).await["value"], "'done'");

    let seq = server.exec(&machine, "1 / 0").await;
    let result = server.result(&machine, seq).await;
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("ZeroDivisionError: division by zero"),
        "{error}"
    );
    assert!(result.get("value").is_none(), "{result}");
    assert!(result.get("data").is_none(), "{result}");

    // The stream of a running instruction: live lines, output before the result.
    let code = "import time\nprint('a')\ntime.sleep(0.3)\nprint('b')\n7";
    let seq = server.exec(&machine, code).await;
    let stream = server.req(GET, &format!("{base}/exec/{seq}/stream-result"));
    let lines = ndjson(stream.send().await.unwrap()).await;
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["output", "output", "result"], "{lines:?}");
    assert_eq!(lines[2]["result"]["value"], "7");

    // Unknown instructions and bad seqs.
    let not_found = StatusCode::NOT_FOUND;
    let result = server.req(GET, &format!("{base}/exec/99/result"));
    fails(result, not_found, "InstructionNotFound").await;
    let stream = server.req(GET, &format!("{base}/exec/99/stream-result"));
    fails(stream, not_found, "InstructionNotFound").await;
    let bad_seq = server.req(GET, &format!("{base}/exec/abc/result"));
    fails(bad_seq, StatusCode::BAD_REQUEST, "BadRequest").await;

    // Bad execs change nothing.
    let count = server.info(&machine).await["instruction_count"].clone();
    assert_eq!(count, 6);
    let exec = |body: String| {
        let request = server.req(POST, &format!("{base}/exec"));
        request
            .header("content-type", "application/json")
            .body(body)
    };
    for body in [
        json!({"instruction": {"code": "1", "timeout_seconds": 0}}),
        json!({"instruction": {"code": "1", "timeout_seconds": -1}}),
        json!({"instruction": {}}),
        json!({"code": "1"}),
        json!({"instruction": {"code": "1\u{0}"}}),
    ] {
        fails(
            exec(body.to_string()),
            StatusCode::BAD_REQUEST,
            "BadRequest",
        )
        .await;
    }
    let wrong_type = exec(r#"{"instruction": {"code": 5}}"#.to_owned());
    let message = fails(wrong_type, StatusCode::BAD_REQUEST, "BadRequest").await;
    assert!(message.contains("instruction.code"), "{message}");
    fails(exec(String::new()), StatusCode::BAD_REQUEST, "BadRequest").await;
    fails(
        exec("not json".to_owned()),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;

    // Code over the engine's 1 MiB limit, then a body over the 2 MiB body limit.
    let too_large = StatusCode::PAYLOAD_TOO_LARGE;
    for size in [1024 * 1024 + 10, 2 * 1024 * 1024 + 10] {
        let body = json!({"instruction": {"code": "#".repeat(size)}});
        fails(exec(body.to_string()), too_large, "PayloadTooLarge").await;
    }
    assert_eq!(server.info(&machine).await["instruction_count"], count);

    // A timeout keeps the machine's state.
    let code = "import time; time.sleep(5)";
    let body = json!({"instruction": {"code": code, "timeout_seconds": 1}});
    let seq = ok(server.exec_request(&machine, &body)).await["instruction_seq"].clone();
    let result = server.result(&machine, seq.as_i64().unwrap()).await;
    let error = result["error"].as_str().unwrap();
    assert!(error.contains("Timed out"), "{error}");
    let seq = server.exec(&machine, "x").await;
    assert_eq!(server.result(&machine, seq).await["value"], "20");

    // Interrupt stops a running instruction and keeps the machine's state. (Each waits until
    // its instruction prints, so that it really runs: see `started_running`.)
    let started = tokio::time::Instant::now();
    let sleeper = "import time\nprint('sleeping')\ntime.sleep(20)";
    let seq = server.exec(&machine, sleeper).await;
    server.started_running(&machine, seq).await;
    let interrupted = ok(server.req(POST, &format!("{base}/interrupt"))).await;
    assert_eq!(interrupted, json!({"interrupted": true}));
    let result = server.result(&machine, seq).await;
    assert_eq!(result["cause"], "interrupted", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .contains("KeyboardInterrupt"),
        "{result}"
    );

    // So does an exec with `interrupt: true`.
    let seq = server.exec(&machine, sleeper).await;
    server.started_running(&machine, seq).await;
    let body = json!({"instruction": {"code": "x * 2"}, "interrupt": true});
    let answer = ok(server.exec_request(&machine, &body)).await;
    assert_eq!(answer["interrupted"], true);
    assert_eq!(answer["instruction_seq"], seq + 1);
    assert_eq!(server.result(&machine, seq).await["cause"], "interrupted");
    assert_eq!(server.result(&machine, seq + 1).await["value"], "40");
    assert!(started.elapsed() < Duration::from_secs(15));

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_repl() {
    let server = Server::start().await;
    let alice = Some(server.alice.as_str());

    // `new`: connected first, then for each exec: exec_received, outputs, result.
    let mut ws = server.ws("/v1/machine/new/repl", alice).await.unwrap();
    let connected = next_message(&mut ws).await;
    assert_eq!(connected["type"], "connected", "{connected}");
    let machine = connected["machine_name"].as_str().unwrap().to_owned();
    assert_eq!(server.list().await, [machine.as_str()]);

    exec_ws(&mut ws, "for i in range(5): print(i)", 0).await;
    let received = json!({"type": "exec_received", "seq": 0, "request_id": 0});
    assert_eq!(next_message(&mut ws).await, received);
    let (output, result) = collect_instruction(&mut ws, 0).await;
    assert_eq!(output, ["0", "1", "2", "3", "4"]);
    assert_eq!(result["value"], Value::Null);

    // An unreadable message gets an error, and the connection goes on.
    let bad_request = json!({"type": "error", "code": "BadRequest", "id": null});
    ws.send(Message::Text("{not json".into())).await.unwrap();
    assert_eq!(next_message(&mut ws).await, bad_request);
    send_ws(&mut ws, &json!({"type": "nonsense"})).await;
    assert_eq!(next_message(&mut ws).await, bad_request);

    // Pings are answered; the connection goes on.
    ws.send(Message::Ping("hi".into())).await.unwrap();
    let pong = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    assert!(
        matches!(&pong, Some(Ok(Message::Pong(p))) if &p[..] == b"hi"),
        "{pong:?}"
    );

    // Two execs back to back: both queued in order, each streamed in order, each
    // `exec_received` before its instruction's messages.
    exec_ws(
        &mut ws,
        "import time\nprint('a')\ntime.sleep(0.2)\nprint('b')\ny = 5",
        1,
    )
    .await;
    exec_ws(&mut ws, "print(y)\ny * 2", 2).await;
    let mut messages = Vec::new();
    while messages
        .iter()
        .filter(|m: &&Value| m["type"] == "result")
        .count()
        < 2
    {
        messages.push(next_message(&mut ws).await);
    }
    let summary: Vec<String> = messages
        .iter()
        .map(|m| match m["type"].as_str().unwrap() {
            "exec_received" => format!("received {} {}", m["seq"], m["request_id"]),
            "output" => format!("output {} {}", m["instruction_id"], m["chunk"]["data"]),
            "result" => format!("result {} {}", m["instruction_id"], m["result"]["value"]),
            other => panic!("unexpected {other}: {m}"),
        })
        .collect();
    let position = |line: &str| summary.iter().position(|s| s == line).unwrap();
    assert!(
        position("received 1 1") < position("received 2 2"),
        "{summary:?}"
    );
    assert!(
        position("received 2 2") < position("output 2 \"5\""),
        "{summary:?}"
    );
    let stream: Vec<&String> = summary
        .iter()
        .filter(|s| !s.starts_with("received"))
        .collect();
    let expected = [
        "output 1 \"a\"",
        "output 1 \"b\"",
        "result 1 null",
        "output 2 \"5\"",
        "result 2 \"10\"",
    ];
    assert_eq!(stream, expected, "{summary:?}");

    // Errors are in the error form.
    exec_ws(&mut ws, "1/0", 3).await;
    assert_eq!(next_message(&mut ws).await["type"], "exec_received");
    let (_, result) = collect_instruction(&mut ws, 3).await;
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError")
    );
    assert!(result.get("value").is_none());
    ws.close(None).await.unwrap();

    // The same machine from another connection, with the token in the query: same state, seqs
    // shared with HTTP.
    assert_eq!(server.exec(&machine, "y + 1").await, 4);
    let path = format!("/v1/machine/{machine}/repl?_forevervm_jwt={}", server.alice);
    let mut ws = server.ws(&path, None).await.unwrap();
    let connected = json!({"type": "connected", "machine_name": machine});
    assert_eq!(next_message(&mut ws).await, connected);
    exec_ws(&mut ws, "y", 0).await;
    let received = json!({"type": "exec_received", "seq": 5, "request_id": 0});
    assert_eq!(next_message(&mut ws).await, received);
    let (output, result) = collect_instruction(&mut ws, 5).await;
    assert!(output.is_empty());
    assert_eq!(result["value"], "5");

    // An exec the engine refuses: an error, then the server closes.
    let refused = json!({"type": "exec", "instruction": {"code": "1", "timeout_seconds": 0}, "request_id": 1});
    send_ws(&mut ws, &refused).await;
    assert_eq!(next_message(&mut ws).await, bad_request);
    closes(&mut ws).await;

    // A doubled leading slash works for the WebSocket too.
    let doubled = format!("//v1/machine/{machine}/repl");
    let mut ws = server.ws(&doubled, alice).await.unwrap();
    assert_eq!(next_message(&mut ws).await["type"], "connected");
    ws.close(None).await.unwrap();

    // Unknown machines and other accounts' machines: the upgrade, an error, then a close.
    let not_found = json!({"type": "error", "code": "MachineNotFound", "id": null});
    for (name, token) in [
        ("NoSuchMachine0000", &server.alice),
        (machine.as_str(), &server.bob),
    ] {
        let path = format!("/v1/machine/{name}/repl");
        let mut ws = server.ws(&path, Some(token.as_str())).await.unwrap();
        assert_eq!(next_message(&mut ws).await, not_found);
        closes(&mut ws).await;
    }

    // Without a token (or with a bad one) the upgrade is refused with 401.
    let path = format!("/v1/machine/{machine}/repl");
    for token in [None, Some("abc.def")] {
        let Err(error) = server.ws(&path, token).await else {
            panic!("expected a 401, got a WebSocket");
        };
        match error.downcast_ref::<tokio_tungstenite::tungstenite::Error>() {
            Some(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
            }
            _ => panic!("expected a 401, got {error:?}"),
        }
    }
    // A plain GET on the WebSocket route is a JSON error.
    let (status, body) = send(server.req(GET, &path)).await;
    assert!(status.is_client_error(), "{status}");
    assert_eq!(body["code"], "BadRequest", "{body}");

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stops_on_its_signal() {
    let home = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(&home)).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = format!("http://{}/healthz", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        let _ = stopped.await;
    };
    let serve = evervm::server::serve_with_shutdown(engine, listener, signal);
    let serving = tokio::spawn(serve);
    let answer: Value = reqwest::get(&health).await.unwrap().json().await.unwrap();
    assert_eq!(answer["status"], "ok");
    stop.send(()).unwrap();
    let result = tokio::time::timeout(WAIT, serving).await.unwrap().unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert!(reqwest::get(&health).await.is_err());
}

/// Lists in pages (GET and POST), an expiry time at creation, and how the interpreter began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_page_and_machines_carry_their_expiry() {
    let server = Server::start().await;
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(server.new_machine(json!({"tags": {"batch": "p"}})).await);
    }
    made.reverse();
    let first = ok(server.req(GET, "/v1/machine/list?limit=2")).await;
    assert_eq!(names(&first), made[..2]);
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let second = ok(server.req(GET, &format!("/v1/machine/list?limit=2&cursor={cursor}"))).await;
    assert_eq!(names(&second), made[2..4]);
    let body = json!({"tags": {"batch": "p"}, "limit": 2, "cursor": second["next_cursor"]});
    let last = ok(server.req(POST, "/v1/machine/list").json(&body)).await;
    assert_eq!(names(&last), made[4..]);
    assert!(last.get("next_cursor").is_none(), "{last}");
    // Without a limit, the ForeverVM answer as it was: every machine, no cursor.
    let all = ok(server.req(GET, "/v1/machine/list")).await;
    assert_eq!(names(&all), made);
    assert!(all.get("next_cursor").is_none());
    fails(
        server.req(GET, "/v1/machine/list?limit=2&cursor=bogus"),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;
    fails(
        server.req(GET, "/v1/machine/list?limit=0"),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;

    let brief = server.new_machine(json!({"ttl_seconds": 3600})).await;
    let info = server.info(&brief).await;
    let expires: chrono::DateTime<chrono::Utc> =
        info["expires_at"].as_str().unwrap().parse().unwrap();
    let left = expires - chrono::Utc::now();
    assert!((3590..=3600).contains(&left.num_seconds()), "{info}");
    fails(
        server
            .req(POST, "/v1/machine/new")
            .json(&json!({"ttl_seconds": 0})),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;
    let seq = server.exec(&brief, "1").await;
    server.result(&brief, seq).await;
    let info = server.info(&brief).await;
    assert_eq!(info["interpreter"]["began"], "booted", "{info}");
    assert!(info["interpreter"]["snapshot_at"].is_null(), "{info}");
    server.stop().await;
}

/// `/metrics` behind its own token: refused without it (an account's token is not it), served
/// with it, counting what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_behind_their_own_token() {
    let home = tempfile::tempdir().unwrap();
    let engine = Engine::open(engine_config(&home)).await.unwrap();
    let token = engine.create_token("alice").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = evervm::server::router_with_metrics_token(engine.clone(), Some("m-secret".into()));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    let client = evervm::Client::remote(&base, &token).unwrap();
    let machine = client
        .create_machine(evervm::CreateMachineOptions::default())
        .await
        .unwrap();
    machine.exec("1 + 1").await.unwrap();
    machine.exec("1 / 0").await.unwrap();
    for bearer in [None, Some(token.as_str()), Some("m-secre")] {
        let mut request = http.get(format!("{base}/metrics"));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "{bearer:?}");
    }
    let answer = http
        .get(format!("{base}/metrics"))
        .bearer_auth("m-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(
        answer.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = answer.text().await.unwrap();
    for line in [
        "evervm_instructions_total{outcome=\"value\"} 1",
        "evervm_instructions_total{outcome=\"exception\"} 1",
        "evervm_account_instructions_total{account=\"alice\"} 2",
        "evervm_account_machines{account=\"alice\"} 1",
        "evervm_instruction_duration_seconds_count 2",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} is missing:\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    engine.shutdown().await;
}

/// `display()` and rich values: ForeverVM's clients see exactly what they always did (text lines
/// numbered 0, 1, ..., no `display` message, no `results`); a client that asks with `rich=true`
/// gets the rich results in order with the text, over HTTP and the WebSocket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rich_results_reach_only_clients_that_ask() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let base = format!("/v1/machine/{machine}");
    let code = "class Table:\n    def _repr_html_(self): return '<table></table>'\n\
                print('a')\ndisplay(Table())\nprint('b')\nTable()";
    let seq = server.exec(&machine, code).await;

    let plain = server.req(GET, &format!("{base}/exec/{seq}/stream-result"));
    let lines = ndjson(plain.send().await.unwrap()).await;
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["output", "output", "result"], "{lines:?}");
    assert_eq!(
        lines[1]["chunk"],
        json!({"stream": "stdout", "data": "b", "seq": 1})
    );
    assert!(lines[2]["result"].get("results").is_none(), "{}", lines[2]);
    assert!(server.result(&machine, seq).await.get("results").is_none());

    let rich = server.req(GET, &format!("{base}/exec/{seq}/stream-result?rich=true"));
    let lines = ndjson(rich.send().await.unwrap()).await;
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["output", "display", "output", "result"],
        "{lines:?}"
    );
    assert_eq!(lines[1]["seq"], 1);
    assert_eq!(lines[1]["result"]["kind"], "display");
    assert_eq!(lines[1]["result"]["data"]["text/html"], "<table></table>");
    assert_eq!(lines[2]["chunk"]["seq"], 2);
    let results = &lines[3]["result"]["results"];
    assert_eq!(results[0], lines[1]["result"]);
    assert_eq!(results[1]["kind"], "value");
    assert_eq!(results[1]["data"]["text/html"], "<table></table>");
    assert!(
        results[1]["data"]["text/plain"]
            .as_str()
            .unwrap()
            .contains("Table object")
    );
    let path = format!("{base}/exec/{seq}/result?rich=true");
    assert_eq!(
        &ok(server.req(GET, &path)).await["result"]["results"],
        results
    );

    let alice = Some(server.alice.as_str());
    let mut ws = server
        .ws(&format!("{base}/repl?rich=true"), alice)
        .await
        .unwrap();
    assert_eq!(next_message(&mut ws).await["type"], "connected");
    exec_ws(&mut ws, "display(Table())\nprint('c')", 0).await;
    assert_eq!(next_message(&mut ws).await["type"], "exec_received");
    let display = next_message(&mut ws).await;
    assert_eq!(display["type"], "display", "{display}");
    assert_eq!(display["result"]["data"]["text/html"], "<table></table>");
    let output = next_message(&mut ws).await;
    assert_eq!(output["chunk"]["data"], "c", "{output}");
    let result = next_message(&mut ws).await;
    assert_eq!(
        result["result"]["results"][0], display["result"],
        "{result}"
    );

    server.stop().await;
}
