//! Warm start from prior studies: a study that learns from a finished study of a shifted
//! Branin is far ahead of a cold one early on, and a study given an unrelated (here:
//! opposite) prior study does not end up much worse than a cold one. Fixed seeds, so the
//! outcome is deterministic.

mod common;

use std::collections::BTreeMap;

use augur_optimizer::test_functions::{BRANIN, branin};
use augur_optimizer::{Assignment, Goal, GpBanditDesigner, MetricSpec, PriorStudy};
use augur_optimizer::{CompletedTrial, Outcome};
use common::{Study, median, run};

/// The value of metric `id` of each measured trial, in order.
fn metric(trials: &[CompletedTrial], id: &str) -> Vec<f64> {
    trials
        .iter()
        .filter_map(|t| match &t.outcome {
            Outcome::Measured(v) => v.get(id).copied(),
            _ => None,
        })
        .collect()
}

/// Best-so-far of `values` after each trial (minimization).
fn best_so_far(values: &[f64]) -> Vec<f64> {
    let mut best = f64::INFINITY;
    values
        .iter()
        .map(|v| {
            best = best.min(*v);
            best
        })
        .collect()
}

const BUDGET: usize = 50;
const SEEDS: std::ops::Range<u64> = 0..4;

fn xy(a: &Assignment) -> (f64, f64) {
    (
        a["x0"].as_f64().unwrap_or(0.0),
        a["x1"].as_f64().unwrap_or(0.0),
    )
}

/// A finished 50-trial GP-bandit study of `f`.
fn prior_study(f: &dyn Fn(f64, f64) -> f64) -> PriorStudy {
    let space = BRANIN.space();
    let metrics = [MetricSpec::new("y", Goal::Minimize)];
    let completed = run(
        &GpBanditDesigner::default(),
        &Study {
            space: &space,
            metrics: &metrics,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
            seed: 1000,
            budget: BUDGET,
            batch: 1,
        },
        &|a| {
            let (x, y) = xy(a);
            BTreeMap::from([("y".to_string(), f(x, y))])
        },
    );
    PriorStudy { completed }
}

/// The cold studies' regret curves, computed once for both tests.
fn cold() -> &'static [Vec<f64>] {
    static COLD: std::sync::OnceLock<Vec<Vec<f64>>> = std::sync::OnceLock::new();
    COLD.get_or_init(|| SEEDS.map(|s| regrets(s, &[])).collect())
}

/// Best-so-far Branin regret after each trial of a study with these prior studies.
fn regrets(seed: u64, prior: &[PriorStudy]) -> Vec<f64> {
    let space = BRANIN.space();
    let metrics = [MetricSpec::new("y", Goal::Minimize)];
    let trials = run(
        &GpBanditDesigner::default(),
        &Study {
            space: &space,
            metrics: &metrics,
            prior_studies: prior,
            desired_min_safe_trials_fraction: None,
            seed,
            budget: BUDGET,
            batch: 1,
        },
        &|a| {
            let (x, y) = xy(a);
            BTreeMap::from([("y".to_string(), branin(&[x, y]))])
        },
    );
    best_so_far(&metric(&trials, "y"))
        .into_iter()
        .map(|v| v - BRANIN.optimum)
        .collect()
}

/// The prior study ran on Branin shifted by (0.15, −0.2) (its minima moved by that much).
/// Over 4 seeds, the median number of trials a warm study needs to reach the cold
/// studies' median regret at 50 trials is at most 30 (measured: 25, 20, 16, 35), and at 10
/// trials the warm studies' median regret is under a tenth of the cold ones' (measured
/// 0.020 against 1.15: a cold study is still in its quasi-random design there, a warm one
/// near an optimum from its first trial).
///
/// The 4 warm studies share one prior study, so the test also checks that one default
/// study of the shifted function finds a minimum: a warm study follows its prior's best
/// region, and one whose prior got stuck on the box's edge (as this prior did under the λ
/// chooser guarded by the likelihood before `boundary_revisit_radius`: regret 0.85 from
/// trial 11 on) stays stuck with it (regret 1.55 at 50 trials on 3 of 4 seeds).
/// Over priors from seeds 1000–1015 (a scratch run), 2 of 16 miss the 30-trial median (41
/// and 30.5 trials; without the revisit rule 2 as well, both never reaching the target,
/// one of their priors stuck on the edge).
#[test]
fn a_prior_study_of_a_shifted_function_reaches_the_cold_regret_in_far_fewer_trials() {
    let prior = [prior_study(&|x, y| branin(&[x - 0.15, y + 0.2]))];
    let cold = cold();
    let warm: Vec<Vec<f64>> = SEEDS.map(|s| regrets(s, &prior)).collect();
    let at = |runs: &[Vec<f64>], n: usize| median(runs.iter().map(|r| r[n - 1]).collect());
    let target = at(cold, BUDGET);
    let needed: Vec<f64> = warm
        .iter()
        .map(|r| {
            r.iter()
                .position(|v| *v <= target)
                .map_or(BUDGET + 1, |i| i + 1) as f64
        })
        .collect();
    assert!(
        median(needed.clone()) <= 30.0,
        "trials to reach {target}: {needed:?}"
    );
    let (c10, w10) = (at(cold, 10), at(&warm, 10));
    assert!(
        w10 < 0.1 * c10,
        "median regret at 10: warm {w10} vs cold {c10}"
    );
}

/// The prior study ran on −Branin (its best points are Branin's worst): the warm studies'
/// median regret at 50 trials stays within twice the cold studies' (plus 1e-3), because
/// the model drops a prior that the new trials contradict (4 seeds).
#[test]
fn an_opposite_prior_study_costs_little_against_a_cold_start() {
    let prior = [prior_study(&|x, y| -branin(&[x, y]))];
    let cold: Vec<f64> = cold().iter().map(|r| r[BUDGET - 1]).collect();
    let warm: Vec<f64> = SEEDS.map(|s| regrets(s, &prior)[BUDGET - 1]).collect();
    let (c, w) = (median(cold), median(warm));
    assert!(
        w <= 2.0 * c + 1e-3,
        "median regret at 50: warm {w} vs cold {c}"
    );
}
