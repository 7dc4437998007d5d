//! `/v1/studies/{study}/trials`: add, list, get, exclude; measurements, complete, fail,
//! heartbeat, should_stop.

use std::collections::BTreeMap;

use super::access::{Access, AccessRouter};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::auth::Actor;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiJson, ApiQuery, STUDY_ID, TRIAL_ID, parse_id};
use crate::model::Role;
use crate::model::{AnnotationUpdate, Measurement, Step, StudyId, Trial, TrialId, TrialState};
use crate::service::Completion;
use crate::service::artifacts::{ArtifactList, ArtifactRoot};

pub fn router() -> AccessRouter {
    // A trial's own token reads and reports to its trial, and sets its user attributes
    // (the service refuses it the rest of a PATCH); nothing else.
    let (read, write) = (Access::Role(Role::Reader), Access::Role(Role::Writer));
    let (read_own, report_own) = (
        Access::RoleOrOwnTrial(Role::Reader),
        Access::RoleOrOwnTrial(Role::Writer),
    );
    AccessRouter::new()
        .routes(write, routes!(add_trial))
        .routes(read, routes!(list_trials))
        .routes(read_own, routes!(get_trial))
        .routes(report_own, routes!(update_trial))
        .routes(report_own, routes!(add_measurement))
        .routes(report_own, routes!(complete_trial))
        .routes(report_own, routes!(fail_trial))
        .routes(write, routes!(retry_trial))
        .routes(report_own, routes!(heartbeat_trial))
        .routes(report_own, routes!(checkpoint_copied))
        .routes(read_own, routes!(stop_verdict))
        .routes(report_own, routes!(should_stop))
        .routes(read, routes!(trial_changes))
        .routes(read, routes!(trial_logs))
        .routes(read, routes!(trial_artifacts))
        .routes(read, routes!(trial_artifact_content))
        .routes(write, routes!(issue_trial_token))
}

/// The log tail a request gets when it names none.
const DEFAULT_LOG_TAIL_BYTES: u64 = 1024 * 1024;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// Only the last this many bytes (default 1 MiB, at most 16 MiB).
    tail_bytes: Option<u64>,
    /// The replica of a cluster trial, e.g. `workerpool1-2`; the primary when absent.
    replica: Option<String>,
}

/// stdout and stderr of a dispatched trial's replica (the primary by default), every attempt.
#[utoipa::path(get, path = "/v1/studies/{study}/trials/{trial}/logs", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID), LogsQuery),
    responses(
        (status = 200, description = "The log (possibly empty while the job starts)", content_type = "text/plain", body = String),
        (status = 400, description = "A query parameter is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study or trial, or the study's trials are not dispatched", body = ErrorBody),
        (status = 409, description = "Where the log should be is a link or a file the server did not make: refused, not followed", body = ErrorBody),
    ))]
pub async fn trial_logs(
    State(state): State<AppState>,
    Path((study, trial)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<LogsQuery>,
) -> ApiResult<impl axum::response::IntoResponse> {
    let (study, trial) = ids(&study, &trial)?;
    let tail = q.tail_bytes.unwrap_or(DEFAULT_LOG_TAIL_BYTES);
    let replica = q.replica.as_deref();
    let text = state.service.trial_log(study, trial, replica, tail).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        text,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ArtifactsQuery {
    /// `model` (default: `AIP_MODEL_DIR`) or `checkpoints` (`AIP_CHECKPOINT_DIR`).
    root: Option<ArtifactRoot>,
}

/// The files a dispatched trial's job left in its model (or checkpoint) directory: what the
/// dashboard's trial page lists. Nothing is followed: links are left out.
#[utoipa::path(get, path = "/v1/studies/{study}/trials/{trial}/artifacts", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID), ArtifactsQuery),
    responses(
        (status = 200, description = "The files, in path order", body = ArtifactList),
        (status = 400, description = "A query parameter is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study or trial, or the study's trials are not dispatched", body = ErrorBody),
        (status = 409, description = "A directory on the way is a link: refused, not followed", body = ErrorBody),
    ))]
