//! A machine's contexts (`contexts.py`): the agent's answer to a context operation, checked.
//!
//! The guest is hostile: a context list is bounded in length, every id is one the host could
//! send back, every working directory is a bounded path, every pid a positive 32-bit number.

use super::channel::ProtocolError;
use crate::{ContextInfo, MAX_CONTEXT_CWD_BYTES, validate_context_id};

/// The most contexts a machine holds besides the default (the agent's `MAX_CONTEXTS`).
pub const MAX_CONTEXTS: usize = 32;

#[derive(serde::Deserialize)]
struct RawContexts {
    contexts: Vec<RawContext>,
}

#[derive(serde::Deserialize)]
struct RawContext {
    id: String,
    cwd: String,
    #[serde(default)]
    pid: Option<i64>,
}

/// Decodes a `contexts` event.
pub(super) fn decode(payload: &[u8]) -> Result<Vec<ContextInfo>, ProtocolError> {
    let malformed = |what: &str| ProtocolError::Malformed(format!("contexts event {what}"));
    let raw: RawContexts =
        serde_json::from_slice(payload).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    if raw.contexts.len() > MAX_CONTEXTS + 1 {
        return Err(malformed("lists too many contexts"));
    }
    raw.contexts
        .into_iter()
        .map(|context| {
            validate_context_id(&context.id).map_err(|_| malformed("has an invalid id"))?;
            if context.cwd.len() > MAX_CONTEXT_CWD_BYTES || context.cwd.contains('\0') {
                return Err(malformed("has an invalid working directory"));
            }
            let pid = match context.pid {
                None => None,
                Some(pid) => Some(
                    u32::try_from(pid)
                        .ok()
                        .filter(|pid| *pid > 0)
                        .ok_or_else(|| malformed("has an invalid pid"))?,
                ),
            };
            Ok(ContextInfo {
                id: context.id,
                cwd: context.cwd,
                pid,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_bounds_contexts() {
        let ok = br#"{"ev":"contexts","contexts":[{"id":"default","cwd":"/home/user","pid":7},
            {"id":"0b6c-x_1","cwd":"/tmp","pid":null}]}"#;
        let contexts = decode(ok).unwrap();
        assert_eq!(contexts.len(), 2);
        assert_eq!(contexts[0].pid, Some(7));
        assert_eq!(contexts[1].id, "0b6c-x_1");
        assert_eq!(contexts[1].pid, None);

        for bad in [
            br#"{"ev":"contexts","contexts":[{"id":"a/b","cwd":"/"}]}"#.to_vec(),
            br#"{"ev":"contexts","contexts":[{"id":"","cwd":"/"}]}"#.to_vec(),
            br#"{"ev":"contexts","contexts":[{"id":"a","cwd":"/","pid":-1}]}"#.to_vec(),
            br#"{"ev":"contexts","contexts":[{"id":"a","cwd":"/","pid":4294967296}]}"#.to_vec(),
            br#"{"ev":"contexts"}"#.to_vec(),
            format!(
                r#"{{"ev":"contexts","contexts":[{{"id":"a","cwd":"{}"}}]}}"#,
                "x".repeat(5000)
            )
            .into_bytes(),
        ] {
            assert!(decode(&bad).is_err(), "{}", String::from_utf8_lossy(&bad));
        }
        let many = (0..=MAX_CONTEXTS + 1)
            .map(|i| format!(r#"{{"id":"c{i}","cwd":"/"}}"#))
            .collect::<Vec<_>>()
            .join(",");
        let many = format!(r#"{{"ev":"contexts","contexts":[{many}]}}"#);
        assert!(decode(many.as_bytes()).is_err());
    }
}
