//! `/v1/machine/{machine_name}/files...` (evervm): files in and out of a machine, streamed both
//! ways. The part of the URL after `files/` is the machine path without its leading `/`
//! (`files/tmp/a.csv` is `/tmp/a.csv`); a first segment `~` is the machine's home
//! (`files/~/a.csv`).

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use evervm_engine as engine;
use futures::StreamExt;
use serde::Deserialize;

use super::AppState;
use super::auth::Authed;
use super::error::ApiFailure;
use super::extract::{JsonBody, WirePath, WireQuery};
use crate::types::{FileInfo, FileList};

type ApiResult<T> = Result<Json<T>, ApiFailure>;

/// The file's permission bits, in octal (`644`), on reads and `HEAD`.
pub(crate) const MODE_HEADER: &str = "x-evervm-mode";
/// The file's absolute path in the machine, percent-encoded, on reads and `HEAD`.
pub(crate) const PATH_HEADER: &str = "x-evervm-path";
/// The file's modification time, RFC 3339 to the microsecond, on reads and `HEAD`.
pub(crate) const MODIFIED_HEADER: &str = "x-evervm-modified";

/// The machine path a URL's `files/...` part names.
pub(crate) fn machine_path(url_path: &str) -> String {
    if url_path == "~" || url_path.starts_with("~/") {
        url_path.to_owned()
    } else {
        format!("/{url_path}")
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    /// The directory; the machine's home when absent.
    dir: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ReadQuery {
    /// Answer with the file's info as JSON instead of its bytes.
    #[serde(default)]
    stat: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WriteQuery {
    /// Permission bits in octal (`600`).
    mode: Option<String>,
    /// Make missing parent directories.
    #[serde(default)]
    parents: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct MakeDirQuery {
    /// Make missing parent directories, and an existing directory is no error.
    #[serde(default)]
    parents: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RemoveQuery {
    /// Remove a directory and everything in it.
    #[serde(default)]
    recursive: bool,
}

/// `GET /v1/machine/{machine_name}/files?dir=PATH`: a directory's entries.
pub(crate) async fn list(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath(name): WirePath<String>,
    WireQuery(query): WireQuery<ListQuery>,
) -> ApiResult<FileList> {
    let dir = query
        .dir
        .filter(|dir| !dir.is_empty())
        .unwrap_or_else(|| "~".to_owned());
    let list = state.engine.list_files(&account, &name, &dir).await?;
    Ok(Json(list.into()))
}

/// `GET /v1/machine/{machine_name}/files/{path}`: the file's bytes, streamed (or its info, with
/// `?stat=true`).
pub(crate) async fn read(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, path)): WirePath<(String, String)>,
    WireQuery(query): WireQuery<ReadQuery>,
) -> Result<Response, ApiFailure> {
    let path = machine_path(&path);
    if query.stat {
        let info = state.engine.stat_file(&account, &name, &path).await?;
        return Ok(Json(FileInfo::from(info)).into_response());
    }
    let read = state.engine.read_file(&account, &name, &path).await?;
    let headers = file_headers(&read.info.clone().into());
    let body = Body::from_stream(
        read.data
            .map(|piece| piece.map_err(|e| std::io::Error::other(e.to_string()))),
    );
    Ok((headers, body).into_response())
}

/// `HEAD /v1/machine/{machine_name}/files/{path}`: the headers of a read, without reading.
pub(crate) async fn head(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, path)): WirePath<(String, String)>,
) -> Result<Response, ApiFailure> {
    let info = state
        .engine
        .stat_file(&account, &name, &machine_path(&path))
        .await?;
    Ok(file_headers(&info.into()).into_response())
}

/// The headers that describe a file being read.
fn file_headers(info: &FileInfo) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(info.size));
    let mut put = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    put(MODE_HEADER, format!("{:o}", info.mode));
    put(
        PATH_HEADER,
        url::form_urlencoded::byte_serialize(info.path.as_bytes()).collect(),
    );
    if let Some(modified) = info.modified_at {
        put(
            MODIFIED_HEADER,
            modified.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        );
        if let Ok(value) =
            HeaderValue::from_str(&modified.format("%a, %d %b %Y %H:%M:%S GMT").to_string())
        {
            headers.insert(header::LAST_MODIFIED, value);
        }
    }
    headers
}

