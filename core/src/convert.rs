//! The one place where engine types, wire types and client types are mapped onto each other.

use crate::protocol::{ApiMachine, StandardOutput, WireExecResult, WireOutcome, WireStream};
use crate::types::{ExecResult, FailureCause, MachineInfo, OutputChunk, OutputStream};

impl From<WireStream> for OutputStream {
    fn from(s: WireStream) -> Self {
        match s {
            WireStream::Stdout => OutputStream::Stdout,
            WireStream::Stderr => OutputStream::Stderr,
        }
    }
}

impl From<OutputStream> for WireStream {
    fn from(s: OutputStream) -> Self {
        match s {
            OutputStream::Stdout => WireStream::Stdout,
            OutputStream::Stderr => WireStream::Stderr,
        }
    }
}

impl From<StandardOutput> for OutputChunk {
    fn from(o: StandardOutput) -> Self {
        OutputChunk {
            seq: o.seq,
            stream: o.stream.into(),
            data: o.data,
        }
    }
}

impl From<OutputChunk> for StandardOutput {
    fn from(c: OutputChunk) -> Self {
        StandardOutput {
            stream: c.stream.into(),
            data: c.data,
            seq: c.seq,
        }
    }
}

impl From<WireExecResult> for ExecResult {
    fn from(r: WireExecResult) -> Self {
        match r.outcome {
            WireOutcome::Value { value, data } => ExecResult {
                value,
                error: None,
                cause: None,
                exception: None,
                data,
                results: r.results.unwrap_or_default(),
                runtime_ms: r.runtime_ms,
                output_truncated: r.output_truncated,
                saved: r.saved,
            },
            WireOutcome::Error {
                error,
                cause,
                exception,
            } => {
                let cause = cause.as_deref().and_then(FailureCause::parse).or_else(|| {
                    Some(if error.contains("Timed out") {
                        FailureCause::Timeout
                    } else {
                        FailureCause::Exception
                    })
                });
                ExecResult {
                    value: None,
                    error: Some(error),
                    cause,
                    exception,
                    data: None,
                    results: r.results.unwrap_or_default(),
                    runtime_ms: r.runtime_ms,
                    output_truncated: r.output_truncated,
                    saved: r.saved,
                }
            }
        }
    }
}

impl From<ExecResult> for WireExecResult {
    fn from(r: ExecResult) -> Self {
        let outcome = match r.error {
            Some(error) => WireOutcome::Error {
                error,
                cause: r.cause.map(|c| c.as_str().to_owned()),
                exception: r.exception,
            },
            None => WireOutcome::Value {
                value: r.value,
                data: r.data,
            },
        };
        WireExecResult {
            outcome,
            runtime_ms: r.runtime_ms,
            output_truncated: r.output_truncated,
            saved: r.saved,
            results: Some(r.results),
        }
    }
}

impl From<ApiMachine> for MachineInfo {
    fn from(m: ApiMachine) -> Self {
        MachineInfo {
            name: m.name,
            created_at: m.created_at,
            tags: m.tags,
            running: m.running,
            has_pending_instruction: m.has_pending_instruction,
            memory_mb: m.memory_mb,
            image: m.image,
            backend: m.backend,
            state: m.state,
            instruction_count: m.instruction_count,
            last_used_at: m.last_used_at,
            last_error: m.last_error,
            disk_bytes: m.disk_bytes,
            resident_bytes: m.resident_bytes,
            durability: m.durability,
            history: m.history,
            parent: m.parent,
            forked_at: m.forked_at,
            env: m.env,
            secret_env: m.secret_env,
            expires_at: m.expires_at,
            interpreter: m.interpreter,
            network: m.network,
        }
    }
}

