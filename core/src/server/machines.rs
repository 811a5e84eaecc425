//! Accounts and machines: whoami, create, list, info, delete, interrupt, swap, fork,
//! checkpoints.

use axum::Json;
use axum::extract::State;
use evervm_engine::Tags;

use super::AppState;
use super::audit::AuditNote;
use super::auth::Authed;
use super::error::ApiFailure;
use super::extract::{OptionalJsonBody, WirePath, WireQuery};
use crate::convert::server::{create_machine_from_wire, list_filter_from_wire, machine_to_wire};
use crate::protocol::{
    ApiCheckpoint, CreateCheckpointRequest, CreateMachineRequest, CreateMachineResponse,
    DeleteCheckpointResponse, DeleteMachineResponse, ForkMachineRequest, HistoryResponse,
    InterruptRequest, InterruptResponse, LineageResponse, ListCheckpointsResponse,
    ListMachinesRequest, ListMachinesResponse, MachineInfoResponse, RewindRequest, RewindResponse,
    SwapResponse, WhoamiResponse,
};

type ApiResult<T> = Result<Json<T>, ApiFailure>;

/// `GET /v1/whoami`.
pub(crate) async fn whoami(Authed(account): Authed) -> Json<WhoamiResponse> {
    Json(WhoamiResponse {
        account: account.name,
    })
}

/// `GET /v1/nodes`: the cluster's nodes (any account's token may read them).
pub(crate) async fn nodes(
    State(state): State<AppState>,
    Authed(_account): Authed,
) -> ApiResult<crate::protocol::NodesResponse> {
    let nodes = state
        .engine
        .nodes()
        .await?
        .into_iter()
        .map(|(node, alive)| crate::protocol::ApiNode {
            id: node.id,
            address: node.address,
            started_at: node.started_at,
            heartbeat_at: node.heartbeat_at,
            alive,
        })
        .collect();
    Ok(Json(crate::protocol::NodesResponse {
        this_node: state.engine.node_id().map(str::to_owned),
        nodes,
    }))
}

/// `POST /v1/machine/new`: the body may be empty, `null` or an object.
pub(crate) async fn create(
    State(state): State<AppState>,
    Authed(account): Authed,
    note: AuditNote,
    OptionalJsonBody(request): OptionalJsonBody<CreateMachineRequest>,
) -> ApiResult<CreateMachineResponse> {
    let info = state
        .engine
        .create_machine(&account, create_machine_from_wire(request)?)
        .await?;
    note.machine(info.name.as_str());
    Ok(Json(CreateMachineResponse {
        machine_name: info.name.to_string(),
    }))
}

/// A page of a list (evervm): at most `limit` machines, after `cursor`.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct PageQuery {
    limit: Option<u32>,
    cursor: Option<String>,
}

async fn list(
    state: &AppState,
    account: &evervm_engine::Account,
    filter: &Tags,
    page: PageQuery,
) -> ApiResult<ListMachinesResponse> {
    let (machines, next_cursor) = match page {
        PageQuery {
            limit: None,
            cursor: None,
        } => (state.engine.list_machines(account, filter).await?, None),
        PageQuery { limit, cursor } => {
            let cursor = cursor
                .as_deref()
                .map(evervm_engine::ListCursor::parse)
                .transpose()?;
            let limit = limit.map_or(evervm_engine::MAX_PAGE, |n| n as usize);
            let page = state
                .engine
                .list_machines_page(account, filter, limit, cursor)
                .await?;
            (
                page.machines,
                page.next_cursor.map(evervm_engine::ListCursor::encode),
            )
        }
    };
    Ok(Json(ListMachinesResponse {
        machines: machines
            .into_iter()
            .map(|m| machine_to_wire(m, &state.redactor))
            .collect(),
        next_cursor,
    }))
}

/// `GET /v1/machine/list`: every machine of the account, newest first (a page of them with
/// `?limit=` and `?cursor=`).
pub(crate) async fn list_all(
    State(state): State<AppState>,
    Authed(account): Authed,
    WireQuery(page): WireQuery<PageQuery>,
) -> ApiResult<ListMachinesResponse> {
    list(&state, &account, &Tags::new(), page).await
}

/// `POST /v1/machine/list`: the machines carrying every given tag, newest first (a page of them
/// with `limit` and `cursor`).
pub(crate) async fn list_filtered(
    State(state): State<AppState>,
    Authed(account): Authed,
    OptionalJsonBody(request): OptionalJsonBody<ListMachinesRequest>,
) -> ApiResult<ListMachinesResponse> {
    let page = PageQuery {
        limit: request.as_ref().and_then(|r| r.limit),
        cursor: request.as_ref().and_then(|r| r.cursor.clone()),
    };
    list(&state, &account, &list_filter_from_wire(request), page).await
}

/// `GET /v1/machine/{machine_name}` (evervm): everything about one machine.
pub(crate) async fn info(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
) -> ApiResult<MachineInfoResponse> {
    let info = state.engine.machine_info(&account, &name).await?;
    Ok(Json(machine_to_wire(info, &state.redactor)))
}

/// `DELETE /v1/machine/{machine_name}` (evervm): the machine, its sandbox and its history.
pub(crate) async fn delete(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
) -> ApiResult<DeleteMachineResponse> {
    state.engine.delete_machine(&account, &name).await?;
    Ok(Json(DeleteMachineResponse { deleted: true }))
}

