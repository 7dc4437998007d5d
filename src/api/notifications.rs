//! `/v1/studies/{study}/notifications`: the study's webhook calls and how each went (a
//! reader's, like the study itself). The webhooks are named in the study's spec
//! (`notifications`) or by the server (`--notify-url`); `service/notifications.rs` calls them.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::access::{Access, AccessRouter};
use super::error::{ApiResult, ErrorBody};
use super::extract::{ApiQuery, STUDY_ID, parse_id};
use crate::model::{NotificationDelivery, Role};

pub fn router() -> AccessRouter {
    AccessRouter::new().routes(Access::Role(Role::Reader), routes!(list_notifications))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NotificationQuery {
    /// 1-1000, default 100.
    page_size: Option<i64>,
    page_token: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NotificationList {
    /// Oldest first.
    pub deliveries: Vec<NotificationDelivery>,
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

/// The study's webhook calls, oldest first: each event sent to each URL, its attempts, the
/// last answer's status or error, and whether it was delivered, is still being tried, or
/// failed.
#[utoipa::path(get, path = "/v1/studies/{study}/notifications", tag = "studies",
    params(("study" = String, Path, description = STUDY_ID), NotificationQuery),
    responses(
        (status = 200, description = "A page of the study's webhook calls", body = NotificationList),
        (status = 400, description = "A query parameter is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn list_notifications(
    State(state): State<AppState>,
    Path(study): Path<String>,
    ApiQuery(q): ApiQuery<NotificationQuery>,
) -> ApiResult<Json<NotificationList>> {
    let id = parse_id(&study, "study")?;
    let page = state
        .service
        .notification_deliveries(id, q.page_size, q.page_token.as_deref())
        .await?;
    Ok(Json(NotificationList {
        deliveries: page.items,
        next_page_token: page.next_page_token,
    }))
}
