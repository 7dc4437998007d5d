//! The GP bandit's model of a study: one GP per objective metric (cold, or warm-started
//! from prior studies, see [`super::warm_start`]) and per safety metric, fitted on the
//! (subsampled) completed trials, plus the pending points for the pending-aware variance.

use nalgebra::DVector;
use rand::{SeedableRng, rngs::StdRng};

use crate::designer::{
    DesignerInput, Goal, MetricSpec, Outcome, objective_metrics, outcome_is_safe, trial_seed,
};
use crate::gp::encoding::Encoder;
use crate::gp::kernel::Hyper;
use crate::gp::mean::{Trend, TrendSpec};
use crate::gp::model::{FitOptions, Posterior, fit_theta};
use crate::gp::rank::loo_rank_quality;
use crate::gp::warping::{Power, Warping, log_jacobian, normal_cdf, warp, warp_with};

use super::GpState;
use super::config::{GpBanditConfig, PowerWarping, WarpingChoice};
use super::warm_start::{PriorData, WarmStart, lift, prior_data};

/// Most pending points (running trials and the batch's earlier suggestions) that enter the
/// pending-aware covariance.
pub(super) const MAX_PENDING_IN_COVARIANCE: usize = 100;

/// A metric's value oriented so that larger is better.
pub(super) fn oriented(metric: &MetricSpec, outcome: &Outcome) -> Option<f64> {
    match outcome {
        Outcome::Measured(v) => v
            .get(&metric.id)
            .copied()
            .filter(|x| x.is_finite())
            .map(|x| match metric.goal {
                Goal::Maximize => x,
                Goal::Minimize => -x,
            }),
        Outcome::Infeasible | Outcome::Failed => None,
    }
}

/// The GP of one objective metric; with a warm start, over this study's and the prior
/// studies' trials together.
pub(super) struct ObjectiveModel {
    /// GP of the targets over the training points (with a warm start: lifted by the study
    /// feature, plus the prior studies' points); `None` without any point.
    pub(super) posterior: Option<Posterior>,
    /// Its kernel (also used for the pending-aware covariance).
    pub(super) hyper: Hyper,
    /// `θ` fitted to the configured warping's targets (the next fit's starting point; the
    /// model's own when it uses that warping).
    pub(super) theta: Vec<f64>,
    /// `θ` fitted to the standardized targets, when the warping was chosen per fit.
    pub(super) standardized_theta: Option<Vec<f64>>,
    /// Whether the per-fit choice replaced the configured warping by standardization
    /// alone (the posterior, `hyper` and `train_y` are then the standardized model's).
    pub(super) standardized: bool,
    /// Warped targets at this study's training points (larger is better).
    pub(super) train_y: DVector<f64>,
    pub(super) warm: Option<WarmStart>,
}

impl ObjectiveModel {
    /// Latent mean and variance at `points` of this study.
    pub(super) fn predict(&self, points: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
        match (&self.posterior, &self.warm) {
            (Some(p), Some(_)) => p.predict(&lift(points, 0.0)),
            (Some(p), None) => p.predict(points),
            (None, _) => (
                vec![0.0; points.len()],
                vec![self.hyper.amplitude; points.len()],
            ),
        }
    }

    /// The kernel's correlation between this study and the prior studies at the same
    /// point, `k(x, 0; x, 1)/σ²` (the Hamming term of the study feature), if warm-started.
    pub(super) fn study_correlation(&self) -> Option<f64> {
        self.warm.as_ref()?;
        let inv = *self.hyper.inv_ls2.last()?;
        Some(crate::gp::kernel::matern52(1.0, inv.sqrt()))
    }

    /// Whether the prior studies inform this model: always before 3 new trials (nothing
    /// tells yet), then while the learned study correlation is at least 0.3.
    pub(super) fn uses_prior(&self) -> bool {
        match &self.warm {
            Some(w) => w.new_trials < 3 || self.study_correlation().is_some_and(|c| c >= 0.3),
            None => false,
        }
    }

    /// The points of the covariance with `pending` in it.
    pub(super) fn covariance_points(
        &self,
        train_x: &[Vec<f64>],
        pending: &[Vec<f64>],
    ) -> Vec<Vec<f64>> {
        match &self.warm {
            Some(w) => {
                let mut x = lift(train_x, 0.0);
                x.extend(w.x.iter().cloned());
                x.extend(lift(pending, 0.0));
                x
            }
            None => train_x.iter().chain(pending).cloned().collect(),
        }
    }

