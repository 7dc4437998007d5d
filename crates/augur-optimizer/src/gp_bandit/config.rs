//! The GP bandit's tuning knobs ([`GpBanditConfig`]) and the choices they name; every
//! default says in its doc comment what measured it (benches/quality/HISTORY.md; the
//! current figures are in RESULTS.md).

use crate::gp::mean::{TrendBasis, TrendSpec};
use crate::gp::model::Prior;
use crate::gp::warping::{Power, Warping, fit_power, power_evidence};

/// How the suggestions after the first of a batch (or while trials are pending) are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAcquisition {
    /// UCB with the pending-aware σ (GP-BUCB, Desautels et al. 2014): pending points and
    /// the batch's earlier suggestions shrink σ around themselves, so the batch spreads
    /// while every member still trades off mean and uncertainty. The default: on the
    /// reference suite with batches of 5 it reached lower regret than UCB-PE (e.g. Branin
    /// median regret at 25 trials 0.008 vs 0.5, Hartmann6 at 50 trials 0.008 vs 0.13; six
    /// seeds each).
    PendingUcb,
    /// GP-UCB-PE (Contal et al. 2013, as in OSS Vizier): maximize the pending-aware σ among
    /// points whose UCB reaches the best LCB of the observed points.
    UcbPe,
}

/// What the first suggestion of a batch (and, with pending points, every suggestion)
/// maximizes for a single objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquisition {
    /// `μ + β σ`.
    Ucb,
    /// `ln EI` with `EI = σ h((μ − y*)/σ)`, `h(z) = φ(z) + z Φ(z)` and y* the best warped
    /// target (Jones et al. 1998; in log space as Ament et al. 2023 advise, so that far-off
    /// candidates still rank instead of all scoring 0). Pending points enter through the
    /// pending-aware σ, as for UCB. Several objectives always use UCB (their scalarization
    /// needs values on the targets' scale).
    LogEi,
}

/// The default trend (see [`GpBanditConfig::trend`]), also what a `trend=…` override starts
/// from when the config has none: quadratic, each coefficient's prior sd 0.3 on
/// standardized targets (the basis columns have unit variance over the box), a bowl or
/// nothing per feature.
pub(super) const DEFAULT_TREND: TrendSpec = TrendSpec {
    basis: TrendBasis::Quadratic,
    prior_sd: 0.3,
    concave: true,
    select: None,
};

