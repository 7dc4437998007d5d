//! The acquisition and its maximization: what a candidate scores (UCB, log-EI, UCB-PE, a
//! Thompson draw; weighted by the probability of safety), where the search starts (the best
//! observed points, their discrete neighbours, the prior studies' best, the best raw samples),
//! the search ([`super::search`], then [`super::refine`]), and which candidate is suggested
//! ([`pick_candidate`]).

use rand::{RngExt, rngs::StdRng};
use rand_distr::{Distribution, StandardNormal};

use crate::gp::encoding::Encoder;
use crate::gp::model::Posterior;
use crate::gp::pathwise::PathwiseSample;
use crate::gp::warping::normal_cdf;

use super::config::{Acquisition, BatchAcquisition, GpBanditConfig};
use super::model::Model;
use super::{refine, search};

/// `ln h(z)`, `h(z) = φ(z) + z Φ(z)`: directly for z > −5, else by the asymptotic series
/// `h(z) ≈ φ(z)/z² (1 − 3/z² + 15/z⁴)` (Mills' ratio), which avoids the cancellation.
pub fn log_h(z: f64) -> f64 {
    const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;
    if z > -5.0 {
        let phi = (-0.5 * z * z - LN_SQRT_2PI).exp();
        (phi + z * normal_cdf(z)).max(1e-300).ln()
    } else {
        let z2 = z * z;
        -0.5 * z2 - LN_SQRT_2PI - z2.ln() + (1.0 - 3.0 / z2 + 15.0 / (z2 * z2)).ln()
    }
}

impl Model {
    /// The next suggestion's feature vector, or `None` if the search found nothing new.
    ///
    /// The steps, each below: the acquisition ([`Scorer`]), the search's starting
    /// population ([`Model::initial_population`]), the population search
    /// ([`search::evolve`]), gradient refinement ([`Scorer::refine_best`]), discrete moves,
    /// and the choice among the best candidates ([`pick_candidate`]). The generator is
    /// drawn from in that order (scalarization, Thompson draw, population, search), which
    /// the quality bench's stored runs pin down.
    pub(super) fn next_point(
        &mut self,
        config: &GpBanditConfig,
        encoder: &Encoder,
        first: bool,
        thompson: bool,
        rng: &mut StdRng,
    ) -> Option<Vec<f64>> {
        let beta = self.exploration_beta(config, encoder);
        let scalarization = Scalarization::draw(self, rng);
        let sample = self.thompson_sample(config, encoder, thompson, rng);
        let known: Vec<Vec<f64>> = self
            .train_x
            .iter()
            .chain(self.pending.iter())
            .cloned()
            .collect();
        self.build_pending_posteriors();
        let this = &*self;
        let scorer = Scorer::new(this, config, encoder, first, beta, scalarization, sample);
        let feasible = Feasible::new(encoder);
        let score = |cands: &[Vec<f64>]| scorer.score(cands);
        let project = |x: Vec<f64>| feasible.project(x);
        let (mut population, mut scores) = this.initial_population(config, &feasible, &scorer, rng);
        search::evolve(
            &mut population,
            &mut scores,
            &feasible.levels,
            config.generations.max(1),
            &score,
            &project,
            rng,
        );
        let mut ranked: Vec<usize> = (0..population.len()).collect();
        sort_best_first(&mut ranked, &scores);
        if scorer.refine_best(config, &feasible, &mut population, &mut scores, &ranked) {
            sort_best_first(&mut ranked, &scores);
        }
        // Discrete moves from the three best candidates, which the steps above cannot make.
        if !feasible.continuous {
            let best: Vec<usize> = ranked.iter().take(3).copied().collect();
            search::discrete_local_search(&mut population, &mut scores, &best, encoder, &score);
            sort_best_first(&mut ranked, &scores);
        }
        let ranked: Vec<Vec<f64>> = ranked.into_iter().map(|j| population[j].clone()).collect();
        let m = this.objectives.len();
        let no_gain = |x: &[f64]| {
            m == 1 && this.objectives[0].predict(&[x.to_vec()]).0[0] <= scorer.incumbent
        };
        // A context feature is pinned to its maximum, not on a face by choice.
        let numeric: Vec<bool> = feasible
            .levels
            .iter()
            .enumerate()
            .map(|(i, l)| l.is_none() && !encoder.is_context(i))
            .collect();
        let revisit = Revisit {
            numeric: &numeric,
            radius: config.boundary_revisit_radius,
        };
        pick_candidate(&ranked, &known, revisit, no_gain).map(|i| ranked[i].clone())
    }