impl From<MachineInfo> for ApiMachine {
    fn from(m: MachineInfo) -> Self {
        ApiMachine {
            name: m.name,
            created_at: m.created_at,
            running: m.running,
            has_pending_instruction: m.has_pending_instruction,
            expires_at: m.expires_at,
            tags: m.tags,
            memory_mb: m.memory_mb,
            image: m.image,
            backend: m.backend,
            state: m.state,
            instruction_count: m.instruction_count,
            last_used_at: m.last_used_at,
            last_error: m.last_error,
            disk_bytes: m.disk_bytes,
            resident_bytes: m.resident_bytes,
            durability: m.durability,
            history: m.history,
            parent: m.parent,
            forked_at: m.forked_at,
            env: m.env,
            secret_env: m.secret_env,
            interpreter: m.interpreter,
            network: m.network,
        }
    }
}

#[cfg(feature = "local")]
pub(crate) mod engine {
    use evervm_engine as engine;

    use crate::types::{
        ByteStream, CheckpointInfo, CreateMachineOptions, ExecEvent, ExecResult, FileInfo,
        FileKind, FileList, FileRead, InterpreterInfo, MachineInfo, MachinePage, OutputChunk,
        OutputStream, WriteFileOptions,
    };

    impl From<engine::ExecResult> for ExecResult {
        fn from(r: engine::ExecResult) -> Self {
            match r.outcome {
                engine::Outcome::Value(value) => ExecResult {
                    value,
                    error: None,
                    cause: None,
                    exception: None,
                    data: r.data,
                    results: r.results,
                    runtime_ms: r.runtime_ms,
                    output_truncated: r.output_truncated,
                    saved: r.saved,
                },
                engine::Outcome::Error { text, cause } => ExecResult {
                    value: None,
                    error: Some(text),
                    cause: Some(cause),
                    exception: r.exception,
                    data: None,
                    results: r.results,
                    runtime_ms: r.runtime_ms,
                    output_truncated: r.output_truncated,
                    saved: r.saved,
                },
            }
        }
    }

    /// An engine event as the client's: a text chunk, or a rich result shown (the engine keeps
    /// those as output chunks holding JSON; one that does not decode is dropped with a log line).
    pub(crate) fn event_from_engine(e: engine::ExecEvent) -> Option<ExecEvent> {
        match e {
            engine::ExecEvent::Output(chunk) => {
                let stream = match chunk.stream {
                    engine::OutputStream::Stdout => OutputStream::Stdout,
                    engine::OutputStream::Stderr => OutputStream::Stderr,
                    engine::OutputStream::Display => {
                        let Some(rich) = chunk.rich() else {
                            tracing::warn!(seq = chunk.seq, "a rich result did not decode");
                            return None;
                        };
                        return Some(ExecEvent::Display(rich));
                    }
                };
                Some(ExecEvent::Output(OutputChunk {
                    seq: chunk.seq,
                    stream,
                    data: chunk.data,
                }))
            }
            engine::ExecEvent::Result(r) => Some(ExecEvent::Result(r.into())),
        }
    }

    impl From<engine::MachineInfo> for MachineInfo {
        fn from(m: engine::MachineInfo) -> Self {
            MachineInfo {
                name: m.name.to_string(),
                created_at: m.created_at,
                tags: m.tags,
                running: m.state == engine::MachineState::Resident,
                has_pending_instruction: m.has_pending_instruction,
                memory_mb: Some(m.memory_mb),
                image: Some(m.image),
                backend: Some(m.backend),
                state: Some(m.state.as_str().to_owned()),
                instruction_count: Some(m.instruction_count),
                last_used_at: m.last_used_at,
                last_error: m.last_error,
                disk_bytes: Some(m.disk_bytes),
                resident_bytes: Some(m.resident_bytes),
                durability: Some(m.durability.as_str().to_owned()),
                history: Some(m.history),
                parent: m.parent,
                forked_at: m.forked_at,
                env: m.env,
                secret_env: m.secret_env,
                expires_at: m.expires_at,
                interpreter: m.interpreter.map(|start| InterpreterInfo {
                    began: start.as_str().to_owned(),
                    started_at: m.interpreter_started_at.unwrap_or(m.created_at),
                    snapshot_at: start.snapshot_at(),
                }),
                network: Some(m.network),
            }
        }
    }

