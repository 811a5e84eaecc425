//! What each tool does: parse its arguments, one [`Client`] call, and the result a model reads.

use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, ProgressNotificationParam};
use rmcp::service::RequestContext;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::catalog::{
    Checkpoint, CheckpointArgs, CheckpointList, CheckpointMade, CreateReplArgs, CreatedRepl,
    FILE_LIMIT_BYTES, FileContent, FileWritten, ForkArgs, Forked, Interrupted, ListArgs,
    ReadFileArgs, ReplArgs, ReplList, ReplNetwork, ReplSummary, RewindArgs, Rewound, RollbackArgs,
    RolledBack, RunArgs, RunOutput, SwappedOut, ToolName, WriteFileArgs,
};
use super::tool_error;
use crate::tool::{TEXT_LIMIT, shorten};
use crate::{
    CheckpointInfo, Client, CreateMachineOptions, Error, ErrorKind, ExecEvent, ExecOptions,
    Execution, MAX_TIMEOUT, RichKind,
};

/// How many REPLs `list-python-repls` gives at most (the newest).
const LIST_LIMIT: u32 = 100;

/// How many images one result carries at most; `figures` counts them all.
const IMAGE_LIMIT: usize = 8;

/// A tool's answer, or the text of its failure.
type Answer = Result<CallToolResult, String>;

pub(super) async fn call(
    tool: ToolName,
    client: &Client,
    arguments: JsonObject,
    context: &RequestContext<RoleServer>,
) -> CallToolResult {
    // Each tool's arguments parsed into its own type, then its call.
    macro_rules! with {
        ($call:expr) => {
            match parse(tool, arguments) {
                Ok(args) => $call(args).await,
                Err(e) => Err(e),
            }
        };
    }
    let answer = match tool {
        ToolName::CreateRepl => with!(|args| create(client, args)),
        ToolName::RunPython => with!(|args| run(client, args, context)),
        ToolName::ListRepls => with!(|args| list(client, args)),
        ToolName::ForkRepl => with!(|args| fork(client, args)),
        ToolName::CreateCheckpoint => with!(|args| checkpoint(client, args)),
        ToolName::ListCheckpoints => with!(|args| checkpoints(client, args)),
        ToolName::Rollback => with!(|args| rollback(client, args)),
        ToolName::Undo => with!(|args: ReplArgs| rewind(client, args.repl_id, -1)),
        ToolName::Rewind => {
            with!(|args: RewindArgs| rewind(client, args.repl_id, args.instruction))
        }
        ToolName::SwapOut => with!(|args| swap_out(client, args)),
        ToolName::Interrupt => with!(|args| interrupt(client, args)),
        ToolName::WriteFile => with!(|args| write_file(client, args)),
        ToolName::ReadFile => with!(|args| read_file(client, args)),
    };
    answer.unwrap_or_else(tool_error)
}

/// The arguments as the tool's type; what was wrong with them, for the model, when they are
/// not.
fn parse<T: DeserializeOwned>(tool: ToolName, arguments: JsonObject) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::Object(arguments)).map_err(|e| {
        format!(
            "wrong arguments for {}: {e}. Its input schema (tools/list) says what it takes.",
            tool.as_str()
        )
    })
}

/// The text of a failed call, with what to do next where that is clear.
fn failed(e: Error) -> String {
    match e.kind() {
        ErrorKind::NotFound => format!(
            "{}. list-python-repls lists the REPLs there are; create-python-repl makes a new \
             one.",
            e.message()
        ),
        ErrorKind::InvalidInput => format!("invalid input: {}", e.message()),
        _ => e.message().to_owned(),
    }
}

/// A success: the structured result, its JSON as the text (what a client without structured
/// results shows), and any further content.
fn structured(value: &impl Serialize, more: Vec<ContentBlock>) -> Answer {
    let json = serde_json::to_value(value).map_err(|e| format!("cannot encode the result: {e}"))?;
    let mut result = CallToolResult::structured(json);
    result.content.extend(more);
    Ok(result)
}

/// The undo points of a REPL the MCP server creates (the tools' descriptions say the number).
const REPL_HISTORY: u32 = 10;