    /// One point as the posterior takes it (with the study feature when warm-started).
    pub(super) fn lift_point(&self, x: &[f64]) -> Vec<f64> {
        let mut p = x.to_vec();
        if self.warm.is_some() {
            p.push(0.0);
        }
        p
    }

    /// Candidates as the pending-aware posterior takes them.
    pub(super) fn candidates<'a>(
        &self,
        points: &'a [Vec<f64>],
    ) -> std::borrow::Cow<'a, [Vec<f64>]> {
        match &self.warm {
            Some(_) => std::borrow::Cow::Owned(lift(points, 0.0)),
            None => std::borrow::Cow::Borrowed(points),
        }
    }
}

/// The GP of one safety metric, on `asinh(margin / scale)` standardized, where the margin
/// is the metric's distance to its threshold on the safe side (negative when unsafe).
pub(super) struct SafetyModel {
    pub(super) posterior: Posterior,
    pub(super) theta: Vec<f64>,
    /// Where the threshold (margin 0) lies on the GP's standardized scale.
    pub(super) threshold: f64,
}

impl SafetyModel {
    /// `P(safe) = Φ((μ(x) − t)/σ(x))` under the GP's latent posterior.
    pub(super) fn prob_safe(&self, points: &[Vec<f64>]) -> Vec<f64> {
        let (mean, var) = self.posterior.predict(points);
        mean.iter()
            .zip(&var)
            .map(|(m, v)| normal_cdf((m - self.threshold) / v.sqrt().max(1e-9)))
            .collect()
    }
}

