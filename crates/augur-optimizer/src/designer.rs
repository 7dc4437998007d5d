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
