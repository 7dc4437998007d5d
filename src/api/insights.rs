//! JSON for the dashboard under `/v1/studies/{study}/…`: the trial table as columns (one
//! request for 50,000 rows), and chart data aggregated on the server (`crate::insights`)
//! so the browser never receives more than a bounded number of points per chart.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiQuery, parse_id};
use crate::insights::{self, Grid, Importance, MAX_CHART_POINTS, ParamAxis};
use crate::model::spec::MetricGoal;
use crate::model::{TrialState, spec::StudySpec};
use crate::store::{Store, StudyRecord, TrialPoint};

/// Learning curves shown at most, and points per curve.
const MAX_CURVES: usize = 200;
const MAX_CURVE_POINTS: usize = 300;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(trial_table))
        .routes(routes!(study_insights))
        .routes(routes!(contour))
        .routes(routes!(learning_curves))
}

const STUDY_ID: &str = "study id (a positive integer)";

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricInfo {
    pub id: String,
    pub goal: MetricGoal,
}

/// Every trial of a study as columns: row `i` of each column is trial `ids[i]`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrialTable {
    /// Pass as `after` to `GET /v1/studies/{study}/changes` to get what changed since.
    pub cursor: String,
    pub metrics: Vec<MetricInfo>,
    pub parameters: Vec<ParamAxis>,
    pub ids: Vec<i64>,
    pub states: Vec<TrialState>,
    /// Ids of the trials stopped early by the stopping rule.
    pub early_stopped: Vec<i64>,
    /// Final value of each metric (null when the trial has none).
    pub values: BTreeMap<String, Vec<Option<f64>>>,
    /// Each parameter's value (null when inactive).
    #[schema(value_type = BTreeMap<String, Vec<serde_json::Value>>)]
    pub params: BTreeMap<String, Vec<Option<augur_optimizer::Value>>>,
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
    let (record, trials) = load(&state, &study).await?;
    // The study's change counter is read before the trials: every change after it comes
    // back from `changes`, some maybe twice, which the dashboard's merge by id absorbs.
    let cursor = crate::service::cursor_after_seq(record.change_seq);
    let metrics = metric_infos(&record.spec);
    let parameters = insights::flatten_parameters(&record.spec.parameters);
    let n = trials.len();
    let mut values: BTreeMap<String, Vec<Option<f64>>> = metrics
        .iter()
        .map(|m| (m.id.clone(), Vec::with_capacity(n)))
        .collect();
    let mut params: BTreeMap<String, Vec<Option<augur_optimizer::Value>>> = parameters
        .iter()
        .map(|p| (p.id.clone(), Vec::with_capacity(n)))
        .collect();
    for t in trials.iter() {
        for (id, column) in &mut values {
            column.push(t.final_metrics.as_ref().and_then(|m| m.get(id).copied()));
        }
        for (id, column) in &mut params {
            column.push(t.parameters.get(id).cloned());
        }
    }
    Ok(Json(TrialTable {
        cursor,
        metrics,
        parameters,
        ids: trials.iter().map(|t| t.id).collect(),
        states: trials.iter().map(|t| t.state).collect(),
        early_stopped: trials
            .iter()
            .filter(|t| t.early_stopped)
            .map(|t| t.id)
            .collect(),
        values,
        params,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MetricQuery {
    /// The metric to chart; the study's first when absent.
    metric: Option<String>,
}

/// A trial and its value.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrialValue {
    pub trial: i64,
    pub value: f64,
}

/// Objective by trial (a bounded sample) and the best-so-far steps (every improvement).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct History {
    pub trial: Vec<i64>,
    pub value: Vec<f64>,
    pub best_trial: Vec<i64>,
    pub best_value: Vec<f64>,
    /// The last trial id, where the best-so-far line ends.
    pub last_trial: i64,
    /// Fewer points than completed trials: a sample is shown.
    pub sampled: bool,
}

/// Completed trials, a bounded sample of them, for parallel coordinates and slice plots.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Sample {
    pub trial: Vec<i64>,
    pub value: Vec<f64>,
    /// Encoded parameter values (categories by index), null when inactive.
    pub params: BTreeMap<String, Vec<Option<f64>>>,
}

