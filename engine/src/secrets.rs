//! Secrets at rest: the values of machines' secret environment variables are sealed in the store
//! (SQLite or PostgreSQL) with a key the operator gives (`EVERVM_SECRET_KEY`, or a file named by
//! `EVERVM_SECRET_KEY_FILE`), ChaCha20-Poly1305 (ring's AEAD), a fresh random nonce per value.
//!
//! A sealed value reads `evervm-sealed:v1:<key id>:<base64url(nonce ‖ ciphertext ‖ tag)>`; its
//! associated data binds it to the machine and the variable it belongs to, so a value copied to
//! another row or variable does not open. The key id (from the key's SHA-256) says which key
//! sealed it: after a rotation the old key goes in `EVERVM_SECRET_KEY_PREVIOUS` until
//! `evervm secret-key rotate` has sealed everything again with the new one. A value sealed with
//! a key the server was not given, or altered, is a clear error naming the key, never garbage.
//! Values stored before a key was given stay readable, and are sealed when next written or
//! rotated.

use std::sync::Arc;

use base64::Engine as _;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind, Result};

/// What every sealed value starts with.
pub const SEALED_PREFIX: &str = "evervm-sealed:v1:";

/// The environment variables that give the keys.
pub const KEY_ENV: &str = "EVERVM_SECRET_KEY";
pub const KEY_FILE_ENV: &str = "EVERVM_SECRET_KEY_FILE";
pub const PREVIOUS_KEYS_ENV: &str = "EVERVM_SECRET_KEY_PREVIOUS";

const KEY_BYTES: usize = 32;

/// One key: its id (16 hex digits of its SHA-256) and the AEAD key.
struct SecretKey {
    id: String,
    key: LessSafeKey,
}

impl SecretKey {
    fn parse(text: &str, what: &str) -> Result<Self> {
        let text = text.trim();
        let bytes = if text.len() == KEY_BYTES * 2 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex::decode(text).ok()
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .ok()
                .or_else(|| {
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .decode(text)
                        .ok()
                })
        };
        // The error never quotes the text: it is a key.
        let bytes = bytes.filter(|b| b.len() == KEY_BYTES).ok_or_else(|| {
            Error::invalid(format!(
                "{what} is not a secret key: expected 32 bytes as 64 hex digits or base64 \
                 (`evervm secret-key generate` makes one)"
            ))
        })?;
        let id = hex::encode(
            &Sha256::digest([b"evervm-secret-key-id\0".as_slice(), &bytes].concat())[..8],
        );
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
            .map_err(|_| Error::internal("the secret key was refused by the cipher"))?;
        Ok(Self {
            id,
            key: LessSafeKey::new(key),
        })
    }
}

/// The keys a server seals and opens secrets with: the current one (sealing and opening) and
/// previous ones (opening only, until a rotation has sealed everything with the current one).
pub struct SecretKeys {
    current: SecretKey,
    previous: Vec<SecretKey>,
}

impl std::fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretKeys")
            .field("current", &self.current.id)
            .field(
                "previous",
                &self.previous.iter().map(|k| &k.id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl SecretKeys {
    /// The keys from `current` and `previous` (each 64 hex digits or base64 of 32 bytes).
    pub fn parse(current: &str, previous: &[&str]) -> Result<Self> {
        Ok(Self {
            current: SecretKey::parse(current, KEY_ENV)?,
            previous: previous
                .iter()
                .filter(|p| !p.trim().is_empty())
                .map(|p| SecretKey::parse(p, PREVIOUS_KEYS_ENV))
                .collect::<Result<_>>()?,
        })
    }

    /// The keys the environment gives: `EVERVM_SECRET_KEY` or the file `EVERVM_SECRET_KEY_FILE`
    /// names, with `EVERVM_SECRET_KEY_PREVIOUS` (comma-separated); `None` when neither is set.
    pub fn from_env() -> Result<Option<Arc<Self>>> {
        let given = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
        let current = match (given(KEY_ENV), given(KEY_FILE_ENV)) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(format!(
                    "both {KEY_ENV} and {KEY_FILE_ENV} are set: give the key one way"
                )));
            }
            (Some(key), None) => key,
            (None, Some(path)) => std::fs::read_to_string(&path).map_err(|e| {
                Error::invalid(format!(
                    "cannot read the secret key file {path} ({KEY_FILE_ENV}): {e}"
                ))
            })?,
            (None, None) => {
                if given(PREVIOUS_KEYS_ENV).is_some() {
                    return Err(Error::invalid(format!(
                        "{PREVIOUS_KEYS_ENV} is set without {KEY_ENV}: give the current key too"
                    )));
                }
                return Ok(None);
            }
        };
        let previous = given(PREVIOUS_KEYS_ENV).unwrap_or_default();
        let previous: Vec<&str> = previous.split(',').collect();
        Self::parse(&current, &previous).map(|keys| Some(Arc::new(keys)))
    }

    /// A new random key, as 64 hex digits.
    pub fn generate() -> Result<String> {
        let mut bytes = [0u8; KEY_BYTES];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| Error::internal("the system's random source failed"))?;
        Ok(hex::encode(bytes))
    }

    /// The current key's id.
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    /// `plaintext` sealed with the current key, bound to `context`.
    pub fn seal(&self, plaintext: &str, context: &str) -> Result<String> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::internal("the system's random source failed"))?;
        let mut sealed = plaintext.as_bytes().to_vec();
        self.current
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| Error::internal("sealing a secret failed"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!(
            "{SEALED_PREFIX}{}:{}",
            self.current.id,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out)
        ))
    }

    /// Whether `text` is sealed with the current key.
    pub fn sealed_with_current(&self, text: &str) -> bool {
        key_id(text) == Some(self.current.id.as_str())
    }
}

