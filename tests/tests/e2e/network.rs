//! Machines' networks. The tests build their own little internet: a network namespace with an
//! echo server (TCP and UDP) on several addresses and a DNS server answering for `.test` names, reached from
//! the host through a veth pair; the engine is told to treat its public-looking block
//! (`198.18.0.0/24`) as public and to resolve names with its DNS server. First without a
//! sandbox (a machine network attached with a policy, the machine played by a thread inside the
//! sandbox's namespace: gVisor's netstack sends the same packets from there), then machines on
//! gVisor. Root only; CI runs as root and fails rather than skips.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use evervm::engine::network::{Cidr, Fabric, NetworkMode, NetworkPolicy, NetworkSettings};
use hickory_resolver::proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_resolver::proto::rr::rdata::A;
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};

const ECHO_PORT: u16 = 8080;
/// A package index on the public test host (`http://allowed.test:8081/simple/`).
const INDEX_PORT: u16 = 8081;
/// The little internet's block: part of the benchmarking range (RFC 2544), which is meant for
/// test networks, so that the routes the test adds on the host shadow nothing real (checked
/// first: the package registries of some hosts sit in documentation ranges).
const TEST_BLOCK: &str = "198.18.0.0/24";
const PUBLIC_HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const OTHER_HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
const PRIVATE_HOST: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const HOST_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

/// The little internet, made once per test binary and gone with it (its namespace is held by
/// this process only; the veth pair goes with the namespace).
struct Internet {
    _namespace: OwnedFd,
    /// A listener in the host's namespace, on every address: what a machine must never reach.
    host_listener_port: u16,
    /// The same over UDP (an echo).
    host_udp_port: u16,
}

/// Held by each test that makes networks: the namespace checks count what this process holds,
/// which another such test running at the same time would change.
static NETWORK_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn internet() -> Option<&'static Internet> {
    static INTERNET: OnceLock<Option<Internet>> = OnceLock::new();
    INTERNET
        .get_or_init(|| {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/sbin/nft").exists() {
                let why = "machines' networks need root and nft (apt-get install nftables)";
                assert!(
                    std::env::var_os("CI").is_none(),
                    "{why}: CI must run these tests"
                );
                eprintln!("skipping: {why}");
                return None;
            }
            if let Some(clash) = clash_with_the_host() {
                assert!(std::env::var_os("CI").is_none(), "{clash}");
                eprintln!("skipping: {clash}");
                return None;
            }
            Some(build_internet())
        })
        .as_ref()
}

