//! What keeps a sandbox's traffic, and the account's key, with evervm.
//!
//! - Each sandbox gets its own `envdAccessToken`: a credential scoped to that sandbox
//!   ([`Engine::scoped_credential`]), never the account's API key. It opens that sandbox's envd
//!   and code interpreter and nothing else, and stops working with the key's token.
//! - Answers about sandboxes carry a `domain` that routes nowhere but back here: an SDK that
//!   ignores `E2B_SANDBOX_URL` builds `https://49999-<id>.sdk-too-old@<this host>/...`, whose host
//!   is this listener (the rest is userinfo), so it fails (TLS against plain HTTP; fetch refuses
//!   URLs with credentials) without a lookup or a byte sent elsewhere.
//! - Create refuses the SDK releases known to send sandbox traffic elsewhere, naming the ones
//!   that work.

use axum::http::{HeaderMap, header};
use evervm_engine::{Account, Engine};

use super::{E2bFailure, KEY_PREFIX};

/// What a sandbox's own access token starts with.
const SANDBOX_TOKEN_PREFIX: &str = "e2bs_";
/// The userinfo of the `domain` answered, which names the problem in a leaking SDK's errors.
pub(super) const SINK_USER: &str = "sdk-too-old";
/// The oldest `e2b` release (both languages) that sends envd traffic to `E2B_SANDBOX_URL`.
const OLDEST_CORE: Version = Version(2, 7, 0);
/// The oldest Python `e2b` that `e2b-code-interpreter` 2.9.0 (the oldest that sends `/execute`
/// to `E2B_SANDBOX_URL`) installs with: an older core beside the code interpreter's template
/// means an older code interpreter, which sends the cell's code to E2B.
const OLDEST_PYTHON_CORE_FOR_CODE_INTERPRETER: Version = Version(2, 26, 0);
/// The template E2B's code interpreter packages create by default.
const CODE_INTERPRETER_TEMPLATE: &str = "code-interpreter-v1";

/// The scope of a sandbox's access token.
fn scope(sandbox: &str) -> String {
    format!("e2b-sandbox:{sandbox}")
}

/// How answers about sandboxes address the caller's SDK: the evervm token behind its API key
/// (already checked), and the sink domain.
pub(super) struct Access {
    token: String,
    domain: String,
}

impl Access {
    /// From a control-plane request's headers.
    /// The caller's key and the domain answered: the server's `--e2b-domain`, else the sink.
    pub(super) fn of(headers: &HeaderMap, state: &super::E2bState) -> Result<Self, E2bFailure> {
        let key = super::header_text(headers, "x-api-key")
            .or_else(|| super::bearer(headers))
            .unwrap_or_default();
        Ok(Self {
            token: super::token_for_api_key(key)?,
            domain: match &state.domain {
                Some(domain) => domain.to_string(),
                None => sink_domain(headers),
            },
        })
    }

    /// The sandbox's own access token.
    pub(super) async fn envd_access_token(
        &self,
        engine: &Engine,
        sandbox: &str,
    ) -> Result<String, E2bFailure> {
        let credential = engine
            .scoped_credential(&self.token, &scope(sandbox))
            .await?;
        Ok(format!("{SANDBOX_TOKEN_PREFIX}{credential}"))
    }

    pub(super) fn domain(&self) -> String {
        self.domain.clone()
    }
}

/// The account a sandbox request acts for: by the sandbox's access token (for that sandbox
/// only), or by the account's API key.
pub(super) async fn authenticate_sandbox(
    engine: &Engine,
    credential: &str,
    sandbox: &str,
) -> Result<Account, E2bFailure> {
    match credential.strip_prefix(SANDBOX_TOKEN_PREFIX) {
        Some(scoped) => Ok(engine.authenticate_scoped(scoped, &scope(sandbox)).await?),
        None if credential.starts_with(KEY_PREFIX) => {
            let token = super::token_for_api_key(credential)?;
            Ok(engine.authenticate(&token).await?)
        }
        None => Err(E2bFailure::unauthorized(
            "the access token is not this sandbox's: send the envdAccessToken that create or \
             connect answered, as X-Access-Token",
        )),
    }
}

