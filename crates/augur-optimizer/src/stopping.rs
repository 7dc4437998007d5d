//! Early-stopping rules: pure decisions over learning curves.

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, Policy, PolicyOutput, StudyView, TrialStatus};
use crate::designer::{Goal, MetricSpec};

/// A study's early-stopping rule, as written in its spec
/// (`early_stopping: {rule: median, min_completed_trials: 5}`).
///
/// A curve is a trial's intermediate measurements of one metric as `(step, value)` pairs
/// sorted by step. [`EarlyStopping`] is a rule as a [`Policy`]: it stops running trials whose
/// curve [`should_stop`] condemns, against the curves of the study's finished trials.
///
/// - **Median** (Golovin et al. 2017, "Google Vizier", §3.2.2): stop trial `t` at step `s`
///   when its best value so far is strictly worse than the median, over completed trials
///   `c`, of `c`'s running average `mean{ y_c(s') : s' ≤ s }`.
/// - **Decay curve**: fit `y(s) = a + b·s^(-c)` (a power-law decay, the usual shape of a
///   learning curve; `c` on a grid, `a` and `b` by least squares) to the trial's curve,
///   extrapolate to the final step of the completed trials, and stop when even the
///   optimistic end of the prediction (`sigmas` standard errors better than the
///   extrapolated value) is worse than the best completed trial's final value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case", deny_unknown_fields)]
pub enum StoppingRule {
    Median {
        /// Completed trials with data at the running trial's step needed before any stop.
        #[serde(default = "default_min_completed_trials")]
        min_completed_trials: usize,
    },
    DecayCurve {
        /// Completed trials needed before any stop.
        #[serde(default)]
        min_completed_trials: usize,
        /// Measurements the running trial needs before its curve is extrapolated.
        #[serde(default = "default_min_curve_points")]
        min_curve_points: usize,
        /// How many standard errors of optimism the prediction gets before it is judged
        /// hopeless; larger stops less often.
        #[serde(default = "default_sigmas")]
        sigmas: f64,
    },
}

fn default_min_completed_trials() -> usize {
    5
}
fn default_min_curve_points() -> usize {
    8
}
fn default_sigmas() -> f64 {
    2.0
}

impl StoppingRule {
    /// The median rule with its defaults.
    pub fn median() -> Self {
        StoppingRule::Median {
            min_completed_trials: default_min_completed_trials(),
        }
    }

    /// The decay-curve rule with its defaults.
    pub fn decay_curve() -> Self {
        StoppingRule::DecayCurve {
            min_completed_trials: 0,
            min_curve_points: default_min_curve_points(),
            sigmas: default_sigmas(),
        }
    }
}

/// A stopping rule applied to one metric, as a policy: it stops the running trials whose
/// curve the rule condemns, compared with the finished trials the study view holds (the
/// service shows it the latest ones, to bound the cost). It starts nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlyStopping {
    pub rule: StoppingRule,
    pub metric: MetricSpec,
}

impl Policy for EarlyStopping {
    fn decide(&self, study: &StudyView<'_>, _slots: usize) -> PolicyOutput {
        let id = &self.metric.id;
        let peers: Vec<Vec<(u64, f64)>> = study
            .trials
            .iter()
            .filter(|t| !t.excluded && matches!(t.status, TrialStatus::Finished(_)))
            .map(|t| t.curve(id))
            .collect();
        let decisions = study
            .trials
            .iter()
            .filter(|t| t.status == TrialStatus::Running)
            .filter(|t| should_stop(&self.rule, self.metric.goal, &t.curve(id), &peers))
            .map(|t| Decision::Stop { trial: t.number })
            .collect();
        PolicyOutput {
            decisions,
            state: None,
            ..Default::default()
        }
    }

    fn uses_history(&self) -> bool {
        true
    }

    fn reads_curves(&self) -> bool {
        true
    }
}