pub async fn trial_artifacts(
    State(state): State<AppState>,
    Path((study, trial)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<ArtifactsQuery>,
) -> ApiResult<Json<ArtifactList>> {
    let (study, trial) = ids(&study, &trial)?;
    let root = q.root.unwrap_or_default();
    Ok(Json(
        state.service.trial_artifacts(study, trial, root).await?,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ArtifactQuery {
    /// The file, as the listing names it (`export/1/saved_model.pb`).
    path: String,
    /// `model` (default) or `checkpoints`.
    root: Option<ArtifactRoot>,
}

/// One artifact's bytes, as a download (`Content-Disposition: attachment`, never shown as a
/// page: a trial's files are its job's, not the server's).
#[utoipa::path(get, path = "/v1/studies/{study}/trials/{trial}/artifacts/content", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID), ArtifactQuery),
    responses(
        (status = 200, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "path is not plain names separated by '/'", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study, trial or file", body = ErrorBody),
        (status = 409, description = "The file or a directory on the way is a link, or the file has other names: refused", body = ErrorBody),
    ))]
pub async fn trial_artifact_content(
    State(state): State<AppState>,
    Path((study, trial)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<ArtifactQuery>,
) -> ApiResult<impl axum::response::IntoResponse> {
    use axum::http::header;
    let (study, trial) = ids(&study, &trial)?;
    let root = q.root.unwrap_or_default();
    let (file, name) = state
        .service
        .open_trial_artifact(study, trial, root, &q.path)
        .await?;
    let length = file.metadata().map(|m| m.len()).ok();
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(
        tokio::fs::File::from_std(file),
    ));
    // Only characters no header or shell reads specially go in the suggested name.
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&format!("attachment; filename=\"{safe}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Some(length) = length {
        headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(length));
    }
    Ok((headers, body))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ChangesQuery {
    /// The `cursor` of a previous answer; absent to start from the beginning.
    after: Option<String>,
    /// 1-1000, default 100.
    page_size: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TrialChanges {
    /// Trials created or changed after the cursor, oldest change first.
    pub trials: Vec<Trial>,
    /// Ask again with `?after=<cursor>` for later changes.
    pub cursor: String,
    /// More changes are waiting: ask again right away.
    pub has_more: bool,
}

/// Trials created or changed since a cursor: for live views that must not reload every trial.
#[utoipa::path(get, path = "/v1/studies/{study}/changes", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ChangesQuery),
    responses(
        (status = 200, description = "Changed trials and the next cursor", body = TrialChanges),
        (status = 400, description = "A query parameter is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn trial_changes(
    State(state): State<AppState>,
    Path(study): Path<String>,
    ApiQuery(q): ApiQuery<ChangesQuery>,
) -> ApiResult<Json<TrialChanges>> {
    let id = parse_id(&study, "study")?;
    let changes = state
        .service
        .trial_changes(id, q.after.as_deref(), q.page_size)
        .await?;
    Ok(Json(TrialChanges {
        trials: changes.trials,
        cursor: changes.cursor,
        has_more: changes.has_more,
    }))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TrialList {
    pub trials: Vec<Trial>,
    /// Absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TrialListQuery {
    /// Only trials in this state.
    state: Option<TrialState>,
    /// 1-1000, default 100.
    page_size: Option<i64>,
    page_token: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinalMeasurementInput {
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddTrialRequest {
    /// A value for every active parameter.
    #[schema(value_type = BTreeMap<String, serde_json::Value>)]
    pub parameters: augur_optimizer::Assignment,
    /// Given: the trial is added completed (a prior result the optimizer learns from).
    /// Absent: it is added `requested`, and the next suggest hands it out first.
    pub final_measurement: Option<FinalMeasurementInput>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrialUpdate {
    /// Keep the trial but hide it from the optimizer and from the best trial (`false`:
    /// include it again).
    #[serde(default)]
    pub excluded: Option<bool>,
    /// The trial's note (plain text; empty removes it).
    #[serde(default)]
    pub note: Option<String>,
    /// The trial's tags, all of them (empty removes them).
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// User attributes to set (any JSON value) or, with `null`, to remove. A trial's own
    /// token (and a worker holding the trial) may change these, and only these.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, serde_json::Value>>)]
    pub user_attrs: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeasurementRequest {
    /// Training step (>= 0); a second report at the same step replaces the first.
    pub step: i64,
    pub elapsed_secs: Option<f64>,
    /// Values of some or all of the study's metrics.
    pub metrics: BTreeMap<String, f64>,
}

/// Send `metrics`, or `infeasible_reason`, or neither: then the final measurement is chosen
/// from the reported ones by the study's `measurement_selection`.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// Every metric of the study.
    pub metrics: Option<BTreeMap<String, f64>>,
    /// Step of the final measurement (default 0).
    pub step: Option<i64>,
    /// The trial ran but its point is infeasible: why, at most 4096 bytes (longer: 400
    /// naming `infeasible_reason`).
    pub infeasible_reason: Option<String>,
    /// Without `metrics`: measurements to record first, in the same change, before the
    /// final one is chosen (what a worker read at its trial's exit, sent with the
    /// completion instead of one request each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<MeasurementRequest>,
}

#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// Why, at most 4096 bytes (longer: 400 naming `reason`).
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShouldStopResponse {
    pub should_stop: bool,
}

fn ids(study: &str, trial: &str) -> ApiResult<(StudyId, TrialId)> {
    Ok((parse_id(study, "study")?, parse_id(trial, "trial")?))
}

/// Add a trial with chosen parameters, completed (prior result) or requested.
#[utoipa::path(post, path = "/v1/studies/{study}/trials", tag = "trials", request_body = AddTrialRequest,
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 201, description = "The new trial", body = Trial),
        (status = 400, description = "A parameter or metric is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
        (status = 409, description = "The study is not active, its budget is spent, or its cap is full", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn add_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(study): Path<String>,
    ApiJson(req): ApiJson<AddTrialRequest>,
) -> ApiResult<(StatusCode, Json<Trial>)> {
    let id = parse_id(&study, "study")?;
    let final_metrics = req.final_measurement.map(|m| m.metrics);
    let trial = state
        .service
        .add_trial(&actor, id, req.parameters, final_metrics)
        .await?;
    Ok((StatusCode::CREATED, Json(trial)))
}

/// List a study's trials by id.
#[utoipa::path(get, path = "/v1/studies/{study}/trials", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), TrialListQuery),
    responses(
        (status = 200, description = "A page of trials", body = TrialList),
        (status = 400, description = "A query parameter is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn list_trials(
    State(state): State<AppState>,
    Path(study): Path<String>,
    ApiQuery(q): ApiQuery<TrialListQuery>,
) -> ApiResult<Json<TrialList>> {
    let id = parse_id(&study, "study")?;
    let page = state
        .service
        .list_trials(id, q.state, q.page_size, q.page_token.as_deref())
        .await?;
    Ok(Json(TrialList {
        trials: page.items,
        next_page_token: page.next_page_token,
    }))
}

/// One trial with its measurements.
#[utoipa::path(get, path = "/v1/studies/{study}/trials/{trial}", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The trial", body = Trial),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "A trial token for another trial", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
    ))]
pub async fn get_trial(
    State(state): State<AppState>,
    Path((study, trial)): Path<(String, String)>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    Ok(Json(state.service.get_trial(study, trial).await?))
}

/// Change a trial: exclude it from the optimizer (and from the best trial) without deleting
/// it, or include it again; set its note and tags (the study's creator or an admin); set or
/// remove its user attributes (also whoever may report to it). Fields left out stay.
#[utoipa::path(patch, path = "/v1/studies/{study}/trials/{trial}", tag = "trials", request_body = TrialUpdate,
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The trial", body = Trial),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn update_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
    ApiJson(req): ApiJson<TrialUpdate>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    let annotations = AnnotationUpdate {
        note: req.note,
        tags: req.tags,
        user_attrs: req.user_attrs,
    };
    if req.excluded.is_none() && annotations.is_empty() {
        return Err(ApiError::invalid(
            "excluded",
            "nothing to change: give excluded, note, tags or user_attrs",
        ));
    }
    if !annotations.is_empty() {
        state
            .service
            .annotate_trial(&actor, study, trial, annotations)
            .await?;
    }
    if let Some(excluded) = req.excluded {
        state
            .service
            .set_excluded(&actor, study, trial, excluded)
            .await?;
    }
    Ok(Json(state.service.get_trial(study, trial).await?))
}

/// Run a failed trial again: it becomes `requested` with the same parameters, and the next
/// suggestion (or the study's dispatcher, in the same directories) takes it.
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/retry", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The trial, requested again", body = Trial),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not the study's creator nor an admin", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 409, description = "The trial did not fail, the study failed (resume it first) or was stopped, or parallel_trials trials run already", body = ErrorBody),
    ))]
pub async fn retry_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    Ok(Json(state.service.retry_trial(&actor, study, trial).await?))
}

/// Report an intermediate measurement of a running trial (renews its lease).
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/measurements", tag = "trials",
    request_body = MeasurementRequest,
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The trial with the new measurement", body = Trial),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator, an admin, nor this trial's own token", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 409, description = "The trial is not running", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn add_measurement(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
    ApiJson(req): ApiJson<MeasurementRequest>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    let measurement = Measurement {
        step: Step::try_from(req.step)?.get(),
        elapsed_secs: req.elapsed_secs,
        metrics: req.metrics,
    };
    Ok(Json(
        state
            .service
            .add_measurement(&actor, study, trial, measurement)
            .await?,
    ))
}

/// Complete a trial with metrics, as infeasible, or from its measurements.
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/complete", tag = "trials",
    request_body(content = CompleteRequest, description = "May be empty"),
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The finished trial", body = Trial),
        (status = 400, description = "A field is wrong (an infeasible_reason over 4096 bytes), or no measurement to select", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator, an admin, nor this trial's own token", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 409, description = "The trial already finished", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn complete_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
    ApiJson(req): ApiJson<CompleteRequest>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    if !req.measurements.is_empty() && (req.metrics.is_some() || req.infeasible_reason.is_some()) {
        return Err(ApiError::invalid(
            "measurements",
            "send measurements only to have the final one chosen from them (without metrics \
             or infeasible_reason)",
        ));
    }
    let mut last = Vec::with_capacity(req.measurements.len());
    for m in req.measurements {
        last.push(Measurement {
            step: Step::try_from(m.step)?.get(),
            elapsed_secs: m.elapsed_secs,
            metrics: m.metrics,
        });
    }
    let outcome = match (req.metrics, req.infeasible_reason) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "infeasible_reason",
                "send either metrics or infeasible_reason, not both",
            ));
        }
        (Some(metrics), None) => Completion::Metrics {
            metrics,
            step: req.step.map(Step::try_from).transpose()?,
        },
        (None, Some(reason)) => Completion::Infeasible(reason),
        (None, None) => Completion::Selected(last),
    };
    Ok(Json(
        state
            .service
            .complete_trial(&actor, study, trial, outcome)
            .await?,
    ))
}

