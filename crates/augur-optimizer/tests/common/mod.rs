//! Helpers shared by the statistical tests: run a whole study through `Designer::suggest`.

use std::collections::BTreeMap;

use augur_optimizer::{
    Assignment, CompletedTrial, Designer, DesignerInput, MetricSpec, Outcome, PriorStudy,
    SearchSpace,
};

/// What a study needs besides its designer.
pub struct Study<'a> {
    pub space: &'a SearchSpace,
    pub metrics: &'a [MetricSpec],
    pub prior_studies: &'a [PriorStudy],
    pub desired_min_safe_trials_fraction: Option<f64>,
    pub seed: u64,
    pub budget: usize,
    /// Suggestions per call (`parallel_trials`): each batch is told before the next.
    pub batch: usize,
}

/// Runs the study, measuring each suggestion with `measure`; returns the trials in order.
pub fn run(
    designer: &dyn Designer,
    study: &Study<'_>,
    measure: &dyn Fn(&Assignment) -> BTreeMap<String, f64>,
) -> Vec<CompletedTrial> {
    let mut completed: Vec<CompletedTrial> = Vec::new();
    let mut state: Option<serde_json::Value> = None;
    while completed.len() < study.budget {
        let count = study.batch.min(study.budget - completed.len());
        let input = DesignerInput {
            space: study.space,
            metrics: study.metrics,
            completed: &completed,
            pending: &[],
            count,
            first_trial_number: completed.len() as u64 + 1,
            seed: study.seed,
            previous_state: state.as_ref(),
            prior_studies: study.prior_studies,
            desired_min_safe_trials_fraction: study.desired_min_safe_trials_fraction,
        };
        let out = designer.suggest(&input);
        state = out.state.or(state);
        assert_eq!(
            out.suggestions.len(),
            count,
            "the GP bandit always suggests"
        );
        for a in out.suggestions {
            assert_eq!(study.space.check_assignment(&a), Ok(()));
            let values = measure(&a);
            completed.push(CompletedTrial {
                parameters: a,
                outcome: Outcome::Measured(values),
            });
        }
    }
    completed
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}
