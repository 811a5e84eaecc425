//! Machines' outbound network: policies (`none`, `public`, `allow`), the classifier that keeps
//! every machine off non-public addresses whatever its policy, and allow-list matching. These
//! are domain rules every transport checks; the engine enforces them where a machine's traffic
//! leaves its sandbox.

mod address;
mod policy;

pub use address::{AddressClass, Cidr, classify, classify_v4, classify_v6};
pub use policy::{AllowList, MAX_ALLOW_RULES, NetworkMode, NetworkPolicy};