/// Mark a trial failed.
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/fail", tag = "trials",
    request_body(content = FailRequest, description = "May be empty"),
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The failed trial", body = Trial),
        (status = 400, description = "A field is wrong (a reason over 4096 bytes)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator, an admin, nor this trial's own token", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 409, description = "The trial already finished", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn fail_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
    ApiJson(req): ApiJson<FailRequest>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    let reason = req
        .reason
        .unwrap_or_else(|| "failed (no reason given)".to_string());
    Ok(Json(
        state
            .service
            .fail_trial(&actor, study, trial, reason)
            .await?,
    ))
}

/// Extend a running trial's lease.
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/heartbeat", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The trial with its new lease", body = Trial),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator, an admin, nor this trial's own token", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 409, description = "The trial is not running", body = ErrorBody),
    ))]
pub async fn heartbeat_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    Ok(Json(state.service.heartbeat(&actor, study, trial).await?))
}

/// PBT: the trial's worker has copied its parent's checkpoint (`lineage.copying_from`) into
/// the trial's own checkpoint; the parent may train on. For a pool's workers and ask/tell
/// clients (the server's dispatcher records its own copies); a completion ends the wait too.
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/checkpoint_copied", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The trial, no longer copying", body = Trial),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator, an admin, nor this trial's own token", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
    ))]
