//! The decisions: may this machine reach this address, under this name? One place for the
//! classifier, the host's own addresses, the operator's extra public blocks and the names each
//! machine was told, so the proxy and the DNS server cannot disagree.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::address::{Cidr, classify};
use super::policy::NetworkPolicy;

/// How long the host's addresses are trusted before they are read again.
const HOST_ADDRESSES_FRESH: Duration = Duration::from_secs(2);
/// Names remembered per machine (address to the names it was answered for).
pub(crate) const MAX_REMEMBERED: usize = 4096;
/// Names per address remembered.
const MAX_NAMES_PER_ADDRESS: usize = 8;
/// How long an answer is remembered at least and at most, whatever its DNS TTL: clients keep
/// addresses longer than TTLs say (connection pools), and a memory must end.
const REMEMBER_AT_LEAST: Duration = Duration::from_secs(10 * 60);
const REMEMBER_AT_MOST: Duration = Duration::from_secs(60 * 60);

/// Decides what machines may reach; one per engine.
pub(crate) struct Judge {
    also_public: Vec<Cidr>,
    host: Mutex<(Instant, Vec<IpAddr>)>,
}

impl Judge {
    pub fn new(also_public: Vec<Cidr>) -> Self {
        Self {
            also_public,
            host: Mutex::new((Instant::now(), host_addresses())),
        }
    }

    /// Why `ip` may not be reached by any machine, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<String> {
        let ip = ip.to_canonical();
        if self.is_host(ip) {
            return Some(format!("{ip} is an address of the host"));
        }
        if self.also_public.iter().any(|block| block.contains(ip)) {
            return None;
        }
        let class = classify(ip);
        (!class.is_public()).then(|| format!("{ip} is {class}"))
    }

    fn is_host(&self, ip: IpAddr) -> bool {
        let Ok(mut host) = self.host.lock() else {
            // A poisoned lock: refuse rather than guess.
            return true;
        };
        if host.0.elapsed() > HOST_ADDRESSES_FRESH {
            *host = (Instant::now(), host_addresses());
        }
        host.1.contains(&ip)
    }
}

/// The addresses of the host's interfaces (the engine's network namespace).
fn host_addresses() -> Vec<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `list`; on success it is freed below with
    // freeifaddrs, and only read in between.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return Vec::new();
    }
    let mut addresses = Vec::new();
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a non-null node of the list getifaddrs returned, alive until
        // freeifaddrs; its ifa_addr is null or points to a sockaddr of the family it names, of
        // the size that family has.
        unsafe {
            let address = (*entry).ifa_addr;
            if !address.is_null() {
                match i32::from((*address).sa_family) {
                    libc::AF_INET => {
                        let v4 = std::ptr::read_unaligned(address.cast::<libc::sockaddr_in>());
                        addresses.push(IpAddr::from(v4.sin_addr.s_addr.to_ne_bytes()));
                    }
                    libc::AF_INET6 => {
                        let v6 = std::ptr::read_unaligned(address.cast::<libc::sockaddr_in6>());
                        addresses.push(IpAddr::from(v6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            entry = (*entry).ifa_next;
        }
    }
    // SAFETY: `list` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    addresses
}

/// What one machine was told by its DNS server: address to names, so that a connection to an
/// address is allowed by the name it was looked up under (and a literal address, never looked
/// up, is not).
#[derive(Default)]
pub(crate) struct Remembered {
    entries: Mutex<HashMap<IpAddr, (Vec<String>, Instant)>>,
}

impl Remembered {
    pub fn remember(&self, ip: IpAddr, name: &str, ttl: Duration) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let now = Instant::now();
        let until = now + ttl.clamp(REMEMBER_AT_LEAST, REMEMBER_AT_MOST);
        if entries.len() >= MAX_REMEMBERED && !entries.contains_key(&ip) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= MAX_REMEMBERED
                && let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(ip, _)| *ip)
            {
                entries.remove(&oldest);
            }
        }
        let (names, expires) = entries.entry(ip).or_insert_with(|| (Vec::new(), until));
        *expires = (*expires).max(until);
        if !names.iter().any(|n| n == name) {
            if names.len() >= MAX_NAMES_PER_ADDRESS {
                names.remove(0);
            }
            names.push(name.to_owned());
        }
    }

    /// Whether `policy` allows one of the names `ip` was given for.
    pub fn allows(&self, ip: IpAddr, policy: &NetworkPolicy) -> bool {
        let Ok(entries) = self.entries.lock() else {
            return false;
        };
        entries
            .get(&ip.to_canonical())
            .is_some_and(|(names, expires)| {
                *expires > Instant::now() && names.iter().any(|n| policy.allows_name(n))
            })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }
}