/// The id of the token behind a sandbox request's credential (a sandbox's access token starts
/// with it; an API key encodes the token), for the audit log; empty when it is neither.
pub(super) fn token_id_of(credential: &str) -> String {
    let token = match credential.strip_prefix(SANDBOX_TOKEN_PREFIX) {
        Some(scoped) => scoped.to_owned(),
        None => super::token_for_api_key(credential).unwrap_or_default(),
    };
    crate::server::audit::token_id(&token).to_owned()
}

/// The `domain` evervm answers for sandboxes reached at `host` (`127.0.0.1:3000`), which is
/// also what users set `E2B_DOMAIN` to: every URL an SDK builds under it leads back to `host`.
pub fn sink_domain_for(host: &str) -> String {
    format!("{SINK_USER}@{host}")
}

/// E2B's own sandbox domains, for which the SDKs reach envd at `sandbox.<domain>`: evervm never
/// answers one of them (an SDK would send there what is meant for evervm).
const E2B_DOMAINS: &[&str] = &[
    "e2b.app",
    "e2b.dev",
    "e2b.pro",
    "e2b-staging.dev",
    "e2b-tango.dev",
    "e2b-juliett.dev",
];

/// A domain for `--e2b-domain`, checked: a DNS name (with a port, perhaps) whose wildcard
/// `*.<name>` leads to evervm's E2B listener, and none of E2B's.
pub fn check_domain(domain: &str) -> Result<String, String> {
    let domain = domain.trim().to_ascii_lowercase();
    let (name, port) = match domain.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (domain.as_str(), None),
    };
    let valid_name = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if !valid_name || port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
        return Err(format!(
            "{domain:?} is not a domain: a DNS name, with a port perhaps (sandboxes.example.com \
             or sandboxes.example.com:3000), whose wildcard leads to the E2B listener"
        ));
    }
    if E2B_DOMAINS
        .iter()
        .any(|e2b| name == *e2b || name.ends_with(&format!(".{e2b}")))
    {
        return Err(format!(
            "{domain:?} is E2B's: the SDKs would send what is meant for evervm to E2B"
        ));
    }
    Ok(domain)
}

/// `sdk-too-old@<the host the request came to>`: a domain under which every sandbox URL an SDK
/// builds points back here (see the module's notes).
fn sink_domain(headers: &HeaderMap) -> String {
    // A request another node forwarded says which host its client called.
    let host = headers
        .get(super::forward::CALLED_HOST)
        .or_else(|| headers.get(header::HOST))
        .and_then(|h| h.to_str().ok())
        .map(str::trim)
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        });
    match host {
        Some(host) => sink_domain_for(host),
        // No usable Host (HTTP/1.0): a name that never resolves (RFC 6761).
        None => format!("{SINK_USER}.invalid"),
    }
}

/// A release number: major, minor, patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Version(u64, u64, u64);

