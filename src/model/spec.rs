//! The study spec (DESIGN §2) as users write it in JSON or YAML, and its validation into a
//! [`StudyConfig`] that the service and optimizer use. Every rejection names its field.

use std::collections::{BTreeMap, BTreeSet};

use augur_optimizer::stopping::{EarlyStopping, StoppingRule};
use augur_optimizer::{Algorithm, Goal, MetricSpec, SearchSpace, Value};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;
use super::study_stopping::{StudyStopping, StudyStoppingSpec};
use crate::model::StudyId;

/// Default lease of a pulled trial: it returns to `requested` after this long without news.
pub const DEFAULT_TRIAL_LEASE_SECS: i64 = 600;
/// Parameters a study may have, conditional children included: what one request can make
/// the optimizer (and every answer) carry is bounded by it.
pub const MAX_PARAMETERS: usize = 256;
/// Values a categorical or discrete parameter may list (each is a feature of the GP).
pub const MAX_VALUES_PER_PARAMETER: usize = 1000;
/// Values one `suggest` may hand out: `count` × the study's parameters (a 256-parameter
/// study may ask for 100 trials at once, a 25-parameter one for the 1,000 `count` allows).
pub const MAX_SUGGEST_VALUES: usize = 25_600;

/// A study spec as submitted. Unknown fields are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StudySpec {
    /// Display name.
    pub name: String,
    /// Search algorithm; `gp_bandit` when absent.
    #[serde(default)]
    pub algorithm: AlgorithmName,
    /// One metric, or several for a multi-objective study.
    pub metrics: Vec<MetricSpecInput>,
    pub parameters: Vec<ParameterInput>,
    /// Trials in all, of any outcome.
    pub max_trials: i64,
    /// At most this many trials requested/active/stopping at once.
    #[serde(default = "one")]
    pub parallel_trials: i64,
    /// The study fails once this many trials have failed. Unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed_trials: Option<i64>,
    /// The study fails, saying why, when its first this many trials all failed with the
    /// same reason and none has completed (a command that does not exist, a script that
    /// crashes at once): 0 turns it off.
    #[serde(default = "default_fail_fast")]
    pub fail_fast_trials: i64,
    /// Which measurement becomes final when a trial completes without metrics.
    #[serde(default)]
    pub measurement_selection: MeasurementSelection,
    /// Makes suggestions reproducible; chosen at random (and stored) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStoppingSpec>,
    /// Study-level stopping: end the study before `max_trials` when it stops making
    /// progress (Vertex's `studyStoppingConfig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study_stopping: Option<StudyStoppingSpec>,
    /// Seconds an active pulled trial may go without heartbeat, measurement or completion
    /// before it returns to `requested`.
    #[serde(default = "default_lease")]
    pub trial_lease_secs: i64,
    /// Wall-clock budget of one model-based suggestion (gp_bandit), from its arrival to
    /// its answer; the model gets it less a reserve for the commit (a tenth, at most 250 ms).
    /// Past that the request is answered with quasi-random points instead of failing or
    /// waiting.
    #[serde(default = "default_suggestion_budget")]
    pub suggestion_time_budget_secs: f64,
    /// Present: the service runs each trial itself as a job (see `dispatch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial_job: Option<super::TrialJobSpec>,
    /// Earlier studies (same or overlapping parameters and metrics) whose trials `gp_bandit`
    /// learns from, without counting them against this study's budget (a warm start).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<i64>)]
    pub prior_studies: Vec<StudyId>,
    /// Multi-fidelity: the budget a trial trains for (epochs, a data fraction), passed to it
    /// as the argument `argument` (`--epochs=9`), `AUGUR_BUDGET` and a suggestion's
    /// `budget`. Without a `scheduler`, every trial trains for `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<FidelitySpec>,
    /// How trials move between budgets: `asha` starts each at `fidelity.min` and promotes
    /// the best (the top 1/`reduction_factor` of each rung) to the next rung, resuming the
    /// same trial from its checkpoint; `hyperband` runs brackets of synchronous successive
    /// halving that start at different rungs; `pbt` trains a population in segments, the
    /// worst copying the checkpoints of the best (see `pbt`). Absent: every trial runs at
    /// the full budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerName>,
    /// Population-based training's settings, with `scheduler: pbt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pbt: Option<PbtSpec>,
    /// The study's total budget in `fidelity` units (e.g. 800 epochs over all trials): every
    /// trial counts its latest budget (a trial that resumes from its checkpoint trains only
    /// the difference). No attempt starts that would go past it; once no new configuration
    /// fits, the study ends when nothing runs (paused trials end at their rung).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_budget: Option<f64>,
    /// Webhooks called when the study completes or fails, a trial fails, or a better trial
    /// is found (at most 8). Their secrets are shown as `[redacted]` when the study is read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<super::NotificationSpec>,
}

