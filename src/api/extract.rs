//! Extractors that answer bad input with a JSON error naming the field: bodies, queries and
//! path ids. An empty body reads as `{}`; any other must be sent as `application/json`.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body, parsed with the path of the first bad field.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                let mime = v
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            });
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge
            } else {
                ApiError::invalid("body", rejection.body_text())
            }
        })?;
        let empty = bytes.iter().all(u8::is_ascii_whitespace);
        // A body must say it is JSON: a web page can send one as text/plain or untyped
        // without asking the server first (see guard.rs).
        if !empty && json_type != Some(true) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes: &[u8] = if empty { b"{}" } else { &bytes };
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let value = serde_path_to_error::deserialize(de).map_err(|e| body_error(&e))?;
        Ok(ApiJson(value))
    }
}

/// A JSON document already read (e.g. to tell which kind of spec it is) as `T`, with the
/// path of the first bad field.
pub fn parse_body<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "body".to_string()
        } else {
            path
        };
        ApiError::invalid(field, e.inner().to_string())
    })
}

fn body_error(e: &serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let message = e.inner().to_string();
    // serde reports an unknown field at its parent; name the field itself.
    // For an unknown field the path already ends with the field's name.
    let field = if path == "." {
        "body".to_string()
    } else {
        path
    };
    ApiError::invalid(field, message)
}

/// Query parameters, parsed with the name of the first bad one.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded_parse(query));
        serde_path_to_error::deserialize(de)
            .map(ApiQuery)
            .map_err(|e| {
                let path = e.path().to_string();
                let message = e.inner().to_string();
                let field = if path == "." {
                    "query".to_string()
                } else {
                    path
                };
                ApiError::invalid(field, message)
            })
    }
}

fn form_urlencoded_parse(query: &str) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(query.as_bytes())
}

/// How the API documents a `{study}` path segment.
pub const STUDY_ID: &str = "study id (a positive integer)";
/// How the API documents a `{trial}` path segment.
pub const TRIAL_ID: &str = "trial id within the study (a positive integer)";

/// Parse a path segment as a positive id (a [`StudyId`](crate::model::StudyId) or a
/// [`TrialId`](crate::model::TrialId)), naming the segment on failure.
pub fn parse_id<Id: std::str::FromStr + Copy + Into<i64>>(
    raw: &str,
    field: &str,
) -> Result<Id, ApiError> {
    raw.parse::<Id>()
        .ok()
        .filter(|id| (*id).into() >= 1)
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "{field} {raw:?} not found: ids are positive integers"
            ))
        })
}
