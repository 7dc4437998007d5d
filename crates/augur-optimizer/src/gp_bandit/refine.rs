//! Gradient-based local refinement of acquisition candidates.

use crate::gp::model::MeanVarianceGradient;
use crate::gp::warping::normal_cdf;

use super::log_h;

/// Which smooth acquisition the gradient is of.
#[derive(Debug, Clone, Copy)]
pub(super) enum Smooth {
    Ucb { beta: f64 },
    LogEi { incumbent: f64 },
}

/// `d ln h(z)/dz = Φ(z)/h(z)`; below −5 the derivative of [`log_h`]'s asymptotic series.
pub(super) fn log_h_derivative(z: f64) -> f64 {
    const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;
    if z > -5.0 {
        let phi = (-0.5 * z * z - LN_SQRT_2PI).exp();
        normal_cdf(z) / (phi + z * normal_cdf(z)).max(1e-300)
    } else {
        // d/dz [−z²/2 − ln z² + ln(1 − 3/z² + 15/z⁴)].
        let (z2, z3, z5) = (z * z, z * z * z, z.powi(5));
        let series = 1.0 - 3.0 / z2 + 15.0 / (z2 * z2);
        -z - 2.0 / z + (6.0 / z3 - 60.0 / z5) / series
    }
}

/// The acquisition's value and gradient from the mean's prediction `m` and the variance's
/// `v` (the same prediction, or the pending-aware covariance's).
pub(super) fn value_and_gradient(
    kind: Smooth,
    m: &MeanVarianceGradient,
    v: &MeanVarianceGradient,
) -> (f64, Vec<f64>) {
    let sd = v.variance.sqrt().max(1e-12);
    let sd_grad = v.variance_grad.iter().map(|g| g / (2.0 * sd));
    match kind {
        Smooth::Ucb { beta } => (
            m.mean + beta * sd,
            m.mean_grad
                .iter()
                .zip(sd_grad)
                .map(|(gm, gs)| gm + beta * gs)
                .collect(),
        ),
        Smooth::LogEi { incumbent } => {
            let z = (m.mean - incumbent) / sd;
            let dlh = log_h_derivative(z);
            (
                sd.ln() + log_h(z),
                m.mean_grad
                    .iter()
                    .zip(sd_grad)
                    .map(|(gm, gs)| gs / sd + dlh * (gm - z * gs) / sd)
                    .collect(),
            )
        }
    }
}

/// What one refinement may do.
pub(super) struct RefineSpace<'a> {
    /// Per feature, the preconditioner (squared length scale, capped); 0 for features the
    /// gradient must not move (categories).
    pub scale: &'a [f64],
    /// Most gradient steps.
    pub max_steps: usize,
}

/// Projected gradient ascent from `start` (whose score is `start_score`): `gradient` gives
/// the smooth acquisition's gradient, `score` judges a point (larger is better), `project`
/// makes a point feasible. Steps are taken along the preconditioned gradient, at most
/// `t` in any feature (t starts at 0.05, halves on a failed step, doubles after a success
/// up to 0.2); a step is taken only if it raises the score. Returns the best point and
/// its score: never worse than the start.
///
/// The population search finds the acquisition's basins; a few dozen gradient steps then
/// climb each of the best candidates to its basin's top, which random moves in 10
/// dimensions reach only slowly (the idea of BoTorch's `optimize_acqf` and Optuna's
/// `GPSampler`: multi-start local optimization from the best raw samples).
///
/// The acquisitions and their gradients, from the posterior mean μ, the (pending-aware)
/// variance s² and their gradients, with `∇s = ∇s²/(2s)`:
/// - UCB `a = μ + β s`: `∇a = ∇μ + β ∇s`;
/// - log-EI `a = ln s + ln h(z)`, `z = (μ − y*)/s`, `h(z) = φ(z) + z Φ(z)`, `h′ = Φ`:
///   `∇a = ∇s/s + (ln h)′(z) (∇μ − z ∇s)/s`.
///
/// The ascent is projected (onto the box, then the space's feasible values) and
/// preconditioned by the squared length scales, since the acquisition changes on the scale
/// of `ℓ_j` in feature j. Every step is judged by the full score (trust region, penalties
/// included), and only strict improvements are taken, so a refined candidate is never
/// worse than its start.
pub(super) fn ascend(
    start: &[f64],
    start_score: f64,
    space: &RefineSpace<'_>,
    gradient: impl Fn(&[f64]) -> Option<Vec<f64>>,
    score: impl Fn(&[f64]) -> f64,
    project: impl Fn(Vec<f64>) -> Vec<f64>,
) -> (Vec<f64>, f64) {
    let (mut x, mut fx) = (start.to_vec(), start_score);
    if !fx.is_finite() {
        return (x, fx);
    }
    let mut t: f64 = 0.05;
    for _ in 0..space.max_steps {
        let Some(g) = gradient(&x) else { break };
        let d: Vec<f64> = g.iter().zip(space.scale).map(|(g, s)| g * s).collect();
        let norm = d.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        if !(norm.is_finite() && norm > 1e-12) {
            break;
        }
        let mut improved = false;
        while t > 1e-6 {
            let y = project(
                x.iter()
                    .zip(&d)
                    .map(|(xi, di)| xi + t * di / norm)
                    .collect(),
            );
            let fy = score(&y);
            if fy > fx {
                (x, fx) = (y, fy);
                improved = true;
                t = (2.0 * t).min(0.2);
                break;
            }
            t /= 2.0;
        }
        if !improved {
            break;
        }
    }
    (x, fx)
}

