//! Instructions run for a streaming answer (`/execute`, `process.Process/Start`): the
//! instruction's events are encoded as they come and sent to the client, with keepalives while
//! it is quiet; a client that goes away interrupts the instruction (the machine's state is
//! kept), and what the run must undo afterwards (per-call environment variables) is queued
//! again after the interrupt.

use std::time::Duration;

use axum::body::{Body, Bytes};
use evervm_engine::{
    Account, Dialect, Engine, ExecEvent, ExecRequest, ExecResult, FailureCause, Outcome,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;

/// How many encoded pieces wait for a slow client before the run waits for it.
const QUEUED_PIECES: usize = 64;

/// What a streamed run is about.
pub(super) struct Run {
    pub(super) engine: Engine,
    pub(super) account: Account,
    pub(super) machine: String,
    /// Code queued after an interrupt (the cleanup the interrupt cancelled).
    pub(super) after_interrupt: Option<String>,
    /// The context it runs in (none: the machine's own interpreter).
    pub(super) context: Option<String>,
}

/// Queues `code` on the machine and returns its seq and events.
pub(super) async fn start(
    engine: &Engine,
    account: &Account,
    machine: &str,
    code: String,
    timeout: Duration,
    dialect: Dialect,
    context: Option<String>,
) -> evervm_engine::Result<(i64, BoxStream<'static, ExecEvent>)> {
    let mut request = ExecRequest::new(code);
    request.timeout = timeout;
    request.dialect = dialect;
    request.context = context;
    let accepted = engine.exec(account, machine, request).await?;
    let events = engine.events(account, machine, accepted.seq).await?;
    Ok((accepted.seq, events))
}

/// Queues `code` whose result nobody waits for (a setup or a cleanup).
pub(super) async fn queue(
    engine: &Engine,
    account: &Account,
    machine: &str,
    context: Option<String>,
    code: String,
) -> evervm_engine::Result<()> {
    let mut request = ExecRequest::new(code);
    request.context = context;
    engine.exec(account, machine, request).await.map(drop)
}

impl Run {
    /// The response body: `first`, then what `encode` makes of each event (the stream ends
    /// after the result's pieces), with `keepalive` after every `keepalive_every` of quiet.
    pub(super) fn body(
        self,
        first: Vec<Bytes>,
        mut events: BoxStream<'static, ExecEvent>,
        keepalive_every: Duration,
        keepalive: Bytes,
        mut encode: impl FnMut(ExecEvent) -> Vec<Bytes> + Send + 'static,
    ) -> Body {
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(QUEUED_PIECES);
        tokio::spawn(async move {
            for piece in first {
                if tx.send(Ok(piece)).await.is_err() {
                    self.client_left().await;
                    return;
                }
            }
            let mut quiet = tokio::time::interval(keepalive_every);
            quiet.reset();
            loop {
                tokio::select! {
                    event = events.next() => {
                        let Some(event) = event else { return };
                        let last = matches!(event, ExecEvent::Result(_));
                        if Self::killed(&event) {
                            // As when E2B's sandbox dies: the answer breaks off, and the SDK,
                            // finding the sandbox gone (/health), says it was killed.
                            let _ = tx.send(Err(std::io::Error::other("the sandbox was killed"))).await;
                            return;
                        }
                        for piece in encode(event) {
                            if tx.send(Ok(piece)).await.is_err() {
                                if !last {
                                    self.client_left().await;
                                }
                                return;
                            }
                        }
                        if last {
                            return;
                        }
                        quiet.reset();
                    }
                    _ = quiet.tick() => {
                        if tx.send(Ok(keepalive.clone())).await.is_err() {
                            self.client_left().await;
                            return;
                        }
                    }
                    () = tx.closed() => {
                        self.client_left().await;
                        return;
                    }
                }
            }
        });
        Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|piece| (piece, rx))
        }))
    }

    /// Whether `event` ends the run because its machine was deleted (E2B's kill) meanwhile.
    fn killed(event: &ExecEvent) -> bool {
        matches!(
            event,
            ExecEvent::Result(ExecResult {
                outcome: Outcome::Error {
                    cause: FailureCause::MachineDeleted,
                    ..
                },
                ..
            })
        )
    }

    /// The client went away before the result: interrupt the run, then queue its cleanup.
    async fn client_left(self) {
        tracing::debug!(machine = self.machine, "E2B client left: interrupting");
        if let Err(e) = self.engine.interrupt(&self.account, &self.machine).await {
            tracing::debug!(machine = self.machine, "cannot interrupt: {e}");
        }
        if let Some(code) = self.after_interrupt
            && let Err(e) = queue(
                &self.engine,
                &self.account,
                &self.machine,
                self.context,
                code,
            )
            .await
        {
            tracing::warn!(machine = self.machine, "cannot queue the cleanup: {e}");
        }
    }
}
