//! The two network namespaces of a networked sandbox, the same for every machine:
//!
//! ```text
//!   sandbox namespace              gate namespace                  the host's namespace
//!   eth0 10.0.2.100/24  <-veth->   gw0 10.0.2.1/24
//!   (gVisor's netstack takes it)   nft: TCP -> :15001, DNS -> :15053,
//!                                       other UDP -> :15002 (tproxy)
//!                                  the engine's sockets  ---------> the engine connects out
//! ```
//!
//! gVisor takes over every interface of the namespace it joins, so the veth's other end lives
//! in a namespace of its own, the gate, where the kernel redirects every TCP connection, DNS
//! query and other UDP datagram from the machine to sockets the engine holds. UDP goes through
//! the kernel's transparent proxying (which keeps each datagram's destination, as NAT would not),
//! and the engine answers a flow from a socket bound to the address the machine sent to. Nothing
//! else leaves: the gate has no route anywhere, does not forward, and drops everything not
//! redirected. Every connection out is made
//! by the engine, from the host's namespace, after the machine's policy and the address
//! classifier have agreed. Nothing is added to the host's namespace (no interface, route or
//! rule), and both namespaces live only as long as the engine's handles on them (and runsc's), so
//! a machine deleted, crashed or left behind by a killed engine leaves nothing.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The machine's address, the same in every sandbox (so snapshots and forks restore anywhere).
pub(crate) const MACHINE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
/// The gate's address: the machine's default route and its DNS server.
pub(crate) const GATE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
const PROXY_PORT: u16 = 15001;
const DNS_PORT: u16 = 15053;
const UDP_PORT: u16 = 15002;
/// The mark of datagrams diverted to the engine, and the routing table that delivers them
/// locally whatever their destination.
const DIVERTED_MARK: u32 = 1;
const DIVERTED_TABLE: u32 = 100;

/// The gate's rules: TCP to anywhere and DNS over UDP go to the engine's sockets, other UDP is
/// diverted (with its destination kept) to the engine's UDP socket; the rest is dropped (the
/// namespace forwards nothing, and IPv6 is off in it).
fn gate_rules() -> String {
    format!(
        "table inet evervm {{
    chain divert {{
        type filter hook prerouting priority mangle; policy accept;
        iifname \"gw0\" udp dport != 53 meta mark set {DIVERTED_MARK} \
            tproxy ip to {GATE_ADDRESS}:{UDP_PORT} accept
    }}
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname \"gw0\" udp dport 53 redirect to :{DNS_PORT}
        iifname \"gw0\" meta l4proto tcp redirect to :{PROXY_PORT}
    }}
    chain input {{
        type filter hook input priority filter; policy drop;
        iifname \"lo\" accept
        ct state established,related accept
        iifname \"gw0\" ct status dnat tcp dport {PROXY_PORT} accept
        iifname \"gw0\" ct status dnat udp dport {DNS_PORT} accept
        iifname \"gw0\" meta mark {DIVERTED_MARK} meta l4proto udp accept
    }}
    chain forward {{
        type filter hook forward priority filter; policy drop;
    }}
}}
"
    )
}

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
    /// Where the machine's other UDP datagrams arrive, until a flow has a socket of its own
    /// (each with its destination, see [`receive_diverted`]).
    pub udp: UdpSocket,
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
             link set gw0 up\n\
             rule add fwmark {DIVERTED_MARK} lookup {DIVERTED_TABLE}\n\
             route add local 0.0.0.0/0 dev lo table {DIVERTED_TABLE}\n",
            pid = std::process::id(),
            sandbox = sandbox.as_raw_fd(),
        ),
    )?;
    for knob in ["all", "default", "gw0"] {
        // Absent without IPv6 in the kernel: nothing to turn off then.
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1");
    }
    run(&tools.nft, &["-f", "-"], &gate_rules())?;
    let proxy = TcpListener::bind(SocketAddrV4::new(GATE_ADDRESS, PROXY_PORT))
        .map_err(|e| Error::internal(format!("cannot listen in a machine's gate: {e}")))?;
    let dns = UdpSocket::bind(SocketAddrV4::new(GATE_ADDRESS, DNS_PORT))
        .map_err(|e| Error::internal(format!("cannot bind a machine's DNS socket: {e}")))?;
    let udp = transparent_udp(SocketAddrV4::new(GATE_ADDRESS, UDP_PORT), None)
        .and_then(|socket| {
            set_option(&socket, libc::IP_RECVORIGDSTADDR)?;
            Ok(socket)
        })
        .map_err(|e| Error::internal(format!("cannot bind a machine's UDP socket: {e}")))?;
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
        udp,
    })
}

