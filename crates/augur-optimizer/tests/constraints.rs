//! Outcome constraints (safety metrics): on Branin with a disc-shaped unsafe region, the GP
//! bandit that knows the safety threshold runs fewer unsafe trials and finds a better best
//! safe value than the same designer without it, over fixed seeds.

mod common;

use std::collections::BTreeMap;

use augur_optimizer::test_functions::{BRANIN, branin};
use augur_optimizer::{Assignment, Goal, GpBanditDesigner, MetricSpec, is_safe};
use common::{Study, median, run};

/// An unsafe disc: trials inside it are unsafe; the `clearance` metric is the distance to
/// its centre (safe when at least the radius).
#[derive(Clone, Copy)]
struct Disc {
    centre: (f64, f64),
    radius: f64,
}

/// Centre (6.3, 2.4), radius 4: covers two of Branin's three minima, (π, 2.275) and
/// (3π, 2.475), so the best safe value is the third, at (−π, 12.275), and a designer that
/// ignores the threshold keeps converging on unsafe points.
const TWO_MINIMA_DISC: Disc = Disc {
    centre: (6.3, 2.4),
    radius: 4.0,
};

fn measure(disc: Disc, a: &Assignment) -> BTreeMap<String, f64> {
    let x0 = a["x0"].as_f64().unwrap_or(0.0);
    let x1 = a["x1"].as_f64().unwrap_or(0.0);
    let distance = ((x0 - disc.centre.0).powi(2) + (x1 - disc.centre.1).powi(2)).sqrt();
    BTreeMap::from([
        ("y".to_string(), branin(&[x0, x1])),
        ("clearance".to_string(), distance),
    ])
}

fn safe_metrics(disc: Disc) -> [MetricSpec; 2] {
    [
        MetricSpec::new("y", Goal::Minimize),
        MetricSpec {
            safety_threshold: Some(disc.radius),
            ..MetricSpec::new("clearance", Goal::Maximize)
        },
    ]
}

/// Trials of the quasi-random initial design (Branin has 2 parameters), which no model
/// steers.
const INITIAL: usize = 5;

/// (unsafe trials after the initial design, best safe y) of a 30-trial study with or
/// without the safety metric.
fn study(disc: Disc, seed: u64, constrained: bool, desired: Option<f64>) -> (usize, f64) {
    let space = BRANIN.space();
    let plain = [MetricSpec::new("y", Goal::Minimize)];
    let with_safety = safe_metrics(disc);
    let metrics: &[MetricSpec] = if constrained { &with_safety } else { &plain };
    let trials = run(
        &GpBanditDesigner::default(),
        &Study {
            space: &space,
            metrics,
            prior_studies: &[],
            desired_min_safe_trials_fraction: desired,
            seed,
            budget: 30,
            batch: 1,
        },
        &|a| measure(disc, a),
    );
    // Safety judged by the same helper the service uses, with the thresholds known.
    let judge = safe_metrics(disc);
    let mut unsafe_trials = 0;
    let mut best = f64::INFINITY;
    for (i, t) in trials.iter().enumerate() {
        let augur_optimizer::Outcome::Measured(v) = &t.outcome else {
            continue;
        };
        if is_safe(&judge, v) {
            best = best.min(v["y"]);
        } else if i >= INITIAL {
            unsafe_trials += 1;
        }
    }
    (unsafe_trials, best)
}

/// Over 8 seeds of 30 trials, the safety-aware designer runs under 0.7× the unsafe trials
/// (after the initial design) of the designer that ignores the threshold, and its median
/// best safe regret is no worse. (Measured: 1 unsafe trial against 90, median best safe
/// regret 0.04 against 5.7. The `desired_min_safe_trials_fraction` is covered by the unit
/// tests in `gp_bandit/tests.rs`: here the probability weighting alone already leaves
/// nothing to remove.)
#[test]
fn safety_threshold_gives_fewer_unsafe_trials_and_a_better_best_safe_value() {
    let seeds = 0..8u64;
    let constrained: Vec<(usize, f64)> = seeds
        .clone()
        .map(|s| study(TWO_MINIMA_DISC, s, true, None))
        .collect();
    let plain: Vec<(usize, f64)> = seeds
        .map(|s| study(TWO_MINIMA_DISC, s, false, None))
        .collect();
    let unsafe_c: usize = constrained.iter().map(|r| r.0).sum();
    let unsafe_p: usize = plain.iter().map(|r| r.0).sum();
    let best_c = median(constrained.iter().map(|r| r.1 - BRANIN.optimum).collect());
    let best_p = median(plain.iter().map(|r| r.1 - BRANIN.optimum).collect());
    assert!(
        (unsafe_c as f64) < 0.7 * unsafe_p as f64,
        "unsafe trials: constrained {unsafe_c} vs plain {unsafe_p}"
    );
    assert!(
        best_c <= best_p,
        "median best safe regret: constrained {best_c} vs plain {best_p}"
    );
}
