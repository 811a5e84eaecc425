//! E2B's control plane (its REST API at `E2B_API_URL`): sandboxes created, connected, listed,
//! given timeouts, paused and killed, over the caller's evervm machines.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use evervm_engine::{Account, CreateMachine, EnvVar, ErrorKind, ForkMachine, MachineInfo, Tags};
use serde::{Deserialize, Serialize};

use super::access::{self, Access};
use super::network::{NetworkRequest, SandboxNetwork, asks_for_something};
use super::sandboxes::{Clock, DEFAULT_TIMEOUT, timeout_from_seconds};
use super::snapshots::{self, is_snapshot};
use super::{ApiCaller, E2bFailure, E2bState, ENVD_VERSION};

/// The tag that keeps the template a sandbox was created from (E2B's `templateID`); tags under
/// `e2b:` are not shown as metadata.
const TEMPLATE_TAG: &str = "e2b:template";
const HIDDEN_TAG_PREFIX: &str = "e2b:";
/// The template the code-interpreter SDKs ask for by default.
const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";
/// E2B's own templates, which are evervm's default image here.
const E2B_TEMPLATES: &[&str] = &["base", "code-interpreter-v1", "code-interpreter"];
/// E2B's `clientID`, which says where a sandbox runs.
const CLIENT_ID: &str = "evervm";
/// The most forks one request makes (E2B's limit).
const MAX_FORKS: u32 = 20;

/// `POST /sandboxes` and `/v2/sandboxes`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NewSandbox {
    #[serde(rename = "templateID", default)]
    template_id: Option<String>,
    /// Seconds.
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    network: Option<NetworkRequest>,
    /// `false`: no internet (E2B's `denyOut: ["0.0.0.0/0"]`).
    #[serde(rename = "allow_internet_access", default)]
    allow_internet_access: Option<bool>,
    /// `false`: a timeout pauses the sandbox without its memory (refused: evervm's pause keeps it).
    #[serde(default)]
    auto_pause_memory: Option<bool>,
    /// E2B's MCP gateway, workload identity and volumes: refused unless empty.
    #[serde(default)]
    mcp: Option<serde_json::Value>,
    #[serde(default)]
    iam: Option<serde_json::Value>,
    #[serde(default)]
    volume_mounts: Option<serde_json::Value>,
}

impl NewSandbox {
    /// Refuses, by name, what E2B's create may ask for that evervm does not have.
    fn check_unsupported(&self) -> Result<(), E2bFailure> {
        if self.auto_pause_memory == Some(false) {
            return Err(E2bFailure::bad_request(FILESYSTEM_ONLY_PAUSE));
        }
        for (field, value, what) in [
            (
                "mcp",
                &self.mcp,
                "E2B's MCP gateway is a hosted service evervm does not run",
            ),
            ("iam", &self.iam, "evervm has no workload identity tokens"),
            (
                "volumeMounts",
                &self.volume_mounts,
                "evervm has no volumes; a sandbox's files are its own",
            ),
        ] {
            if asks_for_something(value.as_ref()) {
                return Err(E2bFailure::bad_request(format!("{field}: {what}")));
            }
        }
        Ok(())
    }
}

/// Why a filesystem-only pause is refused.
pub(super) const FILESYSTEM_ONLY_PAUSE: &str = "a filesystem-only pause (keep_memory=False, \
     autoPauseMemory: false) is not supported by evervm: its files live in the sandbox's memory, \
     so a pause keeps the whole state; pause with the memory kept";

/// A sandbox as create and connect answer it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SandboxView {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    alias: String,
    envd_version: &'static str,
    /// The sandbox's own access token: the SDKs send it back on every sandbox request
    /// (`X-Access-Token`).
    envd_access_token: String,
    /// The same token, which the code interpreter's SDKs send (`E2B-Traffic-Access-Token`) on
    /// the calls that carry no `X-Access-Token` (code contexts).
    traffic_access_token: String,
    /// A domain that leads back here (see [`super::access`]).
    domain: String,
}

/// A sandbox as `GET /sandboxes/{id}` and lists describe it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub(super) template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    pub(super) alias: String,
    pub(super) started_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    envd_version: &'static str,
    cpu_count: usize,
    #[serde(rename = "memoryMB")]
    memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    metadata: BTreeMap<String, String>,
    /// `running` or `paused`.
    pub(super) state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    /// The same token (see [`SandboxView`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic_access_token: Option<String>,
    domain: String,
}

