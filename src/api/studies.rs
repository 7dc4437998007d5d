//! `/v1/studies`: create, list, get, change, stop, delete; suggest; optimal trials; where
//! the trials' directories are.

use super::access::{Access, AccessRouter};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::header::WARNING;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::auth::Actor;
use super::error::{ApiResult, ErrorBody};
use super::extract::{ApiJson, ApiQuery, STUDY_ID, parse_body, parse_id};
use super::trials::TrialList;
use crate::model::Role;
use crate::model::{
    ClientId, ParameterExtension, Study, StudySpec, StudyState, StudyUpdate, SuggestCount, Trial,
};
use crate::service::logs::StudyDirectories;

pub fn router() -> AccessRouter {
    // Changes need a writer here; the service lets only the study's creator (or an admin)
    // change it or ask it for trials, and an operator create one with a `trial_job`.
    let (read, write) = (Access::Role(Role::Reader), Access::Role(Role::Writer));
    AccessRouter::new()
        .routes(write, routes!(create_study))
        .routes(read, routes!(list_studies))
        .routes(read, routes!(get_study))
        .routes(write, routes!(update_study, delete_study))
        .routes(write, routes!(stop_study))
        .routes(write, routes!(resume_study))
        .routes(write, routes!(add_parameter))
        .routes(write, routes!(suggest_trials))
        .routes(read, routes!(optimal_trials))
        .routes(read, routes!(study_directories))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StudyListQuery {
    /// Only studies in this state.
    state: Option<StudyState>,
    /// Only studies whose name contains this (case-insensitive).
    name: Option<String>,
    /// 1-1000, default 100.
    page_size: Option<i64>,
    page_token: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StudyList {
    pub studies: Vec<Study>,
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SuggestRequest {
    /// How many trials to hand out (1-1000), default 1.
    #[serde(default = "one")]
    pub count: i64,
    /// A stable worker id: a worker asking again gets back the unfinished trials it holds.
    pub client_id: Option<String>,
}

fn one() -> i64 {
    1
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SuggestResponse {
    pub trials: Vec<Trial>,
    pub study_state: StudyState,
    /// Present when no trial could be handed out now but one may come later (the cap is
    /// full, or the last trials are still running): ask again after this many seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

/// A study spec: Augur's own, or a Vertex AI `HyperparameterTuningJob` taken unchanged (its
/// REST JSON, or the snake_case YAML `gcloud ai hp-tuning-jobs create --config` reads, as
/// JSON): the README's table says how its fields map.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[expect(
    dead_code,
    reason = "documents the request body; the handler reads it as JSON"
)]
pub enum CreateStudyBody {
    Augur(Box<StudySpec>),
    #[schema(value_type = Object)]
    VertexHyperparameterTuningJob(serde_json::Value),
}

/// Create a study from a spec (Augur's, or a Vertex AI `HyperparameterTuningJob`).
#[utoipa::path(post, path = "/v1/studies", tag = "studies", request_body = CreateStudyBody,
    responses(
        (status = 201, description = "The study, with defaults (and the seed) filled in; a Vertex spec's fields Augur ignores are named in `Warning` headers", body = Study,
            headers(("Warning" = String, description = "`299 augur \"<field>: why it is ignored\"`, one per field"))),
        (status = 400, description = "A field of the spec is wrong; `field` names it", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "A reader's token; a `trial_job` without an operator's, or with a command this server does not run (`field` names it)", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn create_study(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> ApiResult<(StatusCode, HeaderMap, Json<Study>)> {
    let (spec, warnings) = if crate::model::vertex::is_vertex_job(&body) {
        let imported = crate::model::vertex::from_vertex(&body)?;
        (imported.spec, imported.warnings)
    } else {
        (parse_body::<StudySpec>(body)?, Vec::new())
    };
    let study = state.service.create_study(&actor, spec).await?;
    let mut headers = HeaderMap::new();
    for warning in warnings {
        let text = format!("299 augur {:?}", warning.replace('"', "'"));
        if let Ok(value) = HeaderValue::from_str(&text) {
            headers.append(WARNING, value);
        }
    }
    Ok((StatusCode::CREATED, headers, Json(study)))
}

/// List studies by id, optionally filtered by state and name.
#[utoipa::path(get, path = "/v1/studies", tag = "studies", params(StudyListQuery),
    responses(
        (status = 200, description = "A page of studies", body = StudyList),
        (status = 400, description = "A query parameter is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
    ))]
pub async fn list_studies(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<StudyListQuery>,
) -> ApiResult<Json<StudyList>> {
    let page = state
        .service
        .list_studies(
            q.state,
            q.name.as_deref(),
            q.page_size,
            q.page_token.as_deref(),
        )
        .await?;
    Ok(Json(StudyList {
        studies: page.items,
        next_page_token: page.next_page_token,
    }))
}

/// A study with its trial counts and best trial.
#[utoipa::path(get, path = "/v1/studies/{study}", tag = "studies",
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The study", body = Study),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn get_study(
    State(state): State<AppState>,
    Path(study): Path<String>,
) -> ApiResult<Json<Study>> {
    let id = parse_id(&study, "study")?;
    Ok(Json(state.service.get_study(id).await?))
}

/// Change the budget of a live study: `max_trials`, `parallel_trials`, `max_failed_trials`.
/// A study that completed or failed on its budget becomes active again when it is raised.
#[utoipa::path(patch, path = "/v1/studies/{study}", tag = "studies", request_body = StudyUpdate,
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The changed study", body = Study),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
        (status = 409, description = "The study was stopped", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn update_study(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(study): Path<String>,
    ApiJson(update): ApiJson<StudyUpdate>,
) -> ApiResult<Json<Study>> {
    let id = parse_id(&study, "study")?;
    Ok(Json(state.service.update_study(&actor, id, update).await?))
}

/// Delete a study with all its trials and measurements.
#[utoipa::path(delete, path = "/v1/studies/{study}", tag = "studies",
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn delete_study(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(study): Path<String>,
) -> ApiResult<StatusCode> {
    let id = parse_id(&study, "study")?;
    state.service.delete_study(&actor, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Stop a study: no more suggestions. Running trials may still report.
#[utoipa::path(post, path = "/v1/studies/{study}/stop", tag = "studies",
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The study, stopped (unchanged if it had already ended)", body = Study),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn stop_study(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(study): Path<String>,
) -> ApiResult<Json<Study>> {
    let id = parse_id(&study, "study")?;
    Ok(Json(state.service.stop_study(&actor, id).await?))
}

/// Run a failed study again, once its limits allow (`max_failed_trials` above its failures,
/// trials left): the explicit act that a PATCH no longer is.
#[utoipa::path(post, path = "/v1/studies/{study}/resume", tag = "studies",
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The study, active again (unchanged if it was active)", body = Study),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
        (status = 409, description = "The study may not run again as it is: its failures are at max_failed_trials or its budget is spent (raise them first), or it completed or was stopped", body = ErrorBody),
    ))]
pub async fn resume_study(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(study): Path<String>,
) -> ApiResult<Json<Study>> {
    let id = parse_id(&study, "study")?;
    Ok(Json(state.service.resume_study(&actor, id).await?))
}

/// Add a parameter to a study's search space, top-level or as a child of one of its
/// parameters, for code that reveals its parameters as it runs (Optuna's define-by-run). The
/// space only grows: trials stored before lack the parameter, and count as inactive there.
/// Adding what the study has already (same definition, same parent) is a no-op, except that
/// `parent.values` it lacks are added to those that activate it; `trials` fills in the
/// parameter in unfinished trials handed out before it was added.
#[utoipa::path(post, path = "/v1/studies/{study}/parameters", tag = "studies", request_body = ParameterExtension,
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The study, its spec holding the parameter (unchanged if it had it already as asked)", body = Study),
        (status = 400, description = "A field is wrong (the parameter's definition, a parent that is not a categorical, integer or discrete parameter of the study, a value the parent does not take, a trial in which the parameter is not active); `field` names it", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not the study's creator nor an admin; for a study with a `trial_job`, not an operator's token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
        (status = 409, description = "The study has the parameter with another definition or parent (`field` names what differs), a trial named has finished or has another value for it, or the study was stopped or searches a grid", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn add_parameter(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(study): Path<String>,
    ApiJson(extension): ApiJson<ParameterExtension>,
) -> ApiResult<Json<Study>> {
    let id = parse_id(&study, "study")?;
    Ok(Json(
        state.service.add_parameter(&actor, id, extension).await?,
    ))
}

/// Ask for trials to run. Never more than `parallel_trials` unfinished trials at once nor
/// `max_trials` in all; a `client_id` that holds unfinished trials gets those back.
#[utoipa::path(post, path = "/v1/studies/{study}/suggest", tag = "trials", request_body = SuggestRequest,
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "Trials to run (possibly none: see retry_after_secs and study_state)", body = SuggestResponse),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn suggest_trials(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(study): Path<String>,
    ApiJson(req): ApiJson<SuggestRequest>,
) -> ApiResult<Json<SuggestResponse>> {
    let id = parse_id(&study, "study")?;
    let count = SuggestCount::try_from(req.count)?;
    let client_id = req.client_id.map(ClientId::try_from).transpose()?;
    let out = state.service.suggest(&actor, id, count, client_id).await?;
    Ok(Json(SuggestResponse {
        trials: out.trials,
        study_state: out.study_state,
        retry_after_secs: out.retry_after_secs,
    }))
}

/// Where a dispatched study's trials keep their files on the server's machine, each path
/// with `{trial}` for a trial's id: what `augur tensorboard` shows, on a machine that sees
/// the same file system.
#[utoipa::path(get, path = "/v1/studies/{study}/directories", tag = "studies",
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The study's directories", body = StudyDirectories),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study, or its trials are not dispatched (no trial_job)", body = ErrorBody),
    ))]
pub async fn study_directories(
    State(state): State<AppState>,
    Path(study): Path<String>,
) -> ApiResult<Json<StudyDirectories>> {
    let id = parse_id(&study, "study")?;
    Ok(Json(state.service.study_directories(id).await?))
}

/// The best completed trial, or the Pareto set of a study with several metrics.
#[utoipa::path(get, path = "/v1/studies/{study}/optimal_trials", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The optimal trials (none before the first completes)", body = TrialList),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn optimal_trials(
    State(state): State<AppState>,
    Path(study): Path<String>,
) -> ApiResult<Json<TrialList>> {
    let id = parse_id(&study, "study")?;
    let trials = state.service.optimal_trials(id).await?;
    Ok(Json(TrialList {
        trials,
        next_page_token: None,
    }))
}
