//! The dashboard's chart data under `/v1/studies/{study}/…`: thin handlers over
//! `crate::insights::charts`, which reads through the service and bounds every answer.

use super::access::{Access, AccessRouter};
use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::routes;

use super::AppState;
use super::error::{ApiResult, ErrorBody};
use super::extract::{ApiQuery, STUDY_ID, parse_id};
use crate::insights::charts::{self, Contour, LearningCurves, StudyInsights, TrialTable};
use crate::model::Role;

pub fn router() -> AccessRouter {
    let read = Access::Role(Role::Reader);
    AccessRouter::new()
        .routes(read, routes!(trial_table))
        .routes(read, routes!(study_insights))
        .routes(read, routes!(contour))
        .routes(read, routes!(learning_curves))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MetricQuery {
    /// The metric to chart; the study's first when absent.
    metric: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ContourQuery {
    /// Parameter on the x axis.
    x: String,
    /// Parameter on the y axis.
    y: String,
    /// The metric; the study's first when absent.
    metric: Option<String>,
}

/// Every trial of the study as columns, and a cursor for live updates.
#[utoipa::path(get, path = "/v1/studies/{study}/table", tag = "dashboard",
    params(("study" = String, Path, description = STUDY_ID)),
    responses(
        (status = 200, description = "The trial table", body = TrialTable),
        (status = 400, description = "The study id is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn trial_table(
    State(state): State<AppState>,
    Path(study): Path<String>,
) -> ApiResult<Json<TrialTable>> {
    let id = parse_id(&study, "study")?;
    Ok(Json(charts::trial_table(&state.service, id).await?))
}

/// Chart data for the study page, aggregated here: best-so-far history, parameter
/// importance, a bounded sample for parallel coordinates and slices, a Pareto front.
#[utoipa::path(get, path = "/v1/studies/{study}/insights", tag = "dashboard",
    params(("study" = String, Path, description = STUDY_ID), MetricQuery),
    responses(
        (status = 200, description = "Chart data", body = StudyInsights),
        (status = 400, description = "The study id or metric is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn study_insights(
    State(state): State<AppState>,
    Path(study): Path<String>,
    ApiQuery(q): ApiQuery<MetricQuery>,
) -> ApiResult<Json<StudyInsights>> {
    let id = parse_id(&study, "study")?;
    let insights = charts::study_insights(&state.service, id, q.metric.as_deref()).await?;
    Ok(Json(insights))
}

/// Mean objective over a grid of two parameters, for a contour plot.
#[utoipa::path(get, path = "/v1/studies/{study}/contour", tag = "dashboard",
    params(("study" = String, Path, description = STUDY_ID), ContourQuery),
    responses(
        (status = 200, description = "The grid", body = Contour),
        (status = 400, description = "A parameter or metric is unknown", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn contour(
    State(state): State<AppState>,
    Path(study): Path<String>,
    ApiQuery(q): ApiQuery<ContourQuery>,
) -> ApiResult<Json<Contour>> {
    let id = parse_id(&study, "study")?;
    let grid = charts::contour(&state.service, id, &q.x, &q.y, q.metric.as_deref()).await?;
    Ok(Json(grid))
}

/// Intermediate values (learning curves) of a bounded set of trials: the latest, the best
/// and some early-stopped ones.
#[utoipa::path(get, path = "/v1/studies/{study}/curves", tag = "dashboard",
    params(("study" = String, Path, description = STUDY_ID), MetricQuery),
    responses(
        (status = 200, description = "Learning curves", body = LearningCurves),
        (status = 400, description = "The study id or metric is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such study", body = ErrorBody),
    ))]
pub async fn learning_curves(
    State(state): State<AppState>,
    Path(study): Path<String>,
    ApiQuery(q): ApiQuery<MetricQuery>,
) -> ApiResult<Json<LearningCurves>> {
    let id = parse_id(&study, "study")?;
    let curves = charts::learning_curves(&state.service, id, q.metric.as_deref()).await?;
    Ok(Json(curves))
}