/// Whether the running trial with `trial_curve` should stop now. `completed_curves` are the
/// curves of the study's completed trials (early-stopped ones included). Curves are
/// `(step, value)` pairs sorted by step; non-finite values are ignored.
pub fn should_stop(
    rule: &StoppingRule,
    goal: Goal,
    trial_curve: &[(u64, f64)],
    completed_curves: &[Vec<(u64, f64)>],
) -> bool {
    // Work in "smaller is better" internally.
    let sign = match goal {
        Goal::Minimize => 1.0,
        Goal::Maximize => -1.0,
    };
    let clean = |c: &[(u64, f64)]| -> Vec<(u64, f64)> {
        c.iter()
            .filter(|(_, v)| v.is_finite())
            .map(|&(s, v)| (s, sign * v))
            .collect()
    };
    let trial = clean(trial_curve);
    let completed: Vec<Vec<(u64, f64)>> = completed_curves
        .iter()
        .map(|c| clean(c))
        .filter(|c| !c.is_empty())
        .collect();
    let Some(&(step, _)) = trial.last() else {
        return false;
    };
    match rule {
        StoppingRule::Median {
            min_completed_trials,
        } => median_rule(&trial, step, &completed, *min_completed_trials),
        StoppingRule::DecayCurve {
            min_completed_trials,
            min_curve_points,
            sigmas,
        } => {
            completed.len() >= (*min_completed_trials).max(1)
                && trial.len() >= (*min_curve_points).max(3)
                && decay_rule(&trial, step, &completed, *sigmas)
        }
    }
}

fn median_rule(
    trial: &[(u64, f64)],
    step: u64,
    completed: &[Vec<(u64, f64)>],
    min_completed: usize,
) -> bool {
    let mut averages: Vec<f64> = completed
        .iter()
        .filter_map(|c| {
            let upto: Vec<f64> = c.iter().filter(|(s, _)| *s <= step).map(|p| p.1).collect();
            (!upto.is_empty()).then(|| upto.iter().sum::<f64>() / upto.len() as f64)
        })
        .collect();
    if averages.is_empty() || averages.len() < min_completed {
        return false;
    }
    averages.sort_by(f64::total_cmp);
    let n = averages.len();
    let median = if n % 2 == 1 {
        averages[n / 2]
    } else {
        0.5 * (averages[n / 2 - 1] + averages[n / 2])
    };
    let best = trial.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    best > median
}

fn decay_rule(trial: &[(u64, f64)], step: u64, completed: &[Vec<(u64, f64)>], sigmas: f64) -> bool {
    // The horizon is the furthest step a completed trial reached; a trial already there has
    // nothing left to save.
    let horizon = completed
        .iter()
        .filter_map(|c| c.last().map(|p| p.0))
        .max()
        .unwrap_or(0);
    if step >= horizon {
        return false;
    }
    // Best final value among completed trials that ran to (near) the horizon; trials stopped
    // early did not get a fair final value.
    let best_final = completed
        .iter()
        .filter_map(|c| c.last().copied())
        .filter(|&(s, _)| s as f64 >= 0.9 * horizon as f64)
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min);
    if !best_final.is_finite() {
        return false;
    }
    let Some((predicted, stderr)) = extrapolate(trial, horizon) else {
        return false;
    };
    // The trial's best so far also bounds what it can reach (curves may be noisy).
    // A power law fitted to a short prefix is easily wrong about the tail: floor the error
    // at a tenth of the distance the curve has already travelled.
    let travelled = (trial[0].1 - trial[trial.len() - 1].1).abs();
    let optimistic = predicted - sigmas * stderr.max(0.1 * travelled);
    let best_so_far = trial.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    optimistic.min(best_so_far) > best_final
}