fn template_of(info: &MachineInfo) -> String {
    info.tags
        .get(TEMPLATE_TAG)
        .cloned()
        .unwrap_or_else(|| info.image.clone())
}

fn metadata_of(tags: &Tags) -> BTreeMap<String, String> {
    tags.iter()
        .filter(|(key, _)| !key.starts_with(HIDDEN_TAG_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

async fn view(
    state: &E2bState,
    info: &MachineInfo,
    access: &Access,
) -> Result<SandboxView, E2bFailure> {
    let template_id = template_of(info);
    let token = access
        .envd_access_token(&state.engine, info.name.as_str())
        .await?;
    state.signed.handed(info.name.as_str(), &token);
    Ok(SandboxView {
        alias: template_id.clone(),
        template_id,
        sandbox_id: info.name.to_string(),
        client_id: CLIENT_ID,
        envd_version: ENVD_VERSION,
        traffic_access_token: token.clone(),
        envd_access_token: token,
        domain: access.domain(),
    })
}

pub(super) fn detail(
    state: &E2bState,
    info: &MachineInfo,
    envd_access_token: Option<String>,
    domain: String,
) -> SandboxDetail {
    let clock = state.sandboxes.clock(info.name.as_str());
    let (started_at, end_at, running) = match &clock {
        Some(Clock {
            started_at, end_at, ..
        }) => (*started_at, *end_at, true),
        // A paused sandbox: since it was last used (or made), until then.
        None => {
            let last = info.last_used_at.unwrap_or(info.created_at);
            (info.created_at, last, false)
        }
    };
    let template_id = template_of(info);
    SandboxDetail {
        alias: template_id.clone(),
        template_id,
        sandbox_id: info.name.to_string(),
        client_id: CLIENT_ID,
        started_at,
        end_at,
        envd_version: ENVD_VERSION,
        cpu_count: std::thread::available_parallelism().map_or(1, usize::from),
        memory_mb: info.memory_mb,
        disk_size_mb: state.engine.limits().max_disk_mb_per_account,
        metadata: metadata_of(&info.tags),
        state: if running { "running" } else { "paused" },
        traffic_access_token: envd_access_token.clone(),
        envd_access_token,
        domain,
    }
}

/// A JSON body, or `{}` when empty; errors name what is wrong.
pub(super) fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, E2bFailure> {
    let body = if body.trim_ascii().is_empty() {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| E2bFailure::bad_request(format!("the request body is not valid: {e}")))
}

fn created<T: Serialize>(body: &T) -> Response {
    (StatusCode::CREATED, Json(body)).into_response()
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: a new machine, running for its timeout.
pub(super) async fn create(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    note: crate::server::audit::AuditNote,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, E2bFailure> {
    let request: NewSandbox = parse_body(&body)?;
    request.check_unsupported()?;
    let timeout = timeout_or_default(request.timeout)?;
    let template = request
        .template_id
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
    access::check_sdk(&headers, &template)?;
    let access = Access::of(&headers, &state)?;
    let image = if E2B_TEMPLATES.contains(&template.as_str()) {
        None
    } else {
        Some(template.clone())
    };
    let mut tags: Tags = request.metadata.unwrap_or_default().into_iter().collect();
    if tags.keys().any(|key| key.starts_with(HIDDEN_TAG_PREFIX)) {
        return Err(E2bFailure::bad_request(format!(
            "metadata keys starting with {HIDDEN_TAG_PREFIX:?} are evervm's own"
        )));
    }
    tags.insert(TEMPLATE_TAG.to_owned(), template.clone());
    let network = SandboxNetwork::of(
        request.allow_internet_access,
        request.network.as_ref(),
        state.engine.network_default(),
        state.public_ports,
    )?;
    tags.extend(network.tags);
    tags.extend(super::forward::home_tag(&state.engine));
    if snapshots::is_snapshot_id(&template) {
        let Some(snapshot) = snapshots::find(&state, &account, &template).await? else {
            return Err(E2bFailure::new(
                StatusCode::NOT_FOUND,
                format!("snapshot {template:?} not found"),
            ));
        };
        // A fork: the snapshot's memory, files, environment and network.
        if network.policy.is_some() {
            return Err(E2bFailure::bad_request(
                "network: a sandbox made from a snapshot has the snapshot's network",
            ));
        }
        if request.env_vars.as_ref().is_some_and(|env| !env.is_empty()) {
            return Err(E2bFailure::bad_request(
                "envVars: a sandbox made from a snapshot has the snapshot's environment (set \
                 variables with a command or code in it)",
            ));
        }
        let info = state
            .engine
            .fork_machine(
                &account,
                snapshot.name.as_str(),
                ForkMachine {
                    tags: Some(tags),
                    at: None,
                },
            )
            .await
            .map_err(|e| E2bFailure::from(&e))?;
        note.machine(info.name.as_str());
        note.detail(format!("from snapshot {}", snapshot.name));
        state.sandboxes.start(&account, info.name.as_str(), timeout);
        return Ok(created(&view(&state, &info, &access).await?));
    }
    let env = request
        .env_vars
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| {
            (
                name,
                EnvVar {
                    value,
                    secret: false,
                },
            )
        })
        .collect();
    let info = state
        .engine
        .create_machine(
            &account,
            CreateMachine {
                tags,
                image,
                env,
                network: network.policy,
                ..CreateMachine::default()
            },
        )
        .await
        .map_err(|e| template_failure(&e))?;
    note.machine(info.name.as_str());
    state.sandboxes.start(&account, info.name.as_str(), timeout);
    Ok(created(&view(&state, &info, &access).await?))
}

/// A creation that failed on its template says what templates there are.
fn template_failure(error: &evervm_engine::Error) -> E2bFailure {
    let mut failure = E2bFailure::from(error);
    if error.kind() == ErrorKind::InvalidInput && error.message().contains("image") {
        failure.message = format!(
            "{}: a template is E2B's `base` or `code-interpreter-v1` (evervm's default image), or \
             an evervm image (`minimal`, `data`, or one built with `evervm image build`)",
            error.message()
        );
    }
    failure
}

/// The caller's sandbox `id` (a snapshot is none).
pub(super) async fn machine(
    state: &E2bState,
    account: &Account,
    id: &str,
) -> Result<MachineInfo, E2bFailure> {
    let info = state
        .engine
        .machine_info(account, id)
        .await
        .map_err(|e| not_found_as_sandbox(&e, id))?;
    if is_snapshot(&info.tags) {
        return Err(E2bFailure::sandbox_not_found(id));
    }
    Ok(info)
}

pub(super) fn not_found_as_sandbox(error: &evervm_engine::Error, id: &str) -> E2bFailure {
    if error.kind() == ErrorKind::NotFound {
        E2bFailure::sandbox_not_found(id)
    } else {
        E2bFailure::from(error)
    }
}

/// `GET /sandboxes/{id}`.
pub(super) async fn info(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SandboxDetail>, E2bFailure> {
    let info = machine(&state, &account, &id).await?;
    let access = Access::of(&headers, &state)?;
    let token = access
        .envd_access_token(&state.engine, info.name.as_str())
        .await?;
    state.signed.handed(info.name.as_str(), &token);
    Ok(Json(detail(&state, &info, Some(token), access.domain())))
}

/// `DELETE /sandboxes/{id}`: the machine is deleted (E2B's kill).
pub(super) async fn kill(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bFailure> {
    // Gone from envd's /health before the deletion breaks off the sandbox's running code: an
    // SDK whose stream is cut asks /health, and must find the sandbox killed, not running.
    let clock = state.sandboxes.take(&account, &id);
    if let Err(e) = state.engine.delete_machine(&account, &id).await {
        if let Some(clock) = clock
            && e.kind() != ErrorKind::NotFound
        {
            state.sandboxes.put_back(&id, clock);
        }
        return Err(not_found_as_sandbox(&e, &id));
    }
    state.sandboxes.stop(&id);
    state.signed.forget(&id);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct TimeoutRequest {
    timeout: i64,
}

/// `POST /sandboxes/{id}/timeout`: the sandbox runs for that long from now.
pub(super) async fn set_timeout(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bFailure> {
    let request: TimeoutRequest = parse_body(&body)?;
    // 0 is E2B's "now": the sandbox's timeout action runs at once.
    let timeout = if request.timeout == 0 {
        Duration::ZERO
    } else {
        timeout_from_seconds(request.timeout)?
    };
    restart_clock(&state, &account, &id, timeout).await
}

/// The sandbox runs for `timeout` from now.
async fn restart_clock(
    state: &E2bState,
    account: &Account,
    id: &str,
    timeout: Duration,
) -> Result<StatusCode, E2bFailure> {
    machine(state, account, id).await?;
    state.sandboxes.start(account, id, timeout);
    Ok(StatusCode::NO_CONTENT)
}

/// A timeout in seconds given by a caller, or the default.
fn timeout_or_default(seconds: Option<i64>) -> Result<Duration, E2bFailure> {
    seconds.map_or(Ok(DEFAULT_TIMEOUT), timeout_from_seconds)
}

#[derive(Debug, Deserialize)]
struct RefreshRequest {
    #[serde(default)]
    duration: Option<i64>,
}

/// `POST /sandboxes/{id}/refreshes`: as a timeout (E2B's keep-alive of older SDKs).
pub(super) async fn refresh(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bFailure> {
    let request: RefreshRequest = parse_body(&body)?;
    restart_clock(&state, &account, &id, timeout_or_default(request.duration)?).await
}

#[derive(Debug, Default, Deserialize)]
struct PauseRequest {
    /// `false`: a filesystem-only pause (refused).
    #[serde(default)]
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: the machine is swapped out; 409 when it already was paused.
pub(super) async fn pause(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bFailure> {
    machine(&state, &account, &id).await?;
    let request: PauseRequest = parse_body(&body)?;
    if request.memory == Some(false) {
        return Err(E2bFailure::bad_request(FILESYSTEM_ONLY_PAUSE));
    }
    if !state.sandboxes.stop(&id) {
        return Err(E2bFailure::new(
            StatusCode::CONFLICT,
            format!("sandbox {id:?} is already paused"),
        ));
    }
    state
        .engine
        .swap_out(&account, &id)
        .await
        .map_err(|e| not_found_as_sandbox(&e, &id))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /sandboxes/{id}/network` (E2B's `update_network`): refused, by name.
pub(super) async fn update_network(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bFailure> {
    machine(&state, &account, &id).await?;
    Err(E2bFailure::bad_request(
        "update_network: evervm sets a sandbox's network when it is created and does not change          it while it runs; create a sandbox with the network it needs (allow_internet_access, \
         network.allowOut/denyOut)",
    ))
}

#[derive(Debug, Deserialize)]
struct ConnectRequest {
    #[serde(default)]
    timeout: Option<i64>,
}

/// `POST /sandboxes/{id}/connect`, `/v2/sandboxes/{id}/connect`, and the first generation's
/// `/sandboxes/{id}/resume`: a paused sandbox runs again
/// (its machine is restored by its next instruction) for the timeout given; a running one's
/// timeout is only ever extended. 201 when it was paused, 200 when it was running.
pub(super) async fn connect(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bFailure> {
    let request: ConnectRequest = parse_body(&body)?;
    resume_or_connect(&state, &account, &headers, &id, request.timeout).await
}

async fn resume_or_connect(
    state: &E2bState,
    account: &Account,
    headers: &HeaderMap,
    id: &str,
    timeout: Option<i64>,
) -> Result<Response, E2bFailure> {
    let timeout = timeout.map(timeout_from_seconds).transpose()?;
    let info = machine(state, account, id).await?;
    let status = match state.sandboxes.clock(id) {
        Some(clock) => {
            let wanted = timeout.unwrap_or(Duration::ZERO);
            let left = (clock.end_at - Utc::now()).to_std().unwrap_or_default();
            if wanted > left {
                state.sandboxes.start(account, id, wanted);
            }
            StatusCode::OK
        }
        None => {
            state
                .sandboxes
                .start(account, id, timeout.unwrap_or(DEFAULT_TIMEOUT));
            StatusCode::CREATED
        }
    };
    let view = view(state, &info, &Access::of(headers, state)?).await?;
    Ok((status, Json(view)).into_response())
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxMetric {
    timestamp: DateTime<Utc>,
    timestamp_unix: i64,
    cpu_count: usize,
    /// Not measured by evervm: always 0.
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

/// `GET /templates/aliases/{alias}` (`Template.exists`): the templates a sandbox can be created
/// from without a custom image: E2B's defaults and evervm's built-in images.
pub(super) async fn template_alias(
    ApiCaller(_account): ApiCaller,
    Path(alias): Path<String>,
) -> Result<Response, E2bFailure> {
    if E2B_TEMPLATES.contains(&alias.as_str()) || alias == "minimal" || alias == "data" {
        return Ok(
            Json(serde_json::json!({ "templateID": alias, "public": true })).into_response(),
        );
    }
    Err(E2bFailure::new(
        StatusCode::NOT_FOUND,
        format!(
            "template {alias:?} not found: evervm answers for E2B's `base` and \
             `code-interpreter-v1` and its images `minimal` and `data` (a custom image is created \
             from by name, but not listed here)"
        ),
    ))
}

/// `GET /sandboxes/{id}/metrics`: one sample, now: the memory the machine's sandbox holds and
/// the disk its files and snapshot take. CPU use is not measured (0).
pub(super) async fn metrics(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<SandboxMetric>>, E2bFailure> {
    let (start, end) = parse_metrics_range(query.as_deref())?;
    let info = machine(&state, &account, &id).await?;
    let now = Utc::now();
    // No metrics are kept over time: the one sample, taken now, is in a range that reaches the
    // current collection bucket.
    let bucket_start = now.timestamp() - METRICS_BUCKET_SECS;
    if start.is_some_and(|start| start > now.timestamp())
        || end.is_some_and(|end| end < bucket_start)
    {
        return Ok(Json(Vec::new()));
    }
    Ok(Json(vec![SandboxMetric {
        timestamp: now,
        timestamp_unix: now.timestamp(),
        cpu_count: std::thread::available_parallelism().map_or(1, usize::from),
        cpu_used_pct: 0.0,
        mem_used: info.resident_bytes,
        mem_total: u64::from(info.memory_mb) * 1024 * 1024,
        mem_cache: 0,
        disk_used: info.disk_bytes,
        disk_total: state.engine.limits().max_disk_mb_per_account * 1024 * 1024,
    }]))
}

/// How far back a metrics range may end and still get the sample taken now (E2B collects in
/// 5 s buckets).
const METRICS_BUCKET_SECS: i64 = 5;

/// `start` and `end` of a metrics request: Unix seconds.
fn parse_metrics_range(query: Option<&str>) -> Result<(Option<i64>, Option<i64>), E2bFailure> {
    let (mut start, mut end) = (None, None);
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let slot = match key.as_ref() {
            "start" => &mut start,
            "end" => &mut end,
            other => {
                return Err(E2bFailure::bad_request(format!(
                    "the query parameter {other:?} is not one this server knows (start, end)"
                )));
            }
        };
        let seconds = value
            .parse::<i64>()
            .ok()
            .filter(|s| *s >= 0)
            .ok_or_else(|| {
                E2bFailure::bad_request(format!("{key} {value:?}: Unix seconds (0 or more)"))
            })?;
        *slot = Some(seconds);
    }
    if let (Some(start), Some(end)) = (start, end)
        && start > end
    {
        return Err(E2bFailure::bad_request(format!(
            "start {start} is after end {end}"
        )));
    }
    Ok((start, end))
}

#[derive(Debug, Deserialize)]
struct ForkRequest {
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: new sandboxes from the sandbox's current state (evervm's fork:
/// memory and files), each running for the timeout given.
pub(super) async fn fork(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bFailure> {
    let request: ForkRequest = parse_body(&body)?;
    let timeout = timeout_or_default(request.timeout)?;
    let count = request.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(E2bFailure::bad_request(format!(
            "count {count}: a fork makes 1 to {MAX_FORKS} sandboxes"
        )));
    }
    let parent = machine(&state, &account, &id).await?;
    let access = Access::of(&headers, &state)?;
    // A fork's home is the node that made it.
    let mut tags = parent.tags;
    tags.extend(super::forward::home_tag(&state.engine));
    let mut forks = Vec::new();
    for _ in 0..count {
        let item = match state
            .engine
            .fork_machine(
                &account,
                &id,
                ForkMachine {
                    tags: Some(tags.clone()),
                    at: None,
                },
            )
            .await
        {
            Ok(info) => {
                state.sandboxes.start(&account, info.name.as_str(), timeout);
                serde_json::json!({ "sandbox": view(&state, &info, &access).await? })
            }
            Err(e) => {
                let failure = not_found_as_sandbox(&e, &id);
                serde_json::json!({
                    "error": { "code": failure.status.as_u16(), "message": failure.message }
                })
            }
        };
        forks.push(item);
    }
    Ok(created(&forks))
}
