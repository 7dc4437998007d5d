//! Hyperband (Li et al. 2018): brackets of synchronous successive halving that start at
//! different rungs, so that some configurations get the full budget at once (bracket 0) and
//! others are screened cheaply (bracket S). Trials join brackets in creation order, cycling
//! through S, S−1, …, 0; several brackets run at once. Within a bracket a rung is decided
//! when every trial meant to reach it has: its top ⌊n/η⌋ go on, the rest stop there.

use crate::decision::{Decision, Policy, PolicyOutput, StudyView, TrialStatus, TrialView};
use crate::designer::{Algorithm, Designer, MetricSpec};
use crate::multi_fidelity::history::{ModelHistory, scheduler_designer, suggest_new};
use crate::multi_fidelity::{Fidelity, progress, ranked_at};

/// The Hyperband scheduler; new configurations come from `designer`, given the history
/// [`ModelHistory`] says (none by default: the brackets decide which configurations go on).
pub struct Hyperband {
    pub fidelity: Fidelity,
    /// The metric trials are ranked by at each rung.
    pub metric: MetricSpec,
    designer: Box<dyn Designer>,
    history: ModelHistory,
}

/// Where a trial number falls: its bracket's instance (the cycle it is in), the bracket
/// (how many halvings it gets), and its first rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Slot {
    pub cycle: u64,
    pub bracket: usize,
    pub first_rung: usize,
}

impl Hyperband {
    pub fn new(fidelity: Fidelity, metric: MetricSpec, designer: Box<dyn Designer>) -> Self {
        Hyperband {
            fidelity,
            metric,
            designer,
            history: ModelHistory::None,
        }
    }

    /// The same scheduler with its designer given `history`.
    pub fn with_history(self, history: ModelHistory) -> Self {
        Hyperband { history, ..self }
    }

    /// Hyperband as a study with `scheduler: hyperband` and `algorithm` gets it: its
    /// designer and history from [`scheduler_designer`] (for gp_bandit, the GP over
    /// configuration × budget).
    pub fn of(fidelity: Fidelity, metric: MetricSpec, algorithm: Algorithm) -> Self {
        let (designer, history) = scheduler_designer(algorithm);
        Hyperband::new(fidelity, metric, designer).with_history(history)
    }

    /// Configurations bracket `b` starts with, of `rungs` rungs: ⌈(S+1)/(b+1)·η^b⌉, S the
    /// number of halvings of the largest bracket.
    pub(crate) fn bracket_size(&self, rungs: usize, b: usize) -> u64 {
        let s = rungs.saturating_sub(1) as f64;
        let eta = self.fidelity.reduction_factor;
        ((s + 1.0) / (b as f64 + 1.0) * eta.powi(b as i32)).ceil() as u64
    }

    /// The bracket of trial `number` (from 1): brackets S, S−1, …, 0 fill in turn.
    pub(crate) fn slot(&self, rungs: usize, number: u64) -> Slot {
        let s = rungs.saturating_sub(1);
        let sizes: Vec<u64> = (0..=s).rev().map(|b| self.bracket_size(rungs, b)).collect();
        let cycle_len: u64 = sizes.iter().sum::<u64>().max(1);
        let index = number.saturating_sub(1);
        let mut position = index % cycle_len;
        let mut bracket = 0;
        for (i, size) in sizes.iter().enumerate() {
            if position < *size {
                bracket = s - i;
                break;
            }
            position -= size;
        }
        Slot {
            cycle: index / cycle_len,
            bracket,
            first_rung: s - bracket,
        }
    }

    /// How many of a bracket's `n` trials reach each rung from its first: n, ⌊n/η⌋, … (at
    /// least one), indexed by rung.
    fn expected(&self, rungs: usize, first_rung: usize, n: u64) -> Vec<u64> {
        let mut out = vec![0; rungs];
        let mut count = n;
        for slot in out.iter_mut().skip(first_rung) {
            *slot = count;
            count = ((count as f64 / self.fidelity.reduction_factor).floor() as u64).max(1);
        }
        out
    }

    /// Decisions on the brackets' paused trials: for each rung every member of the bracket
    /// has finished, the top ⌊n/η⌋ are promoted (highest rungs first) and the rest stop.
    fn bracket_decisions(
        &self,
        study: &StudyView<'_>,
        rungs: &[f64],
    ) -> (Vec<Decision>, Vec<Decision>) {
        let mut brackets: Vec<(Slot, Vec<&TrialView>)> = Vec::new();
        for trial in study.trials {
            let slot = self.slot(rungs.len(), trial.number);
            match brackets.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(trial),
                None => brackets.push((slot, vec![trial])),
            }
        }
        let none_left = study.new_trials_left() == 0;
        let (mut promotions, mut stops) = (Vec::new(), Vec::new());
        for (slot, members) in brackets {
            let full = self.bracket_size(rungs.len(), slot.bracket);
            // A bracket the study's budget cut short is decided on the trials it has.
            let n = if none_left {
                members.len() as u64
            } else {
                full
            };
            let expected = self.expected(rungs.len(), slot.first_rung, n);
            for k in (slot.first_rung..rungs.len() - 1).rev() {
                let ranked = ranked_at(members.iter().copied(), rungs, k, &self.metric);
                if (ranked.len() as u64) < expected[k] {
                    continue;
                }
                let quota = expected[k + 1] as usize;
                for (i, (_, t)) in ranked.iter().enumerate() {
                    if t.status != TrialStatus::Paused || progress(rungs, t).rungs_done() != Some(k)
                    {
                        continue;
                    }
                    if i < quota {
                        promotions.push(Decision::Resume {
                            trial: t.number,
                            budget: rungs[k + 1],
                        });
                    } else {
                        stops.push(Decision::Stop { trial: t.number });
                    }
                }
            }
        }
        (promotions, stops)
    }
}

impl Policy for Hyperband {
    fn decide(&self, study: &StudyView<'_>, slots: usize) -> PolicyOutput {
        let rungs = self.fidelity.rungs();
        let (promotions, stops) = self.bracket_decisions(study, &rungs);
        let mut decisions: Vec<Decision> = promotions.into_iter().take(slots).collect();
        let new = ((slots - decisions.len()) as u64).min(study.new_trials_left()) as usize;
        let mut state = None;
        if new > 0 {
            // Each new trial starts at its bracket's first rung, by the number it will get.
            let output = suggest_new(self.designer.as_ref(), self.history, study, &rungs, new);
            state = output.state;
            for (i, parameters) in output.suggestions.into_iter().enumerate() {
                let slot = self.slot(rungs.len(), study.next_trial_number.max(1) + i as u64);
                decisions.push(Decision::New {
                    parameters,
                    budget: Some(rungs[slot.first_rung]),
                });
            }
        }
        decisions.extend(stops);
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
