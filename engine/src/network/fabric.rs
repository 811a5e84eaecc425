//! The engine's side of machines' networks: one [`Fabric`] per engine (the resolver, the judge,
//! the commands), one [`MachineNetwork`] per running networked sandbox.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ProtocolConfig, ResolveHosts,
    ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use tokio::sync::Semaphore;

use super::address::Cidr;
use super::gate::{GateContext, serve_dns, serve_proxy};
use super::judge::{Judge, Remembered};
use super::netns::{self, Tools};
use super::policy::NetworkPolicy;
use super::udp::serve_udp;
use crate::error::{Error, Result};

/// Connections (TCP connections and UDP flows) one machine may have open at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// How machines' networks are made.
#[derive(Debug, Clone)]
pub struct NetworkSettings {
    /// The DNS servers machines' names are looked up with (`EVERVM_DNS_UPSTREAM`, `IP[:PORT]`
    /// separated by commas); the host's (`/etc/resolv.conf`) when empty.
    pub dns_upstream: Vec<SocketAddr>,
    /// Address blocks machines may reach as if they were public (`EVERVM_NETWORK_ALSO_PUBLIC`):
    /// for a test network or a private service the operator chooses to expose. Never the host's
    /// own addresses.
    pub also_public: Vec<Cidr>,
    /// Connections (TCP connections and UDP flows) one machine may have open at once.
    pub max_connections: usize,
}

impl NetworkSettings {
    /// From `EVERVM_DNS_UPSTREAM`, `EVERVM_NETWORK_ALSO_PUBLIC` and
    /// `EVERVM_NETWORK_MAX_CONNECTIONS`; what cannot be read is left out, with a warning.
    pub fn from_env() -> Self {
        let list = |key: &str| {
            std::env::var(key)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let dns_upstream = list("EVERVM_DNS_UPSTREAM")
            .into_iter()
            .filter_map(|item| {
                let parsed = item.parse::<SocketAddr>().ok().or_else(|| {
                    item.parse::<std::net::IpAddr>()
                        .ok()
                        .map(|ip| SocketAddr::new(ip, 53))
                });
                if parsed.is_none() {
                    tracing::warn!("EVERVM_DNS_UPSTREAM: ignoring {item:?} (IP or IP:PORT)");
                }
                parsed
            })
            .collect();
        let also_public = list("EVERVM_NETWORK_ALSO_PUBLIC")
            .into_iter()
            .filter_map(|item| match Cidr::parse(&item) {
                Ok(block) => Some(block),
                Err(e) => {
                    tracing::warn!("EVERVM_NETWORK_ALSO_PUBLIC: ignoring {e}");
                    None
                }
            })
            .collect();
        let max_connections = std::env::var("EVERVM_NETWORK_MAX_CONNECTIONS")
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS);
        Self {
            dns_upstream,
            also_public,
            max_connections,
        }
    }
}