/// Why a machine with `policy` may not connect to `ip`, or `None` when it may.
pub(crate) fn connection_refusal(
    judge: &Judge,
    policy: &NetworkPolicy,
    remembered: &Remembered,
    ip: IpAddr,
) -> Option<String> {
    let ip = ip.to_canonical();
    if let Some(why) = judge.refusal(ip) {
        return Some(why);
    }
    match policy {
        NetworkPolicy::None => Some("this machine has no network".to_owned()),
        NetworkPolicy::Public => None,
        NetworkPolicy::Allow(_) => {
            if policy.allows_literal_address(ip) || remembered.allows(ip, policy) {
                None
            } else {
                Some(format!(
                    "{ip} is not in this machine's allow list (a name in it must be looked up \
                     through the machine's DNS to be reached)"
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::NetworkMode;

    fn allow(rules: &[&str]) -> NetworkPolicy {
        NetworkPolicy::new(NetworkMode::Allow, rules).unwrap()
    }

    #[test]
    fn the_host_and_blocked_ranges_are_refused_whatever_the_policy() {
        let judge = Judge::new(vec![Cidr::parse("203.0.113.0/24").unwrap()]);
        let memory = Remembered::default();
        for policy in [NetworkPolicy::Public, allow(&["0.0.0.0/0", "example.com"])] {
            for blocked in [
                "127.0.0.1",
                "10.0.0.1",
                "169.254.169.254",
                "100.64.0.1",
                "::1",
                "::ffff:10.1.1.1",
            ] {
                let why = connection_refusal(&judge, &policy, &memory, blocked.parse().unwrap());
                assert!(why.is_some(), "{blocked}");
            }
            assert_eq!(
                connection_refusal(&judge, &policy, &memory, "203.0.113.7".parse().unwrap()),
                None
            );
        }
        // Every address of this host is refused, even inside a block marked public.
        for ip in host_addresses() {
            let judge = Judge::new(vec![
                Cidr::parse(if ip.is_ipv4() { "0.0.0.0/0" } else { "::/0" }).unwrap(),
            ]);
            let why = judge.refusal(ip).unwrap();
            assert!(why.contains("address of the host"), "{why}");
        }
    }

    #[test]
    fn allow_lets_through_remembered_names_and_blocks_never_literal_addresses_by_name() {
        let judge = Judge::new(Vec::new());
        let memory = Remembered::default();
        let policy = allow(&["example.com", "8.8.8.0/24"]);
        let ip: IpAddr = "93.184.216.34".parse().unwrap();
        assert!(
            connection_refusal(&judge, &policy, &memory, ip)
                .unwrap()
                .contains("allow list")
        );
        memory.remember(ip, "example.com", Duration::from_secs(30));
        assert_eq!(connection_refusal(&judge, &policy, &memory, ip), None);
        // Remembered under a name the policy does not allow: refused.
        let other: IpAddr = "93.184.216.35".parse().unwrap();
        memory.remember(other, "evil.example.net", Duration::from_secs(30));
        assert!(connection_refusal(&judge, &policy, &memory, other).is_some());
        assert_eq!(
            connection_refusal(&judge, &policy, &memory, "8.8.8.8".parse().unwrap()),
            None
        );
        assert!(connection_refusal(&judge, &NetworkPolicy::None, &memory, ip).is_some());
    }

    #[test]
    fn the_memory_is_bounded() {
        let memory = Remembered::default();
        for i in 0..(MAX_REMEMBERED as u32 + 100) {
            memory.remember(
                IpAddr::from((0x0100_0000 + i).to_be_bytes()),
                "example.com",
                Duration::ZERO,
            );
        }
        assert_eq!(memory.len(), MAX_REMEMBERED);
        let ip: IpAddr = "1.1.1.1".parse().unwrap();
        for i in 0..20 {
            memory.remember(ip, &format!("n{i}.example.com"), Duration::ZERO);
        }
        assert!(memory.allows(ip, &allow(&["n19.example.com"])));
        assert!(!memory.allows(ip, &allow(&["n0.example.com"])));
    }
}
