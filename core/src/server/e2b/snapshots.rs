//! E2B's snapshots (`sandbox.create_snapshot`, `Sandbox.create(snapshot_id)`,
//! `Sandbox.list_snapshots`, `Sandbox.delete_snapshot`) over evervm's forks: a snapshot is a
//! machine of its own, a fork of the sandbox (memory and files) that never runs, tagged as a
//! snapshot and never listed as a sandbox. A sandbox made from it is a fork of it; killing the
//! sandbox it was taken from leaves it. Its chunks are shared with the sandbox's, so it costs the
//! disk of what changed since; it counts as one of the account's machines.
//!
//! Its id is E2B's: `<name>:default` when named, else `<machine>:default`. A name taken again
//! replaces the snapshot that had it (E2B: a new build of the same template).

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use evervm_engine::{Account, ErrorKind, ForkMachine, ListCursor, MachineInfo, Tags};
use serde::{Deserialize, Serialize};

use super::control::{self, FILESYSTEM_ONLY_PAUSE};
use super::listing::{MAX_LIST_LIMIT, page_response, parse_limit};
use super::{ApiCaller, E2bFailure, E2bState};

/// The tag that makes a machine a snapshot.
const KIND_TAG: &str = "e2b:kind";
const SNAPSHOT_KIND: &str = "snapshot";
/// The sandbox a snapshot was taken of.
const SOURCE_TAG: &str = "e2b:snapshot-of";
/// A named snapshot's name.
const NAME_TAG: &str = "e2b:snapshot-name";
/// The tag part of every snapshot's id (E2B's templates' default tag).
const ID_TAG: &str = ":default";
/// The longest snapshot name.
const MAX_NAME_BYTES: usize = 128;

/// Whether a machine with these tags is a snapshot (never a sandbox).
pub(super) fn is_snapshot(tags: &Tags) -> bool {
    tags.get(KIND_TAG).map(String::as_str) == Some(SNAPSHOT_KIND)
}

/// Whether a template id names a snapshot (rather than an image).
pub(super) fn is_snapshot_id(template: &str) -> bool {
    template.ends_with(ID_TAG)
}

#[derive(Debug, Default, Deserialize)]
struct SnapshotRequest {
    #[serde(default)]
    name: Option<String>,
    /// `false`: files only (refused, as a filesystem-only pause is).
    #[serde(default)]
    memory: Option<bool>,
}

/// A snapshot as E2B answers it.
#[derive(Debug, Serialize)]
struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

fn info_of(machine: &MachineInfo) -> SnapshotInfo {
    let snapshot_id = match machine.tags.get(NAME_TAG) {
        Some(name) => format!("{name}{ID_TAG}"),
        None => format!("{}{ID_TAG}", machine.name),
    };
    SnapshotInfo {
        names: vec![snapshot_id.clone()],
        snapshot_id,
    }
}

fn check_name(name: &str) -> Result<(), E2bFailure> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if valid {
        Ok(())
    } else {
        Err(E2bFailure::bad_request(format!(
            "snapshot name {name:?}: 1 to {MAX_NAME_BYTES} letters, digits, `-`, `_`, `.` or `/`"
        )))
    }
}

/// The caller's snapshot with this id (`<name>:default` or `<machine>:default`, the tag
/// optional), if there is one.
pub(super) async fn find(
    state: &E2bState,
    account: &Account,
    snapshot_id: &str,
) -> Result<Option<MachineInfo>, E2bFailure> {
    let base = snapshot_id.strip_suffix(ID_TAG).unwrap_or(snapshot_id);
    if base.is_empty() || base.contains(':') {
        return Ok(None);
    }
    match state.engine.machine_info(account, base).await {
        Ok(info) if is_snapshot(&info.tags) && !info.tags.contains_key(NAME_TAG) => {
            return Ok(Some(info));
        }
        Ok(_) => {}
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidInput) => {}
        Err(e) => return Err(E2bFailure::from(&e)),
    }
    let filter = Tags::from([
        (KIND_TAG.to_owned(), SNAPSHOT_KIND.to_owned()),
        (NAME_TAG.to_owned(), base.to_owned()),
    ]);
    let page = state
        .engine
        .list_machines_page_in(account, &filter, 1, None, false)
        .await?;
    Ok(page.machines.into_iter().next())
}