/// Targets for a safety metric's GP (see [`SafetyModel`]) and the threshold on their
/// scale. Trials without the metric (infeasible, failed) count as clearly unsafe.
pub(super) fn safety_targets(margins: &[Option<f64>]) -> (Vec<f64>, f64) {
    let known: Vec<f64> = margins.iter().flatten().copied().collect();
    // A robust scale: the median absolute margin, so one huge value cannot flatten the rest.
    let mut abs: Vec<f64> = known.iter().map(|v| v.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let scale = abs.get(abs.len() / 2).copied().unwrap_or(1.0).max(1e-12);
    let squashed: Vec<f64> = known.iter().map(|v| (v / scale).asinh()).collect();
    let worst = squashed.iter().copied().fold(0.0, f64::min) - 1.0;
    let z: Vec<f64> = margins
        .iter()
        .map(|m| m.map_or(worst, |v| (v / scale).asinh()))
        .collect();
    let n = z.len().max(1) as f64;
    let mean = z.iter().sum::<f64>() / n;
    let sd = (z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    let sd = if sd > 1e-12 { sd } else { 1.0 };
    // asinh(0) = 0: the threshold sits at −mean/sd after standardization.
    (z.iter().map(|v| (v - mean) / sd).collect(), -mean / sd)
}

/// One GP per objective (and per safety metric) over the (subsampled) completed trials,
/// plus the pending points.
pub(super) struct Model {
    pub(super) train_x: Vec<Vec<f64>>,
    pub(super) objectives: Vec<ObjectiveModel>,
    pub(super) safety: Vec<SafetyModel>,
    /// Pending trials and the batch's earlier suggestions (encoded).
    pub(super) pending: Vec<Vec<f64>>,
    /// Covariance-only posteriors over train ∪ pending, per objective (rebuilt on demand).
    pub(super) pending_posteriors: Option<Vec<Posterior>>,
    /// Number of completed trials (before subsampling) and parameters, for the trust region.
    pub(super) num_completed: usize,
    pub(super) num_parameters: usize,
    /// The incumbent's box (centre, half side), when enabled.
    pub(super) incumbent_box: Option<(Vec<f64>, f64)>,
    /// Safe-fraction bookkeeping for `desired_min_safe_trials_fraction`: the target, the
    /// trials counted so far (completed, pending, this batch) and how many of them are
    /// (expected to be) safe.
    pub(super) desired_safe_fraction: Option<f64>,
    pub(super) counted_trials: f64,
    pub(super) expected_safe: f64,
}

impl Model {
    /// Fits the study's model: one GP per objective ([`ObjectiveFit::fit`]), then one per
    /// safety metric ([`fit_safety`]), in that order on `rng`; `None` without an objective
    /// or when a posterior cannot be formed.
    pub(super) fn fit(
        config: &GpBanditConfig,
        encoder: &Encoder,
        input: &DesignerInput<'_>,
        rng: &mut StdRng,
    ) -> Option<Model> {
        let objectives = objective_metrics(input.metrics);
        if objectives.is_empty() {
            return None;
        }
        let safety: Vec<&MetricSpec> = if objectives.len() < input.metrics.len() {
            input.metrics.iter().filter(|m| m.is_safety()).collect()
        } else {
            Vec::new()
        };
        let data = FitData::new(config, encoder, input, &objectives, safety.len());
        let mut objective_models = Vec::new();
        for (k, values) in data.values.iter().enumerate() {
            let fit = ObjectiveFit {
                config,
                data: &data,
                k,
                values,
            };
            objective_models.push(fit.fit(encoder, input, objectives[k], rng)?);
        }
        let mut safety_models = Vec::new();
        for (j, m) in safety.iter().enumerate() {
            safety_models.push(fit_safety(&data, input, m, objectives.len() + j, rng)?);
        }
        Some(Model::assemble(
            config,
            encoder,
            input,
            data,
            objective_models,
            safety_models,
        ))
    }

    /// The model from its fitted GPs: with the pending points (their expected safety
    /// counted towards the safe fraction) and, when enabled for one objective without
    /// safety metrics, the incumbent's box.
    fn assemble(
        config: &GpBanditConfig,
        encoder: &Encoder,
        input: &DesignerInput<'_>,
        data: FitData,
        objectives: Vec<ObjectiveModel>,
        safety: Vec<SafetyModel>,
    ) -> Model {
        let n = input.completed.len();
        let pending: Vec<Vec<f64>> = input.pending.iter().map(|a| encoder.encode(a)).collect();
        let mut model = Model {
            train_x: data.train_x,
            objectives,
            safety,
            pending: Vec::new(),
            pending_posteriors: None,
            num_completed: n,
            incumbent_box: None,
            num_parameters: encoder.num_parameters(),
            desired_safe_fraction: input
                .desired_min_safe_trials_fraction
                .filter(|f| f.is_finite() && *f > 0.0)
                .map(|f| f.min(1.0)),
            counted_trials: n as f64,
            expected_safe: input
                .completed
                .iter()
                .filter(|t| outcome_is_safe(input.metrics, &t.outcome))
                .count() as f64,
        };
        if !model.safety.is_empty() && !pending.is_empty() {
            let p = model.prob_safe(&pending);
            model.counted_trials += pending.len() as f64;
            model.expected_safe += p.iter().sum::<f64>();
        }
        model.pending = pending;
        if config.incumbent_region && data.values.len() == 1 && model.safety.is_empty() {
            let initial = config.initial_trials(encoder.num_parameters());
            model.incumbent_box = incumbent_box(&data.values[0], initial)
                .map(|(i, half)| (encoder.encode(&input.completed[i].parameters), half));
        }
        model
    }

    /// Whether any objective's GP sits on a prior study's mean (a warm start that the new
    /// trials have not contradicted).
    pub(super) fn uses_prior(&self) -> bool {
        self.objectives.iter().any(ObjectiveModel::uses_prior)
    }

    pub(super) fn standardized_thetas(&self) -> Vec<Option<Vec<f64>>> {
        if self
            .objectives
            .iter()
            .all(|o| o.standardized_theta.is_none())
        {
            return Vec::new();
        }
        self.objectives
            .iter()
            .map(|o| o.standardized_theta.clone())
            .collect()
    }

    /// Per objective, whether its targets were standardized by the per-fit choice (empty
    /// when no choice was made).
    pub(super) fn standardized(&self) -> Vec<bool> {
        if self
            .objectives
            .iter()
            .all(|o| o.standardized_theta.is_none())
        {
            return Vec::new();
        }
        self.objectives.iter().map(|o| o.standardized).collect()
    }

    pub(super) fn thetas(&self) -> Vec<Vec<f64>> {
        self.objectives
            .iter()
            .map(|o| o.theta.clone())
            .chain(self.safety.iter().map(|s| s.theta.clone()))
            .collect()
    }

    /// The probability that every safety metric is safe (independent GPs: the product).
    pub(super) fn prob_safe(&self, points: &[Vec<f64>]) -> Vec<f64> {
        let mut p = vec![1.0; points.len()];
        for s in &self.safety {
            for (a, b) in p.iter_mut().zip(s.prob_safe(points)) {
                *a *= b;
            }
        }
        p
    }

    pub(super) fn add_pending(&mut self, x: Vec<f64>) {
        if !self.safety.is_empty() {
            let p = self.prob_safe(std::slice::from_ref(&x))[0];
            self.counted_trials += 1.0;
            self.expected_safe += p;
        }
        self.pending.push(x);
        self.pending_posteriors = None;
    }

    /// Variance-only posteriors with the pending points in the covariance.
    pub(super) fn build_pending_posteriors(&mut self) {
        if !self.pending.is_empty() && self.pending_posteriors.is_none() {
            // The most recent pending points only, so that a huge batch or backlog cannot
            // make the covariance (and each suggestion's cost) grow without bound.
            let skip = self.pending.len().saturating_sub(MAX_PENDING_IN_COVARIANCE);
            let built: Option<Vec<Posterior>> = self
                .objectives
                .iter()
                .map(|o| {
                    let x = o.covariance_points(&self.train_x, &self.pending[skip..]);
                    Posterior::new(o.hyper.clone(), x, None)
                })
                .collect();
            self.pending_posteriors = built;
        }
    }

    /// The probability of safety the next suggestion must reach so that the expected
    /// fraction of safe trials stays at the target: `p ≥ f (N + 1) − S`, with N trials
    /// counted and S expected safe so far (capped at 0.99; 0 without a target).
    pub(super) fn required_safety(&self) -> f64 {
        match self.desired_safe_fraction {
            Some(f) if !self.safety.is_empty() => {
                (f * (self.counted_trials + 1.0) - self.expected_safe).clamp(0.0, 0.99)
            }
            _ => 0.0,
        }
    }
}

/// What every metric's fit shares: the objectives' values, which completed trials train
/// the posteriors and which fit the hyperparameters (both subsampled, by the same ranking),
/// encoded, and the previous suggestion's fitted state as the fits' starting points.
struct FitData {
    /// Per objective, its value per completed trial, larger is better (`None`: missing).
    values: Vec<Vec<Option<f64>>>,
    /// Indices of the completed trials the posteriors condition on.
    train_idx: Vec<usize>,
    /// Indices of the completed trials the hyperparameters are fitted to.
    fit_idx: Vec<usize>,
    train_x: Vec<Vec<f64>>,
    fit_x: Vec<Vec<f64>>,
    /// Per feature, whether it is categorical.
    categorical: Vec<bool>,
    /// The previous suggestion's state, if it fits this model's metrics and features.
    warm: Option<GpState>,
    options: FitOptions,
}

impl FitData {
    /// `modelled_safety`: the number of safety metrics (their θ follow the objectives' in
    /// a state).
    fn new(
        config: &GpBanditConfig,
        encoder: &Encoder,
        input: &DesignerInput<'_>,
        objectives: &[&MetricSpec],
        modelled_safety: usize,
    ) -> FitData {
        let categorical = encoder.categorical_mask();
        // Objective values per trial, "larger is better".
        let values: Vec<Vec<Option<f64>>> = objectives
            .iter()
            .map(|m| {
                input
                    .completed
                    .iter()
                    .map(|t| oriented(m, &t.outcome))
                    .collect()
            })
            .collect();
        let n = input.completed.len();
        // Rank trials by the sum of their warped objectives over the full history.
        let warped_all: Vec<Vec<f64>> = values.iter().map(|v| warp(v)).collect();
        let quality: Vec<f64> = (0..n)
            .map(|i| warped_all.iter().map(|w| w[i]).sum())
            .collect();
        let train_idx = subsample(&quality, config.max_train_points);
        let fit_idx = subsample(&quality, config.max_fit_points.min(config.max_train_points));
        let encode = |idx: &[usize]| -> Vec<Vec<f64>> {
            idx.iter()
                .map(|&i| encoder.encode(&input.completed[i].parameters))
                .collect()
        };
        let train_x = encode(&train_idx);
        let fit_x = encode(&fit_idx);
        let modelled = objectives.len() + modelled_safety;
        let warm: Option<GpState> = input
            .previous_state
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .filter(|s: &GpState| s.dim == encoder.dim() && s.theta.len() == modelled);
        // Fitting dominates the cost of a suggestion: one L-BFGS run from the best of the
        // starting points (two while the history is small and fits are cheap).
        let options = FitOptions {
            random_starts: if warm.is_some() { 1 } else { 4 },
            runs: if fit_x.len() <= 40 { 2 } else { 1 },
            max_iters: config.fit_iters,
            prior: config.prior(categorical.iter().filter(|c| !**c).count()),
        };
        FitData {
            values,
            train_idx,
            fit_idx,
            train_x,
            fit_x,
            categorical,
            warm,
            options,
        }
    }
}

/// Standardization alone: the warping the per-fit choice weighs the configured one against.
const STANDARDIZED: Warping = Warping {
    rank: false,
    log: false,
    power: Power::Off,
};

/// One objective metric's fit.
struct ObjectiveFit<'a> {
    config: &'a GpBanditConfig,
    data: &'a FitData,
    /// The objective's index (its θ in a state; its choice generator's seed).
    k: usize,
    /// Its value per completed trial (larger is better).
    values: &'a [Option<f64>],
}

impl ObjectiveFit<'_> {
    /// The objective's GP with the configured warping (warm-started while the study is
    /// young and prior studies exist); with the per-fit warping choice, the targets'
    /// standardization alone is fitted too and replaces it if it scores better
    /// ([`ObjectiveFit::choose_standardization`]).
    fn fit(
        &self,
        encoder: &Encoder,
        input: &DesignerInput<'_>,
        metric: &MetricSpec,
        rng: &mut StdRng,
    ) -> Option<ObjectiveModel> {
        let (config, data, k) = (self.config, self.data, self.k);
        let (warping, compare) = self.warping(encoder);
        let starts: Vec<Vec<f64>> = data.warm.iter().map(|s| s.theta[k].clone()).collect();
        let prior = if input.completed.len() < config.warm_start_trials(encoder.num_parameters()) {
            prior_data(encoder, input, metric, self.values, warping)
        } else {
            None
        };
        let prior = prior.map(|p| {
            let joint = |idx: &[usize]| {
                DVector::from_iterator(idx.len(), idx.iter().map(|&i| p.new_targets[i]))
            };
            let (t, f) = (joint(&data.train_idx), joint(&data.fit_idx));
            (p, t, f)
        });
        // The second fit draws its random starts from a generator of its own (seeded
        // by the suggestion and the objective), so the main one advances as without the
        // choice: a run that keeps the warping is the fixed warping's run.
        let choice_rng = (compare && prior.is_none() && warping != STANDARDIZED).then(|| {
            StdRng::seed_from_u64(
                trial_seed(input.seed, input.first_trial_number) ^ (0x5157_4152 + k as u64),
            )
        });
        let model = fit_objective(
            config,
            &data.train_x,
            self.targets(&data.train_idx, warping),
            &data.fit_x,
            self.targets(&data.fit_idx, warping),
            &data.categorical,
            &starts,
            prior,
            data.options,
            rng,
        )?;
        Some(match choice_rng {
            Some(mut choice_rng) => {
                self.choose_standardization(model, warping, &starts, &mut choice_rng)
            }
            None => model,
        })
    }

    /// The warping to fit, and whether standardization alone is to be fitted and compared
    /// with it. With the per-fit choice and the λ chooser, λ proposes standardization and
    /// the score (leave-one-out ranking or likelihood) must confirm it; otherwise the
    /// score alone decides.
    fn warping(&self, encoder: &Encoder) -> (Warping, bool) {
        let config = self.config;
        let proposed = config.warping(self.values, encoder.num_parameters());
        match (config.warping_choice, config.power_warping) {
            (WarpingChoice::Fixed, _) => (proposed, false),
            (_, PowerWarping::Choose) => (
                Warping {
                    rank: config.rank_warping,
                    log: config.log_warping,
                    power: Power::Off,
                },
                proposed == STANDARDIZED,
            ),
            (_, _) => (proposed, true),
        }
    }

    /// The objective's targets at the completed trials `idx`, warped by `warping`.
    fn targets(&self, idx: &[usize], warping: Warping) -> DVector<f64> {
        let sub: Vec<Option<f64>> = idx.iter().map(|&i| self.values[i]).collect();
        DVector::from_vec(warp_with(&sub, warping))
    }

    /// `model` (fitted with `warping`) or the fit to the standardized targets, whichever
    /// the configured score prefers by more than `warping_choice_margin`; either way it
    /// keeps both fits' θ for the next call's starting points.
    fn choose_standardization(
        &self,
        mut model: ObjectiveModel,
        warping: Warping,
        starts: &[Vec<f64>],
        choice_rng: &mut StdRng,
    ) -> ObjectiveModel {
        let (config, data) = (self.config, self.data);
        let own: Vec<Vec<f64>> = data
            .warm
            .iter()
            .filter_map(|s| s.standardized_theta.get(self.k).cloned().flatten())
            .collect();
        let observed = self.targets(&data.train_idx, STANDARDIZED);
        let alternative = fit_objective(
            config,
            &data.train_x,
            observed.clone(),
            &data.fit_x,
            self.targets(&data.fit_idx, STANDARDIZED),
            &data.categorical,
            if own.is_empty() { starts } else { &own },
            None,
            data.options,
            choice_rng,
        );
        let Some(alternative) = alternative else {
            return model;
        };
        let train_values: Vec<Option<f64>> =
            data.train_idx.iter().map(|&i| self.values[i]).collect();
        let score = |m: &ObjectiveModel, steps: Warping| {
            self.choice_score(m, steps, &observed, &train_values)
        };
        let standardized_theta = alternative.theta.clone();
        if let (Some(warped), Some(plain)) =
            (score(&model, warping), score(&alternative, STANDARDIZED))
            && plain > warped + config.warping_choice_margin
        {
            model = ObjectiveModel {
                theta: model.theta,
                standardized: true,
                ..alternative
            };
        }
        model.standardized_theta = Some(standardized_theta);
        model
    }

    /// How well `m` (fitted to targets warped by `steps`) explains the observed values, by
    /// the configured per-fit choice; `None` if it cannot be scored.
    fn choice_score(
        &self,
        m: &ObjectiveModel,
        steps: Warping,
        observed: &DVector<f64>,
        train_values: &[Option<f64>],
    ) -> Option<f64> {
        let config = self.config;
        let posterior = m.posterior.as_ref()?;
        match config.warping_choice {
            // Both scored against the standardized values, an increasing map of the
            // observed ones (the rank statistic sees only their order).
            WarpingChoice::LooRank => loo_rank_quality(
                &posterior.loo_means()?,
                observed.as_slice(),
                config.warping_choice_top,
            ),
            WarpingChoice::Likelihood => {
                Some(posterior.log_marginal_likelihood()? + log_jacobian(train_values, steps)?)
            }
            WarpingChoice::LooLikelihood => {
                Some(posterior.loo_log_predictive()? + log_jacobian(train_values, steps)?)
            }
            WarpingChoice::Fixed => None,
        }
    }
}

