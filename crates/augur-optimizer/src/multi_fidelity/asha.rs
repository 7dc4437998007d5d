//! ASHA, asynchronous successive halving (Li et al. 2020, "A System for Massively Parallel
//! Hyperparameter Tuning", Algorithm 2): a free slot goes to a promotion if one is due (from
//! the highest rung down, a paused trial in the top 1/η of the trials that reached its rung),
//! else to a new configuration at the lowest rung. Nobody waits for a rung to fill.

use std::collections::HashSet;

use crate::decision::{Decision, Policy, PolicyOutput, StudyView, TrialStatus, TrialView};
use crate::designer::{Algorithm, Designer, MetricSpec};
use crate::multi_fidelity::history::{ModelHistory, scheduler_designer, suggest_new};
use crate::multi_fidelity::{Fidelity, Progress, progress, ranked_at};

/// The ASHA scheduler; new configurations come from `designer`, which learns from the
/// history [`ModelHistory`] says when it uses history.
pub struct Asha {
    pub fidelity: Fidelity,
    /// The metric trials are ranked by at each rung.
    pub metric: MetricSpec,
    designer: Box<dyn Designer>,
    history: ModelHistory,
}

impl Asha {
    pub fn new(fidelity: Fidelity, metric: MetricSpec, designer: Box<dyn Designer>) -> Self {
        Asha {
            fidelity,
            metric,
            designer,
            history: ModelHistory::HighestRung,
        }
    }

    /// The same scheduler with its designer given `history`.
    pub fn with_history(self, history: ModelHistory) -> Self {
        Asha { history, ..self }
    }

    /// ASHA as a study with `scheduler: asha` and `algorithm` gets it: its designer and
    /// history from [`scheduler_designer`] (for gp_bandit, the GP over configuration ×
    /// budget).
    pub fn of(fidelity: Fidelity, metric: MetricSpec, algorithm: Algorithm) -> Self {
        let (designer, history) = scheduler_designer(algorithm);
        Asha::new(fidelity, metric, designer).with_history(history)
    }

    /// The paused trial to promote now and the rung it leaves, if one is due: from the top
    /// rung down, the best not yet promoted among the top ⌊n/η⌋ of the n trials that reached
    /// the rung. Once nothing runs and no new configuration may start (`end_game`: nothing
    /// can change the rungs any more), ⌈n/η⌉: else a rung of fewer than η trials would never
    /// promote its best.
    fn promotion(
        &self,
        rungs: &[f64],
        trials: &[TrialView],
        taken: &HashSet<u64>,
        end_game: bool,
    ) -> Option<(u64, usize)> {
        let eta = self.fidelity.reduction_factor;
        for k in (0..rungs.len().saturating_sub(1)).rev() {
            let reached = ranked_at(trials, rungs, k, &self.metric);
            let n = reached.len() as f64;
            let quota = if end_game {
                (n / eta).ceil()
            } else {
                (n / eta).floor()
            } as usize;
            let due = reached.iter().take(quota).find(|(value, t)| {
                value.is_finite()
                    && progress(rungs, t)
                        == Progress::Ended {
                            done: k,
                            paused: true,
                        }
                    && !taken.contains(&t.number)
            });
            if let Some((_, t)) = due {
                return Some((t.number, k));
            }
        }
        None
    }
}

impl Policy for Asha {
    fn decide(&self, study: &StudyView<'_>, slots: usize) -> PolicyOutput {
        let rungs = self.fidelity.rungs();
        let new_left = study.new_trials_left();
        let running = study
            .trials
            .iter()
            .any(|t| t.status == TrialStatus::Running);
        let end_game = new_left == 0 && !running;
        let mut decisions = Vec::new();
        let mut taken = HashSet::new();
        while decisions.len() < slots {
            let Some((trial, k)) = self.promotion(&rungs, study.trials, &taken, end_game) else {
                break;
            };
            taken.insert(trial);
            decisions.push(Decision::Resume {
                trial,
                budget: rungs[k + 1],
            });
        }
        let new = ((slots - decisions.len()) as u64).min(new_left) as usize;
        let mut state = None;
        if new > 0 {
            let output = suggest_new(self.designer.as_ref(), self.history, study, &rungs, new);
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
        // Nothing runs, nothing is due and nothing new may start: the paused trials will never
        // be promoted, so they end at their rung.
        let settled = end_game
            && self
                .promotion(&rungs, study.trials, &HashSet::new(), true)
                .is_none();
        if settled {
            decisions.extend(study.stop_paused());
        }
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

/// ASHA's stopping variant, for a trial that trains on in one process (it cannot pause and
/// resume): at the highest rung below the full budget that its measurements reached, it goes
/// on while it is in the top ⌈n/η⌉ of the n trials measured there (itself included), else it
/// should stop. `None` before its first rung.
pub fn stops_at_rung(
    fidelity: &Fidelity,
    metric: &MetricSpec,
    trial: &TrialView,
    peers: &[TrialView],
) -> Option<bool> {
    let rungs = fidelity.rungs();
    let latest = trial.measurements.last()?.step;
    let k = rungs[..rungs.len().saturating_sub(1)]
        .iter()
        .rposition(|r| Fidelity::step(*r) <= latest)?;
    let step = Fidelity::step(rungs[k]);
    let reached_k = |t: &&TrialView| t.measurements.iter().any(|m| m.step >= step);
    let own = crate::multi_fidelity::value_at(trial, metric, rungs[k]);
    let mut values: Vec<(f64, u64)> = peers
        .iter()
        .filter(|t| t.number != trial.number)
        .filter(reached_k)
        .map(|t| {
            (
                crate::multi_fidelity::value_at(t, metric, rungs[k]),
                t.number,
            )
        })
        .chain(std::iter::once((own, trial.number)))
        .collect();
    values.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let keep = (values.len() as f64 / fidelity.reduction_factor).ceil() as usize;
    let rank = values.iter().position(|(_, n)| *n == trial.number)?;
    Some(rank >= keep.max(1))
}
