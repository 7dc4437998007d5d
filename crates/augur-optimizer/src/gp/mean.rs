//! A parametric prior mean (a *trend*) for the GP, so that away from the data its mean
//! reverts to a fitted bowl instead of the data average.

use nalgebra::{DMatrix, DVector};

/// Which basis functions the trend has.
///
/// Model (Rasmussen & Williams 2006, §2.7, "explicit basis functions"):
/// `f(x) = h(x)ᵀβ + g(x)`, `g ~ GP(0, k)`, `β ~ N(0, τ² I)`, with the basis over the
/// numeric features `u_j = x_j − ½` (the unit cube's centre)
/// `h(x) = [1, √12 u_1, …, √12 u_D, √180 (u_1² − 1/12), …, √180 (u_D² − 1/12)]` (constant,
/// linear, quadratic: one curvature per feature, no cross terms). Each column has mean 0 and
/// variance 1 over the unit interval (`E u² = 1/12`, `Var u² = 1/180`), so the intercept
/// stays the average level and one prior sd `τ` means the same for every column. Given `y` at `X` (`H` the n × p basis matrix,
/// `K` the noisy kernel matrix) the posterior mean of `β` is the generalized least-squares
/// estimate with the prior as a ridge (R&W eq. 2.41 with `b = 0`, `B = τ² I`):
/// `β̄ = (τ⁻² I + Hᵀ K⁻¹ H)⁻¹ Hᵀ K⁻¹ y`, and the predictive mean is
/// `μ(x) = h(x)ᵀβ̄ + k(x, X) K⁻¹ (y − Hβ̄)`. Points that the kernel correlates (a cluster of
/// late trials around the incumbent) weigh as about one observation, so the trend follows
/// the whole space rather than the last basin. The prior keeps `β` near zero unless the
/// data support it. The predictive variance ignores the uncertainty of `β` (a plug-in
/// trend; the acquisition's σ is the kernel's alone).
///
/// With `concave`, a curvature that would bend the trend *up* towards the box's faces
/// (targets are larger-is-better) is dropped and the rest refitted, so the trend never
/// sends candidates to the corners on its own: a bowl or nothing, per feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrendBasis {
    /// `h(x) = [1]`: a learned constant mean.
    Constant,
    /// `[1, u_1, …, u_D]`.
    Linear,
    /// `[1, u, u² − 1/12]` per numeric feature.
    Quadratic,
}

/// How a trend is fitted: its basis, the prior sd `τ` of every coefficient (on
/// standardized targets) and whether up-bending curvatures are dropped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrendSpec {
    pub basis: TrendBasis,
    pub prior_sd: f64,
    pub concave: bool,
    /// `Some((τ_lo, τ_hi))`: in a fit under a kernel (a whitening given), `τ` is chosen on
    /// a log grid over `[τ_lo, τ_hi]` by the evidence of the targets (empirical Bayes, see
    /// [`Trend::fit`]) instead of fixed at `prior_sd`; the ridge fit without a kernel keeps
    /// `prior_sd`. Off by default: on the quality bench (seeds 0–9, 44 cells, 35 met with
    /// τ = 0.3) τ in [0.1, 1] met 34 and in [0.03, 0.3] 31 (benches/quality/HISTORY.md,
    /// opt-21).
    pub select: Option<(f64, f64)>,
}

/// Points of the log grid over which `τ` is chosen (see [`TrendSpec::select`]).
const SELECT_GRID: usize = 9;

/// A fitted trend `h(x)ᵀβ`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trend {
    basis: TrendBasis,
    /// The numeric features' indices (categorical features have no trend).
    numeric: Vec<usize>,
    /// `β`, laid out as [`Trend::basis_row`]'s columns (dropped curvatures are 0).
    coef: Vec<f64>,
}

/// Mean of `u²` for `u` uniform on `[−½, ½]`.
const CENTRED_SQUARE: f64 = 1.0 / 12.0;
/// `1/sd(u)` and `1/sd(u²)` for `u` uniform on `[−½, ½]`: `√12` and `√180`.
const LINEAR_SCALE: f64 = 3.464_101_615_137_754_6;
const SQUARE_SCALE: f64 = 13.416_407_864_998_739;

