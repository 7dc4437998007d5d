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

/// Centre (2.5, 7.5) (the box centre), radius 5: about a third of the box; the Branin
/// minimum at (π, 2.275) lies just outside it (distance 5.26).
const CENTRAL_DISC: Disc = Disc {
    centre: (2.5, 7.5),
    radius: 5.0,
};

/// Radius 2.5 next to the minimum at (π, 2.275) (distance 2.83): the good region straddles
/// the boundary, so trading safety for value is tempting.
const NEAR_OPTIMUM_DISC: Disc = Disc {
    centre: (std::f64::consts::PI + 2.0, 4.275),
    radius: 2.5,
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
/// best safe regret is no worse.
#[test]
fn safety_threshold_gives_fewer_unsafe_trials_and_a_better_best_safe_value() {
    let seeds = 0..8u64;
    let constrained: Vec<(usize, f64)> = seeds
        .clone()
        .map(|s| study(CENTRAL_DISC, s, true, None))
        .collect();
    let plain: Vec<(usize, f64)> = seeds.map(|s| study(CENTRAL_DISC, s, false, None)).collect();
    let unsafe_c: usize = constrained.iter().map(|r| r.0).sum();
    let unsafe_p: usize = plain.iter().map(|r| r.0).sum();
    let best_c = median(constrained.iter().map(|r| r.1 - BRANIN.optimum).collect());
    let best_p = median(plain.iter().map(|r| r.1 - BRANIN.optimum).collect());
    eprintln!("constrained {constrained:?}\nplain {plain:?}");
    assert!(
        (unsafe_c as f64) < 0.7 * unsafe_p as f64,
        "unsafe trials: constrained {unsafe_c} vs plain {unsafe_p}"
    );
    assert!(
        best_c <= best_p,
        "median best safe regret: constrained {best_c} vs plain {best_p}"
    );
}

/// With the good region straddling the unsafe boundary, a desired safe fraction of 0.95
/// makes the designer demand a high probability of safety, so it runs fewer unsafe trials
/// than with the probability weighting alone.
#[test]
fn a_desired_safe_fraction_lowers_the_unsafe_count_further() {
    let seeds = 0..8u64;
    let loose: Vec<(usize, f64)> = seeds
        .clone()
        .map(|s| study(NEAR_OPTIMUM_DISC, s, true, None))
        .collect();
    let strict: Vec<(usize, f64)> = seeds
        .map(|s| study(NEAR_OPTIMUM_DISC, s, true, Some(0.95)))
        .collect();
    let count = |r: &[(usize, f64)]| r.iter().map(|v| v.0).sum::<usize>();
    eprintln!("loose {loose:?}\nstrict {strict:?}");
    assert!(
        count(&strict) < count(&loose),
        "unsafe trials: strict {} vs loose {}",
        count(&strict),
        count(&loose)
    );
}