    /// UCB's β for this suggestion: the configured one for the kind of space (or the warm
    /// start's), grown with the number of pending points (at most 4 counted), so that a
    /// batch's later members explore more where the pending-aware variance has shrunk.
    fn exploration_beta(&self, config: &GpBanditConfig, encoder: &Encoder) -> f64 {
        let beta = if self.uses_prior() {
            // Warm start: follow the prior studies' mean around their best region. The
            // kernel is fitted mostly to a finished study's points, clustered near its
            // optima, so σ is large almost everywhere and full UCB scatters the trials over
            // the box (prior on Branin shifted by (0.15, −0.2), 6 seeds: median regret 0.23
            // from trial 5 to 20 with β = 1; 0.012 at 10 and 2e-5 at 20 with β = 0.2,
            // against 0.42 and 5e-4 cold).
            config.warm_start_ucb_beta
        } else if encoder.is_continuous() {
            config.continuous_beta(encoder.dim())
        } else {
            config.ucb_beta
        };
        beta * (1.0 + config.batch_beta_growth * self.pending.len().min(4) as f64)
    }

    /// A Thompson draw of the objective, when this suggestion is a Thompson member and the
    /// draw applies: one objective, no safety metrics, a space of doubles, and a cold GP.
    fn thompson_sample(
        &self,
        config: &GpBanditConfig,
        encoder: &Encoder,
        thompson: bool,
        rng: &mut StdRng,
    ) -> Option<PathwiseSample> {
        if thompson
            && self.objectives.len() == 1
            && self.safety.is_empty()
            && encoder.is_continuous()
        {
            let o = &self.objectives[0];
            o.posterior
                .as_ref()
                .filter(|_| o.warm.is_none())
                .and_then(|p| PathwiseSample::draw(p, config.thompson_features, rng))
        } else {
            None
        }
    }

    /// Trust region: L∞ radius (numeric features) around observed points, growing with the
    /// study; off (∞) once it covers the cube, and with a prior study's mean (which knows
    /// the whole space).
    fn trust_radius(&self, config: &GpBanditConfig) -> f64 {
        if !config.trust_region || self.uses_prior() || self.train_x.is_empty() {
            f64::INFINITY
        } else {
            0.2 + 0.1 * self.num_completed as f64 / self.num_parameters.max(1) as f64
        }
    }

    /// The search's starting population and its scores: the seeds ([`Model::seed_points`]),
    /// then, while fewer than `population` (at least 8), the best of `raw_samples` uniform
    /// random points (as BoTorch's `optimize_acqf` starts from its best raw samples), so
    /// that a narrow basin far from the observed points still gets candidates.
    fn initial_population(
        &self,
        config: &GpBanditConfig,
        feasible: &Feasible<'_>,
        scorer: &Scorer<'_>,
        rng: &mut StdRng,
    ) -> (Vec<Vec<f64>>, Vec<f64>) {
        let population_size = config.population.max(8);
        let mut population = self.seed_points(population_size, feasible, scorer, rng);
        let mut scores = scorer.score(&population);
        if population.len() < population_size {
            let raw: Vec<Vec<f64>> = (0..config.raw_samples.max(population_size))
                .map(|_| feasible.random_point(self.incumbent_box.as_ref(), rng))
                .collect();
            let raw_scores = scorer.score(&raw);
            let mut order: Vec<usize> = (0..raw.len()).collect();
            sort_best_first(&mut order, &raw_scores);
            for &i in order.iter().take(population_size - population.len()) {
                population.push(raw[i].clone());
                scores.push(raw_scores[i]);
            }
        }
        (population, scores)
    }

