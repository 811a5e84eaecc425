//! What the engine runs in each networked machine's gate: a TCP proxy (every connection the
//! machine opens arrives here, with its original destination) and a DNS server (UDP other than
//! DNS is in [`super::udp`]). Both ask the
//! judge; the proxy connects out from the host's namespace only to what it allowed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
use hickory_resolver::proto::rr::rdata::A;
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::judge::{Judge, Remembered, connection_refusal};
use super::policy::NetworkPolicy;

/// How long connecting out may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// DNS queries of one machine answered at once; more are dropped (the machine's resolver
/// retries).
const DNS_IN_FLIGHT: usize = 16;
/// The TTL machines are given: short, so that what they cache stays close to what is allowed.
const ANSWER_TTL: u32 = 60;
/// At most this many addresses in an answer (it then fits in 512 bytes, so no TCP retry).
const MAX_ANSWERS: usize = 16;

/// What a machine's gate serves with.
pub(crate) struct GateContext {
    pub machine: String,
    pub policy: NetworkPolicy,
    pub judge: Arc<Judge>,
    pub resolver: Arc<TokioResolver>,
    pub remembered: Remembered,
    /// Connections (and UDP flows) open at once, at most.
    pub connections: Arc<Semaphore>,
    /// What a machine is refused is logged, but not more than once in a while: a machine
    /// cannot fill the host's logs by knocking.
    pub refusals_logged: Throttle,
}

/// Lets an event through at most once per [`Throttle::EVERY`], counting those held back.
#[derive(Default)]
pub(crate) struct Throttle {
    last: std::sync::Mutex<Option<Instant>>,
    held_back: std::sync::atomic::AtomicU64,
}

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    /// `Some(how many were held back since the last one)` when this one may go.
    pub fn allow(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let Ok(mut last) = self.last.lock() else {
            return None;
        };
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Self::EVERY) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held_back.swap(0, Ordering::Relaxed))
    }
}

pub(crate) fn more_note(held_back: u64) -> String {
    if held_back == 0 {
        String::new()
    } else {
        format!(" ({held_back} more refusals in the last while were not logged)")
    }
}

/// Accepts the machine's connections until aborted (which closes them all).
pub(crate) async fn serve_proxy(listener: TcpListener, context: Arc<GateContext>) {
    let mut open = JoinSet::new();
    loop {
        let accepted = listener.accept().await;
        while open.try_join_next().is_some() {}
        let Ok((stream, _)) = accepted else {
            // A failed accept (out of descriptors): wait rather than spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(permit) = context.connections.clone().try_acquire_owned() else {
            tracing::debug!(
                machine = context.machine,
                "network: too many connections open"
            );
            refuse(stream);
            continue;
        };
        let context = context.clone();
        open.spawn(async move {
            let _permit = permit;
            relay(stream, &context).await;
        });
    }
}

async fn relay(mut inside: TcpStream, context: &GateContext) {
    let Some(destination) = original_destination(&inside) else {
        refuse(inside);
        return;
    };
    if let Some(why) = connection_refusal(
        &context.judge,
        &context.policy,
        &context.remembered,
        destination.ip(),
    ) {
        if let Some(more) = context.refusals_logged.allow() {
            tracing::info!(
                machine = context.machine,
                %destination,
                "network: connection refused: {why}{}",
                more_note(more)
            );
        }
        refuse(inside);
        return;
    }
    let outside = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(destination)).await;
    let mut outside = match outside {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(machine = context.machine, %destination, "network: connect: {e}");
            refuse(inside);
            return;
        }
        Err(_) => {
            refuse(inside);
            return;
        }
    };
    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
}

/// Closes a connection with a reset, so the machine sees it refused at once.
fn refuse(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Where the machine meant to connect (the gate redirected it here).
fn original_destination(stream: &TcpStream) -> Option<SocketAddr> {
    // SAFETY: sockaddr_in is plain data; all zeroes is a valid value.
    let mut address: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the descriptor is the stream's, open for the call; getsockopt writes at most
    // `length` bytes into `address`, which is that large, and sets `length` to what it wrote.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&raw mut address).cast(),
            &raw mut length,
        )
    };
    if result != 0
        || length as usize != std::mem::size_of::<libc::sockaddr_in>()
        || i32::from(address.sin_family) != libc::AF_INET
    {
        return None;
    }
    let ip = Ipv4Addr::from(address.sin_addr.s_addr.to_ne_bytes());
    Some(SocketAddr::V4(SocketAddrV4::new(
        ip,
        u16::from_be(address.sin_port),
    )))
}

