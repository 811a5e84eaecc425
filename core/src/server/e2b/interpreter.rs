//! E2B's code interpreter (port 49999): `POST /execute` runs code on the machine's REPL and
//! streams NDJSON (`stdout`, `stderr`, `result` with MIME fields, `error`,
//! `number_of_executions`, `keepalive`, `end_of_execution`); `/contexts` makes, lists, restarts
//! and removes code contexts: more Python interpreters in the machine (the engine's contexts),
//! each with globals and a working directory of its own. The default context is the machine's
//! own REPL. Python is the only language.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use evervm_engine::{
    Dialect, ErrorKind, ExecEvent, ExecResult, FailureCause, MAX_TIMEOUT, Outcome, OutputStream,
    RichKind, RichResult,
};
use serde::{Deserialize, Serialize};

use super::run::{self, Run};
use super::{E2bFailure, E2bState, InterpreterCaller, SandboxCaller};

/// The id of the default context: the machine's REPL.
pub(super) const DEFAULT_CONTEXT: &str = evervm_engine::DEFAULT_CONTEXT;
/// Where E2B's contexts start (evervm's file APIs here take it for the machine's home).
pub(super) const E2B_HOME: &str = "/home/user";
/// A keepalive line after this much quiet, which also notices a client that left.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
pub(super) struct ExecuteRequest {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize)]
pub(super) struct Context {
    id: String,
    language: &'static str,
    cwd: String,
}

impl Context {
    /// A context as E2B describes it: the default one starts in `/home/user`, the others where
    /// they were asked to (the machine's home, `~`, is `/home/user`).
    fn from_engine(context: evervm_engine::ContextInfo) -> Self {
        let cwd = if context.id == DEFAULT_CONTEXT || context.cwd == "~" {
            E2B_HOME.to_owned()
        } else if let Some(rest) = context.cwd.strip_prefix("~/") {
            format!("{E2B_HOME}/{rest}")
        } else {
            context.cwd
        };
        Self {
            id: context.id,
            language: "python",
            cwd,
        }
    }
}

fn check_language(language: Option<&str>) -> Result<(), E2bFailure> {
    match language {
        None => Ok(()),
        Some(l) if l.eq_ignore_ascii_case("python") || l.eq_ignore_ascii_case("python3") => Ok(()),
        Some(other) => Err(E2bFailure::bad_request(format!(
            "language {other:?}: evervm's machines run Python only"
        ))),
    }
}

/// E2B's answer for a context the sandbox does not have.
fn context_not_found(id: &str) -> E2bFailure {
    E2bFailure::new(StatusCode::NOT_FOUND, format!("Context {id} not found"))
}

/// A failed context operation as E2B answers it.
fn context_failure(error: &evervm_engine::Error, sandbox: &str, id: &str) -> E2bFailure {
    if error.kind() == ErrorKind::NotFound && error.resource() == Some("context") {
        context_not_found(id)
    } else if error.kind() == ErrorKind::InvalidInput && id != DEFAULT_CONTEXT {
        // Not an id the engine could have made.
        context_not_found(id)
    } else {
        super::sandbox_failure(error, sandbox)
    }
}

/// Checks that the sandbox has the context `id` (E2B answers 404 before running anything).
async fn check_context(
    state: &E2bState,
    caller: &SandboxCaller,
    id: &str,
) -> Result<(), E2bFailure> {
    if id == DEFAULT_CONTEXT {
        return Ok(());
    }
    if evervm_engine::validate_context_id(id).is_err() {
        return Err(context_not_found(id));
    }
    let contexts = state
        .engine
        .list_contexts(&caller.account, &caller.sandbox)
        .await
        .map_err(|e| super::sandbox_failure(&e, &caller.sandbox))?;
    if contexts.iter().any(|c| c.id == id) {
        Ok(())
    } else {
        Err(context_not_found(id))
    }
}

/// Python that sets environment variables for the next instructions and remembers what they
/// were, and Python that puts them back. `None` when there are none.
fn env_code(env: &BTreeMap<String, String>) -> Result<Option<(String, String)>, E2bFailure> {
    if env.is_empty() {
        return Ok(None);
    }
    let mut vars = evervm_engine::Env::new();
    for (name, value) in env {
        vars.insert(
            name.clone(),
            evervm_engine::EnvVar {
                value: value.clone(),
                secret: false,
            },
        );
    }
    evervm_engine::validate_env(&vars).map_err(E2bFailure::from)?;
    // A JSON object of strings is a Python dict literal.
    let literal = serde_json::to_string(env)
        .map_err(|e| E2bFailure::bad_request(format!("env_vars: {e}")))?;
    let set = format!(
        "(lambda o, e: (setattr(o, '_evervm_e2b_saved', {{k: o.environ.get(k) for k in e}}), \
         o.environ.update(e)) and None)(__import__('os'), {literal})"
    );
    let restore = "(lambda o: [o.environ.pop(k, None) if v is None else \
                   o.environ.__setitem__(k, v) for k, v in \
                   o.__dict__.pop('_evervm_e2b_saved', {}).items()] and None)(__import__('os'))"
        .to_owned();
    Ok(Some((set, restore)))
}