impl Trend {
    /// A trend of `basis` over the features that are not `categorical` (empty: all
    /// numeric) of `dim`-feature points, with all coefficients 0.
    fn zero(basis: TrendBasis, dim: usize, categorical: &[bool]) -> Self {
        let numeric: Vec<usize> = (0..dim)
            .filter(|&j| !categorical.get(j).copied().unwrap_or(false))
            .collect();
        let p = Self::width(basis, numeric.len());
        Trend {
            basis,
            numeric,
            coef: vec![0.0; p],
        }
    }

    fn width(basis: TrendBasis, numeric: usize) -> usize {
        match basis {
            TrendBasis::Constant => 1,
            TrendBasis::Linear => 1 + numeric,
            TrendBasis::Quadratic => 1 + 2 * numeric,
        }
    }

    /// `h(x)`.
    fn basis_row(&self, x: &[f64]) -> Vec<f64> {
        let mut row = Vec::with_capacity(self.coef.len());
        row.push(1.0);
        if self.basis != TrendBasis::Constant {
            row.extend(self.numeric.iter().map(|&j| LINEAR_SCALE * (x[j] - 0.5)));
        }
        if self.basis == TrendBasis::Quadratic {
            row.extend(
                self.numeric
                    .iter()
                    .map(|&j| SQUARE_SCALE * ((x[j] - 0.5).powi(2) - CENTRED_SQUARE)),
            );
        }
        row
    }

    /// `h(x)ᵀβ`.
    pub fn value(&self, x: &[f64]) -> f64 {
        self.basis_row(x)
            .iter()
            .zip(&self.coef)
            .map(|(h, b)| h * b)
            .sum()
    }

    /// `∇_x h(x)ᵀβ`: `√12 b_j + 2 √180 q_j u_j` per numeric feature, 0 for categorical
    /// ones.
    pub fn gradient(&self, x: &[f64]) -> Vec<f64> {
        let mut g = vec![0.0; x.len()];
        let m = self.numeric.len();
        if self.basis == TrendBasis::Constant {
            return g;
        }
        for (i, &j) in self.numeric.iter().enumerate() {
            g[j] = LINEAR_SCALE * self.coef[1 + i];
            if self.basis == TrendBasis::Quadratic {
                g[j] += 2.0 * SQUARE_SCALE * self.coef[1 + m + i] * (x[j] - 0.5);
            }
        }
        g
    }

    /// The coefficients `β` (intercept, linear terms, curvatures).
    pub fn coefficients(&self) -> &[f64] {
        &self.coef
    }

    /// The basis matrix `H` (n × p) of `points`.
    fn design(&self, points: &[Vec<f64>]) -> DMatrix<f64> {
        let p = self.coef.len();
        let mut h = DMatrix::zeros(points.len(), p);
        for (r, x) in points.iter().enumerate() {
            for (c, v) in self.basis_row(x).into_iter().enumerate() {
                h[(r, c)] = v;
            }
        }
        h
    }