/// Population-based training (`scheduler: pbt`): `population` trials train in segments of
/// `perturbation_interval` budget units up to `fidelity.max`. When every member has ended a
/// segment, each trial in the bottom `quantile_fraction` copies the checkpoint of one in the
/// top quantile into its own checkpoint directory and goes on with that trial's values
/// perturbed (each drawn afresh with `resample_probability`, else numbers ×0.8 or ×1.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PbtSpec {
    /// Trials that train together; `max_trials` when absent (at most `max_trials`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<i64>,
    /// Budget units between two exploit steps; `fidelity.min` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perturbation_interval: Option<f64>,
    /// The fraction of the population that copies, and that is copied (0 to 0.5).
    #[serde(default = "default_quantile_fraction")]
    pub quantile_fraction: f64,
    /// The chance that a value is drawn afresh instead of perturbed (0 to 1).
    #[serde(default = "default_resample_probability")]
    pub resample_probability: f64,
}

fn default_quantile_fraction() -> f64 {
    0.25
}

fn default_resample_probability() -> f64 {
    0.25
}

/// The budget range of a multi-fidelity study: rungs `min·η^k` below `max`, then `max`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FidelitySpec {
    /// The trainer's argument that takes the budget (not a search parameter).
    pub argument: String,
    pub min: f64,
    pub max: f64,
    /// η (at least 2): each rung's budget is η times the one before, and 1/η of its trials
    /// go on.
    #[serde(default = "default_reduction_factor")]
    pub reduction_factor: f64,
}

fn default_reduction_factor() -> f64 {
    3.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SchedulerName {
    Asha,
    Hyperband,
    Pbt,
}

/// A validated `fidelity`: the trainer's argument and the rungs.
#[derive(Debug, Clone, PartialEq)]
pub struct FidelityConfig {
    pub argument: String,
    pub ladder: augur_optimizer::multi_fidelity::Fidelity,
}

impl FidelityConfig {
    /// A budget as the trainer gets it: a whole number when the fidelity is integral.
    pub fn value(&self, budget: f64) -> Value {
        if self.ladder.is_integral() {
            Value::Int(budget.round() as i64)
        } else {
            Value::Float(budget)
        }
    }

    /// Give an attempt's values its budget (`None`: the full one) as the trainer's argument;
    /// the budget as the trainer gets it.
    pub fn add_to(
        &self,
        parameters: &mut augur_optimizer::Assignment,
        budget: Option<f64>,
    ) -> Value {
        let value = self.value(budget.unwrap_or(self.ladder.max));
        parameters.insert(self.argument.clone(), value.clone());
        value
    }
}

impl FidelitySpec {
    fn validate(
        &self,
        parameter_ids: &BTreeSet<String>,
    ) -> Result<FidelityConfig, ValidationError> {
        check_id(&self.argument, "fidelity.argument")?;
        if parameter_ids.contains(&self.argument) {
            return Err(ValidationError::new(
                "fidelity.argument",
                format!(
                    "{:?} is a search parameter; the budget is the scheduler's, not searched",
                    self.argument
                ),
            ));
        }
        if !(self.min.is_finite() && self.min > 0.0) {
            return Err(ValidationError::new("fidelity.min", "must be a number > 0"));
        }
        if !(self.max.is_finite() && self.max > self.min && self.max <= MAX_BUDGET as f64) {
            return Err(ValidationError::new(
                "fidelity.max",
                format!(
                    "must be greater than fidelity.min ({}) and at most {MAX_BUDGET}",
                    self.min
                ),
            ));
        }
        if !(self.reduction_factor.is_finite() && (2.0..=100.0).contains(&self.reduction_factor)) {
            return Err(ValidationError::new(
                "fidelity.reduction_factor",
                "must be between 2 and 100",
            ));
        }
        Ok(FidelityConfig {
            argument: self.argument.clone(),
            ladder: augur_optimizer::multi_fidelity::Fidelity {
                min: self.min,
                max: self.max,
                reduction_factor: self.reduction_factor,
            },
        })
    }
}

fn one() -> i64 {
    1
}
/// Three identical failures before any success: the study is broken, not unlucky.
pub const DEFAULT_FAIL_FAST_TRIALS: i64 = 3;
fn default_fail_fast() -> i64 {
    DEFAULT_FAIL_FAST_TRIALS
}
fn default_lease() -> i64 {
    DEFAULT_TRIAL_LEASE_SECS
}
fn default_suggestion_budget() -> f64 {
    DEFAULT_SUGGESTION_TIME_BUDGET_SECS
}

/// Default wall-clock budget of one model-based suggestion.
pub const DEFAULT_SUGGESTION_TIME_BUDGET_SECS: f64 = 2.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    #[default]
    GpBandit,
    Random,
    QuasiRandom,
    Grid,
}

