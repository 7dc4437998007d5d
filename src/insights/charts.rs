//! Chart data for the study page, read through the service and aggregated here so the
//! browser never receives more than a bounded number of points per chart: the trial table as
//! columns (one request for 50,000 rows), best-so-far history, importance, a sample for
//! parallel coordinates and slices, a Pareto front, contour grids and learning curves.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Grid, Importance, MAX_CHART_POINTS, ParallelAxis, ParamAxis};
use crate::model::spec::MetricGoal;
use crate::model::{StudyId, TrialId, TrialPoint, TrialState, spec::StudySpec};
use crate::service::{
    InternalError, Service, ServiceError, ServiceResult, StudySnapshot, cursor_after_seq,
};

/// Learning curves shown at most, and points per curve.
const MAX_CURVES: usize = 200;
const MAX_CURVE_POINTS: usize = 300;

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
    #[schema(value_type = Vec<i64>)]
    pub ids: Vec<TrialId>,
    pub states: Vec<TrialState>,
    /// Ids of the trials stopped early by the stopping rule.
    #[schema(value_type = Vec<i64>)]
    pub early_stopped: Vec<TrialId>,
    /// Final value of each metric (null when the trial has none).
    pub values: BTreeMap<String, Vec<Option<f64>>>,
    /// Each parameter's value (null when inactive).
    #[schema(value_type = BTreeMap<String, Vec<serde_json::Value>>)]
    pub params: BTreeMap<String, Vec<Option<augur_optimizer::Value>>>,
    /// Each user attribute any trial has, by name: its value per trial (null when unset).
    pub user_attrs: BTreeMap<String, Vec<Option<serde_json::Value>>>,
    /// Each trial's tags.
    pub tags: Vec<Vec<String>>,
    /// Each trial's note (null when none).
    pub notes: Vec<Option<String>>,
    /// Multi-fidelity studies: each trial's latest budget (null: the full budget); absent
    /// when no trial has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Vec<Option<f64>>>,
}

/// Every trial of the study as columns, and a cursor for live updates.
pub async fn trial_table(service: &Service, study_id: StudyId) -> ServiceResult<TrialTable> {
    let snapshot = service.study_snapshot(study_id).await?;
    let trials = &snapshot.trials;
    // The study's change counter is read before the trials: every change after it comes
    // back from `changes`, some maybe twice, which the dashboard's merge by id absorbs.
    let cursor = cursor_after_seq(snapshot.change_seq);
    let metrics = metric_infos(&snapshot.spec);
    let parameters = super::flatten_parameters(&snapshot.spec.parameters);
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
    let mut annotations = service.trial_annotations(study_id).await?;
    let names: std::collections::BTreeSet<String> = annotations
        .values()
        .flat_map(|a| a.user_attrs.keys().cloned())
        .collect();
    let mut user_attrs: BTreeMap<String, Vec<Option<serde_json::Value>>> = names
        .into_iter()
        .map(|name| (name, Vec::with_capacity(n)))
        .collect();
    let mut tags = Vec::with_capacity(n);
    let mut notes = Vec::with_capacity(n);
    for t in trials.iter() {
        let mut a = annotations.remove(&t.id).unwrap_or_default();
        for (name, column) in &mut user_attrs {
            column.push(a.user_attrs.remove(name));
        }
        tags.push(a.tags);
        notes.push(a.note);
    }
    Ok(TrialTable {
        user_attrs,
        tags,
        notes,
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
        budgets: trials
            .iter()
            .any(|t| t.budget.is_some())
            .then(|| trials.iter().map(|t| t.budget).collect()),
    })
}

/// A trial and its value.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrialValue {
    #[schema(value_type = i64)]
    pub trial: TrialId,
    pub value: f64,
}

/// Objective by trial (a bounded sample) and the best-so-far steps (every improvement).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct History {
    #[schema(value_type = Vec<i64>)]
    pub trial: Vec<TrialId>,
    pub value: Vec<f64>,
    #[schema(value_type = Vec<i64>)]
    pub best_trial: Vec<TrialId>,
    pub best_value: Vec<f64>,
    /// The last trial id, where the best-so-far line ends.
    #[schema(value_type = i64)]
    pub last_trial: TrialId,
    /// Fewer points than completed trials: a sample is shown.
    pub sampled: bool,
}