/// The GP of safety metric `metric` (see [`SafetyModel`]); `index`: its θ's place in a
/// state (after the objectives').
fn fit_safety(
    data: &FitData,
    input: &DesignerInput<'_>,
    metric: &MetricSpec,
    index: usize,
    rng: &mut StdRng,
) -> Option<SafetyModel> {
    let threshold = metric.safety_threshold.unwrap_or(0.0);
    let margins: Vec<Option<f64>> = input
        .completed
        .iter()
        .map(|t| {
            let sign = match metric.goal {
                Goal::Maximize => 1.0,
                Goal::Minimize => -1.0,
            };
            oriented(metric, &t.outcome).map(|v| v - sign * threshold)
        })
        .collect();
    let (z, t) = safety_targets(&margins);
    let pick = |idx: &[usize]| DVector::from_iterator(idx.len(), idx.iter().map(|&i| z[i]));
    let starts: Vec<Vec<f64>> = data.warm.iter().map(|s| s.theta[index].clone()).collect();
    let theta = fit_theta(
        &data.fit_x,
        &pick(&data.fit_idx),
        &data.categorical,
        &starts,
        data.options,
        rng,
    );
    let hyper = Hyper::from_theta_with(&theta, &data.categorical);
    let posterior = Posterior::new(hyper, data.train_x.clone(), Some(&pick(&data.train_idx)))?;
    Some(SafetyModel {
        posterior,
        theta,
        threshold: t,
    })
}

