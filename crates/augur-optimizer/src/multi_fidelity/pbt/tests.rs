//! PBT on simulated populations whose members carry a model state that a checkpoint copy
//! moves: every decision checked against the rule kept from the events alone, parents never
//! train while their checkpoint is copied, and exploiting beats the same population trained
//! on its own at equal compute.

use std::collections::BTreeMap;

use super::*;
use crate::decision::StepMeasurement;
use crate::designer::{Algorithm, Goal, designer_for};
use crate::multi_fidelity::Fidelity;
use crate::space::{Parameter, Scale};

const SETTINGS: PbtSettings = PbtSettings {
    population: 8,
    perturbation_interval: 3.0,
    max: 27.0,
    quantile_fraction: 0.25,
    resample_probability: 0.25,
};

fn space() -> SearchSpace {
    let parameter = |id: &str, kind: ParameterKind| Parameter {
        id: id.into(),
        kind,
        children: Vec::new(),
    };
    SearchSpace {
        parameters: vec![
            parameter(
                "lr",
                ParameterKind::Double {
                    min: 1e-3,
                    max: 1.0,
                    scale: Scale::Log,
                },
            ),
            parameter(
                "width",
                ParameterKind::Integer {
                    min: 1,
                    max: 8,
                    scale: Scale::Linear,
                },
            ),
            parameter(
                "optimizer",
                ParameterKind::Categorical {
                    values: vec!["sgd".into(), "adam".into()],
                },
            ),
        ],
    }
}

/// The loss of a model state falls by this factor per epoch trained with these values (best
/// at lr 0.3, width 8, adam).
fn factor(a: &Assignment) -> f64 {
    let lr = a.get("lr").and_then(Value::as_f64).unwrap_or(1.0);
    let width = a.get("width").and_then(Value::as_f64).unwrap_or(1.0);
    let adam = a.get("optimizer") == Some(&Value::Str("adam".into()));
    let lr_gain = 0.5 * (-(lr / 0.3).ln().powi(2) / 2.0).exp();
    (1.0 - lr_gain) * (1.0 - 0.02 * width) * if adam { 0.97 } else { 1.0 }
}

/// A simulated study: `workers` run attempts; each member's checkpoint is a model state
/// (its loss, and the epochs it holds) that an exploit copies.
struct Simulation {
    trials: Vec<TrialView>,
    /// Checkpoints: (loss, epochs trained), by trial number - 1.
    checkpoints: Vec<(f64, u64)>,
    /// Events: (time, trial number, what happens).
    events: Vec<(f64, u64, Event)>,
    clock: f64,
    compute: f64,
    /// Every exploit: (segment end, child, parent).
    exploits: Vec<(u64, u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    /// The copy of the parent's checkpoint is done; the attempt starts.
    Copied { parent: u64, budget: f64 },
    /// The attempt ends.
    Ends { budget: f64 },
}

impl Simulation {
    fn new() -> Self {
        Simulation {
            trials: Vec::new(),
            checkpoints: Vec::new(),
            events: Vec::new(),
            clock: 0.0,
            compute: 0.0,
            exploits: Vec::new(),
        }
    }

