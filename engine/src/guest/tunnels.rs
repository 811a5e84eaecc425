//! Tunnels (`tunnels.py`): TCP connections from the host to servers listening inside a sandbox,
//! carried over the agent channel. The reader hands the agent's tunnel events to the
//! [`TunnelRouter`] as they come; a [`PortStream`] is one connection, an `AsyncRead +
//! AsyncWrite` for whatever proxies it (an HTTP request to E2B's `get_host(port)`).
//!
//! Both directions are credit-bound: the agent may send only the bytes the host granted (a
//! [`TUNNEL_WINDOW`] to start with, then what the host hands on), and so may the host. A guest
//! that sends beyond its credit, a piece over [`TUNNEL_PIECE`] or a malformed frame breaks the
//! protocol, which ends the machine's connection; ids the host never opened are dropped. So a
//! tunnel holds at most a window of the guest's bytes in the engine, whatever the guest does.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, oneshot};

use super::channel::ProtocolError;
use crate::sync::lock;

/// The bytes either side may have in flight per tunnel.
pub const TUNNEL_WINDOW: usize = 256 * 1024;
/// The most bytes one tunnel data frame carries.
pub const TUNNEL_PIECE: usize = 64 * 1024;
/// Connections to one machine's ports open at once (the agent refuses more).
pub const MAX_TUNNELS: usize = 64;
/// The longest error text kept from the agent about a tunnel.
const MAX_TUNNEL_ERROR_BYTES: usize = 1024;

/// What the agent says about a tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelEvent {
    Opened {
        id: u64,
    },
    Failed {
        id: u64,
        failure: TunnelFailure,
    },
    Data {
        id: u64,
        data: Bytes,
    },
    Credit {
        id: u64,
        bytes: u32,
    },
    /// The server sent its last byte.
    Eof {
        id: u64,
    },
    /// The connection broke.
    Closed {
        id: u64,
        error: String,
    },
}

/// Why a tunnel did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelFailure {
    /// Nothing listens on the port.
    Refused(String),
    /// The machine has [`MAX_TUNNELS`] open.
    Limit(String),
    Invalid(String),
}

impl std::fmt::Display for TunnelFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TunnelFailure::Refused(why)
            | TunnelFailure::Limit(why)
            | TunnelFailure::Invalid(why) => f.write_str(why),
        }
    }
}

/// The byte after `T` in a data frame and in a credit frame.
const DATA: u8 = b'd';
const CREDIT: u8 = b'c';

/// Decodes a binary tunnel frame: `T`, `d` or `c`, a big-endian u64 id, then the bytes or a
/// big-endian u32 of bytes granted.
pub(super) fn decode_frame(payload: &[u8]) -> Result<TunnelEvent, ProtocolError> {
    let malformed = |what: &str| ProtocolError::Malformed(format!("tunnel frame {what}"));
    let id = payload
        .get(2..10)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| malformed("is too short"))?;
    let body = &payload[10..];
    match payload.get(1) {
        Some(&DATA) if body.len() > TUNNEL_PIECE => Err(malformed(&format!(
            "carries {} bytes, over the limit of {TUNNEL_PIECE}",
            body.len()
        ))),
        Some(&DATA) => Ok(TunnelEvent::Data {
            id,
            data: Bytes::copy_from_slice(body),
        }),
        Some(&CREDIT) => {
            let bytes = <[u8; 4]>::try_from(body)
                .map(u32::from_be_bytes)
                .map_err(|_| malformed("grants no u32"))?;
            Ok(TunnelEvent::Credit { id, bytes })
        }
        _ => Err(malformed("is neither data nor credit")),
    }
}