/// Fit one objective's GP: cold on this study's trials, or warm-started.
///
/// Warm start is a two-task GP (a multi-task GP with one shared correlation, as in
/// Swersky et al. 2013 with a Hamming task kernel): every point gets a categorical *study*
/// feature (0 here, 1 for the prior studies), and the kernel's Hamming term on it learns
/// how much the studies agree. A related prior study gets a long study length scale and
/// informs the whole space; an unrelated or opposite one gets a short one and drops out of
/// the predictions (its points still share the other hyperparameters). The fit uses all of
/// this study's fit points and fills up to `max_fit_points` with the prior studies' best
/// and most recent; the posterior conditions on at most `max_prior_points` of them.
#[expect(clippy::too_many_arguments, reason = "the pieces of one fit, named")]
pub(super) fn fit_objective(
    config: &GpBanditConfig,
    train_x: &[Vec<f64>],
    train_y: DVector<f64>,
    fit_x: &[Vec<f64>],
    fit_y: DVector<f64>,
    categorical: &[bool],
    starts: &[Vec<f64>],
    prior: Option<(PriorData, DVector<f64>, DVector<f64>)>,
    options: FitOptions,
    rng: &mut StdRng,
) -> Option<ObjectiveModel> {
    let cold = |rng: &mut StdRng| {
        fit_cold(
            config.trend,
            (fit_x, &fit_y),
            (train_x, &train_y),
            categorical,
            starts,
            options,
            rng,
        )
    };
    let Some((prior, joint_train_y, joint_fit_y)) = prior else {
        return cold(rng);
    };
    let mut mask = categorical.to_vec();
    mask.push(true);
    let joint = JointPoints::new(
        config,
        &prior,
        (train_x, &joint_train_y),
        (fit_x, &joint_fit_y),
    );
    // With a trend, one trend for both studies (the study feature, categorical, has none):
    // a warm study then polishes as a cold one does.
    let (theta, posterior) = fit_posterior(
        config.trend,
        (&joint.x_fit, &DVector::from_vec(joint.y_fit)),
        (joint.x, &DVector::from_vec(joint.y)),
        &mask,
        starts,
        options,
        rng,
    )?;
    let hyper = posterior.hyper.clone();
    let mut order: Vec<usize> = (0..prior.y.len()).collect();
    order.sort_by(|&a, &b| prior.y[b].total_cmp(&prior.y[a]));
    let best = order.iter().take(5).map(|&i| prior.x[i].clone()).collect();
    let model = ObjectiveModel {
        posterior: Some(posterior),
        hyper,
        theta,
        standardized_theta: None,
        standardized: false,
        train_y: joint_train_y,
        warm: Some(WarmStart {
            x: joint.prior_x,
            best,
            new_trials: fit_x.len(),
        }),
    };
    // A prior the new trials contradict would still share (and distort) the other
    // hyperparameters, the noise above all: without it the model is a cold GP.
    if model.uses_prior() {
        Some(model)
    } else {
        cold(rng)
    }
}