pub async fn checkpoint_copied(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
) -> ApiResult<Json<Trial>> {
    let (study, trial) = ids(&study, &trial)?;
    Ok(Json(
        state
            .service
            .report_checkpoint_copied(&actor, study, trial)
            .await?,
    ))
}

/// The early-stopping rule's verdict on this trial, changing nothing (true for a trial
/// already stopping). A worker acting on the verdict sends POST.
#[utoipa::path(get, path = "/v1/studies/{study}/trials/{trial}/should_stop", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The verdict; nothing changes", body = ShouldStopResponse),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "A trial token for another trial", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
    ))]
pub async fn stop_verdict(
    State(state): State<AppState>,
    Path((study, trial)): Path<(String, String)>,
) -> ApiResult<Json<ShouldStopResponse>> {
    let (study, trial) = ids(&study, &trial)?;
    Ok(Json(ShouldStopResponse {
        should_stop: state.service.stop_verdict(study, trial).await?,
    }))
}

/// Ask the study's early-stopping rule whether this trial should stop now, and act on it: a
/// trial told to stop moves to `stopping` (finish it with `complete`).
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/should_stop", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 200, description = "The verdict; a stopped trial moves to `stopping`", body = ShouldStopResponse),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator, an admin, nor this trial's own token", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
    ))]
