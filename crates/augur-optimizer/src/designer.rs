//! The designer interface: every algorithm turns a study's history into new suggestions
//! through [`Designer::suggest`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::space::{Assignment, SearchSpace};

/// Whether a metric is better when larger or smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    Maximize,
    Minimize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricSpec {
    pub id: String,
    pub goal: Goal,
    /// Makes this a *safety* metric (Vertex AI's `safetyConfig`): a trial is safe when the
    /// metric is on the good side of the threshold (`≥` for [`Goal::Maximize`], `≤` for
    /// [`Goal::Minimize`]). A safety metric constrains the search and is not an objective,
    /// unless every metric of the study is a safety metric. Absent in specs stored before it
    /// existed, hence the serde default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_threshold: Option<f64>,
}

impl MetricSpec {
    /// An objective metric without a safety threshold.
    pub fn new(id: impl Into<String>, goal: Goal) -> Self {
        MetricSpec {
            id: id.into(),
            goal,
            safety_threshold: None,
        }
    }

    /// Whether this metric carries a safety threshold.
    pub fn is_safety(&self) -> bool {
        self.safety_threshold.is_some()
    }

    /// Whether `value` of this metric is on the safe side of its threshold (always true
    /// without a threshold; never for a non-finite value).
    pub fn value_is_safe(&self, value: f64) -> bool {
        match self.safety_threshold {
            None => true,
            Some(t) => {
                value.is_finite()
                    && match self.goal {
                        Goal::Maximize => value >= t,
                        Goal::Minimize => value <= t,
                    }
            }
        }
    }
}

/// The metrics a designer optimizes: those without a safety threshold, or all of them when
/// every metric has one (then there is nothing else to optimize).
pub fn objective_metrics(metrics: &[MetricSpec]) -> Vec<&MetricSpec> {
    let objectives: Vec<&MetricSpec> = metrics.iter().filter(|m| !m.is_safety()).collect();
    if objectives.is_empty() {
        metrics.iter().collect()
    } else {
        objectives
    }
}

/// Whether a measured trial is safe: every safety metric is present, finite and on the
/// good side of its threshold. A study without safety metrics has only safe trials.
pub fn is_safe(metrics: &[MetricSpec], values: &BTreeMap<String, f64>) -> bool {
    metrics
        .iter()
        .filter(|m| m.is_safety())
        .all(|m| values.get(&m.id).is_some_and(|v| m.value_is_safe(*v)))
}

/// [`is_safe`] for any outcome: infeasible and failed trials are not safe when the study
/// has safety metrics (nothing shows they are), and are when it has none.
pub fn outcome_is_safe(metrics: &[MetricSpec], outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Measured(values) => is_safe(metrics, values),
        Outcome::Infeasible | Outcome::Failed => !metrics.iter().any(MetricSpec::is_safety),
    }
}

/// What a finished trial told us.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Final metric values by metric id (every metric of the study is present).
    Measured(BTreeMap<String, f64>),
    /// The trial ran but its point is infeasible (e.g. diverged, out of memory).
    Infeasible,
    /// The trial failed; its point is a weak hint of a bad region.
    Failed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletedTrial {
    pub parameters: Assignment,
    pub outcome: Outcome,
}

/// The algorithms a study can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    #[default]
    GpBandit,
    Random,
    QuasiRandom,
    Grid,
}

/// The finished trials of an earlier study that a new study learns from (warm start).
///
/// Parameters are matched to the new study's by id: those the new space lacks are dropped,
/// and the new space's parameters that a prior trial lacks count as inactive (as for a
/// conditional parameter). Metric values are matched by metric id and read with the new
/// study's goals. Prior trials never count towards the new study's budget.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriorStudy {
    pub completed: Vec<CompletedTrial>,
}

/// Everything a designer may look at. The service builds this from stored trials.
#[derive(Debug, Clone)]
pub struct DesignerInput<'a> {
    pub space: &'a SearchSpace,
    pub metrics: &'a [MetricSpec],
    /// Finished trials that the optimizer may learn from (excluded trials are left out).
    pub completed: &'a [CompletedTrial],
    /// Trials handed out but not finished: their points are known, their results are not.
    pub pending: &'a [Assignment],
    /// How many suggestions to return.
    pub count: usize,
    /// The study's trial number (from 1) that the first suggestion will get. Sequence
    /// designers (quasi-random, grid) use it as their position; random designers mix it
    /// into the seed so that suggestions are reproducible whatever the concurrency.
    pub first_trial_number: u64,
    /// The study's seed.
    pub seed: u64,
    /// State the designer returned last time, if the service kept it (e.g. GP
    /// hyperparameters to warm-start from). Never required for correctness.
    pub previous_state: Option<&'a serde_json::Value>,
    /// Earlier studies to learn from (warm start); empty for a cold start. Only the GP
    /// bandit uses them.
    pub prior_studies: &'a [PriorStudy],
    /// With safety metrics: the fraction of trials that should be safe at any time (best
    /// effort, Vertex AI's `desired_min_safe_trials_fraction`, in [0, 1]). `None` or 0: no
    /// target, suggestions are only weighted by their probability of being safe.
    pub desired_min_safe_trials_fraction: Option<f64>,
}