/// `POST /v1/machine/{machine_name}/interrupt` (evervm): interrupts the running instruction and
/// cancels queued ones; with `instruction_seq`, that instruction alone.
pub(crate) async fn interrupt(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
    OptionalJsonBody(request): OptionalJsonBody<InterruptRequest>,
) -> ApiResult<InterruptResponse> {
    let interrupted = match request.and_then(|r| r.instruction_seq) {
        Some(seq) if seq < 0 => {
            return Err(evervm_engine::Error::invalid(format!(
                "instruction_seq {seq}: instructions are numbered from 0"
            ))
            .into());
        }
        Some(seq) => {
            state
                .engine
                .interrupt_instruction(&account, &name, seq)
                .await?
        }
        None => state.engine.interrupt(&account, &name).await?,
    };
    Ok(Json(InterruptResponse { interrupted }))
}

/// `POST /v1/machine/{machine_name}/swap` (evervm): saves the machine to disk and releases its
/// sandbox; the next instruction restores it.
pub(crate) async fn swap(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
) -> ApiResult<SwapResponse> {
    state.engine.swap_out(&account, &name).await?;
    Ok(Json(SwapResponse { swapped: true }))
}

/// `POST /v1/machine/{machine_name}/fork` (evervm): a new machine from this one's current state.
pub(crate) async fn fork(
    State(state): State<AppState>,
    Authed(account): Authed,
    note: AuditNote,
    WirePath(name): WirePath<String>,
    OptionalJsonBody(request): OptionalJsonBody<ForkMachineRequest>,
) -> ApiResult<CreateMachineResponse> {
    let request = request.unwrap_or_default();
    let request = evervm_engine::ForkMachine {
        tags: request.tags,
        at: request.at,
    };
    let at = request.at;
    let info = state.engine.fork_machine(&account, &name, request).await?;
    note.detail(match at {
        Some(seq) => format!("made {} at instruction {seq}", info.name),
        None => format!("made {}", info.name),
    });
    Ok(Json(CreateMachineResponse {
        machine_name: info.name.to_string(),
    }))
}

/// `POST /v1/machine/{machine_name}/checkpoints` (evervm): saves the current state, named.
pub(crate) async fn create_checkpoint(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
    OptionalJsonBody(request): OptionalJsonBody<CreateCheckpointRequest>,
) -> ApiResult<ApiCheckpoint> {
    let checkpoint = state
        .engine
        .create_checkpoint(&account, &name, request.and_then(|r| r.name))
        .await?;
    Ok(Json(checkpoint.into()))
}

/// `GET /v1/machine/{machine_name}/checkpoints` (evervm): oldest first.
pub(crate) async fn list_checkpoints(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
) -> ApiResult<ListCheckpointsResponse> {
    let checkpoints = state.engine.list_checkpoints(&account, &name).await?;
    Ok(Json(ListCheckpointsResponse {
        checkpoints: checkpoints.into_iter().map(Into::into).collect(),
    }))
}

/// `POST /v1/machine/{machine_name}/checkpoints/{checkpoint}/rollback` (evervm).
pub(crate) async fn rollback(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, checkpoint)): WirePath<(String, String)>,
) -> ApiResult<MachineInfoResponse> {
    let info = state.engine.rollback(&account, &name, &checkpoint).await?;
    Ok(Json(machine_to_wire(info, &state.redactor)))
}

/// `POST /v1/machine/{machine_name}/rewind` (evervm): makes one of the machine's undo points
/// its state (`to`: an instruction's seq, or -1 for the state before the last instruction).
pub(crate) async fn rewind(
    State(state): State<AppState>,
    Authed(account): Authed,
    note: AuditNote,
    WirePath(name): WirePath<String>,
    OptionalJsonBody(request): OptionalJsonBody<RewindRequest>,
) -> ApiResult<RewindResponse> {
    let to = request.map_or(-1, |r| r.to);
    note.detail(format!("to {to}"));
    Ok(Json(state.engine.rewind(&account, &name, to).await?))
}

/// The query of `GET .../history`.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct HistoryQuery {
    /// How many of the latest instructions (at most 1000; 100 when absent).
    limit: Option<usize>,
}

/// `GET /v1/machine/{machine_name}/history?limit=N` (evervm): the machine's latest
/// instructions, each with a short result and whether it can be rewound to.
pub(crate) async fn history(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
    WireQuery(query): WireQuery<HistoryQuery>,
) -> ApiResult<HistoryResponse> {
    let limit = query.limit.unwrap_or(crate::client::DEFAULT_HISTORY_LIST);
    if !(1..=evervm_engine::MAX_HISTORY_LIST).contains(&limit) {
        return Err(evervm_engine::Error::invalid(format!(
            "limit={limit}: give 1 to {} instructions",
            evervm_engine::MAX_HISTORY_LIST
        ))
        .into());
    }
    Ok(Json(state.engine.history(&account, &name, limit).await?))
}

/// `GET /v1/machine/{machine_name}/lineage` (evervm): the tree of forks the machine is in.
pub(crate) async fn lineage(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
) -> ApiResult<LineageResponse> {
    Ok(Json(state.engine.lineage(&account, &name).await?))
}

/// `DELETE /v1/machine/{machine_name}/checkpoints/{checkpoint}` (evervm).
pub(crate) async fn delete_checkpoint(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, checkpoint)): WirePath<(String, String)>,
) -> ApiResult<DeleteCheckpointResponse> {
    state
        .engine
        .delete_checkpoint(&account, &name, &checkpoint)
        .await?;
    Ok(Json(DeleteCheckpointResponse { deleted: true }))
}