pub async fn should_stop(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
) -> ApiResult<Json<ShouldStopResponse>> {
    let (study, trial) = ids(&study, &trial)?;
    Ok(Json(ShouldStopResponse {
        should_stop: state.service.ask_should_stop(&actor, study, trial).await?,
    }))
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrialTokenRequest {
    /// The `client_id` the trial was suggested to: only its holder gets a token.
    pub client_id: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TrialTokenResponse {
    /// A token that may only read and report to this trial (its measurements, complete,
    /// fail, heartbeat, should_stop). It replaces the trial's earlier token and stops working
    /// when the trial finishes or its lease runs out. Shown once.
    pub token: String,
}

/// A token for a pulled trial's own process, so that it reports with a token that can do
/// nothing else, not its worker's (`augur worker` asks for one per launch and hands it to
/// the trial as `AUGUR_TRIAL_TOKEN`).
#[utoipa::path(post, path = "/v1/studies/{study}/trials/{trial}/token", tag = "trials",
    request_body = TrialTokenRequest,
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 201, description = "The trial's new token", body = TrialTokenResponse),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Neither the study's creator nor an admin, or the trial is not held by this client_id", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 409, description = "The trial is not running", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn issue_trial_token(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
    ApiJson(req): ApiJson<TrialTokenRequest>,
) -> ApiResult<(StatusCode, Json<TrialTokenResponse>)> {
    let (study, trial) = ids(&study, &trial)?;
    let client_id = crate::model::ClientId::try_from(req.client_id)?;
    let token = state
        .service
        .issue_trial_token(&actor, study, trial, client_id.as_str())
        .await?;
    Ok((StatusCode::CREATED, Json(TrialTokenResponse { token })))
}
