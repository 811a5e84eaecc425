//! Three `evervm serve` nodes on loopback sharing one PostgreSQL database and one bucket (gVisor):
//! machines run on one owner whichever node they were created through, requests (and
//! WebSockets) reaching another node are forwarded to the owner, a machine swapped on one node
//! comes back on another with its state, a node killed with SIGKILL loses no acknowledged state
//! of a machine with `durability = instruction`, and nodes racing for one machine never run it
//! both. Needs the test PostgreSQL server and bucket (`scripts/test.sh` starts both). The nodes
//! serve TLS with a certificate of a CA the test makes (openssl), advertise https:// addresses
//! and verify each other against that CA (`--cluster-ca`) when they forward.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use evervm::{Client, CreateMachineOptions, Trust};

const EVERVM: &str = env!("CARGO_BIN_EXE_evervm");

/// Leases of 3 s: a dead node's machines wait at most that long.
const LEASE_SECS: &str = "3";

struct Node {
    url: String,
    /// Its E2B listener.
    e2b_url: String,
    /// The test's CA, which signed the nodes' certificate.
    ca: std::path::PathBuf,
    /// An HTTP client that trusts the CA.
    http: reqwest::Client,
    killed: bool,
    child: Child,
    _home: tempfile::TempDir,
    log: tempfile::NamedTempFile,
}