/// Tuning knobs of the GP bandit; [`Default`] is what studies get.
#[derive(Debug, Clone)]
pub struct GpBanditConfig {
    /// UCB exploration coefficient β in `μ + β σ` (on standardized warped outputs) for
    /// spaces with integer, discrete, categorical or conditional parameters. 1.8 as in
    /// Vizier: with less (1.0) the GP settled on one categorical branch too early (a mixed
    /// test space: loss < 0.2 in 2 of 6 studies vs 5 of 6 with 1.8).
    pub ucb_beta: f64,
    /// β for spaces of doubles only. On the reference suite (10 seeds, parallel 1 and 5)
    /// 1.0 gave lower median regret than 1.8 on Ackley5 (1.24 vs 2.0 at 50 trials),
    /// Rosenbrock4 (2.17 vs 2.77), Levy10 (0.21 vs 0.55 at 100) and Hartmann6 in batches,
    /// and equal on Branin. Re-measured with the quadratic trend (opt-21, seeds 0–29): 2.0
    /// met 38, 40 and 35 of 44 cells on seeds 0–9, 10–19 and 20–29 (1.0: 35, 36, 38; 1.8
    /// on 0–9: 35), gaining Levy10 off-centre and Ackley5 @50 but polishing Branin 4–80×
    /// worse (geometric mean regret over every cell and seed 1.35× that of 1.0).
    pub continuous_ucb_beta: f64,
    /// On spaces of doubles, β is `continuous_ucb_beta · (D/2)^e` for D parameters (see
    /// [`GpBanditConfig::continuous_beta`]). 0: off (the default). With e = ½ (β from 1.0
    /// on Branin to 2.24 on Levy10) the quality bench met 36, 38 and 37 of 44 cells on
    /// seeds 0–9, 10–19 and 20–29 (the default 35, 36, 38): Levy10 off-centre at 100
    /// trials improved in 43 of 60 studies, but Hartmann6 and Rosenbrock6 off-centre
    /// lost about as much (geometric mean regret over every cell and seed 1.03× the
    /// default's). See benches/quality/HISTORY.md (opt-21).
    pub ucb_beta_dim_exponent: f64,
    pub batch: BatchAcquisition,
    /// Most completed trials the GP conditions on.
    pub max_train_points: usize,
    /// Most completed trials the hyperparameters are fitted on (a subset of the above).
    pub max_fit_points: usize,
    /// Most prior-study trials (warm start) the GP conditions on.
    pub max_prior_points: usize,
    /// Population size of the acquisition search.
    pub population: usize,
    /// Uniform random candidates scored once, whose best fill the population.
    pub raw_samples: usize,
    /// Generations of the acquisition search (each evaluates `population` candidates).
    pub generations: usize,
    /// L-BFGS iterations per hyperparameter fit.
    pub fit_iters: u64,
    /// Confine early candidates to an L∞ region around observed points, of radius
    /// `0.2 + 0.1 n/D` after n trials in D parameters (see the module header). Off since
    /// opt-22: with the quadratic trend the GP's mean away from the data is no longer the
    /// targets' average, which the region guarded against. Alone it changed little (quality
    /// bench, seeds 0–29: 109 of 132 cells met, the default then 107; geometric mean regret
    /// 1.00× the default's); without it, refinement ([`GpBanditConfig::refine_starts`]) no
    /// longer loses cells (see there). See benches/quality/HISTORY.md (opt-22).
    pub trust_region: bool,
    pub acquisition: Acquisition,
    /// Best distinct candidates of the population search refined by gradient ascent on the
    /// acquisition (0: none), and the most steps per refinement. 3 × 20 since opt-22, with
    /// the trust region off: on the quality bench (44 cells per seed set) it met 38, 36 and
    /// 35 cells on seeds 0–9, 10–19 and 20–29 (before: 32, 36, 39) with a geometric mean
    /// regret over every cell, checkpoint and seed of 0.83× the former default's (better in
    /// 716 of 1,273 paired checkpoints, worse in 557): Branin 0.17× one at a time, Hartmann6
    /// 0.43× one at a time, Levy10 off-centre 0.76–0.88×; Levy10 one at a time 1.22×, still
    /// far below every reference. With the trust region kept it met 33, 34, 36 (0.82×).
    /// Spaces of doubles only. A suggestion takes 5–18 % longer (d = 10, 100 trials, wall
    /// clock; `examples/suggest_cpu`, interleaved with the former default). Before the trend (opt-14) it helped only Hartmann6 in batches and failed
    /// tests/warm_start.rs (its cold Branin studies polished further than the warm ones
    /// could follow); with the trend that test passes. See benches/quality/HISTORY.md.
    pub refine_starts: usize,
    pub refine_steps: usize,
    /// The numeric length scales' prior median is `0.5 (D/2)^e` for D numeric features.
    pub length_scale_dim_exponent: f64,
    /// Half-rank and log warping of the targets before standardizing (see [`warp`](crate::gp::warping::warp)).
    pub rank_warping: bool,
    pub log_warping: bool,
    /// A Yeo-Johnson power transform of the targets with λ fitted per study by maximum
    /// likelihood (see [`warp`](crate::gp::warping::warp) and [`PowerWarping`]). Off: on the quality bench (seeds
    /// 0–9, 44 cells, 32 met by default) replacing the half-rank and log warping with it
    /// met 32 (Levy's bowl gets compressed too: its fitted λ rises to 2–3 as the GP samples
    /// near good values), and the best variant, [`PowerWarping::Choose`] with λ ≥ 2,
    /// met 34 but lost mixed_ackley6 with batches of 5 (median regret 2.68 against 2.23
    /// at 50 trials; the reference's 2.46). That loss is seed noise (opt-15: the chooser
    /// standardizes there in every batch, λ 0.3–1.4; over seeds 0–59 it beats the default in
    /// 34 and 28 of 60 studies at 30 and 50 trials); its real cost is mixed_train5, which
    /// it standardizes while λ ≈ 2 early on (worse than the default in 19 of 60 studies at
    /// 30 trials, better in 5). See benches/quality/HISTORY.md.
    pub power_warping: PowerWarping,
    /// Least λ of [`PowerWarping::Initial`] (1: never stretch the bad tail).
    pub power_min_lambda: f64,
    /// [`PowerWarping::Choose`]: the fitted λ from which the half-rank and log warping
    /// are used.
    pub power_choose_lambda: f64,
    /// [`PowerWarping::Choose`]: standardization alone only if the fitted λ's profile
    /// log-likelihood beats that of λ = `power_choose_lambda` by at least this much (see
    /// [`power_evidence`]; 0: whenever λ is below it). The half-rank and log warping stay
    /// unless the trials clearly show no heavy bad tail. Measured: with 1 or 1.92 (5 % level)
    /// mixed_train5 and Branin get the default's results back, but Levy10 loses most of
    /// the chooser's gains (its λ < 2 is not yet significant by 50 trials): 31 and 30 of
    /// 44 cells met on seeds 0–9.
    pub power_choose_margin: f64,
    /// Choose the output warping per fit by how well each model predicts (see
    /// [`WarpingChoice`]). Off by default: on the quality bench (seeds 0–9, 44 cells, 32
    /// met by default) the leave-one-out ranking alone met 30 (it standardizes Branin,
    /// whose polishing needs the log warping: 1.2e-4 against 5.3e-6 at 50 trials), and as
    /// a check on the λ chooser's standardization ([`PowerWarping::Choose`], λ < 2) 31:
    /// it gives Branin and mixed_train5 the default's results back but keeps the warping
    /// on Levy10's first 30–50 trials, where the ranking slightly favours it, and so loses
    /// the chooser's Levy gains. [`WarpingChoice::Likelihood`] keeps every heavy-tailed
    /// problem warped (Branin, Rosenbrock, mixed_train5: the default's figures) but
    /// standardizes Levy only now and then: 32 met, as with a margin of −3 nats (more
    /// standardization: Levy10 off-centre's batches gain, mixed_ackley6's batches lose) and
    /// as the λ chooser's guard with −5 nats; [`WarpingChoice::LooLikelihood`] met 30. As
    /// the λ chooser's guard with −10 nats it met 33 (34 on seeds 10–19, the default 29),
    /// but made the default it failed tests/warm_start.rs: its prior study got stuck on
    /// Branin's edge x₀ = 10 (fixed since by [`GpBanditConfig::boundary_revisit_radius`],
    /// with which it passes). Against today's references it meets 32 of 44 on seeds 0–9 and
    /// 32 on 10–19 (the default 29 and 28), but it is not the default because it makes
    /// mixed_train5 worse (20 seeds, median at 50 trials 0.028 against 0.0093 one at a
    /// time; opt-17). The second fit costs ~18 ms of CPU at 100 trials (d = 10: ~40 ms a
    /// suggestion instead of 22). See benches/quality/HISTORY.md (opt-16, opt-17).
    pub warping_choice: WarpingChoice,
    /// [`WarpingChoice::LooRank`]: the share of the training points, best first by
    /// observed value, whose leave-one-out ranking is scored (1: all of them).
    pub warping_choice_top: f64,
    /// [`WarpingChoice::LooRank`] and [`WarpingChoice::Likelihood`]: standardization alone
    /// is used only if its model's score beats the warped model's by more than this (in
    /// Spearman's correlation or in nats; ties keep the warping, a negative margin favours
    /// standardization).
    pub warping_choice_margin: f64,
    /// A suggestion on a face of the box (a numeric feature at its bound) that lies within
    /// this L∞ distance (unit cube) of a known point, where the GP predicts no improvement
    /// over the best observed target, is a *revisit*: it is replaced by the best candidate at
    /// least this far from every known point (0: off; see `acquisition::pick_candidate`).
    pub boundary_revisit_radius: f64,
    /// With k pending points (running trials and the batch's earlier suggestions), UCB's
    /// β is multiplied by `1 + g min(k, 4)`.
    pub batch_beta_growth: f64,
    /// While trials are pending, every trial whose number is a multiple of this (0: never)
    /// maximizes a function drawn from the GP posterior (Thompson sampling, see
    /// [`PathwiseSample`](crate::gp::pathwise::PathwiseSample)) instead of UCB, so that a batch whose UCB members crowd one basin
    /// still sends one member wherever the posterior says the optimum may be. Single
    /// objective, spaces of doubles, no safety metrics, no warm start; otherwise UCB.
    /// 5: on the quality bench with batches of 5 (one drawn member per batch) it met 31 of
    /// 44 cells on seeds 0–9 (the default before, 29) and 18 of the 22 batch cells on seeds
    /// 10–19 (16), losing none: Levy10 at 100 trials 6.88 → 4.39 and 8.29 → 3.86, Levy10
    /// off-centre 10.4 → 8.67 and 11.6 → 7.8; Hartmann6's batches did not change (4–5 of
    /// 10 still end in its local minimum). Every 2nd or every trial drawn was worse. See
    /// benches/quality/HISTORY.md (opt-18).
    pub batch_thompson_every: u64,
    /// With nothing pending (suggestions one at a time, or a batch's first member), every
    /// trial whose number is a multiple of this (0: never) maximizes a Thompson draw
    /// instead of UCB, under the same restrictions as
    /// [`GpBanditConfig::batch_thompson_every`]: meant as a chance for a study that UCB
    /// keeps in one basin to leave it. Off: on the quality bench one at a time (22 cells
    /// per seed set; the default meets 13 on seeds 0–9 and 12 on 10–19) every 3rd, 5th or
    /// 10th trial drawn met 11/10, 11/9 and 12/10 (one cell gained, Ackley5 @30 with 5 on
    /// seeds 0–9; two or three lost per set, mostly Ackley5 and Rosenbrock6 off-centre
    /// @30); the Hartmann6 studies in its local minimum at 100 trials are the same seeds
    /// whatever k, even with every trial drawn (their basin is decided by the Sobol
    /// design), and Levy10 off-centre at 100 trials got worse (9.1 → 17.9 with 5). See
    /// benches/quality/HISTORY.md (opt-19).
    pub sequential_thompson_every: u64,
    /// Random Fourier features of a Thompson draw (its cost: ~70 ms of CPU per drawn
    /// suggestion with 1024, d = 10).
    pub thompson_features: usize,
    /// Prior mean of the numeric `ln ℓ` for 2 numeric features.
    pub length_scale_prior_base: f64,
    /// Lower bound of the numeric `ln ℓ`.
    pub min_ln_length_scale: f64,
    /// Prior sd of the numeric `ln ℓ`.
    pub length_scale_prior_sd: f64,
    /// Prior mean and sd of `ln σ_n²` (noise variance on standardized warped targets).
    pub noise_prior: (f64, f64),
    /// Confine candidates to a box around the incumbent whose side adapts to successes and
    /// failures (TuRBO, Eriksson et al. 2019; see `model::incumbent_box`). Single objective only.
    /// Off: tried against Levy10's gap to the GP references, it made Levy worse (parallel
    /// 1, median at 100 trials: 8.9 against 5.3 on the public box, 22 against 9.1 off-centre)
    /// while helping Branin (50 trials: 1.4e-7 against 5.3e-6), Ackley5 (1.6 against 2.0) and
    /// Hartmann6 (100 trials: 1.6e-5 against 4.5e-5); 7–10 seeds each.
    pub incumbent_region: bool,
    /// UCB β while a warm-started study uses its prior studies.
    pub warm_start_ucb_beta: f64,
    /// Warm start: the new study's trials after which prior studies are no longer used,
    /// as a multiple of [`GpBanditConfig::initial_trials`]. 10 (50 trials on Branin): with
    /// 3, the shifted-Branin studies above lost their lead at trial 15 (a cold GP on
    /// clustered trials explores again) and reached the cold 50-trial regret only at 50.
    pub warm_start_initial_multiple: usize,
    /// Quasi-random trials per parameter before the GP takes over (see
    /// [`GpBanditConfig::initial_trials`]). 2 rather than 1: with `d + 1` Sobol points and
    /// no centre point, 5 of 10 Hartmann6 studies ended in the local minimum (regret 0.12)
    /// even at 100 trials; with `2d + 1`, median regret at 50 trials fell from 0.06 to
    /// 0.001 (Levy10 off-centre at 100 trials: 17 → 9.1; 10 seeds each). Ackley5 and the
    /// mixed problems lost a little (e.g. Ackley5 at 50: 1.76 → 2.04), still below every
    /// reference.
    pub initial_per_parameter: f64,
    /// Most quasi-random trials before the GP takes over.
    pub max_initial_trials: usize,
    /// A fitted trend as the GP's prior mean (see [`crate::gp::mean`] and
    /// `model::fit_posterior`; `None`: zero mean, i.e. the standardized targets' average), for
    /// every objective; with a warm start one trend for both studies. Safety metrics keep
    /// the zero mean. Default: a per-feature quadratic bowl with prior sd 0.3
    /// (`DEFAULT_TREND`). Why: with a zero mean the GP fits Levy's ripples (length
    /// scales 0.05–0.1) and its mean away from the data reverts to the average, so UCB
    /// stays in one ripple valley; the bowl's mean points to the better valleys. On the
    /// quality bench (44 cells per seed set) it met 35 on seeds 0–9 and 36 on 10–19 (zero
    /// mean: 31 and 30), Levy10 at 100 trials one at a time 5.31 → 0.56 and 6.06 → 0.57;
    /// lost three cells on seeds 0–9 by at most 10 % (Ackley5 @50, p1 and p5, met on seeds
    /// 10–19; Levy10 off-centre p5 @30) and none on 10–19. Prior sd 1 met 34 and 36 but
    /// failed tests/warm_start.rs (median 31 trials, allowed 30); 0.5 met 34 and 31; a
    /// learned constant mean or a linear trend did not help Levy. See
    /// benches/quality/HISTORY.md (opt-20).
    pub trend: Option<TrendSpec>,
}

