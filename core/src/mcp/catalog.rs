//! The tools as a model sees them: names, descriptions, the arguments each takes and the
//! structured result each gives, and annotations. The argument types are also what a call is
//! parsed into, so a schema and its parsing cannot drift apart.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every tool, in the order `tools/list` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolName {
    CreateRepl,
    RunPython,
    ListRepls,
    ForkRepl,
    CreateCheckpoint,
    ListCheckpoints,
    Rollback,
    Undo,
    Rewind,
    SwapOut,
    Interrupt,
    WriteFile,
    ReadFile,
}

impl ToolName {
    pub(crate) const ALL: &'static [ToolName] = &[
        ToolName::CreateRepl,
        ToolName::RunPython,
        ToolName::ListRepls,
        ToolName::ForkRepl,
        ToolName::CreateCheckpoint,
        ToolName::ListCheckpoints,
        ToolName::Rollback,
        ToolName::Undo,
        ToolName::Rewind,
        ToolName::SwapOut,
        ToolName::Interrupt,
        ToolName::WriteFile,
        ToolName::ReadFile,
    ];

    /// The name on the wire: ForeverVM's two first, then ours in the same style.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ToolName::CreateRepl => "create-python-repl",
            ToolName::RunPython => "run-python-in-repl",
            ToolName::ListRepls => "list-python-repls",
            ToolName::ForkRepl => "fork-python-repl",
            ToolName::CreateCheckpoint => "create-checkpoint",
            ToolName::ListCheckpoints => "list-checkpoints",
            ToolName::Rollback => "rollback-to-checkpoint",
            ToolName::Undo => "undo-last-instruction",
            ToolName::Rewind => "rewind-python-repl",
            ToolName::SwapOut => "swap-out-python-repl",
            ToolName::Interrupt => "interrupt-python-repl",
            ToolName::WriteFile => "write-file-to-repl",
            ToolName::ReadFile => "read-file-from-repl",
        }
    }

    /// The audit log's action for a tool that changes state (the API's name for the same
    /// change); `None` for one that only reads.
    #[cfg(feature = "server")]
    pub(crate) fn audit_action(self) -> Option<&'static str> {
        Some(match self {
            ToolName::CreateRepl => "machine.create",
            ToolName::RunPython => "exec",
            ToolName::ForkRepl => "machine.fork",
            ToolName::CreateCheckpoint => "checkpoint.create",
            ToolName::Rollback => "checkpoint.rollback",
            ToolName::Undo | ToolName::Rewind => "machine.rewind",
            ToolName::SwapOut => "machine.swap",
            ToolName::Interrupt => "machine.interrupt",
            ToolName::WriteFile => "file.write",
            ToolName::ListRepls | ToolName::ListCheckpoints | ToolName::ReadFile => return None,
        })
    }

    pub(crate) fn parse(name: &str) -> Option<ToolName> {
        Self::ALL.iter().copied().find(|t| t.as_str() == name)
    }

    /// The tool's definition for `tools/list`.
    pub(crate) fn definition(self) -> Tool {
        let (title, description) = self.text();
        let tool = match self {
            ToolName::CreateRepl => {
                Tool::new(self.as_str(), description, input::<CreateReplArgs>())
                    .with_output_schema::<CreatedRepl>()
            }
            ToolName::RunPython => Tool::new(self.as_str(), description, input::<RunArgs>())
                .with_output_schema::<RunOutput>(),
            ToolName::ListRepls => Tool::new(self.as_str(), description, input::<ListArgs>())
                .with_output_schema::<ReplList>(),
            ToolName::ForkRepl => Tool::new(self.as_str(), description, input::<ForkArgs>())
                .with_output_schema::<Forked>(),
            ToolName::CreateCheckpoint => {
                Tool::new(self.as_str(), description, input::<CheckpointArgs>())
                    .with_output_schema::<CheckpointMade>()
            }
            ToolName::ListCheckpoints => Tool::new(self.as_str(), description, input::<ReplArgs>())
                .with_output_schema::<CheckpointList>(),
            ToolName::Rollback => Tool::new(self.as_str(), description, input::<RollbackArgs>())
                .with_output_schema::<RolledBack>(),
            ToolName::Undo => Tool::new(self.as_str(), description, input::<ReplArgs>())
                .with_output_schema::<Rewound>(),
            ToolName::Rewind => Tool::new(self.as_str(), description, input::<RewindArgs>())
                .with_output_schema::<Rewound>(),
            ToolName::SwapOut => Tool::new(self.as_str(), description, input::<ReplArgs>())
                .with_output_schema::<SwappedOut>(),
            ToolName::Interrupt => Tool::new(self.as_str(), description, input::<ReplArgs>())
                .with_output_schema::<Interrupted>(),
            ToolName::WriteFile => Tool::new(self.as_str(), description, input::<WriteFileArgs>())
                .with_output_schema::<FileWritten>(),
            ToolName::ReadFile => Tool::new(self.as_str(), description, input::<ReadFileArgs>())
                .with_output_schema::<FileContent>(),
        };
        let mut tool = tool
            .with_title(title)
            .with_annotations(self.annotations(title));
        tool.input_schema = Arc::new(standard_formats_only(&tool.input_schema));
        tool.output_schema = tool
            .output_schema
            .map(|schema| Arc::new(standard_formats_only(&schema)));
        tool
    }

    /// What the tool may do, said truthfully: only the list and read tools leave everything
    /// as it was; running code, rolling back, interrupting and overwriting a file can undo
    /// work. Only code run in a REPL can reach outside (when its REPL was given a network).
    fn annotations(self, title: &str) -> ToolAnnotations {
        let (read_only, destructive, idempotent) = match self {
            // New things only: a REPL, a copy, a checkpoint.
            ToolName::CreateRepl | ToolName::ForkRepl | ToolName::CreateCheckpoint => {
                (false, false, false)
            }
            // Code does anything; an undo again goes one further back.
            ToolName::RunPython | ToolName::Undo => (false, true, false),
            ToolName::ListRepls | ToolName::ListCheckpoints | ToolName::ReadFile => {
                (true, false, true)
            }
            // What the instruction would still have done is lost; what a rollback, a rewind
            // or a written file replaces is gone.
            ToolName::Rollback | ToolName::Rewind | ToolName::Interrupt | ToolName::WriteFile => {
                (false, true, true)
            }
            // The machine's state is kept; only its memory is released.
            ToolName::SwapOut => (false, false, true),
        };
        ToolAnnotations::with_title(title)
            .read_only(read_only)
            .destructive(destructive)
            .idempotent(idempotent)
            .open_world(self == ToolName::RunPython)
    }

    fn text(self) -> (&'static str, String) {
        match self {
            ToolName::CreateRepl => (
                "Create a Python REPL",
                "Creates a new persistent Python REPL (a sandboxed machine) and returns its \
                 replId. Pass the replId to run-python-in-repl: variables, imports, functions \
                 and files persist between calls in the same REPL for as long as it exists, even \
                 across days (an idle REPL is saved to disk and restored on its next call). \
                 Create one REPL per task and keep using it."
                    .to_owned(),
            ),
            ToolName::RunPython => (
                "Run Python in a REPL",
                format!(
                    "{} The result is JSON: `output` (what it printed, stdout and stderr), \
                     `result` (the repr of the last expression), `error` (the traceback, when \
                     it failed; then isError is set). Instructions time out after \
                     timeoutSeconds (default {} s) with the REPL's state kept.",
                    crate::tool::DESCRIPTION,
                    crate::DEFAULT_TIMEOUT.as_secs()
                ),
            ),
            ToolName::ListRepls => (
                "List Python REPLs",
                "Lists the Python REPLs, newest first, with their tags and whether each is in \
                 memory or saved to disk; with tags, only those carrying all of them."
                    .to_owned(),
            ),
            ToolName::ForkRepl => (
                "Fork a Python REPL",
                "Copies a REPL with everything in it (variables, imports, files) into a new REPL \
                 and returns the new replId; the two then go their own ways. Use it to try \
                 something risky without losing the original."
                    .to_owned(),
            ),
            ToolName::CreateCheckpoint => (
                "Checkpoint a Python REPL",
                "Saves a REPL's whole state (variables, imports, files) under a name, to return \
                 to later with rollback-to-checkpoint."
                    .to_owned(),
            ),
            ToolName::ListCheckpoints => (
                "List a REPL's checkpoints",
                "Lists a REPL's checkpoints, oldest first.".to_owned(),
            ),
            ToolName::Rollback => (
                "Roll a REPL back to a checkpoint",
                "Returns a REPL to the state it had when a checkpoint was made: everything done \
                 since (variables, files) is gone. The checkpoint is kept."
                    .to_owned(),
            ),
            ToolName::Undo => (
                "Undo the last instruction in a REPL",
                "Takes back the last run-python-in-repl call on a REPL: its variables, imports \
                 and files become exactly what they were before that call. Use it when a call \
                 broke the REPL's state (overwrote a DataFrame, half-ran a loop, patched a \
                 module, deleted a file) instead of rebuilding the state by hand or starting a \
                 new REPL; then carry on with a corrected call. Called again, it goes one more \
                 call back, as far as the REPL keeps undo points (its latest 10 calls). The \
                 calls taken back stay listed, marked rewound."
                    .to_owned(),
            ),
            ToolName::Rewind => (
                "Rewind a REPL to an earlier instruction",
                "Returns a REPL to its state right after an earlier run-python-in-repl call, \
                 given that call's `instruction` number (from its result): everything done \
                 after it is taken back. Use it to go back several calls at once, to a state \
                 you know was good; for the last call alone, undo-last-instruction is simpler. \
                 Only the REPL's latest 10 calls can be rewound to."
                    .to_owned(),
            ),
            ToolName::SwapOut => (
                "Swap a REPL out of memory",
                "Saves a REPL to disk and releases its memory now instead of when it is idle; \
                 nothing is lost, and its next call restores it."
                    .to_owned(),
            ),
            ToolName::Interrupt => (
                "Interrupt a REPL",
                "Stops the instruction running in a REPL (as Ctrl-C would: a KeyboardInterrupt) \
                 and cancels queued ones. The REPL's state is kept."
                    .to_owned(),
            ),
            ToolName::WriteFile => (
                "Write a file into a REPL",
                format!(
                    "Writes a file into a REPL's filesystem (relative paths are under its home \
                     directory, where Python starts), replacing any file at that path: give \
                     `content` for text such as a CSV, or `contentBase64` for bytes. Up to {} \
                     MiB; the code then opens it, e.g. pandas.read_csv('data.csv').",
                    FILE_LIMIT_BYTES / (1024 * 1024)
                ),
            ),
            ToolName::ReadFile => (
                "Read a file from a REPL",
                format!(
                    "Reads a file from a REPL's filesystem (relative paths are under its home \
                     directory): text comes back as text, PNG, JPEG, GIF and WebP images as \
                     images, other bytes as base64. Up to {} MiB.",
                    FILE_LIMIT_BYTES / (1024 * 1024)
                ),
            ),
        }
    }
}