/// `POST /sandboxes/{id}/snapshots`: a snapshot of the sandbox as it is now; the sandbox runs on.
pub(super) async fn create(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bFailure> {
    let request: SnapshotRequest = control::parse_body(&body)?;
    if request.memory == Some(false) {
        return Err(E2bFailure::bad_request(FILESYSTEM_ONLY_PAUSE));
    }
    let source = control::machine(&state, &account, &id).await?;
    let mut tags = Tags::from([
        (KIND_TAG.to_owned(), SNAPSHOT_KIND.to_owned()),
        (SOURCE_TAG.to_owned(), source.name.to_string()),
    ]);
    let replaced = match &request.name {
        Some(name) => {
            check_name(name)?;
            tags.insert(NAME_TAG.to_owned(), name.clone());
            find(&state, &account, name).await?
        }
        None => None,
    };
    // Made before the one it replaces goes: a failure leaves the old one.
    let snapshot = state
        .engine
        .fork_machine(
            &account,
            source.name.as_str(),
            ForkMachine {
                tags: Some(tags),
                at: None,
            },
        )
        .await
        .map_err(|e| control::not_found_as_sandbox(&e, &id))?;
    if let Some(old) = replaced
        && let Err(e) = state
            .engine
            .delete_machine(&account, old.name.as_str())
            .await
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(snapshot = %old.name, "cannot delete the snapshot a new one replaced: {e}");
    }
    Ok((StatusCode::CREATED, Json(info_of(&snapshot))).into_response())
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: the caller's snapshots, newest first.
pub(super) async fn list(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    RawQuery(query): RawQuery,
) -> Result<Response, E2bFailure> {
    let mut filter = Tags::from([(KIND_TAG.to_owned(), SNAPSHOT_KIND.to_owned())]);
    let mut limit = MAX_LIST_LIMIT;
    let mut cursor = None;
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "sandboxID" => {
                filter.insert(SOURCE_TAG.to_owned(), value.into_owned());
            }
            "name" => {
                let name = value.strip_suffix(ID_TAG).unwrap_or(&value);
                filter.insert(NAME_TAG.to_owned(), name.to_owned());
            }
            "limit" => limit = parse_limit(&value, "snapshots")?,
            "nextToken" => cursor = Some(ListCursor::parse(&value)?),
            other => {
                return Err(E2bFailure::bad_request(format!(
                    "the query parameter {other:?} is not one this server knows (sandboxID, \
                     name, limit, nextToken)"
                )));
            }
        }
    }
    let page = state
        .engine
        .list_machines_page_in(&account, &filter, limit, cursor, false)
        .await?;
    let snapshots: Vec<SnapshotInfo> = page.machines.iter().map(info_of).collect();
    Ok(page_response(&snapshots, page.next_cursor))
}

/// `DELETE /templates/{id}` (how the SDKs delete a snapshot): 204, or 404 when there is none.
pub(super) async fn delete(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bFailure> {
    let Some(snapshot) = find(&state, &account, &id).await? else {
        return Err(E2bFailure::new(
            StatusCode::NOT_FOUND,
            format!("snapshot {id:?} not found"),
        ));
    };
    state
        .engine
        .delete_machine(&account, snapshot.name.as_str())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_and_ids() {
        assert!(check_name("team/snap-1.v2_x").is_ok());
        for bad in ["", "a:b", "a b", &"n".repeat(MAX_NAME_BYTES + 1)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(is_snapshot_id("snap:default"));
        assert!(!is_snapshot_id("code-interpreter-v1"));
        let mut tags = Tags::from([(KIND_TAG.to_owned(), SNAPSHOT_KIND.to_owned())]);
        assert!(is_snapshot(&tags));
        tags.insert(KIND_TAG.to_owned(), "other".to_owned());
        assert!(!is_snapshot(&tags));
    }
}
