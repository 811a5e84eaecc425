//! The host side of the agent channel: a task that decodes frames from the sandbox and a writer
//! for requests. A garbage or oversized frame ends the connection with an error for that
//! machine only.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use std::sync::Arc;

use super::channel::{AgentEvent, AgentRequest, FrameDecoder, decode_frame};
use super::processes::ProcessRouter;
use super::tunnels::TunnelRouter;
use crate::error::{Error, Result};

/// Boxed halves of a channel, as a sandbox hands them out.
pub type ChannelReader = Box<dyn AsyncRead + Send + Unpin>;
pub type ChannelWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// How many decoded events may wait for the machine's task before the reader stops reading
/// (and so the agent blocks writing): back-pressure for large outputs. The agent sends output
/// in pieces of at most 256 KiB, so this holds at most about 8 MiB per machine.
const EVENT_QUEUE: usize = 32;

/// A live connection to one agent.
pub struct AgentConnection {
    writer: ChannelWriter,
    events: mpsc::Receiver<Result<AgentEvent>>,
    reader_task: tokio::task::JoinHandle<()>,
    python: String,
    /// The processes the agent runs beside the interpreter: their events never wait in
    /// `events`, the reader hands them over as they come.
    processes: Arc<ProcessRouter>,
    /// Connections to the sandbox's ports: their events too go straight to them.
    tunnels: Arc<TunnelRouter>,
}

/// What the channel's reader hands events to as they come, beside the queue.
#[derive(Clone, Default)]
struct Routers {
    processes: Arc<ProcessRouter>,
    tunnels: Arc<TunnelRouter>,
}

impl Routers {
    fn lose_all(&self, why: &str) {
        self.processes.lose_all(why);
        self.tunnels.lose_all(why);
    }
}

impl AgentConnection {
    /// Starts reading from the agent and waits for its `ready` event.
    pub async fn establish(
        reader: ChannelReader,
        writer: ChannelWriter,
        ready_timeout: Duration,
    ) -> Result<Self> {
        let (tx, mut events) = mpsc::channel(EVENT_QUEUE);
        let routers = Routers::default();
        let reader_task = tokio::spawn(read_events(reader, tx, routers.clone()));
        let first = tokio::time::timeout(ready_timeout, events.recv()).await;
        let python = match first {
            Ok(Some(Ok(AgentEvent::Ready { python }))) => python,
            Ok(Some(Ok(other))) => {
                reader_task.abort();
                return Err(Error::crashed(format!(
                    "the agent's first event was not `ready` but {other:?}"
                )));
            }
            Ok(Some(Err(e))) => {
                reader_task.abort();
                return Err(e.context("the agent did not start"));
            }
            Ok(None) => {
                reader_task.abort();
                return Err(Error::crashed("the agent exited before it was ready"));
            }
            Err(_) => {
                reader_task.abort();
                return Err(Error::crashed(format!(
                    "the agent was not ready within {} s",
                    ready_timeout.as_secs_f32()
                )));
            }
        };
        Ok(Self {
            writer,
            events,
            reader_task,
            python,
            processes: routers.processes,
            tunnels: routers.tunnels,
        })
    }

    /// Connects to an agent restored from a snapshot: it is mid-conversation, so there is no
    /// `ready` to wait for; the first request finds out whether it lives.
    pub fn resume(reader: ChannelReader, writer: ChannelWriter) -> Self {
        let (tx, events) = mpsc::channel(EVENT_QUEUE);
        let routers = Routers::default();
        let reader_task = tokio::spawn(read_events(reader, tx, routers.clone()));
        Self {
            writer,
            events,
            reader_task,
            python: String::new(),
            processes: routers.processes,
            tunnels: routers.tunnels,
        }
    }

    /// Asks a restored agent to reseed its random generators and waits for its answer, which
    /// also proves it alive.
    pub async fn reseed(&mut self, timeout: Duration) -> Result<()> {
        self.ready_after(&AgentRequest::Reseed, "a reseed", timeout)
            .await
    }