    /// Fit `β` given a whitening `W` of the residual covariance (`W = L⁻¹` for `K = LLᵀ`;
    /// `None`: white noise of variance 1, i.e. ridge regression):
    /// `β̄ = (τ⁻² I + (WH)ᵀ(WH))⁻¹ (WH)ᵀ(Wy)`. Curvatures dropped by `spec.concave` stay 0.
    /// A non-finite or singular system leaves the trend at zero.
    ///
    /// With [`TrendSpec::select`] and a whitening, `τ` is the grid point that maximizes the
    /// evidence of `y` with `β` integrated out, `y ~ N(0, K + τ² H Hᵀ)` over the columns
    /// kept (R&W 2006, eq. 2.43). With `A = τ⁻² I + G`, `G = (WH)ᵀ(WH)`, `b = (WH)ᵀ(Wy)`,
    /// Woodbury's identity and the determinant lemma give, up to terms free of `τ`,
    /// `ln p(y | τ) = ½ bᵀA⁻¹b − ½ ln|A| − p ln τ` (p columns kept): a trend the data do not
    /// support is shrunk, one they do is let loose.
    pub fn fit(
        spec: TrendSpec,
        x: &[Vec<f64>],
        y: &DVector<f64>,
        categorical: &[bool],
        whitening: Option<&DMatrix<f64>>,
    ) -> Self {
        let dim = x.first().map_or(categorical.len(), Vec::len);
        let trend = Self::zero(spec.basis, dim, categorical);
        if x.is_empty() || !(spec.prior_sd.is_finite() && spec.prior_sd > 0.0) {
            return trend;
        }
        let h = trend.design(x);
        let (hw, yw) = match whitening {
            Some(w) => (w * &h, w * y),
            None => (h, y.clone()),
        };
        let gram = hw.tr_mul(&hw);
        let rhs = hw.tr_mul(&yw);
        let grid: Vec<f64> = match spec.select {
            Some((lo, hi))
                if whitening.is_some() && lo.is_finite() && lo > 0.0 && hi.is_finite() =>
            {
                let hi = hi.max(lo);
                (0..SELECT_GRID)
                    .map(|i| lo * (hi / lo).powf(i as f64 / (SELECT_GRID - 1) as f64))
                    .collect()
            }
            _ => vec![spec.prior_sd],
        };
        let mut best: Option<(f64, Trend)> = None;
        for tau in grid {
            let Some((t, evidence)) = trend.solve(spec, tau, &gram, &rhs) else {
                continue;
            };
            // Ties keep the smaller τ (the grid ascends).
            if best.as_ref().is_none_or(|(e, _)| evidence > *e) {
                best = Some((evidence, t));
            }
        }
        best.map_or(trend, |(_, t)| t)
    }

    /// The trend fitted with prior sd `tau` from the Gram matrix `G` and `b` (see
    /// [`Trend::fit`]), dropping up-bending curvatures if `spec.concave`, and the log
    /// evidence of that fit up to terms free of `τ` (`None`: singular or non-finite).
    fn solve(
        &self,
        spec: TrendSpec,
        tau: f64,
        gram: &DMatrix<f64>,
        rhs: &DVector<f64>,
    ) -> Option<(Trend, f64)> {
        let mut trend = self.clone();
        let p = trend.coef.len();
        let m = trend.numeric.len();
        // Columns in the fit; a dropped curvature leaves its column out.
        let mut active: Vec<bool> = vec![true; p];
        let ridge = 1.0 / (tau * tau);
        // Each pass drops at least one curvature, so at most m + 1 passes.
        for _ in 0..=m {
            let cols: Vec<usize> = (0..p).filter(|&c| active[c]).collect();
            let a = DMatrix::from_fn(cols.len(), cols.len(), |r, c| {
                gram[(cols[r], cols[c])] + if r == c { ridge } else { 0.0 }
            });
            let b = DVector::from_fn(cols.len(), |r, _| rhs[cols[r]]);
            let chol = a.cholesky()?;
            let beta = chol.solve(&b);
            if beta.iter().any(|v| !v.is_finite()) {
                return None;
            }
            trend.coef = vec![0.0; p];
            for (r, &c) in cols.iter().enumerate() {
                trend.coef[c] = beta[r];
            }
            let up: Vec<usize> = (1 + m..p).filter(|&c| trend.coef[c] > 0.0).collect();
            if !(spec.concave && spec.basis == TrendBasis::Quadratic) || up.is_empty() {
                let half_log_det: f64 = chol.l_dirty().diagonal().iter().map(|v| v.ln()).sum();
                let evidence = 0.5 * b.dot(&beta) - half_log_det - cols.len() as f64 * tau.ln();
                return evidence.is_finite().then_some((trend, evidence));
            }
            for c in up {
                active[c] = false;
            }
        }
        None
    }