/// Permission bits written in octal (`644`, `0644`, `0o644`).
fn parse_mode(text: &str) -> Result<u32, ApiFailure> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|mode| *mode <= 0o7777)
        .ok_or_else(|| {
            ApiFailure::bad_request(format!(
                "mode {text:?} is not a permission mode in octal (such as 644)"
            ))
        })
}

/// `POST /v1/machine/{machine_name}/files/{path}`: makes a directory.
pub(crate) async fn make_dir(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, path)): WirePath<(String, String)>,
    WireQuery(query): WireQuery<MakeDirQuery>,
) -> ApiResult<FileInfo> {
    let info = state
        .engine
        .make_dir(&account, &name, &machine_path(&path), query.parents)
        .await?;
    Ok(Json(info.into()))
}

/// `PUT /v1/machine/{machine_name}/files/{path}`: writes the body to the file, streamed.
pub(crate) async fn write(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, path)): WirePath<(String, String)>,
    WireQuery(query): WireQuery<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<FileInfo> {
    let path = machine_path(&path);
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let limit = state.engine.limits().max_file_bytes;
    if let Some(length) = length
        && length > limit
    {
        return Err(ApiFailure::payload_too_large(format!(
            "the file is {length} bytes, larger than the limit of {limit} bytes"
        )));
    }
    let options = engine::WriteFileOptions {
        mode: query.mode.as_deref().map(parse_mode).transpose()?,
        make_parents: query.parents,
        metadata: std::collections::BTreeMap::default(),
    };
    let data = body
        .into_data_stream()
        .map(|piece| {
            piece.map_err(|e| engine::Error::invalid(format!("the upload broke off: {e}")))
        })
        .boxed();
    let info = state
        .engine
        .write_file(&account, &name, &path, data, options)
        .await?;
    Ok(Json(info.into()))
}

/// `DELETE /v1/machine/{machine_name}/files/{path}`: removes a file, a symlink or an empty
/// directory (any directory, with `?recursive=true`); answers what was removed.
pub(crate) async fn remove(
    State(state): State<AppState>,
    Authed(account): Authed,
    WirePath((name, path)): WirePath<(String, String)>,
    WireQuery(query): WireQuery<RemoveQuery>,
) -> ApiResult<FileInfo> {
    let info = state
        .engine
        .remove_file(&account, &name, &machine_path(&path), query.recursive)
        .await?;
    Ok(Json(info.into()))
}

/// `POST /v1/machine/{machine_name}/install` (evervm): installs packages from the package index.
pub(crate) async fn install(
    State(state): State<AppState>,
    Authed(account): Authed,
    note: super::audit::AuditNote,
    WirePath(name): WirePath<String>,
    JsonBody(request): JsonBody<crate::protocol::InstallRequest>,
) -> ApiResult<crate::protocol::InstallResponse> {
    note.detail(request.requirements.join(" "));
    let report = state
        .engine
        .install_packages(&account, &name, &request.requirements)
        .await?;
    Ok(Json(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_paths_name_machine_paths() {
        assert_eq!(machine_path("tmp/a.csv"), "/tmp/a.csv");
        assert_eq!(machine_path("~/a.csv"), "~/a.csv");
        assert_eq!(machine_path("~"), "~");
        assert_eq!(machine_path("~x"), "/~x");
    }

    #[test]
    fn modes_are_octal() {
        assert_eq!(parse_mode("644").unwrap(), 0o644);
        assert_eq!(parse_mode("0o600").unwrap(), 0o600);
        assert_eq!(parse_mode("0755").unwrap(), 0o755);
        assert!(parse_mode("9").is_err());
        assert!(parse_mode("17777").is_err());
        assert!(parse_mode("").is_err());
    }
}
