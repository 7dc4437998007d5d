//! Decisions: what a study does next. A [`Policy`] looks at the study's trials (running,
//! paused and finished, with their measurements by step) and returns [`Decision`]s; a
//! [`Designer`] only proposes configurations, and a policy asks one when it starts trials.
//! Full-budget studies ([`FullBudget`]), early-stopping rules and multi-fidelity schedulers
//! are policies.

use std::collections::BTreeMap;

use crate::designer::{
    Algorithm, CompletedTrial, Designer, DesignerInput, MetricSpec, Outcome, PriorStudy,
    designer_for,
};
use crate::space::{Assignment, SearchSpace};

/// One intermediate measurement: metric values at a step (budget units under a fidelity).
#[derive(Debug, Clone, PartialEq)]
pub struct StepMeasurement {
    pub step: u64,
    pub metrics: BTreeMap<String, f64>,
}

/// Where a trial is, as a policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum TrialStatus {
    /// Handed out (waiting, running or stopping): its point is known, its result is not.
    Running,
    /// Its attempt ended below the full budget; it waits for a decision and holds no slot.
    Paused,
    /// Ended for good.
    Finished(Outcome),
}

/// A trial of the study, as every policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialView {
    /// The study's trial number (from 1).
    pub number: u64,
    pub parameters: Assignment,
    pub status: TrialStatus,
    /// Left out of learning by the user: a designer never learns from it.
    pub excluded: bool,
    /// The budget of its latest attempt; `None` for the study's full budget.
    pub budget: Option<f64>,
    /// Intermediate measurements, ascending by step. Empty unless the policy reads curves
    /// ([`Policy::reads_curves`]).
    pub measurements: Vec<StepMeasurement>,
    /// PBT: the trial whose checkpoint this one copies before its next attempt, while the
    /// copy is not done (that trial must not train on meanwhile).
    pub copying_from: Option<u64>,
}

impl TrialView {
    /// The trial's `(step, value)` curve of one metric, ascending by step.
    pub fn curve(&self, metric: &str) -> Vec<(u64, f64)> {
        self.measurements
            .iter()
            .filter_map(|m| m.metrics.get(metric).map(|v| (m.step, *v)))
            .collect()
    }
}

/// What a policy decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start a new trial with these values, at `budget` (`None`: the full budget).
    New {
        parameters: Assignment,
        budget: Option<f64>,
    },
    /// Run another attempt of a paused trial, from its own checkpoint, at a larger budget.
    Resume { trial: u64, budget: f64 },
    /// End a running or paused trial with what it measured so far.
    Stop { trial: u64 },
    /// PBT's exploit and explore: a paused trial copies `parent`'s checkpoint into its own,
    /// takes new values (`parameters`, perturbed from the parent's) and runs on at `budget`.
    Exploit {
        trial: u64,
        parent: u64,
        parameters: Assignment,
        budget: f64,
    },
}

/// Everything a policy may look at: the study and all its trials. The service builds it in
/// one place from the stored study.
#[derive(Debug, Clone)]
pub struct StudyView<'a> {
    pub space: &'a SearchSpace,
    pub metrics: &'a [MetricSpec],
    /// The study's trials, by number.
    pub trials: &'a [TrialView],
    /// The number the next new trial will get (from 1).
    pub next_trial_number: u64,
    /// How many trials the study may create in all (`None`: no limit known); a scheduler
    /// that can start no new trial settles its paused ones.
    pub max_trials: Option<u64>,
    /// The study's seed.
    pub seed: u64,
    /// State the designer returned last time, if the service kept it.
    pub previous_state: Option<&'a serde_json::Value>,
    /// Earlier studies to learn from (warm start).
    pub prior_studies: &'a [PriorStudy],
    /// Vertex AI's `desired_min_safe_trials_fraction` (see [`DesignerInput`]).
    pub desired_min_safe_trials_fraction: Option<f64>,
}