    impl From<engine::MachinePage> for MachinePage {
        fn from(page: engine::MachinePage) -> Self {
            MachinePage {
                machines: page.machines.into_iter().map(Into::into).collect(),
                next_cursor: page.next_cursor.map(engine::ListCursor::encode),
            }
        }
    }

    impl From<engine::FileKind> for FileKind {
        fn from(kind: engine::FileKind) -> Self {
            match kind {
                engine::FileKind::File => FileKind::File,
                engine::FileKind::Directory => FileKind::Directory,
                engine::FileKind::Symlink => FileKind::Symlink,
                engine::FileKind::Other => FileKind::Other,
            }
        }
    }

    impl From<engine::FileInfo> for FileInfo {
        fn from(f: engine::FileInfo) -> Self {
            FileInfo {
                name: f.name().to_owned(),
                kind: f.kind.into(),
                size: f.size,
                mode: f.mode,
                modified_at: f.modified,
                path: f.path,
                symlink_target: f.symlink_target,
            }
        }
    }

    impl From<engine::FileList> for FileList {
        fn from(list: engine::FileList) -> Self {
            FileList {
                directory: list.directory.into(),
                entries: list.entries.into_iter().map(Into::into).collect(),
                truncated: list.truncated,
            }
        }
    }

    impl From<WriteFileOptions> for engine::WriteFileOptions {
        fn from(options: WriteFileOptions) -> Self {
            engine::WriteFileOptions {
                mode: options.mode,
                make_parents: options.make_parents,
                metadata: std::collections::BTreeMap::default(),
            }
        }
    }

    impl From<engine::FileRead> for FileRead {
        fn from(read: engine::FileRead) -> Self {
            use futures::StreamExt;
            FileRead {
                info: read.info.into(),
                data: read.data.map(|piece| piece.map_err(Into::into)).boxed(),
            }
        }
    }

    /// A caller's file data as the engine takes it.
    pub(crate) fn byte_stream_to_engine(data: ByteStream) -> engine::ByteStream {
        use futures::StreamExt;
        data.map(|piece| piece.map_err(|e| engine::Error::new(e.kind(), e.message())))
            .boxed()
    }

    impl From<engine::CheckpointInfo> for CheckpointInfo {
        fn from(c: engine::CheckpointInfo) -> Self {
            CheckpointInfo {
                name: c.name,
                created_at: c.created_at,
                instruction_count: c.instruction_count,
                disk_bytes: c.disk_bytes,
            }
        }
    }

    /// A new machine's options as the engine takes them; an unknown durability is refused.
    pub(crate) fn create_machine_to_engine(
        options: CreateMachineOptions,
    ) -> engine::Result<engine::CreateMachine> {
        let mut env = engine::Env::new();
        for (name, value) in options.env {
            env.insert(
                name,
                engine::EnvVar {
                    value,
                    secret: false,
                },
            );
        }
        // A name in both is secret: its value is never shown.
        for (name, value) in options.secret_env.0 {
            env.insert(
                name,
                engine::EnvVar {
                    value,
                    secret: true,
                },
            );
        }
        let expires_at = match (options.ttl, options.expires_at) {
            (Some(_), Some(_)) => {
                return Err(engine::Error::invalid(
                    "give a machine ttl_seconds or expires_at, not both",
                ));
            }
            (Some(ttl), None) => {
                if ttl.is_zero() || ttl > engine::MAX_LIFETIME {
                    return Err(engine::Error::invalid(format!(
                        "ttl of {} s: a machine may be given 1 s to {} days",
                        ttl.as_secs(),
                        engine::MAX_LIFETIME.as_secs() / 86_400
                    )));
                }
                chrono::Duration::from_std(ttl)
                    .ok()
                    .map(|ttl| chrono::Utc::now() + ttl)
            }
            (None, at) => at,
        };
        Ok(engine::CreateMachine {
            expires_at,
            tags: options.tags,
            memory_mb: options.memory_mb,
            image: options.image,
            durability: options
                .durability
                .as_deref()
                .map(engine::Durability::parse)
                .transpose()?,
            env,
            network: options.network,
            history: options.history,
        })
    }
}