/// Why the little internet's addresses would shadow something of the host's, if they would: a
/// route or address of the host in them, or a name the host resolves to one of them.
fn clash_with_the_host() -> Option<String> {
    let routes = Command::new("/usr/sbin/ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .ok()?;
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    let addresses = Command::new("/usr/sbin/ip")
        .args(["-4", "addr"])
        .output()
        .ok()?;
    let addresses = String::from_utf8_lossy(&addresses.stdout).into_owned();
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let private = PRIVATE_HOST.to_string();
    for (what, text) in [
        ("a route", &routes),
        ("an address", &addresses),
        ("/etc/hosts", &hosts),
    ] {
        if text.contains("198.18.") || text.contains(&private) {
            return Some(format!(
                "the test network {TEST_BLOCK} (and {private}) clashes with {what} of this host"
            ));
        }
    }
    None
}

fn build_internet() -> Internet {
    let host_ns = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
    let host_if = format!("evt{}", std::process::id() % 100_000);
    let pid = std::process::id();
    let host_fd = host_ns.as_raw_fd();
    let peer = host_if.clone();
    let (namespace, listener, dns, index, udp) = std::thread::spawn(move || {
        // SAFETY: unshare takes no pointers and moves only this (short-lived) thread.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        let namespace = OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net").unwrap());
        ip(&format!(
            "link set lo up\n\
             link add eth0 type veth peer name {peer} netns /proc/{pid}/fd/{host_fd}\n\
             addr add {PUBLIC_HOST}/24 dev eth0\n\
             addr add {OTHER_HOST}/24 dev eth0\n\
             addr add {PRIVATE_HOST}/24 dev eth0\n\
             link set eth0 up\n\
             route add default via {HOST_SIDE} dev eth0\n"
        ));
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, ECHO_PORT)).unwrap();
        let dns = UdpSocket::bind((PUBLIC_HOST, 53)).unwrap();
        let index = TcpListener::bind((PUBLIC_HOST, INDEX_PORT)).unwrap();
        // One UDP socket per address, so that each answers from the address it was sent to.
        let udp: Vec<UdpSocket> = [PUBLIC_HOST, OTHER_HOST, PRIVATE_HOST]
            .into_iter()
            .map(|address| UdpSocket::bind((address, ECHO_PORT)).unwrap())
            .collect();
        (namespace, listener, dns, index, udp)
    })
    .join()
    .unwrap();
    drop(host_ns);
    ip(&format!(
        "addr add {HOST_SIDE}/24 dev {host_if}\n\
         link set {host_if} up\n\
         route add {PRIVATE_HOST}/32 via {PUBLIC_HOST} dev {host_if}\n"
    ));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let local = stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let _ = stream.write_all(format!("hello from {local}").as_bytes());
        }
    });
    std::thread::spawn(move || serve_test_dns(&dns));
    for socket in udp {
        std::thread::spawn(move || udp_echo(&socket));
    }
    let mut routes = evervm_tests::package_index::Routes::default();
    let greeting = evervm_tests::package_index::wheel(
        "evervm-fetched",
        "1.0",
        "py3-none-any",
        &[],
        &[("evervm_fetched.py", b"WHERE = 'the index'\n".to_vec())],
    );
    evervm_tests::package_index::project(
        &mut routes,
        "evervm-fetched",
        vec![(greeting.0, greeting.1, None)],
    );
    evervm_tests::package_index::serve(index, routes, "allowed.test");
    let host_listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let host_listener_port = host_listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in host_listener.incoming().flatten() {
            let mut stream = stream;
            let _ = stream.write_all(b"the host itself");
        }
    });
    let host_udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let host_udp_port = host_udp.local_addr().unwrap().port();
    std::thread::spawn(move || udp_echo(&host_udp));
    Internet {
        _namespace: namespace,
        host_listener_port,
        host_udp_port,
    }
}

/// Answers each datagram with `udp echo from ADDRESS: WHAT IT SAID`.
fn udp_echo(socket: &UdpSocket) {
    let local = socket.local_addr().unwrap();
    let mut buffer = vec![0u8; 65_536];
    while let Ok((length, peer)) = socket.recv_from(&mut buffer) {
        let said = String::from_utf8_lossy(&buffer[..length]);
        let _ = socket.send_to(format!("udp echo from {local}: {said}").as_bytes(), peer);
    }
}

fn ip(batch: &str) {
    let mut child = Command::new("/usr/sbin/ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(batch.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "ip -batch failed:\n{batch}"
    );
}

/// The test names: `allowed.test` and `other.test` at public test hosts, `rebound.test` at a
/// private address.
fn serve_test_dns(socket: &UdpSocket) {
    let mut buffer = [0u8; 1500];
    while let Ok((length, peer)) = socket.recv_from(&mut buffer) {
        let Ok(request) = Message::from_vec(&buffer[..length]) else {
            continue;
        };
        let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
        reply.metadata.recursion_available = true;
        for query in &request.queries {
            reply.add_query(query.clone());
            let address = match query.name().to_ascii().as_str() {
                "allowed.test." => Some(PUBLIC_HOST),
                "other.test." => Some(OTHER_HOST),
                "rebound.test." => Some(PRIVATE_HOST),
                _ => None,
            };
            match (address, query.query_type()) {
                (Some(a), RecordType::A) => {
                    reply.add_answer(Record::from_rdata(query.name().clone(), 30, RData::A(A(a))));
                }
                (Some(_), _) => {}
                (None, _) => reply.metadata.response_code = ResponseCode::NXDomain,
            }
        }
        let _ = socket.send_to(&reply.to_vec().unwrap(), peer);
    }
}