impl Version {
    /// `2.26.0`, `2.7.0rc1` (a pre-release counts as its release), `1.0`.
    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.').map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        });
        let major = parts.next()??;
        let minor = parts.next().flatten().unwrap_or(0);
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Self(major, minor, patch))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// Refuses a create from an E2B SDK that would send this sandbox's traffic (the cell's code and
/// the access token) to E2B rather than here. SDKs say what they are in `lang` and
/// `package_version` (the `e2b` core's version) on every control-plane request; a caller that
/// is not an E2B SDK (no `lang`) is not checked.
pub(super) fn check_sdk(headers: &HeaderMap, template: &str) -> Result<(), E2bFailure> {
    let Some(lang) = super::header_text(headers, "lang") else {
        return Ok(());
    };
    let python = match lang {
        "python" => true,
        "js" => false,
        _ => return Ok(()),
    };
    let given = super::header_text(headers, "package_version");
    let version = given.and_then(Version::parse);
    let works = if python {
        "e2b >= 2.26.0 with e2b-code-interpreter >= 2.9.0 (pip install -U e2b-code-interpreter)"
    } else {
        "e2b >= 2.28.0 with @e2b/code-interpreter >= 2.7.0 (npm install @e2b/code-interpreter@latest)"
    };
    let refuse = |what: String| {
        E2bFailure::bad_request(format!(
            "{what} would send this sandbox's traffic (your code and its access token) to E2B's \
             servers instead of evervm, so evervm refuses it: use {works}, with E2B_API_URL and \
             E2B_SANDBOX_URL set to this server (see docs/e2b.md)"
        ))
    };
    let Some(version) = version else {
        return Err(refuse(format!(
            "an E2B SDK that does not say its version (package_version {:?})",
            given.unwrap_or_default()
        )));
    };
    if version < OLDEST_CORE {
        return Err(refuse(format!("e2b {version} (older than {OLDEST_CORE})")));
    }
    if python
        && template == CODE_INTERPRETER_TEMPLATE
        && version < OLDEST_PYTHON_CORE_FOR_CODE_INTERPRETER
    {
        return Err(refuse(format!(
            "e2b {version} with the code interpreter's template (so e2b-code-interpreter older \
             than 2.9.0, which needs e2b >= {OLDEST_PYTHON_CORE_FOR_CODE_INTERPRETER})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("2.26.0"), Some(Version(2, 26, 0)));
        assert_eq!(Version::parse("2.7.0rc1"), Some(Version(2, 7, 0)));
        assert_eq!(Version::parse("1"), Some(Version(1, 0, 0)));
        assert_eq!(Version::parse("x"), None);
        assert!(Version(2, 6, 9) < OLDEST_CORE && Version(2, 10, 0) > OLDEST_CORE);
    }

    #[test]
    fn sdks_that_would_leak_are_refused_at_create() {
        let template = CODE_INTERPRETER_TEMPLATE;
        for (lang, version, ok) in [
            ("python", "2.63.0", true),
            ("python", "2.26.0", true),
            ("python", "2.20.0", false), // CrewAI's pins: e2b 2.20, e2b-code-interpreter 2.6
            ("python", "2.6.4", false),
            ("python", "1.0.0", false),
            ("js", "2.28.0", true),
            ("js", "2.7.0", true),
            ("js", "2.6.1", false),
            ("js", "garbage", false),
        ] {
            let sent = headers(&[("lang", lang), ("package_version", version)]);
            let checked = check_sdk(&sent, template);
            assert_eq!(checked.is_ok(), ok, "{lang} {version}");
            if let Err(failure) = checked {
                assert!(
                    failure.message.contains("E2B_SANDBOX_URL"),
                    "{}",
                    failure.message
                );
            }
        }
        // The core alone, with another template, is fine from 2.7.0.
        let core = headers(&[("lang", "python"), ("package_version", "2.20.0")]);
        assert!(check_sdk(&core, "base").is_ok());
        // Not an E2B SDK: not checked.
        assert!(check_sdk(&HeaderMap::new(), template).is_ok());
        // An SDK that hides its version is refused.
        assert!(check_sdk(&headers(&[("lang", "python")]), template).is_err());
    }

    #[test]
    fn the_domain_leads_back_here() {
        assert_eq!(
            sink_domain(&headers(&[("host", "127.0.0.1:3000")])),
            "sdk-too-old@127.0.0.1:3000"
        );
        assert_eq!(
            sink_domain(&headers(&[("host", "bad host/x?y")])),
            "sdk-too-old.invalid"
        );
        assert_eq!(sink_domain(&HeaderMap::new()), "sdk-too-old.invalid");
    }
}