impl From<AlgorithmName> for Algorithm {
    fn from(a: AlgorithmName) -> Self {
        match a {
            AlgorithmName::GpBandit => Algorithm::GpBandit,
            AlgorithmName::Random => Algorithm::Random,
            AlgorithmName::QuasiRandom => Algorithm::QuasiRandom,
            AlgorithmName::Grid => Algorithm::Grid,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MetricGoal {
    Maximize,
    Minimize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricSpecInput {
    pub id: String,
    pub goal: MetricGoal,
    /// Makes this metric a safety constraint (Vertex AI's `safetyConfig`): a trial is safe when
    /// the metric is at or above the threshold (`maximize`) or at or below it (`minimize`).
    /// The optimizer models it and proposes points likely to be safe; `optimal_trials` keeps
    /// safe trials only. A safety metric is no objective, unless every metric is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_threshold: Option<f64>,
    /// With `safety_threshold`: the share of trials (0-1) that should be safe; suggestions
    /// become more careful while fewer are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_min_safe_trials_fraction: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MeasurementSelection {
    #[default]
    Last,
    Best,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StoppingRuleName {
    Median,
    DecayCurve,
}

/// Early stopping: `median` stops a trial whose best value so far is worse than the median
/// of completed trials' running averages at the same step; `decay_curve` extrapolates its
/// learning curve and stops it when it is unlikely to beat the best.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EarlyStoppingSpec {
    pub rule: StoppingRuleName,
    /// Completed trials needed before the rule stops anything (default 5 for median, 0
    /// for decay_curve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_completed_trials: Option<i64>,
    /// decay_curve: measurements a trial needs before its curve is extrapolated (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_curve_points: Option<i64>,
    /// decay_curve: standard errors of optimism granted before a trial is judged hopeless
    /// (default 2); larger stops less often.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigmas: Option<f64>,
    /// The metric whose curve the rule reads (a metric id of the study; default: the first
    /// metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
}

impl EarlyStoppingSpec {
    /// The rule applied to its metric, one of `metrics` (already validated).
    fn validate(&self, metrics: &[MetricSpec]) -> Result<EarlyStopping, ValidationError> {
        let metric = match &self.metric {
            None => metrics.first(),
            Some(id) => metrics.iter().find(|m| &m.id == id),
        };
        let Some(metric) = metric.cloned() else {
            return Err(ValidationError::new(
                "early_stopping.metric",
                format!(
                    "{:?} is not a metric of the study",
                    self.metric.as_deref().unwrap_or_default()
                ),
            ));
        };
        Ok(EarlyStopping {
            rule: self.rule()?,
            metric,
        })
    }

    fn rule(&self) -> Result<StoppingRule, ValidationError> {
        let count = |v: Option<i64>, field: &str| -> Result<Option<usize>, ValidationError> {
            match v {
                None => Ok(None),
                Some(n) if (0..=MAX_BUDGET).contains(&n) => Ok(Some(n as usize)),
                Some(n) => Err(ValidationError::new(
                    format!("early_stopping.{field}"),
                    format!("must be between 0 and {MAX_BUDGET}, got {n}"),
                )),
            }
        };
        let min_completed = count(self.min_completed_trials, "min_completed_trials")?;
        let min_points = count(self.min_curve_points, "min_curve_points")?;
        match self.rule {
            StoppingRuleName::Median => {
                for (name, given) in [
                    ("min_curve_points", self.min_curve_points.is_some()),
                    ("sigmas", self.sigmas.is_some()),
                ] {
                    if given {
                        return Err(ValidationError::new(
                            format!("early_stopping.{name}"),
                            "applies to the decay_curve rule only",
                        ));
                    }
                }
                let mut rule = StoppingRule::median();
                if let (
                    StoppingRule::Median {
                        min_completed_trials,
                    },
                    Some(n),
                ) = (&mut rule, min_completed)
                {
                    *min_completed_trials = n;
                }
                Ok(rule)
            }
            StoppingRuleName::DecayCurve => {
                let mut rule = StoppingRule::decay_curve();
                if let StoppingRule::DecayCurve {
                    min_completed_trials,
                    min_curve_points,
                    sigmas,
                } = &mut rule
                {
                    if let Some(n) = min_completed {
                        *min_completed_trials = n;
                    }
                    if let Some(n) = min_points {
                        *min_curve_points = n;
                    }
                    if let Some(s) = self.sigmas {
                        if !(s.is_finite() && s >= 0.0) {
                            return Err(ValidationError::new(
                                "early_stopping.sigmas",
                                "must be a number >= 0",
                            ));
                        }
                        *sigmas = s;
                    }
                }
                Ok(rule)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParameterType {
    Double,
    Integer,
    Discrete,
    Categorical,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScaleName {
    Linear,
    Log,
    ReverseLog,
}

/// One parameter of the search space.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ParameterInput {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: ParameterType,
    /// Lower bound (double, integer).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_as_integer"
    )]
    pub min: Option<f64>,
    /// Upper bound (double, integer).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_as_integer"
    )]
    pub max: Option<f64>,
    /// Feasible values: increasing numbers (discrete) or strings (categorical).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<serde_json::Value>>)]
    pub values: Option<Vec<Value>>,
    /// linear (default), log or reverse_log; numeric types only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleName>,
    /// Conditional parameters, active only when this parameter takes one of `when`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(no_recursion)]
    pub children: Vec<ChildInput>,
}

/// Bounds are shown as given: `8`, not `8.0`.
fn whole_as_integer<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) => Value::from_number(*x).serialize(s),
        None => s.serialize_none(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildInput {
    #[schema(value_type = Vec<serde_json::Value>)]
    pub when: Vec<Value>,
    #[schema(no_recursion)]
    pub parameters: Vec<ParameterInput>,
}

/// Changes to a live study (`PATCH /v1/studies/{study}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StudyUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_trials: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_trials: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed_trials: Option<i64>,
    /// A multi-fidelity study's total budget, in budget units (raise it to let a study whose
    /// budget is spent go on; trials already ended at their rung stay ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_budget: Option<f64>,
    /// The study's note (plain text; empty removes it). Changes in any state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The study's tags, all of them (empty removes them). Changes in any state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// User attributes to set, or with `null` to remove. Changes in any state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, serde_json::Value>>)]
    pub user_attrs: Option<BTreeMap<String, serde_json::Value>>,
    /// The study's webhooks, all of them (`[]` removes them), checked as at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<Vec<super::NotificationSpec>>,
}

impl StudyUpdate {
    /// The note, tags and user attributes this update changes, taken out of it: what is
    /// left changes the budget.
    pub fn take_annotations(&mut self) -> super::AnnotationUpdate {
        super::AnnotationUpdate {
            note: self.note.take(),
            tags: self.tags.take(),
            user_attrs: self.user_attrs.take(),
        }
    }

    /// Whether it changes the budget (`max_trials`, `parallel_trials`, `max_failed_trials`,
    /// `max_budget`).
    /// Whether what is left (after `take_annotations`) changes the study's spec: its budget
    /// or its webhooks.
    pub fn changes_spec(&self) -> bool {
        self.max_trials.is_some()
            || self.parallel_trials.is_some()
            || self.max_failed_trials.is_some()
            || self.max_budget.is_some()
            || self.notifications.is_some()
    }

    /// The update as the audit trail keeps it: webhook secrets hidden.
    pub fn redacted(&self) -> StudyUpdate {
        StudyUpdate {
            notifications: self
                .notifications
                .as_ref()
                .map(|n| n.iter().map(super::NotificationSpec::redacted).collect()),
            ..self.clone()
        }
    }
}

/// A validated study: what the service and the optimizer work with.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyConfig {
    /// Parameters in all, conditional children included (at most [`MAX_PARAMETERS`]).
    pub parameter_count: usize,
    pub algorithm: Algorithm,
    pub metrics: Vec<MetricSpec>,
    pub space: SearchSpace,
    pub max_trials: u64,
    pub parallel_trials: u64,
    pub max_failed_trials: Option<u64>,
    /// `fail_fast_trials`; 0: off.
    pub fail_fast_trials: u64,
    pub measurement_selection: MeasurementSelection,
    pub seed: u64,
    /// The early-stopping rule and the metric it reads.
    pub early_stopping: Option<EarlyStopping>,
    /// Study-level stopping; `None`: the study runs to `max_trials`.
    pub study_stopping: Option<StudyStopping>,
    pub trial_lease_secs: i64,
    pub suggestion_time_budget: std::time::Duration,
    /// How the service runs each trial itself; `None` for ask/tell studies.
    pub trial_job: Option<super::TrialJobSpec>,
    pub prior_studies: Vec<StudyId>,
    /// The largest `desired_min_safe_trials_fraction` of the study's safety metrics.
    pub desired_min_safe_trials_fraction: Option<f64>,
    /// Multi-fidelity: the budget's argument and rungs.
    pub fidelity: Option<FidelityConfig>,
    /// How trials move between rungs; `None`: every trial at the full budget.
    pub scheduler: Option<SchedulerName>,
    /// With `scheduler: pbt`: its population and segments.
    pub pbt: Option<augur_optimizer::multi_fidelity::PbtSettings>,
    /// The study's total budget in fidelity units.
    pub max_budget: Option<f64>,
    /// The study's webhooks (`notifications`), beside `spec`'s by position.
    pub notifications: Vec<super::NotificationTarget>,
}

impl StudyConfig {
    /// The parallelism cap: how many more trials may be unfinished (requested, active or
    /// stopping) while `unfinished` are. The one statement of the rule; the state machine
    /// enforces it, the designers and the dispatcher plan with it.
    pub fn free_slots(&self, unfinished: u64) -> u64 {
        self.parallel_trials.saturating_sub(unfinished)
    }

    /// The budgets a scheduler's attempts run at, ascending (the last is the full budget);
    /// `None` without a scheduler.
    pub fn rungs(&self) -> Option<Vec<f64>> {
        let fidelity = self.fidelity.as_ref()?;
        match (self.scheduler?, self.pbt) {
            (SchedulerName::Pbt, Some(pbt)) => Some(pbt.rungs()),
            _ => Some(fidelity.ladder.rungs()),
        }
    }

    /// The study's first objective metric (safety metrics constrain, they are no objective,
    /// unless every metric is one): what best trials and a scheduler's rungs are ranked by.
    pub fn first_objective(&self) -> Option<&MetricSpec> {
        augur_optimizer::objective_metrics(&self.metrics)
            .first()
            .copied()
    }

    /// How many trials the study will create in all: `max_trials`, or fewer when a grid has
    /// fewer points or a PBT population is smaller.
    pub fn trial_budget(&self) -> u64 {
        // PBT's trials are its population; they go on training, no new ones start.
        if let Some(pbt) = &self.pbt {
            return pbt.population.min(self.max_trials);
        }
        match self.algorithm {
            Algorithm::Grid => augur_optimizer::grid::grid_size(&self.space)
                .map_or(self.max_trials, |points| points.min(self.max_trials)),
            _ => self.max_trials,
        }
    }
}

/// The largest budget a study may ask for; far above what any tuning run needs, and it keeps
/// counters inside every backend's integer range.
const MAX_BUDGET: i64 = 100_000_000;

fn positive(value: i64, field: &str) -> Result<u64, ValidationError> {
    if !(1..=MAX_BUDGET).contains(&value) {
        return Err(ValidationError::new(
            field,
            format!("must be between 1 and {MAX_BUDGET}, got {value}"),
        ));
    }
    Ok(value as u64)
}

pub(super) fn check_id(id: &str, field: &str) -> Result<(), ValidationError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        && !id.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            format!(
                "{id:?} is not a valid id: use 1-64 letters, digits, '_', '-' or '.', not starting with '-'"
            ),
        ))
    }
}