async fn create(client: &Client, args: CreateReplArgs) -> Answer {
    let options = CreateMachineOptions {
        tags: args.tags.unwrap_or_default(),
        network: args
            .network
            .map(ReplNetwork::policy)
            .transpose()
            .map_err(failed)?,
        // A model undoes what broke its REPL (undo-last-instruction, rewind-python-repl).
        history: Some(REPL_HISTORY),
        ..CreateMachineOptions::default()
    };
    let machine = match client.create_machine(options.clone()).await {
        // A server that keeps no history (the process backend, a lower maximum): a REPL
        // without undo points rather than none.
        Err(e) if matches!(e.kind(), ErrorKind::Unsupported | ErrorKind::InvalidInput) => client
            .create_machine(CreateMachineOptions {
                history: None,
                ..options
            })
            .await
            .map_err(failed)?,
        created => created.map_err(failed)?,
    };
    let repl_id = machine.name().to_owned();
    // ForeverVM's server answers with the name alone as the text.
    let mut result = structured(
        &CreatedRepl {
            repl_id: repl_id.clone(),
        },
        Vec::new(),
    )?;
    result.content = vec![ContentBlock::text(repl_id)];
    Ok(result)
}

async fn run(client: &Client, args: RunArgs, context: &RequestContext<RoleServer>) -> Answer {
    let mut options = ExecOptions::default();
    if let Some(seconds) = args.timeout_seconds {
        if !(seconds.is_finite() && (1.0..=MAX_TIMEOUT.as_secs_f64()).contains(&seconds)) {
            return Err(format!(
                "timeoutSeconds must be from 1 to {}, not {seconds}",
                MAX_TIMEOUT.as_secs()
            ));
        }
        options.timeout = Duration::from_secs_f64(seconds);
    }
    let machine = client.machine(&args.repl_id);
    let (seq, mut events) = machine
        .stream(&args.python_code, &options)
        .await
        .map_err(failed)?;
    let mut progress = Progress::new(context);
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut output = Vec::new();
    let result = loop {
        tokio::select! {
            () = context.ct.cancelled() => {
                // Its own instruction alone: the caller's next call may already be queued.
                let interrupted = machine.interrupt_instruction(seq).await;
                return Err(match interrupted {
                    Ok(_) => "the call was cancelled: its instruction was interrupted and the \
                              REPL kept its state".to_owned(),
                    Err(e) => format!("the call was cancelled, but interrupting its instruction \
                                       failed: {}", e.message()),
                });
            }
            _ = heartbeat.tick() => progress.report(None).await,
            event = events.next() => match event {
                Some(Ok(ExecEvent::Output(chunk))) => {
                    progress.report(Some(&chunk.data)).await;
                    output.push(chunk);
                }
                // The result repeats what was displayed.
                Some(Ok(ExecEvent::Display(_))) => {}
                Some(Ok(ExecEvent::Result(result))) => break result,
                Some(Err(e)) => return Err(failed(e)),
                None => {
                    return Err(format!("instruction {seq} ended without a result"));
                }
            },
        }
    };
    let run = Execution {
        seq,
        output,
        result,
    };
    run_result(&args.repl_id, &run)
}

/// An instruction's result for a model: ForeverVM's JSON (with more in it) as the text and as
/// the structured result, then its figures as images.
fn run_result(repl_id: &str, run: &Execution) -> Answer {
    let result = &run.result;
    let mut images = Vec::new();
    let mut displays = Vec::new();
    for rich in &result.results {
        match (rich.kind, rich.get("image/png")) {
            (RichKind::Figure | RichKind::Display, Some(png)) => images.push(png.to_owned()),
            (RichKind::Display, None) => {
                if let Some(text) = rich.text() {
                    displays.push(shorten(text.to_owned(), TEXT_LIMIT));
                }
            }
            // The value's text is `result`.
            (RichKind::Figure | RichKind::Value, _) => {}
        }
    }
    if images.is_empty() {
        // A server that gives ForeverVM's `data.png` only.
        let png = result.data.as_ref().and_then(|d| d.get("png")?.as_str());
        images.extend(png.map(str::to_owned));
    }
    let output: Vec<&str> = run.output.iter().map(|c| c.data.as_str()).collect();
    let stderr = run.stderr();
    let answer = RunOutput {
        output: shorten(output.join("\n"), TEXT_LIMIT),
        result: match (&result.error, &result.value) {
            (Some(_), _) => String::new(),
            (None, Some(value)) => shorten(value.clone(), TEXT_LIMIT),
            (None, None) => "The code did not return a value".to_owned(),
        },
        repl_id: repl_id.to_owned(),
        error: result
            .error
            .as_ref()
            .map(|e| shorten(format!("Error: {e}"), TEXT_LIMIT)),
        exception: result.exception.clone().map(|mut e| {
            e.value = shorten(e.value, TEXT_LIMIT);
            e
        }),
        stderr: (!stderr.is_empty()).then(|| shorten(stderr, TEXT_LIMIT)),
        displays,
        figures: images.len(),
        timed_out: result.timed_out(),
        runtime_ms: result.runtime_ms,
        instruction: run.seq,
    };
    let pictures = images
        .into_iter()
        .take(IMAGE_LIMIT)
        .map(|png| ContentBlock::image(png, "image/png"))
        .collect();
    let mut answer = structured(&answer, pictures)?;
    if result.error.is_some() {
        answer.is_error = Some(true);
    }
    Ok(answer)
}

