//! Population-based training (Jaderberg et al. 2017, "Population Based Training of Neural
//! Networks"): a population of trials trains in segments of `perturbation_interval` budget
//! units. When every member has finished a segment, each trial in the bottom
//! `quantile_fraction` copies the checkpoint of one in the top quantile (exploit) and goes on
//! with that trial's values perturbed (explore); the others go on with their own.

use std::collections::HashMap;

use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::decision::{Decision, Policy, PolicyOutput, StudyView, TrialStatus, TrialView};
use crate::designer::{Designer, MetricSpec, Outcome, trial_seed};
use crate::multi_fidelity::{Progress, progress, ranked_at};
use crate::space::{Assignment, ParameterKind, SearchSpace, Value};

/// PBT's settings (`pbt:` in a study spec).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PbtSettings {
    /// How many trials train together (the study creates this many, at most `max_trials`).
    pub population: u64,
    /// Budget units between two exploit/explore steps.
    pub perturbation_interval: f64,
    /// The full budget: the last segment ends there.
    pub max: f64,
    /// The fraction of the population that copies (bottom) and is copied (top); in (0, 0.5].
    pub quantile_fraction: f64,
    /// The chance that exploring draws a parameter afresh instead of perturbing it.
    pub resample_probability: f64,
}

impl PbtSettings {
    /// The segment ends: every `perturbation_interval` below `max` (whole when both are),
    /// then `max`.
    pub fn rungs(&self) -> Vec<f64> {
        let whole = self.perturbation_interval.fract() == 0.0 && self.max.fract() == 0.0;
        let mut rungs = Vec::new();
        let mut k = 1.0;
        while k * self.perturbation_interval < self.max && rungs.len() < 10_000 {
            let end = k * self.perturbation_interval;
            rungs.push(if whole { end.round() } else { end });
            k += 1.0;
        }
        rungs.push(self.max);
        rungs
    }
}

/// The PBT scheduler; the first population comes from `designer`.
///
/// Synchronous by segment, so that every decision can be recomputed from the trials alone
/// (nothing but the trials is stored) and a parent's checkpoint is still the one it was
/// ranked by when it is copied: a parent waits, paused, until every copy of its checkpoint is
/// done ([`TrialView::copying_from`]).
pub struct Pbt {
    pub settings: PbtSettings,
    /// The metric members are ranked by at the end of each segment.
    pub metric: MetricSpec,
    designer: Box<dyn Designer>,
}

impl Pbt {
    pub fn new(settings: PbtSettings, metric: MetricSpec, designer: Box<dyn Designer>) -> Self {
        Pbt {
            settings,
            metric,
            designer,
        }
    }

    /// What a paused trial at the end of segment `k` does, once every member got there:
    /// exploit a parent (bottom quantile), wait (a parent whose checkpoint is still to be
    /// copied), or go on.
    /// `exploit`: the segment's exploit pairs (`exploits_at`).
    fn next_for(
        &self,
        study: &StudyView<'_>,
        rungs: &[f64],
        trial: &TrialView,
        k: usize,
        exploit: &[(u64, u64)],
    ) -> Next {
        if let Some((_, parent)) = exploit.iter().find(|(child, _)| *child == trial.number) {
            let Some(parent) = study.trials.iter().find(|t| t.number == *parent) else {
                return Next::GoOn;
            };
            let mut rng = StdRng::seed_from_u64(trial_seed(
                study.seed ^ 0x5042_5421,
                trial.number.wrapping_mul(1_000_003) + k as u64,
            ));
            return Next::Exploit {
                parent: parent.number,
                parameters: explore(
                    study.space,
                    &parent.parameters,
                    self.settings.resample_probability,
                    &mut rng,
                ),
            };
        }
        // A parent trains on only once no trial still has to copy its checkpoint: those
        // paused at this segment's end that will, and those that have not yet.
        let copied_by_someone = exploit.iter().any(|(child, parent)| {
            *parent == trial.number
                && study.trials.iter().any(|t| {
                    t.number == *child
                        && progress(rungs, t)
                            == Progress::Ended {
                                done: k,
                                paused: true,
                            }
                })
        }) || study
            .trials
            .iter()
            .any(|t| t.copying_from == Some(trial.number));
        if copied_by_someone {
            Next::Wait
        } else {
            Next::GoOn
        }
    }
}

enum Next {
    Exploit { parent: u64, parameters: Assignment },
    Wait,
    GoOn,
}

/// The exploit pairs `(child, parent)` at segment `k` from its ranking (best first): each of
/// the bottom ⌊n·q⌋ copies one of the top ⌊n·q⌋ that did not fail, drawn with the study's
/// seed. The same for every call: the ranking at a segment's end does not change.
fn exploits_at(
    ranked: &[(f64, &TrialView)],
    quantile_fraction: f64,
    seed: u64,
    k: usize,
) -> Vec<(u64, u64)> {
    let quota = (ranked.len() as f64 * quantile_fraction).floor() as usize;
    if quota == 0 {
        return Vec::new();
    }
    let parents: Vec<u64> = ranked[..quota]
        .iter()
        .filter(|(value, t)| {
            value.is_finite() && !matches!(t.status, TrialStatus::Finished(Outcome::Failed))
        })
        .map(|(_, t)| t.number)
        .collect();
    if parents.is_empty() {
        return Vec::new();
    }
    ranked[ranked.len() - quota..]
        .iter()
        .map(|(_, t)| {
            let draw = trial_seed(seed ^ k as u64, t.number);
            (t.number, parents[(draw % parents.len() as u64) as usize])
        })
        .collect()
}

