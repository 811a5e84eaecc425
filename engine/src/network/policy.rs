//! A machine's network policy: what it may reach, chosen at creation within what the operator
//! allows, and kept with the machine (swaps, restarts and forks keep it).

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::address::Cidr;
use crate::error::{Error, Result};

/// The most rules an allow list may hold.
pub const MAX_ALLOW_RULES: usize = 256;
/// The longest rule, in bytes.
pub const MAX_RULE_BYTES: usize = 255;
/// The longest name looked up (RFC 1035), without a trailing dot.
const MAX_NAME_BYTES: usize = 253;
const MAX_LABEL_BYTES: usize = 63;
/// What a rule is, as a regular expression (the wire schema's; `parse_rule` accepts exactly
/// these, up to [`MAX_RULE_BYTES`]): a domain name of letters, digits, `_` and `-` labels (not
/// starting or ending with `-`), with `*.` in front for every name under it and an optional
/// trailing dot; or an IPv4 address with an optional prefix length. Machines have no IPv6, so
/// an allow list has no IPv6 blocks.
pub const RULE_PATTERN: &str = concat!(
    r"^(\*\.)?([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.)*",
    r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?$",
    r"|^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}",
    r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(/(3[0-2]|[12][0-9]|[0-9]))?$",
);

/// How much of the network a machine reaches, from least to most: the operator's maximum is one
/// of these, and a machine may ask for its mode or a lesser one.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Only the machine's own loopback.
    #[default]
    None,
    /// The names and address blocks of an allow list, at public addresses only.
    Allow,
    /// Any public address.
    Public,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Allow => "allow",
            NetworkMode::Public => "public",
        }
    }

    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "none" => Ok(NetworkMode::None),
            "allow" => Ok(NetworkMode::Allow),
            "public" => Ok(NetworkMode::Public),
            other => Err(Error::invalid(format!(
                "unknown network mode {other:?}: use `none`, `public` or `allow`"
            ))),
        }
    }
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a machine may reach over the network. Whatever the policy, only public addresses are
/// ever reached ([`super::classify`]): an allow list cannot open the host, private space or the
/// metadata service.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "PolicyFields", into = "PolicyFields")]
pub enum NetworkPolicy {
    /// Only loopback.
    #[default]
    None,
    /// Outbound TCP, UDP and DNS to public addresses.
    Public,
    /// Names and address blocks; everything else refused.
    Allow(AllowList),
}

/// How a policy is written: `{"mode": "allow", "allow": ["pypi.org", "*.pythonhosted.org"]}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFields {
    mode: NetworkMode,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    allow: Vec<String>,
}

impl TryFrom<PolicyFields> for NetworkPolicy {
    type Error = Error;

    fn try_from(fields: PolicyFields) -> Result<Self> {
        NetworkPolicy::new(fields.mode, &fields.allow)
    }
}

impl From<NetworkPolicy> for PolicyFields {
    fn from(policy: NetworkPolicy) -> Self {
        PolicyFields {
            mode: policy.mode(),
            allow: policy.allow_rules(),
        }
    }
}

impl NetworkPolicy {
    /// A policy of `mode`; `allow` is its list and must be empty unless the mode is `allow`
    /// (where it must not be: an empty allow list is `none`, said as such).
    pub fn new(mode: NetworkMode, allow: &[impl AsRef<str>]) -> Result<Self> {
        match mode {
            NetworkMode::Allow => Ok(NetworkPolicy::Allow(AllowList::parse(allow)?)),
            _ if !allow.is_empty() => Err(Error::invalid(format!(
                "an allow list goes with the network mode `allow`, not `{mode}`"
            ))),
            NetworkMode::None => Ok(NetworkPolicy::None),
            NetworkMode::Public => Ok(NetworkPolicy::Public),
        }
    }

