//! Which addresses a machine may reach: the one classifier every network check goes through.
//!
//! Only addresses that route on the public internet are [`AddressClass::Public`]. Everything
//! else is refused whatever a machine's policy says: the host and its other sandboxes, loopback,
//! private and shared (CGNAT) space, link-local (the cloud metadata service at 169.254.169.254
//! among them), multicast and broadcast, documentation, benchmarking and reserved space, and on
//! IPv6 unique-local, link-local, site-local and everything outside global unicast (`2000::/3`).
//! An IPv6 address that carries an IPv4 one (IPv4-mapped, the NAT64 prefix `64:ff9b::/96`) is
//! judged by the IPv4 address it carries; 6to4 and Teredo, which tunnel to addresses they encode,
//! are refused.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// What kind of address an IP address is, for the purpose of letting a machine reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressClass {
    /// Routed on the public internet: the only class a machine may reach.
    Public,
    /// `0.0.0.0/8`, `::`: "this host" or no address at all.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// RFC 6598 shared address space (carrier-grade NAT): `100.64.0.0/10`.
    SharedCgnat,
    /// `169.254.0.0/16` (the cloud metadata service's `169.254.169.254` among them), `fe80::/10`.
    LinkLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `240.0.0.0/4`, the broadcast address `255.255.255.255` included.
    Reserved,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// Special-purpose protocol assignments: `192.0.0.0/24`, `192.88.99.0/24` (6to4 relays),
    /// `2001::/23` (Teredo among them), `2002::/16` (6to4), `64:ff9b:1::/48`, `100::/64`.
    ProtocolAssignment,
    /// `fc00::/7`.
    UniqueLocal,
    /// `fec0::/10` (deprecated site-local).
    SiteLocal,
    /// IPv6 outside global unicast (`2000::/3`) not named above, IPv4-compatible `::/96`
    /// included.
    NotGlobalUnicast,
}

impl AddressClass {
    pub fn is_public(self) -> bool {
        self == AddressClass::Public
    }

    /// Words for an error message: "`10.0.0.1` is a private address".
    pub fn describe(self) -> &'static str {
        match self {
            AddressClass::Public => "a public address",
            AddressClass::Unspecified => "an unspecified address",
            AddressClass::Loopback => "a loopback address",
            AddressClass::Private => "a private address (RFC 1918)",
            AddressClass::SharedCgnat => "a shared (carrier-grade NAT) address",
            AddressClass::LinkLocal => "a link-local address (the cloud metadata service's range)",
            AddressClass::Multicast => "a multicast address",
            AddressClass::Reserved => "a reserved or broadcast address",
            AddressClass::Documentation => "a documentation address",
            AddressClass::Benchmarking => "a benchmarking address",
            AddressClass::ProtocolAssignment => "a special-purpose (protocol assignment) address",
            AddressClass::UniqueLocal => "a unique-local IPv6 address",
            AddressClass::SiteLocal => "a site-local IPv6 address",
            AddressClass::NotGlobalUnicast => "not a global unicast IPv6 address",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The class of `ip`.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// The class of an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    const RANGES: &[([u8; 4], u8, AddressClass)] = &[
        ([0, 0, 0, 0], 8, AddressClass::Unspecified),
        ([10, 0, 0, 0], 8, AddressClass::Private),
        ([100, 64, 0, 0], 10, AddressClass::SharedCgnat),
        ([127, 0, 0, 0], 8, AddressClass::Loopback),
        ([169, 254, 0, 0], 16, AddressClass::LinkLocal),
        ([172, 16, 0, 0], 12, AddressClass::Private),
        ([192, 0, 0, 0], 24, AddressClass::ProtocolAssignment),
        ([192, 0, 2, 0], 24, AddressClass::Documentation),
        ([192, 88, 99, 0], 24, AddressClass::ProtocolAssignment),
        ([192, 168, 0, 0], 16, AddressClass::Private),
        ([198, 18, 0, 0], 15, AddressClass::Benchmarking),
        ([198, 51, 100, 0], 24, AddressClass::Documentation),
        ([203, 0, 113, 0], 24, AddressClass::Documentation),
        ([224, 0, 0, 0], 4, AddressClass::Multicast),
        ([240, 0, 0, 0], 4, AddressClass::Reserved),
    ];
    let bits = u32::from(ip);
    RANGES
        .iter()
        .find(|(net, len, _)| prefix_matches_v4(bits, u32::from_be_bytes(*net), *len))
        .map_or(AddressClass::Public, |(_, _, class)| *class)
}

