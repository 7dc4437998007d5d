//! `/v1/tokens` and `/v1/audit`: an admin's. Create a token with a role (its secret is shown
//! once), list them, revoke one; read the audit trail.

use super::access::{Access, AccessRouter};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::auth::Actor;
use super::error::{ApiResult, ErrorBody};
use super::extract::{ApiJson, ApiQuery};
use crate::model::{AuditEvent, Role, TokenInfo};

pub fn router() -> AccessRouter {
    let admin = Access::Role(Role::Admin);
    AccessRouter::new()
        .routes(admin, routes!(create_token, list_tokens))
        .routes(admin, routes!(revoke_token))
        .routes(admin, routes!(audit_events))
}

/// Longest lifetime a token may be given: 10 years.
const MAX_EXPIRES_IN_SECS: u64 = 10 * 365 * 24 * 3600;

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// 1-64 characters without spaces; what the audit trail shows of who acted.
    pub name: String,
    pub role: Role,
    /// Seconds until the token is refused; absent: never.
    pub expires_in_secs: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// The bearer token. Shown once: only its SHA-256 digest is stored.
    pub token: String,
    #[serde(flatten)]
    pub info: TokenInfo,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenInfo>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// 1-1000, default 100.
    page_size: Option<i64>,
    page_token: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// Oldest first.
    pub events: Vec<AuditEvent>,
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

/// Create a token with a role: `reader` (every GET), `writer` (also ask/tell studies and
/// changing its own), `operator` (also `trial_job` studies), `admin` (also tokens and every
/// study).
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateTokenRequest,
    responses(
        (status = 201, description = "The token: its secret is shown this once", body = CreatedToken),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not an admin's token", body = ErrorBody),
        (status = 409, description = "A token of that name exists", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn create_token(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(req): ApiJson<CreateTokenRequest>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let expires_in = match req.expires_in_secs {
        Some(secs) if !(1..=MAX_EXPIRES_IN_SECS).contains(&secs) => {
            return Err(super::error::ApiError::invalid(
                "expires_in_secs",
                format!("must be between 1 and {MAX_EXPIRES_IN_SECS} (10 years)"),
            ));
        }
        other => other.map(std::time::Duration::from_secs),
    };
    let created = state
        .service
        .create_token(&actor, &req.name, req.role, expires_in)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token: created.token,
            info: created.info,
        }),
    ))
}

/// Tokens of people and programs (not trials'), by name, without their secrets.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens",
    responses(
        (status = 200, description = "Every token", body = TokenList),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not an admin's token", body = ErrorBody),
    ))]
pub async fn list_tokens(State(state): State<AppState>) -> ApiResult<Json<TokenList>> {
    Ok(Json(TokenList {
        tokens: state.service.list_tokens().await?,
    }))
}

/// Revoke a token: refused at once by this server, and by every replica within 5 s.
#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "tokens",
    params(("name" = String, Path, description = "the token's name")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "A trial's token (those go with their trial)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not an admin's token", body = ErrorBody),
        (status = 404, description = "No token of that name", body = ErrorBody),
    ))]
pub async fn revoke_token(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    state.service.revoke_token(&actor, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The audit trail: who created, changed, stopped or deleted each study, added, excluded,
/// failed or stopped trials (or completed another's), minted trial tokens, created or revoked
/// tokens; oldest first.
#[utoipa::path(get, path = "/v1/audit", tag = "tokens", params(AuditQuery),
    responses(
        (status = 200, description = "A page of the audit trail", body = AuditList),
        (status = 400, description = "A query parameter is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not an admin's token", body = ErrorBody),
    ))]
pub async fn audit_events(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> ApiResult<Json<AuditList>> {
    let page = state
        .service
        .audit_events(q.page_size, q.page_token.as_deref())
        .await?;
    Ok(Json(AuditList {
        events: page.items,
        next_page_token: page.next_page_token,
    }))
}
