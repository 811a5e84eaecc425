//! A machine's code contexts (evervm): make, list, restart, remove. Instructions name theirs in
//! `instruction.context`.

use axum::Json;
use axum::extract::State;

use super::AppState;
use super::auth::Authed;
use super::error::ApiFailure;
use super::extract::{OptionalJsonBody, WirePath};
use crate::protocol::{
    ApiContext, CreateContextRequest, DeleteContextResponse, ListContextsResponse,
};

type ApiResult<T> = Result<Json<T>, ApiFailure>;

/// `POST /v1/machine/{machine_name}/contexts`.
pub(crate) async fn create(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
    OptionalJsonBody(request): OptionalJsonBody<CreateContextRequest>,
) -> ApiResult<ApiContext> {
    let cwd = request.and_then(|r| r.cwd);
    let made = state
        .engine
        .create_context(&account, &name, cwd.as_deref())
        .await?;
    Ok(Json(made))
}

/// `GET /v1/machine/{machine_name}/contexts`.
pub(crate) async fn list(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
) -> ApiResult<ListContextsResponse> {
    let contexts = state.engine.list_contexts(&account, &name).await?;
    Ok(Json(ListContextsResponse { contexts }))
}

/// `POST /v1/machine/{machine_name}/contexts/{context}/restart`.
pub(crate) async fn restart(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, context)): WirePath<(String, String)>,
) -> ApiResult<ApiContext> {
    let restarted = state
        .engine
        .restart_context(&account, &name, &context)
        .await?;
    Ok(Json(restarted))
}

/// `DELETE /v1/machine/{machine_name}/contexts/{context}`.
pub(crate) async fn remove(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, context)): WirePath<(String, String)>,
) -> ApiResult<DeleteContextResponse> {
    state
        .engine
        .remove_context(&account, &name, &context)
        .await?;
    Ok(Json(DeleteContextResponse { deleted: true }))
}