/// `POST /execute`: runs the code on the machine's REPL (variables, imports and files persist)
/// and streams what it does.
pub(super) async fn execute(
    State(state): State<E2bState>,
    InterpreterCaller(caller): InterpreterCaller,
    note: crate::server::audit::AuditNote,
    body: Bytes,
) -> Result<Response, E2bFailure> {
    let request: ExecuteRequest = serde_json::from_slice(&body)
        .map_err(|e| E2bFailure::bad_request(format!("the request body is not valid: {e}")))?;
    note.detail(state.engine.audit_detail_for_code(&request.code));
    if request.context_id.is_some() && request.language.is_some() {
        return Err(E2bFailure::bad_request(
            "Only one of context_id or language can be provided",
        ));
    }
    check_language(request.language.as_deref())?;
    let context = request.context_id.filter(|id| id != DEFAULT_CONTEXT);
    if let Some(id) = context.as_deref() {
        check_context(&state, &caller, id).await?;
    }
    let SandboxCaller { account, sandbox } = caller;
    let env = env_code(&request.env_vars.unwrap_or_default())?;
    let engine = &state.engine;
    let restore = match env {
        Some((set, restore)) => {
            run::queue(engine, &account, &sandbox, context.clone(), set)
                .await
                .map_err(|e| super::sandbox_failure(&e, &sandbox))?;
            Some(restore)
        }
        None => None,
    };
    // A cell runs as in E2B's code interpreter: a Jupyter cell, with E2B's formatters.
    let started = run::start(
        engine,
        &account,
        &sandbox,
        request.code,
        MAX_TIMEOUT,
        Dialect::E2b,
        context.clone(),
    )
    .await;
    if let Some(restore) = &restore {
        // Queued right behind the code: it runs whether or not the client stays.
        let queued = run::queue(engine, &account, &sandbox, context.clone(), restore.clone());
        if let Err(e) = queued.await {
            tracing::warn!(machine = sandbox, "cannot queue the env restore: {e}");
        }
    }
    let (seq, events) = started.map_err(|e| super::sandbox_failure(&e, &sandbox))?;
    state.sandboxes.touch(&account, &sandbox);
    let redactor = state.redactor.clone();
    let run = Run {
        engine: state.engine.clone(),
        account,
        machine: sandbox,
        after_interrupt: restore,
        context,
    };
    let keepalive = line(&serde_json::json!({ "type": "keepalive" }));
    let mut shown = 0;
    let body = run.body(
        Vec::new(),
        events,
        KEEPALIVE_EVERY,
        keepalive,
        move |event| {
            encode(event, seq, &mut shown, &|text: &str| {
                redactor.text(text).into_owned()
            })
        },
    );
    Ok((
        [
            (CONTENT_TYPE, "application/x-ndjson"),
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response())
}

fn line(value: &serde_json::Value) -> Bytes {
    let mut bytes = value.to_string().into_bytes();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn now_nanos() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
}

/// The NDJSON lines of one event of instruction `seq`; `shown` counts the rich results sent as
/// they were shown.
fn encode(
    event: ExecEvent,
    seq: i64,
    shown: &mut usize,
    redact: &dyn Fn(&str) -> String,
) -> Vec<Bytes> {
    match event {
        ExecEvent::Output(chunk) => match chunk.stream {
            OutputStream::Stdout | OutputStream::Stderr => vec![line(&serde_json::json!({
                "type": chunk.stream.as_str(),
                "text": chunk.text(),
                "timestamp": now_nanos(),
            }))],
            OutputStream::Display => match chunk.rich() {
                Some(rich) => {
                    *shown += 1;
                    vec![line(&result_line(&rich, false))]
                }
                None => Vec::new(),
            },
        },
        ExecEvent::Result(result) => {
            // The cell's number as the kernel numbers it (E2B sends it as the cell starts; the
            // SDK only keeps it): the machine's IPython counts cells, so commands and REPL
            // lines do not count, as they do not in E2B's kernel.
            let mut lines = vec![line(&serde_json::json!({
                "type": "number_of_executions",
                "execution_count": result.execution_count.map_or(seq + 1, |n| i64::try_from(n).unwrap_or(i64::MAX)),
            }))];
            lines.extend(result_lines(&result, *shown, redact));
            lines.push(line(&serde_json::json!({ "type": "end_of_execution" })));
            lines
        }
    }
}

/// The `result` and `error` lines of an instruction's end, in the order a kernel sends them: the
/// value (`execute_result`), then the figures left open (shown as the cell ends); the first
/// `shown` results were sent as they were shown.
fn result_lines(result: &ExecResult, shown: usize, redact: &dyn Fn(&str) -> String) -> Vec<Bytes> {
    let left = result.results.get(shown..).unwrap_or_default();
    let mut lines: Vec<Bytes> = left
        .iter()
        .map(|rich| line(&result_line(rich, rich.kind == RichKind::Value)))
        .collect();
    match &result.outcome {
        Outcome::Value(value) => {
            if let (false, Some(repr)) = (left.iter().any(|r| r.kind == RichKind::Value), value) {
                lines.insert(
                    0,
                    line(&serde_json::json!({
                        "type": "result",
                        "text": e2b_text(repr),
                        "extra": {},
                        "is_main_result": true,
                    })),
                );
            }
        }
        Outcome::Error { text, cause } => {
            let (name, value) = match &result.exception {
                Some(exception) => (exception.name.clone(), exception.value.clone()),
                None => failure_name_and_value(text, *cause),
            };
            lines.push(line(&serde_json::json!({
                "type": "error",
                "name": name,
                "value": redact(&value),
                "traceback": redact(text),
            })));
        }
    }
    lines
}

/// E2B's `result`: a MIME bundle under E2B's names (`text`, `html`, `png`, ...), other types
/// under `extra`.
fn result_line(rich: &RichResult, main: bool) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    out.insert("type".into(), "result".into());
    let mut extra = serde_json::Map::new();
    for (mime, value) in &rich.data {
        let name = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            "e2b/data" => "data",
            "e2b/chart" => "chart",
            other => {
                extra.insert(other.to_owned(), value.clone());
                continue;
            }
        };
        let value = match (name, value) {
            ("text", serde_json::Value::String(text)) => e2b_text(text).into(),
            _ => value.clone(),
        };
        out.insert(name.into(), value);
    }
    // E2B's server sends `extra` on every result, `{}` when there is nothing else.
    out.insert("extra".into(), extra.into());
    out.insert("is_main_result".into(), main.into());
    out.into()
}