    /// `h(x)ᵀβ` at every point.
    pub fn values(&self, points: &[Vec<f64>]) -> DVector<f64> {
        DVector::from_iterator(points.len(), points.iter().map(|p| self.value(p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    fn uniform(n: usize, d: usize, seed: u64) -> Vec<Vec<f64>> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| (0..d).map(|_| rng.random::<f64>()).collect())
            .collect()
    }

    fn quadratic(tight: f64) -> TrendSpec {
        TrendSpec {
            basis: TrendBasis::Quadratic,
            prior_sd: tight,
            concave: true,
            select: None,
        }
    }

    /// The bowl `2 − Σ_j a_j (x_j − c_j)²`, expanded in the trend's basis.
    fn bowl(x: &[f64]) -> f64 {
        let (a, c) = ([3.0, 1.0, 0.5], [0.3, 0.5, 0.8]);
        2.0 - (0..3).map(|j| a[j] * (x[j] - c[j]).powi(2)).sum::<f64>()
    }

    #[test]
    fn ridge_fit_recovers_a_known_bowl() {
        let x = uniform(60, 3, 1);
        let y = DVector::from_iterator(x.len(), x.iter().map(|p| bowl(p)));
        let t = Trend::fit(quadratic(100.0), &x, &y, &[], None);
        for p in uniform(20, 3, 2) {
            assert!((t.value(&p) - bowl(&p)).abs() < 1e-3, "{p:?}");
        }
        // Curvatures are −a_j/√180; the linear terms 2 a_j (c_j − ½)/√12.
        let q = &t.coefficients()[4..7];
        assert!((q[0] * SQUARE_SCALE + 3.0).abs() < 1e-3, "{q:?}");
        assert!((q[1] * SQUARE_SCALE + 1.0).abs() < 1e-3, "{q:?}");
        let b = &t.coefficients()[1..4];
        assert!(
            (b[0] * LINEAR_SCALE - 2.0 * 3.0 * (0.3 - 0.5)).abs() < 1e-3,
            "{b:?}"
        );
    }

    #[test]
    fn the_prior_keeps_the_trend_near_zero_without_a_bowl_in_the_data() {
        // Pure noise around 0: a tight prior leaves every coefficient small.
        let x = uniform(30, 4, 3);
        let mut rng = StdRng::seed_from_u64(4);
        let y = DVector::from_iterator(x.len(), (0..x.len()).map(|_| rng.random::<f64>() - 0.5));
        let t = Trend::fit(quadratic(0.3), &x, &y, &[], None);
        assert!(t.coefficients().iter().all(|c| c.abs() < 0.3), "{t:?}");
        let loose = Trend::fit(quadratic(100.0), &x, &y, &[], None);
        let size = |t: &Trend| t.coefficients().iter().map(|c| c * c).sum::<f64>();
        assert!(size(&t) < size(&loose));
    }

    #[test]
    fn concave_fit_drops_an_upward_curvature() {
        // A saddle: down along x₀, up along x₁. The up-bending curvature is dropped.
        let x = uniform(50, 2, 5);
        let f = |p: &[f64]| -2.0 * (p[0] - 0.4).powi(2) + 2.0 * (p[1] - 0.5).powi(2);
        let y = DVector::from_iterator(x.len(), x.iter().map(|p| f(p)));
        let t = Trend::fit(quadratic(100.0), &x, &y, &[], None);
        let q = &t.coefficients()[3..5];
        assert!((q[0] * SQUARE_SCALE + 2.0).abs() < 0.3, "{q:?}");
        assert_eq!(q[1], 0.0);
        let free = Trend::fit(
            TrendSpec {
                concave: false,
                ..quadratic(100.0)
            },
            &x,
            &y,
            &[],
            None,
        );
        assert!((free.coefficients()[4] * SQUARE_SCALE - 2.0).abs() < 1e-3);
    }

    #[test]
    fn trend_gradient_matches_finite_differences() {
        let x = uniform(40, 3, 6);
        let y = DVector::from_iterator(x.len(), x.iter().map(|p| bowl(p) + p[1]));
        let t = Trend::fit(quadratic(10.0), &x, &y, &[false, true, false], None);
        for p in uniform(5, 3, 7) {
            let g = t.gradient(&p);
            assert_eq!(g[1], 0.0, "categorical features have no trend");
            for j in 0..3 {
                let e = 1e-6;
                let (mut a, mut b) = (p.clone(), p.clone());
                a[j] += e;
                b[j] -= e;
                let fd = (t.value(&a) - t.value(&b)) / (2.0 * e);
                assert!((g[j] - fd).abs() < 1e-6, "{j}: {} vs {fd}", g[j]);
            }
        }
    }

    #[test]
    fn evidence_matches_the_direct_gaussian_density_up_to_a_constant() {
        // ln N(y; 0, I + τ² H Hᵀ) computed directly against `solve`'s evidence: the two
        // differ by a constant free of τ.
        let x = uniform(25, 2, 9);
        let y = DVector::from_iterator(x.len(), x.iter().map(|p| bowl(&[p[0], p[1], 0.5])));
        let spec = TrendSpec {
            concave: false,
            ..quadratic(1.0)
        };
        let t = Trend::zero(TrendBasis::Quadratic, 2, &[]);
        let h = t.design(&x);
        let (gram, rhs) = (h.tr_mul(&h), h.tr_mul(&y));
        let direct = |tau: f64| {
            let c = DMatrix::identity(x.len(), x.len()) + &h * h.transpose() * (tau * tau);
            let ch = c.cholesky().expect("pd");
            let log_det: f64 = 2.0 * ch.l_dirty().diagonal().iter().map(|v| v.ln()).sum::<f64>();
            -0.5 * y.dot(&ch.solve(&y)) - 0.5 * log_det
        };
        let ours = |tau: f64| t.solve(spec, tau, &gram, &rhs).expect("fit").1;
        let offset = direct(0.3) - ours(0.3);
        for tau in [0.05, 1.0, 4.0] {
            assert!((direct(tau) - ours(tau) - offset).abs() < 1e-8, "τ = {tau}");
        }
    }

    #[test]
    fn evidence_selection_loosens_a_clear_bowl_and_shrinks_noise() {
        // Whitening by the identity (unit white noise): a large bowl gets the loosest prior
        // in the range, pure noise the tightest; without a whitening (the ridge fit) the
        // fixed prior sd is kept.
        let select = TrendSpec {
            select: Some((0.03, 3.0)),
            ..quadratic(0.3)
        };
        let x = uniform(40, 3, 10);
        let eye = DMatrix::identity(x.len(), x.len());
        let mut rng = StdRng::seed_from_u64(11);
        let noise: Vec<f64> = (0..x.len()).map(|_| rng.random::<f64>() - 0.5).collect();
        let big = DVector::from_iterator(
            x.len(),
            x.iter().zip(&noise).map(|(p, e)| 20.0 * bowl(p) + e),
        );
        let chosen = Trend::fit(select, &x, &big, &[], Some(&eye));
        let loosest = Trend::fit(quadratic(3.0), &x, &big, &[], Some(&eye));
        assert_eq!(chosen, loosest);
        let pure = DVector::from_vec(noise);
        let chosen = Trend::fit(select, &x, &pure, &[], Some(&eye));
        let tightest = Trend::fit(quadratic(0.03), &x, &pure, &[], Some(&eye));
        assert_eq!(chosen, tightest);
        assert_eq!(
            Trend::fit(select, &x, &pure, &[], None),
            Trend::fit(quadratic(0.3), &x, &pure, &[], None)
        );
    }

    #[test]
    fn constant_trend_is_the_shrunk_average() {
        let x = uniform(10, 2, 8);
        let y = DVector::from_element(10, 2.0);
        let t = Trend::fit(
            TrendSpec {
                basis: TrendBasis::Constant,
                prior_sd: 1.0,
                concave: false,
                select: None,
            },
            &x,
            &y,
            &[],
            None,
        );
        // (1/τ² + n)⁻¹ Σ y = 20/11.
        assert!((t.coefficients()[0] - 20.0 / 11.0).abs() < 1e-12);
        assert_eq!(t.gradient(&x[0]), vec![0.0, 0.0]);
    }
}
