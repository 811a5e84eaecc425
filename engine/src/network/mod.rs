//! Machines' outbound network: policies (`none`, `public`, `allow`), the classifier that keeps
//! every machine off non-public addresses whatever its policy, and allow-list matching: domain
//! rules every transport checks. With the `runtime` feature, also where the engine enforces
//! them: each networked sandbox's namespaces ([`netns`]), and the proxy and DNS server the
//! engine runs in its gate.
//!
//! Why a proxy, and not NAT with firewall rules per machine: domain rules cannot be enforced on
//! addresses alone (a name's addresses change, a literal address must not pass for a name, a
//! name may be rebound to a private address), so every connection goes through code that knows
//! which names the machine looked up, classifies the address it is about to connect to, and
//! connects itself. The kernel's part is fixed and the same for every machine (redirect TCP, DNS
//! and other UDP to the engine, drop the rest), lives in the machine's own namespaces and goes with them,
//! so there are no rules per machine to install, remove or leak.

mod address;
#[cfg(feature = "runtime")]
mod fabric;
#[cfg(feature = "runtime")]
mod gate;
#[cfg(feature = "runtime")]
mod judge;
#[cfg(feature = "runtime")]
mod netns;
mod policy;
#[cfg(feature = "runtime")]
mod udp;

pub use address::{AddressClass, Cidr, classify, classify_v4, classify_v6};
#[cfg(feature = "runtime")]
pub use fabric::{DEFAULT_MAX_CONNECTIONS, Fabric, MachineNetwork, NetworkSettings};
#[cfg(feature = "runtime")]
pub(crate) use netns::{Tools, create as create_namespaces};
pub use policy::{
    AllowList, MAX_ALLOW_RULES, MAX_RULE_BYTES, NetworkMode, NetworkPolicy, RULE_PATTERN,
};
