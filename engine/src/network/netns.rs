//! The two network namespaces of a networked sandbox, the same for every machine:
//!
//! ```text
//!   sandbox namespace              gate namespace                  the host's namespace
//!   eth0 10.0.2.100/24  <-veth->   gw0 10.0.2.1/24
//!   (gVisor's netstack takes it)   nft: TCP -> :15001, DNS -> :15053
//!                                  the engine's sockets  ---------> the engine connects out
//! ```
//!
//! gVisor takes over every interface of the namespace it joins, so the veth's other end lives
//! in a namespace of its own, the gate, where the kernel redirects every TCP connection and DNS
//! query from the machine to sockets the engine holds. Nothing else leaves: the gate has no route
//! anywhere, does not forward, and drops everything not redirected. Every connection out is made
//! by the engine, from the host's namespace, after the machine's policy and the address
//! classifier have agreed. Nothing is added to the host's namespace (no interface, route or
//! rule), and both namespaces live only as long as the engine's handles on them (and runsc's), so
//! a machine deleted, crashed or left behind by a killed engine leaves nothing.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The machine's address, the same in every sandbox (so snapshots and forks restore anywhere).
pub(crate) const MACHINE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
/// The gate's address: the machine's default route and its DNS server.
pub(crate) const GATE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
const PROXY_PORT: u16 = 15001;
const DNS_PORT: u16 = 15053;

/// The gate's rules: TCP to anywhere and DNS over UDP go to the engine's sockets; the rest is
/// dropped (the namespace forwards nothing, and IPv6 is off in it).
const GATE_RULES: &str = "
table inet evervm {
    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        iifname \"gw0\" udp dport 53 redirect to :15053
        iifname \"gw0\" meta l4proto tcp redirect to :15001
    }
    chain input {
        type filter hook input priority filter; policy drop;
        iifname \"lo\" accept
        ct state established,related accept
        iifname \"gw0\" ct status dnat tcp dport 15001 accept
        iifname \"gw0\" ct status dnat udp dport 15053 accept
    }
    chain forward {
        type filter hook forward priority filter; policy drop;
    }
}
";

/// A sandbox's namespaces and the gate's sockets.
pub(crate) struct Namespaces {
    /// The namespace runsc joins.
    pub sandbox: OwnedFd,
    /// Held so that the gate outlives a moment with no socket in it.
    pub gate: OwnedFd,
    /// Where the machine's TCP connections arrive (their destination is the socket's original
    /// destination).
    pub proxy: TcpListener,
    /// Where the machine's DNS queries arrive.
    pub dns: UdpSocket,
}

impl Namespaces {
    /// A path to the sandbox's namespace that runsc can open while this lives.
    pub fn sandbox_path(&self) -> PathBuf {
        fd_path(&self.sandbox)
    }

    /// The same for the gate's namespace.
    pub fn gate_path(&self) -> PathBuf {
        fd_path(&self.gate)
    }
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    Path::new("/proc")
        .join(std::process::id().to_string())
        .join("fd")
        .join(fd.as_raw_fd().to_string())
}

/// The commands the namespaces are set up with, found once.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    ip: PathBuf,
    nft: PathBuf,
}

impl Tools {
    /// Finds `ip` and `nft`, or says how to install them.
    pub fn find() -> Result<Self> {
        let find = |name: &str| {
            ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                .iter()
                .map(|dir| Path::new(dir).join(name))
                .find(|p| p.is_file())
        };
        match (find("ip"), find("nft")) {
            (Some(ip), Some(nft)) => Ok(Self { ip, nft }),
            _ => Err(Error::unsupported(
                "machines with a network need the `ip` and `nft` commands: apt-get install \
                 iproute2 nftables",
            )),
        }
    }
}

/// Makes a sandbox's namespaces. Blocking (it runs `ip` and `nft`); on a thread of its own,
/// which ends in a namespace of its own and is never reused.
pub(crate) async fn create(tools: &Tools) -> Result<Namespaces> {
    let tools = tools.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("evervm-netns".to_owned())
        .spawn(move || {
            let _ = tx.send(create_on_this_thread(&tools));
        })
        .map_err(|e| Error::internal(format!("cannot start a thread: {e}")))?;
    rx.await
        .map_err(|_| Error::internal("the network set-up thread ended without an answer"))?
}

fn create_on_this_thread(tools: &Tools) -> Result<Namespaces> {
    let sandbox = new_namespace()?;
    let gate = new_namespace()?;
    run(
        &tools.ip,
        &["-batch", "-"],
        &format!(
            "link set lo up\n\
             link add gw0 type veth peer name eth0 netns /proc/{pid}/fd/{sandbox}\n\
             addr add {GATE_ADDRESS}/24 dev gw0\n\
             link set gw0 up\n",
            pid = std::process::id(),
            sandbox = sandbox.as_raw_fd(),
        ),
    )?;
    for knob in ["all", "default", "gw0"] {
        // Absent without IPv6 in the kernel: nothing to turn off then.
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1");
    }
    run(&tools.nft, &["-f", "-"], GATE_RULES)?;
    let proxy = TcpListener::bind(SocketAddrV4::new(GATE_ADDRESS, PROXY_PORT))
        .map_err(|e| Error::internal(format!("cannot listen in a machine's gate: {e}")))?;
    let dns = UdpSocket::bind(SocketAddrV4::new(GATE_ADDRESS, DNS_PORT))
        .map_err(|e| Error::internal(format!("cannot bind a machine's DNS socket: {e}")))?;
    for result in [proxy.set_nonblocking(true), dns.set_nonblocking(true)] {
        result.map_err(|e| Error::internal(format!("cannot set up a gate socket: {e}")))?;
    }
    enter(&sandbox)?;
    run(
        &tools.ip,
        &["-batch", "-"],
        &format!(
            "link set lo up\n\
             addr add {MACHINE_ADDRESS}/24 dev eth0\n\
             link set eth0 up\n\
             route add default via {GATE_ADDRESS} dev eth0\n"
        ),
    )?;
    Ok(Namespaces {
        sandbox,
        gate,
        proxy,
        dns,
    })
}

/// Moves this thread into a new network namespace; returns a handle on it.
fn new_namespace() -> Result<OwnedFd> {
    // SAFETY: unshare takes no pointers; it changes only this thread's namespace (the thread is
    // dedicated to this and ends afterwards).
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::unsupported(format!(
            "cannot create a network namespace ({e}): machines with a network need root (or \
             CAP_SYS_ADMIN)"
        )));
    }
    let file = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| Error::internal(format!("cannot open a new network namespace: {e}")))?;
    Ok(OwnedFd::from(file))
}

/// Moves this thread into `namespace`.
fn enter(namespace: &OwnedFd) -> Result<()> {
    // SAFETY: the descriptor is valid for the call (borrowed from an OwnedFd); setns only changes
    // this thread's namespace.
    if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::internal(format!(
            "cannot enter a machine's network namespace: {e}"
        )));
    }
    Ok(())
}

/// Runs `program args` with `input` on its stdin, in this thread's namespaces.
fn run(program: &Path, args: &[&str], input: &str) -> Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::internal(format!("cannot run {}: {e}", program.display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| Error::internal(format!("cannot write to {}: {e}", program.display())))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| Error::internal(format!("{} did not finish: {e}", program.display())))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "setting up a machine's network: {} failed ({}): {}",
            program.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