/// One objective's GP on this study's trials alone (see [`fit_posterior`]).
fn fit_cold(
    trend: Option<TrendSpec>,
    fit: (&[Vec<f64>], &DVector<f64>),
    (train_x, train_y): (&[Vec<f64>], &DVector<f64>),
    categorical: &[bool],
    starts: &[Vec<f64>],
    options: FitOptions,
    rng: &mut StdRng,
) -> Option<ObjectiveModel> {
    let (theta, posterior) = fit_posterior(
        trend,
        fit,
        (train_x.to_vec(), train_y),
        categorical,
        starts,
        options,
        rng,
    )?;
    let hyper = posterior.hyper.clone();
    Some(ObjectiveModel {
        posterior: Some(posterior),
        hyper,
        theta,
        standardized_theta: None,
        standardized: false,
        train_y: train_y.clone(),
        warm: None,
    })
}

/// This study's and the prior studies' points together, lifted by the study feature (0
/// here, 1 for the prior studies), for a warm-started fit.
struct JointPoints {
    /// Fit points: all of this study's, then the prior studies' best and most recent, up
    /// to `max_fit_points` (at least 20 of theirs).
    x_fit: Vec<Vec<f64>>,
    y_fit: Vec<f64>,
    /// Training points: this study's, then at most `max_prior_points` of the prior studies'.
    x: Vec<Vec<f64>>,
    y: Vec<f64>,
    /// The prior studies' training points alone (the pending covariance adds them).
    prior_x: Vec<Vec<f64>>,
}

