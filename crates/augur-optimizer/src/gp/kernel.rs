//! The Matérn-5/2 kernel with automatic relevance determination (one length scale per
//! feature), over mixed numeric and categorical features.

/// Smallest observation noise variance (on standardized outputs).
pub const NOISE_FLOOR: f64 = 1e-6;

const SQRT5: f64 = 2.236_067_977_499_79;

/// Kernel hyperparameters, decoded from `θ`.
///
/// `k(x, y) = σ² (1 + √5 r + 5/3 r²) exp(−√5 r)`, with `r² = Σ_j δ_j(x_j, y_j) / ℓ_j²`
/// (Rasmussen & Williams 2006, eq. 4.17), where `δ_j(a, b) = (a − b)²` for a numeric feature
/// and the Hamming term `δ_j(a, b) = 1[a ≠ b]` for a categorical feature (which holds a
/// category index). The Hamming term treats categories as categories: every pair of distinct
/// levels is equally far apart, with one learned length scale per categorical parameter
/// (as Optuna's `GPSampler` and the overlap kernels of Ru et al. 2020 do), instead of one
/// length scale per one-hot level. `exp(−r²)`-type kernels of the Hamming distance are
/// positive definite (it is a squared Euclidean distance of the one-hot embedding, up to a
/// factor 2), so the Matérn form stays valid.
///
/// Hyperparameters are kept on a log scale as one vector
/// `θ = [ln σ², ln ℓ_1, …, ln ℓ_D, ln σ_n²]`, where `σ_n²` is the observation noise (plus a
/// fixed floor, [`NOISE_FLOOR`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Hyper {
    /// Signal variance σ².
    pub amplitude: f64,
    /// `1 / ℓ_j²` per feature.
    pub inv_ls2: Vec<f64>,
    /// Observation noise variance σ_n² (including the floor).
    pub noise: f64,
    /// Per feature: whether it is categorical (Hamming term) rather than numeric. Empty
    /// means every feature is numeric.
    pub categorical: Vec<bool>,
}

impl Hyper {
    /// Decode `θ = [ln σ², ln ℓ_1..ln ℓ_D, ln σ_n²]` for numeric features only.
    pub fn from_theta(theta: &[f64]) -> Self {
        Self::from_theta_with(theta, &[])
    }

    /// Decode `θ` for features whose kinds `categorical` gives (empty: all numeric).
    pub fn from_theta_with(theta: &[f64], categorical: &[bool]) -> Self {
        let d = theta.len() - 2;
        Hyper {
            amplitude: theta[0].exp(),
            inv_ls2: theta[1..=d].iter().map(|l| (-2.0 * l).exp()).collect(),
            noise: NOISE_FLOOR + theta[d + 1].exp(),
            categorical: categorical.to_vec(),
        }
    }

    /// Whether feature `j` is categorical (features past the mask are numeric).
    pub fn is_categorical(&self, j: usize) -> bool {
        self.categorical.get(j).copied().unwrap_or(false)
    }

    /// `r² = Σ_j δ_j(x_j, y_j) / ℓ_j²`.
    pub fn r2(&self, x: &[f64], y: &[f64]) -> f64 {
        scaled_r2(&self.inv_ls2, &self.categorical, x, y)
    }

    /// `k(x, y)` without noise.
    pub fn k(&self, x: &[f64], y: &[f64]) -> f64 {
        matern52(self.amplitude, self.r2(x, y).sqrt())
    }
}

/// `δ(a, b)`: `(a − b)²` for a numeric feature, `1[a ≠ b]` for a categorical one.
#[inline]
pub fn feature_distance(categorical: bool, a: f64, b: f64) -> f64 {
    if categorical {
        if a == b { 0.0 } else { 1.0 }
    } else {
        (a - b) * (a - b)
    }
}

/// `r² = Σ_j δ_j(x_j, y_j) / ℓ_j²`; `categorical` empty means every feature is numeric.
pub fn scaled_r2(inv_ls2: &[f64], categorical: &[bool], x: &[f64], y: &[f64]) -> f64 {
    if categorical.is_empty() {
        return inv_ls2
            .iter()
            .zip(x.iter().zip(y))
            .map(|(w, (a, b))| w * (a - b) * (a - b))
            .sum();
    }
    inv_ls2
        .iter()
        .zip(categorical)
        .zip(x.iter().zip(y))
        .map(|((w, &c), (a, b))| w * feature_distance(c, *a, *b))
        .sum()
}

/// `σ² (1 + √5 r + 5/3 r²) exp(−√5 r)`.
pub fn matern52(amplitude: f64, r: f64) -> f64 {
    amplitude * (1.0 + SQRT5 * r + 5.0 / 3.0 * r * r) * (-SQRT5 * r).exp()
}

/// `∂k/∂ln ℓ_j = c(r) · δ_j(x_j, y_j) / ℓ_j²` with `c(r) = σ² · 5/3 · (1 + √5 r) exp(−√5 r)`.
/// (From `∂k/∂r = −σ² · 5/3 · r (1 + √5 r) e^{−√5 r}` and `∂r/∂ln ℓ_j = −δ_j / (ℓ_j² r)`;
/// the same for the Hamming term, whose `δ_j` does not depend on `ℓ_j`.)
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
        let r = h.r2(&x, &y).sqrt();
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

    #[test]
    fn hamming_term_counts_mismatched_categories_once_whatever_their_indices() {
        let theta = [0.0, 0.0, (0.5f64).ln(), -30.0];
        let h = Hyper::from_theta_with(&theta, &[false, true]);
        // Categories 0 vs 1 and 0 vs 2 are equally far: r² = 0.1² + 1/0.25.
        let a = h.k(&[0.2, 0.0], &[0.3, 1.0]);
        let b = h.k(&[0.2, 0.0], &[0.3, 2.0]);
        assert_eq!(a, b);
        let r = (0.01f64 + 4.0).sqrt();
        assert!((a - matern52(1.0, r)).abs() < 1e-12);
        // Same category: only the numeric feature counts.
        let same = h.k(&[0.2, 2.0], &[0.3, 2.0]);
        assert!((same - matern52(1.0, 0.1)).abs() < 1e-12);
    }

    #[test]
    fn categorical_length_scale_derivative_matches_finite_differences() {
        let (x, y) = ([0.1, 3.0, 0.3], [0.4, 1.0, 0.35]);
        let cat = [false, true, false];
        let theta = [0.3, -0.5, 0.2, -1.0, -5.0];
        let h = Hyper::from_theta_with(&theta, &cat);
        let r = h.r2(&x, &y).sqrt();
        for j in 0..3 {
            let analytic = length_scale_factor(h.amplitude, r)
                * feature_distance(cat[j], x[j], y[j])
                * h.inv_ls2[j];
            let eps = 1e-6;
            let mut tp = theta;
            tp[1 + j] += eps;
            let mut tm = theta;
            tm[1 + j] -= eps;
            let numeric = (Hyper::from_theta_with(&tp, &cat).k(&x, &y)
                - Hyper::from_theta_with(&tm, &cat).k(&x, &y))
                / (2.0 * eps);
            assert!(
                (analytic - numeric).abs() < 1e-7,
                "{j}: {analytic} vs {numeric}"
            );
        }
    }
}