/// Explore: each parameter of `values` is drawn afresh with `resample_probability`, else
/// perturbed: a number by a factor 0.8 or 1.2 (in its scaled position where it can be zero
/// or negative), an integer by at least one, a discrete value to a neighbour; a category
/// changes only when drawn afresh. Clipped to the space.
pub fn explore(
    space: &SearchSpace,
    values: &Assignment,
    resample_probability: f64,
    rng: &mut StdRng,
) -> Assignment {
    let mut explored = values.clone();
    for parameter in &space.parameters {
        let Some(value) = values.get(&parameter.id) else {
            continue;
        };
        let resample = rng.random::<f64>() < resample_probability;
        let up = rng.random::<bool>();
        let unit = rng.random::<f64>();
        let new = if resample {
            parameter.kind.from_unit(unit)
        } else {
            perturb(&parameter.kind, value, up)
        };
        explored.insert(parameter.id.clone(), new);
    }
    explored
}

fn perturb(kind: &ParameterKind, value: &Value, up: bool) -> Value {
    let factor = if up { 1.2 } else { 0.8 };
    let scaled =
        |x: f64, min: f64| -> Option<f64> { if min > 0.0 { Some(x * factor) } else { None } };
    match kind {
        ParameterKind::Double { min, max, .. } => {
            let Some(x) = value.as_f64() else {
                return value.clone();
            };
            match scaled(x, *min) {
                Some(y) => Value::Float(y.clamp(*min, *max)),
                None => shift_in_unit(kind, value, up),
            }
        }
        ParameterKind::Integer { min, max, .. } => {
            let Some(x) = value.as_f64() else {
                return value.clone();
            };
            let y = match scaled(x, *min as f64) {
                Some(y) => y.round() as i64,
                None => shift_in_unit(kind, value, up).as_f64().map_or(x, |v| v) as i64,
            };
            // A small integer times 1.2 rounds back to itself: move it by one at least.
            let step = if up { 1 } else { -1 };
            let y = if y == x as i64 { y + step } else { y };
            Value::Int(y.clamp(*min, *max))
        }
        ParameterKind::Discrete { values, .. } => {
            let Some(x) = value.as_f64() else {
                return value.clone();
            };
            let i = values.iter().position(|v| *v == x).unwrap_or(0);
            let j = if up {
                (i + 1).min(values.len() - 1)
            } else {
                i.saturating_sub(1)
            };
            Value::from_number(values[j])
        }
        ParameterKind::Categorical { .. } => value.clone(),
    }
}

/// Move a value a fifth of its range up or down in its scaled position.
fn shift_in_unit(kind: &ParameterKind, value: &Value, up: bool) -> Value {
    let u = kind.to_unit(value).unwrap_or(0.5);
    kind.from_unit(if up { u + 0.2 } else { u - 0.2 })
}

impl Policy for Pbt {
    fn decide(&self, study: &StudyView<'_>, slots: usize) -> PolicyOutput {
        let rungs = self.settings.rungs();
        let created = study.next_trial_number.saturating_sub(1);
        let population = self
            .settings
            .population
            .min(created.saturating_add(study.new_trials_left()));
        let mut decisions = Vec::new();
        // The first segment of each member.
        let new = (population.saturating_sub(created)).min(slots as u64) as usize;
        let mut state = None;
        if new > 0 {
            let output = self.designer.suggest(&study.designer_input(&[], &[], new));
            state = output.state;
            decisions.extend(
                output
                    .suggestions
                    .into_iter()
                    .map(|parameters| Decision::New {
                        parameters,
                        budget: Some(rungs[0]),
                    }),
            );
        }
        if created < population {
            return PolicyOutput {
                decisions,
                state,
                ..Default::default()
            };
        }
        // A segment's end is decided once every member still training got there.
        let alive: Vec<Progress> = study
            .trials
            .iter()
            .filter(|t| !matches!(t.status, TrialStatus::Finished(_)))
            .map(|t| progress(&rungs, t))
            .collect();
        let everyone_reached = |k: usize| {
            alive
                .iter()
                .all(|p| p.rungs_done().is_some_and(|done| done >= k))
        };
        let mut exploits = Vec::new();
        let mut go_on = Vec::new();
        // Each segment end's exploit pairs, ranked once for all its paused trials.
        let mut pairs: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for trial in study.trials {
            let Progress::Ended {
                done: k,
                paused: true,
            } = progress(&rungs, trial)
            else {
                continue;
            };
            if k + 1 >= rungs.len() || !everyone_reached(k) {
                continue;
            }
            let budget = rungs[k + 1];
            let exploit = pairs.entry(k).or_insert_with(|| {
                let ranked = ranked_at(study.trials, &rungs, k, &self.metric);
                exploits_at(&ranked, self.settings.quantile_fraction, study.seed, k)
            });
            match self.next_for(study, &rungs, trial, k, exploit) {
                Next::Exploit { parent, parameters } => exploits.push(Decision::Exploit {
                    trial: trial.number,
                    parent,
                    parameters,
                    budget,
                }),
                Next::GoOn => go_on.push(Decision::Resume {
                    trial: trial.number,
                    budget,
                }),
                Next::Wait => {}
            }
        }
        // Copies first: they free the parents.
        let room = slots.saturating_sub(decisions.len());
        decisions.extend(exploits.into_iter().chain(go_on).take(room));
        PolicyOutput {
            decisions,
            state,
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

#[cfg(test)]
mod tests;