/// Where the output warping's Yeo-Johnson λ comes from (see [`GpBanditConfig::warping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerWarping {
    /// No power transform.
    Off,
    /// λ fitted on the targets being warped (all trials the GP sees).
    AllTrials,
    /// λ and the standardization fitted on the study's first (quasi-random, space-filling)
    /// trials, whose values are a sample of the objective over the space rather than of
    /// where the GP has been sampling, and λ at least
    /// [`GpBanditConfig::power_min_lambda`].
    Initial,
    /// No power transform; λ fitted on all trials only chooses between the half-rank and
    /// log warping (heavy tail: λ ≥ [`GpBanditConfig::power_choose_lambda`]) and
    /// standardization alone.
    Choose,
}

/// Whether each fit chooses between the configured output warping (half-rank + log by
/// default, see [`GpBanditConfig::warping`]) and standardization alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarpingChoice {
    /// Always the configured warping.
    Fixed,
    /// Fit a GP to each of the two target sets (same points, same fitting effort) and keep
    /// the one whose closed-form leave-one-out means ([`Posterior::loo_means`](crate::gp::model::Posterior::loo_means)) rank the
    /// observed values better ([`loo_rank_quality`](crate::gp::rank::loo_rank_quality) over the best
    /// [`GpBanditConfig::warping_choice_top`] of the training points). A rank statistic
    /// is unchanged by the increasing output transform, so the two models are scored on
    /// one scale. Cold fits only (a warm-started fit keeps the configured warping, which
    /// its prior studies share); costs a second hyperparameter fit per objective.
    ///
    /// With [`PowerWarping::Choose`], the fitted λ proposes standardization (λ below
    /// [`GpBanditConfig::power_choose_lambda`]) and this ranking must confirm it: the
    /// second fit runs only then, and otherwise the half-rank and log warping stay.
    LooRank,
    /// As [`WarpingChoice::LooRank`], scored instead by each model's log marginal
    /// likelihood of the values on their own scale: `ln p_GP(w(y)) + Σ ln w′(yᵢ)` over the
    /// training points ([`Posterior::log_marginal_likelihood`](crate::gp::model::Posterior::log_marginal_likelihood), [`log_jacobian`](crate::gp::warping::log_jacobian), whose
    /// half-rank derivative comes from a smooth surrogate); the margin is in nats.
    Likelihood,
    /// As [`WarpingChoice::Likelihood`] with the leave-one-out log predictive probability
    /// ([`Posterior::loo_log_predictive`](crate::gp::model::Posterior::loo_log_predictive)) in place of the marginal likelihood: each
    /// point's density given the others, on the values' own scale (a cross-validation
    /// score, less tied to the model being right than the marginal likelihood; Rasmussen &
    /// Williams 2006, §5.4.2).
    LooLikelihood,
}