impl JointPoints {
    /// `train` and `fit`: this study's points with their jointly warped targets.
    fn new(
        config: &GpBanditConfig,
        prior: &PriorData,
        (train_x, train_y): (&[Vec<f64>], &DVector<f64>),
        (fit_x, fit_y): (&[Vec<f64>], &DVector<f64>),
    ) -> JointPoints {
        let keep = subsample(&prior.y, config.max_prior_points);
        let fit_room = config.max_fit_points.saturating_sub(fit_x.len()).max(20);
        let fit_keep = subsample(&prior.y, fit_room.min(config.max_prior_points));
        let pick_x = |idx: &[usize]| -> Vec<Vec<f64>> {
            lift(
                &idx.iter().map(|&i| prior.x[i].clone()).collect::<Vec<_>>(),
                1.0,
            )
        };
        let pick_y = |idx: &[usize]| idx.iter().map(|&i| prior.y[i]).collect::<Vec<_>>();
        let mut x_fit = lift(fit_x, 0.0);
        x_fit.extend(pick_x(&fit_keep));
        let y_fit: Vec<f64> = fit_y.iter().copied().chain(pick_y(&fit_keep)).collect();
        let prior_x = pick_x(&keep);
        let mut x = lift(train_x, 0.0);
        x.extend(prior_x.iter().cloned());
        let y: Vec<f64> = train_y.iter().copied().chain(pick_y(&keep)).collect();
        JointPoints {
            x_fit,
            y_fit,
            x,
            y,
            prior_x,
        }
    }
}