    fn view<'a>(
        &'a self,
        space: &'a SearchSpace,
        metrics: &'a [MetricSpec],
        seed: u64,
    ) -> StudyView<'a> {
        StudyView {
            space,
            metrics,
            trials: &self.trials,
            next_trial_number: self.trials.len() as u64 + 1,
            max_trials: Some(SETTINGS.population),
            seed,
            previous_state: None,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        }
    }

    fn start(&mut self, number: u64, budget: f64) {
        let (_, trained) = self.checkpoints[number as usize - 1];
        let epochs = Fidelity::step(budget);
        assert!(
            epochs > trained,
            "trial {number} would train again what it has"
        );
        let t = &mut self.trials[number as usize - 1];
        t.status = TrialStatus::Running;
        t.budget = Some(budget);
        self.compute += (epochs - trained) as f64;
        self.events.push((
            self.clock + (epochs - trained) as f64,
            number,
            Event::Ends { budget },
        ));
    }

    fn apply(&mut self, decisions: Vec<Decision>, rungs: &[f64]) {
        for decision in decisions {
            match decision {
                Decision::New { parameters, budget } => {
                    assert_eq!(
                        budget,
                        Some(rungs[0]),
                        "a member starts at the first segment"
                    );
                    self.trials.push(TrialView {
                        number: self.trials.len() as u64 + 1,
                        parameters,
                        status: TrialStatus::Running,
                        excluded: false,
                        budget: None,
                        measurements: vec![],
                        copying_from: None,
                    });
                    self.checkpoints.push((1.0, 0));
                    self.start(self.trials.len() as u64, rungs[0]);
                }
                Decision::Resume { trial, budget } => {
                    let t = &self.trials[trial as usize - 1];
                    assert_eq!(t.status, TrialStatus::Paused);
                    assert!(
                        self.trials.iter().all(|c| c.copying_from != Some(trial)),
                        "trial {trial} trains on while its checkpoint is copied"
                    );
                    self.start(trial, budget);
                }
                Decision::Exploit {
                    trial,
                    parent,
                    parameters,
                    budget,
                } => {
                    let t = &mut self.trials[trial as usize - 1];
                    assert_eq!(t.status, TrialStatus::Paused);
                    assert!(
                        space().check_assignment(&parameters).is_ok(),
                        "{parameters:?}"
                    );
                    let done = Fidelity::step(t.budget.unwrap_or(0.0));
                    self.exploits.push((done, trial, parent));
                    t.parameters = parameters;
                    t.status = TrialStatus::Running;
                    t.copying_from = Some(parent);
                    // The copy takes a while: the parent must stay where it was ranked.
                    self.events
                        .push((self.clock + 0.5, trial, Event::Copied { parent, budget }));
                }
                Decision::Stop { trial } => panic!("PBT stopped trial {trial}"),
            }
        }
    }

    /// The next event happens.
    fn step(&mut self) -> bool {
        let Some(i) =
            (0..self.events.len()).min_by(|&a, &b| self.events[a].0.total_cmp(&self.events[b].0))
        else {
            return false;
        };
        let (time, number, event) = self.events.swap_remove(i);
        self.clock = time;
        match event {
            Event::Copied { parent, budget } => {
                let p = &self.trials[parent as usize - 1];
                assert_eq!(
                    p.status,
                    TrialStatus::Paused,
                    "parent {parent} trained while trial {number} copied its checkpoint"
                );
                self.checkpoints[number as usize - 1] = self.checkpoints[parent as usize - 1];
                self.trials[number as usize - 1].copying_from = None;
                self.start(number, budget);
            }
            Event::Ends { budget } => {
                let t = &mut self.trials[number as usize - 1];
                let (mut loss, trained) = self.checkpoints[number as usize - 1];
                let per_epoch = factor(&t.parameters);
                for step in trained + 1..=Fidelity::step(budget) {
                    loss *= per_epoch;
                    t.measurements.push(StepMeasurement {
                        step,
                        metrics: BTreeMap::from([("loss".to_string(), loss)]),
                    });
                }
                self.checkpoints[number as usize - 1] = (loss, Fidelity::step(budget));
                t.status = if budget >= SETTINGS.max {
                    TrialStatus::Finished(Outcome::Measured(BTreeMap::from([(
                        "loss".to_string(),
                        loss,
                    )])))
                } else {
                    TrialStatus::Paused
                };
            }
        }
        true
    }

    fn running(&self) -> usize {
        self.trials
            .iter()
            .filter(|t| t.status == TrialStatus::Running && t.copying_from.is_none())
            .count()
    }

    fn best_final_loss(&self) -> f64 {
        self.checkpoints
            .iter()
            .map(|(loss, _)| *loss)
            .fold(f64::INFINITY, f64::min)
    }
}

/// Runs a study to its end with `workers`, checking the rule at every segment's end.
fn simulate(settings: PbtSettings, workers: usize, seed: u64) -> Simulation {
    let space = space();
    let metrics = [MetricSpec::new("loss", Goal::Minimize)];
    let pbt = Pbt::new(
        settings,
        metrics[0].clone(),
        designer_for(Algorithm::Random),
    );
    let rungs = settings.rungs();
    let mut sim = Simulation::new();
    for _ in 0..100_000 {
        let slots = workers.saturating_sub(sim.running());
        if slots > 0 {
            let decided = pbt
                .decide(&sim.view(&space, &metrics, seed), slots)
                .decisions;
            assert!(
                decided.len() <= slots,
                "{} decisions for {slots} slots",
                decided.len()
            );
            sim.apply(decided, &rungs);
        }
        if !sim.step() {
            break;
        }
    }
    assert!(
        sim.trials
            .iter()
            .all(|t| matches!(t.status, TrialStatus::Finished(_))),
        "every member trains to the end: {:?}",
        sim.trials
            .iter()
            .map(|t| (&t.status, t.budget))
            .collect::<Vec<_>>()
    );
    sim
}

#[test]
fn segments_end_every_interval_and_at_the_full_budget() {
    assert_eq!(
        SETTINGS.rungs(),
        [3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0, 24.0, 27.0]
    );
    let uneven = PbtSettings {
        perturbation_interval: 4.0,
        max: 10.0,
        ..SETTINGS
    };
    assert_eq!(uneven.rungs(), [4.0, 8.0, 10.0]);
    let fraction = PbtSettings {
        perturbation_interval: 0.25,
        max: 1.0,
        ..SETTINGS
    };
    assert_eq!(fraction.rungs(), [0.25, 0.5, 0.75, 1.0]);
}