impl Default for GpBanditConfig {
    fn default() -> Self {
        GpBanditConfig {
            ucb_beta: 1.8,
            continuous_ucb_beta: 1.0,
            ucb_beta_dim_exponent: 0.0,
            batch: BatchAcquisition::PendingUcb,
            max_train_points: 300,
            max_fit_points: 80,
            max_prior_points: 100,
            population: 64,
            raw_samples: 512,
            generations: 30,
            fit_iters: 30,
            trust_region: false,
            acquisition: Acquisition::Ucb,
            refine_starts: 3,
            refine_steps: 20,
            length_scale_dim_exponent: 0.0,
            length_scale_prior_sd: 1.0,
            min_ln_length_scale: Prior::default().min_ln_length_scale,
            rank_warping: true,
            log_warping: true,
            power_warping: PowerWarping::Off,
            power_min_lambda: 1.0,
            power_choose_lambda: 3.5,
            power_choose_margin: 0.0,
            warping_choice: WarpingChoice::Fixed,
            warping_choice_top: 1.0,
            warping_choice_margin: 0.0,
            batch_beta_growth: 0.0,
            batch_thompson_every: 5,
            sequential_thompson_every: 0,
            thompson_features: 1024,
            boundary_revisit_radius: 0.01,
            length_scale_prior_base: Prior::default().ln_length_scale.0,
            noise_prior: (-6.9, 2.0),
            incumbent_region: false,
            warm_start_initial_multiple: 10,
            warm_start_ucb_beta: 0.2,
            initial_per_parameter: 2.0,
            max_initial_trials: 20,
            trend: Some(DEFAULT_TREND),
        }
    }
}