/// Progress notifications while an instruction runs, for a client that asked for them (a
/// progress token on the call): one a second, and output lines at most four times a second.
struct Progress<'a> {
    context: &'a RequestContext<RoleServer>,
    started: Instant,
    last_sent: Option<Instant>,
    last_value: f64,
}

impl<'a> Progress<'a> {
    fn new(context: &'a RequestContext<RoleServer>) -> Self {
        Self {
            context,
            started: Instant::now(),
            last_sent: None,
            last_value: 0.0,
        }
    }

    async fn report(&mut self, line: Option<&str>) {
        let Some(token) = self.context.meta.get_progress_token() else {
            return;
        };
        let now = Instant::now();
        let quiet_for = self.last_sent.map(|sent| now.duration_since(sent));
        let due = match line {
            Some(_) => quiet_for.is_none_or(|d| d >= Duration::from_millis(250)),
            None => quiet_for.is_none_or(|d| d >= Duration::from_millis(900)),
        };
        if !due {
            return;
        }
        let elapsed = now.duration_since(self.started).as_secs_f64();
        // Progress must grow with every notification.
        let value = elapsed.max(self.last_value + 0.001);
        let message = match line {
            Some(line) => {
                let line: String = line.chars().take(200).collect();
                format!("running for {elapsed:.0} s: {line}")
            }
            None => format!("running for {elapsed:.0} s"),
        };
        let notification = ProgressNotificationParam::new(token, value).with_message(message);
        if let Err(e) = self.context.peer.notify_progress(notification).await {
            tracing::debug!("progress notification not sent: {e}");
        }
        self.last_sent = Some(now);
        self.last_value = value;
    }
}

async fn list(client: &Client, args: ListArgs) -> Answer {
    let page = client
        .list_machines_page(&args.tags.unwrap_or_default(), LIST_LIMIT, None)
        .await
        .map_err(failed)?;
    let repls = page
        .machines
        .into_iter()
        .map(|m| ReplSummary {
            busy: m.has_pending_instruction,
            repl_id: m.name,
            tags: m.tags,
            created_at: m.created_at.to_rfc3339(),
            state: m.state,
        })
        .collect();
    structured(&ReplList { repls }, Vec::new())
}

async fn fork(client: &Client, args: ForkArgs) -> Answer {
    let copy = client
        .machine(&args.repl_id)
        .fork(args.tags)
        .await
        .map_err(failed)?;
    structured(
        &Forked {
            repl_id: copy.name().to_owned(),
            forked_from: args.repl_id,
        },
        Vec::new(),
    )
}

fn checkpoint_of(info: CheckpointInfo) -> Checkpoint {
    Checkpoint {
        name: info.name,
        created_at: info.created_at.to_rfc3339(),
        instruction_count: info.instruction_count,
    }
}

async fn checkpoint(client: &Client, args: CheckpointArgs) -> Answer {
    let info = client
        .machine(&args.repl_id)
        .checkpoint(args.name.as_deref())
        .await
        .map_err(failed)?;
    structured(
        &CheckpointMade {
            repl_id: args.repl_id,
            checkpoint: checkpoint_of(info),
        },
        Vec::new(),
    )
}

async fn checkpoints(client: &Client, args: ReplArgs) -> Answer {
    let list = client
        .machine(&args.repl_id)
        .checkpoints()
        .await
        .map_err(failed)?;
    structured(
        &CheckpointList {
            repl_id: args.repl_id,
            checkpoints: list.into_iter().map(checkpoint_of).collect(),
        },
        Vec::new(),
    )
}