/// Completed trials, a bounded sample of them, for parallel coordinates and slice plots.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Sample {
    #[schema(value_type = Vec<i64>)]
    pub trial: Vec<TrialId>,
    pub value: Vec<f64>,
    /// Encoded parameter values (categories by index), null when inactive.
    pub params: BTreeMap<String, Vec<Option<f64>>>,
    /// The parallel coordinates' axes over these trials, one per parameter in spec order:
    /// inactive values on a tick of their own, so every trial is drawn.
    pub parallel: Vec<ParallelAxis>,
}

/// Two metrics against each other, and the Pareto front among them.
#[derive(Debug, Serialize, ToSchema)]
pub struct ParetoView {
    pub metrics: Vec<MetricInfo>,
    #[schema(value_type = Vec<i64>)]
    pub trial: Vec<TrialId>,
    pub x: Vec<f64>,
    pub y: Vec<f64>,
    /// The non-dominated trials, sorted along the first metric.
    #[schema(value_type = Vec<i64>)]
    pub front_trial: Vec<TrialId>,
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
pub async fn study_insights(
    service: &Service,
    study_id: StudyId,
    metric: Option<&str>,
) -> ServiceResult<StudyInsights> {
    let StudySnapshot { spec, trials, .. } = service.study_snapshot(study_id).await?;
    let metrics = metric_infos(&spec);
    let metric = pick_metric(&metrics, metric)?;
    let parameters = super::flatten_parameters(&spec.parameters);
    // Aggregation is CPU work over every trial: keep it off the async workers.
    tokio::task::spawn_blocking(move || {
        build_insights(metric, metrics, parameters, trials.as_slice())
    })
    .await
    .map_err(|e| InternalError::Task("insights", e).into())
}

fn build_insights(
    metric: MetricInfo,
    metrics: Vec<MetricInfo>,
    parameters: Vec<ParamAxis>,
    trials: &[TrialPoint],
) -> StudyInsights {
    let maximize = metric.goal == MetricGoal::Maximize;
    let scored = scored_trials(trials, &metric.id);
    let points: Vec<(TrialId, f64)> = scored.iter().map(|(t, v)| (t.id, *v)).collect();
    let values: Vec<f64> = points.iter().map(|p| p.1).collect();
    let best_steps = super::best_so_far(&points, maximize);
    let mut keep: Vec<usize> = super::top_k(&values, 50, maximize);
    // The improvements are what the eye follows: always drawn.
    let mut j = 0;
    for (i, p) in points.iter().enumerate() {
        if j < best_steps.len() && best_steps[j].0 == p.0 {
            keep.push(i);
            j += 1;
        }
    }
    let chosen = super::sample_indices(points.len(), MAX_CHART_POINTS, &keep);
    let history = History {
        trial: chosen.iter().map(|&i| points[i].0).collect(),
        value: chosen.iter().map(|&i| points[i].1).collect(),
        best_trial: best_steps.iter().map(|p| p.0).collect(),
        best_value: best_steps.iter().map(|p| p.1).collect(),
        last_trial: trials.iter().map(|t| t.id).max().unwrap_or_default(),
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
    let mut importance = super::ped_anova(&parameters, &columns, &values, maximize);
    importance.sort_by(|a, b| b.importance.total_cmp(&a.importance));
    let sampled: Vec<Vec<Option<f64>>> = columns
        .iter()
        .map(|c| chosen.iter().map(|&i| c[i]).collect())
        .collect();
    let sample = Sample {
        trial: chosen.iter().map(|&i| points[i].0).collect(),
        value: chosen.iter().map(|&i| points[i].1).collect(),
        parallel: parameters
            .iter()
            .zip(&sampled)
            .map(|(a, c)| super::parallel_axis(a, c))
            .collect(),
        params: parameters
            .iter()
            .map(|a| a.id.clone())
            .zip(sampled)
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
    let rows: Vec<(TrialId, f64, f64)> = trials
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
    let front = super::pareto_front_2d(&xs, &ys, goals);
    let chosen = super::sample_indices(rows.len(), MAX_CHART_POINTS, &front);
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
pub async fn contour(
    service: &Service,
    study_id: StudyId,
    x: &str,
    y: &str,
    metric: Option<&str>,
) -> ServiceResult<Contour> {
    let StudySnapshot { spec, trials, .. } = service.study_snapshot(study_id).await?;
    let metrics = metric_infos(&spec);
    let metric = pick_metric(&metrics, metric)?;
    let parameters = super::flatten_parameters(&spec.parameters);
    let axis = |id: &str, field: &str| {
        parameters
            .iter()
            .find(|p| p.id == id)
            .cloned()
            .ok_or_else(|| {
                ServiceError::invalid(field, format!("no parameter {id:?} in this study"))
            })
    };
    let (x_axis, y_axis) = (axis(x, "x")?, axis(y, "y")?);
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
    let grid = super::contour_grid(&x_axis, &y_axis, &xs, &ys, &values);
    let both: Vec<(f64, f64)> = xs
        .iter()
        .zip(&ys)
        .filter_map(|(x, y)| Some(((*x)?, (*y)?)))
        .collect();
    let chosen = super::sample_indices(both.len(), MAX_CHART_POINTS, &[]);
    Ok(Contour {
        metric,
        x_axis,
        y_axis,
        grid,
        points_x: chosen.iter().map(|&i| both[i].0).collect(),
        points_y: chosen.iter().map(|&i| both[i].1).collect(),
    })
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Curve {
    #[schema(value_type = i64)]
    pub trial: TrialId,
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
    /// Multi-fidelity studies: the budgets attempts run at (the steps of the rung chart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rungs: Option<Vec<f64>>,
}

/// Intermediate values (learning curves) of a bounded set of trials: the latest, the best
/// and some early-stopped ones.
pub async fn learning_curves(
    service: &Service,
    study_id: StudyId,
    metric: Option<&str>,
) -> ServiceResult<LearningCurves> {
    let StudySnapshot { spec, trials, .. } = service.study_snapshot(study_id).await?;
    let metrics = metric_infos(&spec);
    let metric = pick_metric(&metrics, metric)?;
    let last = trials.last().map_or(TrialId::new(0), |t| t.id);
    // One range read for the latest trials, one read each for a few best and early-stopped
    // ones further back: the cost stays bounded however large the study is.
    let first_recent = TrialId::new((last.get() - 150).max(1));
    let mut rows = service
        .trial_measurements(study_id, first_recent, last)
        .await?;
    let scored = scored_trials(&trials, &metric.id);
    let values: Vec<f64> = scored.iter().map(|s| s.1).collect();
    let maximize = metric.goal == MetricGoal::Maximize;
    let mut extra: Vec<TrialId> = super::top_k(&values, 10, maximize)
        .into_iter()
        .map(|i| scored[i].0.id)
        .collect();
    let stopped: Vec<TrialId> = trials
        .iter()
        .filter(|t| t.early_stopped)
        .map(|t| t.id)
        .collect();
    extra.extend(
        super::sample_indices(stopped.len(), 30, &[])
            .into_iter()
            .map(|i| stopped[i]),
    );
    extra.retain(|&id| id < first_recent);
    extra.sort_unstable();
    extra.dedup();
    for id in extra {
        rows.extend(service.trial_measurements(study_id, id, id).await?);
    }
    let mut by_trial: BTreeMap<TrialId, (Vec<i64>, Vec<f64>)> = BTreeMap::new();
    for (trial, m) in rows {
        if let Some(v) = m.metrics.get(&metric.id) {
            let e = by_trial.entry(trial).or_default();
            e.0.push(m.step);
            e.1.push(*v);
        }
    }
    let info: BTreeMap<TrialId, &TrialPoint> = trials.iter().map(|t| (t.id, t)).collect();
    let trials_with_curves = by_trial.len();
    let mut curves: Vec<Curve> = by_trial
        .into_iter()
        .rev()
        .take(MAX_CURVES)
        .filter_map(|(trial, (step, value))| {
            let t = info.get(&trial)?;
            let keep = super::sample_indices(step.len(), MAX_CURVE_POINTS, &[step.len() - 1]);
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
    Ok(LearningCurves {
        metric,
        curves,
        trials_with_curves,
        rungs: spec.validate().ok().and_then(|config| config.rungs()),
    })
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

fn pick_metric(metrics: &[MetricInfo], wanted: Option<&str>) -> ServiceResult<MetricInfo> {
    match wanted {
        None => metrics
            .first()
            .cloned()
            .ok_or_else(|| InternalError::bug("a study without metrics").into()),
        Some(id) => metrics.iter().find(|m| m.id == id).cloned().ok_or_else(|| {
            ServiceError::invalid("metric", format!("no metric {id:?} in this study"))
        }),
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
