//! Vizier's studies: create (409 for a display name taken at its project and location),
//! get, list, delete, lookup by display name. Project and location are kept in the study's
//! user attributes and listed; they are not a tenancy boundary.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::Call;
use super::convert::{self, LOCATION_ATTR, PROJECT_ATTR, Place};
use super::error::{VizierError, VizierResult};
use super::types::{LookupStudyRequest, PageQuery, StudyInput};
use crate::api::AppState;
use crate::api::auth::Actor;
use crate::api::error::ApiError;
use crate::api::extract::{ApiJson, ApiQuery};
use crate::model::{AnnotationUpdate, Study, StudyId};
use crate::service::Service;

pub async fn create_study(
    State(state): State<AppState>,
    Actor(actor): Actor,
    call: Call,
    ApiJson(input): ApiJson<StudyInput>,
) -> VizierResult<Json<Value>> {
    let display_name = input
        .display_name
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| ApiError::invalid("displayName", "is required"))?;
    let study_spec = input
        .study_spec
        .ok_or_else(|| ApiError::invalid("studySpec", "is required"))?;
    let spec = convert::spec_from_vizier(&display_name, &study_spec)?;
    let place = call.place();
    if let Some(existing) = find_by_display_name(&state.service, &place, &display_name).await? {
        return Err(name_taken(&place, &display_name, existing.id));
    }
    let study = state.service.create_study(&actor, spec).await?;
    let attrs = BTreeMap::from([
        (PROJECT_ATTR.to_string(), json!(place.project)),
        (LOCATION_ATTR.to_string(), json!(place.location)),
    ]);
    let update = AnnotationUpdate {
        user_attrs: Some(attrs),
        ..Default::default()
    };
    if let Err(e) = state.service.annotate_study(&actor, study.id, update).await {
        // A study nobody can look up at its place would be made again by the next
        // create_or_load: take it back (it has no trials yet).
        if let Err(undo) = state.service.delete_study(&actor, study.id).await {
            tracing::warn!(study = %study.id, %undo, "could not remove a half-made Vizier study");
        }
        return Err(e.into());
    }
    // Creates of one name that raced past the check above: the oldest study wins, and the
    // others, empty still, are taken back (each racer sees the oldest once it is named).
    if let Some(first) = find_by_display_name(&state.service, &place, &display_name).await?
        && first.id != study.id
    {
        state.service.delete_study(&actor, study.id).await?;
        return Err(name_taken(&place, &display_name, first.id));
    }
    let study = state.service.get_study(study.id).await?;
    Ok(Json(convert::study_to_vizier(&study, &place, call.enc)))
}

/// 409 `ALREADY_EXISTS`, naming the study that holds the display name.
fn name_taken(place: &Place<'_>, display_name: &str, holder: StudyId) -> VizierError {
    VizierError::AlreadyExists(format!(
        "a study named {display_name:?} exists already: {}",
        convert::study_name(place, holder)
    ))
}

pub async fn get_study(State(state): State<AppState>, call: Call) -> VizierResult<Json<Value>> {
    let study = state.service.get_study(call.study()?).await?;
    Ok(Json(convert::study_to_vizier(
        &study,
        &call.place(),
        call.enc,
    )))
}

/// The studies made through Vizier at the path's project and location, a page of Augur's
/// studies at a time (a page may hold none, with a token for the next).
pub async fn list_studies(
    State(state): State<AppState>,
    call: Call,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> VizierResult<Json<Value>> {
    let place = call.place();
    let listed = state
        .service
        .list_studies(None, None, page.size(), page.page_token.as_deref())
        .await
        .map_err(|e| page_error(e.into()))?;
    let studies: Vec<Value> = listed
        .items
        .iter()
        .filter(|s| convert::is_at(s, &place))
        .map(|s| convert::study_to_vizier(s, &place, call.enc))
        .collect();
    let mut out = json!({ "studies": studies });
    if let Some(token) = listed.next_page_token {
        out["nextPageToken"] = json!(token);
    }
    Ok(Json(out))
}

pub async fn delete_study(
    State(state): State<AppState>,
    Actor(actor): Actor,
    call: Call,
) -> VizierResult<Json<Value>> {
    state.service.delete_study(&actor, call.study()?).await?;
    Ok(Json(json!({})))
}

pub async fn lookup_study(
    State(state): State<AppState>,
    call: Call,
    ApiJson(request): ApiJson<LookupStudyRequest>,
) -> VizierResult<Json<Value>> {
    let display_name = request
        .display_name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid("displayName", "is required"))?;
    let place = call.place();
    let study = find_by_display_name(&state.service, &place, &display_name)
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "no study named {display_name:?} in projects/{}/locations/{}",
                place.project, place.location
            ))
        })?;
    Ok(Json(convert::study_to_vizier(&study, &place, call.enc)))
}

/// The first study made through Vizier at `place` with this display name.
async fn find_by_display_name(
    service: &Service,
    place: &Place<'_>,
    display_name: &str,
) -> Result<Option<Study>, VizierError> {
    let mut token: Option<String> = None;
    loop {
        let page = service
            .list_studies(None, Some(display_name), Some(1000), token.as_deref())
            .await?;
        if let Some(study) = page
            .items
            .into_iter()
            .find(|s| s.name == display_name && convert::is_at(s, place))
        {
            return Ok(Some(study));
        }
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => return Ok(None),
        }
    }
}

/// A paging error, naming Vizier's query parameter.
pub(super) fn page_error(e: ApiError) -> ApiError {
    renamed(
        renamed(e, "page_size", "pageSize"),
        "page_token",
        "pageToken",
    )
}

/// An error about Augur's field `from`, naming Vizier's `to` instead.
pub(super) fn renamed(e: ApiError, from: &str, to: &str) -> ApiError {
    match e {
        ApiError::InvalidArgument {
            message,
            field: Some(field),
        } if field == from => ApiError::InvalidArgument {
            message,
            field: Some(to.to_string()),
        },
        other => other,
    }
}