/// The class of an IPv6 address.
pub fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let bits = u128::from(ip);
    // The NAT64 well-known prefix: a NAT64 gateway would carry it to the IPv4 address inside.
    if prefix_matches_v6(bits, 0x0064_ff9b << 96, 96) {
        return classify_v4(Ipv4Addr::from(bits as u32));
    }
    const RANGES: &[(u128, u8, AddressClass)] = &[
        (0, 128, AddressClass::Unspecified),
        (1, 128, AddressClass::Loopback),
        (0x0064_ff9b_0001 << 80, 48, AddressClass::ProtocolAssignment),
        (0x0100 << 112, 64, AddressClass::ProtocolAssignment),
        (0x2001_0002 << 96, 48, AddressClass::Benchmarking),
        (0x2001_0db8 << 96, 32, AddressClass::Documentation),
        (0x2001 << 112, 23, AddressClass::ProtocolAssignment),
        (0x2002 << 112, 16, AddressClass::ProtocolAssignment),
        (0x3fff << 112, 20, AddressClass::Documentation),
        (0xfc00 << 112, 7, AddressClass::UniqueLocal),
        (0xfe80 << 112, 10, AddressClass::LinkLocal),
        (0xfec0 << 112, 10, AddressClass::SiteLocal),
        (0xff00 << 112, 8, AddressClass::Multicast),
        // IPv4-compatible (deprecated) and the rest of ::/8, after the ranges inside it.
        (0, 8, AddressClass::NotGlobalUnicast),
    ];
    if let Some((_, _, class)) = RANGES
        .iter()
        .find(|(net, len, _)| prefix_matches_v6(bits, *net, *len))
    {
        return *class;
    }
    if prefix_matches_v6(bits, 0x2000 << 112, 3) {
        AddressClass::Public
    } else {
        AddressClass::NotGlobalUnicast
    }
}

fn prefix_matches_v4(bits: u32, net: u32, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    bits & mask == net & mask
}

fn prefix_matches_v6(bits: u128, net: u128, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    bits & mask == net & mask
}

