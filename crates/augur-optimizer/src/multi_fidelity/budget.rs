//! A study's total budget (`max_budget`, in budget units: epochs over all trials), over any
//! policy.

use crate::decision::{Decision, Policy, PolicyOutput, StudyView, TrialStatus, TrialView};

/// A trial that resumes from its checkpoint trains only the difference, so what the study has
/// spent or committed is every trial's latest budget (the full budget for a trial that has
/// none). Decisions are kept in order while they fit in what is left; once no new
/// configuration fits, none starts, and once nothing runs and nothing fits, the paused trials
/// end at their rung.
pub struct BudgetCap {
    inner: Box<dyn Policy>,
    max_budget: f64,
    /// The budgets attempts run at, ascending; the last is the full budget.
    rungs: Vec<f64>,
}

impl BudgetCap {
    /// `rungs` must not be empty (the full budget alone for a study without a scheduler).
    pub fn new(inner: Box<dyn Policy>, max_budget: f64, rungs: Vec<f64>) -> Self {
        BudgetCap {
            inner,
            max_budget,
            rungs,
        }
    }

    fn full(&self) -> f64 {
        self.rungs.last().copied().unwrap_or(0.0)
    }

    /// Budget units spent or committed: every trial's latest budget.
    pub fn allocated(&self, trials: &[TrialView]) -> f64 {
        trials.iter().map(|t| t.budget.unwrap_or(self.full())).sum()
    }

    /// What a decision adds to the allocation.
    fn cost(&self, decision: &Decision, trials: &[TrialView]) -> f64 {
        let current = |number: u64| {
            trials
                .iter()
                .find(|t| t.number == number)
                .map_or(0.0, |t| t.budget.unwrap_or(self.full()))
        };
        match decision {
            Decision::New { budget, .. } => budget.unwrap_or(self.full()),
            Decision::Resume { trial, budget } | Decision::Exploit { trial, budget, .. } => {
                (budget - current(*trial)).max(0.0)
            }
            Decision::Stop { .. } => 0.0,
        }
    }
}

impl Policy for BudgetCap {
    fn decide(&self, study: &StudyView<'_>, slots: usize) -> PolicyOutput {
        let left = self.max_budget - self.allocated(study.trials);
        let first = self.rungs.first().copied().unwrap_or(0.0);
        let closed = left + 1e-9 < first;
        // With no room for a new configuration, the policy is told none may start (so a
        // scheduler plays its end game: promotes the best it has, settles the rest).
        let created = study.next_trial_number.saturating_sub(1);
        let view = StudyView {
            max_trials: if closed {
                Some(created)
            } else {
                study.max_trials
            },
            ..study.clone()
        };
        // A decision that does not fit (a promotion larger than what is left) leaves its
        // slot to the next the policy would take (a new configuration, which may fit): asked
        // for one more slot per decision dropped, as long as it has more to give.
        let paused = study
            .trials
            .iter()
            .filter(|t| t.status == TrialStatus::Paused)
            .count();
        let mut asked = slots;
        let (decisions, state) = loop {
            let decided = self.inner.decide(&view, asked);
            let offered = decided.decisions.len();
            let mut room = left;
            let (mut kept, mut starts) = (Vec::new(), 0);
            for decision in decided.decisions {
                let cost = self.cost(&decision, study.trials);
                let start = !matches!(decision, Decision::Stop { .. });
                if cost <= room + 1e-9 && (!start || starts < slots) {
                    room -= cost;
                    starts += usize::from(start);
                    kept.push(decision);
                }
            }
            if starts >= slots || offered < asked || asked >= slots + paused {
                break (kept, decided.state);
            }
            asked += 1;
        };
        let mut decisions = decisions;
        let running = study
            .trials
            .iter()
            .any(|t| t.status == TrialStatus::Running);
        if closed && !running && decisions.is_empty() {
            decisions.extend(study.stop_paused());
        }
        PolicyOutput {
            decisions,
            state,
            closed,
        }
    }

    fn uses_history(&self) -> bool {
        true
    }

