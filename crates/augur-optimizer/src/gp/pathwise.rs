//! Functions drawn from a GP posterior, for Thompson sampling: a draw is a whole function,
//! cheap to evaluate anywhere, so the acquisition search can maximize it like any other
//! acquisition.

use nalgebra::DVector;
use rand::{Rng, RngExt};
use rand_distr::{ChiSquared, Distribution, StandardNormal};

use super::model::Posterior;

/// One function drawn from a GP posterior (see the module header).
///
/// Pathwise conditioning (Wilson et al. 2020, "Efficiently sampling functions from Gaussian
/// process posteriors"): with `f̃` a draw from the prior and `ε ~ N(0, σ_n² I)`,
/// `f*(x) = f̃(x) + k(x, X) K_y⁻¹ (y − f̃(X) − ε)` is a draw from the posterior given `y` at
/// `X`. The prior draw uses random Fourier features (Rahimi & Recht 2007):
/// `f̃(x) = Σ_j w_j √(2σ²/m) cos(ω_jᵀx + b_j)`, `w_j ~ N(0, 1)`, `b_j ~ U[0, 2π)`, and for the
/// Matérn-5/2 kernel the frequencies follow its spectral density, a multivariate Student-t
/// with 5 degrees of freedom and scale `1/ℓ` per feature: `ω = z/(ℓ √(u/5))`,
/// `z ~ N(0, I)`, `u ~ χ²₅`. Numeric features only (the Hamming term of a categorical
/// feature has no such spectral form).
pub struct PathwiseSample {
    /// Frequencies `ω_j`, already scaled by the inverse length scales.
    omega: Vec<Vec<f64>>,
    /// Phases `b_j`.
    phase: Vec<f64>,
    /// `w_j √(2σ²/m)`.
    weight: Vec<f64>,
    /// The posterior's points conditioned on the residual `y − f̃(X) − ε`: its mean is the
    /// update term `k(x, X) K_y⁻¹ (y − f̃(X) − ε)`.
    update: Posterior,
}

impl PathwiseSample {
    /// Draw a function from `posterior` with `features` random Fourier features; `None` for
    /// a covariance-only posterior or one with categorical features.
    pub fn draw(posterior: &Posterior, features: usize, rng: &mut impl Rng) -> Option<Self> {
        let h = &posterior.hyper;
        if h.categorical.iter().any(|c| *c) || features == 0 {
            return None;
        }
        let y = posterior.outputs()?;
        let chi = ChiSquared::new(5.0).ok()?;
        let omega: Vec<Vec<f64>> = (0..features)
            .map(|_| {
                let u: f64 = chi.sample(rng);
                let s = (5.0 / u.max(1e-12)).sqrt();
                h.inv_ls2
                    .iter()
                    .map(|w| {
                        let z: f64 = StandardNormal.sample(rng);
                        z * s * w.sqrt()
                    })
                    .collect()
            })
            .collect();
        let phase: Vec<f64> = (0..features)
            .map(|_| rng.random::<f64>() * std::f64::consts::TAU)
            .collect();
        let scale = (2.0 * h.amplitude / features as f64).sqrt();
        let weight: Vec<f64> = (0..features)
            .map(|_| {
                let z: f64 = StandardNormal.sample(rng);
                z * scale
            })
            .collect();
        let noise_sd = h.noise.sqrt();
        let prior = Prior {
            omega: &omega,
            phase: &phase,
            weight: &weight,
        };
        let at_x = prior.values(posterior.points());
        let residual = DVector::from_iterator(
            y.len(),
            y.iter().zip(at_x).map(|(y, f)| {
                let e: f64 = StandardNormal.sample(rng);
                y - f - noise_sd * e
            }),
        );
        let update = posterior.with_outputs(&residual);
        Some(PathwiseSample {
            omega,
            phase,
            weight,
            update,
        })
    }

    /// The drawn function's values at `points`.
    pub fn values(&self, points: &[Vec<f64>]) -> Vec<f64> {
        let prior = Prior {
            omega: &self.omega,
            phase: &self.phase,
            weight: &self.weight,
        };
        prior
            .values(points)
            .into_iter()
            .zip(self.update.predict_mean(points))
            .map(|(a, b)| a + b)
            .collect()
    }
}

/// The random-Fourier-feature prior draw `f̃`.
struct Prior<'a> {
    omega: &'a [Vec<f64>],
    phase: &'a [f64],
    weight: &'a [f64],
}