impl StudySpec {
    /// Validate and convert. `seed` must already be filled in (see [`StudySpec::with_seed`]).
    pub fn validate(&self) -> Result<StudyConfig, ValidationError> {
        self.check_name()?;
        let metrics = self.metric_specs()?;
        let (parameters, ids) = self.parameter_tree()?;
        let max_trials = positive(self.max_trials, "max_trials")?;
        let parallel_trials = positive(self.parallel_trials, "parallel_trials")?;
        let max_failed_trials = self
            .max_failed_trials
            .map(|v| positive(v, "max_failed_trials"))
            .transpose()?;
        let early_stopping = self
            .early_stopping
            .as_ref()
            .map(|e| e.validate(&metrics))
            .transpose()?;
        let objectives: Vec<Goal> = augur_optimizer::objective_metrics(&metrics)
            .iter()
            .map(|m| m.goal)
            .collect();
        let study_stopping = self
            .study_stopping
            .as_ref()
            .map(|s| s.validate(&objectives))
            .transpose()?;
        self.check_limits()?;
        let (fidelity, scheduler) = self.multi_fidelity(&ids, early_stopping.is_some())?;
        let pbt = self.pbt(fidelity.as_ref(), max_trials)?;
        let max_budget = self.max_budget(fidelity.as_ref(), pbt.as_ref())?;
        let notifications = self.notifications()?;
        let algorithm: Algorithm = self.algorithm.into();
        let space = SearchSpace { parameters };
        Ok(StudyConfig {
            parameter_count: ids.len(),
            algorithm,
            metrics,
            space,
            max_trials,
            parallel_trials,
            max_failed_trials,
            fail_fast_trials: self.fail_fast_trials as u64,
            measurement_selection: self.measurement_selection,
            seed: self.seed.unwrap_or(0),
            early_stopping,
            study_stopping,
            trial_lease_secs: self.trial_lease_secs,
            suggestion_time_budget: std::time::Duration::from_secs_f64(
                self.suggestion_time_budget_secs,
            ),
            trial_job: self.trial_job.clone(),
            prior_studies: self.prior_studies.clone(),
            desired_min_safe_trials_fraction: self
                .metrics
                .iter()
                .filter_map(|m| m.desired_min_safe_trials_fraction)
                .reduce(f64::max),
            fidelity,
            scheduler,
            pbt,
            max_budget,
            notifications,
        })
    }