/// A block of addresses: `203.0.113.0/24`, `2001:db8::/32`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `ADDRESS/PREFIX` or a bare address (a block of one). Bits set below the prefix
    /// are refused (`10.0.0.1/8` is a typo for `10.0.0.0/8` or `10.0.0.1/32`; the error says
    /// which block was meant).
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or a CIDR block"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            // Digits only, no sign or leading zero: "/08" is more likely a typo than a /8.
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max && n.to_string() == p => n,
                _ => {
                    return Err(format!(
                        "{text:?}: the prefix length must be a number from 0 to {max}"
                    ));
                }
            },
        };
        let cidr = Self { network, prefix };
        if cidr.masked() != network {
            return Err(format!(
                "{text:?} has bits set past its /{prefix} prefix: did you mean {}?",
                Self {
                    network: cidr.masked(),
                    prefix
                }
            ));
        }
        Ok(cidr)
    }

    /// Like [`Cidr::parse`], but bits set past the prefix are cleared (`10.0.0.1/8` is
    /// `10.0.0.0/8`).
    pub fn parse_masked(text: &str) -> std::result::Result<Self, String> {
        match Self::parse(text) {
            Ok(cidr) => Ok(cidr),
            Err(_) => {
                let (address, prefix) = text
                    .split_once('/')
                    .ok_or_else(|| format!("{text:?} is not an IP address or a CIDR block"))?;
                let network: IpAddr = address
                    .parse()
                    .map_err(|_| format!("{text:?} is not an IP address or a CIDR block"))?;
                let max = if network.is_ipv4() { 32 } else { 128 };
                let prefix = prefix
                    .parse::<u8>()
                    .ok()
                    .filter(|n| *n <= max && n.to_string() == prefix)
                    .ok_or_else(|| {
                        format!("{text:?}: the prefix length must be a number from 0 to {max}")
                    })?;
                let cidr = Self { network, prefix };
                Ok(Self {
                    network: cidr.masked(),
                    prefix,
                })
            }
        }
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    fn masked(&self) -> IpAddr {
        match self.network {
            IpAddr::V4(v4) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_matches_v4(u32::from(ip), u32::from(net), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_matches_v6(u128::from(ip), u128::from(net), self.prefix)
            }
            // An IPv4-mapped IPv6 address is the IPv4 address it carries.
            (IpAddr::V4(_), IpAddr::V6(ip)) => ip
                .to_ipv4_mapped()
                .is_some_and(|v4| self.contains(IpAddr::V4(v4))),
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(text: &str) -> AddressClass {
        classify(text.parse().unwrap())
    }

    #[test]
    fn every_blocked_ipv4_range_is_blocked_at_both_ends_and_its_neighbours_are_not() {
        // (first address, last address, class, the address before, the address after)
        let ranges = [
            (
                "0.0.0.0",
                "0.255.255.255",
                AddressClass::Unspecified,
                None,
                Some("1.0.0.0"),
            ),
            (
                "10.0.0.0",
                "10.255.255.255",
                AddressClass::Private,
                Some("9.255.255.255"),
                Some("11.0.0.0"),
            ),
            (
                "100.64.0.0",
                "100.127.255.255",
                AddressClass::SharedCgnat,
                Some("100.63.255.255"),
                Some("100.128.0.0"),
            ),
            (
                "127.0.0.0",
                "127.255.255.255",
                AddressClass::Loopback,
                Some("126.255.255.255"),
                Some("128.0.0.0"),
            ),
            (
                "169.254.0.0",
                "169.254.255.255",
                AddressClass::LinkLocal,
                Some("169.253.255.255"),
                Some("169.255.0.0"),
            ),
            (
                "172.16.0.0",
                "172.31.255.255",
                AddressClass::Private,
                Some("172.15.255.255"),
                Some("172.32.0.0"),
            ),
            (
                "192.0.0.0",
                "192.0.0.255",
                AddressClass::ProtocolAssignment,
                Some("191.255.255.255"),
                Some("192.0.1.0"),
            ),
            (
                "192.0.2.0",
                "192.0.2.255",
                AddressClass::Documentation,
                Some("192.0.1.255"),
                Some("192.0.3.0"),
            ),
            (
                "192.88.99.0",
                "192.88.99.255",
                AddressClass::ProtocolAssignment,
                Some("192.88.98.255"),
                Some("192.88.100.0"),
            ),
            (
                "192.168.0.0",
                "192.168.255.255",
                AddressClass::Private,
                Some("192.167.255.255"),
                Some("192.169.0.0"),
            ),
            (
                "198.18.0.0",
                "198.19.255.255",
                AddressClass::Benchmarking,
                Some("198.17.255.255"),
                Some("198.20.0.0"),
            ),
            (
                "198.51.100.0",
                "198.51.100.255",
                AddressClass::Documentation,
                Some("198.51.99.255"),
                Some("198.51.101.0"),
            ),
            (
                "203.0.113.0",
                "203.0.113.255",
                AddressClass::Documentation,
                Some("203.0.112.255"),
                Some("203.0.114.0"),
            ),
            (
                "224.0.0.0",
                "239.255.255.255",
                AddressClass::Multicast,
                Some("223.255.255.255"),
                None,
            ),
            (
                "240.0.0.0",
                "255.255.255.255",
                AddressClass::Reserved,
                None,
                None,
            ),
        ];
        for (first, last, class, before, after) in ranges {
            assert_eq!(v4(first), class, "{first}");
            assert_eq!(v4(last), class, "{last}");
            for outside in [before, after].into_iter().flatten() {
                assert_eq!(v4(outside), AddressClass::Public, "{outside}");
            }
        }
        assert_eq!(v4("169.254.169.254"), AddressClass::LinkLocal);
        assert_eq!(v4("255.255.255.255"), AddressClass::Reserved);
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "151.101.0.223",
            "223.255.255.255",
        ] {
            assert!(v4(public).is_public(), "{public}");
        }
    }

    #[test]
    fn ipv6_is_public_only_in_global_unicast_outside_special_ranges() {
        let cases = [
            ("::", AddressClass::Unspecified),
            ("::1", AddressClass::Loopback),
            ("::2", AddressClass::NotGlobalUnicast),
            ("::10.0.0.1", AddressClass::NotGlobalUnicast),
            ("::ffff:10.0.0.1", AddressClass::Private),
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("::ffff:169.254.169.254", AddressClass::LinkLocal),
            ("::ffff:1.1.1.1", AddressClass::Public),
            ("64:ff9b::a00:1", AddressClass::Private),
            ("64:ff9b::808:808", AddressClass::Public),
            ("64:ff9b:1::1", AddressClass::ProtocolAssignment),
            ("100::1", AddressClass::ProtocolAssignment),
            ("2001::1", AddressClass::ProtocolAssignment),
            ("2001:1ff:ffff::1", AddressClass::ProtocolAssignment),
            ("2001:2::1", AddressClass::Benchmarking),
            ("2001:db8::1", AddressClass::Documentation),
            ("2002:a00:1::1", AddressClass::ProtocolAssignment),
            ("3fff::1", AddressClass::Documentation),
            ("3fff:fff::1", AddressClass::Documentation),
            ("fc00::1", AddressClass::UniqueLocal),
            ("fd00:ec2::254", AddressClass::UniqueLocal),
            ("fe80::1", AddressClass::LinkLocal),
            ("febf::1", AddressClass::LinkLocal),
            ("fec0::1", AddressClass::SiteLocal),
            ("ff02::1", AddressClass::Multicast),
            ("4000::1", AddressClass::NotGlobalUnicast),
            ("1fff:ffff::1", AddressClass::NotGlobalUnicast),
            ("5f00::1", AddressClass::NotGlobalUnicast),
            ("2001:200::1", AddressClass::Public),
            ("2001:4860:4860::8888", AddressClass::Public),
            ("2606:4700:4700::1111", AddressClass::Public),
            ("2003::1", AddressClass::Public),
            ("3ffe::1", AddressClass::Public),
            ("3fff:1000::1", AddressClass::Public),
        ];
        for (ip, class) in cases {
            assert_eq!(classify(ip.parse().unwrap()), class, "{ip}");
        }
    }

    #[test]
    fn classifying_agrees_with_the_standard_library_where_it_has_an_opinion() {
        // A sweep of IPv4 space in steps that land in every /8: whatever std calls private,
        // loopback, link-local, multicast, broadcast, documentation or unspecified, we block.
        let mut ip = 0u32;
        loop {
            let addr = Ipv4Addr::from(ip);
            let std_blocked = addr.is_private()
                || addr.is_loopback()
                || addr.is_link_local()
                || addr.is_multicast()
                || addr.is_broadcast()
                || addr.is_documentation()
                || addr.is_unspecified();
            if std_blocked {
                assert!(!classify_v4(addr).is_public(), "{addr}");
            }
            match ip.checked_add(65_521) {
                Some(next) => ip = next,
                None => break,
            }
        }
    }

    #[test]
    fn cidr_blocks_parse_contain_and_refuse_bad_text() {
        let block = Cidr::parse("203.0.113.0/24").unwrap();
        assert!(block.contains("203.0.113.7".parse().unwrap()));
        assert!(block.contains("::ffff:203.0.113.7".parse().unwrap()));
        assert!(!block.contains("203.0.114.7".parse().unwrap()));
        assert!(!block.contains("2001:db8::1".parse().unwrap()));
        assert_eq!(block.to_string(), "203.0.113.0/24");
        let one = Cidr::parse("8.8.8.8").unwrap();
        assert_eq!(one.to_string(), "8.8.8.8/32");
        assert!(one.contains("8.8.8.8".parse().unwrap()));
        assert!(!one.contains("8.8.8.9".parse().unwrap()));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains("2001:db8:1::1".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("1.2.3.4".parse().unwrap())
        );
        let typo = Cidr::parse("10.0.0.1/8").unwrap_err();
        assert!(typo.contains("did you mean 10.0.0.0/8"), "{typo}");
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/08",
            "example.com",
            "::/129",
            "1.2.3/24",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad:?}");
        }
    }
}
