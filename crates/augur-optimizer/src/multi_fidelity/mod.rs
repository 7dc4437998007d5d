//! Multi-fidelity scheduling: trials run at small budgets (epochs) first and the best are
//! promoted to larger ones. [`Fidelity`] is the ladder of budgets (rungs); [`asha`] the
//! asynchronous successive-halving policy, [`hyperband`] brackets of synchronous halving,
//! [`pbt`] population-based training (segments, exploit and explore). A trial's value at a rung is the metric measured
//! at that rung's step (budget units), or the latest one before it.

pub mod asha;
pub mod budget;
pub mod history;
pub mod hyperband;
pub mod pbt;

use serde::{Deserialize, Serialize};

use crate::decision::{TrialStatus, TrialView};
use crate::designer::{Goal, MetricSpec};

pub use asha::{Asha, stops_at_rung};
pub use budget::BudgetCap;
pub use history::ModelHistory;
pub use hyperband::Hyperband;
pub use pbt::{Pbt, PbtSettings};

/// The budget range of a multi-fidelity study (`fidelity: {min: 1, max: 27,
/// reduction_factor: 3}`): rungs `min·η^k` below `max`, then `max`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fidelity {
    pub min: f64,
    pub max: f64,
    /// η: the fraction 1/η of a rung goes on to the next, whose budget is η times larger.
    pub reduction_factor: f64,
}

impl Fidelity {
    /// Whether budgets are whole numbers (epochs): when `min` and `max` are.
    pub fn is_integral(&self) -> bool {
        self.min.fract() == 0.0 && self.max.fract() == 0.0
    }

    /// The rungs, ascending: `min·η^k` while below `max` (rounded to whole budgets when
    /// integral, without repeats), then `max`. Expects `0 < min < max` and `η >= 2`
    /// (the service validates them).
    pub fn rungs(&self) -> Vec<f64> {
        let mut rungs: Vec<f64> = Vec::new();
        let mut budget = self.min;
        while budget < self.max && rungs.len() < 64 {
            let rung = if self.is_integral() {
                budget.round()
            } else {
                budget
            };
            if rung < self.max && rungs.last().is_none_or(|last| rung > *last) {
                rungs.push(rung);
            }
            budget *= self.reduction_factor;
        }
        rungs.push(self.max);
        rungs
    }

    /// The step a measurement at `budget` is reported at: budget units, whole steps.
    pub fn step(budget: f64) -> u64 {
        budget.round().max(0.0) as u64
    }
}

/// How far a trial has got on the ladder, by its status and its latest attempt's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Running an attempt at rung `running`: the rungs below it are done.
    Running { running: usize },
    /// Its attempt at rung `done` ended and it waits (paused), or it ended for good there.
    Ended { done: usize, paused: bool },
}

impl Progress {
    /// Rungs `0..=k` whose result the trial has, if any.
    pub fn rungs_done(self) -> Option<usize> {
        match self {
            Progress::Running { running } => running.checked_sub(1),
            Progress::Ended { done, .. } => Some(done),
        }
    }
}

/// The rung index of `budget` (the highest rung at or below it; 0 for a smaller budget or
/// none, i.e. the full budget, which is the top rung).
pub(crate) fn rung_index(rungs: &[f64], budget: Option<f64>) -> usize {
    match budget {
        None => rungs.len().saturating_sub(1),
        Some(b) => rungs
            .iter()
            .rposition(|r| *r <= b * (1.0 + 1e-9))
            .unwrap_or(0),
    }
}

pub(crate) fn progress(rungs: &[f64], trial: &TrialView) -> Progress {
    let rung = rung_index(rungs, trial.budget);
    match &trial.status {
        TrialStatus::Running => Progress::Running { running: rung },
        TrialStatus::Paused => Progress::Ended {
            done: rung,
            paused: true,
        },
        TrialStatus::Finished(_) => Progress::Ended {
            done: rung,
            paused: false,
        },
    }
}

/// The trials that reached rung `k` (their attempt at it ended), best first by `metric` at
/// that rung (ties by trial number), with their values.
pub(crate) fn ranked_at<'t>(
    trials: impl IntoIterator<Item = &'t TrialView>,
    rungs: &[f64],
    k: usize,
    metric: &MetricSpec,
) -> Vec<(f64, &'t TrialView)> {
    let mut ranked: Vec<(f64, &TrialView)> = trials
        .into_iter()
        .filter(|t| {
            progress(rungs, t)
                .rungs_done()
                .is_some_and(|done| done >= k)
        })
        .map(|t| (value_at(t, metric, rungs[k]), t))
        .collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.number.cmp(&b.1.number)));
    ranked
}

/// The trial's value of `metric` at the budget `rung`: measured at its step, or the latest
/// step before it; "smaller is better" (negated for a maximized metric). A trial that
/// reported nothing usable there ranks last (`+∞`).
pub(crate) fn value_at(trial: &TrialView, metric: &MetricSpec, rung: f64) -> f64 {
    let step = Fidelity::step(rung);
    let sign = match metric.goal {
        Goal::Minimize => 1.0,
        Goal::Maximize => -1.0,
    };
    trial
        .measurements
        .iter()
        .filter(|m| m.step <= step)
        .filter_map(|m| m.metrics.get(&metric.id).copied())
        .next_back()
        .filter(|v| v.is_finite())
        .map_or(f64::INFINITY, |v| sign * v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(min: f64, max: f64, eta: f64) -> Vec<f64> {
        Fidelity {
            min,
            max,
            reduction_factor: eta,
        }
        .rungs()
    }

    #[test]
    fn rungs_grow_by_eta_up_to_max_and_stay_whole_for_whole_budgets() {
        assert_eq!(ladder(1.0, 27.0, 3.0), [1.0, 3.0, 9.0, 27.0]);
        assert_eq!(ladder(1.0, 20.0, 3.0), [1.0, 3.0, 9.0, 20.0]);
        assert_eq!(ladder(2.0, 100.0, 2.5), [2.0, 5.0, 13.0, 31.0, 78.0, 100.0]);
        assert_eq!(ladder(1.0, 2.0, 3.0), [1.0, 2.0]);
        // A data fraction: doubles, not rounded.
        let fractions = ladder(0.1, 1.0, 2.0);
        assert_eq!(fractions.len(), 5);
        assert!((fractions[3] - 0.8).abs() < 1e-12, "{fractions:?}");
        assert_eq!(fractions[4], 1.0);
    }

    #[test]
    fn a_budget_maps_to_its_rung_and_the_full_budget_to_the_top() {
        let rungs = ladder(1.0, 27.0, 3.0);
        assert_eq!(rung_index(&rungs, Some(1.0)), 0);
        assert_eq!(rung_index(&rungs, Some(9.0)), 2);
        assert_eq!(rung_index(&rungs, Some(27.0)), 3);
        assert_eq!(rung_index(&rungs, None), 3);
    }
}