impl Node {
    fn start(id: &str, database: &str, bucket: &str, tls: &std::path::Path) -> Self {
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (port, e2b_port) = (free_port(), free_port());
        let url = format!("https://127.0.0.1:{port}");
        let e2b_url = format!("https://127.0.0.1:{e2b_port}");
        let ca = tls.join("ca.pem");
        let home = tempfile::tempdir().unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new(EVERVM)
            .args(["serve", "--backend", "gvisor", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--advertise", &url, "--node-id", id])
            .arg("--e2b-listen")
            .arg(format!("127.0.0.1:{e2b_port}"))
            .args(["--database", database, "--snapshots", bucket])
            .arg("--tls-cert")
            .arg(tls.join("node.pem"))
            .arg("--tls-key")
            .arg(tls.join("node.key"))
            .arg("--cluster-ca")
            .arg(&ca)
            .arg("--home")
            .arg(home.path())
            .env("EVERVM_LEASE_SECS", LEASE_SECS)
            .env("EVERVM_IDLE_SWAP_SECS", "0")
            .env("EVERVM_LOG", "debug")
            .env_remove("EVERVM_URL")
            .env_remove("EVERVM_TOKEN")
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            let Some(Ok(line)) = lines.next() else {
                let log = std::fs::read_to_string(log.path()).unwrap_or_default();
                panic!("node {id} did not start:\n{log}");
            };
            if line.contains("E2B-compatible API on ") {
                break;
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        let certificate = reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap();
        let http = reqwest::Client::builder()
            .add_root_certificate(certificate)
            .build()
            .unwrap();
        Self {
            url,
            e2b_url,
            ca,
            http,
            killed: false,
            child,
            _home: home,
            log,
        }
    }

    fn client(&self, token: &str) -> Client {
        Client::remote_trusting(&self.url, token, &Trust::CaFile(self.ca.clone())).unwrap()
    }

    fn kill(&mut self) {
        self.killed = true;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// `GET PATH` with the token, as JSON or text.
    async fn get(&self, path: &str, token: &str) -> String {
        self.http
            .get(format!("{}{path}", self.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// How many machines this node has resident (`evervm_machines{state="resident"}`).
    async fn resident(&self, token: &str) -> u64 {
        metric(
            &self.get("/metrics", token).await,
            "evervm_machines{state=\"resident\"}",
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{series} ")))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// The `repr` of what `code` evaluates to on `machine` through `client`; fails on an error.
async fn value(client: &Client, machine: &str, code: &str) -> String {
    let run = client.machine(machine).exec(code).await.unwrap();
    match (run.result.value, run.result.error) {
        (Some(value), None) => value,
        (None, None) => String::new(),
        (_, Some(error)) => panic!("{code:?} on {machine} failed: {error}"),
    }
}

struct Cluster {
    nodes: Vec<Node>,
    token: String,
    _database: evervm_tests::postgres::ScratchPostgres,
    _tls: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Option<Self> {
        if !evervm_tests::backends().iter().any(|b| b == "gvisor") {
            eprintln!("skipping: the gVisor backend is not available here");
            return None;
        }
        let database = evervm_tests::postgres::ScratchPostgres::create()?;
        let bucket = evervm_tests::bucket::scratch_bucket()?;
        let made = Command::new(EVERVM)
            .args(["token", "create", "--account", "cluster", "--database"])
            .arg(&database.url)
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let token = String::from_utf8(made.stdout).unwrap().trim().to_owned();
        let tls = tempfile::tempdir().unwrap();
        make_certificates(tls.path());
        let nodes = ["node-a", "node-b", "node-c"]
            .iter()
            .map(|id| Node::start(id, &database.url, &bucket, tls.path()))
            .collect();
        Some(Self {
            nodes,
            token,
            _database: database,
            _tls: tls,
        })
    }

    fn client(&self, node: usize) -> Client {
        self.nodes[node].client(&self.token)
    }

    /// How many machines each node has resident (a killed node: none).
    async fn residents(&self) -> Vec<u64> {
        let mut counts = Vec::new();
        for node in &self.nodes {
            counts.push(if node.killed {
                0
            } else {
                node.resident(&self.token).await
            });
        }
        counts
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_nodes_share_machines_forward_requests_and_survive_a_kill() {
    let Some(mut cluster) = Cluster::start() else {
        return;
    };
    let token = cluster.token.clone();
    // A client that trusts only the default roots refuses the nodes' certificate.
    let untrusting = Client::remote(&cluster.nodes[0].url, &token).unwrap();
    let refused = untrusting.whoami().await.unwrap_err().to_string();
    assert!(refused.contains("certificate"), "{refused}");

    // Every node lists the three, alive.
    let listed: serde_json::Value =
        serde_json::from_str(&cluster.nodes[1].get("/v1/nodes", &token).await).unwrap();
    assert_eq!(listed["this_node"], "node-b", "{listed}");
    let alive: Vec<&str> = listed["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["alive"] == true)
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(alive, ["node-a", "node-b", "node-c"], "{listed}");

    // A machine created through A runs on A, and requests through B and C reach it there.
    let machine = cluster
        .client(0)
        .create_machine(CreateMachineOptions {
            image: Some("minimal".into()),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap();
    let name = machine.name().to_owned();
    value(&cluster.client(0), &name, "x = 1").await;
    assert_eq!(value(&cluster.client(1), &name, "x += 1; x").await, "2");
    assert_eq!(cluster.residents().await, [1, 0, 0]);
    // A WebSocket through C is forwarded too.
    let mut session = cluster.client(2).machine(&name).connect().await.unwrap();
    let run = session
        .exec("x * 10", &evervm::ExecOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(run.result.value.as_deref(), Some("20"), "{run:?}");
    drop(session);
    assert_eq!(cluster.residents().await, [1, 0, 0]);
    // The audit log, read through C, has each call once, recorded by A, which ran them (A
    // writes its entries a moment after each call: read until all four are there).
    let path = format!("/v1/audit?machine={name}");
    let mut audit = serde_json::Value::Null;
    for _ in 0..100 {
        audit = serde_json::from_str(&cluster.nodes[2].get(&path, &token).await).unwrap();
        if audit["entries"].as_array().is_some_and(|e| e.len() >= 4) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let entries = audit["entries"].as_array().unwrap();
    assert!(entries.iter().all(|e| e["node"] == "node-a"), "{audit}");
    let actions: Vec<&str> = entries
        .iter()
        .rev()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["machine.create", "exec", "exec", "exec"],
        "{audit}"
    );

    // A sandbox made through B's E2B listener runs on B (its timeout's clock is there); E2B
    // requests through the other nodes reach it there, however they name it.
    let e2b = cluster.nodes[0].http.clone();
    let key = evervm::server::e2b::api_key_for_token(&token);
    let created = json_answer(
        e2b.post(format!("{}/sandboxes", cluster.nodes[1].e2b_url))
            .header("X-API-Key", &key)
            .json(&serde_json::json!({ "templateID": "base", "timeout": 120 })),
    )
    .await;
    let sandbox = created["sandboxID"].as_str().unwrap().to_owned();
    let access = created["envdAccessToken"].as_str().unwrap().to_owned();
    let executed = e2b
        .post(format!("{}/execute", cluster.nodes[2].e2b_url))
        .header("E2b-Sandbox-Id", &sandbox)
        .header("E2b-Sandbox-Port", "49999")
        .header("X-Access-Token", &access)
        .json(&serde_json::json!({ "code": "z = 6 * 7\nz" }))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(executed.contains(r#""text":"42""#), "{executed}");
    // Its machine started on its first request, at home: B.
    assert_eq!(cluster.residents().await, [1, 1, 0]);
    // Named by its host, as behind wildcard DNS (restated in headers on the way).
    let read = e2b
        .get(format!("{}/health", cluster.nodes[0].e2b_url))
        .header("Host", format!("49983-{sandbox}.e2b.example"))
        .header("X-Access-Token", &access)
        .send()
        .await
        .unwrap();
    assert!(read.status().is_success(), "{:?}", read.text().await);
    let info = json_answer(
        e2b.get(format!("{}/sandboxes/{sandbox}", cluster.nodes[0].e2b_url))
            .header("X-API-Key", &key),
    )
    .await;
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(cluster.residents().await, [1, 1, 0], "served where it runs");
    let killed = e2b
        .delete(format!("{}/sandboxes/{sandbox}", cluster.nodes[2].e2b_url))
        .header("X-API-Key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), reqwest::StatusCode::NO_CONTENT);
    assert_eq!(cluster.residents().await, [1, 0, 0]);

    // Swapped on A, it comes back on the node its next instruction reaches: B.
    cluster.client(0).machine(&name).swap_out().await.unwrap();
    assert_eq!(value(&cluster.client(1), &name, "x").await, "2");
    assert_eq!(cluster.residents().await, [0, 1, 0]);
    let metrics_b = cluster.nodes[1].get("/metrics", &token).await;
    assert_eq!(
        metric(
            &metrics_b,
            "evervm_snapshot_fetches_total{source=\"bucket\"}"
        ),
        1
    );

    // A machine with durability = instruction on C, C killed: the next instruction (through
    // A) runs on a survivor with every acknowledged change.
    let durable = cluster
        .client(2)
        .create_machine(CreateMachineOptions {
            image: Some("minimal".into()),
            durability: Some("instruction".into()),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap();
    let durable = durable.name().to_owned();
    for i in 1..=3 {
        value(&cluster.client(2), &durable, &format!("y = {i}")).await;
    }
    assert_eq!(
        cluster.residents().await,
        [0, 1, 1],
        "it runs where it was created"
    );
    assert_eq!(
        cluster.residents().await,
        [0, 1, 1],
        "it runs where it was created"
    );
    // An instruction still running when its node dies gets an error result on the survivor.
    let (running, mut events) = cluster
        .client(2)
        .machine(&durable)
        .stream(
            "print('running', flush=True); import time; time.sleep(60); y = 'never'",
            &evervm::ExecOptions::default(),
        )
        .await
        .unwrap();
    // Killed once it runs: its first line came.
    match futures::StreamExt::next(&mut events).await {
        Some(Ok(evervm::ExecEvent::Output(chunk))) => assert_eq!(chunk.data.trim_end(), "running"),
        other => panic!("expected its first line, got {other:?}"),
    }
    cluster.nodes[2].kill();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(60);
    let back = loop {
        match cluster.client(0).machine(&durable).exec("y").await {
            Ok(run) if run.result.error.is_none() => break run,
            Ok(run) => eprintln!("not yet: {:?}", run.result.error),
            Err(e) => eprintln!("not yet: {e}"),
        }
        assert!(Instant::now() < deadline, "no failover within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "failover: the machine answered on a survivor {:.2} s after its node was killed \
         (leases of {LEASE_SECS} s)",
        killed.elapsed().as_secs_f64()
    );
    assert_eq!(back.result.value.as_deref(), Some("3"), "{back:?}");
    let cut_short = cluster
        .client(0)
        .machine(&durable)
        .result(running)
        .await
        .unwrap();
    assert!(
        cut_short
            .error
            .as_deref()
            .is_some_and(|e| e.contains("node that ran this instruction stopped")),
        "{cut_short:?}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&cluster.nodes[0].get("/v1/nodes", &token).await).unwrap();
    let c = listed["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "node-c");
    assert!(c.is_none_or(|c| c["alive"] == false), "{listed}");
    cluster.client(0).machine(&durable).delete().await.unwrap();

    // The two survivors race for one swapped machine, many times: the node that loses
    // forwards the instruction to the winner, and every instruction ran on the one node that
    // held the machine then, so none is lost.
    let shared = name.clone();
    let (mut succeeded, mut refused) = (0, Vec::new());
    for _ in 0..15 {
        let owner_a = cluster.client(0);
        owner_a.machine(&shared).swap_out().await.unwrap();
        let (on_a, on_b) = (
            cluster.client(0).machine(&shared),
            cluster.client(1).machine(&shared),
        );
        let step = "n = globals().get('n', 0) + 1; n";
        let (a, b) = tokio::join!(on_a.exec(step), on_b.exec(step));
        for run in [a, b] {
            match run {
                Ok(run) if run.result.error.is_none() => succeeded += 1,
                Ok(run) => refused.push(format!("{:?}", run.result.error)),
                Err(e) => refused.push(e.to_string()),
            }
        }
        let residents = cluster.residents().await;
        assert!(residents[0] + residents[1] <= 1, "{residents:?}");
    }
    eprintln!(
        "the race: {succeeded} of 30 instructions ran, {} refused: {refused:?}",
        refused.len()
    );
    assert_eq!(succeeded, 30, "every instruction ran: {refused:?}");
    assert_eq!(
        value(&cluster.client(1), &shared, "n").await,
        succeeded.to_string(),
        "every instruction that succeeded counted once"
    );
    for node in &cluster.nodes[..2] {
        assert!(!node.log().contains("panicked"), "{}", node.log());
    }
}

/// Sends `request` and reads its answer as JSON.
async fn json_answer(request: reqwest::RequestBuilder) -> serde_json::Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// A CA of the test's own (`ca.pem`) and a certificate it signed for 127.0.0.1 (`node.pem`,
/// `node.key`), which every node serves (they all listen on loopback).
fn make_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let done = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs (scripts/setup.sh installs it)");
        assert!(
            done.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&done.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=evervm test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req", "-new"][..],
            &ec,
            &[
                "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.join("node.ext"), "subjectAltName = IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "node.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "node.ext",
        "-out",
        "node.pem",
    ]);
}