    /// A machine's policy as the bindings show it: its mode's name (none when the server did not
    /// say) and its allow list (empty unless the mode is `allow`).
    pub fn mode_and_rules(policy: Option<&NetworkPolicy>) -> (Option<String>, Vec<String>) {
        (
            policy.map(|p| p.mode().as_str().to_owned()),
            policy.map(NetworkPolicy::allow_rules).unwrap_or_default(),
        )
    }

    /// The policy a binding's `network` option names when it is a word: `none` or `public`
    /// (an allow list is given as the list itself).
    pub fn from_mode_name(name: &str) -> Result<Self> {
        match NetworkMode::parse(name) {
            Ok(NetworkMode::None) => Ok(NetworkPolicy::None),
            Ok(NetworkMode::Public) => Ok(NetworkPolicy::Public),
            Ok(NetworkMode::Allow) => Err(Error::invalid(
                "network `allow`: give the list itself, like [\"pypi.org\", \"*.pythonhosted.org\"]",
            )),
            Err(e) => Err(Error::invalid(format!(
                "network {name:?}: {} (or a list of names and blocks to allow)",
                e.message()
            ))),
        }
    }

    pub fn mode(&self) -> NetworkMode {
        match self {
            NetworkPolicy::None => NetworkMode::None,
            NetworkPolicy::Public => NetworkMode::Public,
            NetworkPolicy::Allow(_) => NetworkMode::Allow,
        }
    }

    /// The allow list as written (normalized), empty unless the mode is `allow`.
    pub fn allow_rules(&self) -> Vec<String> {
        match self {
            NetworkPolicy::Allow(list) => list.rules.iter().map(ToString::to_string).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether the machine has a network beyond loopback.
    pub fn is_networked(&self) -> bool {
        !matches!(self, NetworkPolicy::None)
    }

    /// Whether a connection to `name` (as the machine asked for it) may be made, before its
    /// addresses are checked.
    pub fn allows_name(&self, name: &str) -> bool {
        match self {
            NetworkPolicy::None => false,
            NetworkPolicy::Public => true,
            NetworkPolicy::Allow(list) => list.allows_name(name),
        }
    }

    /// Whether a connection to the literal address `ip` may be made, before it is classified:
    /// under `allow`, only a CIDR rule lets a literal address through, never a domain rule.
    pub fn allows_literal_address(&self, ip: IpAddr) -> bool {
        match self {
            NetworkPolicy::None => false,
            NetworkPolicy::Public => true,
            NetworkPolicy::Allow(list) => list.allows_address(ip),
        }
    }
}

/// The rules of an `allow` policy: domain names (`example.com`, or `*.example.com` for every name
/// under it, not the name itself) and address blocks (`203.0.113.0/24`, or one address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    rules: Vec<AllowRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowRule {
    /// An exact name, lowercase, without a trailing dot.
    Name(String),
    /// Every name strictly under this one.
    Subdomains(String),
    Block(Cidr),
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowRule::Name(name) => f.write_str(name),
            AllowRule::Subdomains(name) => write!(f, "*.{name}"),
            AllowRule::Block(block) => block.fmt(f),
        }
    }
}

impl AllowList {
    /// Parses rules; names are lowercased and lose a trailing dot, duplicates go, the order
    /// stays.
    pub fn parse(rules: &[impl AsRef<str>]) -> Result<Self> {
        if rules.is_empty() {
            return Err(Error::invalid(
                "the network mode `allow` needs at least one name or address block (for no \
                 network at all, use the mode `none`)",
            ));
        }
        if rules.len() > MAX_ALLOW_RULES {
            return Err(Error::invalid(format!(
                "the allow list has {} rules (at most {MAX_ALLOW_RULES})",
                rules.len()
            )));
        }
        let mut parsed: Vec<AllowRule> = Vec::with_capacity(rules.len());
        for rule in rules {
            let rule = parse_rule(rule.as_ref())?;
            if !parsed.contains(&rule) {
                parsed.push(rule);
            }
        }
        Ok(Self { rules: parsed })
    }