/// The largest file the file tools move: larger ones go through the files API or `evervm cp`,
/// which stream.
pub(crate) const FILE_LIMIT_BYTES: usize = 4 * 1024 * 1024;

/// `schema` without the `format`s JSON Schema does not define (schemars writes `uint64` for an
/// unsigned integer, which validators such as the TypeScript SDK's warn about).
fn standard_formats_only(schema: &JsonObject) -> JsonObject {
    fn clean(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => serde_json::Value::Object(
                map.iter()
                    .filter(|(key, value)| {
                        !(key.as_str() == "format"
                            && value.as_str().is_some_and(|f| {
                                f.starts_with("int")
                                    || f.starts_with("uint")
                                    || f == "double"
                                    || f == "float"
                            }))
                    })
                    .map(|(key, value)| (key.clone(), clean(value)))
                    .collect(),
            ),
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(clean).collect())
            }
            other => other.clone(),
        }
    }
    match clean(&serde_json::Value::Object(schema.clone())) {
        serde_json::Value::Object(map) => map,
        _ => schema.clone(),
    }
}

fn input<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_type::<T>()
}

/// Tags: short keys and values a REPL is labelled and found with.
pub(crate) type TagMap = BTreeMap<String, String>;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateReplArgs {
    /// Labels for the new REPL (e.g. {"task": "sales-report"}), to find it again with
    /// list-python-repls.
    #[serde(default)]
    pub(crate) tags: Option<TagMap>,
    /// What the REPL may reach over the network: `"none"`, `"public"`, or a list of names and
    /// blocks such as `["pypi.org", "*.pythonhosted.org"]` (within what the server allows; its
    /// default when omitted). `%pip install` works without a network.
    #[serde(default)]
    pub(crate) network: Option<ReplNetwork>,
}