/// Two metrics against each other, and the Pareto front among them.
#[derive(Debug, Serialize, ToSchema)]
pub struct ParetoView {
    pub metrics: Vec<MetricInfo>,
    pub trial: Vec<i64>,
    pub x: Vec<f64>,
    pub y: Vec<f64>,
    /// The non-dominated trials, sorted along the first metric.
    pub front_trial: Vec<i64>,
    pub front_x: Vec<f64>,
    pub front_y: Vec<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StudyInsights {
    pub metric: MetricInfo,
    pub metrics: Vec<MetricInfo>,
    pub parameters: Vec<ParamAxis>,
    /// Completed, not excluded trials that report this metric.
    pub completed: usize,
    pub best: Option<TrialValue>,
    pub history: History,
    /// PED-ANOVA importance of each parameter for this metric, largest first.
    pub importance: Vec<Importance>,
    pub sample: Sample,
    /// Present for studies with two or more metrics (the first two).
    pub pareto: Option<ParetoView>,
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
    let (record, trials) = load(&state, &study).await?;
    let metrics = metric_infos(&record.spec);
    let metric = pick_metric(&metrics, q.metric.as_deref())?;
    let parameters = insights::flatten_parameters(&record.spec.parameters);
    // Aggregation is CPU work over every trial: keep it off the async workers.
    let out = tokio::task::spawn_blocking(move || {
        build_insights(metric, metrics, parameters, trials.as_slice())
    })
    .await
    .map_err(|e| ApiError::Internal(format!("insights task: {e}")))?;
    Ok(Json(out))
}

fn build_insights(
    metric: MetricInfo,
    metrics: Vec<MetricInfo>,
    parameters: Vec<ParamAxis>,
    trials: &[TrialPoint],
) -> StudyInsights {
    let maximize = metric.goal == MetricGoal::Maximize;
    let scored = scored_trials(trials, &metric.id);
    let points: Vec<(i64, f64)> = scored.iter().map(|(t, v)| (t.id, *v)).collect();
    let values: Vec<f64> = points.iter().map(|p| p.1).collect();
    let best_steps = insights::best_so_far(&points, maximize);
    let mut keep: Vec<usize> = insights::top_k(&values, 50, maximize);
    // The improvements are what the eye follows: always drawn.
    let mut j = 0;
    for (i, p) in points.iter().enumerate() {
        if j < best_steps.len() && best_steps[j].0 == p.0 {
            keep.push(i);
            j += 1;
        }
    }
    let chosen = insights::sample_indices(points.len(), MAX_CHART_POINTS, &keep);
    let history = History {
        trial: chosen.iter().map(|&i| points[i].0).collect(),
        value: chosen.iter().map(|&i| points[i].1).collect(),
        best_trial: best_steps.iter().map(|p| p.0).collect(),
        best_value: best_steps.iter().map(|p| p.1).collect(),
        last_trial: trials.iter().map(|t| t.id).max().unwrap_or(0),
        sampled: chosen.len() < points.len(),
    };
    let columns: Vec<Vec<Option<f64>>> = parameters
        .iter()
        .map(|a| {
            scored
                .iter()
                .map(|(t, _)| a.encode(t.parameters.get(&a.id)))
                .collect()
        })
        .collect();
    let mut importance = insights::ped_anova(&parameters, &columns, &values, maximize);
    importance.sort_by(|a, b| b.importance.total_cmp(&a.importance));
    let sample = Sample {
        trial: chosen.iter().map(|&i| points[i].0).collect(),
        value: chosen.iter().map(|&i| points[i].1).collect(),
        params: parameters
            .iter()
            .zip(&columns)
            .map(|(a, c)| (a.id.clone(), chosen.iter().map(|&i| c[i]).collect()))
            .collect(),
    };
    let best = best_steps
        .last()
        .map(|&(trial, value)| TrialValue { trial, value });
    let pareto = (metrics.len() >= 2).then(|| pareto_view(&metrics[..2], trials));
    StudyInsights {
        metric,
        metrics,
        parameters,
        completed: points.len(),
        best,
        history,
        importance,
        sample,
        pareto,
    }
}

fn pareto_view(metrics: &[MetricInfo], trials: &[TrialPoint]) -> ParetoView {
    let rows: Vec<(i64, f64, f64)> = trials
        .iter()
        .filter(|t| t.state == TrialState::Completed && !t.excluded)
        .filter_map(|t| {
            let m = t.final_metrics.as_ref()?;
            Some((t.id, *m.get(&metrics[0].id)?, *m.get(&metrics[1].id)?))
        })
        .collect();
    let xs: Vec<f64> = rows.iter().map(|r| r.1).collect();
    let ys: Vec<f64> = rows.iter().map(|r| r.2).collect();
    let goals = (
        metrics[0].goal == MetricGoal::Maximize,
        metrics[1].goal == MetricGoal::Maximize,
    );
    let front = insights::pareto_front_2d(&xs, &ys, goals);
    let chosen = insights::sample_indices(rows.len(), MAX_CHART_POINTS, &front);
    ParetoView {
        metrics: metrics.to_vec(),
        trial: chosen.iter().map(|&i| rows[i].0).collect(),
        x: chosen.iter().map(|&i| xs[i]).collect(),
        y: chosen.iter().map(|&i| ys[i]).collect(),
        front_trial: front.iter().map(|&i| rows[i].0).collect(),
        front_x: front.iter().map(|&i| xs[i]).collect(),
        front_y: front.iter().map(|&i| ys[i]).collect(),
    }
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

#[derive(Debug, Serialize, ToSchema)]
pub struct Contour {
    pub metric: MetricInfo,
    pub x_axis: ParamAxis,
    pub y_axis: ParamAxis,
    /// Mean objective per cell.
    pub grid: Grid,
    /// A bounded sample of the trials behind it, as encoded values.
    pub points_x: Vec<f64>,
    pub points_y: Vec<f64>,
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
    let (record, trials) = load(&state, &study).await?;
    let metrics = metric_infos(&record.spec);
    let metric = pick_metric(&metrics, q.metric.as_deref())?;
    let parameters = insights::flatten_parameters(&record.spec.parameters);
    let axis = |id: &str, field: &str| {
        parameters
            .iter()
            .find(|p| p.id == id)
            .cloned()
            .ok_or_else(|| ApiError::invalid(field, format!("no parameter {id:?} in this study")))
    };
    let (x_axis, y_axis) = (axis(&q.x, "x")?, axis(&q.y, "y")?);
    let scored = scored_trials(&trials, &metric.id);
    let xs: Vec<Option<f64>> = scored
        .iter()
        .map(|(t, _)| x_axis.encode(t.parameters.get(&x_axis.id)))
        .collect();
    let ys: Vec<Option<f64>> = scored
        .iter()
        .map(|(t, _)| y_axis.encode(t.parameters.get(&y_axis.id)))
        .collect();
    let values: Vec<f64> = scored.iter().map(|s| s.1).collect();
    let grid = insights::contour_grid(&x_axis, &y_axis, &xs, &ys, &values);
    let both: Vec<(f64, f64)> = xs
        .iter()
        .zip(&ys)
        .filter_map(|(x, y)| Some(((*x)?, (*y)?)))
        .collect();
    let chosen = insights::sample_indices(both.len(), MAX_CHART_POINTS, &[]);
    Ok(Json(Contour {
        metric,
        x_axis,
        y_axis,
        grid,
        points_x: chosen.iter().map(|&i| both[i].0).collect(),
        points_y: chosen.iter().map(|&i| both[i].1).collect(),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Curve {
    pub trial: i64,
    pub state: TrialState,
    pub early_stopped: bool,
    pub step: Vec<i64>,
    pub value: Vec<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LearningCurves {
    pub metric: MetricInfo,
    /// The most recent trials, the best ones and early-stopped ones, at most 200.
    pub curves: Vec<Curve>,
    /// Trials with measurements of this metric, shown or not, among those read.
    pub trials_with_curves: usize,
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
    let (record, trials) = load(&state, &study).await?;
    let metrics = metric_infos(&record.spec);
    let metric = pick_metric(&metrics, q.metric.as_deref())?;
    let store = state.service.store();
    let last = trials.last().map_or(0, |t| t.id);
    // One range read for the latest trials, one read each for a few best and early-stopped
    // ones further back: the cost stays bounded however large the study is.
    let first_recent = (last - 150).max(1);
    let mut rows = store
        .measurements(record.id, first_recent, last)
        .await
        .map_err(internal)?;
    let scored = scored_trials(&trials, &metric.id);
    let values: Vec<f64> = scored.iter().map(|s| s.1).collect();
    let maximize = metric.goal == MetricGoal::Maximize;
    let mut extra: Vec<i64> = insights::top_k(&values, 10, maximize)
        .into_iter()
        .map(|i| scored[i].0.id)
        .collect();
    let stopped: Vec<i64> = trials
        .iter()
        .filter(|t| t.early_stopped)
        .map(|t| t.id)
        .collect();
    extra.extend(
        insights::sample_indices(stopped.len(), 30, &[])
            .into_iter()
            .map(|i| stopped[i]),
    );
    extra.retain(|&id| id < first_recent);
    extra.sort_unstable();
    extra.dedup();
    for id in extra {
        rows.extend(
            store
                .measurements(record.id, id, id)
                .await
                .map_err(internal)?,
        );
    }
    let mut by_trial: BTreeMap<i64, (Vec<i64>, Vec<f64>)> = BTreeMap::new();
    for (trial, m) in rows {
        if let Some(v) = m.metrics.get(&metric.id) {
            let e = by_trial.entry(trial).or_default();
            e.0.push(m.step);
            e.1.push(*v);
        }
    }
    let info: BTreeMap<i64, &TrialPoint> = trials.iter().map(|t| (t.id, t)).collect();
    let trials_with_curves = by_trial.len();
    let mut curves: Vec<Curve> = by_trial
        .into_iter()
        .rev()
        .take(MAX_CURVES)
        .filter_map(|(trial, (step, value))| {
            let t = info.get(&trial)?;
            let keep = insights::sample_indices(step.len(), MAX_CURVE_POINTS, &[step.len() - 1]);
            Some(Curve {
                trial,
                state: t.state,
                early_stopped: t.early_stopped,
                step: keep.iter().map(|&i| step[i]).collect(),
                value: keep.iter().map(|&i| value[i]).collect(),
            })
        })
        .collect();
    curves.reverse();
    Ok(Json(LearningCurves {
        metric,
        curves,
        trials_with_curves,
    }))
}

/// The trials of recently viewed studies, as of a study's `change_seq`: a cache, never the
/// truth. A request whose study has moved on reads only the trials changed since (the same
/// cursor as `changes`), so a live dashboard costs O(changes) per refresh, and concurrent
/// requests for one study wait for a single load instead of each reading 50,000 rows.
#[derive(Clone, Default)]
pub struct Snapshots {
    studies: Arc<Mutex<HashMap<i64, SnapshotSlot>>>,
}

/// One study's snapshot; its lock makes concurrent requests wait for a single load.
type SnapshotSlot = Arc<tokio::sync::Mutex<Option<Snapshot>>>;

struct Snapshot {
    /// Tells a study apart from a later one that reuses its id.
    created_at: chrono::DateTime<chrono::Utc>,
    change_seq: i64,
    trials: Arc<Vec<TrialPoint>>,
    used: std::time::Instant,
}

/// Studies kept in the cache; the least recently used goes first.
const CACHED_STUDIES: usize = 8;
/// More changes than this since the snapshot: read everything again instead.
const MAX_INCREMENT: i64 = 10_000;

impl Snapshots {
    fn slot(&self, study: i64) -> ApiResult<SnapshotSlot> {
        let mut map = self
            .studies
            .lock()
            .map_err(|_| ApiError::Internal("snapshot cache poisoned".into()))?;
        if !map.contains_key(&study) && map.len() >= CACHED_STUDIES {
            // Evict the least recently used study that nobody is loading right now.
            let oldest = map
                .iter()
                .filter_map(|(id, slot)| Some((*id, slot.try_lock().ok()?.as_ref()?.used)))
                .min_by_key(|(_, used)| *used)
                .map(|(id, _)| id);
            if let Some(id) = oldest {
                map.remove(&id);
            }
        }
        Ok(map.entry(study).or_default().clone())
    }

    /// The study and all its trials (by id), as of at least the study's current change.
    async fn load(
        &self,
        store: &Arc<dyn Store>,
        study: i64,
    ) -> ApiResult<(StudyRecord, Arc<Vec<TrialPoint>>)> {
        let record = store
            .get_study(study)
            .await
            .map_err(internal)?
            .ok_or_else(|| ApiError::NotFound(format!("study {study} not found")))?;
        let slot = self.slot(study)?;
        let mut cached = slot.lock().await;
        let same_study = |s: &Snapshot| s.created_at == record.created_at;
        let trials = match cached.take() {
            Some(snap) if same_study(&snap) && snap.change_seq == record.change_seq => snap.trials,
            Some(snap) if same_study(&snap) && snap.change_seq < record.change_seq => {
                let changed = store
                    .trial_points(study, Some(snap.change_seq), MAX_INCREMENT + 1)
                    .await
                    .map_err(internal)?;
                if changed.len() as i64 > MAX_INCREMENT {
                    Arc::new(all_points(store, study).await?)
                } else {
                    Arc::new(merge_by_id(&snap.trials, changed))
                }
            }
            // None, or a snapshot from before the study was deleted and made again.
            _ => Arc::new(all_points(store, study).await?),
        };
        *cached = Some(Snapshot {
            created_at: record.created_at,
            change_seq: record.change_seq,
            trials: trials.clone(),
            used: std::time::Instant::now(),
        });
        Ok((record, trials))
    }
}

async fn all_points(store: &Arc<dyn Store>, study: i64) -> ApiResult<Vec<TrialPoint>> {
    store.trial_points(study, None, 0).await.map_err(internal)
}

/// `base` (sorted by id) with `changed` replacing or adding trials, still sorted by id.
fn merge_by_id(base: &[TrialPoint], mut changed: Vec<TrialPoint>) -> Vec<TrialPoint> {
    changed.sort_by_key(|t| t.id);
    changed.dedup_by_key(|t| t.id);
    let mut out = Vec::with_capacity(base.len() + changed.len());
    let mut next = changed.into_iter().peekable();
    for t in base {
        while next.peek().is_some_and(|c| c.id < t.id) {
            out.extend(next.next());
        }
        if next.peek().is_some_and(|c| c.id == t.id) {
            out.extend(next.next());
        } else {
            out.push(t.clone());
        }
    }
    out.extend(next);
    out
}

async fn load(state: &AppState, study: &str) -> ApiResult<(StudyRecord, Arc<Vec<TrialPoint>>)> {
    let id = parse_id(study, "study")?;
    state.snapshots.load(state.service.store(), id).await
}

fn internal(e: crate::store::StoreError) -> ApiError {
    ApiError::Internal(e.to_string())
}

fn metric_infos(spec: &StudySpec) -> Vec<MetricInfo> {
    spec.metrics
        .iter()
        .map(|m| MetricInfo {
            id: m.id.clone(),
            goal: m.goal,
        })
        .collect()
}

fn pick_metric(metrics: &[MetricInfo], wanted: Option<&str>) -> ApiResult<MetricInfo> {
    match wanted {
        None => metrics
            .first()
            .cloned()
            .ok_or_else(|| ApiError::Internal("a study without metrics".into())),
        Some(id) => {
            metrics.iter().find(|m| m.id == id).cloned().ok_or_else(|| {
                ApiError::invalid("metric", format!("no metric {id:?} in this study"))
            })
        }
    }
}

/// Completed, not excluded trials with a final value of `metric`, by id.
fn scored_trials<'a>(trials: &'a [TrialPoint], metric: &str) -> Vec<(&'a TrialPoint, f64)> {
    trials
        .iter()
        .filter(|t| t.state == TrialState::Completed && !t.excluded)
        .filter_map(|t| {
            let v = *t.final_metrics.as_ref()?.get(metric)?;
            v.is_finite().then_some((t, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(id: i64, state: TrialState) -> TrialPoint {
        TrialPoint {
            id,
            state,
            parameters: Default::default(),
            final_metrics: None,
            early_stopped: false,
            excluded: false,
        }
    }

    #[test]
    fn merging_changes_replaces_and_appends_by_id() {
        let base: Vec<TrialPoint> = (1..=4).map(|i| trial(i, TrialState::Active)).collect();
        let changed = vec![
            trial(6, TrialState::Requested),
            trial(2, TrialState::Completed),
            trial(5, TrialState::Active),
        ];
        let merged = merge_by_id(&base, changed);
        let ids: Vec<i64> = merged.iter().map(|t| t.id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5, 6]);
        assert_eq!(merged[1].state, TrialState::Completed);
        assert_eq!(merged[0].state, TrialState::Active);
    }
}