/// MAP hyperparameters on the fit points and the posterior on the training points, with
/// `trend` as the prior mean if given: then a ridge fit of the trend on the fit points
/// first and the hyperparameters on its residuals, so the kernel's amplitude and length
/// scales describe what the trend leaves (Levy's ripples), not the bowl; the posterior
/// refits the trend by generalized least squares under that kernel.
pub(super) fn fit_posterior(
    trend: Option<TrendSpec>,
    (fit_x, fit_y): (&[Vec<f64>], &DVector<f64>),
    (train_x, train_y): (Vec<Vec<f64>>, &DVector<f64>),
    categorical: &[bool],
    starts: &[Vec<f64>],
    options: FitOptions,
    rng: &mut StdRng,
) -> Option<(Vec<f64>, Posterior)> {
    let Some(spec) = trend else {
        let theta = fit_theta(fit_x, fit_y, categorical, starts, options, rng);
        let hyper = Hyper::from_theta_with(&theta, categorical);
        return Some((theta, Posterior::new(hyper, train_x, Some(train_y))?));
    };
    let ridge = Trend::fit(spec, fit_x, fit_y, categorical, None);
    let residual = fit_y - ridge.values(fit_x);
    let theta = fit_theta(fit_x, &residual, categorical, starts, options, rng);
    let hyper = Hyper::from_theta_with(&theta, categorical);
    let posterior = Posterior::with_trend(hyper, train_x, train_y, spec, categorical)?;
    Some((theta, posterior))
}

/// The incumbent's trust region, replayed from the history (so that it needs no state):
/// side 0.8 of the unit cube after the initial design; after 3 successive improvements (by
/// more than 1e-3 of the range so far) it doubles (at most 1.6), after 5 successive
/// failures it halves, and below 0.8/64 it restarts at 0.8 (after Eriksson et al. 2019,
/// TuRBO-1 with one region). Returns the incumbent's index and the box's half side.
/// `values`: larger is better, `None` for infeasible trials.
pub(super) fn incumbent_box(values: &[Option<f64>], initial: usize) -> Option<(usize, f64)> {
    const START: f64 = 0.8;
    let (mut side, mut successes, mut failures) = (START, 0usize, 0usize);
    let mut best: Option<(usize, f64)> = None;
    let (lo, hi) = values
        .iter()
        .flatten()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    let tol = 1e-3 * (hi - lo).max(1e-12);
    for (i, v) in values.iter().enumerate() {
        let improved = match (v, best) {
            (Some(v), Some((_, b))) => *v > b + tol,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if let Some(v) = v
            && best.is_none_or(|(_, b)| *v > b)
        {
            best = Some((i, *v));
        }
        if i < initial {
            continue;
        }
        if improved {
            successes += 1;
            failures = 0;
        } else {
            failures += 1;
            successes = 0;
        }
        if successes >= 3 {
            side = (2.0 * side).min(1.6);
            successes = 0;
        }
        if failures >= 5 {
            side /= 2.0;
            failures = 0;
        }
        if side < START / 64.0 {
            side = START;
        }
    }
    best.map(|(i, _)| (i, side / 2.0))
}

/// Indices of at most `cap` trials: the best third by `quality`, then the most recent.
pub(super) fn subsample(quality: &[f64], cap: usize) -> Vec<usize> {
    let n = quality.len();
    if n <= cap {
        return (0..n).collect();
    }
    let mut by_quality: Vec<usize> = (0..n).collect();
    by_quality.sort_by(|&a, &b| quality[b].total_cmp(&quality[a]));
    let mut keep = vec![false; n];
    for &i in by_quality.iter().take(cap / 3) {
        keep[i] = true;
    }
    let mut count = cap / 3;
    for i in (0..n).rev() {
        if count >= cap {
            break;
        }
        if !keep[i] {
            keep[i] = true;
            count += 1;
        }
    }
    (0..n).filter(|&i| keep[i]).collect()
}
