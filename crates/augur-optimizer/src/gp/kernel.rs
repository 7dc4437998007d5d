//! The Matérn-5/2 kernel with automatic relevance determination (one length scale per
//! feature).
//!
//! `k(x, y) = σ² (1 + √5 r + 5/3 r²) exp(−√5 r)`, with `r² = Σ_j (x_j − y_j)² / ℓ_j²`
//! (Rasmussen & Williams 2006, eq. 4.17).
//!
//! Hyperparameters are kept on a log scale as one vector
//! `θ = [ln σ², ln ℓ_1, …, ln ℓ_D, ln σ_n²]`, where `σ_n²` is the observation noise (plus a
//! fixed floor, [`NOISE_FLOOR`]).

/// Smallest observation noise variance (on standardized outputs).
pub const NOISE_FLOOR: f64 = 1e-6;

const SQRT5: f64 = 2.236_067_977_499_79;

/// Kernel hyperparameters, decoded from `θ`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hyper {
    /// Signal variance σ².
    pub amplitude: f64,
    /// `1 / ℓ_j²` per feature.
    pub inv_ls2: Vec<f64>,
    /// Observation noise variance σ_n² (including the floor).
    pub noise: f64,
}

impl Hyper {
    /// Decode `θ = [ln σ², ln ℓ_1..ln ℓ_D, ln σ_n²]`.
    pub fn from_theta(theta: &[f64]) -> Self {
        let d = theta.len() - 2;
        Hyper {
            amplitude: theta[0].exp(),
            inv_ls2: theta[1..=d].iter().map(|l| (-2.0 * l).exp()).collect(),
            noise: NOISE_FLOOR + theta[d + 1].exp(),
        }
    }

    /// `k(x, y)` without noise.
    pub fn k(&self, x: &[f64], y: &[f64]) -> f64 {
        matern52(self.amplitude, scaled_r2(&self.inv_ls2, x, y).sqrt())
    }
}

/// `r² = Σ_j (x_j − y_j)² / ℓ_j²`.
pub fn scaled_r2(inv_ls2: &[f64], x: &[f64], y: &[f64]) -> f64 {
    inv_ls2
        .iter()
        .zip(x.iter().zip(y))
        .map(|(w, (a, b))| w * (a - b) * (a - b))
        .sum()
}

/// `σ² (1 + √5 r + 5/3 r²) exp(−√5 r)`.
pub fn matern52(amplitude: f64, r: f64) -> f64 {
    amplitude * (1.0 + SQRT5 * r + 5.0 / 3.0 * r * r) * (-SQRT5 * r).exp()
}

/// `∂k/∂ln ℓ_j = c(r) · (x_j − y_j)² / ℓ_j²` with `c(r) = σ² · 5/3 · (1 + √5 r) exp(−√5 r)`.
/// (From `∂k/∂r = −σ² · 5/3 · r (1 + √5 r) e^{−√5 r}` and `∂r/∂ln ℓ_j = −(x_j − y_j)² / (ℓ_j² r)`.)
pub fn length_scale_factor(amplitude: f64, r: f64) -> f64 {
    amplitude * 5.0 / 3.0 * (1.0 + SQRT5 * r) * (-SQRT5 * r).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_matches_the_closed_form_and_is_one_at_zero_distance() {
        let h = Hyper::from_theta(&[2f64.ln(), 0.5f64.ln(), 0.25f64.ln(), -30.0]);
        assert!((h.k(&[0.3, 0.3], &[0.3, 0.3]) - 2.0).abs() < 1e-12);
        // r² = 0.1²/0.25 + 0.2²/0.0625 = 0.04 + 0.64
        let r = 0.68f64.sqrt();
        let expected = 2.0 * (1.0 + 5f64.sqrt() * r + 5.0 / 3.0 * 0.68) * (-5f64.sqrt() * r).exp();
        assert!((h.k(&[0.1, 0.2], &[0.2, 0.4]) - expected).abs() < 1e-12);
    }

    #[test]
    fn length_scale_derivative_matches_finite_differences() {
        let (x, y) = ([0.1, 0.7, 0.3], [0.4, 0.2, 0.35]);
        let theta = [0.3, -0.5, 0.2, -1.0, -5.0];
        let h = Hyper::from_theta(&theta);
        let r = scaled_r2(&h.inv_ls2, &x, &y).sqrt();
        for j in 0..3 {
            let analytic =
                length_scale_factor(h.amplitude, r) * (x[j] - y[j]).powi(2) * h.inv_ls2[j];
            let eps = 1e-6;
            let mut tp = theta;
            tp[1 + j] += eps;
            let mut tm = theta;
            tm[1 + j] -= eps;
            let numeric =
                (Hyper::from_theta(&tp).k(&x, &y) - Hyper::from_theta(&tm).k(&x, &y)) / (2.0 * eps);
            assert!(
                (analytic - numeric).abs() < 1e-7,
                "{j}: {analytic} vs {numeric}"
            );
        }
    }
}