/// Answers the machine's DNS queries until aborted.
pub(crate) async fn serve_dns(socket: UdpSocket, context: Arc<GateContext>) {
    let socket = Arc::new(socket);
    let in_flight = Arc::new(Semaphore::new(DNS_IN_FLIGHT));
    let mut answering = JoinSet::new();
    let mut buffer = vec![0u8; 1500];
    loop {
        let Ok((length, peer)) = socket.recv_from(&mut buffer).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        while answering.try_join_next().is_some() {}
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            continue;
        };
        let query = buffer[..length].to_vec();
        let (socket, context) = (socket.clone(), context.clone());
        answering.spawn(async move {
            let _permit = permit;
            if let Some(reply) = answer(&context, &query).await {
                let _ = socket.send_to(&reply, peer).await;
            }
        });
    }
}

/// The reply to one query, if it is one.
async fn answer(context: &GateContext, query: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    let [question] = request.queries.as_slice() else {
        reply.metadata.response_code = ResponseCode::FormErr;
        return reply.to_vec().ok();
    };
    reply.add_query(question.clone());
    let name = question.name().to_ascii();
    if !context.policy.allows_name(&name) {
        if let Some(more) = context.refusals_logged.allow() {
            tracing::info!(
                machine = context.machine,
                name,
                "network: name refused: not in this machine's allow list{}",
                more_note(more)
            );
        }
        reply.metadata.response_code = ResponseCode::Refused;
        return reply.to_vec().ok();
    }
    match question.query_type() {
        RecordType::A => {
            match context.resolver.lookup_ip(question.name().clone()).await {
                Ok(found) => {
                    let ttl = found
                        .valid_until()
                        .saturating_duration_since(Instant::now());
                    let mut refused = 0;
                    for ip in found.iter() {
                        let IpAddr::V4(v4) = ip else { continue };
                        if let Some(why) = context.judge.refusal(ip) {
                            if let Some(more) = context.refusals_logged.allow() {
                                tracing::info!(
                                    machine = context.machine,
                                    name,
                                    "network: address withheld: {why}{}",
                                    more_note(more)
                                );
                            }
                            refused += 1;
                            continue;
                        }
                        if reply.answers.len() < MAX_ANSWERS {
                            context.remembered.remember(ip, &name, ttl);
                            reply.add_answer(Record::from_rdata(
                                question.name().clone(),
                                ANSWER_TTL,
                                RData::A(A(v4)),
                            ));
                        }
                    }
                    if reply.answers.is_empty() && refused > 0 {
                        // Every address is one machines may not reach (a name rebound to a
                        // private address, say): the name is refused, not answered.
                        reply.metadata.response_code = ResponseCode::Refused;
                    }
                }
                Err(e) if e.is_nx_domain() => reply.metadata.response_code = ResponseCode::NXDomain,
                Err(e) if e.is_no_records_found() => {}
                Err(e) => {
                    tracing::debug!(machine = context.machine, name, "network: lookup: {e}");
                    reply.metadata.response_code = ResponseCode::ServFail;
                }
            }
        }
        // Machines have no IPv6: no AAAA answers, so their resolvers go to A at once.
        RecordType::AAAA => {}
        other => match context
            .resolver
            .lookup(question.name().clone(), other)
            .await
        {
            Ok(found) => {
                for record in found.answers().iter().filter(|r| r.record_type() == other) {
                    if reply.answers.len() < MAX_ANSWERS {
                        reply.add_answer(record.clone());
                    }
                }
            }
            Err(e) if e.is_nx_domain() => reply.metadata.response_code = ResponseCode::NXDomain,
            Err(e) if e.is_no_records_found() => {}
            Err(_) => reply.metadata.response_code = ResponseCode::ServFail,
        },
    }
    reply.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_lets_one_through_then_counts_the_rest() {
        let throttle = Throttle::default();
        assert_eq!(throttle.allow(), Some(0));
        assert_eq!(throttle.allow(), None);
        assert_eq!(throttle.allow(), None);
        *throttle.last.lock().unwrap() = Instant::now().checked_sub(Throttle::EVERY);
        assert_eq!(throttle.allow(), Some(2));
        assert_eq!(more_note(0), "");
        assert!(more_note(2).contains("2 more refusals"));
    }
}
