//! E2B's lists of sandboxes (`GET /v2/sandboxes`, `GET /sandboxes`): a page of the caller's
//! machines, filtered as the query says; every parameter E2B documents is honoured or refused.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use evervm_engine::{Account, ListCursor, Tags};

use super::access::Access;
use super::control::{SandboxDetail, detail};
use super::snapshots::is_snapshot;
use super::{ApiCaller, E2bFailure, E2bState};

/// The most sandboxes (or snapshots) one page of a list holds (E2B's limit).
pub(super) const MAX_LIST_LIMIT: usize = 100;

/// `GET /v2/sandboxes`'s query (metadata in E2B's encoding, see [`parse_metadata`]).
#[derive(Debug, Default)]
struct ListQuery {
    metadata: Tags,
    /// `running`, `paused`, or both when empty.
    states: Vec<String>,
    limit: Option<usize>,
    next_token: Option<String>,
    /// `order=asc`: oldest first (E2B's default and `desc`: newest first).
    oldest_first: bool,
    /// Only sandboxes started at or after this.
    started_after: Option<DateTime<Utc>>,
    /// Only sandboxes of this template (E2B's template id or alias: evervm's image).
    template: Option<String>,
}

fn parse_list_query(query: Option<&str>) -> Result<ListQuery, E2bFailure> {
    let mut parsed = ListQuery::default();
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "metadata" | "query" => parsed.metadata.extend(parse_metadata(&value)?),
            "state" => {
                for state in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    if state != "running" && state != "paused" {
                        return Err(E2bFailure::bad_request(format!(
                            "state {state:?}: a sandbox is `running` or `paused`"
                        )));
                    }
                    parsed.states.push(state.to_owned());
                }
            }
            "limit" => parsed.limit = Some(parse_limit(&value, "sandboxes")?),
            "nextToken" => parsed.next_token = Some(value.into_owned()),
            "order" => {
                parsed.oldest_first = match value.as_ref() {
                    "asc" => true,
                    "desc" => false,
                    other => {
                        return Err(E2bFailure::bad_request(format!(
                            "order {other:?}: `asc` or `desc`"
                        )));
                    }
                }
            }
            "startedAfter" => {
                let at = DateTime::parse_from_rfc3339(&value).map_err(|e| {
                    E2bFailure::bad_request(format!(
                        "startedAfter {value:?} is not an RFC 3339 time: {e}"
                    ))
                })?;
                parsed.started_after = Some(at.with_timezone(&Utc));
            }
            "template" => parsed.template = Some(value.into_owned()),
            other => {
                return Err(E2bFailure::bad_request(format!(
                    "the query parameter {other:?} is not one this server knows (metadata, \
                     state, limit, nextToken, order, startedAfter, template)"
                )));
            }
        }
    }
    Ok(parsed)
}

/// E2B's metadata filter, once the query string is decoded: `k=v&k2=v2` with every key and
/// value percent-encoded, the whole percent-encoded once more (what both SDKs send).
fn parse_metadata(text: &str) -> Result<Tags, E2bFailure> {
    let once = percent_decode(text)?;
    let mut tags = Tags::new();
    for pair in once.split('&').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(E2bFailure::bad_request(format!(
                "metadata filter {pair:?} is not key=value"
            )));
        };
        tags.insert(percent_decode(key)?, percent_decode(value)?);
    }
    Ok(tags)
}

/// `%XX` sequences decoded (a `%` not followed by two hex digits stays as it is).
fn percent_decode(text: &str) -> Result<String, E2bFailure> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| E2bFailure::bad_request("the metadata filter is not UTF-8"))
}

/// `GET /v2/sandboxes`: the caller's sandboxes with every metadata pair given, newest first, in
/// pages (`X-Next-Token`).
pub(super) async fn list(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, E2bFailure> {
    let query = parse_list_query(query.as_deref())?;
    list_page(&state, &account, &headers, query).await
}

/// `GET /sandboxes` (the first generation's list): running sandboxes only, one page.
pub(super) async fn list_running(
    State(state): State<E2bState>,
    ApiCaller(account): ApiCaller,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, E2bFailure> {
    let mut query = parse_list_query(query.as_deref())?;
    query.states = vec!["running".to_owned()];
    list_page(&state, &account, &headers, query).await
}

async fn list_page(
    state: &E2bState,
    account: &Account,
    headers: &HeaderMap,
    query: ListQuery,
) -> Result<Response, E2bFailure> {
    let domain = Access::of(headers, state)?.domain();
    let cursor = query
        .next_token
        .as_deref()
        .map(ListCursor::parse)
        .transpose()?;
    let page = state
        .engine
        .list_machines_page_in(
            account,
            &query.metadata,
            query.limit.unwrap_or(MAX_LIST_LIMIT),
            cursor,
            query.oldest_first,
        )
        .await?;
    let sandboxes: Vec<SandboxDetail> = page
        .machines
        .iter()
        // A snapshot is a machine of its own, never a sandbox.
        .filter(|info| !is_snapshot(&info.tags))
        .map(|info| detail(state, info, None, domain.clone()))
        .filter(|d| query.states.is_empty() || query.states.iter().any(|s| s == d.state))
        .filter(|d| {
            query
                .started_after
                .is_none_or(|after| d.started_at >= after)
        })
        .filter(|d| {
            query
                .template
                .as_ref()
                .is_none_or(|t| *t == d.template_id || *t == d.alias)
        })
        .collect();
    Ok(page_response(&sandboxes, page.next_cursor))
}

/// A page's `limit`: 1 to [`MAX_LIST_LIMIT`] `things`.
pub(super) fn parse_limit(value: &str, things: &str) -> Result<usize, E2bFailure> {
    value
        .parse::<usize>()
        .ok()
        .filter(|l| (1..=MAX_LIST_LIMIT).contains(l))
        .ok_or_else(|| {
            E2bFailure::bad_request(format!(
                "limit {value:?}: a page holds 1 to {MAX_LIST_LIMIT} {things}"
            ))
        })
}

/// A page of a list, with the next page's token in `X-Next-Token` when there is one.
pub(super) fn page_response<T: serde::Serialize>(
    items: &[T],
    next: Option<ListCursor>,
) -> Response {
    let mut response = Json(items).into_response();
    if let Some(next) = next
        && let Ok(value) = HeaderValue::from_str(&next.encode())
    {
        response.headers_mut().insert("x-next-token", value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_in_both_sdks_encodings() {
        // Python: urlencode({quote(k): quote(v)}), then the query encoding; JS the same with
        // encodeURIComponent. After the query string's own decoding:
        let decoded_query = "user%2520id=a%2520b%2526c%253Dd&k=v";
        let tags = parse_metadata(decoded_query).unwrap();
        assert_eq!(tags.get("user id").map(String::as_str), Some("a b&c=d"));
        assert_eq!(tags.get("k").map(String::as_str), Some("v"));

        let query = parse_list_query(Some(
            "metadata=user%252520id%3Da%252520b%252526c%25253Dd%26k%3Dv&state=running%2Cpaused&limit=5",
        ))
        .unwrap();
        assert_eq!(query.metadata, tags);
        assert_eq!(query.states, ["running", "paused"]);
        assert_eq!(query.limit, Some(5));

        assert_eq!(percent_decode("a%zz%4%41").unwrap(), "a%zz%4A");
        assert!(percent_decode("%ff").is_err(), "not UTF-8");
        assert!(parse_metadata("novalue").is_err());
        assert!(parse_list_query(Some("state=dead")).is_err());
        assert!(parse_list_query(Some("limit=0")).is_err());
        assert!(parse_list_query(Some("limit=101")).is_err());
    }
}