    /// Seeds of the search (at most twice `population_size`): the best observed points (by
    /// the scalarized warped targets), each with a few perturbations; every one-parameter
    /// discrete move from the best two; and the prior studies' best points, until the new
    /// study has its own.
    fn seed_points(
        &self,
        population_size: usize,
        feasible: &Feasible<'_>,
        scorer: &Scorer<'_>,
        rng: &mut StdRng,
    ) -> Vec<Vec<f64>> {
        let mut order: Vec<usize> = (0..self.train_x.len()).collect();
        let quality: Vec<f64> = order
            .iter()
            .map(|&i| {
                scorer.scalarization.apply(
                    &self
                        .objectives
                        .iter()
                        .map(|o| o.train_y[i])
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        sort_best_first(&mut order, &quality);
        let mut population: Vec<Vec<f64>> = Vec::with_capacity(2 * population_size);
        for &i in order.iter().take(5) {
            population.push(self.train_x[i].clone());
            for _ in 0..3 {
                population.push(feasible.perturb(&self.train_x[i], rng));
            }
        }
        if !feasible.continuous {
            for &i in order.iter().take(2) {
                population.extend(feasible.encoder.discrete_neighbours(&self.train_x[i]));
            }
        }
        if self.train_x.is_empty() {
            for o in &self.objectives {
                if let Some(warm) = &o.warm {
                    population.extend(warm.best.iter().cloned());
                }
            }
        }
        population.truncate(2 * population_size);
        // An observed point (at a lower budget, say) is a candidate with its context pinned.
        for x in &mut population {
            feasible.encoder.pin_context(x);
        }
        population
    }
}

/// Sorts `order` (indices into `scores`) by score, best first; stable, so ties keep their
/// order (which the re-sorts after refinement and discrete moves rely on to stay as they
/// were).
fn sort_best_first(order: &mut [usize], scores: &[f64]) {
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
}

/// The hypervolume scalarization of several objectives: the smallest weighted gain over a
/// reference point, `min_k (v_k − r_k)/w_k`, along a random direction `w` (Golovin & Zhang
/// 2020); the identity for one objective.
struct Scalarization {
    /// The direction: |N(0, 1)| per objective (at least 1e-3), normalized.
    weights: Vec<f64>,
    /// Per objective, just below its worst warped target (−3 without any).
    reference: Vec<f64>,
}

impl Scalarization {
    /// Draws the direction (one normal per objective, also for one objective, so that the
    /// generator advances the same way).
    fn draw(model: &Model, rng: &mut StdRng) -> Self {
        let w: Vec<f64> = (0..model.objectives.len())
            .map(|_| {
                let z: f64 = StandardNormal.sample(rng);
                z.abs().max(1e-3)
            })
            .collect();
        let norm = w.iter().map(|v| v * v).sum::<f64>().sqrt();
        let weights = w.iter().map(|v| v / norm).collect();
        let reference = model
            .objectives
            .iter()
            .map(|o| {
                if o.train_y.is_empty() {
                    -3.0
                } else {
                    o.train_y.min() - 0.1
                }
            })
            .collect();
        Scalarization { weights, reference }
    }

    fn apply(&self, v: &[f64]) -> f64 {
        let m = self.weights.len();
        if m == 1 {
            v[0]
        } else {
            (0..m)
                .map(|k| (v[k] - self.reference[k]) / self.weights[k])
                .fold(f64::INFINITY, f64::min)
        }
    }
}

/// The points the search may propose: numbers in `[0, 1]`, category indices within their
/// levels, and on spaces with integers or discrete values, snapped to their grid.
struct Feasible<'a> {
    encoder: &'a Encoder,
    /// Per feature, its number of categories (`None`: numeric).
    levels: Vec<Option<usize>>,
    /// Whether the space holds only doubles (then no snapping and no discrete moves).
    continuous: bool,
}

impl<'a> Feasible<'a> {
    fn new(encoder: &'a Encoder) -> Self {
        Feasible {
            encoder,
            levels: encoder.levels(),
            continuous: encoder.is_continuous(),
        }
    }

    /// The nearest feasible point to `x` (clamped, rounded, snapped), with its context
    /// features pinned (see [`Encoder::pin_context`]).
    fn project(&self, x: Vec<f64>) -> Vec<f64> {
        let mut x: Vec<f64> = x
            .into_iter()
            .zip(&self.levels)
            .map(|(v, l)| match l {
                Some(k) => v.round().clamp(0.0, (*k).max(1) as f64 - 1.0),
                None => v.clamp(0.0, 1.0),
            })
            .collect();
        self.encoder.pin_context(&mut x);
        if self.continuous {
            x
        } else {
            self.encoder.snap(&x)
        }
    }

    /// A uniform random point; inside the incumbent's box (centre, half side) if there is
    /// one, where the candidates must be.
    fn random_point(&self, incumbent_box: Option<&(Vec<f64>, f64)>, rng: &mut StdRng) -> Vec<f64> {
        let x = self
            .levels
            .iter()
            .enumerate()
            .map(|(d, l)| match (l, incumbent_box) {
                (Some(k), _) => rng.random_range(0..(*k).max(1)) as f64,
                (None, Some((centre, half))) => {
                    centre[d] + half * (2.0 * rng.random::<f64>() - 1.0)
                }
                (None, None) => rng.random::<f64>(),
            })
            .collect();
        self.project(x)
    }

    /// A perturbation of `x`: numbers moved by N(0, 0.05²), each category redrawn with
    /// probability 0.2.
    fn perturb(&self, x: &[f64], rng: &mut StdRng) -> Vec<f64> {
        let x = x
            .iter()
            .zip(&self.levels)
            .map(|(v, l)| match l {
                Some(k) if rng.random::<f64>() < 0.2 => rng.random_range(0..(*k).max(1)) as f64,
                Some(_) => *v,
                None => {
                    let z: f64 = StandardNormal.sample(rng);
                    v + 0.05 * z
                }
            })
            .collect();
        self.project(x)
    }
}

/// One suggestion's acquisition: a candidate's score (larger is better), with everything
/// it depends on fixed before the search starts, so that the population search, the
/// gradient refinement and the discrete moves all maximize the same function.
struct Scorer<'a> {
    model: &'a Model,
    /// Covariance-only posteriors with the pending points (the pending-aware variance).
    pending_posts: Option<&'a [Posterior]>,
    /// A Thompson draw, which replaces the acquisition when present.
    sample: Option<PathwiseSample>,
    scalarization: Scalarization,
    /// UCB's exploration weight.
    beta: f64,
    /// The incumbent for EI: the best warped target (−∞ before any new trial).
    incumbent: f64,
    /// Whether the score is log-EI (one objective, with trials of this study).
    log_ei: bool,
    /// Whether the score is UCB; else UCB-PE's exploration of the promising region.
    use_ucb: bool,
    with_safety: bool,
    /// The probability of safety a candidate must reach ([`Model::required_safety`]).
    required: f64,
    /// Threshold of the promising region: the best scalarized LCB at observed points.
    threshold: f64,
    /// The floor of the probability weighting: below every plausible UCB value.
    floor: f64,
    /// The trust region's radius ([`Model::trust_radius`]).
    radius: f64,
    /// Per feature, whether it is categorical (distances count numeric features only).
    categorical: Vec<bool>,
}

/// A batch of candidates' predictions, as [`Scorer::score`] needs them.
struct Predictions {
    /// The Thompson draw's values, if drawn (then nothing else is predicted).
    drawn: Option<Vec<f64>>,
    /// Per objective, the posterior means and variances.
    preds: Vec<(Vec<f64>, Vec<f64>)>,
    /// Per objective, the pending-aware variances, with pending points.
    pending_vars: Option<Vec<Vec<f64>>>,
    /// The probability that every safety metric is safe (empty without any).
    psafe: Vec<f64>,
}

impl Predictions {
    /// Objective `k`'s variance at candidate `c`, pending-aware where there are pending
    /// points.
    fn var_p(&self, k: usize, c: usize) -> f64 {
        match &self.pending_vars {
            Some(v) => v[k][c],
            None => self.preds[k].1[c],
        }
    }
}

impl<'a> Scorer<'a> {
    fn new(
        model: &'a Model,
        config: &GpBanditConfig,
        encoder: &Encoder,
        first: bool,
        beta: f64,
        scalarization: Scalarization,
        sample: Option<PathwiseSample>,
    ) -> Self {
        let m = model.objectives.len();
        let with_safety = !model.safety.is_empty();
        let incumbent = model.objectives[0]
            .train_y
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        // UCB-PE's exploration needs a UCB threshold; safety studies use UCB throughout so
        // that the probability weighting applies to one kind of value.
        let use_ucb = first || config.batch == BatchAcquisition::PendingUcb || with_safety;
        let threshold = promising_threshold(model, beta, &scalarization);
        let floor = scalarization.apply(&scalarization.reference) - 2.0;
        Scorer {
            model,
            pending_posts: model.pending_posteriors.as_deref(),
            sample,
            scalarization,
            beta,
            incumbent,
            log_ei: config.acquisition == Acquisition::LogEi && m == 1 && !model.train_x.is_empty(),
            use_ucb,
            with_safety,
            required: model.required_safety(),
            threshold,
            floor,
            radius: model.trust_radius(config),
            categorical: encoder.categorical_mask(),
        }
    }