impl GpBanditConfig {
    /// The hyperparameter prior for `numeric` numeric features.
    pub(super) fn prior(&self, numeric: usize) -> Prior {
        let shift = self.length_scale_dim_exponent * (numeric.max(2) as f64 / 2.0).ln();
        Prior {
            ln_length_scale: (
                self.length_scale_prior_base + shift,
                self.length_scale_prior_sd,
            ),
            ln_noise: self.noise_prior,
            min_ln_length_scale: self.min_ln_length_scale,
        }
    }

    /// The output warping steps the GP's targets get, for an objective with `values`
    /// (per completed trial, in completion order, larger is better) in a space of
    /// `num_parameters` parameters.
    pub fn warping(&self, values: &[Option<f64>], num_parameters: usize) -> Warping {
        let (mut rank, mut log) = (self.rank_warping, self.log_warping);
        let power = match self.power_warping {
            PowerWarping::Off => Power::Off,
            PowerWarping::AllTrials => Power::Fitted,
            PowerWarping::Initial => {
                let k = self.initial_trials(num_parameters).min(values.len());
                fit_power(&values[..k], self.power_min_lambda)
            }
            PowerWarping::Choose => {
                let heavy = match power_evidence(values, self.power_choose_lambda) {
                    Some((lambda, gain)) => {
                        lambda >= self.power_choose_lambda || gain < self.power_choose_margin
                    }
                    None => false,
                };
                rank &= heavy;
                log &= heavy;
                Power::Off
            }
        };
        Warping { rank, log, power }
    }

