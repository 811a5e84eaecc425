//! The audit log's rows, as both databases keep them: one row per state-changing call (who, when,
//! through which door, on which machine, and how it went). Rows name no machine by key: they
//! outlive the machines they name, and go only by age and count ([`Metadata::prune_audit`]).
//!
//! [`Metadata::prune_audit`]: super::Metadata::prune_audit

pub use crate::audit::{AUDIT_PAGE_MAX, AuditEntry, AuditQuery};

use super::schema::Dialect;

/// A parameter of the query [`select`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Parameter {
    Text(String),
    Int(i64),
}

/// The columns read, in [`AuditEntry`]'s order.
pub(super) const COLUMNS: &str =
    "id, at, node, door, account, token_id, action, machine, outcome, detail";

/// The statement inserting one entry, with its ten parameters in [`COLUMNS`]' order after `id`.
pub(super) fn insert(dialect: Dialect) -> String {
    let marks: Vec<String> = (1..=9).map(|n| mark(dialect, n)).collect();
    format!(
        "INSERT INTO audit (at, node, door, account, token_id, action, machine, outcome, detail) \
         VALUES ({})",
        marks.join(", ")
    )
}

/// The query for `query` in `dialect`, with its parameters in order.
pub(super) fn select(query: &AuditQuery, dialect: Dialect) -> (String, Vec<Parameter>) {
    let mut conditions = Vec::new();
    let mut parameters = Vec::new();
    let mut add = |column: &str, operator: &str, value: Parameter| {
        parameters.push(value);
        conditions.push(format!(
            "{column} {operator} {}",
            mark(dialect, parameters.len())
        ));
    };
    if let Some(account) = &query.account {
        add("account", "=", Parameter::Text(account.clone()));
    }
    if let Some(machine) = &query.machine {
        add("machine", "=", Parameter::Text(machine.clone()));
    }
    if let Some(action) = &query.action {
        add("action", "=", Parameter::Text(action.clone()));
    }
    if let Some(since) = query.since {
        add("at", ">=", Parameter::Text(super::stored(since)));
    }
    if let Some(before) = query.before_id {
        add("id", "<", Parameter::Int(before));
    }
    let limit = query.limit.clamp(1, AUDIT_PAGE_MAX);
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {} ", conditions.join(" AND "))
    };
    (
        format!("SELECT {COLUMNS} FROM audit {filter}ORDER BY id DESC LIMIT {limit}"),
        parameters,
    )
}

/// Entries removed at most by one statement of a pruning pass, so that no pass holds the
/// database for long.
pub(crate) const PRUNE_BATCH: i64 = 5000;

/// The statement removing up to [`PRUNE_BATCH`] of the oldest entries that are older than its
/// first parameter (a stored time) or not among the newest (second parameter) entries by id.
pub(super) fn prune(dialect: Dialect) -> String {
    let (older, newest) = (mark(dialect, 1), mark(dialect, 2));
    format!(
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < {older} \
         OR id <= (SELECT COALESCE(MAX(id), 0) FROM audit) - {newest} \
         ORDER BY id LIMIT {PRUNE_BATCH})"
    )
}

/// Parameter `n` as the dialect writes it.
fn mark(dialect: Dialect, n: usize) -> String {
    match dialect {
        Dialect::Sqlite => format!("?{n}"),
        Dialect::Postgres => format!("${n}"),
    }
}

/// An entry from its columns as read.
#[allow(clippy::too_many_arguments)]
pub(super) fn entry(
    id: i64,
    at: &str,
    node: Option<String>,
    door: String,
    account: Option<String>,
    token_id: Option<String>,
    action: String,
    machine: Option<String>,
    outcome: String,
    detail: Option<String>,
) -> crate::error::Result<AuditEntry> {
    Ok(AuditEntry {
        id,
        at: super::parse_time(at)?,
        node,
        door,
        account,
        token_id,
        action,
        machine,
        outcome,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_name_only_the_filters_given() {
        let (sql, parameters) = select(&AuditQuery::default(), Dialect::Sqlite);
        assert_eq!(
            sql,
            format!("SELECT {COLUMNS} FROM audit ORDER BY id DESC LIMIT 1")
        );
        assert!(parameters.is_empty());
        let query = AuditQuery {
            account: Some("alice".into()),
            before_id: Some(7),
            limit: 1_000_000,
            ..AuditQuery::default()
        };
        let (sql, parameters) = select(&query, Dialect::Postgres);
        assert!(
            sql.ends_with("WHERE account = $1 AND id < $2 ORDER BY id DESC LIMIT 1000"),
            "{sql}"
        );
        assert_eq!(
            parameters,
            vec![Parameter::Text("alice".into()), Parameter::Int(7)]
        );
        assert!(insert(Dialect::Sqlite).ends_with("VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"));
        assert!(prune(Dialect::Postgres).contains("at < $1"));
    }
}
