//! Ports: connections from the host to servers listening inside a machine (E2B's
//! `get_host(port)`), carried by the agent as tunnels (`guest/tunnels.rs`). Opening one brings a
//! swapped-out machine back, like starting a process; an open one keeps the machine resident.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;

use super::MachineHandle;
use super::processes::{Broken, ProcessOp};
use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::guest::tunnels::{PortStream, TunnelFailure};
use crate::pool::Resident;

/// How long an opening waits for the agent: longer than its own tries at a server still
/// starting; an agent that says nothing predates tunnels.
const OPEN_WAIT: Duration = Duration::from_secs(10);

/// A tunnel asked for, and the agent's answer to come.
pub(crate) struct Opening {
    stream: PortStream,
    opened: oneshot::Receiver<std::result::Result<(), TunnelFailure>>,
}

impl MachineHandle {
    /// Connects to `port` on the machine's loopback, once something listens there.
    pub(crate) async fn connect_port(self: &Arc<Self>, port: u16) -> Result<PortStream> {
        if port == 0 {
            return Err(Error::invalid("a port is a number from 1 to 65535"));
        }
        let Opening { stream, opened } = self
            .process_op(|reply| ProcessOp::OpenPort { port, reply })
            .await?;
        match tokio::time::timeout(OPEN_WAIT, opened).await {
            Ok(Ok(Ok(()))) => Ok(stream),
            Ok(Ok(Err(TunnelFailure::Refused(why)))) => {
                Err(Error::port_not_open(self.name.as_str(), port, &why))
            }
            Ok(Ok(Err(TunnelFailure::Limit(why)))) => Err(Error::limit_exceeded(why)),
            Ok(Ok(Err(TunnelFailure::Invalid(why)))) => Err(Error::crashed(format!(
                "the connection to port {port} did not open: {why}"
            ))),
            Ok(Err(_)) => Err(Error::crashed("the machine stopped")),
            Err(_) => Err(Error::crashed(format!(
                "machine {} did not open port {port} within {} s: its agent may predate ports \
                 (a machine made or last restarted by an older evervm); restart its interpreter",
                self.name,
                OPEN_WAIT.as_secs()
            ))),
        }
    }
}

/// Asks the machine's agent for a tunnel to `port`. `Err`: the channel broke, and the opening
/// comes back to be tried on a new sandbox.
pub(super) async fn open(
    engine: &EngineInner,
    machine: &MachineHandle,
    current: &mut Resident,
    port: u16,
    reply: oneshot::Sender<Result<Opening>>,
) -> std::result::Result<(), Broken> {
    let router = Arc::clone(current.agent.tunnels());
    if router.is_closed() {
        return Err(Broken {
            error: Error::crashed("the machine's sandbox had stopped"),
            retry: Some(ProcessOp::OpenPort { port, reply }),
        });
    }
    // What a server does for a connection is the machine's state changing.
    machine.mark_unsaved(engine).await;
    let id = machine.next_process_id.fetch_add(1, Ordering::SeqCst);
    let (stream, opened) = router.register(id);
    match current.agent.open_tunnel(id, port).await {
        Ok(()) => {
            let _ = reply.send(Ok(Opening { stream, opened }));
            Ok(())
        }
        Err(error) => Err(Broken {
            error,
            retry: Some(ProcessOp::OpenPort { port, reply }),
        }),
    }
}

/// Resolves when a tunnel of the resident sandbox has work for the machine's task (never, with
/// none resident).
pub(super) fn kicked(
    resident: Option<&Resident>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let router = resident.map(|r| Arc::clone(r.agent.tunnels()));
    async move {
        match router {
            Some(router) => router.kicked().await,
            None => std::future::pending().await,
        }
    }
}
