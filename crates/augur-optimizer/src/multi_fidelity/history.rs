//! What a scheduler's designer learns from when it proposes new configurations: nothing
//! (Hyperband's brackets alone decide), the results at one rung (BOHB's rule: the highest
//! rung that enough trials reached), or every result at every rung with the budget as one

use std::collections::HashSet;

use crate::decision::{StudyView, TrialStatus, TrialView};
use crate::designer::{
    Algorithm, CompletedTrial, Designer, DesignerOutput, MetricSpec, Outcome, designer_for,
};
use crate::gp_bandit::{GpBanditConfig, GpBanditDesigner};
use crate::multi_fidelity::{Fidelity, progress};
use crate::space::{Assignment, Parameter, ParameterKind, Scale, SearchSpace, Value};

/// The id of the budget input in the extended space: a context parameter (its prefix), and
/// an id the service's validation does not allow, so it never collides with a study's.
pub const BUDGET_FEATURE: &str = "augur:budget";

/// What a scheduler's designer is given when it proposes new configurations.
///
/// more input of the model (a GP over configuration × budget, as MOBSTER and BOHB's
/// successors do, Klein et al. 2020 "Model-based asynchronous hyperparameter and neural
/// architecture search").
///
/// The budget input is the rung's budget on a log scale normalised to `[0, 1]`:
/// `u(b) = ln(b / min) / ln(max / min)`, so the rungs of a ladder with reduction factor η are
/// equally spaced and the full budget is 1. The designer is asked for points of the space
/// extended by that input ([`BUDGET_FEATURE`]), a *context* parameter of the GP bandit
/// ([`crate::gp::encoding::CONTEXT_PREFIX`]): learned over, but pinned to 1 in every
/// candidate, so the acquisition is evaluated at the full budget and proposes the
/// configuration that looks best when fully trained. Only the configuration is kept: the
/// new trial starts at the first rung as every new trial does. (Left free, the acquisition
/// chose u ≈ ⅔ for most of the MLP bench's proposals: configurations good at 9 epochs.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelHistory {
    /// No history: the designer's space-filling sequence (Hyperband's brackets alone decide
    /// which configurations go on).
    None,
    /// Every trial's result at the highest rung that the space's dimension + 2 trials
    /// reached (BOHB), else at the lowest.
    HighestRung,
    /// Every result at every rung, the normalised log budget as an extra input; the
    /// proposal's configuration is kept.
    BudgetFeature,
}

/// The designer a scheduler (ASHA, Hyperband) proposes new configurations with for a study's
/// `algorithm`, and what it learns from. With `gp_bandit`: the GP over configuration ×
/// budget ([`ModelHistory::BudgetFeature`]) with a zero prior mean instead of the fitted
/// quadratic trend ([`GpBanditConfig::trend`] off). Measured on the multi-fidelity bench
/// (benches/quality/RESULTS.md, 2026-12-07, seeds 0–9, best loss at a third of the
/// full-budget GP's compute): against the highest-rung GP, 0.033 against 0.288 on the
/// learning curves and 0.321 against 0.325 on the MLP; with the trend on, the MLP's GP
/// extrapolated the 9-epoch losses of a too-large learning rate (0.28, better than any
/// 27-epoch loss) to the full budget and proposed that corner again and again (0.338).
/// Other algorithms: their own designer (they use no history).
pub fn scheduler_designer(algorithm: Algorithm) -> (Box<dyn Designer>, ModelHistory) {
    match algorithm {
        Algorithm::GpBandit => (
            Box::new(GpBanditDesigner {
                config: GpBanditConfig {
                    trend: None,
                    ..GpBanditConfig::default()
                },
            }),
            ModelHistory::BudgetFeature,
        ),
        other => (designer_for(other), ModelHistory::None),
    }
}

/// The designer's suggestions of `count` new configurations for a study on `rungs`, given
/// the history `mode` says.
pub(crate) fn suggest_new(
    designer: &dyn Designer,
    mode: ModelHistory,
    study: &StudyView<'_>,
    rungs: &[f64],
    count: usize,
) -> DesignerOutput {
    if !designer.uses_history() || mode == ModelHistory::None {
        return designer.suggest(&study.designer_input(&[], &[], count));
    }
    match mode {
        ModelHistory::BudgetFeature => {
            let space = with_budget_feature(study.space);
            let (completed, pending) = every_rung(study, rungs);
            let view = StudyView {
                space: &space,
                ..study.clone()
            };
            let mut output = designer.suggest(&view.designer_input(&completed, &pending, count));
            for a in &mut output.suggestions {
                a.remove(BUDGET_FEATURE);
            }
            output
        }
        _ => {
            let (completed, pending) = highest_rung(study, rungs);
            designer.suggest(&study.designer_input(&completed, &pending, count))
        }
    }
}