/// Wire to engine and engine to wire, for the server. Everything goes through the client types
/// above, so that each field is mapped in one place.
#[cfg(feature = "server")]
pub(crate) mod server {
    use std::time::Duration;

    use evervm_engine as engine;

    use super::engine::event_from_engine;
    use crate::protocol::{
        ApiMachine, CreateMachineRequest, ListMachinesRequest, MessageFromServer, WireExecResult,
        WireInstruction,
    };
    use crate::server::redact::Redactor;
    use crate::types::{CreateMachineOptions, ExecEvent, ExecResult, MachineInfo, Tags};

    /// A machine's info for a client: `last_error` (engine text) without host paths.
    pub(crate) fn machine_to_wire(info: engine::MachineInfo, redactor: &Redactor) -> ApiMachine {
        let mut info = MachineInfo::from(info);
        if let Some(error) = info.last_error.as_mut() {
            redactor.string(error);
        }
        info.into()
    }

    /// A result for a client: a failure's text without host paths; its rich results only for
    /// a client that asked (`rich`), never for ForeverVM's clients.
    pub(crate) fn result_to_wire(
        result: engine::ExecResult,
        redactor: &Redactor,
        rich: bool,
    ) -> WireExecResult {
        client_result_to_wire(result.into(), redactor, rich)
    }

    fn client_result_to_wire(
        mut result: ExecResult,
        redactor: &Redactor,
        rich: bool,
    ) -> WireExecResult {
        if let Some(error) = result.error.as_mut() {
            redactor.string(error);
        }
        if let Some(exception) = result.exception.as_mut() {
            redactor.string(&mut exception.value);
        }
        let mut wire = WireExecResult::from(result);
        if !rich {
            wire.results = None;
        }
        wire
    }

    /// How one client sees one instruction's events, from its first: with rich results, or
    /// without them (ForeverVM's clients), when output lines are numbered 0, 1, 2, ... among
    /// themselves as ForeverVM's protocol has them.
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct EventView {
        rich: bool,
        /// Rich results left out so far.
        skipped: i64,
    }

    impl EventView {
        pub(crate) fn new(rich: bool) -> Self {
            Self { rich, skipped: 0 }
        }
    }

    /// One event of instruction `instruction_id` as the message that carries it (`output`,
    /// `display` for a client that asked for rich results, `result`), on a WebSocket or as an
    /// NDJSON line; output and failures without host paths (the engine's own notes in the output
    /// can name them). `None`: nothing for this client.
    pub(crate) fn event_to_wire(
        instruction_id: i64,
        event: engine::ExecEvent,
        redactor: &Redactor,
        view: &mut EventView,
    ) -> Option<MessageFromServer> {
        let rich = view.rich;
        let seq = match &event {
            engine::ExecEvent::Output(chunk) => chunk.seq,
            engine::ExecEvent::Result(_) => -1,
        };
        if !rich
            && let engine::ExecEvent::Output(chunk) = &event
            && chunk.stream == engine::OutputStream::Display
        {
            view.skipped += 1;
            return None;
        }
        Some(match event_from_engine(event)? {
            ExecEvent::Output(mut chunk) => {
                chunk.seq -= view.skipped;
                redactor.string(&mut chunk.data);
                MessageFromServer::Output {
                    chunk: chunk.into(),
                    instruction_id,
                }
            }
            ExecEvent::Display(result) if rich => MessageFromServer::Display {
                instruction_id,
                seq,
                result,
            },
            ExecEvent::Display(_) => return None,
            ExecEvent::Result(result) => MessageFromServer::Result {
                instruction_id,
                result: client_result_to_wire(result, redactor, rich),
            },
        })
    }

