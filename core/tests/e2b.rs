//! The E2B-compatible listener over real HTTP, with a real engine on the `process` backend: what
//! callers who are not E2B's SDKs may send (no key, someone else's sandbox, broken envelopes).
//! The SDKs themselves drive it in `tests/e2b/` (gVisor).

#![cfg(feature = "server")]
// Test code: a failed step should stop the test at once, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use evervm::server::e2b::{ENVD_PORT, INTERPRETER_PORT, api_key_for_token};
use evervm_engine::{BackendChoice, Engine, EngineConfig};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

struct Server {
    base: String,
    alice: String,
    bob: String,
    http: reqwest::Client,
    engine: Engine,
    _home: tempfile::TempDir,
}

impl Server {
    async fn start() -> Self {
        Self::start_with(evervm::server::e2b::E2bOptions::default()).await
    }

    async fn start_with(options: evervm::server::e2b::E2bOptions) -> Self {
        let home = tempfile::tempdir().unwrap();
        let mut config = EngineConfig::new(home.path());
        config.backend = BackendChoice::parse("process");
        let engine = Engine::open(config).await.unwrap();
        let alice = api_key_for_token(&engine.create_token("alice").await.unwrap());
        let bob = api_key_for_token(&engine.create_token("bob").await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = evervm::server::e2b::router_with(engine.clone(), options);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base: format!("http://{address}"),
            alice,
            bob,
            http: reqwest::Client::builder().timeout(WAIT).build().unwrap(),
            engine,
            _home: home,
        }
    }

    fn api(&self, method: Method, path: &str, key: Option<&str>) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match key {
            Some(key) => request.header("X-API-Key", key),
            None => request,
        }
    }

    fn sandbox(&self, path: &str, id: &str, port: u16, key: &str) -> RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", port.to_string())
            .header("X-Access-Token", key)
    }
}

async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The frames of a whole Connect stream: (flags, JSON).
fn frames(body: &[u8]) -> Vec<(u8, Value)> {
    let (out, used) = frames_and_length(body);
    assert_eq!(used, body.len(), "a frame was cut: {body:?}");
    out
}

/// The whole frames at the start of what arrived so far.
fn frames_so_far(body: &[u8]) -> Vec<(u8, Value)> {
    frames_and_length(body).0
}

/// The whole frames at the start of `body`, and how many bytes they take.
fn frames_and_length(body: &[u8]) -> (Vec<(u8, Value)>, usize) {
    let mut out = Vec::new();
    let mut used = 0;
    while let Some(header) = body.get(used..used + 5) {
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let Some(message) = body.get(used + 5..used + 5 + length) else {
            break;
        };
        out.push((header[0], serde_json::from_slice(message).unwrap()));
        used += 5 + length;
    }
    (out, used)
}

fn envelope(message: &Value) -> Vec<u8> {
    let json = message.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(json.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&json);
    out
}