#[test]
fn the_bottom_quarter_copies_the_top_quarter_at_every_segment_end_and_parents_wait() {
    for workers in [1, 3, 8] {
        let sim = simulate(SETTINGS, workers, 11);
        assert_eq!(sim.trials.len(), 8, "the population, no more");
        assert_eq!(sim.compute, 8.0 * 27.0, "no epoch trained twice");
        // The rule from the events alone: at each segment's end, the 2 worst by their loss
        // there copied one of the 2 best.
        let segments: Vec<u64> = SETTINGS.rungs()[..8].iter().map(|r| *r as u64).collect();
        for end in segments {
            let mut ranked: Vec<(f64, u64)> = sim
                .trials
                .iter()
                .map(|t| {
                    let loss = t
                        .measurements
                        .iter()
                        .find(|m| m.step == end)
                        .map(|m| m.metrics["loss"])
                        .expect("every member measured at every segment end");
                    (loss, t.number)
                })
                .collect();
            ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut children: Vec<u64> = sim
                .exploits
                .iter()
                .filter(|(at, _, _)| *at == end)
                .map(|(_, child, parent)| {
                    assert!(
                        ranked[..2].iter().any(|(_, t)| t == parent),
                        "{workers} workers, epoch {end}: parent {parent} not in the top 2 of {ranked:?}"
                    );
                    *child
                })
                .collect();
            children.sort();
            let mut bottom: Vec<u64> = ranked[6..].iter().map(|(_, t)| *t).collect();
            bottom.sort();
            assert_eq!(children, bottom, "{workers} workers, epoch {end}");
        }
    }
}

#[test]
fn decisions_do_not_depend_on_the_number_of_workers() {
    let lineage = |workers| {
        let mut e = simulate(SETTINGS, workers, 5).exploits;
        e.sort();
        e
    };
    assert_eq!(lineage(1), lineage(8));
    assert_eq!(lineage(3), lineage(8));
}

#[test]
fn explore_perturbs_numbers_by_a_fifth_and_stays_in_the_space() {
    let space = space();
    let parent = Assignment::from([
        ("lr".to_string(), Value::Float(0.1)),
        ("width".to_string(), Value::Int(1)),
        ("optimizer".to_string(), Value::Str("sgd".into())),
    ]);
    let mut rng = StdRng::seed_from_u64(3);
    let mut lrs = Vec::new();
    for _ in 0..200 {
        let child = explore(&space, &parent, 0.0, &mut rng);
        assert!(space.check_assignment(&child).is_ok(), "{child:?}");
        let lr = child["lr"].as_f64().unwrap_or(f64::NAN);
        assert!(
            (lr - 0.08).abs() < 1e-12 || (lr - 0.12).abs() < 1e-12,
            "{lr}"
        );
        lrs.push(lr);
        // Width 1 moves up to 2, or stays at its lower bound.
        assert!(matches!(child["width"], Value::Int(1 | 2)), "{child:?}");
        assert_eq!(
            child["optimizer"], parent["optimizer"],
            "a category only resamples"
        );
    }
    assert!(lrs.iter().any(|lr| *lr > 0.1) && lrs.iter().any(|lr| *lr < 0.1));
    // Resampling everything draws categories too.
    let drawn: Vec<Assignment> = (0..50)
        .map(|_| explore(&space, &parent, 1.0, &mut rng))
        .collect();
    assert!(
        drawn
            .iter()
            .any(|c| c["optimizer"] == Value::Str("adam".into()))
    );
}

#[test]
fn exploiting_beats_the_same_population_trained_alone_at_equal_compute() {
    let alone = PbtSettings {
        quantile_fraction: 0.01,
        ..SETTINGS
    };
    let mut wins = 0;
    let (mut pbt_losses, mut alone_losses) = (Vec::new(), Vec::new());
    for seed in 0..20 {
        let with = simulate(SETTINGS, 4, seed);
        let without = simulate(alone, 4, seed);
        assert!(without.exploits.is_empty());
        assert_eq!(with.compute, without.compute, "equal compute");
        let (a, b) = (with.best_final_loss().ln(), without.best_final_loss().ln());
        wins += usize::from(a < b);
        pbt_losses.push(a);
        alone_losses.push(b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[9] + v[10]) / 2.0
    };
    let (pbt, alone) = (median(&mut pbt_losses), median(&mut alone_losses));
    assert!(
        wins >= 15 && pbt < alone - 1.0,
        "PBT won {wins} of 20; median log loss {pbt:.2} vs {alone:.2} alone"
    );
}