async fn rollback(client: &Client, args: RollbackArgs) -> Answer {
    client
        .machine(&args.repl_id)
        .rollback(&args.checkpoint)
        .await
        .map_err(failed)?;
    structured(
        &RolledBack {
            repl_id: args.repl_id,
            checkpoint: args.checkpoint,
        },
        Vec::new(),
    )
}

async fn rewind(client: &Client, repl_id: String, to: i64) -> Answer {
    let rewound = client.machine(&repl_id).rewind(to).await.map_err(failed)?;
    structured(
        &Rewound {
            repl_id,
            back_to_instruction: rewound.to,
            taken_back: rewound.rewound,
        },
        Vec::new(),
    )
}

async fn swap_out(client: &Client, args: ReplArgs) -> Answer {
    client
        .machine(&args.repl_id)
        .swap_out()
        .await
        .map_err(failed)?;
    structured(
        &SwappedOut {
            repl_id: args.repl_id,
        },
        Vec::new(),
    )
}

async fn interrupt(client: &Client, args: ReplArgs) -> Answer {
    let interrupted = client
        .machine(&args.repl_id)
        .interrupt()
        .await
        .map_err(failed)?;
    structured(
        &Interrupted {
            repl_id: args.repl_id,
            interrupted,
        },
        Vec::new(),
    )
}

fn too_large(size: usize) -> String {
    format!(
        "the file is {size} bytes, more than the {} MiB the file tools move: use the files API \
         or `evervm cp` for larger files, or split it",
        FILE_LIMIT_BYTES / (1024 * 1024)
    )
}

async fn write_file(client: &Client, args: WriteFileArgs) -> Answer {
    let bytes = match (args.content, args.content_base64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(encoded)) => {
            // Four base64 characters make three bytes: refuse before decoding a huge one.
            if encoded.len() / 4 * 3 > FILE_LIMIT_BYTES + 3 {
                return Err(too_large(encoded.len() / 4 * 3));
            }
            base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|e| format!("contentBase64 is not base64: {e}"))?
        }
        (Some(_), Some(_)) => return Err("give content or contentBase64, not both".to_owned()),
        (None, None) => {
            return Err("give the file's content (text) or contentBase64 (bytes)".to_owned());
        }
    };
    if bytes.len() > FILE_LIMIT_BYTES {
        return Err(too_large(bytes.len()));
    }
    let info = client
        .machine(&args.repl_id)
        .write_file(&args.path, bytes)
        .await
        .map_err(failed)?;
    structured(
        &FileWritten {
            repl_id: args.repl_id,
            path: info.path,
            size: info.size,
        },
        Vec::new(),
    )
}

/// The image type of `bytes` by their first bytes, for the types models take.
fn image_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

