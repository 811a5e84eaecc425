//! A new sandbox's network, as E2B's create asks for it, in evervm's terms: what the sandbox may
//! reach (`allow_internet_access`, `network.allowOut`/`denyOut`), who may reach its ports
//! (`network.allowPublicTraffic`) and the `Host` its servers see (`network.maskRequestHost`).
//! What evervm cannot give is refused with 400 naming it, never ignored.
//!
//! E2B's egress rules: a destination in `allowOut` is reached, else one in `denyOut` is not, else
//! it is; `allow_internet_access: false` is `denyOut: ["0.0.0.0/0"]`. evervm's policies are
//! `none`, `public` and an allow list, so:
//! - everything denied: the allow list `allowOut` (`none` when empty);
//! - nothing denied: the server's default (`--network-default`, which stands for E2B's
//!   internet); with `allowOut`, that default widened by the list when it is narrower;
//! - single blocks denied and the rest reached: refused (evervm has no deny lists).
//!
//! The server's maximum (`--network-max`) still holds: more is refused by the engine (403).

use axum::http::HeaderValue;
use axum::http::uri::Authority;
use evervm_engine::Tags;
use evervm_engine::network::{NetworkMode, NetworkPolicy};
use serde::Deserialize;

use super::E2bFailure;

/// The hidden tag of a sandbox anyone may reach the ports of.
pub(super) const PUBLIC_TAG: &str = "e2b:public";
/// The hidden tag holding the `Host` a sandbox's servers are sent (`maskRequestHost`).
const MASK_HOST_TAG: &str = "e2b:mask-host";
/// E2B's "all traffic" block.
const ALL_TRAFFIC: &str = "0.0.0.0/0";
/// Where `maskRequestHost` puts the port a request was for.
const PORT_PLACEHOLDER: &str = "${PORT}";
/// The longest `maskRequestHost`.
const MAX_MASK_BYTES: usize = 255;

/// What evervm reads of a new sandbox's `network`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NetworkRequest {
    /// Whether anyone may reach the sandbox's ports (E2B's default), or only its owner
    /// (evervm's default, and `false`).
    #[serde(default)]
    allow_public_traffic: Option<bool>,
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    #[serde(default)]
    mask_request_host: Option<String>,
    /// Per-domain transforms of outgoing requests (E2B's egress proxy): refused unless empty.
    #[serde(default)]
    rules: Option<serde_json::Value>,
    /// A SOCKS5 proxy for outgoing traffic: refused unless empty.
    #[serde(default)]
    egress_proxy: Option<serde_json::Value>,
}

/// A new sandbox's network in evervm's terms.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SandboxNetwork {
    /// The machine's policy; `None`: the server's default.
    pub(super) policy: Option<NetworkPolicy>,
    /// Its hidden tags (public ports, the masked host).
    pub(super) tags: Vec<(String, String)>,
}

/// Whether a JSON value asks for something: not absent, `null`, or only empty objects and
/// arrays (`{"tokens": {}}` asks for nothing).
pub(super) fn asks_for_something(value: Option<&serde_json::Value>) -> bool {
    match value {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Object(map)) => map.values().any(|v| asks_for_something(Some(v))),
        Some(serde_json::Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    }
}

