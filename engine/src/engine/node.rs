//! This engine as one node of a cluster: several `evervm serve` sharing one PostgreSQL database
//! and one bucket. Each resident machine is owned by one node through a lease in the database,
//! renewed by this node's heartbeat; a node that cannot renew in time stops its sandboxes
//! before its leases can have expired (by its own monotonic clock, from the moment it sent the
//! last renewal that succeeded), so that no machine ever runs on two nodes at once. Requests
//! for a machine another node owns are forwarded to it by the server ([`Engine::owner_address`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chrono::Utc;

use super::{Engine, EngineInner};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{Lease, LeaseOutcome, NodeRecord};
use crate::sync::lock;

/// How this engine joins a cluster (`evervm serve --advertise URL [--node-id ID]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    /// Unique among the nodes sharing the database; the same across restarts of one node.
    pub id: String,
    /// Where the other nodes reach this one's API (`http://HOST:PORT`), to forward requests for
    /// the machines it runs.
    pub advertise: String,
    /// How long a lease holds without renewal (`EVERVM_LEASE_SECS`, default 10 s): the longest a
    /// dead node's machines wait before another node takes them. Renewed every quarter of it.
    pub lease_ttl: Duration,
}

impl NodeSettings {
    /// Checked settings: an id of letters, digits, `.`, `_` and `-` (at most 63), and an
    /// `http://` or `https://` address with a host.
    pub fn new(id: &str, advertise: &str) -> Result<Self> {
        let id_ok = !id.is_empty()
            && id.len() <= 63
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !id_ok {
            return Err(Error::invalid(format!(
                "the node id {id:?} must be 1 to 63 letters, digits, '.', '_' or '-'"
            )));
        }
        let advertise = advertise.trim_end_matches('/');
        let parsed = url::Url::parse(advertise).map_err(|e| {
            Error::invalid(format!(
                "--advertise {advertise:?} is not a URL ({e}): give where the other nodes reach \
                 this one, like http://10.0.0.5:8080"
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(Error::invalid(format!(
                "--advertise {advertise:?} must be an http:// or https:// address with a host"
            )));
        }
        let lease_ttl = std::env::var("EVERVM_LEASE_SECS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|s| *s >= 2)
            .map_or(Duration::from_secs(10), Duration::from_secs);
        Ok(Self {
            id: id.to_owned(),
            advertise: advertise.to_owned(),
            lease_ttl,
        })
    }

    /// Every how long the heartbeat renews this node's leases.
    fn heartbeat_every(&self) -> Duration {
        self.lease_ttl / 4
    }
}

/// This node's standing in the cluster.
pub(crate) struct Node {
    pub(crate) settings: NodeSettings,
    /// Until when (by this host's monotonic clock) every lease this node holds surely holds: the
    /// moment the last renewal that succeeded was sent, plus a lease's length.
    valid_until: Mutex<Instant>,
    /// The other nodes as last read, by id.
    peers: Mutex<HashMap<String, NodeRecord>>,
    /// How many leases the last heartbeat renewed.
    leases: AtomicUsize,
}

impl Node {
    pub(crate) fn new(settings: NodeSettings) -> Self {
        let valid_until = Instant::now() + settings.lease_ttl;
        Self {
            settings,
            valid_until: Mutex::new(valid_until),
            peers: Mutex::new(HashMap::new()),
            leases: AtomicUsize::new(0),
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.settings.id
    }

    /// How many leases the last heartbeat renewed.
    pub(crate) fn leases(&self) -> usize {
        self.leases.load(Ordering::Relaxed)
    }

    /// Whether this node's leases may have run out (or will within a heartbeat): then it must
    /// not run or save machines.
    fn fenced(&self) -> bool {
        Instant::now() + self.settings.heartbeat_every() >= *lock(&self.valid_until)
    }
}

/// The error for a machine another node runs.
pub(crate) fn owned_elsewhere(lease: &Lease) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "machine {} runs on node {} now (until {} at least): send its requests there, or \
             through any node's server, which forwards them",
            lease.machine,
            lease.owner,
            lease
                .until
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
    )
}

impl EngineInner {
    /// Takes the machine's lease for this node (nothing to do outside a cluster): `Ok(None)`
    /// outside a cluster, the lease when this node holds it, an error naming the owner when
    /// another node does.
    pub(crate) async fn take_lease(&self, machine: &str) -> Result<Option<Lease>> {
        let Some(node) = &self.node else {
            return Ok(None);
        };
        self.refuse_if_fenced()?;
        match self
            .store
            .take_lease(machine, node.id(), node.settings.lease_ttl)
            .await?
        {
            LeaseOutcome::Taken(lease) => Ok(Some(lease)),
            LeaseOutcome::Held(lease) => Err(owned_elsewhere(&lease)),
        }
    }

    /// Refuses to run machines while this node's leases may have run out (nothing to refuse
    /// outside a cluster).
    pub(crate) fn refuse_if_fenced(&self) -> Result<()> {
        match &self.node {
            Some(node) if node.fenced() => Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "node {} cannot reach the database to renew its leases, so it runs no \
                     machine now: try another node",
                    node.id()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Gives up a lease (logging a failure: it then runs out by itself).
    pub(crate) async fn release_lease(&self, lease: &Lease) {
        if let Err(e) = self.store.release_lease(lease).await {
            tracing::warn!(machine = lease.machine, "cannot give up the lease: {e}");
        }
    }
}

impl Engine {
    /// Joins the cluster: this node's earlier leases (from before a restart) are given up, it is
    /// registered, and its heartbeat starts.
    pub(super) async fn join_cluster(&self) -> Result<()> {
        let Some(node) = &self.inner.node else {
            return Ok(());
        };
        let given_up = self.inner.store.remove_node(node.id()).await?;
        if given_up > 0 {
            tracing::warn!(
                "node {} held {given_up} leases from before it restarted: given up",
                node.id()
            );
        }
        let sent = Instant::now();
        self.inner
            .store
            .register_node(node.id(), &node.settings.advertise)
            .await?;
        *lock(&node.valid_until) = sent + node.settings.lease_ttl;
        refresh_peers(&self.inner).await;
        tracing::info!(
            node = node.id(),
            advertise = node.settings.advertise,
            lease_secs = node.settings.lease_ttl.as_secs(),
            "joined the cluster"
        );
        tokio::spawn(heartbeat(Arc::downgrade(&self.inner)));
        Ok(())
    }

    /// Where to forward a request for `machine`: the address of the node that holds its lease,
    /// when that is another node and the lease has not run out; `None` to serve it here.
    pub async fn owner_address(&self, machine: &str) -> Result<Option<String>> {
        self.serving_address(machine, async || None).await
    }

    /// Where to send a request for `machine` whose clients call a node its home (the node they
    /// made it on): as [`Engine::owner_address`] while a node holds its lease; when none does,
    /// the address of the node `home` names (asked only then), if that is another node, alive
    /// now; `None` to serve it here.
    pub async fn serving_address(
        &self,
        machine: &str,
        home: impl AsyncFnOnce() -> Option<String>,
    ) -> Result<Option<String>> {
        let Some(node) = &self.inner.node else {
            return Ok(None);
        };
        // Served here without asking the database while this node holds the lease.
        let held_here = lock(&self.inner.machines)
            .get(machine)
            .is_some_and(|handle| handle.holds_lease());
        if held_here && !node.fenced() {
            return Ok(None);
        }
        let (peer, alive_only) = match self.inner.store.lease(machine).await? {
            Some(lease) if lease.until > Utc::now() => (lease.owner, false),
            _ => match home().await {
                Some(home) => (home, true),
                None => return Ok(None),
            },
        };
        if peer == node.id() {
            return Ok(None);
        }
        let ttl = chrono::Duration::from_std(node.settings.lease_ttl)
            .map_err(|e| Error::internal(format!("a lease's length: {e}")))?;
        let address = |peers: &HashMap<String, NodeRecord>| {
            peers
                .get(&peer)
                .filter(|n| !alive_only || n.heartbeat_at + ttl > Utc::now())
                .map(|n| n.address.clone())
        };
        if let Some(address) = address(&lock(&node.peers)) {
            return Ok(Some(address));
        }
        refresh_peers(&self.inner).await;
        Ok(address(&lock(&node.peers)))
    }

    /// This node's id, in a cluster.
    pub fn node_id(&self) -> Option<&str> {
        self.inner.node.as_ref().map(Node::id)
    }

    /// The nodes sharing this engine's database (none outside a cluster), with whether each
    /// renewed its leases within one lease's length.
    pub async fn nodes(&self) -> Result<Vec<(NodeRecord, bool)>> {
        let Some(node) = &self.inner.node else {
            return Ok(Vec::new());
        };
        let ttl = chrono::Duration::from_std(node.settings.lease_ttl)
            .map_err(|e| Error::internal(format!("a lease's length: {e}")))?;
        let now = Utc::now();
        Ok(self
            .inner
            .store
            .nodes()
            .await?
            .into_iter()
            .map(|n| {
                let alive = n.heartbeat_at + ttl > now;
                (n, alive)
            })
            .collect())
    }

    /// Leaves the cluster at shutdown (after the machines were saved): its leases go.
    pub(super) async fn leave_cluster(&self) {
        if let Some(node) = &self.inner.node
            && let Err(e) = self.inner.store.remove_node(node.id()).await
        {
            tracing::warn!("cannot leave the cluster cleanly (its leases run out): {e}");
        }
    }
}

async fn refresh_peers(engine: &EngineInner) {
    let Some(node) = &engine.node else {
        return;
    };
    match engine.store.nodes().await {
        Ok(nodes) => {
            *lock(&node.peers) = nodes.into_iter().map(|n| (n.id.clone(), n)).collect();
        }
        Err(e) => tracing::warn!("cannot read the cluster's nodes: {e}"),
    }
}

/// Renews this node's leases every quarter of a lease's length while the engine lives; stops
/// the machines when the leases may run out (the database out of reach), and registers the node
/// again when the others took it for dead. Nodes silent for three leases' lengths are removed
/// (their leases ran out long ago).
async fn heartbeat(engine: Weak<EngineInner>) {
    let every = match engine.upgrade() {
        Some(inner) => match &inner.node {
            Some(node) => node.settings.heartbeat_every(),
            None => return,
        },
        None => return,
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = engine.upgrade() else {
            return;
        };
        if inner.closing() {
            return;
        }
        let Some(node) = &inner.node else {
            return;
        };
        let sent = Instant::now();
        let renewed = tokio::time::timeout(
            node.settings.lease_ttl / 2,
            inner.store.heartbeat(node.id(), node.settings.lease_ttl),
        )
        .await;
        match renewed {
            Ok(Ok(count)) => {
                *lock(&node.valid_until) = sent + node.settings.lease_ttl;
                node.leases.store(count, Ordering::Relaxed);
                refresh_peers(&inner).await;
                remove_dead_nodes(&inner, node).await;
            }
            Ok(Err(e)) if e.kind() == ErrorKind::Conflict => {
                tracing::error!("{e}");
                fence(&inner, "the other nodes took this one for dead").await;
                let sent = Instant::now();
                match inner
                    .store
                    .register_node(node.id(), &node.settings.advertise)
                    .await
                {
                    Ok(()) => *lock(&node.valid_until) = sent + node.settings.lease_ttl,
                    Err(e) => tracing::warn!("cannot register this node again: {e}"),
                }
            }
            Ok(Err(e)) => tracing::warn!("cannot renew this node's leases: {e}"),
            Err(_) => tracing::warn!("renewing this node's leases did not answer in time"),
        }
        if node.fenced() {
            fence(&inner, "it could not renew its leases in time").await;
        }
    }
}

/// Removes nodes whose heartbeat is older than three leases' lengths.
async fn remove_dead_nodes(engine: &EngineInner, node: &Node) {
    let Ok(silence) = chrono::Duration::from_std(node.settings.lease_ttl * 3) else {
        return;
    };
    let dead: Vec<String> = lock(&node.peers)
        .values()
        .filter(|n| n.id != node.id() && n.heartbeat_at + silence < Utc::now())
        .map(|n| n.id.clone())
        .collect();
    for id in dead {
        match engine.store.remove_node(&id).await {
            Ok(_) => tracing::warn!("removed node {id}: silent for {} s", silence.num_seconds()),
            Err(e) => tracing::debug!("cannot remove node {id}: {e}"),
        }
    }
}

/// Stops every machine this node runs, without saving (its leases may be another node's by
/// now): their handles go, and the next request for one finds where it runs then.
async fn fence(engine: &EngineInner, why: &str) {
    let handles: Vec<_> = lock(&engine.machines)
        .drain()
        .map(|(_, handle)| handle)
        .collect();
    let resident = handles.iter().filter(|h| h.resident()).count();
    if resident > 0 {
        tracing::error!(
            "stopping the {resident} machines this node runs, unsaved: {why} (they come back \
             from their last snapshots wherever they are used next)"
        );
    }
    for handle in handles {
        handle.stop().await;
    }
}