impl StudyView<'_> {
    /// How many more new trials the study may create.
    pub fn new_trials_left(&self) -> u64 {
        self.max_trials.map_or(u64::MAX, |max| {
            max.saturating_sub(self.next_trial_number.saturating_sub(1))
        })
    }

    /// Finished trials the designer learns from (excluded ones left out), by number.
    pub fn completed(&self) -> Vec<CompletedTrial> {
        self.trials
            .iter()
            .filter(|t| !t.excluded)
            .filter_map(|t| match &t.status {
                TrialStatus::Finished(outcome) => Some(CompletedTrial {
                    parameters: t.parameters.clone(),
                    outcome: outcome.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Ends every paused trial at its rung: a scheduler that will promote none of them.
    pub fn stop_paused(&self) -> impl Iterator<Item = Decision> + '_ {
        self.trials
            .iter()
            .filter(|t| t.status == TrialStatus::Paused)
            .map(|t| Decision::Stop { trial: t.number })
    }

    /// The points of trials not finished (running or paused): known points, unknown results.
    pub fn pending(&self) -> Vec<Assignment> {
        self.trials
            .iter()
            .filter(|t| !matches!(t.status, TrialStatus::Finished(_)))
            .map(|t| t.parameters.clone())
            .collect()
    }

    /// A designer's input for `count` new points that learns from `completed` with
    /// `pending` under way: the one place a [`DesignerInput`] is made from a study.
    pub fn designer_input<'b>(
        &'b self,
        completed: &'b [CompletedTrial],
        pending: &'b [Assignment],
        count: usize,
    ) -> DesignerInput<'b> {
        DesignerInput {
            space: self.space,
            metrics: self.metrics,
            completed,
            pending,
            count,
            first_trial_number: self.next_trial_number.max(1),
            seed: self.seed,
            previous_state: self.previous_state,
            prior_studies: self.prior_studies,
            desired_min_safe_trials_fraction: self.desired_min_safe_trials_fraction,
        }
    }
}

/// What a policy returns.
#[derive(Debug, Clone, Default)]
pub struct PolicyOutput {
    pub decisions: Vec<Decision>,
    /// The designer's state to hand back as `previous_state` next time.
    pub state: Option<serde_json::Value>,
    /// No new trial will start again (the study's `max_budget` is spent): once nothing runs
    /// or waits, the study is done.
    pub closed: bool,
}

impl PolicyOutput {
    /// The values of the new trials decided, in order.
    pub fn new_points(self) -> Vec<Assignment> {
        self.decisions
            .into_iter()
            .filter_map(|d| match d {
                Decision::New { parameters, .. } => Some(parameters),
                _ => None,
            })
            .collect()
    }
}

/// A study's way of deciding what runs next.
pub trait Policy: Send + Sync {
    /// The decisions for the study now, starting at most `slots` attempts (new trials and
    /// resumptions together; stops free slots and are not counted).
    fn decide(&self, study: &StudyView<'_>, slots: usize) -> PolicyOutput;

    /// Whether decisions depend on the trials. Policies that do not are cheap and are
    /// asked inside the slot-claiming transaction with the exact trial numbers.
    fn uses_history(&self) -> bool;

    /// Whether decisions read intermediate measurements ([`TrialView::measurements`]);
    /// when not, the service leaves them empty and saves the read.
    fn reads_curves(&self) -> bool {
        false
    }
}

/// Every trial trains to the full budget: free slots become new trials, proposed by the
/// designer from the finished trials with the unfinished ones pending.
pub struct FullBudget {
    designer: Box<dyn Designer>,
}

impl FullBudget {
    pub fn new(designer: Box<dyn Designer>) -> Self {
        FullBudget { designer }
    }

    /// With the designer of `algorithm`.
    pub fn of(algorithm: Algorithm) -> Self {
        FullBudget::new(designer_for(algorithm))
    }
}

impl Policy for FullBudget {
    fn decide(&self, study: &StudyView<'_>, slots: usize) -> PolicyOutput {
        let (completed, pending) = if self.designer.uses_history() {
            (study.completed(), study.pending())
        } else {
            (Vec::new(), Vec::new())
        };
        let output = self
            .designer
            .suggest(&study.designer_input(&completed, &pending, slots));
        PolicyOutput {
            decisions: output
                .suggestions
                .into_iter()
                .map(|parameters| Decision::New {
                    parameters,
                    budget: None,
                })
                .collect(),
            state: output.state,
            closed: false,
        }
    }

    fn uses_history(&self) -> bool {
        self.designer.uses_history()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::designer::Goal;
    use crate::space::Value;

    fn space() -> SearchSpace {
        SearchSpace::unit_box(&["x"])
    }

    fn trial(number: u64, x: f64, status: TrialStatus) -> TrialView {
        TrialView {
            number,
            parameters: Assignment::from([("x".to_string(), Value::Float(x))]),
            status,
            excluded: false,
            budget: None,
            measurements: vec![],
            copying_from: None,
        }
    }

    fn measured(y: f64) -> TrialStatus {
        TrialStatus::Finished(Outcome::Measured(BTreeMap::from([("y".to_string(), y)])))
    }

    #[test]
    fn full_budget_asks_its_designer_with_the_history_it_would_get_directly() {
        let space = space();
        let metrics = [MetricSpec::new("y", Goal::Minimize)];
        let mut trials: Vec<TrialView> = (1..=8)
            .map(|i| {
                trial(
                    i,
                    i as f64 / 10.0,
                    measured((i as f64 / 10.0 - 0.3).powi(2)),
                )
            })
            .collect();
        trials[2].excluded = true;
        trials.push(trial(9, 0.95, TrialStatus::Running));
        trials.push(trial(10, 0.05, TrialStatus::Paused));
        let study = StudyView {
            space: &space,
            metrics: &metrics,
            trials: &trials,
            next_trial_number: 11,
            max_trials: None,
            seed: 7,
            previous_state: None,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        };
        let completed = study.completed();
        assert_eq!(completed.len(), 7, "the excluded trial is left out");
        assert_eq!(
            study.pending().len(),
            2,
            "running and paused trials are pending"
        );
        for algorithm in [
            Algorithm::GpBandit,
            Algorithm::Random,
            Algorithm::QuasiRandom,
        ] {
            let pending = study.pending();
            let direct = designer_for(algorithm)
                .suggest(&study.designer_input(&completed, &pending, 3))
                .suggestions;
            let decided = FullBudget::of(algorithm).decide(&study, 3);
            assert!(
                decided
                    .decisions
                    .iter()
                    .all(|d| matches!(d, Decision::New { budget: None, .. })),
                "{algorithm:?}: only new trials at the full budget"
            );
            assert_eq!(decided.new_points(), direct, "{algorithm:?}");
        }
    }
}