/// What a designer returns.
#[derive(Debug, Clone, Default)]
pub struct DesignerOutput {
    /// At most `count` suggestions; fewer when the algorithm is exhausted (a finished grid).
    pub suggestions: Vec<Assignment>,
    /// State to hand back as `previous_state` next time.
    pub state: Option<serde_json::Value>,
}

pub trait Designer: Send + Sync {
    fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput;

    /// Whether suggestions depend on the history (`completed`/`pending`). Designers that do
    /// not are cheap and are called inside the slot-claiming transaction with the exact
    /// trial numbers; designers that do are called outside it on a snapshot.
    fn uses_history(&self) -> bool;
}

/// The designer for an algorithm.
pub fn designer_for(algorithm: Algorithm) -> Box<dyn Designer> {
    match algorithm {
        Algorithm::Random => Box::new(crate::random::RandomDesigner),
        Algorithm::QuasiRandom => Box::new(crate::quasi_random::QuasiRandomDesigner),
        Algorithm::Grid => Box::new(crate::grid::GridDesigner::default()),
        Algorithm::GpBandit => Box::new(crate::gp_bandit::GpBanditDesigner::default()),
    }
}

/// A 64-bit seed for trial `trial_number` of a study seeded with `seed` (SplitMix64 finalizer,
/// so neighbouring trial numbers give unrelated streams).
pub fn trial_seed(seed: u64, trial_number: u64) -> u64 {
    let mut z = seed ^ trial_number.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn safety_follows_each_metrics_goal_and_needs_every_safety_metric() {
        let metrics = [
            MetricSpec::new("accuracy", Goal::Maximize),
            MetricSpec {
                safety_threshold: Some(2.0),
                ..MetricSpec::new("memory_gb", Goal::Minimize)
            },
            MetricSpec {
                safety_threshold: Some(0.5),
                ..MetricSpec::new("recall", Goal::Maximize)
            },
        ];
        let safe = values(&[("accuracy", 0.1), ("memory_gb", 2.0), ("recall", 0.5)]);
        assert!(is_safe(&metrics, &safe), "thresholds themselves are safe");
        let too_big = values(&[("accuracy", 0.9), ("memory_gb", 2.1), ("recall", 0.9)]);
        assert!(!is_safe(&metrics, &too_big));
        let too_low = values(&[("accuracy", 0.9), ("memory_gb", 1.0), ("recall", 0.4)]);
        assert!(!is_safe(&metrics, &too_low));
        let missing = values(&[("accuracy", 0.9), ("memory_gb", 1.0)]);
        assert!(
            !is_safe(&metrics, &missing),
            "a missing safety metric is not safe"
        );
        let nan = values(&[("accuracy", 0.9), ("memory_gb", f64::NAN), ("recall", 0.9)]);
        assert!(!is_safe(&metrics, &nan));
        assert!(!outcome_is_safe(&metrics, &Outcome::Infeasible));
        assert!(outcome_is_safe(&metrics[..1], &Outcome::Failed));
        assert_eq!(objective_metrics(&metrics), vec![&metrics[0]]);
        assert_eq!(objective_metrics(&metrics[1..]).len(), 2);
    }

    #[test]
    fn stored_metric_specs_without_a_threshold_still_parse_and_round_trip() {
        let old: MetricSpec =
            serde_json::from_str(r#"{"id": "loss", "goal": "minimize"}"#).expect("parses");
        assert_eq!(old, MetricSpec::new("loss", Goal::Minimize));
        assert_eq!(
            serde_json::to_string(&old).expect("serializes"),
            r#"{"id":"loss","goal":"minimize"}"#
        );
        let new: MetricSpec =
            serde_json::from_str(r#"{"id": "mem", "goal": "minimize", "safety_threshold": 4.5}"#)
                .expect("parses");
        assert_eq!(new.safety_threshold, Some(4.5));
    }
}
