//! Hyperband's brackets, and simulated studies whose every bracket halves exactly as
//! synchronous successive halving does, checked from the values each trial measured.

use std::collections::BTreeMap;

use super::*;
use crate::decision::StepMeasurement;
use crate::designer::{Algorithm, Goal, Outcome, designer_for};
use crate::space::{Assignment, SearchSpace, Value};

const FIDELITY: Fidelity = Fidelity {
    min: 1.0,
    max: 27.0,
    reduction_factor: 3.0,
};

fn hyperband() -> Hyperband {
    Hyperband::new(
        FIDELITY,
        MetricSpec::new("loss", Goal::Minimize),
        designer_for(Algorithm::Random),
    )
}

#[test]
fn brackets_start_at_every_rung_and_fill_in_turn() {
    let hb = hyperband();
    let sizes: Vec<u64> = (0..4).rev().map(|b| hb.bracket_size(4, b)).collect();
    assert_eq!(
        sizes,
        [27, 12, 6, 4],
        "Li et al. 2018's brackets for η 3, S 3"
    );
    let first_rung = |n| hb.slot(4, n).first_rung;
    assert_eq!(
        [1, 27, 28, 39, 40, 45, 46, 49].map(first_rung),
        [0, 0, 1, 1, 2, 2, 3, 3]
    );
    assert_eq!(
        hb.slot(4, 50),
        Slot {
            cycle: 1,
            bracket: 3,
            first_rung: 0
        }
    );
}

fn space() -> SearchSpace {
    SearchSpace::unit_box(&["x"])
}

/// Curves that cross: a trial's loss at each epoch.
fn loss_at(a: &Assignment, epoch: u64) -> f64 {
    let x = a.get("x").and_then(Value::as_f64).unwrap_or(0.0);
    (x - 0.3).powi(2) + (0.1 + (7.3 * x).fract()) * (epoch as f64).powf(-0.7)
}

/// Runs a study of `max_trials` with `workers`, each attempt training only what the trial's
/// checkpoint lacks; returns its trials.
fn run(max_trials: u64, workers: usize, seed: u64) -> Vec<TrialView> {
    let (space, hb) = (space(), hyperband());
    let metrics = [MetricSpec::new("loss", Goal::Minimize)];
    let rungs = FIDELITY.rungs();
    let mut trials: Vec<TrialView> = Vec::new();
    let mut running: Vec<(f64, u64)> = Vec::new();
    let mut clock = 0.0;
    loop {
        let view = StudyView {
            space: &space,
            metrics: &metrics,
            trials: &trials,
            next_trial_number: trials.len() as u64 + 1,
            max_trials: Some(max_trials),
            seed,
            previous_state: None,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        };
        let decided = hb.decide(&view, workers - running.len()).decisions;
        let acted = !decided.is_empty();
        for decision in decided {
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
                    (trials.len() as u64, budget.expect("a budget"))
                }
                Decision::Resume { trial, budget } => (trial, budget),
                Decision::Stop { trial } => {
                    let t = &mut trials[trial as usize - 1];
                    assert_eq!(t.status, TrialStatus::Paused, "only paused trials stop");
                    t.status = TrialStatus::Finished(Outcome::Infeasible);
                    continue;
                }
                Decision::Exploit { .. } => panic!("Hyperband never exploits"),
            };
            assert!(rungs.contains(&budget), "{budget} is no rung");
            let t = &mut trials[number as usize - 1];
            let trained = t.measurements.last().map_or(0, |m| m.step);
            assert!(
                Fidelity::step(budget) > trained,
                "trial {number} trains again"
            );
            t.status = TrialStatus::Running;
            t.budget = Some(budget);
            running.push((clock + budget - trained as f64, number));
        }
        assert!(running.len() <= workers);
        let Some(i) = (0..running.len()).min_by(|&a, &b| running[a].0.total_cmp(&running[b].0))
        else {
            assert!(!acted || trials.iter().all(|t| t.status != TrialStatus::Running));
            if !acted {
                break;
            }
            continue;
        };
        let (end, number) = running.swap_remove(i);
        clock = end;
        let t = &mut trials[number as usize - 1];
        let budget = t.budget.unwrap_or(FIDELITY.max);
        let from = t.measurements.last().map_or(1, |m| m.step + 1);
        for step in from..=Fidelity::step(budget) {
            let metrics = BTreeMap::from([("loss".to_string(), loss_at(&t.parameters, step))]);
            t.measurements.push(StepMeasurement { step, metrics });
        }
        t.status = if budget >= FIDELITY.max {
            TrialStatus::Finished(Outcome::Infeasible)
        } else {
            TrialStatus::Paused
        };
    }
    trials
}