    /// `name`: 1-256 printable characters.
    fn check_name(&self) -> Result<(), ValidationError> {
        if self.name.trim().is_empty() || self.name.len() > 256 {
            return Err(ValidationError::new(
                "name",
                "must be 1-256 characters and not blank",
            ));
        }
        // A name is printed by `augur study list` and shown in terminals and pages: no
        // escape sequences, NULs or line breaks.
        if self.name.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "name",
                "must not hold control characters (escape sequences, NUL, line breaks)",
            ));
        }
        Ok(())
    }

    /// `metrics`: at least one, ids unique, safety settings consistent.
    fn metric_specs(&self) -> Result<Vec<MetricSpec>, ValidationError> {
        if self.metrics.is_empty() {
            return Err(ValidationError::new(
                "metrics",
                "a study needs at least one metric",
            ));
        }
        let mut metric_ids = BTreeSet::new();
        let mut metrics = Vec::new();
        for (i, m) in self.metrics.iter().enumerate() {
            let field = format!("metrics[{i}].id");
            check_id(&m.id, &field)?;
            if !metric_ids.insert(m.id.as_str()) {
                return Err(ValidationError::new(
                    field,
                    format!("duplicate metric id {:?}", m.id),
                ));
            }
            let goal = match m.goal {
                MetricGoal::Maximize => Goal::Maximize,
                MetricGoal::Minimize => Goal::Minimize,
            };
            if m.safety_threshold.is_some_and(|t| !t.is_finite()) {
                return Err(ValidationError::new(
                    format!("metrics[{i}].safety_threshold"),
                    "must be a finite number",
                ));
            }
            if let Some(f) = m.desired_min_safe_trials_fraction {
                if !(0.0..=1.0).contains(&f) {
                    return Err(ValidationError::new(
                        format!("metrics[{i}].desired_min_safe_trials_fraction"),
                        "must be between 0 and 1",
                    ));
                }
                if m.safety_threshold.is_none() {
                    return Err(ValidationError::new(
                        format!("metrics[{i}].desired_min_safe_trials_fraction"),
                        "applies to a metric with a safety_threshold",
                    ));
                }
            }
            metrics.push(MetricSpec {
                id: m.id.clone(),
                goal,
                safety_threshold: m.safety_threshold,
            });
        }
        Ok(metrics)
    }

    /// `parameters` converted, with the id of every parameter of the tree (children
    /// included) once.
    fn parameter_tree(
        &self,
    ) -> Result<(Vec<augur_optimizer::Parameter>, BTreeSet<String>), ValidationError> {
        if self.parameters.is_empty() {
            return Err(ValidationError::new(
                "parameters",
                "a study needs at least one parameter",
            ));
        }
        let mut ids = BTreeSet::new();
        let parameters =
            super::parameters::convert_parameters(&self.parameters, "parameters", &mut ids)?;
        // `ids` holds every parameter of the tree once.
        if ids.len() > MAX_PARAMETERS {
            return Err(ValidationError::new(
                "parameters",
                format!(
                    "a study may have at most {MAX_PARAMETERS} parameters (children included), \
                     not {}",
                    ids.len()
                ),
            ));
        }
        Ok((parameters, ids))
    }

    /// The knobs with a range of their own, the trial job and the prior studies.
    fn check_limits(&self) -> Result<(), ValidationError> {
        if !(0..=1000).contains(&self.fail_fast_trials) {
            return Err(ValidationError::new(
                "fail_fast_trials",
                "must be between 0 (off) and 1000",
            ));
        }
        if !(1..=30 * 24 * 3600).contains(&self.trial_lease_secs) {
            return Err(ValidationError::new(
                "trial_lease_secs",
                "must be between 1 and 2592000 (30 days)",
            ));
        }
        if !(0.001..=3600.0).contains(&self.suggestion_time_budget_secs) {
            return Err(ValidationError::new(
                "suggestion_time_budget_secs",
                "must be between 0.001 and 3600",
            ));
        }
        if let Some(job) = &self.trial_job {
            job.validate()?;
        }
        if self.prior_studies.len() > 20 {
            return Err(ValidationError::new("prior_studies", "at most 20 studies"));
        }
        if let Some(i) = self.prior_studies.iter().position(|id| id.get() < 1) {
            return Err(ValidationError::new(
                format!("prior_studies[{i}]"),
                "must be a study id",
            ));
        }
        Ok(())
    }

    /// `notifications`: at most [`super::notification::MAX_NOTIFICATIONS`], each checked
    /// (the hosts they may reach are the server's to decide, `NotifyHosts`).
    fn notifications(&self) -> Result<Vec<super::NotificationTarget>, ValidationError> {
        let max = super::notification::MAX_NOTIFICATIONS;
        if self.notifications.len() > max {
            return Err(ValidationError::new(
                "notifications",
                format!("at most {max} webhooks"),
            ));
        }
        self.notifications
            .iter()
            .enumerate()
            .map(|(i, n)| n.validate(&format!("notifications[{i}]")))
            .collect()
    }

    /// The spec as the API shows it: each webhook's secret replaced by `[redacted]`.
    pub fn redacted(&self) -> StudySpec {
        StudySpec {
            notifications: self
                .notifications
                .iter()
                .map(super::NotificationSpec::redacted)
                .collect(),
            ..self.clone()
        }
    }

    /// `max_budget`: in the fidelity's units, enough for the first attempt.
    fn max_budget(
        &self,
        fidelity: Option<&FidelityConfig>,
        pbt: Option<&augur_optimizer::multi_fidelity::PbtSettings>,
    ) -> Result<Option<f64>, ValidationError> {
        let Some(max) = self.max_budget else {
            return Ok(None);
        };
        let Some(fidelity) = fidelity else {
            return Err(ValidationError::new(
                "max_budget",
                "needs a fidelity: it counts the budget units of fidelity.argument",
            ));
        };
        let first = match (self.scheduler, pbt) {
            (Some(SchedulerName::Pbt), Some(pbt)) => pbt.rungs()[0],
            (Some(_), _) => fidelity.ladder.rungs()[0],
            (None, _) => fidelity.ladder.max,
        };
        if !(max.is_finite() && max >= first && max <= MAX_BUDGET as f64 * 1000.0) {
            return Err(ValidationError::new(
                "max_budget",
                format!("must be at least the first attempt's budget ({first}) and finite"),
            ));
        }
        Ok(Some(max))
    }

    /// `pbt` with `scheduler: pbt`: a population that has a top and a bottom, segments
    /// inside the fidelity, values it can perturb, and trials whose checkpoints can be
    /// copied between them ([`Self::pbt_copies_checkpoints`]).
    fn pbt(
        &self,
        fidelity: Option<&FidelityConfig>,
        max_trials: u64,
    ) -> Result<Option<augur_optimizer::multi_fidelity::PbtSettings>, ValidationError> {
        let (Some(SchedulerName::Pbt), Some(fidelity)) = (self.scheduler, fidelity) else {
            if self.pbt.is_some() {
                return Err(ValidationError::new(
                    "pbt",
                    "applies with scheduler: pbt only",
                ));
            }
            return Ok(None);
        };
        let spec = self.pbt.clone().unwrap_or(PbtSpec {
            population: None,
            perturbation_interval: None,
            quantile_fraction: default_quantile_fraction(),
            resample_probability: default_resample_probability(),
        });
        let population = match spec.population {
            None => max_trials,
            Some(n) if n >= 2 && n as u64 <= max_trials => n as u64,
            Some(n) => {
                return Err(ValidationError::new(
                    "pbt.population",
                    format!("must be between 2 and max_trials ({max_trials}), got {n}"),
                ));
            }
        };
        let ladder = fidelity.ladder;
        let interval = spec.perturbation_interval.unwrap_or(ladder.min);
        if !(interval.is_finite() && interval > 0.0 && interval < ladder.max) {
            return Err(ValidationError::new(
                "pbt.perturbation_interval",
                format!(
                    "must be a number > 0 and below fidelity.max ({})",
                    ladder.max
                ),
            ));
        }
        if (ladder.max / interval).ceil() > 10_000.0 {
            return Err(ValidationError::new(
                "pbt.perturbation_interval",
                "makes more than 10,000 segments of fidelity.max",
            ));
        }
        let q = spec.quantile_fraction;
        if !(q > 0.0 && q <= 0.5) || (population as f64 * q) < 1.0 {
            return Err(ValidationError::new(
                "pbt.quantile_fraction",
                format!(
                    "must be above 0 and at most 0.5, and put at least one of the {population} \
                     trials in each quantile"
                ),
            ));
        }
        if !(0.0..=1.0).contains(&spec.resample_probability) {
            return Err(ValidationError::new(
                "pbt.resample_probability",
                "must be between 0 and 1",
            ));
        }
        self.pbt_copies_checkpoints()?;
        // Perturbing a parent would switch its children on and off mid-training.
        if let Some(i) = self.parameters.iter().position(|p| !p.children.is_empty()) {
            return Err(ValidationError::new(
                format!("parameters[{i}]"),
                "pbt cannot perturb conditional parameters (children)",
            ));
        }
        Ok(Some(augur_optimizer::multi_fidelity::PbtSettings {
            population,
            perturbation_interval: interval,
            max: ladder.max,
            quantile_fraction: q,
            resample_probability: spec.resample_probability,
        }))
    }

    /// Where PBT's copies of checkpoints are made: by the dispatcher (local, container,
    /// Slurm), a pool's worker, an ask/tell client, or a Kubernetes pod on the claim; not
    /// where an object store holds the trainer's files.
    fn pbt_copies_checkpoints(&self) -> Result<(), ValidationError> {
        match &self.trial_job {
            // Ask/tell clients keep the checkpoints: a segment names the trial to copy
            // (`lineage.copying_from`), and the client reports the copy (`checkpoint_copied`).
            None => Ok(()),
            // On Kubernetes the copy is made in the primary's pod, on the claim: an object
            // store's files are the trainer's own. (No volume at all is refused with any
            // scheduler, below.)
            Some(job)
                if job.executor.kubernetes().is_some_and(|o| {
                    matches!(
                        o.output_volume,
                        Some(super::executor::OutputVolume::ObjectStore)
                    )
                }) =>
            {
                Err(ValidationError::new(
                    "trial_job.kubernetes.output_volume",
                    "pbt copies checkpoints between trials' directories on the pods' volume: \
                     give a persistent_volume_claim (with object_store the trainer's files \
                     are out of reach)",
                ))
            }
            // A pool's workers copy from the study's directory, which they must share.
            Some(_) => Ok(()),
        }
    }

    /// `fidelity` and `scheduler`, checked together with what they exclude.
    fn multi_fidelity(
        &self,
        parameter_ids: &BTreeSet<String>,
        early_stopping: bool,
    ) -> Result<(Option<FidelityConfig>, Option<SchedulerName>), ValidationError> {
        let fidelity = self
            .fidelity
            .as_ref()
            .map(|f| f.validate(parameter_ids))
            .transpose()?;
        if self.scheduler.is_some() {
            if fidelity.is_none() {
                return Err(ValidationError::new(
                    "scheduler",
                    "needs a fidelity: {argument, min, max, reduction_factor}",
                ));
            }
            if early_stopping {
                return Err(ValidationError::new(
                    "early_stopping",
                    "a scheduler already stops trials at its rungs; use one or the other",
                ));
            }
            // A paused trial resumes from its checkpoint: on Kubernetes its pods' files go
            // with them unless the trial directories are on a volume.
            if let Some(job) = &self.trial_job
                && let Some(options) = job.executor.kubernetes()
                && options.output_volume.is_none()
            {
                return Err(ValidationError::new(
                    "trial_job.kubernetes.output_volume",
                    "a scheduler resumes paused trials from their checkpoints: give the trial \
                     directories a volume that outlives the pods",
                ));
            }
        }
        Ok((fidelity, self.scheduler))
    }

    /// The spec with a seed: the given one, or `fallback` (stored so that the study's
    /// suggestions can be reproduced later).
    pub fn with_seed(mut self, fallback: u64) -> Self {
        self.seed.get_or_insert(fallback);
        self
    }

    /// Apply a live change, validating the result as a whole.
    pub fn apply_update(
        &self,
        update: &StudyUpdate,
    ) -> Result<(StudySpec, StudyConfig), ValidationError> {
        let mut next = self.clone();
        if let Some(v) = update.max_trials {
            positive(v, "max_trials")?;
            next.max_trials = v;
        }
        if let Some(v) = update.parallel_trials {
            positive(v, "parallel_trials")?;
            next.parallel_trials = v;
        }
        if let Some(v) = update.max_failed_trials {
            positive(v, "max_failed_trials")?;
            next.max_failed_trials = Some(v);
        }
        if let Some(v) = update.max_budget {
            next.max_budget = Some(v);
        }
        if let Some(notifications) = &update.notifications {
            next.notifications = notifications.clone();
        }
        let config = next.validate()?;
        Ok((next, config))
    }
}
