//! The GP bandit: Bayesian optimization with GP-UCB-PE (Contal et al. 2013; the design
//! follows OSS Vizier's default designer, see DESIGN.md §5).

use rand::{SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use crate::designer::{Designer, DesignerInput, DesignerOutput, trial_seed};
use crate::gp::encoding::Encoder;
use crate::quasi_random::quasi_random_assignment;
use crate::space::Assignment;

// The designer's parts, each one step of the list above: its knobs, the model (2, 5), the
// warm start (3), the acquisition (4–7) and how it is maximized (8).
mod acquisition;
mod config;
mod model;
mod refine;
mod search;
#[cfg(test)]
mod tests;
mod warm_start;

pub use acquisition::log_h;
pub use config::{Acquisition, BatchAcquisition, GpBanditConfig, PowerWarping, WarpingChoice};
use model::Model;
use warm_start::has_prior_trials;

/// The GP bandit designer (the steps above), with its knobs.
///
/// Per call:
/// 1. The first trials of a study are scrambled Sobol points, until
///    [`GpBanditConfig::initial_trials`] trials have finished. No centre point: a design
///    that starts at the centre looks good exactly when the optimum is near the centre
///    (Levy and Rosenbrock on their public boxes) and wastes a trial otherwise. With a warm
///    start ([`DesignerInput::prior_studies`]) the GP takes over at once, as long as the
///    new trials do not contradict the prior studies (see 3).
/// 2. Completed trials are encoded ([`Encoder`]: numbers in `[0, 1]`, categoricals as level
///    indices compared by the kernel's Hamming term), each objective metric's values warped
///    ([`warp`](crate::gp::warping::warp)), and one GP per objective fitted (MAP hyperparameters, warm-started from
///    the state returned last time), whose prior mean is a fitted quadratic bowl rather
///    than the targets' average ([`GpBanditConfig::trend`], [`crate::gp::mean`]): away
///    from the data the mean then points to the bowl's floor, which a GP that models
///    ripples with short length scales (Levy) does not see otherwise. Large histories are
///    subsampled (the best third plus the most recent) so the cost of a suggestion is
///    bounded without a clock.
/// 3. Warm start: the prior studies' trials (warped together with the new study's, so both
///    are on one scale) join the GP with a categorical *study* feature, whose Hamming term
///    learns how far the studies agree (a two-task GP, see `model::fit_objective`); while a
///    prior is used, UCB's β is small ([`GpBanditConfig::warm_start_ucb_beta`]), so the
///    study follows the prior's best region. A prior whose learned study correlation is low
///    is dropped (a cold GP, and the quasi-random design while warming up), and so is every
///    prior once the new study has [`GpBanditConfig::warm_start_trials`] trials of its own. (A stacked residual
///    GP, as in Vizier, was tried first: on Branin shifted by (0.15, −0.2) it sat at the
///    prior's optimum, regret 0.24, for 10–20 trials, since the residual of a shifted
///    function is a gradient field that a GP on a few clustered points learns slowly.)
/// 4. The first suggestion maximizes UCB `μ + β σ` (β = 1.8, or 1.0 on spaces of doubles
///    only, see [`GpBanditConfig`]), with σ *pending-aware* (pending trials
///    and the batch's earlier suggestions enter the covariance), so it does not repeat a
///    running trial. The rest of the batch either do the same (GP-BUCB, the default, see
///    [`BatchAcquisition`] for the measured reason) or, with [`BatchAcquisition::UcbPe`],
///    maximize the pending-aware σ among points whose UCB reaches the best lower confidence
///    bound of the observed points (pure exploration within the promising region). With
///    [`GpBanditConfig::batch_thompson_every`], some of those members instead maximize a
///    function drawn from the posterior (Thompson sampling, [`PathwiseSample`](crate::gp::pathwise::PathwiseSample));
///    [`GpBanditConfig::sequential_thompson_every`] does the same with nothing pending
///    (opt-in: it did not help one at a time).
/// 5. Safety metrics (a `safety_threshold`): one GP per safety metric on its margin to the
///    threshold gives the probability `p(x)` that a point is safe; the acquisition value
///    `a` becomes `a₀ + (a − a₀) p(x)` above a floor `a₀` (probability-weighted, as in
///    constrained EI, Gardner et al. 2014), and with `desired_min_safe_trials_fraction`
///    a point must also reach the probability that keeps the expected safe fraction at
///    the target.
/// 6. Optionally ([`GpBanditConfig::trust_region`], off by default since the trend), early
///    candidates are confined to a trust region around observed points (in the numeric
///    features), growing with the number of trials.
/// 7. Several metrics: a random hypervolume scalarization `min_k (v_k − r_k)/w_k` of the
///    per-metric acquisition values, with a fresh direction `w` per suggestion (Golovin &
///    Zhang 2020).
/// 8. The acquisition (`acquisition.rs`) is maximized by an evolutionary population search
///    (`search.rs`; firefly-style moves towards better individuals plus Gaussian mutations
///    with a shrinking step; categorical features copy the attractor's level or jump to a
///    random level), seeded with the best
///    observed points and every one-parameter discrete move from the best two (each other
///    category, the next integer up and down), and finished by a local search over those
///    discrete moves, which continuous steps cannot make. On spaces of doubles the best
///    few distinct candidates are then climbed by gradient ascent on the acquisition
///    (`refine.rs`; [`GpBanditConfig::refine_starts`]), which random moves do slowly in
///    many dimensions. A winner that would only re-measure a known point on a face of the
///    box gives way to the best candidate farther off (`acquisition::pick_candidate`).
#[derive(Default)]
pub struct GpBanditDesigner {
    pub config: GpBanditConfig,
}

/// What the designer hands back as `previous_state`: the fitted log-hyperparameters per
/// modelled metric (objectives, then safety metrics), used as a warm start next time.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GpState {
    /// Feature dimension the hyperparameters belong to.
    dim: usize,
    /// `θ` per modelled metric (objectives: fitted to the configured warping's targets).
    theta: Vec<Vec<f64>>,
    /// Per objective, `θ` fitted to the standardized targets when the warping was chosen
    /// per fit (see [`WarpingChoice`]), so each of the two fits starts from its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    standardized_theta: Vec<Option<Vec<f64>>>,
    /// Per objective, whether that choice standardized the targets this time (a record of
    /// what the model was, for tracing; empty without the choice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    standardized: Vec<bool>,
}

