//! The acquisition and its maximization: what a candidate scores (UCB, log-EI, UCB-PE,
//! a Thompson draw; weighted by the probability of safety), where the search for its
//! maximum starts (the best observed points, their discrete neighbours, the prior studies'
//! best, the best raw samples), the search itself ([`super::search`], then gradient
//! refinement, [`super::refine`]), and which of the best candidates is suggested
//! ([`pick_candidate`]).

use rand::{RngExt, rngs::StdRng};
use rand_distr::{Distribution, StandardNormal};

use crate::gp::encoding::Encoder;
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
    pub(super) fn next_point(
        &mut self,
        config: &GpBanditConfig,
        encoder: &Encoder,
        first: bool,
        thompson: bool,
        rng: &mut StdRng,
    ) -> Option<Vec<f64>> {
        let m = self.objectives.len();
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
        let beta = beta * (1.0 + config.batch_beta_growth * self.pending.len().min(4) as f64);
        // A random direction for the hypervolume scalarization (ignored for one metric).
        let weights: Vec<f64> = {
            let w: Vec<f64> = (0..m)
                .map(|_| {
                    let z: f64 = StandardNormal.sample(rng);
                    z.abs().max(1e-3)
                })
                .collect();
            let norm = w.iter().map(|v| v * v).sum::<f64>().sqrt();
            w.iter().map(|v| v / norm).collect()
        };
        let reference: Vec<f64> = self
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
        let scalarize = |v: &[f64]| -> f64 {
            if m == 1 {
                v[0]
            } else {
                (0..m)
                    .map(|k| (v[k] - reference[k]) / weights[k])
                    .fold(f64::INFINITY, f64::min)
            }
        };
        let with_safety = !self.safety.is_empty();
        let sample = if thompson && m == 1 && !with_safety && encoder.is_continuous() {
            let o = &self.objectives[0];
            o.posterior
                .as_ref()
                .filter(|_| o.warm.is_none())
                .and_then(|p| PathwiseSample::draw(p, config.thompson_features, rng))
        } else {
            None
        };
        // The incumbent for EI: the best warped target (none before any new trial).
        let incumbent = self.objectives[0]
            .train_y
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let log_ei = config.acquisition == Acquisition::LogEi && m == 1 && !self.train_x.is_empty();
        let required = self.required_safety();
        // UCB-PE's exploration needs a UCB threshold; safety studies use UCB throughout so
        // that the probability weighting applies to one kind of value.
        let use_ucb = first || config.batch == BatchAcquisition::PendingUcb || with_safety;
        // Threshold of the promising region: the best scalarized LCB at observed points.
        let threshold = {
            let preds: Vec<(Vec<f64>, Vec<f64>)> = self
                .objectives
                .iter()
                .map(|o| o.predict(&self.train_x))
                .collect();
            (0..self.train_x.len())
                .map(|i| {
                    let lcb: Vec<f64> = preds
                        .iter()
                        .map(|(mu, var)| mu[i] - beta * var[i].sqrt())
                        .collect();
                    scalarize(&lcb)
                })
                .fold(f64::NEG_INFINITY, f64::max)
        };
        // The floor of the probability weighting: below every plausible UCB value.
        let floor = scalarize(&reference) - 2.0;
        // Trust region: L∞ radius (numeric features) around observed points, growing with
        // the study; off once it covers the cube, and with a prior study's mean (which
        // knows the whole space).
        let radius = if !config.trust_region || self.uses_prior() || self.train_x.is_empty() {
            f64::INFINITY
        } else {
            0.2 + 0.1 * self.num_completed as f64 / self.num_parameters.max(1) as f64
        };
        let categorical = encoder.categorical_mask();
        let numeric_linf = |a: &[f64], b: &[f64]| -> f64 {
            a.iter()
                .zip(b)
                .zip(&categorical)
                .filter(|(_, c)| !**c)
                .map(|((x, y), _)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        let known: Vec<Vec<f64>> = self
            .train_x
            .iter()
            .chain(self.pending.iter())
            .cloned()
            .collect();
        self.build_pending_posteriors();
        let this = &*self;
        let pending_posts = this.pending_posteriors.as_deref();
        let score = |cands: &[Vec<f64>]| -> Vec<f64> {
            let drawn = sample.as_ref().map(|s| s.values(cands));
            // A Thompson draw needs no posterior means or variances (a third of its cost).
            let preds: Vec<(Vec<f64>, Vec<f64>)> = if drawn.is_some() {
                Vec::new()
            } else {
                this.objectives.iter().map(|o| o.predict(cands)).collect()
            };
            let pvars: Option<Vec<Vec<f64>>> =
                pending_posts.filter(|_| drawn.is_none()).map(|pp| {
                    pp.iter()
                        .zip(&this.objectives)
                        .map(|(p, o)| p.predict(&o.candidates(cands)).1)
                        .collect()
                });
            let psafe = if with_safety {
                this.prob_safe(cands)
            } else {
                Vec::new()
            };
            (0..cands.len())
                .map(|c| {
                    let var_p = |k: usize| match &pvars {
                        Some(v) => v[k][c],
                        None => preds[k].1[c],
                    };
                    let mut value = if let Some(d) = &drawn {
                        d[c]
                    } else if log_ei {
                        let sd = var_p(0).sqrt().max(1e-12);
                        sd.ln() + log_h((preds[0].0[c] - incumbent) / sd)
                    } else if use_ucb {
                        let ucb: Vec<f64> = (0..m)
                            .map(|k| preds[k].0[c] + beta * var_p(k).sqrt())
                            .collect();
                        scalarize(&ucb)
                    } else {
                        let ucb: Vec<f64> = (0..m)
                            .map(|k| preds[k].0[c] + beta * preds[k].1[c].sqrt())
                            .collect();
                        let u = scalarize(&ucb);
                        if u >= threshold {
                            (0..m).map(var_p).sum::<f64>().sqrt()
                        } else {
                            -1.0 - (threshold - u)
                        }
                    };
                    if with_safety {
                        let p = psafe[c];
                        value = if log_ei {
                            // ln(EI · p): constrained EI (Gardner et al. 2014).
                            value + p.max(1e-300).ln()
                        } else {
                            floor + (value - floor).max(0.0) * p
                        };
                        if p < required {
                            // Below the required probability: only the most likely safe
                            // of such points, if nothing else is left.
                            value = -1e6 + p;
                        }
                    }
                    if let Some((centre, half)) = &this.incumbent_box {
                        let dist = numeric_linf(centre, &cands[c]);
                        if dist > *half {
                            return -1e9 - dist;
                        }
                    }
                    if radius < 1.0 {
                        let dist = this
                            .train_x
                            .iter()
                            .map(|t| numeric_linf(t, &cands[c]))
                            .fold(f64::INFINITY, f64::min);
                        if dist > radius {
                            return -1e9 - dist;
                        }
                    }
                    value
                })
                .collect()
        };
        let dim = encoder.dim();
        let levels = encoder.levels();
        let continuous = encoder.is_continuous();
        let project = |x: Vec<f64>| -> Vec<f64> {
            let x: Vec<f64> = x
                .into_iter()
                .zip(&levels)
                .map(|(v, l)| match l {
                    Some(k) => v.round().clamp(0.0, (*k).max(1) as f64 - 1.0),
                    None => v.clamp(0.0, 1.0),
                })
                .collect();
            if continuous { x } else { encoder.snap(&x) }
        };
        let incumbent_box = self.incumbent_box.clone();
        let random_point = |rng: &mut StdRng| -> Vec<f64> {
            let x = levels
                .iter()
                .enumerate()
                .map(|(d, l)| match (l, &incumbent_box) {
                    (Some(k), _) => rng.random_range(0..(*k).max(1)) as f64,
                    // Inside the incumbent's box, where the candidates must be.
                    (None, Some((centre, half))) => {
                        centre[d] + half * (2.0 * rng.random::<f64>() - 1.0)
                    }
                    (None, None) => rng.random::<f64>(),
                })
                .collect();
            project(x)
        };
        // Seeds: the best observed points (by the scalarized warped targets), each with a
        // few perturbations; every one-parameter discrete move from the best two; the prior
        // studies' best points; and uniform random points.
        let mut order: Vec<usize> = (0..self.train_x.len()).collect();
        let quality: Vec<f64> = order
            .iter()
            .map(|&i| {
                scalarize(
                    &self
                        .objectives
                        .iter()
                        .map(|o| o.train_y[i])
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        order.sort_by(|&a, &b| quality[b].total_cmp(&quality[a]));
        let population_size = config.population.max(8);
        let mut population: Vec<Vec<f64>> = Vec::with_capacity(2 * population_size);
        for &i in order.iter().take(5) {
            population.push(self.train_x[i].clone());
            for _ in 0..3 {
                let x = self.train_x[i]
                    .iter()
                    .zip(&levels)
                    .map(|(v, l)| match l {
                        Some(k) if rng.random::<f64>() < 0.2 => {
                            rng.random_range(0..(*k).max(1)) as f64
                        }
                        Some(_) => *v,
                        None => {
                            let z: f64 = StandardNormal.sample(rng);
                            v + 0.05 * z
                        }
                    })
                    .collect();
                population.push(project(x));
            }
        }
        if !continuous {
            for &i in order.iter().take(2) {
                population.extend(encoder.discrete_neighbours(&self.train_x[i]));
            }
        }
        // The prior studies' best points, until the new study has its own.
        if self.train_x.is_empty() {
            for o in &self.objectives {
                if let Some(warm) = &o.warm {
                    population.extend(warm.best.iter().cloned());
                }
            }
        }
        population.truncate(2 * population_size);
        let mut scores = score(&population);
        // The rest of the population: the best of `raw_samples` uniform random points (as
        // BoTorch's `optimize_acqf` starts from its best raw samples), so that a narrow
        // basin far from the observed points still gets candidates.
        if population.len() < population_size {
            let raw: Vec<Vec<f64>> = (0..config.raw_samples.max(population_size))
                .map(|_| random_point(rng))
                .collect();
            let raw_scores = score(&raw);
            let mut order: Vec<usize> = (0..raw.len()).collect();
            order.sort_by(|&a, &b| raw_scores[b].total_cmp(&raw_scores[a]));
            for &i in order.iter().take(population_size - population.len()) {
                population.push(raw[i].clone());
                scores.push(raw_scores[i]);
            }
        }
        search::evolve(
            &mut population,
            &mut scores,
            &levels,
            config.generations.max(1),
            &score,
            &project,
            rng,
        );
        let mut ranked: Vec<usize> = (0..population.len()).collect();
        ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        // Gradient refinement of the best distinct candidates (see `refine`): single
        // objective without safety metrics, whose score is the smooth acquisition itself up
        // to the trust region's cut, on spaces of doubles only. On the mixed problems,
        // where snapping integers undoes small steps, it lost (mixed_ackley6, batches of 5,
        // median at 50 trials: 2.89 against 2.23; mixed_train5 at 50: 0.1 against 0.054).
        // A Thompson draw has no gradient here: the population search alone maximizes it.
        let smooth = if sample.is_some() {
            None
        } else if log_ei {
            Some(refine::Smooth::LogEi { incumbent })
        } else if use_ucb {
            Some(refine::Smooth::Ucb { beta })
        } else {
            None
        };
        if let Some(kind) = smooth
            && m == 1
            && !with_safety
            && continuous
            && config.refine_starts > 0
            && let Some(post) = this.objectives[0].posterior.as_ref()
        {
            let o = &this.objectives[0];
            let pending_post = pending_posts.and_then(|pp| pp.first());
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
                    if categorical[j] {
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
            let mut starts: Vec<usize> = Vec::new();
            for &j in &ranked {
                if starts.len() >= config.refine_starts {
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
            for j in starts {
                let (x, s) = refine::ascend(
                    &population[j],
                    scores[j],
                    &space,
                    gradient,
                    |x| score(std::slice::from_ref(&x.to_vec()))[0],
                    project,
                );
                population[j] = x;
                scores[j] = s;
            }
            ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        }
        // Discrete moves from the three best candidates, which the steps above cannot make.
        if !continuous {
            let best: Vec<usize> = ranked.iter().take(3).copied().collect();
            search::discrete_local_search(&mut population, &mut scores, &best, encoder, &score);
            ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        }
        let ranked: Vec<Vec<f64>> = ranked.into_iter().map(|j| population[j].clone()).collect();
        let no_gain =
            |x: &[f64]| m == 1 && this.objectives[0].predict(&[x.to_vec()]).0[0] <= incumbent;
        let numeric: Vec<bool> = levels.iter().map(Option::is_none).collect();
        let revisit = Revisit {
            numeric: &numeric,
            radius: config.boundary_revisit_radius,
        };
        pick_candidate(&ranked, &known, revisit, no_gain).map(|i| ranked[i].clone())
    }
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