    /// Makes a fresh interpreter a machine's (its environment, its home as working directory)
    /// and waits for the agent's answer.
    pub async fn configure(
        &mut self,
        env: std::collections::BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<()> {
        let request = AgentRequest::Configure {
            env: super::channel::EnvValues(env),
        };
        self.ready_after(&request, "its configuration", timeout)
            .await
    }

    /// Sends `request` and waits for the agent's `ready`.
    async fn ready_after(
        &mut self,
        request: &AgentRequest,
        what: &str,
        timeout: Duration,
    ) -> Result<()> {
        self.send(request).await?;
        match tokio::time::timeout(timeout, self.next_event()).await {
            Ok(Ok(AgentEvent::Ready { python })) => {
                self.python = python;
                Ok(())
            }
            Ok(Ok(other)) => Err(Error::crashed(format!(
                "the agent answered {what} with {other:?}"
            ))),
            Ok(Err(e)) => Err(e.context(format!("the agent did not answer {what}"))),
            Err(_) => Err(Error::crashed(format!(
                "the agent did not answer {what} within {} s",
                timeout.as_secs_f32()
            ))),
        }
    }

    /// Checks that the agent still answers, without touching the machine's state: it runs an
    /// empty instruction (the id no real instruction has).
    pub async fn probe(&mut self, timeout: Duration) -> Result<()> {
        const PROBE_ID: i64 = -2;
        self.send(&AgentRequest::Exec {
            id: PROBE_ID,
            code: "pass".to_owned(),
            timeout_ms: timeout.as_millis() as u64,
            dialect: crate::Dialect::Python,
            context: None,
        })
        .await?;
        let answered = tokio::time::timeout(timeout, async {
            loop {
                if let AgentEvent::Result { id: PROBE_ID, .. } = self.next_event().await? {
                    return Ok(());
                }
            }
        })
        .await;
        answered.unwrap_or_else(|_| {
            Err(Error::crashed(format!(
                "the agent did not answer within {} s",
                timeout.as_secs_f32()
            )))
        })
    }

    /// The processes this agent runs beside the interpreter.
    pub fn processes(&self) -> &Arc<ProcessRouter> {
        &self.processes
    }

    /// The connections to this sandbox's ports.
    pub fn tunnels(&self) -> &Arc<TunnelRouter> {
        &self.tunnels
    }

    /// Opens tunnel `id` to `port` in the sandbox (the first open on a channel first tells the
    /// agent to drop tunnels a snapshot restored).
    pub async fn open_tunnel(&mut self, id: u64, port: u16) -> Result<()> {
        if self.tunnels.needs_reset() {
            self.send(&AgentRequest::TunResetAll).await?;
        }
        self.send(&AgentRequest::TunOpen { id, port }).await
    }

    /// Sends what the tunnels have for the agent: bytes within their credit, grants, ends.
    pub async fn flush_tunnels(&mut self) -> Result<()> {
        let closed =
            |e: std::io::Error| Error::crashed(format!("the agent channel is closed: {e}"));
        for work in self.tunnels.take_work() {
            for piece in &work.data {
                let header = super::tunnels::data_frame_header(work.id, piece.len());
                self.writer.write_all(&header).await.map_err(closed)?;
                self.writer.write_all(piece).await.map_err(closed)?;
            }
            if work.grant > 0 {
                let frame = super::tunnels::credit_frame(work.id, work.grant);
                self.writer.write_all(&frame).await.map_err(closed)?;
            }
            if work.shutdown {
                self.send(&AgentRequest::TunShutdown { id: work.id })
                    .await?;
            }
            if work.reset {
                self.send(&AgentRequest::TunReset { id: work.id }).await?;
            }
        }
        self.writer.flush().await.map_err(closed)
    }

    /// The Python version the agent reported.
    pub fn python_version(&self) -> &str {
        &self.python
    }

    pub async fn send(&mut self, request: &AgentRequest) -> Result<()> {
        let frame = request
            .encode()
            .map_err(|e| Error::invalid(e.to_string()))?;
        self.writer
            .write_all(&frame)
            .await
            .map_err(|e| Error::crashed(format!("the agent channel is closed: {e}")))?;
        self.writer
            .flush()
            .await
            .map_err(|e| Error::crashed(format!("the agent channel is closed: {e}")))
    }

    /// Sends a piece of file data (a write's), without copying it into a frame first.
    pub async fn send_data(&mut self, data: &[u8]) -> Result<()> {
        let header = super::channel::data_frame_header(data.len())
            .map_err(|e| Error::invalid(e.to_string()))?;
        let closed =
            |e: std::io::Error| Error::crashed(format!("the agent channel is closed: {e}"));
        self.writer.write_all(&header).await.map_err(closed)?;
        self.writer.write_all(data).await.map_err(closed)?;
        self.writer.flush().await.map_err(closed)
    }

    /// The next event; `Err` when the channel broke or the agent misbehaved.
    pub async fn next_event(&mut self) -> Result<AgentEvent> {
        match self.events.recv().await {
            Some(event) => event,
            None => Err(Error::crashed("the agent channel is closed")),
        }
    }
}

impl Drop for AgentConnection {
    fn drop(&mut self) {
        self.reader_task.abort();
        let why = "the machine's sandbox stopped (or was swapped out) while it ran";
        self.processes.lose_all(why);
        self.tunnels.lose_all(why);
    }
}

async fn read_events(
    reader: ChannelReader,
    tx: mpsc::Sender<Result<AgentEvent>>,
    routers: Routers,
) {
    read_until_closed(reader, tx, &routers).await;
    routers.lose_all("the machine's sandbox stopped while it ran");
}

async fn read_until_closed(
    mut reader: ChannelReader,
    tx: mpsc::Sender<Result<AgentEvent>>,
    routers: &Routers,
) {
    let mut decoder = FrameDecoder::new();
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        let read = match reader.read(&mut buffer).await {
            Ok(0) => {
                let _ = tx
                    .send(Err(Error::crashed("the sandbox closed the agent channel")))
                    .await;
                return;
            }
            Ok(n) => n,
            Err(e) => {
                let _ = tx
                    .send(Err(Error::crashed(format!(
                        "reading the agent channel failed: {e}"
                    ))))
                    .await;
                return;
            }
        };
        decoder.feed(&buffer[..read]);
        loop {
            let event = match decoder.next_frame() {
                Ok(None) => break,
                Ok(Some(payload)) => decode_frame(payload),
                Err(e) => Err(e),
            };
            let event = match event {
                Ok(AgentEvent::Process(event)) => {
                    routers.processes.deliver(event);
                    continue;
                }
                Ok(AgentEvent::Tunnel(event)) => match routers.tunnels.deliver(event) {
                    Ok(()) => continue,
                    Err(e) => Err(e),
                },
                other => other,
            };
            let failed = event.is_err();
            let event = event.map_err(|e| Error::crashed(e.to_string()));
            if tx.send(event).await.is_err() || failed {
                return;
            }
        }
    }
}