/// The normalised log budget `u(b) = ln(b / min) / ln(max / min)` of `budget` on `rungs`
/// (1 for a ladder of one rung).
pub fn budget_feature(rungs: &[f64], budget: f64) -> f64 {
    let (min, max) = (rungs[0], rungs[rungs.len() - 1]);
    if max <= min || budget <= 0.0 {
        return 1.0;
    }
    ((budget / min).ln() / (max / min).ln()).clamp(0.0, 1.0)
}

/// `space` with the budget input appended: a double in `[0, 1]`.
fn with_budget_feature(space: &SearchSpace) -> SearchSpace {
    let mut extended = space.clone();
    extended.parameters.push(Parameter {
        id: BUDGET_FEATURE.into(),
        kind: ParameterKind::Double {
            min: 0.0,
            max: 1.0,
            scale: Scale::Linear,
        },
        children: vec![],
    });
    extended
}

fn at_budget(parameters: &Assignment, u: f64) -> Assignment {
    let mut a = parameters.clone();
    a.insert(BUDGET_FEATURE.into(), Value::Float(u));
    a
}

/// Every result at every rung (a trial that reached rung k gives k + 1 of them, each at its
/// rung's budget), and the running trials at the full budget, for
/// [`ModelHistory::BudgetFeature`].
fn every_rung(study: &StudyView<'_>, rungs: &[f64]) -> (Vec<CompletedTrial>, Vec<Assignment>) {
    let mut completed = Vec::new();
    let mut pending = Vec::new();
    for t in study.trials.iter().filter(|t| !t.excluded) {
        if let Some(done) = progress(rungs, t).rungs_done() {
            for rung in rungs.iter().take(done + 1) {
                completed.push(CompletedTrial {
                    parameters: at_budget(&t.parameters, budget_feature(rungs, *rung)),
                    outcome: outcome_at(t, study.metrics, Fidelity::step(*rung)),
                });
            }
        }
        // A running trial is pending at the full budget, where the candidates are: its
        // result will come (if it is good, it is promoted up to there), so the next
        // proposal keeps away from it. At the budget it runs to, its pending point hardly
        // weighs on the full budget's variance, and on the MLP bench the GP proposed the same
        // configuration several times at once (seed 3: trials 24–26).
        if t.status == TrialStatus::Running {
            pending.push(at_budget(&t.parameters, 1.0));
        }
    }
    (completed, pending)
}

/// Every trial's result at the highest rung that enough trials reached (the space's
/// dimension + 2, as BOHB), else at the lowest; the trials without a result there that
/// still run are pending (a paused one has a result already, at a lower rung, and most are
/// never promoted: counting them as pending would steer the search away from regions it
/// has measured).
pub(crate) fn highest_rung(
    study: &StudyView<'_>,
    rungs: &[f64],
) -> (Vec<CompletedTrial>, Vec<Assignment>) {
    let enough = study.space.all_parameters().len() + 2;
    let reached = |k: usize| -> Vec<&TrialView> {
        study
            .trials
            .iter()
            .filter(|t| !t.excluded)
            .filter(|t| {
                progress(rungs, t)
                    .rungs_done()
                    .is_some_and(|done| done >= k)
            })
            .collect()
    };
    let rung = (0..rungs.len())
        .rev()
        .find(|&k| reached(k).len() >= enough)
        .unwrap_or(0);
    let with_result = reached(rung);
    let numbers: HashSet<u64> = with_result.iter().map(|t| t.number).collect();
    let step = Fidelity::step(rungs[rung]);
    let completed = with_result
        .into_iter()
        .map(|t| CompletedTrial {
            parameters: t.parameters.clone(),
            outcome: outcome_at(t, study.metrics, step),
        })
        .collect();
    let pending = study
        .trials
        .iter()
        .filter(|t| !numbers.contains(&t.number))
        .filter(|t| t.status == TrialStatus::Running)
        .map(|t| t.parameters.clone())
        .collect();
    (completed, pending)
}