/// How the engine reaches the little internet.
fn settings() -> NetworkSettings {
    NetworkSettings {
        dns_upstream: vec![SocketAddr::from((PUBLIC_HOST, 53))],
        also_public: vec![Cidr::parse(TEST_BLOCK).unwrap()],
        ..NetworkSettings::default()
    }
}

fn fabric() -> Fabric {
    Fabric::open(&settings()).unwrap()
}

/// What the machine sees.
#[derive(Debug, PartialEq)]
enum Reached {
    /// What the server said.
    Answer(String),
    /// Refused, reset or closed with nothing said.
    Refused,
}

/// Runs `f` on a thread inside the namespace at `path` (as the machine).
fn as_machine<T: Send + 'static>(path: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    as_machine_in(&std::fs::File::open(path).unwrap(), f)
}

fn connect(path: &Path, ip: Ipv4Addr, port: u16) -> Reached {
    as_machine(path, move || {
        let address = SocketAddr::from((ip, port));
        let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(5)) else {
            return Reached::Refused;
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let mut text = String::new();
        match stream.read_to_string(&mut text) {
            Ok(_) if !text.is_empty() => Reached::Answer(text),
            _ => Reached::Refused,
        }
    })
}

/// Sends each of `said` from one socket of the machine to `ip:port`, waiting for each answer:
/// what came back, or `Refused` for a datagram that got no answer.
fn udp(path: &Path, ip: Ipv4Addr, port: u16, said: &[&str]) -> Vec<Reached> {
    let said: Vec<String> = said.iter().map(|s| (*s).to_owned()).collect();
    as_machine(path, move || {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        socket.connect((ip, port)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut buffer = [0u8; 1500];
        said.iter()
            .map(|text| {
                socket.send(text.as_bytes()).unwrap();
                match socket.recv(&mut buffer) {
                    Ok(length) => {
                        Reached::Answer(String::from_utf8_lossy(&buffer[..length]).into_owned())
                    }
                    Err(_) => Reached::Refused,
                }
            })
            .collect()
    })
}

fn udp_answer(ip: Ipv4Addr, said: &str) -> Reached {
    Reached::Answer(format!("udp echo from {ip}:{ECHO_PORT}: {said}"))
}

fn resolve(path: &Path, name: &str) -> (ResponseCode, Vec<Ipv4Addr>) {
    let name = name.to_owned();
    as_machine(path, move || {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut query = Message::query();
        query.metadata.id = 4242;
        query.metadata.message_type = MessageType::Query;
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(
            Name::from_ascii(&name).unwrap(),
            RecordType::A,
        ));
        socket
            .send_to(&query.to_vec().unwrap(), (Ipv4Addr::new(10, 0, 2, 1), 53))
            .unwrap();
        let mut buffer = [0u8; 1500];
        let (length, _) = socket.recv_from(&mut buffer).expect("a DNS answer");
        let reply = Message::from_vec(&buffer[..length]).unwrap();
        assert_eq!(reply.metadata.id, 4242);
        let addresses = reply
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect();
        (reply.metadata.response_code, addresses)
    })
}