async fn read_file(client: &Client, args: ReadFileArgs) -> Answer {
    let read = client
        .machine(&args.repl_id)
        .read_file_stream(&args.path)
        .await
        .map_err(failed)?;
    let size = usize::try_from(read.info.size).unwrap_or(usize::MAX);
    if size > FILE_LIMIT_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size);
    let mut data = read.data;
    while let Some(piece) = data.next().await {
        let piece = piece.map_err(failed)?;
        // The file may have grown since it was opened.
        if bytes.len() + piece.len() > FILE_LIMIT_BYTES {
            return Err(too_large(bytes.len() + piece.len()));
        }
        bytes.extend_from_slice(&piece);
    }
    let mut answer = FileContent {
        repl_id: args.repl_id,
        path: read.info.path,
        size: bytes.len() as u64,
        mime_type: "application/octet-stream".to_owned(),
        text: None,
        content_base64: None,
    };
    let base64 = || base64::engine::general_purpose::STANDARD.encode(&bytes);
    if let Some(mime) = image_type(&bytes) {
        mime.clone_into(&mut answer.mime_type);
        let picture = ContentBlock::image(base64(), mime);
        return structured(&answer, vec![picture]);
    }
    match std::str::from_utf8(&bytes) {
        Ok(text) => {
            "text/plain; charset=utf-8".clone_into(&mut answer.mime_type);
            answer.text = Some(text.to_owned());
            let mut result = structured(&answer, Vec::new())?;
            // The text itself, not JSON around it, is what a model reads best.
            result.content = vec![ContentBlock::text(text.to_owned())];
            Ok(result)
        }
        Err(_) => {
            answer.content_base64 = Some(base64());
            structured(&answer, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ExecResult, OutputChunk, OutputStream, RichResult};

    fn execution(value: Option<&str>, error: Option<&str>, results: Vec<RichResult>) -> Execution {
        Execution {
            seq: 3,
            output: vec![
                OutputChunk {
                    stream: OutputStream::Stdout,
                    data: "hello".to_owned(),
                    seq: 0,
                },
                OutputChunk {
                    stream: OutputStream::Stderr,
                    data: "careful".to_owned(),
                    seq: 1,
                },
            ],
            result: ExecResult {
                value: value.map(str::to_owned),
                error: error.map(str::to_owned),
                results,
                runtime_ms: 12,
                cause: None,
                exception: error.map(|name| crate::types::ExceptionInfo {
                    name: name.to_owned(),
                    qualname: name.to_owned(),
                    module: "builtins".to_owned(),
                    value: "division by zero".to_owned(),
                }),
                data: None,
                output_truncated: false,
                saved: None,
            },
        }
    }

    fn text_of(result: &CallToolResult) -> serde_json::Value {
        let text = result.content[0].as_text().map(|t| t.text.clone());
        serde_json::from_str(&text.unwrap_or_default()).unwrap_or_default()
    }

    #[test]
    fn a_value_comes_as_forevervm_json_with_more() {
        let answer = run_result("m1", &execution(Some("42"), None, Vec::new())).unwrap();
        assert_eq!(answer.is_error, Some(false));
        let json = text_of(&answer);
        assert_eq!(json["output"], "hello\ncareful");
        assert_eq!(json["result"], "42");
        assert_eq!(json["replId"], "m1");
        assert_eq!(json["stderr"], "careful\n");
        assert_eq!(json["instruction"], 3);
        assert!(json.get("error").is_none());
        assert_eq!(answer.structured_content, Some(json));
    }

    #[test]
    fn an_error_sets_is_error_and_a_figure_comes_as_an_image_too() {
        let figure = RichResult {
            kind: RichKind::Figure,
            data: serde_json::json!({"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        };
        let answer = run_result(
            "m1",
            &execution(None, Some("ZeroDivisionError"), vec![figure]),
        )
        .unwrap();
        assert_eq!(answer.is_error, Some(true));
        let json = text_of(&answer);
        assert_eq!(json["error"], "Error: ZeroDivisionError");
        assert_eq!(json["exception"]["name"], "ZeroDivisionError");
        assert_eq!(json["exception"]["value"], "division by zero");
        assert_eq!(json["result"], "");
        assert_eq!(json["figures"], 1);
        assert_eq!(answer.content.len(), 2);
        let image = answer.content[1].as_image().map(|i| i.data.clone());
        assert_eq!(image.as_deref(), Some("iVBORw0KGgo="));
    }

    #[test]
    fn no_value_says_so() {
        let answer = run_result("m1", &execution(None, None, Vec::new())).unwrap();
        assert_eq!(
            text_of(&answer)["result"],
            "The code did not return a value"
        );
    }

    #[test]
    fn images_are_known_by_their_first_bytes() {
        assert_eq!(image_type(b"\x89PNG\r\n\x1a\nrest"), Some("image/png"));
        assert_eq!(image_type(&[0xff, 0xd8, 0xff, 0xe0]), Some("image/jpeg"));
        assert_eq!(image_type(b"GIF89a..."), Some("image/gif"));
        assert_eq!(image_type(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(image_type(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(image_type(b"a,b\n1,2\n"), None);
        assert_eq!(image_type(b""), None);
    }

    #[test]
    fn bad_arguments_are_a_tool_error_naming_the_problem() {
        let arguments = serde_json::json!({"pythonCode": 5});
        let Err(text) = parse::<RunArgs>(
            ToolName::RunPython,
            arguments.as_object().cloned().unwrap_or_default(),
        ) else {
            panic!("5 is not code");
        };
        assert!(
            text.contains("run-python-in-repl") && text.contains("invalid type"),
            "{text}"
        );
        let Err(text) = parse::<RunArgs>(ToolName::RunPython, JsonObject::new()) else {
            panic!("no arguments");
        };
        assert!(text.contains("missing field"), "{text}");
    }
}
