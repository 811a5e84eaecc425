//! UDP from a networked machine, other than DNS: each flow (the machine's port and the address
//! it sends to) is judged like a TCP connection, then relayed by the engine through a socket of
//! its own in the host's namespace, connected to that address only (so only it can answer).
//! Replies reach the machine from a socket in the gate bound to the address it sent to, which
//! also receives the flow's further datagrams. A flow ends after [`IDLE`] without a datagram
//! either way; flows count against the machine's connections.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::JoinSet;

use super::gate::{GateContext, more_note};
use super::judge::connection_refusal;
use super::netns::{gate_udp_socket, receive_diverted};

/// A flow without a datagram either way for this long is closed.
const IDLE: Duration = Duration::from_secs(60);
/// The largest UDP payload over IPv4.
const MAX_DATAGRAM: usize = 65_507;
/// Datagrams held for a flow while its sockets are being made (more are dropped, as UDP may).
const QUEUED_PER_FLOW: usize = 4;

/// A flow: the machine's socket and the address it sends to.
type FlowKey = (SocketAddrV4, SocketAddrV4);

/// Relays the machine's UDP flows until aborted (which ends them all).
pub(crate) async fn serve_udp(socket: UdpSocket, gate: OwnedFd, context: Arc<GateContext>) {
    let gate = Arc::new(gate);
    let mut flows: HashMap<FlowKey, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let mut running = JoinSet::new();
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    loop {
        let received = socket
            .async_io(Interest::READABLE, || {
                receive_diverted(&socket, &mut buffer)
            })
            .await;
        let (length, machine, destination) = match received {
            Ok(Some(datagram)) => datagram,
            Ok(None) => continue,
            Err(_) => {
                // Out of memory or descriptors: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while running.try_join_next().is_some() {}
        flows.retain(|_, queue| !queue.is_closed());
        let datagram = buffer[..length].to_vec();
        let key = (machine, destination);
        if let Some(queue) = flows.get(&key) {
            // A datagram that came before the flow's own socket in the gate was made.
            let _ = queue.try_send(datagram);
            continue;
        }
        if let Some(why) = connection_refusal(
            &context.judge,
            &context.policy,
            &context.remembered,
            (*destination.ip()).into(),
        ) {
            if let Some(more) = context.refusals_logged.allow() {
                tracing::info!(
                    machine = context.machine,
                    %destination,
                    "network: UDP refused: {why}{}",
                    more_note(more)
                );
            }
            continue;
        }
        let Ok(permit) = context.connections.clone().try_acquire_owned() else {
            tracing::debug!(
                machine = context.machine,
                "network: too many connections open"
            );
            continue;
        };
        let (queue, queued) = mpsc::channel(QUEUED_PER_FLOW);
        let _ = queue.try_send(datagram);
        flows.insert(key, queue);
        running.spawn(relay(
            machine,
            destination,
            queued,
            gate.clone(),
            context.clone(),
            permit,
        ));
    }
}

/// One flow, from its first datagram (in `queued`) until it has been idle for [`IDLE`].
async fn relay(
    machine: SocketAddrV4,
    destination: SocketAddrV4,
    mut queued: mpsc::Receiver<Vec<u8>>,
    gate: Arc<OwnedFd>,
    context: Arc<GateContext>,
    _permit: OwnedSemaphorePermit,
) {
    let outside = match UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).await {
        Ok(socket) => socket,
        Err(e) => {
            tracing::debug!(machine = context.machine, "network: UDP socket: {e}");
            return;
        }
    };
    if let Err(e) = outside.connect(SocketAddr::V4(destination)).await {
        tracing::debug!(machine = context.machine, %destination, "network: UDP: {e}");
        return;
    }
    let inside = match gate_udp_socket(&gate, destination, machine)
        .await
        .and_then(|socket| {
            UdpSocket::from_std(socket).map_err(|e| crate::error::Error::internal(e.to_string()))
        }) {
        Ok(socket) => socket,
        Err(e) => {
            tracing::debug!(machine = context.machine, %destination, "network: UDP: {e}");
            return;
        }
    };
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let idle = tokio::time::sleep(IDLE);
    tokio::pin!(idle);
    loop {
        // Send errors are dropped datagrams, as UDP allows; an error a receive reports (an ICMP
        // refusal from the destination, say) does not end the flow.
        tokio::select! {
            datagram = queued.recv() => {
                let Some(datagram) = datagram else { return };
                let _ = outside.send(&datagram).await;
            }
            ready = inside.readable() => {
                if ready.is_err() {
                    return;
                }
                if let Ok(length) = inside.try_recv(&mut buffer) {
                    let _ = outside.send(&buffer[..length]).await;
                }
            }
            ready = outside.readable() => {
                if ready.is_err() {
                    return;
                }
                if let Ok(length) = outside.try_recv(&mut buffer) {
                    let _ = inside.send(&buffer[..length]).await;
                }
            }
            () = &mut idle => return,
        }
        idle.as_mut().reset(tokio::time::Instant::now() + IDLE);
    }
}
