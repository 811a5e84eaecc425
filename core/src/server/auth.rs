//! Who is calling: `Authorization: Bearer <id>.<secret>` on every `/v1` route, checked by the
//! engine. The WebSocket route also takes the token from `?_forevervm_jwt=<token>`, which is how
//! the ForeverVM JS SDK authenticates from browsers (they cannot set headers on a WebSocket).

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use evervm_engine::Account;

use super::AppState;
use super::audit::{AuditNote, token_id};
use super::error::ApiFailure;

/// The query parameter the ForeverVM JS SDK puts the token in.
pub(crate) const TOKEN_QUERY_PARAMETER: &str = "_forevervm_jwt";

/// The caller's account, from the `Authorization` header.
#[derive(Debug)]
pub(crate) struct Authed(pub(crate) Account);

/// The caller's account and the id of its token, from the `Authorization` header or the
/// `_forevervm_jwt` query parameter.
#[derive(Debug)]
pub(crate) struct WsAuthed(pub(crate) Account, pub(crate) String);

/// The token in an `Authorization` header value: `Bearer <token>` (scheme in any case).
pub(crate) fn bearer_token(header: &str) -> Result<&str, ApiFailure> {
    let (scheme, token) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ApiFailure::unauthorized(
            "the Authorization header must be `Bearer <id>.<secret>`",
        ));
    }
    Ok(token)
}

/// The token in a query string's `_forevervm_jwt` parameter, if there is one.
pub(crate) fn query_token(query: &str) -> Option<String> {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == TOKEN_QUERY_PARAMETER)
        .map(|(_, value)| value.into_owned())
        .filter(|value| !value.is_empty())
}

/// The bearer token of a request that authentication accepted.
pub(crate) fn request_token(parts: &Parts) -> Option<&str> {
    header_token(parts).ok().flatten()
}

fn header_token(parts: &Parts) -> Result<Option<&str>, ApiFailure> {
    let Some(value) = parts.headers.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| ApiFailure::unauthorized("the Authorization header is not valid text"))?;
    bearer_token(value).map(Some)
}

/// The token's account, noted on the request's audit note when it has one.
async fn authenticate(state: &AppState, token: &str, parts: &Parts) -> Result<Account, ApiFailure> {
    let account = state
        .engine
        .authenticate(token)
        .await
        .map_err(ApiFailure::from)?;
    if let Some(note) = parts.extensions.get::<AuditNote>() {
        note.caller(&account, token);
    }
    Ok(account)
}

const MISSING: &str =
    "no token: send `Authorization: Bearer <id>.<secret>` (create one with `evervm token create`)";

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiFailure;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiFailure> {
        match header_token(parts)? {
            Some(token) => authenticate(state, token, parts).await.map(Authed),
            None => Err(ApiFailure::unauthorized(MISSING)),
        }
    }
}

impl FromRequestParts<AppState> for WsAuthed {
    type Rejection = ApiFailure;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiFailure> {
        if let Some(token) = header_token(parts)? {
            let account = authenticate(state, token, parts).await?;
            return Ok(WsAuthed(account, token_id(token).to_owned()));
        }
        match parts.uri.query().and_then(query_token) {
            Some(token) => {
                let account = authenticate(state, &token, parts).await?;
                Ok(WsAuthed(account, token_id(&token).to_owned()))
            }
            None => Err(ApiFailure::unauthorized(MISSING)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token("Bearer a.b").unwrap(), "a.b");
        assert_eq!(bearer_token("bearer   a.b ").unwrap(), "a.b");
        assert_eq!(bearer_token("BEARER a.b").unwrap(), "a.b");
        for bad in ["", "Bearer", "Bearer ", "Basic a.b", "a.b"] {
            let err = bearer_token(bad).unwrap_err();
            assert_eq!(
                (err.status.as_u16(), err.code),
                (401, "Unauthorized"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn query_tokens() {
        assert_eq!(query_token("_forevervm_jwt=a.b").as_deref(), Some("a.b"));
        assert_eq!(
            query_token("x=1&_forevervm_jwt=a%2Eb%3D").as_deref(),
            Some("a.b=")
        );
        assert_eq!(query_token("x=1"), None);
        assert_eq!(query_token("_forevervm_jwt="), None);
        assert_eq!(query_token(""), None);
    }
}