/// The fields of a JSON `tun_*` event.
#[derive(serde::Deserialize)]
pub(super) struct RawTunnelEvent {
    ev: String,
    id: u64,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

impl RawTunnelEvent {
    pub(super) fn check(self) -> Result<TunnelEvent, ProtocolError> {
        let mut error = self.error.unwrap_or_default();
        if error.len() > MAX_TUNNEL_ERROR_BYTES {
            let mut end = MAX_TUNNEL_ERROR_BYTES;
            while !error.is_char_boundary(end) {
                end -= 1;
            }
            error.truncate(end);
        }
        let id = self.id;
        match self.ev.as_str() {
            "tun_opened" => Ok(TunnelEvent::Opened { id }),
            "tun_eof" => Ok(TunnelEvent::Eof { id }),
            "tun_closed" => Ok(TunnelEvent::Closed { id, error }),
            "tun_failed" => {
                let failure = match self.kind.as_deref() {
                    Some("refused") => TunnelFailure::Refused(error),
                    Some("limit") => TunnelFailure::Limit(error),
                    _ => TunnelFailure::Invalid(error),
                };
                Ok(TunnelEvent::Failed { id, failure })
            }
            other => Err(ProtocolError::Malformed(format!(
                "unknown tunnel event {other:?}"
            ))),
        }
    }
}

/// The frames that carry `data` to the agent: the length, `T`, `d`, the id.
pub fn data_frame_header(id: u64, len: usize) -> [u8; 14] {
    let mut header = [0u8; 14];
    header[..4].copy_from_slice(&((len + 10) as u32).to_be_bytes());
    header[4] = b'T';
    header[5] = DATA;
    header[6..14].copy_from_slice(&id.to_be_bytes());
    header
}

/// The frame that grants the agent `bytes` more.
pub fn credit_frame(id: u64, bytes: u32) -> [u8; 18] {
    let mut frame = [0u8; 18];
    frame[..4].copy_from_slice(&14u32.to_be_bytes());
    frame[4] = b'T';
    frame[5] = CREDIT;
    frame[6..14].copy_from_slice(&id.to_be_bytes());
    frame[14..].copy_from_slice(&bytes.to_be_bytes());
    frame
}

/// One tunnel as both ends of the host see it.
#[derive(Default)]
struct Tunnel {
    opened: Option<oneshot::Sender<Result<(), TunnelFailure>>>,
    /// The agent's bytes not yet read, and how many more it may send.
    inbound: VecDeque<Bytes>,
    allowance: usize,
    /// Bytes read and not yet granted back.
    consumed: usize,
    /// The host's bytes not yet sent to the agent, and how many more the agent takes.
    outbound: VecDeque<Bytes>,
    outbound_bytes: usize,
    credit: usize,
    eof: bool,
    /// Set when the connection broke (or the sandbox went): every read and write fails.
    broken: Option<String>,
    shutdown: bool,
    shutdown_sent: bool,
    dropped: bool,
    /// Waiting for work from the machine's task.
    dirty: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

impl Tunnel {
    fn wake(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
        if let Some(w) = self.write_waker.take() {
            w.wake();
        }
    }

    fn break_with(&mut self, why: &str) {
        if self.broken.is_none() {
            self.broken = Some(why.to_owned());
        }
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(TunnelFailure::Invalid(why.to_owned())));
        }
        self.wake();
    }
}

/// What the machine's task sends the agent for one tunnel.
#[derive(Debug, Default)]
pub struct TunnelWork {
    pub id: u64,
    pub data: Vec<Bytes>,
    pub grant: u32,
    pub shutdown: bool,
    /// The host dropped it: the agent closes the connection.
    pub reset: bool,
}

/// The tunnels of one sandbox's agent, by id.
#[derive(Default)]
pub struct TunnelRouter {
    tunnels: Mutex<HashMap<u64, Tunnel>>,
    /// Told when a tunnel has work for the machine's task.
    kick: Notify,
    closed: AtomicBool,
    /// Whether the agent was told to drop what a snapshot may have restored.
    reset_sent: AtomicBool,
}

impl TunnelRouter {
    /// Registers a tunnel about to be opened; its receiver says whether the agent opened it.
    pub fn register(
        self: &Arc<Self>,
        id: u64,
    ) -> (PortStream, oneshot::Receiver<Result<(), TunnelFailure>>) {
        let (opened, answer) = oneshot::channel();
        let mut tunnel = Tunnel {
            opened: Some(opened),
            allowance: TUNNEL_WINDOW,
            credit: TUNNEL_WINDOW,
            ..Tunnel::default()
        };
        let mut tunnels = lock(&self.tunnels);
        if self.is_closed() {
            tunnel.break_with("the machine's sandbox had stopped");
        }
        tunnels.insert(id, tunnel);
        let stream = PortStream {
            id,
            router: Arc::clone(self),
        };
        (stream, answer)
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.tunnels).is_empty()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// True the first time only: the caller tells the agent to reset every tunnel.
    pub fn needs_reset(&self) -> bool {
        !self.reset_sent.swap(true, Ordering::SeqCst)
    }