    fn reads_curves(&self) -> bool {
        self.inner.reads_curves()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::designer::{Algorithm, Goal, MetricSpec};
    use crate::multi_fidelity::{Asha, Fidelity};
    use crate::space::SearchSpace;

    const FIDELITY: Fidelity = Fidelity {
        min: 1.0,
        max: 9.0,
        reduction_factor: 3.0,
    };

    /// Runs an ASHA study under `max_budget` one attempt at a time; every trial reaches
    /// rung `k` with loss `x + 1/budget`. The budgets trained, the trials, and whether the
    /// last decision said closed.
    fn run(max_budget: f64) -> (f64, Vec<TrialView>, bool) {
        let space = SearchSpace::unit_box(&["x"]);
        let metrics = [MetricSpec::new("loss", Goal::Minimize)];
        let asha = Asha::new(
            FIDELITY,
            metrics[0].clone(),
            crate::designer::designer_for(Algorithm::Random),
        );
        let policy = BudgetCap::new(Box::new(asha), max_budget, FIDELITY.rungs());
        let mut trials: Vec<TrialView> = Vec::new();
        let (mut trained, mut closed) = (0.0, false);
        for _ in 0..1000 {
            let study = StudyView {
                space: &space,
                metrics: &metrics,
                trials: &trials,
                next_trial_number: trials.len() as u64 + 1,
                max_trials: Some(100),
                seed: 3,
                previous_state: None,
                prior_studies: &[],
                desired_min_safe_trials_fraction: None,
            };
            let out = policy.decide(&study, 1);
            closed = out.closed;
            if out.decisions.is_empty() {
                break;
            }
            for decision in out.decisions {
                let (number, budget) = match decision {
                    Decision::New { parameters, budget } => {
                        trials.push(TrialView {
                            number: trials.len() as u64 + 1,
                            parameters,
                            status: TrialStatus::Running,
                            excluded: false,
                            budget: None,
                            measurements: vec![],
                            copying_from: None,
                        });
                        (trials.len() as u64, budget.unwrap_or(9.0))
                    }
                    Decision::Resume { trial, budget } => (trial, budget),
                    Decision::Stop { trial } => {
                        trials[trial as usize - 1].status =
                            TrialStatus::Finished(crate::designer::Outcome::Infeasible);
                        continue;
                    }
                    Decision::Exploit { .. } => panic!("ASHA never exploits"),
                };
                let t = &mut trials[number as usize - 1];
                trained += budget - t.budget.unwrap_or(0.0);
                t.budget = Some(budget);
                let x = t.parameters["x"].as_f64().unwrap_or(1.0);
                t.measurements.push(crate::decision::StepMeasurement {
                    step: Fidelity::step(budget),
                    metrics: [("loss".to_string(), x + 1.0 / budget)].into(),
                });
                t.status = if budget >= 9.0 {
                    TrialStatus::Finished(crate::designer::Outcome::Infeasible)
                } else {
                    TrialStatus::Paused
                };
            }
        }
        (trained, trials, closed)
    }

    #[test]
    fn a_study_never_trains_past_its_budget_and_ends_with_nothing_paused() {
        for max_budget in [1.0, 5.0, 20.0, 37.5, 60.0] {
            let (trained, trials, closed) = run(max_budget);
            assert!(trained <= max_budget, "{trained} epochs for {max_budget}");
            assert!(
                trials.iter().all(|t| t.status != TrialStatus::Paused),
                "{max_budget}: paused trials left"
            );
            assert!(
                closed,
                "{max_budget}: the budget is spent, no new trial starts"
            );
            // Spent up to what is left for the cheapest step: a new configuration (1).
            assert!(
                max_budget - trained < 1.0,
                "{max_budget}: only {trained} trained"
            );
        }
    }

    #[test]
    fn with_room_left_it_decides_as_the_policy_does() {
        let (trained, trials, closed) = run(1e9);
        assert!(!closed);
        assert_eq!(trials.len(), 100, "max_trials, not the budget, ends it");
        assert!(trained > 100.0);
    }
}
