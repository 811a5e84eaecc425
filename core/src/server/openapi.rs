//! `GET /openapi.json`: the OpenAPI 3.1 document of every route, `openapi.json` beside this file,
//! served as committed.
//!
//! Two hands write that file. Its prose and shapes (summaries, descriptions, paths, parameters,
//! error responses) are written by hand in it. Its version is the crate's; its schemas
//! (`components.schemas`) and every operation's request body and success body are generated
//! from the wire types of [`crate::protocol`] (their `schemars::JsonSchema` derives) by the
//! test `openapi_json_matches_the_wire_types` below, which fails when the file differs from
//! what the types give, and rewrites it when run with `EVERVM_UPDATE_OPENAPI=1`:
//!
//! ```text
//! EVERVM_UPDATE_OPENAPI=1 cargo test -p evervm openapi
//! ```
//!
//! A server serves it with its own settings filled in: the `memory_mb` values it offers.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use evervm_engine::Limits;

use super::AppState;

/// The document, as committed.
const DOCUMENT: &str = include_str!("openapi.json");

pub(crate) async fn openapi(State(state): State<AppState>) -> Response {
    (
        [(CONTENT_TYPE, "application/json")],
        state.openapi.to_string(),
    )
        .into_response()
}

/// The document for a server with these limits: `memory_mb` takes exactly the sizes it offers,
/// `history` at most the undo points it keeps per machine.
pub(crate) fn document_for(limits: &Limits, max_history: u32) -> String {
    let Ok(mut document) = serde_json::from_str::<serde_json::Value>(DOCUMENT) else {
        return DOCUMENT.to_owned();
    };
    let memory =
        &mut document["components"]["schemas"]["CreateMachineRequest"]["properties"]["memory_mb"];
    if let Some(schema) = memory.as_object_mut() {
        schema.remove("minimum");
        schema.remove("maximum");
        let mut offered: Vec<serde_json::Value> = limits
            .allowed_memory_mb
            .iter()
            .map(|&mb| mb.into())
            .collect();
        offered.push(serde_json::Value::Null);
        schema.insert("enum".to_owned(), offered.into());
    }
    let history =
        &mut document["components"]["schemas"]["CreateMachineRequest"]["properties"]["history"];
    if let Some(schema) = history.as_object_mut() {
        schema.insert("maximum".to_owned(), max_history.into());
    }
    serde_json::to_string_pretty(&document).unwrap_or_else(|_| DOCUMENT.to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use schemars::generate::SchemaSettings;
    use schemars::{JsonSchema, Schema, SchemaGenerator};
    use serde::Serialize;
    use serde_json::{Map, Value, json};

    use super::DOCUMENT;
    use crate::protocol::{
        ApiCheckpoint, ApiContext, ApiError, AuditResponse, CreateCheckpointRequest,
        CreateContextRequest, CreateMachineRequest, CreateMachineResponse,
        DeleteCheckpointResponse, DeleteContextResponse, DeleteMachineResponse, ExecRequest,
        ExecResponse, ExecResultResponse, ForkMachineRequest, HealthResponse, HistoryResponse,
        InstallRequest, InstallResponse, InterruptRequest, InterruptResponse, LineageResponse,
        ListCheckpointsResponse, ListContextsResponse, ListMachinesRequest, ListMachinesResponse,
        MachineInfoResponse, MessageFromServer, MessageToServer, NodesResponse, RewindRequest,
        RewindResponse, SignupRequest, SwapResponse, WhoamiResponse,
    };
    use crate::server::paths;
    use crate::types::{FileInfo, FileList};

    /// The schema of a body, added to a generator's definitions.
    type Body = fn(&mut SchemaGenerator) -> Schema;

    fn body<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
        generator.subschema_for::<T>()
    }

    /// An operation's request body, as its handler's extractor takes it.
    enum Request {
        /// No body is read.
        None,
        /// `JsonBody<T>`: required.
        Required(Body),
        /// `OptionalJsonBody<T>` (an empty body, `null` or `T`): give the schema of `Option<T>`.
        Optional(Body),
        /// Not JSON (a file's bytes): written by hand.
        ByHand,
    }

    /// An operation's success answer: `200` and a media type, or anything else written by hand.
    enum Answer {
        Json(Body),
        NdJson(Body),
        ByHand,
    }

    /// Every operation of the router with the types its handler reads and writes: the table the
    /// document's bodies are generated from. A new route or method is added here, in the router
    /// and in `openapi.json`; the tests below fail until all three agree.
    fn operations() -> Vec<(&'static str, &'static str, Request, Answer)> {
        use Answer::{ByHand, Json, NdJson};
        use Request::{None, Optional, Required};
        vec![
            ("get", paths::HEALTHZ, None, Json(body::<HealthResponse>)),
            ("get", paths::OPENAPI, None, ByHand),
            ("get", paths::METRICS, None, ByHand),
            (
                "post",
                paths::SIGNUP,
                Optional(body::<SignupRequest>),
                ByHand,
            ),
            ("get", paths::WHOAMI, None, Json(body::<WhoamiResponse>)),
            ("get", paths::NODES, None, Json(body::<NodesResponse>)),
            ("get", paths::AUDIT, None, Json(body::<AuditResponse>)),
            (
                "post",
                paths::MACHINE_NEW,
                Optional(body::<Option<CreateMachineRequest>>),
                Json(body::<CreateMachineResponse>),
            ),
            (
                "get",
                paths::MACHINE_LIST,
                None,
                Json(body::<ListMachinesResponse>),
            ),
            (
                "post",
                paths::MACHINE_LIST,
                Optional(body::<Option<ListMachinesRequest>>),
                Json(body::<ListMachinesResponse>),
            ),
            (
                "get",
                paths::MACHINE,
                None,
                Json(body::<MachineInfoResponse>),
            ),
            (
                "delete",
                paths::MACHINE,
                None,
                Json(body::<DeleteMachineResponse>),
            ),
            (
                "post",
                paths::INTERRUPT,
                Optional(body::<Option<InterruptRequest>>),
                Json(body::<InterruptResponse>),
            ),
            ("post", paths::SWAP, None, Json(body::<SwapResponse>)),
            (
                "post",
                paths::FORK,
                Optional(body::<Option<ForkMachineRequest>>),
                Json(body::<CreateMachineResponse>),
            ),
            (
                "get",
                paths::CHECKPOINTS,
                None,
                Json(body::<ListCheckpointsResponse>),
            ),
            (
                "post",
                paths::CHECKPOINTS,
                Optional(body::<Option<CreateCheckpointRequest>>),
                Json(body::<ApiCheckpoint>),
            ),
            (
                "delete",
                paths::CHECKPOINT,
                None,
                Json(body::<DeleteCheckpointResponse>),
            ),
            (
                "post",
                paths::ROLLBACK,
                None,
                Json(body::<MachineInfoResponse>),
            ),
            (
                "get",
                paths::CONTEXTS,
                None,
                Json(body::<ListContextsResponse>),
            ),
            (
                "post",
                paths::CONTEXTS,
                Optional(body::<Option<CreateContextRequest>>),
                Json(body::<ApiContext>),
            ),
            (
                "delete",
                paths::CONTEXT,
                None,
                Json(body::<DeleteContextResponse>),
            ),
            (
                "post",
                paths::CONTEXT_RESTART,
                None,
                Json(body::<ApiContext>),
            ),
            (
                "post",
                paths::REWIND,
                Optional(body::<Option<RewindRequest>>),
                Json(body::<RewindResponse>),
            ),
            ("get", paths::HISTORY, None, Json(body::<HistoryResponse>)),
            ("get", paths::LINEAGE, None, Json(body::<LineageResponse>)),
            (
                "post",
                paths::EXEC,
                Required(body::<ExecRequest>),
                Json(body::<ExecResponse>),
            ),
            ("get", paths::RESULT, None, Json(body::<ExecResultResponse>)),
            (
                "get",
                paths::STREAM_RESULT,
                None,
                NdJson(body::<MessageFromServer>),
            ),
            ("get", paths::REPL, None, ByHand),
            ("get", paths::FILES, None, Json(body::<FileList>)),
            (
                "post",
                paths::INSTALL,
                Required(body::<InstallRequest>),
                Json(body::<InstallResponse>),
            ),
            ("get", paths::FILE, None, ByHand),
            ("head", paths::FILE, None, ByHand),
            ("put", paths::FILE, Request::ByHand, Json(body::<FileInfo>)),
            ("post", paths::FILE, None, Json(body::<FileInfo>)),
            ("delete", paths::FILE, None, Json(body::<FileInfo>)),
        ]
    }

    /// Schemas referenced by hand-written parts of the document: the WebSocket's messages (read
    /// and written), and the error body of every error response (written).
    const EXTRA_READ: &[Body] = &[body::<MessageToServer>];
    const EXTRA_WRITTEN: &[Body] = &[body::<MessageFromServer>, body::<ApiError>];

    fn generator(settings: SchemaSettings) -> SchemaGenerator {
        settings
            .with(|s| {
                s.definitions_path = "/components/schemas".into();
                s.meta_schema = None;
            })
            .into_generator()
    }

    /// The operation object of `method` on `path`.
    fn operation<'a>(document: &'a mut Value, path: &str, method: &str) -> &'a mut Value {
        let operation = &mut document["paths"][path][method];
        assert!(
            operation.is_object(),
            "openapi.json has no {} {path}",
            method.to_uppercase()
        );
        operation
    }

    /// The document with its generated parts generated anew from the wire types: what
    /// `openapi.json` must be.
    fn generated(mut document: Value) -> Value {
        // Request bodies are read (deserialized) by the server, answers written (serialized):
        // the two contracts differ where serde defaults or skips a field.
        let mut read = generator(SchemaSettings::draft2020_12().for_deserialize());
        let mut written = generator(SchemaSettings::draft2020_12().for_serialize());
        for (method, path, request, answer) in operations() {
            // `None` inside: the request body is written by hand.
            let request = match request {
                Request::None => Some(None),
                Request::ByHand => None,
                Request::Required(body) => Some(Some((true, body(&mut read)))),
                Request::Optional(body) => Some(Some((false, body(&mut read)))),
            };
            let answer = match answer {
                Answer::Json(body) => Some(("application/json", body(&mut written))),
                Answer::NdJson(body) => Some(("application/x-ndjson", body(&mut written))),
                Answer::ByHand => None,
            };
            let operation = operation(&mut document, path, method);
            match request {
                None => {}
                Some(None) => {
                    if let Some(map) = operation.as_object_mut() {
                        map.remove("requestBody");
                    }
                }
                Some(Some((required, schema))) => {
                    let request = &mut operation["requestBody"];
                    request["required"] = json!(required);
                    request["content"] = json!({ "application/json": { "schema": schema } });
                }
            }
            if let Some((media_type, schema)) = answer {
                let ok = &mut operation["responses"]["200"];
                assert!(
                    ok["description"].is_string(),
                    "{} {path}: the 200 answer needs a description (written by hand)",
                    method.to_uppercase()
                );
                ok["content"] = json!({ media_type: { "schema": schema } });
            }
        }
        for body in EXTRA_READ {
            body(&mut read);
        }
        for body in EXTRA_WRITTEN {
            body(&mut written);
        }
        let mut schemas = read.take_definitions(true);
        for (name, schema) in written.take_definitions(true) {
            if let Some(read_schema) = schemas.get(&name) {
                assert_eq!(
                    read_schema, &schema,
                    "schema {name} differs between what the server reads and what it writes: \
                     give one of the two types its own schema name"
                );
            }
            schemas.insert(name, schema);
        }
        let mut schemas = Value::Object(schemas);
        unwrap_descriptions(&mut schemas);
        document["components"]["schemas"] = schemas;
        document["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
        document
    }

    /// Doc comments become descriptions with their line breaks: joins the lines of each
    /// paragraph, as Markdown would.
    fn unwrap_descriptions(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    match (key.as_str(), value) {
                        ("description", Value::String(text)) => {
                            *text = text
                                .split("\n\n")
                                .map(|paragraph| paragraph.replace('\n', " "))
                                .collect::<Vec<_>>()
                                .join("\n\n");
                        }
                        (_, value) => unwrap_descriptions(value),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
            _ => {}
        }
    }

    /// The document as `openapi.json` keeps it: two-space indents, the top-level fields in the
    /// usual order, the rest sorted.
    fn pretty(document: &Value) -> String {
        #[derive(Serialize)]
        struct Ordered<'a> {
            openapi: &'a Value,
            info: &'a Value,
            servers: &'a Value,
            security: &'a Value,
            tags: &'a Value,
            paths: &'a Value,
            components: &'a Value,
        }
        let known = [
            "openapi",
            "info",
            "servers",
            "security",
            "tags",
            "paths",
            "components",
        ];
        let fields = document.as_object().map(Map::keys).into_iter().flatten();
        for field in fields {
            assert!(known.contains(&field.as_str()), "unexpected field {field}");
        }
        let ordered = Ordered {
            openapi: &document["openapi"],
            info: &document["info"],
            servers: &document["servers"],
            security: &document["security"],
            tags: &document["tags"],
            paths: &document["paths"],
            components: &document["components"],
        };
        let mut text = serde_json::to_string_pretty(&ordered).unwrap();
        text.push('\n');
        text
    }

    /// Every `$ref` in `value`.
    fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("$ref", Value::String(target)) => found.push(target),
                        _ => refs(value, found),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
            _ => {}
        }
    }

    /// Where two documents differ, as JSON pointers.
    fn differences(a: &Value, b: &Value, at: &str, found: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for key in keys {
                    let at = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                    match (x.get(key), y.get(key)) {
                        (Some(a), Some(b)) => differences(a, b, &at, found),
                        _ => found.push(at),
                    }
                }
            }
            _ if a != b => found.push(at.to_owned()),
            _ => {}
        }
    }

    const METHODS: &[&str] = &[
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    #[test]
    fn a_server_documents_the_memory_sizes_it_offers() {
        let limits = evervm_engine::Limits {
            allowed_memory_mb: vec![256, 1024],
            ..evervm_engine::Limits::default()
        };
        let document: Value = serde_json::from_str(&super::document_for(&limits, 7)).unwrap();
        let memory =
            &document["components"]["schemas"]["CreateMachineRequest"]["properties"]["memory_mb"];
        assert_eq!(memory["enum"], json!([256, 1024, null]));
        assert!(memory.get("minimum").is_none(), "{memory}");
        let history =
            &document["components"]["schemas"]["CreateMachineRequest"]["properties"]["history"];
        assert_eq!(history["maximum"], json!(7));
    }

    #[test]
    fn openapi_json_matches_the_wire_types() {
        let committed: Value = serde_json::from_str(DOCUMENT).unwrap();
        let expected = generated(committed.clone());
        let text = pretty(&expected);
        if text == DOCUMENT {
            return;
        }
        if std::env::var_os("EVERVM_UPDATE_OPENAPI").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/server/openapi.json");
            std::fs::write(path, text).unwrap();
            eprintln!("rewrote {path}");
            return;
        }
        let mut found = Vec::new();
        differences(&committed, &expected, "", &mut found);
        let what = if found.is_empty() {
            "is not formatted as the generator writes it".to_owned()
        } else {
            format!(
                "differs from what the wire types give at {}",
                found.join(", ")
            )
        };
        panic!(
            "openapi.json {what}: run `EVERVM_UPDATE_OPENAPI=1 cargo test -p evervm openapi` \
             to rewrite it, and review the diff"
        );
    }

    #[test]
    fn openapi_json_describes_every_route_and_only_those() {
        let document: Value = serde_json::from_str(DOCUMENT).unwrap();
        assert_eq!(document["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
        let described = document["paths"].as_object().unwrap();
        let served: BTreeSet<&str> = paths::ALL.iter().copied().collect();
        let documented: BTreeSet<&str> = described.keys().map(String::as_str).collect();
        assert_eq!(
            served, documented,
            "paths::ALL and the paths of openapi.json"
        );
        let mut documented = BTreeSet::new();
        for (path, item) in described {
            for method in item.as_object().unwrap().keys() {
                if METHODS.contains(&method.as_str()) {
                    documented.insert((method.as_str(), path.as_str()));
                }
            }
        }
        let listed: BTreeSet<(&str, &str)> = operations()
            .iter()
            .map(|(method, path, ..)| (*method, *path))
            .collect();
        assert_eq!(listed, documented, "the operations table and openapi.json");
    }

    #[test]
    fn every_reference_resolves() {
        let document: Value = serde_json::from_str(DOCUMENT).unwrap();
        let mut found = Vec::new();
        refs(&document, &mut found);
        assert!(!found.is_empty());
        for target in found {
            let pointer = target.strip_prefix('#').unwrap_or_else(|| {
                panic!("{target}: only references inside the document are expected")
            });
            assert!(
                document.pointer(pointer).is_some(),
                "{target} points at nothing"
            );
        }
    }

    #[test]
    fn operation_ids_are_unique() {
        let document: Value = serde_json::from_str(DOCUMENT).unwrap();
        let mut ids = BTreeSet::new();
        for item in document["paths"].as_object().unwrap().values() {
            for (method, operation) in item.as_object().unwrap() {
                if METHODS.contains(&method.as_str()) {
                    let id = operation["operationId"].as_str().unwrap();
                    assert!(ids.insert(id.to_owned()), "operationId {id} twice");
                }
            }
        }
    }
}