#[tokio::test]
async fn keys_tenants_and_hostile_requests() {
    let s = Server::start().await;

    // No key, a key that is not one, a key of no token: 401 with E2B's body.
    let (status, body) = send(s.api(Method::GET, "/v2/sandboxes", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("X-API-Key"),
        "{body}"
    );
    for bad in ["e2b_zz", "sk-123", "e2b_", &api_key_for_token("nope.nope")] {
        let (status, body) = send(s.api(Method::GET, "/v2/sandboxes", Some(bad))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}: {body}");
    }

    // Alice's sandbox.
    let (status, created) = send(
        s.api(Method::POST, "/v2/sandboxes", Some(&s.alice))
            .json(&json!({"templateID": "base", "metadata": {"who": "alice"}, "timeout": 60})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
        "{id}"
    );
    assert_eq!(created["templateID"], "base");
    // The sandbox's own access token, never the key; it opens this sandbox only.
    let access = created["envdAccessToken"].as_str().unwrap().to_owned();
    assert!(access.starts_with("e2bs_"), "{access}");
    assert!(!created.to_string().contains(s.alice.as_str()), "{created}");
    let (status, body) = send(
        s.sandbox("/execute", &id, INTERPRETER_PORT, &access)
            .json(&json!({"code": "6 * 7"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = send(s.api(Method::GET, "/v2/sandboxes", Some(&access))).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a sandbox's token is no API key"
    );

    // Bob sees none of it: not in his list, not by id, not through envd or the interpreter.
    let (_, listed) = send(s.api(Method::GET, "/v2/sandboxes", Some(&s.bob))).await;
    assert_eq!(listed, json!([]));
    let (status, body) = send(s.api(Method::GET, &format!("/sandboxes/{id}"), Some(&s.bob))).await;
    assert_eq!(
        (status, body["code"].clone()),
        (StatusCode::NOT_FOUND, json!(404))
    );
    let (status, _) = send(s.api(Method::DELETE, &format!("/sandboxes/{id}"), Some(&s.bob))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = send(
        s.sandbox("/execute", &id, INTERPRETER_PORT, &s.bob)
            .json(&json!({"code": "1+1"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body["message"].as_str().unwrap().contains("was not found"));
    let (status, body) = send(
        s.sandbox("/filesystem.Filesystem/Stat", &id, ENVD_PORT, &s.bob)
            .header("content-type", "application/json")
            .json(&json!({"path": "/tmp"})),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "unavailable");

    // The wrong port for a path, and no sandbox at all.
    let (status, _) = send(
        s.sandbox("/execute", &id, ENVD_PORT, &s.alice)
            .json(&json!({"code": "1"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let (status, body) = send(
        s.http
            .post(format!("{}/execute", s.base))
            .header("X-Access-Token", &s.alice)
            .json(&json!({"code": "1"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Bad bodies are named, not guessed at.
    let (status, body) = send(
        s.api(Method::POST, "/v2/sandboxes", Some(&s.alice))
            .body("{not json"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = send(
        s.api(
            Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            Some(&s.alice),
        )
        .json(&json!({"timeout": -5})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = send(
        s.api(Method::POST, "/v2/sandboxes", Some(&s.alice))
            .json(&json!({"metadata": {"e2b:template": "x"}})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // A streaming call whose envelope lies about its length ends with a Connect error.
    let mut lying = envelope(&json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi"]}}));
    lying[4] = lying[4].wrapping_add(10);
    let response = s
        .sandbox("/process.Process/Start", &id, ENVD_PORT, &s.alice)
        .header("content-type", "application/connect+json")
        .body(lying)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "application/connect+json"
    );
    let got = frames(&response.bytes().await.unwrap());
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, 2, "an end-of-stream frame");
    assert_eq!(got[0].1["error"]["code"], "invalid_argument", "{got:?}");

    // Alice's command runs, its output streamed between a start and an end.
    let response = s
        .sandbox("/process.Process/Start", &id, ENVD_PORT, &s.alice)
        .header("content-type", "application/connect+json")
        .body(envelope(
            &json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi; exit 4"]}}),
        ))
        .send()
        .await
        .unwrap();
    let got = frames(&response.bytes().await.unwrap());
    assert!(
        got[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0,
        "{got:?}"
    );
    let data: Vec<&Value> = got
        .iter()
        .filter_map(|(_, f)| f["event"]["data"]["stdout"].as_str().map(|_| f))
        .collect();
    assert_eq!(data.len(), 1, "{got:?}");
    assert_eq!(
        data[0]["event"]["data"]["stdout"], "aGkK",
        "base64 of hi\\n"
    );
    let end = &got[got.len() - 2].1["event"]["end"];
    assert_eq!(end["exitCode"], 4, "{got:?}");
    assert_eq!(got.last().unwrap(), &(2, json!({})));

    // A running command is Alice's alone: Bob neither lists nor signals it; Alice's signal ends
    // it.
    let mut running = s
        .sandbox("/process.Process/Start", &id, ENVD_PORT, &s.alice)
        .header("content-type", "application/connect+json")
        .body(envelope(
            &json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo started; sleep 60"]}}),
        ))
        .send()
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !frames_so_far(&seen)
        .iter()
        .any(|(_, f)| f["event"]["data"]["stdout"].is_string())
    {
        seen.extend_from_slice(&running.chunk().await.unwrap().expect("the stream ended"));
    }
    let pid = frames_so_far(&seen)[0].1["event"]["start"]["pid"].clone();
    let list = |key: &str| {
        s.sandbox("/process.Process/List", &id, ENVD_PORT, key)
            .header("content-type", "application/json")
            .body("{}")
    };
    let (_, listed) = send(list(&s.bob)).await;
    assert_eq!(listed, json!({"processes": []}));
    let (_, listed) = send(list(&s.alice)).await;
    assert_eq!(listed["processes"][0]["pid"], pid, "{listed}");
    assert_eq!(listed["processes"][0]["config"]["cmd"], "/bin/sh");
    let signal = |key: &str| {
        s.sandbox("/process.Process/SendSignal", &id, ENVD_PORT, key)
            .header("content-type", "application/json")
            .json(&json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}))
    };
    let (status, body) = send(signal(&s.bob)).await;
    assert_eq!(
        (status, body["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    let (status, _) = send(signal(&s.alice)).await;
    assert_eq!(status, StatusCode::OK);
    while let Some(chunk) = running.chunk().await.unwrap() {
        seen.extend_from_slice(&chunk);
    }
    // As envd: the killed command ends with its end event, then the stream closes cleanly.
    let mut all = frames(&seen);
    let last = all.pop().unwrap();
    assert_eq!((last.0, last.1.get("error")), (2, None), "{last:?}");
    let end = all.pop().unwrap();
    assert_eq!(end.1["event"]["end"]["status"], "signal: killed", "{end:?}");

    // Unknown Connect methods say so.
    let (status, body) = send(
        s.sandbox(
            "/filesystem.Filesystem/NoSuchMethod",
            &id,
            ENVD_PORT,
            &s.alice,
        )
        .header("content-type", "application/json")
        .body("{}"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(body["code"], "unimplemented");

    // Kill: gone for alice too, and a second kill is E2B's 404.
    let (status, _) =
        send(s.api(Method::DELETE, &format!("/sandboxes/{id}"), Some(&s.alice))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) =
        send(s.api(Method::DELETE, &format!("/sandboxes/{id}"), Some(&s.alice))).await;
    assert_eq!(
        (status, body["code"].clone()),
        (StatusCode::NOT_FOUND, json!(404))
    );
    s.engine.shutdown().await;
}

/// A server in the sandbox that answers every request with what it received, as JSON.
const ECHO_SERVER: &str = r#"
import http.server, json, threading
class _Echo(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        body = json.dumps({"method": self.command, "path": self.path,
                           "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": self.rfile.read(length).decode()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *args):
        pass
_server = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), _Echo)
threading.Thread(target=_server.serve_forever, daemon=True).start()
"#;

/// A server that takes any request as an upgrade, answers 101, then echoes raw bytes.
const UPGRADE_SERVER: &str = r#"
import socket, threading
def _upgrade(listener):
    while True:
        conn, _ = listener.accept()
        def serve(c=conn):
            data = b""
            while b"\r\n\r\n" not in data:
                data += c.recv(4096)
            c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
            while True:
                piece = c.recv(4096)
                if not piece:
                    return
                c.sendall(piece)
        threading.Thread(target=serve, daemon=True).start()
_upgrades = socket.socket()
_upgrades.bind(("127.0.0.1", 8003))
_upgrades.listen(8)
threading.Thread(target=_upgrade, args=(_upgrades,), daemon=True).start()
"#;

#[tokio::test]
async fn ports_are_proxied_for_their_owner_in_every_form() {
    let s = Server::start().await;
    let create = |public: bool| {
        s.api(Method::POST, "/v2/sandboxes", Some(&s.alice))
            .json(&json!({"templateID": "base", "network": {"allowPublicTraffic": public}}))
    };
    let (status, private) = send(create(false)).await;
    assert_eq!(status, StatusCode::CREATED, "{private}");
    let id = private["sandboxID"].as_str().unwrap().to_owned();
    let token = private["trafficAccessToken"].as_str().unwrap().to_owned();
    let (status, body) = send(
        s.sandbox("/execute", &id, INTERPRETER_PORT, &token)
            .json(&json!({"code": ECHO_SERVER})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The headers' form, with the traffic token: the application gets its own headers (its
    // Bearer too) and none of the routing or credentials.
    let port_request = |path: &str| {
        s.http
            .post(format!("{}{path}", s.base))
            .header("E2b-Sandbox-Id", &id)
            .header("E2b-Sandbox-Port", "8000")
    };
    let (status, echoed) = send(
        port_request("/files?x=1")
            .header("e2b-traffic-access-token", &token)
            .header("authorization", "Bearer the-app-s-own")
            .body("hello"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{echoed}");
    assert_eq!(echoed["path"], "/files?x=1", "envd's paths reach the app");
    assert_eq!(echoed["body"], "hello");
    let headers = echoed["headers"].as_object().unwrap();
    assert_eq!(headers["authorization"], "Bearer the-app-s-own");
    for stripped in [
        "e2b-traffic-access-token",
        "x-access-token",
        "x-api-key",
        "e2b-sandbox-id",
        "e2b-sandbox-port",
    ] {
        assert!(!headers.contains_key(stripped), "{stripped}: {echoed}");
    }

    // No token, or someone else's: E2B's refusals.
    let (status, body) = send(port_request("/")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("is missing"),
        "{body}"
    );
    assert_eq!(body["sandboxId"], id.as_str());
    let (status, body) =
        send(port_request("/").header("e2b-traffic-access-token", "e2bs_x.y")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("is invalid"),
        "{body}"
    );
    let (status, body) = send(port_request("/").header("X-API-Key", &s.bob)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["message"], "The sandbox was not found");

    // The host's form, the userinfo form (what httpx sends for get_host's URL under evervm's
    // default domain) and the path form.
    let (status, echoed) = send(
        s.http
            .get(format!("{}/a", s.base))
            .header("host", format!("8000-{id}.example.test"))
            .header("X-API-Key", &s.alice),
    )
    .await;
    assert_eq!(
        (status, echoed["path"].clone()),
        (StatusCode::OK, json!("/a"))
    );
    let address = s.base.strip_prefix("http://").unwrap();
    let (status, echoed) = send(
        s.http
            .get(format!("http://8000-{id}.sdk-too-old@{address}/b"))
            .header("e2b-traffic-access-token", &token),
    )
    .await;
    assert_eq!(
        (status, echoed["path"].clone()),
        (StatusCode::OK, json!("/b"))
    );
    assert!(
        !echoed["headers"]
            .as_object()
            .unwrap()
            .contains_key("authorization"),
        "{echoed}"
    );
    let (status, echoed) = send(
        s.http
            .get(format!("{}/ports/8000-{id}/c/d?e=f", s.base))
            .header("e2b-traffic-access-token", &token),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{echoed}");
    assert_eq!(echoed["path"], "/c/d?e=f");
    assert_eq!(
        echoed["headers"]["x-forwarded-prefix"],
        format!("/ports/8000-{id}")
    );

    // A port nothing listens on, and a port that is not one.
    let (status, body) = send(
        s.http
            .get(format!("{}/ports/8001-{id}/", s.base))
            .header("e2b-traffic-access-token", &token),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(
        body["message"],
        "The sandbox is running but port is not open"
    );
    assert_eq!(body["port"], 8001);
    let (status, _) = send(
        s.http
            .get(format!("{}/", s.base))
            .header("E2b-Sandbox-Id", &id)
            .header("E2b-Sandbox-Port", "eighty"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // An upgrade (a WebSocket's) is spliced: after the 101, bytes go both ways as they are.
    let (status, body) = send(
        s.sandbox("/execute", &id, INTERPRETER_PORT, &token)
            .json(&json!({"code": UPGRADE_SERVER})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut raw = tokio::net::TcpStream::connect(address).await.unwrap();
    let upgrade = format!(
        "GET /ports/8003-{id}/ws HTTP/1.1\r\nhost: {address}\r\nconnection: upgrade\r\n\
         upgrade: websocket\r\ne2b-traffic-access-token: {token}\r\n\r\n"
    );
    raw.write_all(upgrade.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(raw.read(&mut byte).await.unwrap(), 1, "{head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    raw.write_all(b"both ways").await.unwrap();
    let mut echoed = [0u8; 9];
    tokio::time::timeout(WAIT, raw.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"both ways");

    // A public sandbox answers anyone.
    let (status, public) = send(create(true)).await;
    assert_eq!(status, StatusCode::CREATED, "{public}");
    let public_id = public["sandboxID"].as_str().unwrap().to_owned();
    let public_token = public["envdAccessToken"].as_str().unwrap().to_owned();
    let (status, body) = send(
        s.sandbox("/execute", &public_id, INTERPRETER_PORT, &public_token)
            .json(&json!({"code": ECHO_SERVER})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, echoed) = send(
        s.http
            .get(format!("{}/ports/8000-{public_id}/open", s.base)),
    )
    .await;
    assert_eq!(
        (status, echoed["path"].clone()),
        (StatusCode::OK, json!("/open"))
    );
    assert!(
        !public["metadata"].to_string().contains("public"),
        "evervm's tag is hidden: {public}"
    );

    // A killed sandbox's port: E2B's "not found".
    let (status, _) =
        send(s.api(Method::DELETE, &format!("/sandboxes/{id}"), Some(&s.alice))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for request in [
        port_request("/").header("e2b-traffic-access-token", &token),
        port_request("/"),
    ] {
        let (status, body) = send(request).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(body["message"], "The sandbox was not found");
        assert_eq!(body["sandboxId"], id.as_str());
    }
    s.engine.shutdown().await;
}

#[tokio::test]
async fn a_configured_domain_is_answered_and_routes_by_host() {
    let domain = evervm::server::e2b::check_domain("Sandboxes.Example.Test:3000").unwrap();
    let s = Server::start_with(evervm::server::e2b::E2bOptions {
        domain: Some(domain.clone()),
        ..evervm::server::e2b::E2bOptions::default()
    })
    .await;
    let (status, created) = send(
        s.api(Method::POST, "/v2/sandboxes", Some(&s.alice))
            .json(&json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["domain"], "sandboxes.example.test:3000");
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let token = created["envdAccessToken"].as_str().unwrap().to_owned();
    let (status, body) = send(
        s.sandbox("/execute", &id, INTERPRETER_PORT, &token)
            .json(&json!({"code": ECHO_SERVER})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // What get_host(8000) gives, as wildcard DNS would bring it here.
    let (status, echoed) = send(
        s.http
            .get(format!("{}/here", s.base))
            .header("host", format!("8000-{id}.{domain}"))
            .header("e2b-traffic-access-token", &token),
    )
    .await;
    assert_eq!(
        (status, echoed["path"].clone()),
        (StatusCode::OK, json!("/here"))
    );
    for refused in ["e2b.app", "x.e2b.dev", "a@b", "a/b", "host:0", ""] {
        assert!(
            evervm::server::e2b::check_domain(refused).is_err(),
            "{refused}"
        );
    }
    s.engine.shutdown().await;
}

/// E2B's state-changing calls are in the audit log with the door `e2b`, the token behind the
/// key or the sandbox's access token, and their outcome; reads are not.
#[tokio::test]
async fn e2b_calls_are_audited() {
    let s = Server::start().await;
    let (status, created) = send(
        s.api(Method::POST, "/v2/sandboxes", Some(&s.alice))
            .json(&json!({"templateID": "base", "timeout": 60})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let access = created["envdAccessToken"].as_str().unwrap().to_owned();
    let (status, _) = send(
        s.sandbox("/execute", &id, INTERPRETER_PORT, &access)
            .json(&json!({"code": "6 * 7"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for (method, body) in [
        ("MakeDir", json!({"path": "made"})),
        ("Stat", json!({"path": "made"})),
    ] {
        let (status, answer) = send(
            s.sandbox(
                &format!("/filesystem.Filesystem/{method}"),
                &id,
                ENVD_PORT,
                &access,
            )
            .header("content-type", "application/json")
            .json(&body),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{method}: {answer}");
    }
    let (status, _) = send(s.api(Method::GET, &format!("/sandboxes/{id}"), Some(&s.alice))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(s.api(Method::DELETE, &format!("/sandboxes/{id}"), Some(&s.bob))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) =
        send(s.api(Method::DELETE, &format!("/sandboxes/{id}"), Some(&s.alice))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let query = evervm_engine::store::AuditQuery {
        machine: Some(id.clone()),
        limit: 100,
        ..Default::default()
    };
    let mut entries = s.engine.audit_entries(&query).await.unwrap();
    entries.reverse();
    let seen: Vec<(&str, &str, &str)> = entries
        .iter()
        .map(|e| {
            assert_eq!(e.door, "e2b", "{e:?}");
            (
                e.account.as_deref().unwrap(),
                e.action.as_str(),
                e.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("alice", "machine.create", "ok"),
            ("alice", "exec", "ok"),
            ("alice", "file.mkdir", "ok"),
            ("bob", "machine.delete", "404 Not Found"),
            ("alice", "machine.delete", "ok"),
        ]
    );
    // The same token's id whether the call carried the key or the sandbox's access token.
    let alice_ids: std::collections::BTreeSet<_> = entries
        .iter()
        .filter(|e| e.account.as_deref() == Some("alice"))
        .map(|e| e.token_id.clone().unwrap())
        .collect();
    assert_eq!(alice_ids.len(), 1, "{alice_ids:?}");
    assert!(entries[1].detail.as_deref().unwrap().starts_with("sha256:"));
}