    /// The candidates' scores.
    fn score(&self, cands: &[Vec<f64>]) -> Vec<f64> {
        let predictions = self.predict(cands);
        (0..cands.len())
            .map(|c| {
                let mut value = self.acquisition(&predictions, c);
                if self.with_safety {
                    value = self.weighted_by_safety(value, predictions.psafe[c]);
                }
                self.outside_regions(&cands[c]).unwrap_or(value)
            })
            .collect()
    }

    /// What the scores need at `cands`. A Thompson draw needs no posterior means or
    /// variances (a third of its cost).
    fn predict(&self, cands: &[Vec<f64>]) -> Predictions {
        let drawn = self.sample.as_ref().map(|s| s.values(cands));
        let preds: Vec<(Vec<f64>, Vec<f64>)> = if drawn.is_some() {
            Vec::new()
        } else {
            self.model
                .objectives
                .iter()
                .map(|o| o.predict(cands))
                .collect()
        };
        let pending_vars: Option<Vec<Vec<f64>>> =
            self.pending_posts.filter(|_| drawn.is_none()).map(|pp| {
                pp.iter()
                    .zip(&self.model.objectives)
                    .map(|(p, o)| p.predict(&o.candidates(cands)).1)
                    .collect()
            });
        let psafe = if self.with_safety {
            self.model.prob_safe(cands)
        } else {
            Vec::new()
        };
        Predictions {
            drawn,
            preds,
            pending_vars,
            psafe,
        }
    }

