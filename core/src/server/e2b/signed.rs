//! Signed file URLs (`sandbox.download_url(...)`, `upload_url(...)` of a sandbox created
//! `secure`): `/files?path=&username=&signature=v1_...&signature_expiration=`, where the SDK
//! signs `path:operation:username:envdAccessToken[:expiration]` with SHA-256 (E2B's scheme, so
//! that E2B's SDKs make URLs evervm accepts). Such a URL names no sandbox when the SDK talks to
//! `E2B_SANDBOX_URL`: the signature does, as only the holder of one sandbox's access token can
//! make it. So the access tokens this listener has handed out are kept in memory (a few per
//! sandbox, never written anywhere or logged) and the signature is checked against each.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine as _;
use evervm_engine::Account;
use sha2::{Digest, Sha256};

use super::{E2bFailure, E2bState, lock};

/// The access tokens kept per sandbox (the newest).
const TOKENS_PER_SANDBOX: usize = 4;
/// The most sandboxes whose tokens are kept: past it, one is forgotten for each new one (its
/// signed URLs work again once the SDK connects to it). A check costs a hash per token kept.
const MAX_SANDBOXES: usize = 4096;
/// Signatures that match no token, at most, per second (each cost a hash per token kept):
/// past it, signed URLs are refused with 429 for the rest of the second.
const MAX_MISSES_PER_SECOND: u32 = 50;

#[derive(Default)]
pub(crate) struct SignedUrls {
    handed: Mutex<HashMap<String, Vec<String>>>,
    /// The second signatures missed in, and how many.
    misses: Mutex<Option<(std::time::Instant, u32)>>,
}

impl SignedUrls {
    /// Notes an access token handed out for `sandbox`.
    pub(super) fn handed(&self, sandbox: &str, token: &str) {
        let mut handed = lock(&self.handed);
        if handed.len() >= MAX_SANDBOXES
            && !handed.contains_key(sandbox)
            && let Some(evicted) = handed.keys().next().cloned()
        {
            handed.remove(&evicted);
        }
        let tokens = handed.entry(sandbox.to_owned()).or_default();
        if !tokens.iter().any(|t| t == token) {
            tokens.push(token.to_owned());
            if tokens.len() > TOKENS_PER_SANDBOX {
                tokens.remove(0);
            }
        }
    }

    /// Forgets a sandbox that is gone.
    pub(super) fn forget(&self, sandbox: &str) {
        lock(&self.handed).remove(sandbox);
    }
}

/// A signed URL's query.
pub(super) struct Signed<'a> {
    pub path: &'a str,
    pub username: &'a str,
    pub signature: &'a str,
    pub expiration: Option<&'a str>,
}

/// E2B's v1 signature of a file URL.
fn signature(
    path: &str,
    operation: &str,
    username: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let raw = match expiration {
        Some(expiration) => format!("{path}:{operation}:{username}:{token}:{expiration}"),
        None => format!("{path}:{operation}:{username}:{token}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Equal, in a time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The account and sandbox a signed URL acts for, if its signature is one of theirs for
/// `operation` (`read` or `write`) and has not expired.
pub(super) async fn verify(
    state: &E2bState,
    signed: &Signed<'_>,
    operation: &str,
) -> Result<(Account, String), E2bFailure> {
    if let Some(expiration) = signed.expiration {
        let at: i64 = expiration
            .parse()
            .map_err(|_| E2bFailure::bad_request("signature_expiration is not a number"))?;
        if at < chrono::Utc::now().timestamp() {
            return Err(E2bFailure::unauthorized("signature is already expired"));
        }
    }
    {
        let misses = lock(&state.signed.misses);
        if let Some((since, count)) = *misses
            && since.elapsed() < std::time::Duration::from_secs(1)
            && count >= MAX_MISSES_PER_SECOND
        {
            return Err(E2bFailure::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "too many invalid signatures: try again in a second",
            ));
        }
    }
    let found = {
        let handed = lock(&state.signed.handed);
        handed.iter().find_map(|(sandbox, tokens)| {
            tokens
                .iter()
                .find(|token| {
                    let expected = signature(
                        signed.path,
                        operation,
                        signed.username,
                        token,
                        signed.expiration,
                    );
                    same(&expected, signed.signature)
                })
                .map(|token| (sandbox.clone(), token.clone()))
        })
    };
    let Some((sandbox, token)) = found else {
        let mut misses = lock(&state.signed.misses);
        *misses = match *misses {
            Some((since, count)) if since.elapsed() < std::time::Duration::from_secs(1) => {
                Some((since, count + 1))
            }
            _ => Some((std::time::Instant::now(), 1)),
        };
        return Err(E2bFailure::unauthorized("invalid signature"));
    };
    // The token must still hold (its account's token may have been revoked since).
    let account = super::access::authenticate_sandbox(&state.engine, &token, &sandbox).await?;
    Ok((account, sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_e2bs() {
        // What E2B's SDKs compute (Python: base64 of sha256, padding stripped).
        assert_eq!(
            signature("a.txt", "read", "user", "tok", None),
            "v1_wPjHOh/p+K3FbqiyGd5vwPNc/g4IPd8sigMxb1gqu9I"
        );
        assert_eq!(
            signature("a.txt", "read", "user", "tok", Some("1")),
            "v1_5MB4zRiELz5NuBfCdq+gagnf5xJsJPdbJiCoFfYIPQA"
        );
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