    fn allows_name(&self, name: &str) -> bool {
        let Some(name) = normalize_name(name, MAX_NAME_BYTES) else {
            return false;
        };
        self.rules.iter().any(|rule| match rule {
            AllowRule::Name(allowed) => *allowed == name,
            AllowRule::Subdomains(parent) => name
                .strip_suffix(parent.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            AllowRule::Block(_) => false,
        })
    }

    fn allows_address(&self, ip: IpAddr) -> bool {
        self.rules.iter().any(|rule| match rule {
            AllowRule::Block(block) => block.contains(ip),
            _ => false,
        })
    }
}

fn parse_rule(text: &str) -> Result<AllowRule> {
    if text.len() > MAX_RULE_BYTES {
        return Err(Error::invalid(format!(
            "allow list: a rule of {} bytes (at most {MAX_RULE_BYTES})",
            text.len()
        )));
    }
    // An address or a block: anything with a `/` or a `:`, or that parses as an address.
    if text.contains('/') || text.contains(':') || text.parse::<IpAddr>().is_ok() {
        let block =
            Cidr::parse_masked(text).map_err(|e| Error::invalid(format!("allow list: {e}")))?;
        if !block.is_ipv4() {
            return Err(Error::invalid(format!(
                "allow list: {text:?} is IPv6, and machines have no IPv6: list IPv4 addresses \
                 and blocks, or names"
            )));
        }
        return Ok(AllowRule::Block(block));
    }
    let (wildcard, name) = match text.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let bad = |why: &str| Error::invalid(format!("allow list: {text:?} {why}"));
    if !text.is_ascii() {
        return Err(bad(
            "is not ASCII: write an internationalized name in its xn-- (punycode) form",
        ));
    }
    if name.contains('*') {
        return Err(bad(
            "has a `*` that is not its first label: `*.example.com` allows every name under \
             example.com, nothing else takes a wildcard",
        ));
    }
    let Some(name) = normalize_name(name, MAX_RULE_BYTES) else {
        return Err(bad(
            "is neither an IPv4 address or block nor a domain name (labels of 1 to 63 letters, \
             digits, hyphens (not at either end) or underscores)",
        ));
    };
    Ok(if wildcard {
        AllowRule::Subdomains(name)
    } else {
        AllowRule::Name(name)
    })
}

/// A domain name lowercased and without its trailing dot, if it is a valid host name of at most
/// `max` bytes.
fn normalize_name(name: &str, max: usize) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= max
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= MAX_LABEL_BYTES
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    valid.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(rules: &[&str]) -> NetworkPolicy {
        NetworkPolicy::new(NetworkMode::Allow, rules).unwrap()
    }

    #[test]
    fn modes_order_from_none_to_public() {
        assert!(NetworkMode::None < NetworkMode::Allow);
        assert!(NetworkMode::Allow < NetworkMode::Public);
        for mode in [NetworkMode::None, NetworkMode::Allow, NetworkMode::Public] {
            assert_eq!(NetworkMode::parse(mode.as_str()).unwrap(), mode);
        }
        let unknown = NetworkMode::parse("open").unwrap_err();
        assert!(unknown.message().contains("`none`, `public` or `allow`"));
    }

    #[test]
    fn names_match_exactly_or_strictly_below_a_wildcard() {
        let policy = allow(&["Example.COM.", "*.pythonhosted.org", "pypi.org"]);
        for allowed in [
            "example.com",
            "EXAMPLE.com.",
            "files.pythonhosted.org",
            "a.b.pythonhosted.org",
            "pypi.org",
        ] {
            assert!(policy.allows_name(allowed), "{allowed}");
        }
        for refused in [
            "www.example.com",
            "pythonhosted.org",
            "evilpythonhosted.org",
            "files.pythonhosted.org.evil.com",
            "pypi.org.evil.com",
            "xpypi.org",
            "",
            ".",
            "example..com",
        ] {
            assert!(!policy.allows_name(refused), "{refused}");
        }
        assert_eq!(
            policy.allow_rules(),
            ["example.com", "*.pythonhosted.org", "pypi.org"]
        );
    }