/// A trial's outcome at a rung's `step`: its latest measurement up to it with every metric
/// of the study, else failed (when it failed) or infeasible.
fn outcome_at(trial: &TrialView, metrics: &[MetricSpec], step: u64) -> Outcome {
    let measured = trial
        .measurements
        .iter()
        .rfind(|m| m.step <= step && metrics.iter().all(|spec| m.metrics.contains_key(&spec.id)));
    match (measured, &trial.status) {
        (Some(m), _) => Outcome::Measured(m.metrics.clone()),
        (None, TrialStatus::Finished(Outcome::Failed)) => Outcome::Failed,
        (None, _) => Outcome::Infeasible,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::decision::StepMeasurement;
    use crate::designer::{DesignerInput, Goal};

    /// What a designer was given: the space's number of parameters, the history, the
    /// pending points.
    type Seen = (usize, Vec<CompletedTrial>, Vec<Assignment>);

    /// A designer that records what it was given and suggests the space's centre.
    #[derive(Default)]
    struct Recorder {
        seen: std::sync::Mutex<Vec<Seen>>,
    }

    impl Designer for Recorder {
        fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput {
            self.seen.lock().expect("not poisoned").push((
                input.space.parameters.len(),
                input.completed.to_vec(),
                input.pending.to_vec(),
            ));
            DesignerOutput {
                suggestions: (0..input.count)
                    .map(|_| input.space.sample_with(|p| p.kind.from_unit(0.5)))
                    .collect(),
                state: None,
            }
        }

        fn uses_history(&self) -> bool {
            true
        }
    }

    fn trial(number: u64, x: f64, status: TrialStatus, budget: f64, steps: u64) -> TrialView {
        TrialView {
            number,
            parameters: [("x".to_string(), Value::Float(x))].into(),
            status,
            excluded: false,
            budget: Some(budget),
            measurements: (1..=steps)
                .map(|step| StepMeasurement {
                    step,
                    metrics: BTreeMap::from([("loss".to_string(), x + 1.0 / step as f64)]),
                })
                .collect(),
            copying_from: None,
        }
    }

    #[test]
    fn the_budget_feature_spaces_the_rungs_evenly_from_zero_to_one() {
        let rungs = [1.0, 3.0, 9.0, 27.0];
        let u: Vec<f64> = rungs.iter().map(|b| budget_feature(&rungs, *b)).collect();
        for (got, want) in u.iter().zip([0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0]) {
            assert!((got - want).abs() < 1e-12, "{u:?}");
        }
        assert_eq!(
            budget_feature(&[5.0], 5.0),
            1.0,
            "one rung: the full budget"
        );
        assert!(BUDGET_FEATURE.starts_with(crate::gp::encoding::CONTEXT_PREFIX));
    }

    #[test]
    fn every_rung_result_is_an_observation_at_its_budget_and_running_trials_are_pending() {
        let rungs = [1.0, 3.0, 9.0];
        let space = SearchSpace::unit_box(&["x"]);
        let metrics = [MetricSpec::new("loss", Goal::Minimize)];
        let mut excluded = trial(4, 0.9, TrialStatus::Paused, 1.0, 1);
        excluded.excluded = true;
        let trials = vec![
            // Reached 3 and waits there: results at 1 and 3.
            trial(1, 0.2, TrialStatus::Paused, 3.0, 3),
            // Runs to 9 from 3: results at 1 and 3, pending at 9.
            trial(2, 0.4, TrialStatus::Running, 9.0, 3),
            // Runs its first rung: nothing yet, pending at 1.
            trial(3, 0.6, TrialStatus::Running, 1.0, 0),
            excluded,
        ];
        let study = StudyView {
            space: &space,
            metrics: &metrics,
            trials: &trials,
            next_trial_number: 5,
            max_trials: None,
            seed: 1,
            previous_state: None,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        };
        let recorder = Recorder::default();
        let out = suggest_new(&recorder, ModelHistory::BudgetFeature, &study, &rungs, 2);
        assert!(
            out.suggestions
                .iter()
                .all(|a| a.len() == 1 && a.contains_key("x")),
            "the budget input is not part of a suggestion: {:?}",
            out.suggestions
        );
        let seen = recorder.seen.lock().expect("not poisoned");
        let (dims, completed, pending) = &seen[0];
        assert_eq!(*dims, 2, "x and the budget");
        let observed: Vec<(f64, f64, f64)> = completed
            .iter()
            .map(|c| {
                let Outcome::Measured(m) = &c.outcome else {
                    panic!("every rung was measured")
                };
                (
                    c.parameters["x"].as_f64().unwrap_or(f64::NAN),
                    c.parameters[BUDGET_FEATURE].as_f64().unwrap_or(f64::NAN),
                    m["loss"],
                )
            })
            .collect();
        let expected = [
            (0.2, 0.0, 1.2),
            (0.2, 0.5, 0.2 + 1.0 / 3.0),
            (0.4, 0.0, 1.4),
            (0.4, 0.5, 0.4 + 1.0 / 3.0),
        ];
        assert_eq!(observed.len(), expected.len(), "{observed:?}");
        for (got, want) in observed.iter().zip(expected) {
            assert!(
                (got.0 - want.0).abs() + (got.1 - want.1).abs() + (got.2 - want.2).abs() < 1e-12,
                "{observed:?}"
            );
        }
        let pending: Vec<(f64, f64)> = pending
            .iter()
            .map(|a| {
                (
                    a["x"].as_f64().unwrap_or(f64::NAN),
                    a[BUDGET_FEATURE].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect();
        assert_eq!(
            pending,
            [(0.4, 1.0), (0.6, 1.0)],
            "running trials are pending at the full budget, where candidates are"
        );
    }
}