/// A UDP socket in the gate `gate` names, bound to `local` (any address: the destination a
/// machine sent to, which replies must come from) and connected to `peer` (the machine's
/// socket), non-blocking. The kernel then hands it the flow's further datagrams.
pub(crate) async fn gate_udp_socket(
    gate: &OwnedFd,
    local: SocketAddrV4,
    peer: SocketAddrV4,
) -> Result<UdpSocket> {
    let gate = gate
        .try_clone()
        .map_err(|e| Error::internal(format!("cannot hold a machine's gate: {e}")))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A socket belongs to the namespace of the thread that makes it: a thread of its own, which
    // enters the gate and ends.
    std::thread::Builder::new()
        .name("evervm-gate".to_owned())
        .spawn(move || {
            let made = enter(&gate).and_then(|()| {
                transparent_udp(local, Some(peer)).map_err(|e| {
                    Error::internal(format!("cannot answer a machine's UDP flow: {e}"))
                })
            });
            let _ = tx.send(made);
        })
        .map_err(|e| Error::internal(format!("cannot start a thread: {e}")))?;
    rx.await
        .map_err(|_| Error::internal("the gate's thread ended without an answer"))?
}

/// A non-blocking UDP socket that may use any address (IP_TRANSPARENT), bound to `local` and
/// connected to `peer` if given. Several may share an address and port (each connected to
/// another peer).
fn transparent_udp(local: SocketAddrV4, peer: Option<SocketAddrV4>) -> std::io::Result<UdpSocket> {
    // SAFETY: socket takes no pointers; a descriptor it returns is owned from here on.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket and is owned by nothing else.
    let socket = UdpSocket::from(unsafe { OwnedFd::from_raw_fd(fd) });
    set_option(&socket, libc::IP_TRANSPARENT)?;
    // SAFETY: an int option of the right size, on the socket's own descriptor.
    let reuse = unsafe {
        let on: libc::c_int = 1;
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&raw const on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if reuse != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // std binds and connects only sockets it makes itself, hence the raw calls.
    let address = |a: SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let bound = address(local);
    // SAFETY: `bound` is a sockaddr_in of `length` bytes, alive for the call.
    if unsafe { libc::bind(socket.as_raw_fd(), (&raw const bound).cast(), length) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if let Some(peer) = peer {
        let peer = address(peer);
        // SAFETY: as for bind.
        if unsafe { libc::connect(socket.as_raw_fd(), (&raw const peer).cast(), length) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(socket)
}

/// Turns on the IP-level int option `option` of `socket`.
fn set_option(socket: &UdpSocket, option: libc::c_int) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: an int option of the right size, on the socket's own descriptor.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_IP,
            option,
            (&raw const on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One diverted datagram from `socket` (the gate's UDP socket) into `buffer`: its length, who
/// sent it and where it was going. `None` for what is not a whole IPv4 datagram with its
/// destination (truncated, or without the kernel's note of where it was going).
pub(crate) fn receive_diverted(
    socket: &impl AsRawFd,
    buffer: &mut [u8],
) -> std::io::Result<Option<(usize, SocketAddrV4, SocketAddrV4)>> {
    // SAFETY: sockaddr_in is plain data; all zeroes is a valid value.
    let mut source: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    // Room for one IP_ORIGDSTADDR message (a sockaddr_in), aligned as cmsghdr needs.
    let mut control = [0u64; 8];
    let mut data = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is a valid (empty) value.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_name = (&raw mut source).cast();
    message.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    message.msg_iov = &raw mut data;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: every pointer in `message` points to memory of the length given beside it, alive
    // and not otherwise borrowed for the call; recvmsg writes within those lengths.
    let received = unsafe { libc::recvmsg(socket.as_raw_fd(), &raw mut message, 0) };
    let Ok(length) = usize::try_from(received) else {
        return Err(std::io::Error::last_os_error());
    };
    if message.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0
        || message.msg_namelen as usize != std::mem::size_of::<libc::sockaddr_in>()
        || i32::from(source.sin_family) != libc::AF_INET
    {
        return Ok(None);
    }
    let mut destination = None;
    // SAFETY: the control buffer was filled by recvmsg and `message` describes it; the CMSG
    // macros walk only within msg_controllen, and a header's data is read only when its length
    // covers a whole sockaddr_in (read unaligned, as the buffer promises no alignment for it).
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&raw const message);
        while !header.is_null() {
            let wanted = libc::CMSG_LEN(std::mem::size_of::<libc::sockaddr_in>() as u32) as usize;
            if (*header).cmsg_level == libc::SOL_IP
                && (*header).cmsg_type == libc::IP_ORIGDSTADDR
                && (*header).cmsg_len as usize >= wanted
            {
                let original =
                    std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::sockaddr_in>());
                if i32::from(original.sin_family) == libc::AF_INET {
                    destination = Some(socket_address(&original));
                }
            }
            header = libc::CMSG_NXTHDR(&raw const message, header);
        }
    }
    Ok(destination.map(|destination| (length, socket_address(&source), destination)))
}

fn socket_address(address: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(address.sin_addr.s_addr.to_ne_bytes()),
        u16::from_be(address.sin_port),
    )
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