/// A result's `text` as E2B's server gives it: a text that starts and ends with the same quote
/// character (`'` or `"`, any result's, not only a `str`'s) loses one at each end, with no
/// unescaping (`'it\'s'` stays escaped).
fn e2b_text(text: &str) -> &str {
    let quoted = |q: char| text.starts_with(q) && text.ends_with(q);
    if quoted('\'') || quoted('"') {
        // One character: the quote, which is one byte; a lone quote becomes "".
        text.get(1..text.len().saturating_sub(1).max(1))
            .unwrap_or_default()
    } else {
        text
    }
}

/// A failure that is not an exception the code raised (the sandbox died, a limit refused the
/// instruction): what it is, and the engine's text.
fn failure_name_and_value(text: &str, cause: FailureCause) -> (String, String) {
    let name = match cause {
        FailureCause::Exception => "Exception",
        FailureCause::Timeout => "TimeoutError",
        FailureCause::Interrupted | FailureCause::MachineDeleted => "KeyboardInterrupt",
        FailureCause::MachineCrashed => "MachineCrashed",
        FailureCause::LimitExceeded => "LimitExceeded",
    };
    (name.to_owned(), text.trim().to_owned())
}

/// `GET /contexts`: the default context, then the others in the order they were made.
pub(super) async fn list_contexts(
    State(state): State<E2bState>,
    InterpreterCaller(caller): InterpreterCaller,
) -> Result<Json<Vec<Context>>, E2bFailure> {
    let contexts = state
        .engine
        .list_contexts(&caller.account, &caller.sandbox)
        .await
        .map_err(|e| super::sandbox_failure(&e, &caller.sandbox))?;
    Ok(Json(
        contexts.into_iter().map(Context::from_engine).collect(),
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct NewContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `POST /contexts`: a new Python interpreter in the machine, started in `cwd` (default
/// `/home/user`; one that does not exist leaves it there, as E2B's `%cd` does).
pub(super) async fn create_context(
    State(state): State<E2bState>,
    InterpreterCaller(caller): InterpreterCaller,
    body: Bytes,
) -> Result<Json<Context>, E2bFailure> {
    let request: NewContext = if body.trim_ascii().is_empty() {
        NewContext {
            language: None,
            cwd: None,
        }
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| E2bFailure::bad_request(format!("the request body is not valid: {e}")))?
    };
    check_language(request.language.as_deref())?;
    let asked = request
        .cwd
        .filter(|cwd| !cwd.is_empty())
        .unwrap_or_else(|| E2B_HOME.to_owned());
    let cwd = super::envd::to_machine(&asked);
    let made = state
        .engine
        .create_context(&caller.account, &caller.sandbox, Some(&cwd))
        .await
        .map_err(|e| super::sandbox_failure(&e, &caller.sandbox))?;
    state.sandboxes.touch(&caller.account, &caller.sandbox);
    Ok(Json(Context {
        cwd: asked,
        ..Context::from_engine(made)
    }))
}

/// `DELETE /contexts/{id}`: the context's interpreter is stopped and the context forgotten. The
/// default one goes only with its sandbox (kill).
pub(super) async fn remove_context(
    State(state): State<E2bState>,
    InterpreterCaller(caller): InterpreterCaller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<()>, E2bFailure> {
    if id == DEFAULT_CONTEXT {
        return Err(E2bFailure::bad_request(
            "the default context is the machine's REPL: it is removed with its sandbox (kill)",
        ));
    }
    state
        .engine
        .remove_context(&caller.account, &caller.sandbox, &id)
        .await
        .map_err(|e| context_failure(&e, &caller.sandbox, &id))?;
    Ok(Json(()))
}

/// `POST /contexts/{id}/restart`: the context's interpreter starts again, its variables gone.
/// The default one is the machine's REPL, which is not restarted (create a sandbox afresh).
pub(super) async fn restart_context(
    State(state): State<E2bState>,
    InterpreterCaller(caller): InterpreterCaller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<()>, E2bFailure> {
    if id == DEFAULT_CONTEXT {
        return Err(E2bFailure::new(
            StatusCode::NOT_IMPLEMENTED,
            "evervm does not restart a machine's own REPL: make a context to start afresh, or \
             create a new sandbox",
        ));
    }
    state
        .engine
        .restart_context(&caller.account, &caller.sandbox, &id)
        .await
        .map_err(|e| context_failure(&e, &caller.sandbox, &id))?;
    Ok(Json(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_without_an_exception_say_what_they_are() {
        assert_eq!(
            failure_name_and_value("the sandbox died\n", FailureCause::MachineCrashed),
            ("MachineCrashed".into(), "the sandbox died".into())
        );
        assert_eq!(
            failure_name_and_value("ran past 5 s", FailureCause::Timeout).0,
            "TimeoutError"
        );
    }

    #[test]
    fn contexts_are_described_in_e2b_paths() {
        let described = |id: &str, cwd: &str| {
            let context = Context::from_engine(evervm_engine::ContextInfo {
                id: id.into(),
                cwd: cwd.into(),
                pid: Some(2),
            });
            (context.id, context.language, context.cwd)
        };
        assert_eq!(
            described("default", "/home/machine"),
            ("default".into(), "python", E2B_HOME.into())
        );
        assert_eq!(described("c1", "~").2, E2B_HOME);
        assert_eq!(described("c1", "~/a/b").2, "/home/user/a/b");
        assert_eq!(described("c1", "/tmp").2, "/tmp");
        assert_eq!(described("c1", "~x").2, "~x");
    }

    #[test]
    fn text_loses_one_quote_at_each_end_as_e2b_gives_it() {
        assert_eq!(e2b_text("'supertest'"), "supertest");
        assert_eq!(e2b_text("\"it's\""), "it's");
        assert_eq!(e2b_text("'a\\nb'"), "a\\nb");
        assert_eq!(e2b_text("'"), "");
        assert_eq!(e2b_text("''"), "");
        assert_eq!(e2b_text("'x\""), "'x\"");
        assert_eq!(e2b_text("42"), "42");
        assert_eq!(e2b_text(""), "");
    }

    #[test]
    fn rich_results_use_e2b_names() {
        let mut data = serde_json::Map::new();
        data.insert("text/plain".into(), "df".into());
        data.insert("text/html".into(), "<table/>".into());
        data.insert("application/vnd.custom".into(), "x".into());
        let rich = RichResult {
            kind: RichKind::Value,
            data,
        };
        let line = result_line(&rich, true);
        assert_eq!(line["type"], "result");
        assert_eq!(line["text"], "df");
        assert_eq!(line["html"], "<table/>");
        assert_eq!(line["extra"]["application/vnd.custom"], "x");
        assert_eq!(line["is_main_result"], true);
    }

    #[test]
    fn env_code_is_python_literals() {
        assert!(env_code(&BTreeMap::new()).unwrap().is_none());
        let env = BTreeMap::from([("A_B".to_owned(), "x\"y'z\\".to_owned())]);
        let (set, restore) = env_code(&env).unwrap().unwrap();
        assert!(set.contains(r#"{"A_B":"x\"y'z\\"}"#), "{set}");
        assert!(restore.contains("_evervm_e2b_saved"));
        let bad = BTreeMap::from([("1A".to_owned(), "x".to_owned())]);
        assert!(env_code(&bad).is_err());
    }
}