impl Default for NetworkSettings {
    fn default() -> Self {
        Self {
            dns_upstream: Vec::new(),
            also_public: Vec::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// What every networked machine of an engine shares.
pub struct Fabric {
    tools: Tools,
    judge: Arc<Judge>,
    resolver: Arc<TokioResolver>,
    max_connections: usize,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric").finish_non_exhaustive()
    }
}

impl Fabric {
    /// Checks that this host can give machines a network (the commands are there) and sets up
    /// the resolver. Making a machine's namespaces also needs root, which the first machine
    /// finds out.
    pub fn open(settings: &NetworkSettings) -> Result<Self> {
        let tools = Tools::find()?;
        let mut builder = if settings.dns_upstream.is_empty() {
            TokioResolver::builder_tokio().map_err(|e| {
                Error::unsupported(format!(
                    "machines' DNS: cannot read the host's resolver configuration ({e}); set \
                     EVERVM_DNS_UPSTREAM to the DNS servers to use"
                ))
            })?
        } else {
            let servers = settings
                .dns_upstream
                .iter()
                .map(|server| {
                    let connection = |protocol| {
                        let mut c = ConnectionConfig::new(protocol);
                        c.port = server.port();
                        c
                    };
                    NameServerConfig::new(
                        server.ip(),
                        true,
                        vec![
                            connection(ProtocolConfig::Udp),
                            connection(ProtocolConfig::Tcp),
                        ],
                    )
                })
                .collect();
            TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                TokioRuntimeProvider::default(),
            )
        };
        let options = builder.options_mut();
        options.ip_strategy = LookupIpStrategy::Ipv4Only;
        // The host's /etc/hosts is the host's business, not the machines'.
        options.use_hosts_file = ResolveHosts::Never;
        options.timeout = std::time::Duration::from_secs(4);
        options.attempts = 2;
        options.cache_size = 4096;
        let resolver = builder
            .build()
            .map_err(|e| Error::internal(format!("machines' DNS resolver: {e}")))?;
        Ok(Self {
            tools,
            judge: Arc::new(Judge::new(settings.also_public.clone())),
            resolver: Arc::new(resolver),
            max_connections: settings.max_connections.max(1),
        })
    }

    /// A network for one sandbox of `machine`, with `policy`: its namespaces, proxy, DNS and UDP
    /// relay.
    /// Everything goes when it is dropped.
    pub async fn attach(&self, machine: &str, policy: &NetworkPolicy) -> Result<MachineNetwork> {
        if !policy.is_networked() {
            return Err(Error::internal("a network for a machine without one"));
        }
        let namespaces = netns::create(&self.tools).await?;
        let netns_path = namespaces.sandbox_path();
        let gate_path = namespaces.gate_path();
        let proxy = tokio::net::TcpListener::from_std(namespaces.proxy)
            .map_err(|e| Error::internal(format!("machine's proxy socket: {e}")))?;
        let dns = tokio::net::UdpSocket::from_std(namespaces.dns)
            .map_err(|e| Error::internal(format!("machine's DNS socket: {e}")))?;
        let udp = tokio::net::UdpSocket::from_std(namespaces.udp)
            .map_err(|e| Error::internal(format!("machine's UDP socket: {e}")))?;
        let gate = namespaces
            .gate
            .try_clone()
            .map_err(|e| Error::internal(format!("cannot hold a machine's gate: {e}")))?;
        let context = Arc::new(GateContext {
            machine: machine.to_owned(),
            policy: policy.clone(),
            judge: self.judge.clone(),
            resolver: self.resolver.clone(),
            remembered: Remembered::default(),
            connections: Arc::new(Semaphore::new(self.max_connections)),
            refusals_logged: super::gate::Throttle::default(),
        });
        let tasks = vec![
            tokio::spawn(serve_proxy(proxy, context.clone())),
            tokio::spawn(serve_dns(dns, context.clone())),
            tokio::spawn(serve_udp(udp, gate, context)),
        ];
        Ok(MachineNetwork {
            _sandbox_ns: namespaces.sandbox,
            _gate_ns: namespaces.gate,
            netns_path,
            gate_path,
            tasks,
        })
    }
}

/// A running sandbox's network. Dropping it closes the machine's connections and releases its
/// namespaces (once runsc, which holds the sandbox's, has exited too).
pub struct MachineNetwork {
    _sandbox_ns: std::os::fd::OwnedFd,
    _gate_ns: std::os::fd::OwnedFd,
    netns_path: PathBuf,
    gate_path: PathBuf,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl MachineNetwork {
    /// The network namespace the sandbox runs in (a path runsc opens while this lives).
    pub fn netns_path(&self) -> &std::path::Path {
        &self.netns_path
    }

    /// Closes the machine's connections and sockets and releases its namespaces, returning once
    /// they are (dropping it does the same, without waiting).
    pub async fn close(mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Both namespaces of the sandbox (its own, then its gate's), as paths that name them while
    /// this lives: for checks that they go when it does.
    pub fn namespace_paths(&self) -> [&std::path::Path; 2] {
        [&self.netns_path, &self.gate_path]
    }

    /// The nameserver line for the sandbox's `/etc/resolv.conf`.
    pub fn resolv_conf() -> String {
        format!(
            "nameserver {}\noptions attempts:2 timeout:3\n",
            netns::GATE_ADDRESS
        )
    }
}

impl Drop for MachineNetwork {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