#[test]
fn every_bracket_halves_synchronously_to_its_top_third() {
    let hb = hyperband();
    let rungs = FIDELITY.rungs();
    for (seed, workers) in [(0, 1), (1, 4), (2, 7)] {
        let trials = run(49, workers, seed);
        assert_eq!(trials.len(), 49);
        assert!(
            trials
                .iter()
                .all(|t| matches!(t.status, TrialStatus::Finished(_))),
            "seed {seed}: every trial ends"
        );
        // Per bracket, the trials at each rung are the best ⌊n/η⌋ of the rung below, by
        // what they measured there; the counts are Hyperband's.
        let mut by_bracket: BTreeMap<usize, Vec<&TrialView>> = BTreeMap::new();
        for t in &trials {
            by_bracket
                .entry(hb.slot(4, t.number).bracket)
                .or_default()
                .push(t);
        }
        let reached = |members: &[&TrialView], k: usize| -> Vec<u64> {
            members
                .iter()
                .filter(|t| t.budget.is_some_and(|b| b >= rungs[k]))
                .map(|t| t.number)
                .collect()
        };
        let counts: BTreeMap<usize, Vec<usize>> = by_bracket
            .iter()
            .map(|(b, members)| (*b, (3 - b..4).map(|k| reached(members, k).len()).collect()))
            .collect();
        assert_eq!(
            counts,
            BTreeMap::from([
                (3, vec![27, 9, 3, 1]),
                (2, vec![12, 4, 1]),
                (1, vec![6, 2]),
                (0, vec![4])
            ]),
            "seed {seed}, {workers} workers"
        );
        for (b, members) in &by_bracket {
            for (k, rung) in rungs.iter().enumerate().take(3).skip(3 - b) {
                let step = Fidelity::step(*rung);
                let mut at_k: Vec<(f64, u64)> = reached(members, k)
                    .into_iter()
                    .map(|n| (loss_at(&trials[n as usize - 1].parameters, step), n))
                    .collect();
                at_k.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let quota = reached(members, k + 1).len();
                let mut top: Vec<u64> = at_k.iter().take(quota).map(|p| p.1).collect();
                top.sort_unstable();
                assert_eq!(
                    top,
                    reached(members, k + 1),
                    "seed {seed}: bracket {b}, rung {k}"
                );
            }
        }
    }
}

#[test]
fn a_bracket_cut_short_by_max_trials_is_decided_on_the_trials_it_has() {
    // 30 trials: bracket 3 complete (27), bracket 2 has 3 of its 12.
    let hb = hyperband();
    let trials = run(30, 4, 5);
    assert!(
        trials
            .iter()
            .all(|t| matches!(t.status, TrialStatus::Finished(_)))
    );
    let cut: Vec<&TrialView> = trials
        .iter()
        .filter(|t| hb.slot(4, t.number).bracket == 2)
        .collect();
    assert_eq!(cut.len(), 3);
    let at_9 = cut
        .iter()
        .filter(|t| t.budget.is_some_and(|b| b >= 9.0))
        .count();
    assert_eq!(at_9, 1, "⌊3/3⌋ = 1 of the 3 goes on");
}