impl Designer for GpBanditDesigner {
    fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput {
        let encoder = Encoder::new(input.space);
        let mut rng = StdRng::seed_from_u64(trial_seed(input.seed, input.first_trial_number));
        let initial = self.config.initial_trials(encoder.num_parameters());
        let sobol = |i: usize| {
            quasi_random_assignment(
                input.space,
                input.seed,
                input.first_trial_number.saturating_sub(1) + i as u64,
            )
        };
        let quasi_random_only = |suggestions: Vec<Assignment>| {
            let mut suggestions = suggestions;
            while suggestions.len() < input.count {
                suggestions.push(sobol(suggestions.len()));
            }
            DesignerOutput {
                suggestions,
                state: None,
            }
        };
        if encoder.dim() == 0 || input.count == 0 {
            return quasi_random_only(Vec::new());
        }
        let warming_up = input.completed.len() < initial;
        if warming_up && !has_prior_trials(input) {
            return quasi_random_only(Vec::new());
        }
        // No usable model (should not happen on validated input): quasi-random points rather
        // than failing the study. While warming up, only a model that kept its prior
        // studies is worth more than the space-filling design.
        let Some(mut model) = Model::fit(&self.config, &encoder, input, &mut rng)
            .filter(|m| !warming_up || m.uses_prior())
        else {
            return quasi_random_only(Vec::new());
        };
        let state = serde_json::to_value(GpState {
            dim: encoder.dim(),
            theta: model.thetas(),
            standardized_theta: model.standardized_thetas(),
            standardized: model.standardized(),
        })
        .ok();
        let mut suggestions = Vec::with_capacity(input.count);
        let mut first = true;
        while suggestions.len() < input.count && !crate::cancel::requested() {
            // By trial number, so that a batch and one-at-a-time suggestions with trials
            // running get the same share of Thompson draws.
            // With nothing pending (one at a time, or a batch's first member) the draw has
            // its own, opt-in, period.
            let every = if model.pending.is_empty() {
                self.config.sequential_thompson_every
            } else {
                self.config.batch_thompson_every
            };
            let trial = input.first_trial_number + suggestions.len() as u64;
            let thompson = every > 0 && trial.is_multiple_of(every);
            let a = match model.next_point(&self.config, &encoder, first, thompson, &mut rng) {
                Some(x) => {
                    let a = encoder.decode(&x);
                    model.add_pending(x);
                    a
                }
                None => sobol(suggestions.len()),
            };
            suggestions.push(a);
            first = false;
        }
        DesignerOutput { suggestions, state }
    }

    fn uses_history(&self) -> bool {
        true
    }
}