impl SandboxNetwork {
    /// The network E2B's create asks for, over a server whose default network is `default`
    /// and whose sandboxes' ports are public unless asked otherwise when `public_ports`.
    pub(super) fn of(
        allow_internet_access: Option<bool>,
        request: Option<&NetworkRequest>,
        default: &NetworkPolicy,
        public_ports: bool,
    ) -> Result<Self, E2bFailure> {
        let empty = NetworkRequest::default();
        let request = request.unwrap_or(&empty);
        if asks_for_something(request.rules.as_ref()) {
            return Err(E2bFailure::bad_request(
                "network.rules: evervm has no egress proxy to transform a sandbox's outgoing \
                 requests; send the headers from the sandbox itself",
            ));
        }
        if asks_for_something(request.egress_proxy.as_ref()) {
            return Err(E2bFailure::bad_request(
                "network.egressProxy: evervm does not send a sandbox's traffic through a SOCKS5 \
                 proxy; its network is the server's (--network-default, --network-max)",
            ));
        }
        let deny = request.deny_out.as_deref().unwrap_or_default();
        let allow = request.allow_out.as_deref().unwrap_or_default();
        let deny_all =
            allow_internet_access == Some(false) || deny.iter().any(|d| d.trim() == ALL_TRAFFIC);
        let single_blocks: Vec<&str> = deny
            .iter()
            .map(|d| d.trim())
            .filter(|d| *d != ALL_TRAFFIC)
            .collect();
        let allow_list = |rules: &[String]| {
            NetworkPolicy::new(NetworkMode::Allow, rules)
                .map_err(|e| E2bFailure::bad_request(format!("network.allowOut: {}", e.message())))
        };
        let policy = if deny_all {
            // Blocks denied besides all traffic change nothing.
            Some(if allow.is_empty() {
                NetworkPolicy::None
            } else {
                allow_list(allow)?
            })
        } else if !single_blocks.is_empty() {
            return Err(E2bFailure::bad_request(format!(
                "network.denyOut {single_blocks:?}: evervm denies all traffic or nothing, not \
                 single blocks; deny all ({ALL_TRAFFIC:?}) and list what the sandbox may reach \
                 in allowOut"
            )));
        } else if allow.is_empty() {
            None
        } else {
            match default {
                NetworkPolicy::Public => None,
                NetworkPolicy::None => Some(allow_list(allow)?),
                NetworkPolicy::Allow(_) => {
                    let mut rules = default.allow_rules();
                    rules.extend(allow.iter().cloned());
                    Some(allow_list(&rules)?)
                }
            }
        };
        let mut tags = Vec::new();
        if request.allow_public_traffic.unwrap_or(public_ports) {
            tags.push((PUBLIC_TAG.to_owned(), "true".to_owned()));
        }
        if let Some(mask) = &request.mask_request_host {
            check_mask(mask)?;
            tags.push((MASK_HOST_TAG.to_owned(), mask.clone()));
        }
        Ok(Self { policy, tags })
    }
}

/// Checks a `maskRequestHost`: a host, optionally with a port, where `${PORT}` may stand for the
/// port requested.
fn check_mask(mask: &str) -> Result<(), E2bFailure> {
    let example = mask.replace(PORT_PLACEHOLDER, "65535");
    let valid = !mask.is_empty()
        && mask.len() <= MAX_MASK_BYTES
        && !example.contains(['@', '/', '?', '#'])
        && example.parse::<Authority>().is_ok();
    if valid {
        Ok(())
    } else {
        Err(E2bFailure::bad_request(format!(
            "network.maskRequestHost {mask:?}: give a host, optionally with a port, where \
             {PORT_PLACEHOLDER} stands for the port requested (at most {MAX_MASK_BYTES} bytes), \
             like \"app.example.com:{PORT_PLACEHOLDER}\""
        )))
    }
}

/// Whether anyone may reach the ports of a sandbox with these tags.
pub(super) fn is_public(tags: &Tags) -> bool {
    tags.get(PUBLIC_TAG).map(String::as_str) == Some("true")
}

