//! Instructions over HTTP: exec (returns at once), result (long-poll) and stream-result (NDJSON).

use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::AppState;
use super::auth::Authed;
use super::error::ApiFailure;
use super::extract::{JsonBody, WirePath, WireQuery};
use crate::convert::server::{EventView, event_to_wire, exec_from_wire, result_to_wire};
use crate::protocol::{ExecRequest, ExecResponse, ExecResultResponse, MessageFromServer};

/// `POST /v1/machine/{machine_name}/exec`: queues the instruction and answers with its seq.
pub(crate) async fn exec(
    State(state): State<AppState>,
    Authed(account): Authed,
    note: super::audit::AuditNote,
    WirePath(name): WirePath<String>,
    JsonBody(request): JsonBody<ExecRequest>,
) -> Result<Json<ExecResponse>, ApiFailure> {
    let accepted = match exec_from_wire(request.instruction, request.interrupt) {
        Ok(request) => {
            note.detail(state.engine.audit_detail_for_code(&request.code));
            state.engine.exec(&account, &name, request).await
        }
        Err(e) => Err(e),
    }
    .map_err(|e| ApiFailure::from(&e))?;
    Ok(Json(ExecResponse {
        instruction_seq: Some(accepted.seq),
        machine: Some(name),
        interrupted: accepted.interrupted,
    }))
}

/// `?rich=true`: the client wants evervm's rich results (`results` in a result, `display`
/// messages in a stream), which ForeverVM's clients never get.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct RichQuery {
    #[serde(default)]
    pub(crate) rich: bool,
}

/// `GET /v1/machine/{machine_name}/exec/{instruction_seq}/result`: waits for the result.
pub(crate) async fn result(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, seq)): WirePath<(String, i64)>,
    WireQuery(query): WireQuery<RichQuery>,
) -> Result<Json<ExecResultResponse>, ApiFailure> {
    let result = state.engine.result(&account, &name, seq).await?;
    Ok(Json(ExecResultResponse {
        instruction_id: seq,
        result: result_to_wire(result, &state.redactor, query.rich),
    }))
}

/// One NDJSON line: the message and its `\n`.
pub(crate) fn ndjson_line(message: &MessageFromServer) -> Bytes {
    let mut line = serde_json::to_vec(message).unwrap_or_else(|e| {
        tracing::error!("cannot encode {message:?}: {e}");
        br#"{"type":"error","code":"InternalError","id":null}"#.to_vec()
    });
    line.push(b'\n');
    Bytes::from(line)
}

/// `GET /v1/machine/{machine_name}/exec/{instruction_seq}/stream-result`: the instruction's
/// `output` messages then its `result`, one JSON object per line, each sent as it happens (or
/// replayed when the instruction already finished).
pub(crate) async fn stream_result(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, seq)): WirePath<(String, i64)>,
    WireQuery(query): WireQuery<RichQuery>,
) -> Result<Response, ApiFailure> {
    let events = state.engine.events(&account, &name, seq).await?;
    let redactor = state.redactor;
    let mut view = EventView::new(query.rich);
    // The events ready at once go out as one body chunk: large outputs are many lines.
    let lines = events.ready_chunks(1024).map(move |batch| {
        let mut body = Vec::new();
        for event in batch {
            if let Some(message) = event_to_wire(seq, event, &redactor, &mut view) {
                body.extend_from_slice(&ndjson_line(&message));
            }
        }
        Ok::<_, Infallible>(Bytes::from(body))
    });
    Ok((
        [
            (CONTENT_TYPE, "application/x-ndjson"),
            (CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(lines),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_end_with_a_newline() {
        let line = ndjson_line(&MessageFromServer::Connected {
            machine_name: "m".into(),
        });
        assert_eq!(
            &line[..],
            b"{\"type\":\"connected\",\"machine_name\":\"m\"}\n"
        );
    }
}