/// Fit `y = a + b·x` with `x = (s + 1)^(-c)` for `c` on a grid, keeping the least-squares
/// best fit, and return the prediction at `horizon` with a standard error combining the
/// residual noise and the uncertainty of the extrapolation:
/// `se² = σ²·(1 + 1/n + (x* − x̄)²/Sxx)` (ordinary least-squares prediction interval).
fn extrapolate(curve: &[(u64, f64)], horizon: u64) -> Option<(f64, f64)> {
    let n = curve.len() as f64;
    let mut best: Option<(f64, f64, f64)> = None; // (sse, prediction, stderr)
    for k in 1..=40 {
        let c = 0.05 * k as f64;
        let xs: Vec<f64> = curve.iter().map(|p| (p.0 as f64 + 1.0).powf(-c)).collect();
        let ys: Vec<f64> = curve.iter().map(|p| p.1).collect();
        let mx = xs.iter().sum::<f64>() / n;
        let my = ys.iter().sum::<f64>() / n;
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        if sxx <= 1e-300 {
            continue;
        }
        let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        let b = sxy / sxx;
        let a = my - b * mx;
        let sse: f64 = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| (y - a - b * x).powi(2))
            .sum();
        let x_star = (horizon as f64 + 1.0).powf(-c);
        let sigma2 = sse / (n - 2.0).max(1.0);
        let se = (sigma2 * (1.0 + 1.0 / n + (x_star - mx).powi(2) / sxx)).sqrt();
        let prediction = a + b * x_star;
        if best.is_none_or(|(s, _, _)| sse < s) {
            best = Some((sse, prediction, se));
        }
    }
    best.map(|(_, p, s)| (p, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    const STEPS: u64 = 100;

    /// A loss curve decaying as a power law to `final_loss`, with a little noise.
    fn curve(final_loss: f64, amplitude: f64, rng: &mut StdRng) -> Vec<(u64, f64)> {
        (1..=STEPS)
            .map(|s| {
                let noise = 0.01 * (rng.random::<f64>() - 0.5);
                (s, final_loss + amplitude * (s as f64).powf(-0.7) + noise)
            })
            .collect()
    }

    /// Runs a study of 40 trials one after another under `rule`; returns the fraction of
    /// steps saved and whether the trial with the best true final loss ran to the end.
    fn simulate(rule: &StoppingRule, seed: u64) -> (f64, bool) {
        let mut rng = StdRng::seed_from_u64(seed);
        let trials: Vec<(f64, Vec<(u64, f64)>)> = (0..40)
            .map(|_| {
                let final_loss = 0.1 + rng.random::<f64>();
                let amplitude = 0.5 + rng.random::<f64>();
                (final_loss, curve(final_loss, amplitude, &mut rng))
            })
            .collect();
        let best = (0..trials.len())
            .min_by(|&a, &b| trials[a].0.total_cmp(&trials[b].0))
            .unwrap_or(0);
        let mut completed: Vec<Vec<(u64, f64)>> = Vec::new();
        let mut steps_run = 0usize;
        let mut best_ran_fully = false;
        for (i, (_, full)) in trials.iter().enumerate() {
            let mut seen = Vec::new();
            for point in full {
                seen.push(*point);
                if should_stop(rule, Goal::Minimize, &seen, &completed) {
                    break;
                }
            }
            steps_run += seen.len();
            if i == best {
                best_ran_fully = seen.len() == full.len();
            }
            completed.push(seen);
        }
        let saved = 1.0 - steps_run as f64 / (trials.len() as f64 * STEPS as f64);
        (saved, best_ran_fully)
    }

    #[test]
    fn median_rule_saves_a_third_of_the_steps_and_keeps_the_best_trial() {
        let mut total_saved = 0.0;
        for seed in 0..10 {
            let (saved, kept_best) = simulate(&StoppingRule::median(), seed);
            assert!(saved >= 0.2, "seed {seed}: saved only {saved:.2}");
            assert!(kept_best, "seed {seed}: the best trial was stopped");
            total_saved += saved / 10.0;
        }
        // Measured: 0.46 on average over these 10 studies (0.29 to 0.59).
        assert!(
            total_saved >= 0.30,
            "saved only {total_saved:.2} on average"
        );
    }

    #[test]
    fn decay_curve_rule_saves_steps_and_keeps_the_best_trial() {
        for seed in 0..10 {
            let (saved, kept_best) = simulate(&StoppingRule::decay_curve(), seed);
            // Measured: 0.74 to 0.83 over these 10 studies.
            assert!(saved >= 0.30, "seed {seed}: saved only {saved:.2}");
            assert!(kept_best, "seed {seed}: the best trial was stopped");
        }
    }

    #[test]
    fn median_rule_waits_for_enough_completed_trials_and_honours_the_goal() {
        let good: Vec<(u64, f64)> = vec![(1, 0.9), (2, 0.95)];
        let bad: Vec<(u64, f64)> = vec![(1, 0.1), (2, 0.2)];
        let completed = vec![good.clone(); 5];
        let rule = StoppingRule::median();
        assert!(should_stop(&rule, Goal::Maximize, &bad, &completed));
        assert!(!should_stop(&rule, Goal::Minimize, &bad, &completed));
        assert!(!should_stop(&rule, Goal::Maximize, &bad, &completed[..4]));
        assert!(!should_stop(&rule, Goal::Maximize, &[], &completed));
    }

    #[test]
    fn the_policy_stops_running_trials_by_the_metric_it_names_against_finished_peers() {
        use crate::decision::{StepMeasurement, TrialView};
        use crate::designer::Outcome;
        use crate::space::{Assignment, SearchSpace};
        use std::collections::BTreeMap;
        // Every trial is as accurate as the others; the running one's loss is far worse.
        let view = |number: u64, loss: f64, status: TrialStatus| TrialView {
            number,
            parameters: Assignment::new(),
            status,
            excluded: false,
            budget: None,
            measurements: (1..=3)
                .map(|step| StepMeasurement {
                    step,
                    metrics: BTreeMap::from([("acc".to_string(), 0.9), ("loss".to_string(), loss)]),
                })
                .collect(),
            copying_from: None,
        };
        let finished = || TrialStatus::Finished(Outcome::Infeasible);
        let mut trials: Vec<TrialView> = (1..=5).map(|n| view(n, 0.1, finished())).collect();
        trials.push(view(6, 5.0, TrialStatus::Running));
        trials.push(view(7, 5.0, TrialStatus::Paused));
        let space = SearchSpace::default();
        let metrics = [
            MetricSpec::new("acc", Goal::Maximize),
            MetricSpec::new("loss", Goal::Minimize),
        ];
        let study = StudyView {
            space: &space,
            metrics: &metrics,
            trials: &trials,
            next_trial_number: 8,
            max_trials: None,
            seed: 0,
            previous_state: None,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        };
        let by = |metric: &MetricSpec| {
            EarlyStopping {
                rule: StoppingRule::median(),
                metric: metric.clone(),
            }
            .decide(&study, 4)
            .decisions
        };
        assert_eq!(by(&metrics[1]), vec![Decision::Stop { trial: 6 }]);
        assert!(
            by(&metrics[0]).is_empty(),
            "its accuracy is as good as its peers'"
        );
        let mut one_excluded = trials.clone();
        one_excluded[0].excluded = true;
        let fewer_peers = StudyView {
            trials: &one_excluded,
            ..study.clone()
        };
        let with_four = EarlyStopping {
            rule: StoppingRule::median(),
            metric: metrics[1].clone(),
        }
        .decide(&fewer_peers, 0);
        assert!(
            with_four.decisions.is_empty(),
            "an excluded trial is no peer: 4 < min_completed_trials 5"
        );
    }

    #[test]
    fn decay_curve_extrapolates_a_power_law_exactly() {
        let curve: Vec<(u64, f64)> = (1..=20)
            .map(|s| (s, 0.3 + 2.0 * (s as f64 + 1.0).powf(-0.5)))
            .collect();
        let (predicted, se) = extrapolate(&curve, 1000).unwrap_or((f64::NAN, f64::NAN));
        let truth = 0.3 + 2.0 * 1001f64.powf(-0.5);
        assert!((predicted - truth).abs() < 1e-6, "{predicted} vs {truth}");
        assert!(se < 1e-6);
    }

    #[test]
    fn rules_parse_from_the_spec_with_defaults_and_reject_unknown_fields() {
        let median: StoppingRule =
            serde_json::from_str(r#"{"rule": "median"}"#).unwrap_or(StoppingRule::decay_curve());
        assert_eq!(median, StoppingRule::median());
        let decay: Result<StoppingRule, _> =
            serde_json::from_str(r#"{"rule": "decay_curve", "min_completed_trials": 3}"#);
        assert!(matches!(
            decay,
            Ok(StoppingRule::DecayCurve {
                min_completed_trials: 3,
                min_curve_points: 8,
                ..
            })
        ));
        let unknown: Result<StoppingRule, _> =
            serde_json::from_str(r#"{"rule": "median", "patience": 3}"#);
        assert!(unknown.is_err());
        let round_trip = serde_json::to_string(&StoppingRule::decay_curve())
            .ok()
            .and_then(|s| serde_json::from_str::<StoppingRule>(&s).ok());
        assert_eq!(round_trip, Some(StoppingRule::decay_curve()));
    }
}