    /// Candidate `c`'s acquisition value before safety and regions: the Thompson draw,
    /// log-EI, (scalarized) UCB, or UCB-PE: inside the promising region the total
    /// pending-aware standard deviation, outside it below −1 by the UCB's shortfall.
    fn acquisition(&self, p: &Predictions, c: usize) -> f64 {
        let m = self.model.objectives.len();
        if let Some(d) = &p.drawn {
            d[c]
        } else if self.log_ei {
            let sd = p.var_p(0, c).sqrt().max(1e-12);
            sd.ln() + log_h((p.preds[0].0[c] - self.incumbent) / sd)
        } else if self.use_ucb {
            let ucb: Vec<f64> = (0..m)
                .map(|k| p.preds[k].0[c] + self.beta * p.var_p(k, c).sqrt())
                .collect();
            self.scalarization.apply(&ucb)
        } else {
            let ucb: Vec<f64> = (0..m)
                .map(|k| p.preds[k].0[c] + self.beta * p.preds[k].1[c].sqrt())
                .collect();
            let u = self.scalarization.apply(&ucb);
            if u >= self.threshold {
                (0..m).map(|k| p.var_p(k, c)).sum::<f64>().sqrt()
            } else {
                -1.0 - (self.threshold - u)
            }
        }
    }