    /// Resolves once some tunnel has work for the machine's task.
    pub async fn kicked(&self) {
        self.kick.notified().await;
    }

    /// Takes an event off the channel; never waits. `Err`: the agent broke the protocol.
    pub fn deliver(&self, event: TunnelEvent) -> Result<(), ProtocolError> {
        let mut tunnels = lock(&self.tunnels);
        match event {
            TunnelEvent::Opened { id } => {
                if let Some(t) = tunnels.get_mut(&id)
                    && let Some(opened) = t.opened.take()
                {
                    let _ = opened.send(Ok(()));
                    // What the host wrote meanwhile (or dropping it) may go now.
                    t.dirty = true;
                    self.kick.notify_one();
                }
            }
            TunnelEvent::Failed { id, failure } => {
                if let Some(mut t) = tunnels.remove(&id) {
                    if let Some(opened) = t.opened.take() {
                        let _ = opened.send(Err(failure));
                    }
                    t.break_with("the tunnel did not open");
                }
            }
            TunnelEvent::Data { id, data } => {
                let Some(t) = tunnels.get_mut(&id) else {
                    return Ok(());
                };
                if t.opened.is_some() || data.len() > t.allowance {
                    return Err(ProtocolError::Malformed(format!(
                        "tunnel {id}: {} bytes beyond what the host granted",
                        data.len()
                    )));
                }
                t.allowance -= data.len();
                if !data.is_empty() {
                    t.inbound.push_back(data);
                }
                if let Some(w) = t.read_waker.take() {
                    w.wake();
                }
            }
            TunnelEvent::Credit { id, bytes } => {
                if let Some(t) = tunnels.get_mut(&id) {
                    t.credit = (t.credit + bytes as usize).min(TUNNEL_WINDOW);
                    if let Some(w) = t.write_waker.take() {
                        w.wake();
                    }
                    // Bytes waiting for this credit go now.
                    if !t.outbound.is_empty() {
                        t.dirty = true;
                        self.kick.notify_one();
                    }
                }
            }
            TunnelEvent::Eof { id } => {
                if let Some(t) = tunnels.get_mut(&id) {
                    t.eof = true;
                    if let Some(w) = t.read_waker.take() {
                        w.wake();
                    }
                }
            }
            TunnelEvent::Closed { id, error } => {
                if let Some(t) = tunnels.get_mut(&id) {
                    t.break_with(&format!("the connection in the sandbox broke: {error}"));
                }
            }
        }
        Ok(())
    }

    /// What the machine's task is to send: each tunnel's bytes within its credit, grants,
    /// shutdowns and resets. Dropped tunnels are forgotten here.
    pub fn take_work(&self) -> Vec<TunnelWork> {
        let mut tunnels = lock(&self.tunnels);
        let mut work = Vec::new();
        let mut forget = Vec::new();
        for (&id, t) in tunnels.iter_mut() {
            if !t.dirty {
                continue;
            }
            t.dirty = false;
            if t.dropped {
                forget.push(id);
                // Reset also when the agent has not answered yet: it may still be connecting,
                // and a connection it made for nobody would hold one of its places for ever.
                work.push(TunnelWork {
                    id,
                    reset: true,
                    ..TunnelWork::default()
                });
                continue;
            }
            if t.opened.is_some() || t.broken.is_some() {
                continue;
            }
            let mut item = TunnelWork {
                id,
                ..TunnelWork::default()
            };
            while t.credit > 0
                && let Some(front) = t.outbound.front_mut()
            {
                // A piece larger than the credit goes in part.
                let piece = if front.len() > t.credit {
                    front.split_to(t.credit)
                } else {
                    t.outbound.pop_front().unwrap_or_default()
                };
                t.credit -= piece.len();
                t.outbound_bytes -= piece.len();
                item.data.push(piece);
            }
            if t.consumed > 0 {
                item.grant = u32::try_from(t.consumed).unwrap_or(u32::MAX);
                t.allowance += item.grant as usize;
                t.consumed -= item.grant as usize;
            }
            if t.shutdown && t.outbound.is_empty() && !t.shutdown_sent {
                t.shutdown_sent = true;
                item.shutdown = true;
            }
            if !item.data.is_empty()
                && let Some(w) = t.write_waker.take()
            {
                w.wake();
            }
            if !item.data.is_empty() || item.grant > 0 || item.shutdown {
                work.push(item);
            }
        }
        for id in forget {
            tunnels.remove(&id);
        }
        work
    }