#[cfg(test)]
mod tests {
    use nalgebra::DVector;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    use super::*;
    use crate::gp::kernel::Hyper;
    use crate::gp::model::Posterior;

    #[test]
    fn log_h_derivative_matches_finite_differences_on_both_branches() {
        for z in [-9.0, -6.0, -5.2, -4.8, -2.0, -0.3, 0.0, 1.5, 4.0] {
            let eps = 1e-5;
            let numeric = (log_h(z + eps) - log_h(z - eps)) / (2.0 * eps);
            let analytic = log_h_derivative(z);
            assert!(
                (analytic - numeric).abs() < 1e-3 * numeric.abs().max(1.0),
                "z = {z}: {analytic} vs {numeric}"
            );
        }
    }

    fn posteriors() -> (Posterior, Posterior) {
        let mut rng = StdRng::seed_from_u64(11);
        let x: Vec<Vec<f64>> = (0..25)
            .map(|_| (0..3).map(|_| rng.random::<f64>()).collect())
            .collect();
        let y = DVector::from_iterator(25, x.iter().map(|p| (5.0 * p[0]).cos() + p[1] - p[2]));
        let hyper = Hyper::from_theta(&[0.0, -1.2, -0.5, -0.9, -7.0]);
        let mean = Posterior::new(hyper.clone(), x.clone(), Some(&y)).expect("pd");
        // A pending point joins the covariance, as in a batch.
        let mut with_pending = x;
        with_pending.push(vec![0.4, 0.4, 0.4]);
        let pending = Posterior::new(hyper, with_pending, None).expect("pd");
        (mean, pending)
    }

    #[test]
    fn ucb_and_log_ei_gradients_match_finite_differences_with_pending_variance() {
        let (mean, pending) = posteriors();
        let value = |kind: Smooth, p: &[f64]| {
            value_and_gradient(
                kind,
                &mean.predict_with_gradient(p),
                &pending.predict_with_gradient(p),
            )
        };
        for kind in [
            Smooth::Ucb { beta: 1.8 },
            Smooth::LogEi { incumbent: 1.2 },
            // Far above every mean: the asymptotic branch of ln h.
            Smooth::LogEi { incumbent: 30.0 },
        ] {
            for point in [[0.42, 0.37, 0.45], [0.9, 0.1, 0.6], [0.05, 0.95, 0.3]] {
                let (_, grad) = value(kind, &point);
                for j in 0..3 {
                    let eps = 1e-6;
                    let mut p = point;
                    p[j] += eps;
                    let fp = value(kind, &p).0;
                    p[j] -= 2.0 * eps;
                    let fm = value(kind, &p).0;
                    let numeric = (fp - fm) / (2.0 * eps);
                    assert!(
                        (grad[j] - numeric).abs() < 1e-4 * numeric.abs().max(1.0),
                        "{kind:?} at {point:?}, feature {j}: {} vs {numeric}",
                        grad[j]
                    );
                }
            }
        }
    }

    #[test]
    fn ascent_never_returns_a_worse_point_and_climbs_to_a_smooth_maximum() {
        let (mean, pending) = posteriors();
        let kind = Smooth::LogEi { incumbent: 1.0 };
        let acq = |p: &[f64]| {
            value_and_gradient(
                kind,
                &mean.predict_with_gradient(p),
                &pending.predict_with_gradient(p),
            )
        };
        let project = |x: Vec<f64>| x.into_iter().map(|v| v.clamp(0.0, 1.0)).collect();
        let space = RefineSpace {
            scale: &[0.1, 0.3, 0.2],
            max_steps: 50,
        };
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..20 {
            let start: Vec<f64> = (0..3).map(|_| rng.random::<f64>()).collect();
            let f0 = acq(&start).0;
            let (x, fx) = ascend(
                &start,
                f0,
                &space,
                |p| Some(acq(p).1),
                |p| acq(p).0,
                project,
            );
            assert!(fx >= f0, "{fx} < {f0}");
            assert!((acq(&x).0 - fx).abs() < 1e-12, "the score returned is x's");
            assert!(x.iter().all(|v| (0.0..=1.0).contains(v)));
        }
        // A concave quadratic with its top inside the box, scaled unevenly: reached.
        let top = [0.3, 0.8, 0.55];
        let q = |p: &[f64]| -> f64 {
            -(0..3)
                .map(|j| (j + 1) as f64 * (p[j] - top[j]).powi(2))
                .sum::<f64>()
        };
        let grad = |p: &[f64]| -> Option<Vec<f64>> {
            Some(
                (0..3)
                    .map(|j| -2.0 * (j + 1) as f64 * (p[j] - top[j]))
                    .collect(),
            )
        };
        let space = RefineSpace {
            scale: &[1.0, 1.0, 1.0],
            max_steps: 200,
        };
        let (x, _) = ascend(
            &[0.9, 0.1, 0.1],
            q(&[0.9, 0.1, 0.1]),
            &space,
            grad,
            q,
            project,
        );
        for j in 0..3 {
            assert!((x[j] - top[j]).abs() < 1e-3, "{x:?}");
        }
        // Features with scale 0 stay put.
        let frozen = RefineSpace {
            scale: &[1.0, 0.0, 1.0],
            max_steps: 200,
        };
        let (x, _) = ascend(
            &[0.9, 0.1, 0.1],
            q(&[0.9, 0.1, 0.1]),
            &frozen,
            grad,
            q,
            project,
        );
        assert_eq!(x[1], 0.1);
    }
}
