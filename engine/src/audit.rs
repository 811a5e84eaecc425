//! An audit log's entries and the queries that read them, as every door and client sees them
//! (the store keeps them: `store/audit.rs`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AuditEntry {
    /// Its place in the log (0 before it is stored): larger is later.
    pub id: i64,
    pub at: DateTime<Utc>,
    /// The node that served the call, in a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// How the call came: `api`, `websocket`, `mcp`, `e2b` or `cli` (the operator's commands).
    pub door: String,
    /// The caller's account (`None` for the operator's own commands that name none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The id of the token the call carried (never its secret); `None` for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// What was asked: `machine.create`, `exec`, `file.write`, `token.create`, ...
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// `ok`, or what refused it (`404 Not Found`, `error`).
    pub outcome: String,
    /// What the action was about, briefly: a checkpoint's or a file's name, the machine a fork
    /// made, the code of an instruction or its SHA-256 (by the server's setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AuditEntry {
    /// An entry for a call made now (the node is set when it is stored).
    pub fn now(door: &str, action: &str, outcome: &str) -> Self {
        Self {
            id: 0,
            at: Utc::now(),
            node: None,
            door: door.to_owned(),
            account: None,
            token_id: None,
            action: action.to_owned(),
            machine: None,
            outcome: outcome.to_owned(),
            detail: None,
        }
    }
}

/// Which entries to read: those matching every filter given, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    pub account: Option<String>,
    pub machine: Option<String>,
    pub action: Option<String>,
    /// Entries at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Entries before this id (the smallest id of the page before: paging backwards).
    pub before_id: Option<i64>,
    /// At most this many (bounded by [`AUDIT_PAGE_MAX`]).
    pub limit: usize,
}

/// The most entries one read gives.
pub const AUDIT_PAGE_MAX: usize = 1000;