    /// `None` (an empty or `null` body) means every default.
    pub(crate) fn create_machine_from_wire(
        request: Option<CreateMachineRequest>,
    ) -> engine::Result<engine::CreateMachine> {
        let request = request.unwrap_or_default();
        super::engine::create_machine_to_engine(CreateMachineOptions {
            tags: request.tags.unwrap_or_default(),
            memory_mb: request.memory_mb,
            image: request.image,
            durability: request.durability,
            history: request.history,
            env: request.env.unwrap_or_default(),
            secret_env: request.secret_env.unwrap_or_default(),
            ttl: request.ttl_seconds.map(Duration::from_secs),
            expires_at: None,
            network: request.network,
        })
    }

    /// The tags a list must match; none (every machine) when the body is empty or `null`.
    pub(crate) fn list_filter_from_wire(request: Option<ListMachinesRequest>) -> Tags {
        request.and_then(|r| r.tags).unwrap_or_default()
    }

    /// An instruction from the wire; `timeout_seconds` must be positive (the engine checks the
    /// upper bound).
    pub(crate) fn exec_from_wire(
        instruction: WireInstruction,
        interrupt: bool,
    ) -> engine::Result<engine::ExecRequest> {
        let seconds = u64::try_from(instruction.timeout_seconds)
            .ok()
            .filter(|s| *s > 0)
            .ok_or_else(|| {
                engine::Error::invalid(format!(
                    "timeout_seconds must be a positive number of seconds, not {}",
                    instruction.timeout_seconds
                ))
            })?;
        Ok(engine::ExecRequest {
            code: instruction.code,
            timeout: Duration::from_secs(seconds),
            interrupt,
            dialect: instruction.dialect,
            context: instruction.context,
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::protocol::{WireOutcome, WireStream};
        use crate::types::RichKind;

        #[test]
        fn timeouts_must_be_positive() {
            let instruction = |timeout_seconds| WireInstruction {
                code: "1".into(),
                timeout_seconds,
                dialect: engine::Dialect::Python,
                context: None,
            };
            for bad in [0, -1, i32::MIN] {
                let err = exec_from_wire(instruction(bad), false).unwrap_err();
                assert_eq!(err.kind(), engine::ErrorKind::InvalidInput);
                assert!(err.message().contains("timeout_seconds"), "{err}");
            }
            let ok = exec_from_wire(instruction(7), true).unwrap();
            assert_eq!(ok.timeout, Duration::from_secs(7));
            assert!(ok.interrupt);
            assert_eq!(ok.code, "1");
        }

        #[test]
        fn empty_requests_mean_defaults() {
            let create = create_machine_from_wire(None).unwrap();
            assert!(create.tags.is_empty());
            assert_eq!(create.memory_mb, None);
            assert_eq!(create.durability, None);
            let create = create_machine_from_wire(Some(CreateMachineRequest {
                ttl_seconds: Some(60),
                tags: Some([("a".to_owned(), "b".to_owned())].into()),
                memory_mb: Some(256),
                image: Some("data".into()),
                durability: Some("instruction".into()),
                history: Some(7),
                env: Some([("PLAIN".to_owned(), "1".to_owned())].into()),
                secret_env: Some(crate::types::SecretEnv(
                    [("TOKEN".to_owned(), "s3cret".to_owned())].into(),
                )),
                network: Some(crate::types::NetworkPolicy::Public),
            }))
            .unwrap();
            assert_eq!(create.tags.get("a").map(String::as_str), Some("b"));
            assert_eq!(create.network, Some(crate::types::NetworkPolicy::Public));
            let in_a_minute = create.expires_at.unwrap() - chrono::Utc::now();
            assert!(
                (55..=60).contains(&in_a_minute.num_seconds()),
                "{in_a_minute}"
            );
            let endless = create_machine_from_wire(Some(CreateMachineRequest {
                ttl_seconds: Some(u64::MAX / 2),
                ..CreateMachineRequest::default()
            }));
            assert!(endless.is_err());
            assert_eq!(
                create
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.value.as_str(), v.secret))
                    .collect::<Vec<_>>(),
                [("PLAIN", "1", false), ("TOKEN", "s3cret", true)]
            );
            assert!(!format!("{create:?}").contains("s3cret"));
            let both = create_machine_from_wire(Some(CreateMachineRequest {
                env: Some([("X".to_owned(), "1".to_owned())].into()),
                secret_env: Some(crate::types::SecretEnv(
                    [("X".to_owned(), "2".to_owned())].into(),
                )),
                ..CreateMachineRequest::default()
            }))
            .unwrap();
            assert_eq!(
                both.env.get("X").map(|v| (v.value.as_str(), v.secret)),
                Some(("2", true))
            );
            assert_eq!(create.memory_mb, Some(256));
            assert_eq!(create.image.as_deref(), Some("data"));
            assert_eq!(create.durability, Some(engine::Durability::Instruction));
            assert_eq!(create.history, Some(7));
            let err = create_machine_from_wire(Some(CreateMachineRequest {
                durability: Some("sometimes".into()),
                ..CreateMachineRequest::default()
            }))
            .unwrap_err();
            assert!(err.message().contains("sometimes"), "{err}");
            assert!(list_filter_from_wire(None).is_empty());
            assert!(list_filter_from_wire(Some(ListMachinesRequest::default())).is_empty());
        }

        #[test]
        fn events_become_messages() {
            let output = event_to_wire(
                3,
                engine::ExecEvent::Output(engine::OutputChunk {
                    seq: 1,
                    stream: engine::OutputStream::Stderr,
                    data: "x".into(),
                    partial: false,
                }),
                &Redactor::default(),
                &mut EventView::new(false),
            );
            match output {
                Some(MessageFromServer::Output {
                    chunk,
                    instruction_id,
                }) => {
                    assert_eq!(instruction_id, 3);
                    assert_eq!(chunk.stream, WireStream::Stderr);
                    assert_eq!((chunk.seq, chunk.data.as_str()), (1, "x"));
                }
                other => panic!("unexpected {other:?}"),
            }
            let result = event_to_wire(
                3,
                engine::ExecEvent::Result(engine::ExecResult {
                    outcome: engine::Outcome::Value(None),
                    runtime_ms: 5,
                    ..engine::ExecResult::default()
                }),
                &Redactor::default(),
                &mut EventView::new(false),
            );
            match result {
                Some(MessageFromServer::Result {
                    instruction_id,
                    result,
                }) => {
                    assert_eq!(instruction_id, 3);
                    assert_eq!(result.runtime_ms, 5);
                    assert_eq!(
                        result.outcome,
                        WireOutcome::Value {
                            value: None,
                            data: None
                        }
                    );
                }
                other => panic!("unexpected {other:?}"),
            }
        }

        #[test]
        fn rich_results_reach_only_clients_that_ask() {
            let figure = engine::RichResult {
                kind: engine::RichKind::Figure,
                data: serde_json::json!({"image/png": "iVBO", "text/plain": "<Figure>"})
                    .as_object()
                    .unwrap()
                    .clone(),
            };
            let shown = || {
                engine::ExecEvent::Output(engine::OutputChunk {
                    seq: 4,
                    stream: engine::OutputStream::Display,
                    data: serde_json::to_string(&figure).unwrap(),
                    partial: false,
                })
            };
            let finished = || {
                engine::ExecEvent::Result(engine::ExecResult {
                    data: Some(serde_json::json!({"png": "iVBO"})),
                    results: vec![figure.clone()],
                    ..engine::ExecResult::default()
                })
            };
            let redactor = Redactor::default();
            assert_eq!(
                event_to_wire(2, shown(), &redactor, &mut EventView::new(false)),
                None
            );
            match event_to_wire(2, shown(), &redactor, &mut EventView::new(true)) {
                Some(MessageFromServer::Display {
                    instruction_id: 2,
                    seq: 4,
                    result,
                }) => {
                    assert_eq!(result.kind, RichKind::Figure);
                    assert_eq!(result.get("image/png"), Some("iVBO"));
                }
                other => panic!("unexpected {other:?}"),
            }
            for rich in [false, true] {
                let Some(MessageFromServer::Result { result, .. }) =
                    event_to_wire(2, finished(), &redactor, &mut EventView::new(rich))
                else {
                    panic!("no result");
                };
                // ForeverVM's `data` keeps its shape either way.
                assert_eq!(
                    result.outcome,
                    WireOutcome::Value {
                        value: None,
                        data: Some(serde_json::json!({"png": "iVBO"}))
                    }
                );
                assert_eq!(result.results.map(|r| r.len()), rich.then_some(1));
            }
            // Without rich results, output lines are numbered among themselves (0, 1, 2, ...).
            let line = |seq| {
                engine::ExecEvent::Output(engine::OutputChunk {
                    seq,
                    stream: engine::OutputStream::Stdout,
                    data: "x".into(),
                    partial: false,
                })
            };
            for (rich, expected) in [(false, [0, 1]), (true, [0, 2])] {
                let mut view = EventView::new(rich);
                let mut seqs = Vec::new();
                for event in [line(0), shown(), line(2)] {
                    if let Some(MessageFromServer::Output { chunk, .. }) =
                        event_to_wire(2, event, &redactor, &mut view)
                    {
                        seqs.push(chunk.seq);
                    }
                }
                assert_eq!(seqs, expected, "rich: {rich}");
            }
            // A chunk that does not decode is dropped, not sent as text.
            let broken = engine::ExecEvent::Output(engine::OutputChunk {
                seq: 0,
                stream: engine::OutputStream::Display,
                data: "{".into(),
                partial: false,
            });
            assert_eq!(
                event_to_wire(2, broken, &redactor, &mut EventView::new(true)),
                None
            );
        }

        #[test]
        fn engine_text_reaches_clients_without_host_paths() {
            let redactor = Redactor::new(
                std::path::Path::new("/srv/evervm"),
                std::path::Path::new("/srv/images"),
                None,
            );
            let failed = engine::ExecResult {
                outcome: engine::Outcome::Error {
                    text: "cannot restore /srv/evervm/machines/m/snapshot: truncated".into(),
                    cause: engine::FailureCause::MachineCrashed,
                },
                ..engine::ExecResult::default()
            };
            let wire = result_to_wire(failed.clone(), &redactor, false);
            assert_eq!(
                wire.outcome,
                WireOutcome::Error {
                    error: "cannot restore <evervm home>/machines/m/snapshot: truncated".into(),
                    cause: Some("machine_crashed".into()),
                    exception: None,
                }
            );
            match event_to_wire(
                0,
                engine::ExecEvent::Result(failed),
                &redactor,
                &mut EventView::new(false),
            ) {
                Some(MessageFromServer::Result { result, .. }) => assert_eq!(result, wire),
                other => panic!("unexpected {other:?}"),
            }
            let note = engine::ExecEvent::Output(engine::OutputChunk {
                seq: 0,
                stream: engine::OutputStream::Stderr,
                data: "[evervm] this machine's sandbox stopped (/srv/images/minimal-1 is gone)"
                    .into(),
                partial: false,
            });
            match event_to_wire(0, note, &redactor, &mut EventView::new(false)) {
                Some(MessageFromServer::Output { chunk, .. }) => assert_eq!(
                    chunk.data,
                    "[evervm] this machine's sandbox stopped (<evervm images>/minimal-1 is gone)"
                ),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}
