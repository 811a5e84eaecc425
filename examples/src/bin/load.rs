//! The evervm load program: N clients × M instructions over K machines, with swaps forced while
//! they run. Checks that nothing fails and that every machine keeps its order and its state;
//! prints latency per transport (p50, p99, max), throughput, errors and swaps.
//!
//! `cargo run --release -p evervm-examples --bin load -- --backend gvisor --clients 100
//! --instructions 1000 --machines 10 --swap-every-ms 500 --max-seconds 1200`
//!
//! Without `--url` it starts its own server on a loopback port (a fresh home, the backend of
//! `--backend`; `auto` takes the best this host runs; the account's instruction rate limit
//! lifted, since the whole load is one account's); with `--url` and `--token` (or
//! `EVERVM_TOKEN`) it loads that server instead, on machines of its own that it deletes at the
//! end.
//!
//! Even-numbered clients speak WebSocket (`/v1/machine/{name}/repl`, one connection per machine,
//! each message checked: `connected`, then per instruction `exec_received`, its one `output`
//! line, its `result`); odd-numbered ones HTTP (`POST .../exec`, then the long-poll `GET
//! .../exec/{seq}/result`). Client `c` sends its instruction `i` to machine `(c + i) % K`: the
//! instruction adds one to `counter_c` on that machine, prints `c i` and returns the counter, so
//! the client knows the value it must get back (state kept, across swaps too, and no instruction
//! lost or run twice) and checks that the seqs it is given on each machine increase. A swapper
//! asks `POST /v1/machine/{name}/swap` of a random machine every `--swap-every-ms` (the process
//! backend has no swap: it says so, and the load goes on without). At the end each machine's
//! seqs must be exactly 0..n, each accepted once, and its counters must add up to its
//! instructions.
//!
//! Bounded: M instructions per client, and `--max-seconds` for everything (a client's
//! instruction may also wait at most 120 s). Exits non-zero, after the summary, on any error,
//! any violation, or when the time is up.
#![allow(clippy::print_stdout)]

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use evervm::protocol::{
    DEFAULT_TIMEOUT_SECONDS, HealthResponse, MessageFromServer, MessageToServer, WireInstruction,
    WireOutcome, WireStream,
};
use evervm::{Client, CreateMachineOptions, ErrorKind, ExecOptions};
use evervm_examples::measure::{ms, percentile};
use evervm_tests::TestServer;
use futures::{SinkExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// How long one instruction (or one swap) may take, queue and restores included, before it
/// counts as an error.
const INSTRUCTION_WAIT: Duration = Duration::from_secs(120);

/// How many errors the summary lists (all are counted).
const ERRORS_SHOWN: usize = 20;

/// How long deleting the machines at the end may take.
const CLEANUP_WAIT: Duration = Duration::from_secs(60);

const USAGE: &str = "usage: load [--backend auto|gvisor|process] [--clients N] \
                     [--instructions M] [--machines K] [--swap-every-ms MS (0: none)] \
                     [--max-seconds S] [--url URL --token TOKEN]";

struct Args {
    backend: String,
    clients: usize,
    /// Per client.
    instructions: usize,
    machines: usize,
    /// `None`: no swaps.
    swap_every: Option<Duration>,
    max_seconds: u64,
    url: Option<String>,
    token: Option<String>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        backend: "auto".to_owned(),
        clients: 8,
        instructions: 50,
        machines: 4,
        swap_every: Some(Duration::from_millis(250)),
        max_seconds: 300,
        url: None,
        token: std::env::var("EVERVM_TOKEN").ok(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{arg} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--backend" => args.backend = value()?,
            "--clients" => args.clients = value()?.parse()?,
            "--instructions" => args.instructions = value()?.parse()?,
            "--machines" => args.machines = value()?.parse()?,
            "--swap-every-ms" => {
                let millis: u64 = value()?.parse()?;
                args.swap_every = (millis > 0).then(|| Duration::from_millis(millis));
            }
            "--max-seconds" => args.max_seconds = value()?.parse()?,
            "--url" => args.url = Some(value()?),
            "--token" => args.token = Some(value()?),
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    if args.clients == 0 || args.instructions == 0 || args.machines == 0 {
        bail!("--clients, --instructions and --machines must be at least 1");
    }
    Ok(args)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    WebSocket,
    Http,
}

impl Transport {
    /// Half the clients each: even ones WebSocket, odd ones HTTP.
    fn of(client: usize) -> Self {
        if client.is_multiple_of(2) {
            Transport::WebSocket
        } else {
            Transport::Http
        }
    }

    fn index(self) -> usize {
        match self {
            Transport::WebSocket => 0,
            Transport::Http => 1,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Transport::WebSocket => "WebSocket",
            Transport::Http => "HTTP",
        }
    }
}

/// What every client and the swapper record.
#[derive(Default)]
struct Tally {
    /// Latencies of successful instructions, by `Transport::index`.
    latencies: [Vec<Duration>; 2],
    /// Every seq accepted, per machine.
    seqs: Vec<Vec<i64>>,
    errors: Vec<String>,
    error_count: usize,
}

impl Tally {
    fn error(&mut self, text: String) {
        self.error_count += 1;
        if self.errors.len() < ERRORS_SHOWN {
            self.errors.push(text);
        }
    }
}

/// The run: where the server is, its machines, and the tally.
struct Load {
    url: String,
    ws_base: String,
    token: String,
    machines: Vec<String>,
    instructions: usize,
    tally: Mutex<Tally>,
}

impl Load {
    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Instruction `i` of client `c`: one more on `counter_c`, a line `c i`, and the counter.
fn instruction_code(client: usize, i: usize) -> String {
    format!(
        "counter_{client} = globals().get('counter_{client}', 0) + 1\n\
         print('{client} {i}')\n\
         counter_{client}"
    )
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One WebSocket REPL connection to one machine.
struct WsLink {
    socket: Socket,
    next_request: u32,
}

impl WsLink {
    /// Connects and checks that `connected` comes first and names the machine.
    async fn open(load: &Load, machine: &str) -> Result<Self> {
        let url = format!("{}/v1/machine/{machine}/repl", load.ws_base);
        let mut request = url.as_str().into_client_request()?;
        let bearer = format!("Bearer {}", load.token).parse()?;
        request.headers_mut().insert("authorization", bearer);
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .with_context(|| format!("cannot open {url}"))?;
        let mut link = Self {
            socket,
            next_request: 0,
        };
        match link.receive().await? {
            MessageFromServer::Connected { machine_name } if machine_name == machine => Ok(link),
            other => bail!("{machine}'s WebSocket began with {other:?}, not `connected` to it"),
        }
    }

    async fn receive(&mut self) -> Result<MessageFromServer> {
        loop {
            let frame = self
                .socket
                .next()
                .await
                .context("the server ended the WebSocket")??;
            match frame {
                Message::Text(text) => {
                    return serde_json::from_str(text.as_str())
                        .with_context(|| format!("a message outside the protocol: {text}"));
                }
                Message::Close(frame) => bail!("the server closed the WebSocket: {frame:?}"),
                Message::Binary(_) => bail!("the server sent a binary message"),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
    }

    /// Runs one instruction that prints `line`; its seq and value. Each message must be the one
    /// the protocol says comes next.
    async fn run(&mut self, code: &str, line: &str) -> Result<(i64, Option<String>)> {
        let request_id = self.next_request;
        self.next_request = self.next_request.wrapping_add(1);
        let exec = MessageToServer::Exec {
            instruction: WireInstruction {
                code: code.to_owned(),
                timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
                dialect: evervm::Dialect::Python,
                context: None,
            },
            request_id,
        };
        let text = serde_json::to_string(&exec)?;
        self.socket.send(Message::text(text)).await?;
        let seq = match self.receive().await? {
            MessageFromServer::ExecReceived {
                seq,
                request_id: id,
            } if id == request_id => seq,
            other => bail!("expected exec_received of request {request_id}, got {other:?}"),
        };
        match self.receive().await? {
            MessageFromServer::Output {
                chunk,
                instruction_id,
            } if instruction_id == seq
                && chunk.seq == 0
                && chunk.stream == WireStream::Stdout
                && chunk.data == line => {}
            other => bail!("expected instruction {seq}'s output line {line:?}, got {other:?}"),
        }
        match self.receive().await? {
            MessageFromServer::Result {
                instruction_id,
                result,
            } if instruction_id == seq => match result.outcome {
                WireOutcome::Value { value, .. } => Ok((seq, value)),
                WireOutcome::Error { error, .. } => bail!("instruction {seq} failed: {error}"),
            },
            other => bail!("expected instruction {seq}'s result, got {other:?}"),
        }
    }
}

/// How a client reaches the machines.
enum Link {
    /// One connection per machine, opened at its first instruction.
    WebSocket(Vec<Option<WsLink>>),
    Http(Client),
}

impl Link {
    /// Runs instruction `code` (which prints `line`) on machine `m`; its seq, its value, and
    /// how long it took (a WebSocket's opening not included).
    async fn run(
        &mut self,
        load: &Load,
        m: usize,
        code: &str,
        line: &str,
    ) -> Result<(i64, Option<String>, Duration)> {
        match self {
            Link::WebSocket(links) => {
                let link = match &mut links[m] {
                    Some(link) => link,
                    empty @ None => empty.insert(WsLink::open(load, &load.machines[m]).await?),
                };
                let started = Instant::now();
                let (seq, value) = link.run(code, line).await?;
                Ok((seq, value, started.elapsed()))
            }
            Link::Http(client) => {
                let machine = client.machine(&load.machines[m]);
                let started = Instant::now();
                let accepted = machine.start(code, &ExecOptions::default()).await?;
                let result = machine.result(accepted.seq).await?;
                let elapsed = started.elapsed();
                if let Some(error) = result.error {
                    bail!("instruction {} failed: {error}", accepted.seq);
                }
                Ok((accepted.seq, result.value, elapsed))
            }
        }
    }
}

/// One client: its M instructions, one at a time, round-robin over the machines. Stops at its
/// first error, which it records.
async fn run_client(load: Arc<Load>, client: usize) {
    let transport = Transport::of(client);
    if let Err(e) = client_instructions(&load, client, transport).await {
        let label = transport.label();
        load.tally()
            .error(format!("client {client} ({label}): {e:#}"));
    }
}

async fn client_instructions(load: &Load, client: usize, transport: Transport) -> Result<()> {
    let machines = load.machines.len();
    let mut link = match transport {
        Transport::WebSocket => Link::WebSocket((0..machines).map(|_| None).collect()),
        Transport::Http => Link::Http(Client::remote(&load.url, &load.token)?),
    };
    // What this client has counted on each machine, and the last seq it was given there.
    let mut counters = vec![0_u64; machines];
    let mut last_seqs: Vec<Option<i64>> = vec![None; machines];
    for i in 0..load.instructions {
        let m = (client + i) % machines;
        let code = instruction_code(client, i);
        let line = format!("{client} {i}");
        let running = link.run(load, m, &code, &line);
        let (seq, value, elapsed) = tokio::time::timeout(INSTRUCTION_WAIT, running)
            .await
            .with_context(|| {
                format!(
                    "instruction {i} on machine {m} gave no result within {} s",
                    INSTRUCTION_WAIT.as_secs()
                )
            })??;
        {
            let mut tally = load.tally();
            tally.seqs[m].push(seq);
            tally.latencies[transport.index()].push(elapsed);
        }
        if let Some(last) = last_seqs[m]
            && seq <= last
        {
            bail!("machine {m} gave instruction {i} seq {seq}, after seq {last}: out of order");
        }
        last_seqs[m] = Some(seq);
        counters[m] += 1;
        let expected = counters[m].to_string();
        if value.as_deref() != Some(expected.as_str()) {
            bail!(
                "machine {m}, instruction {i} (seq {seq}): counter_{client} is {value:?}, \
                 expected {expected}: state lost, or an instruction lost or run twice"
            );
        }
    }
    Ok(())
}

/// What the swapper did.
#[derive(Default)]
struct Swaps {
    latencies: Vec<Duration>,
    /// Why the backend cannot swap, when it cannot.
    unsupported: Option<String>,
}

/// Swaps a random machine out every `every` until `stop`; an instruction for it then restores
/// it. Stops for good, and says why, on a backend without swap.
async fn swapper(load: Arc<Load>, every: Duration, mut stop: watch::Receiver<bool>) -> Swaps {
    let mut swaps = Swaps::default();
    let client = match Client::remote(&load.url, &load.token) {
        Ok(client) => client,
        Err(e) => {
            load.tally().error(format!("swapper: {e}"));
            return swaps;
        }
    };
    let mut random = Xorshift::seeded();
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.changed() => break,
        }
        let m = (random.next() % load.machines.len() as u64) as usize;
        let started = Instant::now();
        let machine = client.machine(&load.machines[m]);
        match tokio::time::timeout(INSTRUCTION_WAIT, machine.swap_out()).await {
            Ok(Ok(())) => swaps.latencies.push(started.elapsed()),
            Ok(Err(e)) if e.kind() == ErrorKind::Unsupported => {
                swaps.unsupported = Some(e.message().to_owned());
                break;
            }
            Ok(Err(e)) => load.tally().error(format!("swap of machine {m}: {e}")),
            Err(_) => load.tally().error(format!(
                "swap of machine {m} did not finish within {} s",
                INSTRUCTION_WAIT.as_secs()
            )),
        }
    }
    swaps
}

/// A small random number generator (xorshift64): the swapper's choices need no more.
struct Xorshift(u64);

impl Xorshift {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self((u64::from(std::process::id()) << 32 | u64::from(nanos)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// After the load: each machine's seqs must be 0..n, each accepted once, and its counters must
/// add up to the load's instructions on it (all but the warm-up). The problems found.
async fn check_machines(load: &Load, client: &Client) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let sum = "sum(v for k, v in list(globals().items()) if k.startswith('counter_'))";
    for (m, name) in load.machines.iter().enumerate() {
        let mut seqs = load.tally().seqs[m].clone();
        seqs.sort_unstable();
        if let Some(j) = (0..seqs.len()).find(|&j| seqs[j] != j as i64) {
            problems.push(format!(
                "machine {m} ({name}): seqs are not 0..{} once each: position {j} has seq {}",
                seqs.len(),
                seqs[j]
            ));
        }
        let run = client.machine(name).exec(sum).await?;
        let expected = seqs.len().saturating_sub(1).to_string();
        if run.result.value.as_deref() != Some(expected.as_str()) {
            problems.push(format!(
                "machine {m} ({name}): its counters add up to {:?}, expected {expected}",
                run.result.value.as_deref().or(run.result.error.as_deref())
            ));
        }
    }
    Ok(problems)
}

async fn health(url: &str) -> Result<HealthResponse> {
    let response = reqwest::get(format!("{url}/healthz")).await?;
    Ok(response.error_for_status()?.json().await?)
}

/// The server's URL and token: the one given, or a server of our own (kept running as long as
/// the returned value lives).
fn target(args: &Args) -> Result<(String, String, Option<TestServer>)> {
    match &args.url {
        Some(url) => {
            let token = args
                .token
                .clone()
                .context("--url needs --token (or EVERVM_TOKEN)")?;
            Ok((url.trim_end_matches('/').to_owned(), token, None))
        }
        None => {
            // The load is one account's: its server lifts the account's instruction rate (500/s
            // by default), which this program would otherwise measure instead of the engine.
            let server = TestServer::start_with(&args.backend, |config| {
                config.limits.instructions_per_second = 0.0;
            });
            Ok((server.url.clone(), server.token.clone(), Some(server)))
        }
    }
}

fn websocket_base(url: &str) -> Result<String> {
    if let Some(rest) = url.strip_prefix("http://") {
        Ok(format!("ws://{rest}"))
    } else if let Some(rest) = url.strip_prefix("https://") {
        Ok(format!("wss://{rest}"))
    } else {
        bail!("{url:?}: the URL must start with http:// or https://")
    }
}

/// Creates the machines and runs one instruction in each (so that the load does not time the
/// first start of a sandbox); their names and the warm-up seqs.
async fn create_machines(client: &Client, count: usize) -> Result<(Vec<String>, Vec<Vec<i64>>)> {
    let mut machines = Vec::with_capacity(count);
    for _ in 0..count {
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await?;
        machines.push(machine);
    }
    let warm_ups = machines.iter().map(|machine| machine.exec("0"));
    let mut seqs = Vec::with_capacity(count);
    for (m, run) in futures::future::join_all(warm_ups)
        .await
        .into_iter()
        .enumerate()
    {
        let run = run.with_context(|| format!("warming up machine {m}"))?;
        if run.result.value.as_deref() != Some("0") {
            bail!("machine {m}'s warm-up gave {:?}", run.result);
        }
        seqs.push(vec![run.seq]);
    }
    let names = machines.iter().map(|m| m.name().to_owned()).collect();
    Ok((names, seqs))
}

fn print_latencies(label: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    println!(
        "  {label:<10} {:>7} instructions  p50 {:>10}  p99 {:>10}  max {:>10}",
        samples.len(),
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
        ms(samples.last().copied().unwrap_or_default()),
    );
}

fn print_swaps(swaps: Option<&Swaps>, backend: &str) {
    match swaps {
        None => println!("  swaps      off (--swap-every-ms 0)"),
        Some(Swaps {
            unsupported: Some(why),
            latencies,
        }) => println!(
            "  swaps      {} done: the {backend} backend cannot swap ({why}); the load ran \
             without swaps",
            latencies.len()
        ),
        Some(Swaps { latencies, .. }) => {
            let mut sorted = latencies.clone();
            sorted.sort_unstable();
            println!(
                "  swaps      {:>7} done          p50 {:>10}  p99 {:>10}  max {:>10}",
                sorted.len(),
                ms(percentile(&sorted, 50.0)),
                ms(percentile(&sorted, 99.0)),
                ms(sorted.last().copied().unwrap_or_default()),
            );
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.max_seconds);
    let (url, token, server) = target(&args)?;
    let health = health(&url).await?;
    let where_ = if server.is_some() {
        "in-process"
    } else {
        "given"
    };
    println!(
        "evervm load: {} clients ({} WebSocket, {} HTTP) x {} instructions over {} machines; \
         {}; at most {} s",
        args.clients,
        args.clients.div_ceil(2),
        args.clients / 2,
        args.instructions,
        args.machines,
        args.swap_every.map_or_else(
            || "no swaps".to_owned(),
            |every| format!("swaps every {}", ms(every))
        ),
        args.max_seconds
    );
    println!(
        "server {url} ({where_}), backend {} ({})",
        health.backend, health.backend_version
    );

    let client = Client::remote(&url, &token)?;
    let (machines, seqs) =
        tokio::time::timeout_at(deadline, create_machines(&client, args.machines))
            .await
            .context("--max-seconds passed while creating the machines")??;
    let load = Arc::new(Load {
        url: url.clone(),
        ws_base: websocket_base(&url)?,
        token,
        machines,
        instructions: args.instructions,
        tally: Mutex::new(Tally {
            seqs,
            ..Tally::default()
        }),
    });

    let (stop, stopped) = watch::channel(false);
    let swapper = args
        .swap_every
        .map(|every| tokio::spawn(swapper(Arc::clone(&load), every, stopped)));
    let load_started = Instant::now();
    let mut clients = JoinSet::new();
    for c in 0..args.clients {
        clients.spawn(run_client(Arc::clone(&load), c));
    }
    let all_done = async {
        while let Some(joined) = clients.join_next().await {
            if let Err(e) = joined {
                load.tally().error(format!("a client task failed: {e}"));
            }
        }
    };
    let finished = tokio::time::timeout_at(deadline, all_done).await.is_ok();
    let load_time = load_started.elapsed();
    if !finished {
        clients.abort_all();
        load.tally().error(format!(
            "--max-seconds ({} s) passed before the clients were done",
            args.max_seconds
        ));
    }
    let _ = stop.send(true);
    let swaps = match swapper {
        Some(handle) => Some(
            tokio::time::timeout(INSTRUCTION_WAIT, handle)
                .await
                .context("the swapper did not stop")??,
        ),
        None => None,
    };

    // Only a complete run has every seq accounted for.
    let checked = finished && load.tally().error_count == 0;
    let problems = if checked {
        match tokio::time::timeout_at(deadline, check_machines(&load, &client)).await {
            Ok(Ok(problems)) => problems,
            Ok(Err(e)) => vec![format!("checking the machines: {e}")],
            Err(_) => vec!["--max-seconds passed while checking the machines".to_owned()],
        }
    } else {
        vec!["not checked: the load did not complete".to_owned()]
    };

    let tally = std::mem::take(&mut *load.tally());
    let [ws, http] = tally.latencies;
    let done = ws.len() + http.len();
    print_latencies(Transport::WebSocket.label(), ws);
    print_latencies(Transport::Http.label(), http);
    println!(
        "  all        {done:>7} instructions in {:.1} s: {:.0} instructions/s",
        load_time.as_secs_f64(),
        done as f64 / load_time.as_secs_f64()
    );
    print_swaps(swaps.as_ref(), &health.backend);
    if problems.is_empty() {
        println!(
            "  order      ok: every machine's seqs are 0..n, each accepted once, its counters \
             add up, and every client saw its counters go up by one"
        );
    } else {
        for problem in &problems {
            println!("  order      {problem}");
        }
    }
    println!("  errors     {}", tally.error_count);
    for error in &tally.errors {
        println!("    {error}");
    }

    let deletes = load.machines.iter().map(|name| {
        let machine = client.machine(name);
        async move { machine.delete().await }
    });
    match tokio::time::timeout(CLEANUP_WAIT, futures::future::join_all(deletes)).await {
        Ok(deleted) => {
            if let Some(Err(e)) = deleted.into_iter().find(Result::is_err) {
                println!("  (a machine was not deleted: {e})");
            }
        }
        Err(_) => println!(
            "  (deleting the machines took more than {} s)",
            CLEANUP_WAIT.as_secs()
        ),
    }
    drop(server);
    println!(
        "  duration   {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    if !checked {
        bail!("{} errors (order not checked)", tally.error_count);
    }
    if !problems.is_empty() {
        bail!("{} order problems", problems.len());
    }
    Ok(())
}