fn answer_from(ip: Ipv4Addr) -> Reached {
    Reached::Answer(format!("hello from {ip}:{ECHO_PORT}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_reaches_public_hosts_and_nothing_else() {
    let _one_at_a_time = NETWORK_TESTS.lock().await;
    let Some(internet) = internet() else { return };
    let fabric = fabric();
    let network = fabric
        .attach("m-public", &NetworkPolicy::Public)
        .await
        .unwrap();
    let path = network.netns_path().to_owned();
    let p = path.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        vec![
            ("public host", connect(&p, PUBLIC_HOST, ECHO_PORT)),
            ("private host", connect(&p, PRIVATE_HOST, ECHO_PORT)),
            (
                "metadata",
                connect(&p, Ipv4Addr::new(169, 254, 169, 254), 80),
            ),
            (
                "the host's address",
                connect(&p, HOST_SIDE, internet.host_listener_port),
            ),
            (
                "loopback",
                connect(&p, Ipv4Addr::LOCALHOST, internet.host_listener_port),
            ),
        ]
    })
    .await
    .unwrap();
    assert_eq!(
        outcome,
        vec![
            ("public host", answer_from(PUBLIC_HOST)),
            ("private host", Reached::Refused),
            ("metadata", Reached::Refused),
            ("the host's address", Reached::Refused),
            ("loopback", Reached::Refused),
        ]
    );
    let p = path.clone();
    let names = tokio::task::spawn_blocking(move || {
        [
            resolve(&p, "allowed.test"),
            resolve(&p, "rebound.test"),
            resolve(&p, "nowhere.test"),
        ]
    })
    .await
    .unwrap();
    assert_eq!(names[0], (ResponseCode::NoError, vec![PUBLIC_HOST]));
    assert_eq!(names[1], (ResponseCode::Refused, vec![]));
    assert_eq!(names[2], (ResponseCode::NXDomain, vec![]));

    // UDP: a flow to a public host, both ways and more than once (later datagrams go through the
    // flow's own socket), two flows at once; nothing from anywhere blocked.
    let p = path.clone();
    let host_udp_port = internet.host_udp_port;
    let datagrams = tokio::task::spawn_blocking(move || {
        let other = {
            let p = p.clone();
            std::thread::spawn(move || udp(&p, OTHER_HOST, ECHO_PORT, &["a", "b"]))
        };
        vec![
            (
                "public host",
                udp(&p, PUBLIC_HOST, ECHO_PORT, &["one", "two", "three"]),
            ),
            ("other host", other.join().unwrap()),
            ("private host", udp(&p, PRIVATE_HOST, ECHO_PORT, &["x"])),
            (
                "metadata",
                udp(&p, Ipv4Addr::new(169, 254, 169, 254), 80, &["x"]),
            ),
            (
                "the host's address",
                udp(&p, HOST_SIDE, host_udp_port, &["x"]),
            ),
            (
                "loopback",
                udp(&p, Ipv4Addr::LOCALHOST, host_udp_port, &["x"]),
            ),
        ]
    })
    .await
    .unwrap();
    assert_eq!(
        datagrams,
        vec![
            (
                "public host",
                vec![
                    udp_answer(PUBLIC_HOST, "one"),
                    udp_answer(PUBLIC_HOST, "two"),
                    udp_answer(PUBLIC_HOST, "three"),
                ]
            ),
            (
                "other host",
                vec![udp_answer(OTHER_HOST, "a"), udp_answer(OTHER_HOST, "b")]
            ),
            ("private host", vec![Reached::Refused]),
            ("metadata", vec![Reached::Refused]),
            ("the host's address", vec![Reached::Refused]),
            ("loopback", vec![Reached::Refused]),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_reaches_names_it_looked_up_and_blocks_it_lists() {
    let _one_at_a_time = NETWORK_TESTS.lock().await;
    if internet().is_none() {
        return;
    }
    let fabric = fabric();
    let policy = NetworkPolicy::new(
        NetworkMode::Allow,
        &["allowed.test", "rebound.test", "198.18.0.11/32"],
    )
    .unwrap();
    let network = fabric.attach("m-allow", &policy).await.unwrap();
    let p = network.netns_path().to_owned();
    let steps = tokio::task::spawn_blocking(move || {
        vec![
            // A literal address is not let through by a domain rule...
            (
                "literal before lookup",
                format!("{:?}", connect(&p, PUBLIC_HOST, ECHO_PORT)),
            ),
            (
                "lookup allowed",
                format!("{:?}", resolve(&p, "allowed.test")),
            ),
            // ...but the address the machine was given for an allowed name is.
            (
                "after lookup",
                format!("{:?}", connect(&p, PUBLIC_HOST, ECHO_PORT)),
            ),
            ("lookup other", format!("{:?}", resolve(&p, "other.test"))),
            // A block in the list lets its addresses through.
            (
                "listed block",
                format!("{:?}", connect(&p, OTHER_HOST, ECHO_PORT)),
            ),
            (
                "lookup rebound",
                format!("{:?}", resolve(&p, "rebound.test")),
            ),
            (
                "rebound address",
                format!("{:?}", connect(&p, PRIVATE_HOST, ECHO_PORT)),
            ),
            // UDP is judged the same way.
            (
                "udp to an allowed name",
                format!("{:?}", udp(&p, PUBLIC_HOST, ECHO_PORT, &["n"])),
            ),
            (
                "udp to a listed block",
                format!("{:?}", udp(&p, OTHER_HOST, ECHO_PORT, &["b"])),
            ),
            (
                "udp to a rebound address",
                format!("{:?}", udp(&p, PRIVATE_HOST, ECHO_PORT, &["r"])),
            ),
        ]
    })
    .await
    .unwrap();
    let expected = vec![
        ("literal before lookup", format!("{:?}", Reached::Refused)),
        (
            "lookup allowed",
            format!("{:?}", (ResponseCode::NoError, vec![PUBLIC_HOST])),
        ),
        ("after lookup", format!("{:?}", answer_from(PUBLIC_HOST))),
        (
            "lookup other",
            format!("{:?}", (ResponseCode::Refused, Vec::<Ipv4Addr>::new())),
        ),
        ("listed block", format!("{:?}", answer_from(OTHER_HOST))),
        (
            "lookup rebound",
            format!("{:?}", (ResponseCode::Refused, Vec::<Ipv4Addr>::new())),
        ),
        ("rebound address", format!("{:?}", Reached::Refused)),
        (
            "udp to an allowed name",
            format!("{:?}", vec![udp_answer(PUBLIC_HOST, "n")]),
        ),
        (
            "udp to a listed block",
            format!("{:?}", vec![udp_answer(OTHER_HOST, "b")]),
        ),
        (
            "udp to a rebound address",
            format!("{:?}", vec![Reached::Refused]),
        ),
    ];
    assert_eq!(steps, expected);
}

/// The inode naming a namespace (`net:[4026532801]`).
fn namespace_id(path: &Path) -> String {
    std::fs::read_link(path)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Every process's and thread's namespace and open descriptors that name `id`.
fn holders(id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return found;
    };
    for process in processes.flatten() {
        let base = process.path();
        if !process
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let mut links = vec![base.join("ns/net")];
        for dir in ["fd", "task"] {
            if let Ok(entries) = std::fs::read_dir(base.join(dir)) {
                for entry in entries.flatten() {
                    links.push(if dir == "task" {
                        entry.path().join("ns/net")
                    } else {
                        entry.path()
                    });
                }
            }
        }
        found.extend(
            links
                .into_iter()
                .filter(|l| std::fs::read_link(l).is_ok_and(|t| t.to_string_lossy() == id)),
        );
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_network_leaves_no_namespace_and_no_rule() {
    let _one_at_a_time = NETWORK_TESTS.lock().await;
    if internet().is_none() {
        return;
    }
    let fabric = fabric();
    let network = fabric
        .attach("m-gone", &NetworkPolicy::Public)
        .await
        .unwrap();
    let paths: Vec<PathBuf> = network
        .namespace_paths()
        .iter()
        .map(|p| p.to_path_buf())
        .collect();
    let ids: Vec<String> = paths.iter().map(|p| namespace_id(p)).collect();
    assert_ne!(ids[0], ids[1]);
    // Held by this test too, to look inside once the engine has let go (then released).
    let ours: Vec<std::fs::File> = paths
        .iter()
        .map(|p| std::fs::File::open(p).unwrap())
        .collect();
    let our_links: Vec<PathBuf> = ours
        .iter()
        .map(|f| Path::new("/proc/self/fd").join(f.as_raw_fd().to_string()))
        .map(|l| {
            std::fs::canonicalize(l.parent().unwrap())
                .unwrap()
                .join(l.file_name().unwrap())
        })
        .collect();
    network.close().await;
    let left: Vec<PathBuf> = ids
        .iter()
        .flat_map(|id| holders(id))
        .filter(|h| !our_links.contains(h))
        .collect();
    assert_eq!(
        left,
        Vec::<PathBuf>::new(),
        "still held after the network was closed"
    );
    // The gate's sockets (which hold its namespace without naming it) are closed too.
    let gate_sockets = as_machine_in(&ours[1], || {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let udp = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        // The proxy's port (15001), the DNS server's (15053) and the UDP relay's (15002), as
        // /proc/net lists them.
        tcp.contains(":3A99 ") || udp.contains(":3ACD ") || udp.contains(":3A9A ")
    });
    assert!(!gate_sockets, "the gate's sockets are still open");
    drop(ours);
    // The rules lived in the gate's namespace, now gone; the host's own ruleset has no table of
    // ours.
    let ruleset = Command::new("/usr/sbin/nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(ruleset.status.success());
    assert!(!String::from_utf8_lossy(&ruleset.stdout).contains("evervm"));
}

/// Runs `f` on a thread inside the namespace `namespace` names.
fn as_machine_in<T: Send + 'static>(
    namespace: &std::fs::File,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let namespace = namespace.try_clone().unwrap();
    std::thread::spawn(move || {
        // SAFETY: a valid descriptor for the call; only this thread moves.
        let entered = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(entered, 0);
        f()
    })
    .join()
    .unwrap()
}

#[tokio::test]
async fn a_machine_without_a_network_gets_none() {
    if internet().is_none() {
        return;
    }
    assert!(
        fabric()
            .attach("m-none", &NetworkPolicy::None)
            .await
            .is_err()
    );
}

// --- machines on gVisor ----------------------------------------------------------------------

/// What a machine's Python sees when it connects to `host:port` and reads: the server's words,
/// or the name of the error.
const FETCH: &str = r"import socket
def fetch(host, port=8080):
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            return s.recv(100).decode() or 'closed'
    except OSError as e:
        return type(e).__name__
def udp(host, port=8080, said=b'ping'):
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(3)
            s.sendto(said, (host, port))
            return s.recvfrom(100)[0].decode()
    except OSError as e:
        return type(e).__name__
def lookup(name):
    try:
        return sorted({a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET)})
    except OSError as e:
        return type(e).__name__
";

async fn machine_with(client: &evervm::Client, network: Option<NetworkPolicy>) -> evervm::Machine {
    let machine = client
        .create_machine(evervm::CreateMachineOptions {
            image: Some("minimal".to_owned()),
            network,
            ..evervm::CreateMachineOptions::default()
        })
        .await
        .unwrap();
    crate::value(&machine, FETCH).await;
    machine
}

/// The network namespaces this process holds (the engine's machines' among them).
fn namespaces_held() -> std::collections::BTreeSet<String> {
    let mut held = std::collections::BTreeSet::new();
    for dir in ["/proc/self/fd", "/proc/self/task"] {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let link = if dir.ends_with("task") {
                entry.path().join("ns/net")
            } else {
                entry.path()
            };
            if let Ok(target) = std::fs::read_link(link) {
                let target = target.to_string_lossy().into_owned();
                if target.starts_with("net:") {
                    held.insert(target);
                }
            }
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_reach_what_their_policy_allows_across_swap_and_fork() {
    let _one_at_a_time = NETWORK_TESTS.lock().await;
    let Some(internet) = internet() else { return };
    if !evervm_tests::backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut config = crate::gvisor_config(home.path());
    config.network = settings();
    let engine = evervm::engine::Engine::open(config).await.unwrap();
    let account = engine.ensure_account("local").await.unwrap();
    let client = evervm::Client::from_engine(engine.clone(), account);
    let before = namespaces_held();

    // No network: not even the gate.
    let none = machine_with(&client, None).await;
    assert_eq!(
        crate::value(&none, "fetch('198.18.0.10')").await,
        "'OSError'"
    );
    assert_eq!(
        none.info().await.unwrap().network,
        Some(NetworkPolicy::None)
    );

    let public = match client
        .create_machine(evervm::CreateMachineOptions {
            image: Some("minimal".to_owned()),
            network: Some(NetworkPolicy::Public),
            ..evervm::CreateMachineOptions::default()
        })
        .await
    {
        Ok(machine) => machine,
        // Debian's 2022 runsc cannot run a sandbox with a network on current kernels (the
        // engine finds out by trying, once): the second pass of CI runs on it.
        Err(e) if e.kind() == evervm::ErrorKind::Unsupported => {
            let on_debian_runsc = std::env::var_os("EVERVM_RUNSC").is_some();
            assert!(
                on_debian_runsc || std::env::var_os("CI").is_none(),
                "the engine's runsc must run machines with a network in CI: {e}"
            );
            eprintln!("skipping: this runsc gives machines no network ({e})");
            engine.shutdown().await;
            return;
        }
        Err(e) => panic!("{e}"),
    };
    crate::value(&public, FETCH).await;
    let host_port = internet.host_listener_port;
    let host_udp_port = internet.host_udp_port;
    let seen = format!(
        "[fetch('198.18.0.10'), fetch('10.99.0.10'), fetch('169.254.169.254', 80), \
         fetch('198.18.0.1', {host_port}), lookup('allowed.test'), lookup('rebound.test'), \
         udp('198.18.0.10'), udp('10.99.0.10'), udp('198.18.0.1', {host_udp_port})]"
    );
    let expected = "['hello from 198.18.0.10:8080', 'ConnectionResetError', \
        'ConnectionResetError', 'ConnectionResetError', ['198.18.0.10'], 'gaierror', \
        'udp echo from 198.18.0.10:8080: ping', 'TimeoutError', 'TimeoutError']";
    assert_eq!(crate::value(&public, &seen).await, expected);

    let policy = NetworkPolicy::new(NetworkMode::Allow, &["allowed.test"]).unwrap();
    let allow = machine_with(&client, Some(policy.clone())).await;
    let seen = "[fetch('198.18.0.10'), fetch('allowed.test'), fetch('198.18.0.11'), \
        lookup('other.test')]";
    let expected = "['ConnectionResetError', 'hello from 198.18.0.10:8080', \
        'ConnectionResetError', 'gaierror']";
    assert_eq!(crate::value(&allow, seen).await, expected);

    // pip in a machine whose policy reaches the index: into the user's site-packages,
    // importable at once.
    let pip = "import subprocess, sys\n\
        r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', \
        '--disable-pip-version-check', '--index-url', 'http://allowed.test:8081/simple/', '--trusted-host', 'allowed.test', \
        'evervm-fetched'], capture_output=True, text=True)\n\
        r.returncode, r.stdout.strip().splitlines()[-1:], r.stderr[-500:]";
    let installed = crate::value(&allow, pip).await;
    assert!(
        installed.starts_with("(0, ['Successfully installed evervm-fetched-1.0']"),
        "{installed}"
    );
    assert_eq!(
        crate::value(&allow, "import evervm_fetched; evervm_fetched.WHERE").await,
        "'the index'"
    );

    // After a swap the machine is restored into a new sandbox: its network comes back with the
    // same policy (open connections are closed).
    public.swap_out().await.unwrap();
    allow.swap_out().await.unwrap();
    assert_eq!(
        crate::value(
            &public,
            "[fetch('198.18.0.10'), fetch('10.99.0.10'), udp('198.18.0.10', said=b'back')]"
        )
        .await,
        "['hello from 198.18.0.10:8080', 'ConnectionResetError', \
         'udp echo from 198.18.0.10:8080: back']"
    );
    assert_eq!(crate::value(&allow, seen).await, expected);
    assert_eq!(allow.info().await.unwrap().network, Some(policy.clone()));

    // A fork has its parent's policy.
    let fork = allow.fork(None).await.unwrap();
    assert_eq!(crate::value(&fork, seen).await, expected);
    assert_eq!(fork.info().await.unwrap().network, Some(policy));
    assert_eq!(
        crate::value(&fork, "import evervm_fetched; evervm_fetched.WHERE").await,
        "'the index'"
    );

    // Deleting the machines releases their namespaces.
    for machine in [none, public, allow, fork] {
        machine.delete().await.unwrap();
    }
    // Deleting a machine stops its sandbox and closes its network before it returns.
    let left: Vec<String> = namespaces_held().difference(&before).cloned().collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "namespaces still held after delete"
    );
    engine.shutdown().await;
}