    #[test]
    fn a_domain_rule_never_lets_a_literal_address_through_but_a_block_does() {
        let policy = allow(&["example.com", "203.0.113.0/24", "10.1.2.3/8", "8.8.8.8"]);
        assert!(policy.allows_literal_address("203.0.113.9".parse().unwrap()));
        // A block written with host bits is the block they are in.
        assert!(policy.allows_literal_address("10.200.0.1".parse().unwrap()));
        assert!(policy.allow_rules().contains(&"10.0.0.0/8".to_owned()));
        assert!(policy.allows_literal_address("::ffff:8.8.8.8".parse().unwrap()));
        assert!(policy.allows_literal_address("8.8.8.8".parse().unwrap()));
        assert!(!policy.allows_literal_address("8.8.4.4".parse().unwrap()));
        assert!(!policy.allows_literal_address("93.184.216.34".parse().unwrap()));
        assert!(!policy.allows_name("203.0.113.9"));
        assert!(!NetworkPolicy::None.allows_literal_address("1.1.1.1".parse().unwrap()));
        assert!(NetworkPolicy::Public.allows_literal_address("1.1.1.1".parse().unwrap()));
        assert!(!NetworkPolicy::None.allows_name("example.com"));
        assert!(NetworkPolicy::Public.allows_name("example.com"));
    }

    #[test]
    fn bad_rules_are_refused_with_what_was_wrong() {
        let cases = [
            ("*", "wildcard"),
            ("*.", "nor a domain name"),
            ("ex*ample.com", "wildcard"),
            ("*.*.example.com", "wildcard"),
            ("-example.com", "nor a domain name"),
            ("exa mple.com", "nor a domain name"),
            (" example.com", "nor a domain name"),
            ("bücher.de", "punycode"),
            ("10.0.0.0/40", "prefix length"),
            ("fe80::1%eth0", "not an IP address"),
            ("2001:db8::/32", "machines have no IPv6"),
        ];
        for (rule, why) in cases {
            let e = NetworkPolicy::new(NetworkMode::Allow, &[rule]).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
            assert!(e.message().contains(why), "{rule:?}: {}", e.message());
        }
        let long = format!("{}.com", "a".repeat(64));
        assert!(NetworkPolicy::new(NetworkMode::Allow, &[long]).is_err());
        let many: Vec<String> = (0..=MAX_ALLOW_RULES)
            .map(|i| format!("h{i}.example.com"))
            .collect();
        assert!(NetworkPolicy::new(NetworkMode::Allow, &many).is_err());
        assert!(NetworkPolicy::new(NetworkMode::Allow, &many[..MAX_ALLOW_RULES]).is_ok());
        let empty: [&str; 0] = [];
        assert!(
            NetworkPolicy::new(NetworkMode::Allow, &empty)
                .unwrap_err()
                .message()
                .contains("`none`")
        );
        assert!(NetworkPolicy::new(NetworkMode::Public, &["example.com"]).is_err());
    }

    #[test]
    fn policies_round_trip_through_their_written_form() {
        for policy in [
            NetworkPolicy::None,
            NetworkPolicy::Public,
            allow(&["*.github.com", "151.101.0.0/16"]),
        ] {
            let text = serde_json::to_string(&policy).unwrap();
            let back: NetworkPolicy = serde_json::from_str(&text).unwrap();
            assert_eq!(back, policy, "{text}");
        }
        assert_eq!(
            serde_json::to_string(&NetworkPolicy::Public).unwrap(),
            r#"{"mode":"public"}"#
        );
        let bad = serde_json::from_str::<NetworkPolicy>(r#"{"mode":"allow","allow":["a b"]}"#);
        assert!(bad.is_err());
        let none: NetworkPolicy = serde_json::from_str(r#"{"mode":"none"}"#).unwrap();
        assert!(!none.is_networked());
    }
}