    /// `value` weighted by the probability of safety `p`; below the required probability,
    /// only the most likely safe of such points, if nothing else is left.
    fn weighted_by_safety(&self, value: f64, p: f64) -> f64 {
        let weighted = if self.log_ei {
            // ln(EI · p): constrained EI (Gardner et al. 2014).
            value + p.max(1e-300).ln()
        } else {
            self.floor + (value - self.floor).max(0.0) * p
        };
        if p < self.required {
            -1e6 + p
        } else {
            weighted
        }
    }

    /// The score of a candidate outside the incumbent's box or the trust region (below
    /// −1e9 by its distance), or `None` inside both.
    fn outside_regions(&self, x: &[f64]) -> Option<f64> {
        if let Some((centre, half)) = &self.model.incumbent_box {
            let dist = self.numeric_linf(centre, x);
            if dist > *half {
                return Some(-1e9 - dist);
            }
        }
        if self.radius < 1.0 {
            let dist = self
                .model
                .train_x
                .iter()
                .map(|t| self.numeric_linf(t, x))
                .fold(f64::INFINITY, f64::min);
            if dist > self.radius {
                return Some(-1e9 - dist);
            }
        }
        None
    }

    /// L∞ distance over the numeric features.
    fn numeric_linf(&self, a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .zip(&self.categorical)
            .filter(|(_, c)| !**c)
            .map(|((x, y), _)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    /// The smooth acquisition the score is, for gradient refinement: UCB or log-EI; none
    /// for UCB-PE's piecewise score or a Thompson draw (no gradient here).
    fn smooth(&self) -> Option<refine::Smooth> {
        if self.sample.is_some() {
            None
        } else if self.log_ei {
            Some(refine::Smooth::LogEi {
                incumbent: self.incumbent,
            })
        } else if self.use_ucb {
            Some(refine::Smooth::Ucb { beta: self.beta })
        } else {
            None
        }
    }

    /// Gradient refinement of the best distinct candidates (see [`refine`]); returns
    /// whether it ran. Only for one objective without safety metrics, whose score is the
    /// smooth acquisition itself up to the trust region's cut, on spaces of doubles. On the
    /// mixed problems, where snapping integers undoes small steps, it lost (mixed_ackley6,
    /// batches of 5, median at 50 trials: 2.89 against 2.23; mixed_train5 at 50: 0.1
    /// against 0.054). A Thompson draw has no gradient here: the population search alone
    /// maximizes it.
    fn refine_best(
        &self,
        config: &GpBanditConfig,
        feasible: &Feasible<'_>,
        population: &mut [Vec<f64>],
        scores: &mut [f64],
        ranked: &[usize],
    ) -> bool {
        let o = &self.model.objectives[0];
        let applies = self.model.objectives.len() == 1
            && !self.with_safety
            && feasible.continuous
            && config.refine_starts > 0;
        if !applies {
            return false;
        }
        let (Some(kind), Some(post)) = (self.smooth(), o.posterior.as_ref()) else {
            return false;
        };
        let dim = feasible.encoder.dim();
        let pending_post = self.pending_posts.and_then(|pp| pp.first());
        let gradient = |x: &[f64]| -> Option<Vec<f64>> {
            let lifted = o.lift_point(x);
            let mean = post.predict_with_gradient(&lifted);
            let (_, mut grad) = match pending_post {
                Some(pp) => {
                    refine::value_and_gradient(kind, &mean, &pp.predict_with_gradient(&lifted))
                }
                None => refine::value_and_gradient(kind, &mean, &mean),
            };
            grad.truncate(dim);
            grad.iter().all(|g| g.is_finite()).then_some(grad)
        };
        // Preconditioner ℓ_j² (capped at 1); categories are not moved by gradients.
        let scale: Vec<f64> = (0..dim)
            .map(|j| {
                if self.categorical[j] {
                    0.0
                } else {
                    (1.0 / o.hyper.inv_ls2[j]).min(1.0)
                }
            })
            .collect();
        let space = refine::RefineSpace {
            scale: &scale,
            max_steps: config.refine_steps,
        };
        for j in distinct_starts(ranked, scores, population, config.refine_starts) {
            let (x, s) = refine::ascend(
                &population[j],
                scores[j],
                &space,
                gradient,
                |x| self.score(std::slice::from_ref(&x.to_vec()))[0],
                |x| feasible.project(x),
            );
            population[j] = x;
            scores[j] = s;
        }
        true
    }
}

/// Threshold of UCB-PE's promising region: the best scalarized LCB at observed points
/// (−∞ without any).
fn promising_threshold(model: &Model, beta: f64, scalarization: &Scalarization) -> f64 {
    let preds: Vec<(Vec<f64>, Vec<f64>)> = model
        .objectives
        .iter()
        .map(|o| o.predict(&model.train_x))
        .collect();
    (0..model.train_x.len())
        .map(|i| {
            let lcb: Vec<f64> = preds
                .iter()
                .map(|(mu, var)| mu[i] - beta * var[i].sqrt())
                .collect();
            scalarization.apply(&lcb)
        })
        .fold(f64::NEG_INFINITY, f64::max)
}

/// Up to `count` of the `ranked` candidates (best first) to refine: inside the regions
/// (score above −1e8) and more than 1e-3 (L∞) from every one taken before.
fn distinct_starts(
    ranked: &[usize],
    scores: &[f64],
    population: &[Vec<f64>],
    count: usize,
) -> Vec<usize> {
    let mut starts: Vec<usize> = Vec::new();
    for &j in ranked {
        if starts.len() >= count {
            break;
        }
        if scores[j] > -1e8
            && starts
                .iter()
                .all(|&s| linf(&population[s], &population[j]) > 1e-3)
        {
            starts.push(j);
        }
    }
    starts
}

/// What makes a candidate a revisit (see [`pick_candidate`]).
#[derive(Clone, Copy)]
pub(super) struct Revisit<'a> {
    /// Per feature, whether it is numeric (its bounds are faces of the box).
    pub(super) numeric: &'a [bool],
    /// L∞ distance to a known point within which a candidate on a face is a revisit (0: off).
    pub(super) radius: f64,
}

/// The index in `ranked` (best first) of the candidate to suggest: the first that is not a
/// known point, unless it is a revisit: on a face of the box, within `revisit.radius` of a
/// known point and with no predicted improvement (`no_gain`); then the first candidate at
/// least that far from every known point, if there is one.
///
/// Why: UCB's σ is largest on the box's faces, so its argmax lands there more often than
/// optima do (boundary over-exploration, Siivola et al. 2018); once the best trial sits on a
/// face, a near-noiseless GP with no trial just inside cannot see the slope into the box,
/// and UCB's argmax becomes that trial again. Measured (cold studies, 50 trials, seeds
/// 0–39): 2 of 40 Branin studies (regret 1.4 and 1.5) and 4 of 40 on Branin shifted by
/// (0.15, −0.2) (0.82–0.86) spent most of their trials re-measuring a point on the edge
/// x₀ = 10 between far-off explorations; with radius 0.01 one did (regret 0.34), and the
/// medians stayed (5.6e-6 and 7.9e-6 against 5.3e-6 and 9.1e-6). Interior points are left
/// alone: polishing an interior optimum takes steps far below 0.01.
pub(super) fn pick_candidate(
    ranked: &[Vec<f64>],
    known: &[Vec<f64>],
    revisit: Revisit<'_>,
    no_gain: impl Fn(&[f64]) -> bool,
) -> Option<usize> {
    let nearest = |x: &[f64]| {
        known
            .iter()
            .map(|k| linf(k, x))
            .fold(f64::INFINITY, f64::min)
    };
    let first = ranked.iter().position(|x| nearest(x) > 1e-9)?;
    let x = &ranked[first];
    let on_face = x
        .iter()
        .zip(revisit.numeric)
        .any(|(v, numeric)| *numeric && (*v <= 0.0 || *v >= 1.0));
    if revisit.radius > 0.0
        && on_face
        && nearest(x) < revisit.radius
        && no_gain(x)
        && let Some(far) = ranked.iter().position(|y| nearest(y) >= revisit.radius)
    {
        return Some(far);
    }
    Some(first)
}

pub(super) fn linf(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