    /// Every tunnel breaks, for `why`, and so does any registered later.
    pub fn lose_all(&self, why: &str) {
        self.closed.store(true, Ordering::SeqCst);
        for t in lock(&self.tunnels).values_mut() {
            t.break_with(why);
        }
    }

    /// Runs `f` on tunnel `id`, marking it for the task when `f` says so.
    fn with<R>(&self, id: u64, f: impl FnOnce(&mut Tunnel) -> (R, bool)) -> Option<R> {
        let mut tunnels = lock(&self.tunnels);
        let t = tunnels.get_mut(&id)?;
        let (result, kick) = f(t);
        if kick && !t.dirty {
            t.dirty = true;
            self.kick.notify_one();
        }
        Some(result)
    }
}

/// One connection to a port inside a machine. Dropping it closes the connection there.
pub struct PortStream {
    id: u64,
    router: Arc<TunnelRouter>,
}

impl std::fmt::Debug for PortStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortStream")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the tunnel is closed")
}

impl AsyncRead for PortStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = self.router.with(self.id, |t| {
            if let Some(front) = t.inbound.front_mut() {
                let n = front.len().min(buf.remaining());
                buf.put_slice(&front.split_to(n));
                if front.is_empty() {
                    t.inbound.pop_front();
                }
                t.consumed += n;
                // Granted back in quarters of the window, so that grants stay few.
                return (Poll::Ready(Ok(())), t.consumed >= TUNNEL_WINDOW / 4);
            }
            if let Some(why) = &t.broken {
                return (
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone()))),
                    false,
                );
            }
            if t.eof {
                return (Poll::Ready(Ok(())), false);
            }
            t.read_waker = Some(cx.waker().clone());
            // Whatever is read but not granted goes back now: the agent may be waiting for it.
            (Poll::Pending, t.consumed > 0)
        });
        polled.unwrap_or_else(|| Poll::Ready(Err(gone())))
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = self.router.with(self.id, |t| {
            if let Some(why) = &t.broken {
                return (
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone()))),
                    false,
                );
            }
            if t.shutdown {
                return (Poll::Ready(Err(gone())), false);
            }
            let room = TUNNEL_WINDOW.saturating_sub(t.outbound_bytes);
            if room == 0 {
                t.write_waker = Some(cx.waker().clone());
                return (Poll::Pending, false);
            }
            let n = data.len().min(room).min(TUNNEL_PIECE);
            t.outbound.push_back(Bytes::copy_from_slice(&data[..n]));
            t.outbound_bytes += n;
            (Poll::Ready(Ok(n)), true)
        });
        polled.unwrap_or_else(|| Poll::Ready(Err(gone())))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = self.router.with(self.id, |t| {
            let first = !t.shutdown;
            t.shutdown = true;
            ((), first)
        });
        Poll::Ready(Ok(()))
    }
}