    /// UCB's β on a space of `dim` doubles: `continuous_ucb_beta · (max(D, 2)/2)^e`, so that
    /// exploration grows with the dimension as GP-UCB's confidence width does (its `β_t`
    /// grows linearly in D, Srinivas et al. 2010, Theorem 2, and the coefficient of σ is
    /// `√β_t`: e = ½).
    pub fn continuous_beta(&self, dim: usize) -> f64 {
        self.continuous_ucb_beta * (dim.max(2) as f64 / 2.0).powf(self.ucb_beta_dim_exponent)
    }

    /// The new study's trials after which prior studies are no longer used.
    pub fn warm_start_trials(&self, num_parameters: usize) -> usize {
        self.warm_start_initial_multiple * self.initial_trials(num_parameters)
    }

    /// Apply `key=value` overrides (comma-separated) of the numeric knobs, for the quality
    /// bench's experiments. Unknown keys or bad values are errors.
    pub fn with_overrides(mut self, overrides: &str) -> Result<Self, String> {
        for kv in overrides.split(',').filter(|s| !s.trim().is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{kv}: expected key=value"))?;
            let num = |v: &str| knob_value(kv, v);
            match k.trim() {
                "ucb_beta" => self.ucb_beta = num(v)?,
                "continuous_ucb_beta" => self.continuous_ucb_beta = num(v)?,
                "ucb_beta_dim_exponent" => self.ucb_beta_dim_exponent = num(v)?,
                "population" => self.population = num(v)? as usize,
                "raw_samples" => self.raw_samples = num(v)? as usize,
                "generations" => self.generations = num(v)? as usize,
                "refine_starts" => self.refine_starts = num(v)? as usize,
                "refine_steps" => self.refine_steps = num(v)? as usize,
                "length_scale_dim_exponent" => self.length_scale_dim_exponent = num(v)?,
                "length_scale_prior_sd" => self.length_scale_prior_sd = num(v)?,
                "min_ln_length_scale" => self.min_ln_length_scale = num(v)?,
                "shape_warping" => {
                    self.rank_warping = num(v)? != 0.0;
                    self.log_warping = self.rank_warping;
                }
                "rank_warping" => self.rank_warping = num(v)? != 0.0,
                "log_warping" => self.log_warping = num(v)? != 0.0,
                "power_warping" => {
                    use PowerWarping::*;
                    self.power_warping = nth(kv, num(v)?, [Off, AllTrials, Initial, Choose])?;
                }
                "power_min_lambda" => self.power_min_lambda = num(v)?,
                "power_choose_lambda" => self.power_choose_lambda = num(v)?,
                "power_choose_margin" => self.power_choose_margin = num(v)?,
                "warping_choice" => {
                    use WarpingChoice::*;
                    self.warping_choice =
                        nth(kv, num(v)?, [Fixed, LooRank, Likelihood, LooLikelihood])?;
                }
                "warping_choice_top" => self.warping_choice_top = num(v)?,
                "warping_choice_margin" => self.warping_choice_margin = num(v)?,
                "batch_beta_growth" => self.batch_beta_growth = num(v)?,
                "batch_thompson_every" => self.batch_thompson_every = num(v)? as u64,
                "sequential_thompson_every" => self.sequential_thompson_every = num(v)? as u64,
                "thompson_features" => self.thompson_features = num(v)? as usize,
                "boundary_revisit_radius" => self.boundary_revisit_radius = num(v)?,
                "length_scale_prior_base" => self.length_scale_prior_base = num(v)?,
                "noise_prior_mean" => self.noise_prior.0 = num(v)?,
                "noise_prior_sd" => self.noise_prior.1 = num(v)?,
                "trust_region" => self.trust_region = num(v)? != 0.0,
                "incumbent_region" => self.incumbent_region = num(v)? != 0.0,
                "initial_per_parameter" => self.initial_per_parameter = num(v)?,
                "max_initial_trials" => self.max_initial_trials = num(v)? as usize,
                "trend" | "trend_prior_sd" | "trend_concave" | "trend_select_min"
                | "trend_select_max" => self.set_trend_knob(kv, k.trim(), v)?,
                "log_ei" => {
                    self.acquisition = if num(v)? != 0.0 {
                        Acquisition::LogEi
                    } else {
                        Acquisition::Ucb
                    }
                }
                "ucb_pe" => {
                    self.batch = if num(v)? != 0.0 {
                        BatchAcquisition::UcbPe
                    } else {
                        BatchAcquisition::PendingUcb
                    }
                }
                other => return Err(format!("unknown knob {other}")),
            }
        }
        Ok(self)
    }

