//! The study as the optimizer sees it: stored trials become `TrialView`s and a `StudyView`
//! here and nowhere else, and the study's policy (what decides its next trials) is chosen here.

use std::collections::HashMap;

use augur_optimizer::multi_fidelity::{Asha, BudgetCap, Hyperband, Pbt};
use augur_optimizer::{
    CompletedTrial, FullBudget, Outcome, Policy, PriorStudy, StepMeasurement, StudyView,
    TrialStatus, TrialView, designer_for,
};

use crate::model::spec::SchedulerName;
use crate::model::{Measurement, StudyConfig, TrialId, TrialState};
use crate::store::TrialRecord;

/// What a study's trials are decided by: its scheduler over the rungs of its fidelity, else
/// every trial at the full budget; new points from the study's algorithm.
pub fn policy_for(config: &StudyConfig) -> Box<dyn Policy> {
    let policy = scheduler_for(config);
    match (config.max_budget, config.rungs(), &config.fidelity) {
        (Some(max), Some(rungs), _) => Box::new(BudgetCap::new(policy, max, rungs)),
        (Some(max), None, Some(f)) => Box::new(BudgetCap::new(policy, max, vec![f.ladder.max])),
        _ => policy,
    }
}

/// The study's scheduler over its designer, without the study's total budget. ASHA and
/// Hyperband pick their designer for the algorithm themselves (`Asha::of`): with gp_bandit,
/// a GP over configuration × budget.
fn scheduler_for(config: &StudyConfig) -> Box<dyn Policy> {
    let designer = designer_for(config.algorithm);
    // Schedulers rank trials at a rung by the study's first objective metric.
    let metric = config.first_objective().cloned();
    match (config.scheduler, &config.fidelity, metric) {
        (Some(SchedulerName::Asha), Some(f), Some(m)) => {
            Box::new(Asha::of(f.ladder, m, config.algorithm))
        }
        (Some(SchedulerName::Hyperband), Some(f), Some(m)) => {
            Box::new(Hyperband::of(f.ladder, m, config.algorithm))
        }
        (Some(SchedulerName::Pbt), Some(_), Some(m)) => match config.pbt {
            Some(settings) => Box::new(Pbt::new(settings, m, designer)),
            None => Box::new(FullBudget::new(designer)),
        },
        _ => Box::new(FullBudget::new(designer)),
    }
}

/// An owned snapshot of a study for a policy that runs off the async workers.
pub(super) struct Snapshot {
    pub config: StudyConfig,
    pub trials: Vec<TrialView>,
    pub next_trial_number: u64,
    pub previous_state: Option<serde_json::Value>,
    pub priors: Vec<PriorStudy>,
}

impl Snapshot {
    pub fn view(&self) -> StudyView<'_> {
        StudyView {
            trials: &self.trials,
            previous_state: self.previous_state.as_ref(),
            prior_studies: &self.priors,
            ..history_free(&self.config, self.next_trial_number)
        }
    }
}

/// The study without its trials, for policies that need no history (and for a preview): the
/// next trial is numbered `next_trial_number`.
pub fn history_free(config: &StudyConfig, next_trial_number: u64) -> StudyView<'_> {
    StudyView {
        space: &config.space,
        metrics: &config.metrics,
        trials: &[],
        next_trial_number: next_trial_number.max(1),
        max_trials: Some(config.trial_budget()),
        seed: config.seed,
        previous_state: None,
        prior_studies: &[],
        desired_min_safe_trials_fraction: config.desired_min_safe_trials_fraction,
    }
}

/// The stored trials as a policy sees them, with their measurements from `curves` (by trial
/// id; a trial absent there has none).
pub(super) fn trial_views(
    trials: &[TrialRecord],
    config: &StudyConfig,
    mut curves: HashMap<TrialId, Vec<StepMeasurement>>,
) -> Vec<TrialView> {
    trials
        .iter()
        .map(|t| TrialView {
            number: optimizer_number(t.id),
            parameters: t.parameters.clone(),
            status: match t.state {
                TrialState::Paused => TrialStatus::Paused,
                s if s.is_unfinished() => TrialStatus::Running,
                _ => TrialStatus::Finished(outcome_of(t, config)),
            },
            excluded: t.excluded,
            budget: t.budget,
            measurements: curves.remove(&t.id).unwrap_or_default(),
            // A trial that ended (failed, stopped) will copy nothing: its parent need not
            // wait for it.
            copying_from: t
                .lineage
                .as_ref()
                .filter(|_| t.state.is_unfinished() || t.state == TrialState::Paused)
                .and_then(|l| l.copying_from)
                .map(optimizer_number),
        })
        .collect()
}

/// The optimizer's number of a trial: its id, which the optimizer's crate knows as a plain
/// `u64` (it has no store types).
pub(super) fn optimizer_number(id: TrialId) -> u64 {
    id.get().max(0) as u64
}

/// The trial the optimizer's number names ([`optimizer_number`] read back).
pub(super) fn trial_of_number(number: u64) -> TrialId {
    TrialId::new(number as i64)
}

/// Measurement rows (trial id, measurement) grouped by trial, in step order.
pub(super) fn curves_by_trial(
    rows: Vec<(TrialId, Measurement)>,
) -> HashMap<TrialId, Vec<StepMeasurement>> {
    let mut curves: HashMap<TrialId, Vec<StepMeasurement>> = HashMap::new();
    for (trial_id, m) in rows {
        curves.entry(trial_id).or_default().push(StepMeasurement {
            step: m.step.max(0) as u64,
            metrics: m.metrics,
        });
    }
    curves
}

/// The finished, not excluded trials as a designer learns from them, their outcomes read
/// with `config`'s metrics (a warm start reads a prior study's trials this way).
pub(super) fn completed_trials(
    trials: &[TrialRecord],
    config: &StudyConfig,
) -> Vec<CompletedTrial> {
    let views = trial_views(trials, config, HashMap::new());
    StudyView {
        trials: &views,
        ..history_free(config, 1)
    }
    .completed()
}

fn outcome_of(trial: &TrialRecord, config: &StudyConfig) -> Outcome {
    match (trial.state, &trial.final_measurement) {
        (TrialState::Completed, Some(m))
            if config
                .metrics
                .iter()
                .all(|spec| m.metrics.contains_key(&spec.id)) =>
        {
            Outcome::Measured(m.metrics.clone())
        }
        (TrialState::Failed, _) => Outcome::Failed,
        _ => Outcome::Infeasible,
    }
}

/// Whether the study's policy needs the trials' history.
pub(super) fn uses_history(config: &StudyConfig) -> bool {
    policy_for(config).uses_history()
}