impl Drop for PortStream {
    fn drop(&mut self) {
        let _ = self.router.with(self.id, |t| {
            t.dropped = true;
            ((), true)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn tunnel_frames_are_checked() {
        let mut frame = vec![b'T', b'd'];
        frame.extend(7u64.to_be_bytes());
        frame.extend(b"abc");
        assert_eq!(
            decode_frame(&frame),
            Ok(TunnelEvent::Data {
                id: 7,
                data: Bytes::from_static(b"abc")
            })
        );
        let mut big = vec![b'T', b'd'];
        big.extend(7u64.to_be_bytes());
        big.extend(vec![0u8; TUNNEL_PIECE + 1]);
        assert!(decode_frame(&big).is_err());
        assert!(decode_frame(b"Td").is_err());
        let credit = &credit_frame(9, 300)[4..];
        assert_eq!(
            decode_frame(credit),
            Ok(TunnelEvent::Credit { id: 9, bytes: 300 })
        );
        assert!(decode_frame(&credit[..credit.len() - 1]).is_err());
        let mut other = vec![b'T', b'x'];
        other.extend(1u64.to_be_bytes());
        assert!(decode_frame(&other).is_err());
    }

    /// The bytes the machine's task would send the agent now.
    fn bytes_sent(router: &TunnelRouter) -> usize {
        router
            .take_work()
            .iter()
            .flat_map(|w| w.data.iter().map(Bytes::len))
            .sum()
    }

    #[tokio::test]
    async fn credit_bounds_both_directions() {
        let router = Arc::new(TunnelRouter::default());
        let (mut stream, opened) = router.register(1);
        // Nothing goes to the agent before it opened the tunnel.
        stream
            .write_all(b"GET /")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(router.take_work().iter().all(|w| w.data.is_empty()));
        // Data for a tunnel not opened yet breaks the protocol.
        let early = TunnelEvent::Data {
            id: 1,
            data: Bytes::from_static(b"x"),
        };
        assert!(router.deliver(early).is_err());
        router
            .deliver(TunnelEvent::Opened { id: 1 })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opened.await.ok(), Some(Ok(())));
        // An id the host never opened is dropped.
        let stray = TunnelEvent::Data {
            id: 5,
            data: Bytes::from_static(b"x"),
        };
        assert!(router.deliver(stray).is_ok());
        // The agent may send a window, and no more.
        let piece = Bytes::from(vec![b'a'; TUNNEL_PIECE]);
        for _ in 0..TUNNEL_WINDOW / TUNNEL_PIECE {
            let data = TunnelEvent::Data {
                id: 1,
                data: piece.clone(),
            };
            router.deliver(data).unwrap_or_else(|e| panic!("{e}"));
        }
        let over = TunnelEvent::Data {
            id: 1,
            data: Bytes::from_static(b"!"),
        };
        assert!(router.deliver(over).is_err());
        // What the host reads is granted back.
        let mut read = vec![0u8; TUNNEL_WINDOW];
        stream
            .read_exact(&mut read)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let work = router.take_work();
        assert_eq!(work.len(), 1);
        assert_eq!(work[0].data.concat(), b"GET /");
        assert_eq!(work[0].grant as usize, TUNNEL_WINDOW);
        // The host writes within the agent's credit only.
        let big = vec![b'b'; TUNNEL_WINDOW];
        stream
            .write_all(&big)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bytes_sent(&router), TUNNEL_WINDOW - 5);
        router
            .deliver(TunnelEvent::Credit { id: 1, bytes: 5 })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bytes_sent(&router), 5);
        // End of stream, then a drop resets it in the agent and forgets it.
        router
            .deliver(TunnelEvent::Eof { id: 1 })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stream.read(&mut read).await.ok(), Some(0));
        drop(stream);
        let work = router.take_work();
        assert!(work.len() == 1 && work[0].reset);
        assert!(router.is_empty());
    }

    #[test]
    fn a_tunnel_dropped_before_it_opened_is_reset_in_the_agent() {
        let router = Arc::new(TunnelRouter::default());
        let (stream, _opened) = router.register(3);
        drop(stream);
        let work = router.take_work();
        assert!(
            work.len() == 1 && work[0].id == 3 && work[0].reset,
            "{work:?}"
        );
        assert!(router.is_empty());
    }

    #[tokio::test]
    async fn a_lost_channel_breaks_every_tunnel() {
        let router = Arc::new(TunnelRouter::default());
        let (mut stream, opened) = router.register(1);
        router.lose_all("gone");
        assert!(matches!(opened.await, Ok(Err(_))));
        let mut buf = [0u8; 4];
        assert!(stream.read(&mut buf).await.is_err());
        assert!(stream.write(b"x").await.is_err());
        let (_late, late_opened) = router.register(2);
        assert!(matches!(late_opened.await, Ok(Err(_))));
    }
}
