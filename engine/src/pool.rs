//! Ready sandboxes: started ahead of time per image and memory size, so that a new machine does
//! not pay the cold start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::engine::EngineInner;
use crate::error::{Error, Result};
use crate::guest::connection::AgentConnection;
use crate::guest::image::Profile;
use crate::machine::lock;
use crate::sandbox::{Sandbox, SandboxSpec};

/// A running sandbox with its agent ready.
pub(crate) struct Resident {
    pub sandbox: Box<dyn Sandbox>,
    pub agent: AgentConnection,
}

impl Resident {
    /// Stops the sandbox; returns why it had ended, if it had.
    pub async fn kill(mut self) -> Option<String> {
        let reason = self.sandbox.exit_reason();
        let _ = self.sandbox.kill().await;
        reason.or_else(|| self.sandbox.exit_reason())
    }
}

/// The pool's key: sandboxes are interchangeable when these match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub profile: Profile,
    pub memory_mb: u32,
}

#[derive(Default)]
pub(crate) struct Pool {
    ready: Mutex<HashMap<Shape, Vec<Resident>>>,
    /// Sandboxes being started for the pool, per shape.
    starting: Mutex<HashMap<Shape, usize>>,
}

pub(crate) fn sandbox_id() -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("evm-{n:016x}")
}

/// Starts one sandbox and waits for its agent.
pub(crate) async fn start_sandbox(engine: &EngineInner, shape: Shape) -> Result<Resident> {
    let spec = SandboxSpec {
        id: sandbox_id(),
        memory_mb: shape.memory_mb,
        profile: shape.profile,
        image_id: None,
    };
    let mut sandbox = engine.backend.start(&spec).await?;
    let Some((reader, writer)) = sandbox.take_channel() else {
        let _ = sandbox.kill().await;
        return Err(Error::internal("the sandbox has no agent channel"));
    };
    match AgentConnection::establish(reader, writer, engine.config.ready_timeout).await {
        Ok(agent) => Ok(Resident { sandbox, agent }),
        Err(e) => {
            let reason = sandbox.exit_reason();
            let _ = sandbox.kill().await;
            Err(match reason {
                Some(reason) => e.context(reason),
                None => e,
            })
        }
    }
}

impl Pool {
    /// A ready sandbox of this shape: from the pool when it has one, else started now. Either
    /// way the pool is topped up in the background.
    pub(crate) async fn take(engine: &Arc<EngineInner>, shape: Shape) -> Result<Resident> {
        let pooled = {
            let mut ready = lock(&engine.pool.ready);
            ready.get_mut(&shape).and_then(Vec::pop)
        };
        Self::refill(engine, shape);
        if let Some(mut resident) = pooled {
            if resident.sandbox.exit_reason().is_none() {
                return Ok(resident);
            }
            let _ = resident.sandbox.kill().await;
        }
        start_sandbox(engine, shape).await
    }

    /// Starts sandboxes until the pool holds `pool_size` of this shape.
    pub(crate) fn refill(engine: &Arc<EngineInner>, shape: Shape) {
        let target = engine.config.pool_size;
        let wanted = {
            let ready = lock(&engine.pool.ready).get(&shape).map_or(0, Vec::len);
            let mut starting = lock(&engine.pool.starting);
            let in_flight = starting.entry(shape).or_insert(0);
            let wanted = target.saturating_sub(ready + *in_flight);
            *in_flight += wanted;
            wanted
        };
        for _ in 0..wanted {
            let engine = Arc::clone(engine);
            tokio::spawn(async move {
                let started = start_sandbox(&engine, shape).await;
                if let Some(n) = lock(&engine.pool.starting).get_mut(&shape) {
                    *n = n.saturating_sub(1);
                }
                match started {
                    Ok(resident) if !engine.closing() => {
                        lock(&engine.pool.ready)
                            .entry(shape)
                            .or_default()
                            .push(resident);
                    }
                    Ok(resident) => {
                        resident.kill().await;
                    }
                    Err(e) => tracing::warn!("could not start a sandbox for the pool: {e}"),
                }
            });
        }
    }

    /// Stops every pooled sandbox.
    pub(crate) async fn drain(&self) {
        let all: Vec<Resident> = lock(&self.ready)
            .drain()
            .flat_map(|(_, residents)| residents)
            .collect();
        for resident in all {
            resident.kill().await;
        }
    }

    /// How many ready sandboxes the pool holds.
    pub(crate) fn len(&self) -> usize {
        lock(&self.ready).values().map(Vec::len).sum()
    }
}