/// A REPL's network: a mode, or the list of what it may reach.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ReplNetwork {
    /// `none` (its own loopback only) or `public` (public internet addresses, never the host's
    /// or private ones).
    Mode(String),
    /// Domain names (`*.` wildcards allowed) and IPv4 blocks it may reach, nothing else.
    Allow(Vec<String>),
}

impl ReplNetwork {
    pub(crate) fn policy(self) -> crate::Result<crate::NetworkPolicy> {
        Ok(match self {
            ReplNetwork::Mode(mode) => crate::NetworkPolicy::from_mode_name(&mode)?,
            ReplNetwork::Allow(rules) => {
                crate::NetworkPolicy::new(crate::NetworkMode::Allow, &rules)?
            }
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunArgs {
    /// Python code to run; the value of its last expression is returned.
    pub(crate) python_code: String,
    /// The REPL to run it in, as create-python-repl returned it.
    pub(crate) repl_id: String,
    /// Seconds before the code is interrupted (its REPL's state is kept).
    #[serde(default)]
    pub(crate) timeout_seconds: Option<f64>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListArgs {
    /// Only REPLs carrying all of these tags.
    #[serde(default)]
    pub(crate) tags: Option<TagMap>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReplArgs {
    /// The REPL, as create-python-repl returned it.
    pub(crate) repl_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ForkArgs {
    /// The REPL to copy.
    pub(crate) repl_id: String,
    /// The copy's tags (default: the original's).
    #[serde(default)]
    pub(crate) tags: Option<TagMap>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CheckpointArgs {
    /// The REPL to checkpoint.
    pub(crate) repl_id: String,
    /// A name for the checkpoint (letters, digits, `-`, `_`, `.`); one is made up when not
    /// given.
    #[serde(default)]
    pub(crate) name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RollbackArgs {
    /// The REPL to roll back.
    pub(crate) repl_id: String,
    /// The checkpoint's name, as create-checkpoint or list-checkpoints gave it.
    pub(crate) checkpoint: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RewindArgs {
    /// The REPL to rewind.
    pub(crate) repl_id: String,
    /// The `instruction` number of the call whose after-state to return to, as its
    /// run-python-in-repl result gave it.
    pub(crate) instruction: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WriteFileArgs {
    /// The REPL to write into.
    pub(crate) repl_id: String,
    /// The file's path: relative to the REPL's home directory, or absolute under it or /tmp.
    pub(crate) path: String,
    /// The file's text (written as UTF-8). Give this or contentBase64.
    #[serde(default)]
    pub(crate) content: Option<String>,
    /// The file's bytes, base64-encoded. Give this or content.
    #[serde(default)]
    pub(crate) content_base64: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReadFileArgs {
    /// The REPL to read from.
    pub(crate) repl_id: String,
    /// The file's path: relative to the REPL's home directory, or absolute.
    pub(crate) path: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreatedRepl {
    /// The new REPL's id, for the other tools.
    pub(crate) repl_id: String,
}

/// What an instruction did. `output`, `result`, `replId` and `error` are ForeverVM's MCP
/// server's result, key for key.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunOutput {
    /// What it printed (stdout and stderr, in order), one line per line.
    pub(crate) output: String,
    /// The repr of its last expression, "The code did not return a value" when there was
    /// none, or "" when it failed.
    pub(crate) result: String,
    pub(crate) repl_id: String,
    /// "Error: " and the traceback, when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// The exception it raised, as data: its class's name, qualified name and module, and
    /// its message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exception: Option<crate::types::ExceptionInfo>,
    /// What it printed on stderr alone, when it printed anything there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stderr: Option<String>,
    /// The text of what it displayed with display() (a DataFrame's table, say).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) displays: Vec<String>,
    /// How many figures (matplotlib plots) it produced; each comes as an image.
    pub(crate) figures: usize,
    /// True when it ran out of time and was interrupted (the REPL's state is kept).
    pub(crate) timed_out: bool,
    pub(crate) runtime_ms: u64,
    /// Its number in the REPL, from 0.
    pub(crate) instruction: i64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReplSummary {
    pub(crate) repl_id: String,
    pub(crate) tags: TagMap,
    /// RFC 3339.
    pub(crate) created_at: String,
    /// `resident` (in memory), `swapped` (saved to disk, restored on its next call), ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<String>,
    /// True while an instruction runs or waits.
    pub(crate) busy: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReplList {
    pub(crate) repls: Vec<ReplSummary>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Forked {
    /// The copy's id.
    pub(crate) repl_id: String,
    /// The REPL it was copied from.
    pub(crate) forked_from: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Checkpoint {
    pub(crate) name: String,
    /// RFC 3339.
    pub(crate) created_at: String,
    /// How many instructions the REPL had run when it was made.
    pub(crate) instruction_count: i64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CheckpointMade {
    pub(crate) repl_id: String,
    pub(crate) checkpoint: Checkpoint,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CheckpointList {
    pub(crate) repl_id: String,
    pub(crate) checkpoints: Vec<Checkpoint>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RolledBack {
    pub(crate) repl_id: String,
    pub(crate) checkpoint: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rewound {
    pub(crate) repl_id: String,
    /// The REPL is now as it was right after this instruction (-1: before its first).
    pub(crate) back_to_instruction: i64,
    /// How many calls were taken back.
    pub(crate) taken_back: i64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SwappedOut {
    pub(crate) repl_id: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Interrupted {
    pub(crate) repl_id: String,
    /// False when nothing was running.
    pub(crate) interrupted: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileWritten {
    pub(crate) repl_id: String,
    /// Its absolute path in the REPL.
    pub(crate) path: String,
    pub(crate) size: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileContent {
    pub(crate) repl_id: String,
    /// Its absolute path in the REPL.
    pub(crate) path: String,
    pub(crate) size: u64,
    pub(crate) mime_type: String,
    /// The text, when the file is UTF-8 text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<String>,
    /// The bytes, base64-encoded, when the file is neither text nor an image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content_base64: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_a_unique_name_an_object_schema_and_annotations() {
        let mut names = std::collections::HashSet::new();
        for tool in ToolName::ALL {
            assert_eq!(ToolName::parse(tool.as_str()), Some(*tool));
            assert!(names.insert(tool.as_str()), "{} twice", tool.as_str());
            let definition = tool.definition();
            assert_eq!(
                definition.input_schema.get("type"),
                Some(&serde_json::json!("object")),
                "{}",
                tool.as_str()
            );
            let output = definition.output_schema.expect("an output schema");
            assert_eq!(output.get("type"), Some(&serde_json::json!("object")));
            let annotations = definition.annotations.expect("annotations");
            assert!(annotations.read_only_hint.is_some());
            assert!(annotations.destructive_hint.is_some());
            assert!(definition.description.is_some_and(|d| d.len() > 40));
            let schemas = serde_json::json!([&*definition.input_schema, &*output]).to_string();
            assert!(!schemas.contains("\"format\":\"uint"), "{schemas}");
        }
        assert_eq!(ToolName::parse("no-such-tool"), None);
    }

    #[test]
    fn forevervm_tools_keep_their_arguments() {
        let run = ToolName::RunPython.definition();
        let required = run.input_schema.get("required").cloned();
        let mut required: Vec<String> =
            serde_json::from_value(required.unwrap_or_default()).unwrap_or_default();
        required.sort();
        assert_eq!(required, ["pythonCode", "replId"]);
        let create = ToolName::CreateRepl.definition();
        assert!(
            create
                .input_schema
                .get("required")
                .is_none_or(|r| r.as_array().is_some_and(Vec::is_empty))
        );
    }
}
