//! Wire types of the ForeverVM-compatible HTTP + WebSocket API (see `protocol.md`), plus the
//! evervm additions under `/v1`. Field names here are the wire's; the engine never sees them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Tags on the wire: a JSON object of strings.
pub type WireTags = BTreeMap<String, String>;

/// The default instruction timeout when a request gives none (every ForeverVM client's default).
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 15;

/// An error body: `{"code": "...", "id": null}`; evervm adds a human-readable `message`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: String,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `GET /v1/whoami`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhoamiResponse {
    pub account: String,
}

/// `POST /v1/machine/new`. Every field is optional; an empty body or `null` means all defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateMachineRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<WireTags>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u32>,
    /// evervm addition: the image profile (`minimal`, `data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// evervm addition: `idle` (default) or `instruction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateMachineResponse {
    pub machine_name: String,
}

/// `POST /v1/machine/list` (`GET` takes no filter).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListMachinesRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<WireTags>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListMachinesResponse {
    pub machines: Vec<ApiMachine>,
}

/// A machine in a list. `has_pending_instruction` is singular, as the ForeverVM CLI requires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiMachine {
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub running: bool,
    pub has_pending_instruction: bool,
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub tags: WireTags,
    /// evervm additions, absent from other servers' answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// `resident` or `stopped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
}

/// An instruction: code and a timeout in seconds (15 when absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireInstruction {
    pub code: String,
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: i32,
}

fn default_timeout_seconds() -> i32 {
    DEFAULT_TIMEOUT_SECONDS
}

/// `POST /v1/machine/{name}/exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub instruction: WireInstruction,
    #[serde(default)]
    pub interrupt: bool,
}

/// The answer to an exec, sent as soon as the instruction is queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResponse {
    pub instruction_seq: Option<i64>,
    pub machine: Option<String>,
    #[serde(default)]
    pub interrupted: bool,
}

/// `GET /v1/machine/{name}/exec/{seq}/result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResultResponse {
    pub instruction_id: i64,
    pub result: WireExecResult,
}

/// A result on the wire: exactly one of the value form (`value` always present, `null` for no
/// value, plus `data`) and the error form (`error` only), each with `runtime_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireExecResult {
    #[serde(flatten)]
    pub outcome: WireOutcome,
    pub runtime_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WireOutcome {
    Error {
        error: String,
        /// evervm addition: why it failed (`exception`, `timeout`, `interrupted`,
        /// `machine_crashed`). Other clients ignore it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<String>,
    },
    Value {
        value: Option<String>,
        data: Option<serde_json::Value>,
    },
}

/// One line of output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandardOutput {
    pub stream: WireStream,
    pub data: String,
    pub seq: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireStream {
    Stdout,
    Stderr,
}

/// WebSocket, client to server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessageToServer {
    Exec {
        instruction: WireInstruction,
        request_id: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageLevel {
    Info,
    Warn,
    Error,
}

/// WebSocket (and stream-result NDJSON lines), server to client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessageFromServer {
    Connected {
        machine_name: String,
    },
    ExecReceived {
        seq: i64,
        request_id: u32,
    },
    Output {
        chunk: StandardOutput,
        instruction_id: i64,
    },
    Result {
        instruction_id: i64,
        result: WireExecResult,
    },
    Error {
        code: String,
        id: Option<String>,
    },
    Message {
        message: String,
        level: MessageLevel,
    },
}

// --- evervm additions ----------------------------------------------------------------------

/// `GET /v1/machine/{name}`: everything about one machine (the list's object, every field set).
pub type MachineInfoResponse = ApiMachine;

/// `DELETE /v1/machine/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteMachineResponse {
    pub deleted: bool,
}

/// `POST /v1/machine/{name}/swap`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapResponse {
    pub swapped: bool,
}

/// `POST /v1/machine/{name}/fork`: the fork's tags (the parent's when absent). Answered with
/// [`CreateMachineResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkMachineRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<WireTags>,
}

/// `POST /v1/machine/{name}/checkpoints`: the checkpoint's name (generated when absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateCheckpointRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A checkpoint: the answer to its creation, and an item of a list.
pub type ApiCheckpoint = crate::types::CheckpointInfo;

/// `GET /v1/machine/{name}/checkpoints`: oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListCheckpointsResponse {
    pub checkpoints: Vec<ApiCheckpoint>,
}

/// `DELETE /v1/machine/{name}/checkpoints/{checkpoint}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteCheckpointResponse {
    pub deleted: bool,
}

/// `POST /v1/machine/{name}/interrupt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptResponse {
    pub interrupted: bool,
}

/// `GET /healthz`: the server is up; which sandbox backend its engine uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthResponse {
    /// Always `ok` when the server answers.
    pub status: String,
    pub backend: String,
    /// The backend's exact version (for gVisor: runsc's version, binary hash and platform).
    #[serde(default)]
    pub backend_version: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_forms_match_the_wire() {
        let value = WireExecResult {
            outcome: WireOutcome::Value {
                value: None,
                data: None,
            },
            runtime_ms: 3,
        };
        assert_eq!(
            serde_json::to_string(&value).unwrap(),
            r#"{"value":null,"data":null,"runtime_ms":3}"#
        );
        let error = WireExecResult {
            outcome: WireOutcome::Error {
                error: "boom".into(),
                cause: None,
            },
            runtime_ms: 1,
        };
        assert_eq!(
            serde_json::to_string(&error).unwrap(),
            r#"{"error":"boom","runtime_ms":1}"#
        );
        let back: WireExecResult =
            serde_json::from_str(r#"{"value":"2","data":null,"runtime_ms":0}"#).unwrap();
        assert_eq!(
            back.outcome,
            WireOutcome::Value {
                value: Some("2".into()),
                data: None
            }
        );
    }

    #[test]
    fn numbers_in_data_survive_a_round_trip() {
        // Without serde_json's `float_roundtrip`, this number came back one ULP off after each
        // decode and re-encode (seen through the fuzz harnesses' round-trip checks).
        let text = r#"{"value":null,"data":{"x":9.15860402102123842989e-300},"runtime_ms":0}"#;
        let first: WireExecResult = serde_json::from_str(text).unwrap();
        let again: WireExecResult =
            serde_json::from_str(&serde_json::to_string(&first).unwrap()).unwrap();
        assert_eq!(again, first);
        let WireOutcome::Value {
            data: Some(data), ..
        } = first.outcome
        else {
            panic!("not a value: {first:?}");
        };
        assert_eq!(
            data["x"].as_f64().map(f64::to_bits),
            Some(9.158_604_021_021_239e-300_f64.to_bits())
        );
    }

    #[test]
    fn server_messages_are_tagged() {
        let message = MessageFromServer::Result {
            instruction_id: 4,
            result: WireExecResult {
                outcome: WireOutcome::Value {
                    value: Some("2".into()),
                    data: None,
                },
                runtime_ms: 0,
            },
        };
        assert_eq!(
            serde_json::to_string(&message).unwrap(),
            r#"{"type":"result","instruction_id":4,"result":{"value":"2","data":null,"runtime_ms":0}}"#
        );
        let exec: MessageToServer =
            serde_json::from_str(r#"{"type":"exec","instruction":{"code":"1"},"request_id":0}"#)
                .unwrap();
        assert_eq!(
            exec,
            MessageToServer::Exec {
                instruction: WireInstruction {
                    code: "1".into(),
                    timeout_seconds: 15
                },
                request_id: 0
            }
        );
    }
}