impl Prior<'_> {
    fn values(&self, points: &[Vec<f64>]) -> Vec<f64> {
        points
            .iter()
            .map(|x| {
                self.omega
                    .iter()
                    .zip(self.phase)
                    .zip(self.weight)
                    .map(|((w, b), a)| {
                        let dot: f64 = w.iter().zip(x).map(|(w, x)| w * x).sum();
                        a * (dot + b).cos()
                    })
                    .sum()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gp::kernel::Hyper;
    use rand::{SeedableRng, rngs::StdRng};

    /// A posterior with noise variance ≈ 1.1e-6 (sd ≈ 1e-3, mostly the kernel's floor).
    fn posterior(points: usize, seed: u64) -> Posterior {
        let mut rng = StdRng::seed_from_u64(seed);
        let x: Vec<Vec<f64>> = (0..points)
            .map(|_| (0..2).map(|_| rng.random::<f64>()).collect())
            .collect();
        let y = DVector::from_iterator(points, x.iter().map(|p| (5.0 * p[0]).sin() - p[1]));
        let h = Hyper::from_theta(&[0.0, -1.5, -1.0, -16.0]);
        Posterior::new(h, x, Some(&y)).expect("factorizes")
    }

    #[test]
    fn draws_have_the_posterior_mean_and_variance() {
        // Over many draws, the sample mean and variance at a few points approach the
        // posterior's (within Monte Carlo error and the feature approximation's bias).
        let post = posterior(12, 1);
        let probes: Vec<Vec<f64>> = vec![vec![0.1, 0.9], vec![0.5, 0.5], vec![0.95, 0.05]];
        let (mean, var) = post.predict(&probes);
        let mut rng = StdRng::seed_from_u64(2);
        let draws = 2000;
        let mut sum = [0.0; 3];
        let mut sum2 = [0.0; 3];
        for _ in 0..draws {
            let s = PathwiseSample::draw(&post, 500, &mut rng).expect("numeric");
            for (k, v) in s.values(&probes).into_iter().enumerate() {
                sum[k] += v;
                sum2[k] += v * v;
            }
        }
        for k in 0..3 {
            let m = sum[k] / draws as f64;
            let v = sum2[k] / draws as f64 - m * m;
            let sd = var[k].sqrt();
            assert!(
                (m - mean[k]).abs() < 0.1 * sd + 0.01,
                "mean {m} vs {}",
                mean[k]
            );
            assert!((v / var[k] - 1.0).abs() < 0.2, "variance {v} vs {}", var[k]);
        }
    }

    #[test]
    fn draws_interpolate_noise_free_data() {
        // With tiny noise, a draw passes through the observed outputs (within a few noise
        // standard deviations).
        let post = posterior(8, 3);
        let mut rng = StdRng::seed_from_u64(4);
        let s = PathwiseSample::draw(&post, 256, &mut rng).expect("numeric");
        let at_x = s.values(post.points());
        for (v, y) in at_x.iter().zip(post.outputs().expect("outputs").iter()) {
            assert!((v - y).abs() < 1e-2, "{v} vs {y}");
        }
    }

    #[test]
    fn prior_draws_match_the_matern_kernel() {
        // E[f̃(x) f̃(x')] = k(x, x'): the empirical covariance of prior draws at two points
        // a length scale apart matches the Matérn-5/2 value.
        let h = Hyper::from_theta(&[0.0, -1.0, -1.0, -9.0]);
        let (a, b) = (vec![0.2, 0.3], vec![0.2 + (-1.0f64).exp(), 0.3]);
        let mut rng = StdRng::seed_from_u64(5);
        let (mut prod, mut sq) = (0.0, 0.0);
        let draws = 4000;
        // An empty posterior is not possible; a single far-away point barely conditions.
        let post = Posterior::new(h.clone(), vec![vec![50.0, 50.0]], Some(&DVector::zeros(1)))
            .expect("factorizes");
        for _ in 0..draws {
            let s = PathwiseSample::draw(&post, 200, &mut rng).expect("numeric");
            let v = s.values(&[a.clone(), b.clone()]);
            prod += v[0] * v[1];
            sq += v[0] * v[0];
        }
        let cov = prod / draws as f64;
        let var = sq / draws as f64;
        assert!((cov - h.k(&a, &b)).abs() < 0.06, "{cov} vs {}", h.k(&a, &b));
        assert!((var - h.amplitude).abs() < 0.08, "{var} vs {}", h.amplitude);
    }

    #[test]
    fn categorical_features_and_covariance_only_posteriors_give_no_draw() {
        let mut rng = StdRng::seed_from_u64(6);
        let h = Hyper::from_theta_with(&[0.0, -1.0, 0.0, -9.0], &[false, true]);
        let post =
            Posterior::new(h, vec![vec![0.1, 0.0]], Some(&DVector::zeros(1))).expect("factorizes");
        assert!(PathwiseSample::draw(&post, 64, &mut rng).is_none());
        let h = Hyper::from_theta(&[0.0, -1.0, -9.0]);
        let cov_only = Posterior::new(h, vec![vec![0.1]], None).expect("factorizes");
        assert!(PathwiseSample::draw(&cov_only, 64, &mut rng).is_none());
    }
}