    /// The `trend` knob (its basis by index, 0 for none) and the trend's options, which
    /// need a trend first; `kv` is the whole override, for the errors.
    fn set_trend_knob(&mut self, kv: &str, key: &str, v: &str) -> Result<(), String> {
        if key == "trend" {
            use TrendBasis::*;
            let basis = nth(
                kv,
                knob_value(kv, v)?,
                [None, Some(Constant), Some(Linear), Some(Quadratic)],
            )?;
            let old = self.trend.unwrap_or(DEFAULT_TREND);
            self.trend = basis.map(|basis| TrendSpec { basis, ..old });
            return Ok(());
        }
        let Some(trend) = self.trend.as_mut() else {
            return Err(format!("{kv}: set trend first"));
        };
        let value = knob_value(kv, v)?;
        // A bound of τ's range that is not given is the fixed prior sd; a bound ≤ 0 turns
        // the selection off.
        let (lo, hi) = trend.select.unwrap_or((trend.prior_sd, trend.prior_sd));
        match key {
            "trend_prior_sd" => trend.prior_sd = value,
            "trend_concave" => trend.concave = value != 0.0,
            "trend_select_min" => trend.select = (value > 0.0).then_some((value, hi)),
            _ => trend.select = (value > 0.0).then_some((lo, value)),
        }
        Ok(())
    }

    /// Quasi-random trials before the GP takes over: `max(⌈k d⌉ + 1, 5)` for d parameters
    /// and `k` = [`GpBanditConfig::initial_per_parameter`], at most
    /// [`GpBanditConfig::max_initial_trials`].
    pub fn initial_trials(&self, num_parameters: usize) -> usize {
        let k = (self.initial_per_parameter * num_parameters as f64).ceil() as usize + 1;
        k.max(5).min(self.max_initial_trials.max(1))
    }
}

/// A knob's number; `kv` is the whole override, for the error.
fn knob_value(kv: &str, v: &str) -> Result<f64, String> {
    v.trim().parse::<f64>().map_err(|e| format!("{kv}: {e}"))
}

/// The `v`-th of `choices` (`v` = 0, 1, …), for a knob that names one of a few variants.
fn nth<T: Copy, const N: usize>(kv: &str, v: f64, choices: [T; N]) -> Result<T, String> {
    let index = v as usize;
    if v.fract() != 0.0 || v < 0.0 || index >= N {
        return Err(format!("{kv}: expected an integer from 0 to {}", N - 1));
    }
    Ok(choices[index])
}