/// Whether a stored value is sealed.
pub fn is_sealed(text: &str) -> bool {
    text.starts_with(SEALED_PREFIX)
}

fn key_id(text: &str) -> Option<&str> {
    text.strip_prefix(SEALED_PREFIX)?.split(':').next()
}

/// A stored value opened: as it is when it is not sealed; opened with the key that sealed it
/// otherwise (`what` names it in errors, `context` is what it was bound to).
pub fn open(keys: Option<&SecretKeys>, text: &str, context: &str, what: &str) -> Result<String> {
    let Some(rest) = text.strip_prefix(SEALED_PREFIX) else {
        return Ok(text.to_owned());
    };
    let (id, body) = rest.split_once(':').ok_or_else(|| damaged(what))?;
    let Some(keys) = keys else {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "{what} is sealed with secret key {id}, and this server was given no key: start \
                 it with {KEY_ENV} (or {KEY_FILE_ENV}) set to that key"
            ),
        ));
    };
    let key = std::iter::once(&keys.current)
        .chain(&keys.previous)
        .find(|k| k.id == id)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{what} is sealed with secret key {id}, which this server was not given (its \
                     key is {}): give that key in {PREVIOUS_KEYS_ENV} and run `evervm secret-key \
                     rotate`",
                    keys.current.id
                ),
            )
        })?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| damaged(what))?;
    if bytes.len() < NONCE_LEN {
        return Err(damaged(what));
    }
    let (nonce, sealed) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| damaged(what))?;
    let mut sealed = sealed.to_vec();
    let opened = key
        .key
        .open_in_place(nonce, Aad::from(context.as_bytes()), &mut sealed)
        .map_err(|_| damaged(what))?;
    String::from_utf8(opened.to_vec()).map_err(|_| damaged(what))
}

fn damaged(what: &str) -> Error {
    Error::new(
        ErrorKind::Internal,
        format!("{what} is sealed but does not open: it was altered or damaged in the store"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn sealed_values_open_only_with_their_key_and_context() {
        let key_b = SecretKeys::generate().unwrap();
        let a = SecretKeys::parse(KEY_A, &[]).unwrap();
        let sealed = a.seal("sk-live-123", "m-1/API_KEY").unwrap();
        assert!(is_sealed(&sealed) && !sealed.contains("sk-live-123"));
        assert_ne!(
            sealed,
            a.seal("sk-live-123", "m-1/API_KEY").unwrap(),
            "fresh nonces"
        );
        assert_eq!(
            open(Some(&a), &sealed, "m-1/API_KEY", "it").unwrap(),
            "sk-live-123"
        );
        // Another machine's or variable's value does not open here.
        assert!(open(Some(&a), &sealed, "m-2/API_KEY", "it").is_err());
        // No key, another key: a clear refusal naming the key.
        let no_key = open(None, &sealed, "m-1/API_KEY", "it").unwrap_err();
        assert!(no_key.message().contains(a.current_id()), "{no_key}");
        let b = SecretKeys::parse(&key_b, &[]).unwrap();
        let other = open(Some(&b), &sealed, "m-1/API_KEY", "it").unwrap_err();
        assert!(other.message().contains(PREVIOUS_KEYS_ENV), "{other}");
        // After a rotation, the old key opens what it sealed.
        let rotated = SecretKeys::parse(&key_b, &[KEY_A]).unwrap();
        assert_eq!(
            open(Some(&rotated), &sealed, "m-1/API_KEY", "it").unwrap(),
            "sk-live-123"
        );
        assert!(!rotated.sealed_with_current(&sealed));
        // Altered: refused, never garbage.
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 3;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert!(open(Some(&a), &altered, "m-1/API_KEY", "it").is_err());
        // Not sealed: as it is.
        assert_eq!(open(None, "plain", "x", "it").unwrap(), "plain");
        // Keys that are not keys, and whose text is never repeated.
        let bad = SecretKeys::parse("hunter2", &[]).unwrap_err();
        assert!(!bad.message().contains("hunter2"), "{bad}");
    }
}