/// The `Host` a request for `port` of a sandbox with these tags is sent with, when its creator
/// masked it.
pub(super) fn masked_host(tags: &Tags, port: u16) -> Option<HeaderValue> {
    let mask = tags.get(MASK_HOST_TAG)?;
    HeaderValue::from_str(&mask.replace(PORT_PLACEHOLDER, &port.to_string())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(json: serde_json::Value) -> NetworkRequest {
        serde_json::from_value(json).unwrap()
    }

    fn policy(
        internet: Option<bool>,
        json: serde_json::Value,
        default: &NetworkPolicy,
    ) -> Result<Option<NetworkPolicy>, String> {
        SandboxNetwork::of(internet, Some(&request(json)), default, false)
            .map(|n| n.policy)
            .map_err(|e| e.message)
    }

    fn allow(rules: &[&str]) -> NetworkPolicy {
        NetworkPolicy::new(NetworkMode::Allow, rules).unwrap()
    }

    #[test]
    fn egress_rules_become_evervms_policies() {
        let none = NetworkPolicy::None;
        let public = NetworkPolicy::Public;
        // Nothing asked: the server's default.
        assert_eq!(policy(None, json!({}), &public), Ok(None));
        assert_eq!(policy(Some(true), json!({}), &none), Ok(None));
        // No internet, however said.
        assert_eq!(
            policy(Some(false), json!({}), &public),
            Ok(Some(NetworkPolicy::None))
        );
        assert_eq!(
            policy(None, json!({"denyOut": ["0.0.0.0/0"]}), &public),
            Ok(Some(NetworkPolicy::None))
        );
        // Everything denied but a list: the list, whatever else was denied.
        let only =
            json!({"denyOut": ["0.0.0.0/0", "8.8.8.8"], "allowOut": ["1.1.1.1", "*.pypi.org"]});
        assert_eq!(
            policy(None, only, &public),
            Ok(Some(allow(&["1.1.1.1", "*.pypi.org"])))
        );
        assert_eq!(
            policy(Some(false), json!({"allowOut": ["pypi.org"]}), &public),
            Ok(Some(allow(&["pypi.org"])))
        );
        // A list with nothing denied widens a narrower default only.
        let widen = json!({"allowOut": ["pypi.org"]});
        assert_eq!(policy(None, widen.clone(), &public), Ok(None));
        assert_eq!(
            policy(None, widen.clone(), &none),
            Ok(Some(allow(&["pypi.org"])))
        );
        assert_eq!(
            policy(None, widen, &allow(&["example.com"])),
            Ok(Some(allow(&["example.com", "pypi.org"])))
        );
    }

    #[test]
    fn what_evervm_cannot_give_is_refused_by_name() {
        let public = NetworkPolicy::Public;
        for (ask, named) in [
            (
                json!({"denyOut": ["8.8.8.8"]}),
                "network.denyOut [\"8.8.8.8\"]",
            ),
            (
                json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["2001:db8::1"]}),
                "network.allowOut",
            ),
            (
                json!({"rules": {"api.example.com": [{"transform": {}}]}}),
                "network.rules",
            ),
            (
                json!({"egressProxy": {"address": "198.18.0.1:1080"}}),
                "network.egressProxy",
            ),
            (
                json!({"maskRequestHost": "a.example.com/path"}),
                "network.maskRequestHost",
            ),
        ] {
            let why = policy(None, ask.clone(), &public).unwrap_err();
            assert!(why.starts_with(named), "{ask}: {why}");
        }
        // Empty forms of the refused fields ask for nothing.
        let empty = json!({"rules": {}, "egressProxy": null, "denyOut": []});
        assert_eq!(policy(None, empty, &public), Ok(None));
    }

    #[test]
    fn public_ports_and_the_masked_host_are_kept_in_hidden_tags() {
        let ask = request(serde_json::json!({
            "allowPublicTraffic": true,
            "maskRequestHost": "custom-host.example.com:${PORT}"
        }));
        let network = SandboxNetwork::of(None, Some(&ask), &NetworkPolicy::None, false).unwrap();
        let tags: Tags = network.tags.into_iter().collect();
        assert!(is_public(&tags));
        assert_eq!(
            masked_host(&tags, 8080).unwrap(),
            "custom-host.example.com:8080"
        );
        assert_eq!(masked_host(&Tags::new(), 8080), None);
        assert!(!is_public(&Tags::new()));
        // With public ports the server's default, public unless asked otherwise.
        let public = |ask: serde_json::Value| {
            let network =
                SandboxNetwork::of(None, Some(&request(ask)), &NetworkPolicy::None, true).unwrap();
            is_public(&network.tags.into_iter().collect())
        };
        assert!(public(json!({})));
        assert!(!public(json!({"allowPublicTraffic": false})));
    }
}
