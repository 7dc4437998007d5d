//! A GP regression model: MAP hyperparameters and the posterior, zero-mean or with a
//! fitted trend as its prior mean ([`Posterior::with_trend`], see [`super::mean`]).

use std::cell::{Cell, RefCell};

use argmin::core::{CostFunction, Error, Executor, Gradient};
use argmin::solver::linesearch::BacktrackingLineSearch;
use argmin::solver::linesearch::condition::ArmijoCondition;
use argmin::solver::quasinewton::LBFGS;
use nalgebra::{Cholesky, DMatrix, DVector, Dyn};
use rand::{Rng, RngExt};

use super::kernel::{Hyper, feature_distance, length_scale_factor, matern52};
use super::mean::{Trend, TrendSpec};

const SQRT5: f64 = 2.236_067_977_499_79;

/// Prior means and standard deviations of `θ` (for standardized outputs on `[0, 1]^D`):
/// signal variance around 1, length scales around 0.5, noise around 1e-3, each within a
/// factor of e^σ.
const PRIOR_LN_AMPLITUDE: (f64, f64) = (0.0, 1.0);
const PRIOR_LN_LENGTH_SCALE: (f64, f64) = (-0.693, 1.0);
/// Categorical features (Hamming term, distance 1 between distinct levels): length scales
/// around 1, i.e. a correlation of about 0.5 between two levels of one parameter a priori.
const PRIOR_LN_CATEGORICAL_LENGTH_SCALE: (f64, f64) = (0.0, 1.0);
const PRIOR_LN_NOISE: (f64, f64) = (-6.9, 2.0);
/// Hard box for `θ`, enforced by a steep quadratic penalty outside it (argmin's L-BFGS is
/// unbounded).
const BOUNDS_AMPLITUDE: (f64, f64) = (-4.6, 4.6);
const BOUNDS_LENGTH_SCALE: (f64, f64) = (-4.6, 3.0);
const BOUNDS_NOISE: (f64, f64) = (-18.0, 0.0);

/// The default starting point of the hyperparameter search (the prior means);
/// `categorical` as in [`Hyper::categorical`].
pub fn default_theta(dim: usize, categorical: &[bool]) -> Vec<f64> {
    default_theta_with(dim, categorical, &Prior::default())
}

fn default_theta_with(dim: usize, categorical: &[bool], prior: &Prior) -> Vec<f64> {
    (0..dim + 2)
        .map(|j| prior.and_bounds(dim, categorical, j).0.0)
        .collect()
}

/// The normal priors (mean, sd) on the numeric features' `ln ℓ` and on `ln σ_n²`; the
/// amplitude's and the categorical length scales' are fixed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prior {
    pub ln_length_scale: (f64, f64),
    pub ln_noise: (f64, f64),
    /// Lower bound of the numeric `ln ℓ`.
    pub min_ln_length_scale: f64,
}

impl Default for Prior {
    fn default() -> Self {
        Prior {
            ln_length_scale: PRIOR_LN_LENGTH_SCALE,
            ln_noise: PRIOR_LN_NOISE,
            min_ln_length_scale: BOUNDS_LENGTH_SCALE.0,
        }
    }
}

impl Prior {
    /// The prior and the hard bounds of `θ_j`.
    fn and_bounds(&self, dim: usize, categorical: &[bool], j: usize) -> ((f64, f64), (f64, f64)) {
        if j == 0 {
            (PRIOR_LN_AMPLITUDE, BOUNDS_AMPLITUDE)
        } else if j == dim + 1 {
            (self.ln_noise, BOUNDS_NOISE)
        } else if categorical.get(j - 1).copied().unwrap_or(false) {
            (PRIOR_LN_CATEGORICAL_LENGTH_SCALE, BOUNDS_LENGTH_SCALE)
        } else {
            (
                self.ln_length_scale,
                (self.min_ln_length_scale, BOUNDS_LENGTH_SCALE.1),
            )
        }
    }
}

/// `K_f` (noise-free kernel matrix) of `x`.
fn kernel_matrix(h: &Hyper, x: &[Vec<f64>]) -> DMatrix<f64> {
    let n = x.len();
    let mut k = DMatrix::zeros(n, n);
    for a in 0..n {
        k[(a, a)] = h.amplitude;
        for b in 0..a {
            let v = h.k(&x[a], &x[b]);
            k[(a, b)] = v;
            k[(b, a)] = v;
        }
    }
    k
}

/// Cholesky of `K_f + noise·I`, adding jitter (growing tenfold, up to 1e-2 of the
/// amplitude) until it succeeds.
pub fn robust_cholesky(
    mut k: DMatrix<f64>,
    noise: f64,
    amplitude: f64,
) -> Option<Cholesky<f64, Dyn>> {
    let n = k.nrows();
    if !(noise.is_finite() && amplitude.is_finite() && amplitude > 0.0) {
        return None;
    }
    for i in 0..n {
        k[(i, i)] += noise;
    }
    if let Some(c) = k.clone().cholesky() {
        return Some(c);
    }
    // Jitter 1e-8, 1e-7, ..., 1e-2 times the amplitude.
    for e in 0..7 {
        let jitter = amplitude * 10f64.powi(e - 8);
        let mut kj = k.clone();
        for i in 0..n {
            kj[(i, i)] += jitter;
        }
        if let Some(c) = kj.cholesky() {
            return Some(c);
        }
    }
    None
}

/// `L⁻¹` of a lower-triangular `L` (only its lower triangle is read) by forward
/// substitution column by column: `X_jj = 1/L_jj`, `X_ij = −(Σ_{k=j}^{i−1} L_ik X_kj)/L_ii`,
/// n³/6 flops (nalgebra's general inverse does about six times as many).
///
/// Columns go four at a time: their substitutions are independent, so four running sums
/// hide each addition's latency (one sum at a time waits on the last). A column's sum runs
/// over `k` in the same order as alone, the block's earlier rows adding exact zeros, so
/// the result is the one-column-at-a-time result to the bit.
pub fn lower_triangular_inverse(l: &DMatrix<f64>) -> DMatrix<f64> {
    const BLOCK: usize = 4;
    let n = l.nrows();
    // Rows of L as contiguous slices (columns of Lᵀ, nalgebra being column-major).
    let lt = l.transpose();
    let mut x = DMatrix::zeros(n, n);
    // block[k][c] = X_k,(j0+c): rows of the block's columns, contiguous per row.
    let mut block = vec![[0.0f64; BLOCK]; n];
    for j0 in (0..n).step_by(BLOCK) {
        let width = BLOCK.min(n - j0);
        block[j0..].fill([0.0; BLOCK]);
        for i in j0..n {
            let row = &lt.as_slice()[i * n + j0..i * n + i];
            let mut sums = [0.0f64; BLOCK];
            for (r, xk) in row.iter().zip(&block[j0..i]) {
                for c in 0..BLOCK {
                    sums[c] += r * xk[c];
                }
            }
            let lii = l[(i, i)];
            for c in 0..width {
                let j = j0 + c;
                block[i][c] = match i.cmp(&j) {
                    std::cmp::Ordering::Less => 0.0,
                    std::cmp::Ordering::Equal => 1.0 / lii,
                    std::cmp::Ordering::Greater => -sums[c] / lii,
                };
            }
        }
        for c in 0..width {
            for i in j0..n {
                x[(i, j0 + c)] = block[i][c];
            }
        }
    }
    x
}

/// Negative log posterior of `θ` (up to a constant) and its gradient; `categorical` as in
/// [`Hyper::categorical`].
///
/// The log marginal likelihood (Rasmussen & Williams 2006, eq. 5.8) on standardized outputs
/// `y` with `K = K_f + σ_n² I`:
/// `−ln p(y|θ) = ½ yᵀK⁻¹y + ½ ln|K| + n/2 ln 2π`, and its gradient (eq. 5.9)
/// `∂/∂θ_j = −½ tr((ααᵀ − K⁻¹) ∂K/∂θ_j)` with `α = K⁻¹y`.
/// We minimize it plus weak normal priors on `θ` (log-normal priors on the hyperparameters)
/// with L-BFGS (argmin) from several starts.
pub fn neg_log_posterior(
    x: &[Vec<f64>],
    y: &DVector<f64>,
    categorical: &[bool],
    theta: &[f64],
) -> Option<(f64, Vec<f64>)> {
    neg_log_posterior_with(x, y, categorical, theta, &Prior::default())
}

/// [`neg_log_posterior`] under `prior`.
fn neg_log_posterior_with(
    x: &[Vec<f64>],
    y: &DVector<f64>,
    categorical: &[bool],
    theta: &[f64],
    prior: &Prior,
) -> Option<(f64, Vec<f64>)> {
    let n = x.len();
    // Far outside the box the line search may probe: not a usable point.
    if theta.iter().any(|t| !t.is_finite() || t.abs() > 40.0) {
        return None;
    }
    let h = Hyper::from_theta_with(theta, categorical);
    let (kf, ls_factor) = kernel_with_length_scale_factor(x, &h);
    let chol = robust_cholesky(kf.clone(), h.noise, h.amplitude)?;
    let alpha = chol.solve(y);
    let log_det: f64 = 2.0
        * chol
            .l_dirty()
            .diagonal()
            .iter()
            .map(|v| v.ln())
            .sum::<f64>();
    let mut cost =
        0.5 * y.dot(&alpha) + 0.5 * log_det + 0.5 * n as f64 * (2.0 * std::f64::consts::PI).ln();
    // W = K⁻¹ − ααᵀ, so that ∂cost/∂θ_j = ½ Σ_ab W_ab ∂K_ab/∂θ_j.
    let l_inv = lower_triangular_inverse(chol.l_dirty());
    let mut w = l_inv.transpose() * &l_inv;
    w.ger(-1.0, &alpha, &alpha, 1.0);
    let mut grad = likelihood_gradient(x, categorical, &h, (&kf, &ls_factor), &w);
    add_prior_terms(theta, categorical, prior, &mut cost, &mut grad);
    (cost.is_finite() && grad.iter().all(|g| g.is_finite())).then_some((cost, grad))
}

/// `K_f` (noise-free Matérn-5/2) at `x` and, per pair below the diagonal, the factor
/// `c(r)` of `∂K/∂ln ℓ_j` (one exp per pair for both).
fn kernel_with_length_scale_factor(x: &[Vec<f64>], h: &Hyper) -> (DMatrix<f64>, DMatrix<f64>) {
    let n = x.len();
    let mut kf = DMatrix::zeros(n, n);
    let mut ls_factor = DMatrix::zeros(n, n);
    for a in 0..n {
        kf[(a, a)] = h.amplitude;
        for b in 0..a {
            let r = h.r2(&x[a], &x[b]).sqrt();
            let e = h.amplitude * (-SQRT5 * r).exp();
            let k = e * (1.0 + SQRT5 * r + 5.0 / 3.0 * r * r);
            kf[(a, b)] = k;
            kf[(b, a)] = k;
            ls_factor[(a, b)] = e * 5.0 / 3.0 * (1.0 + SQRT5 * r);
        }
    }
    (kf, ls_factor)
}

/// The negative log likelihood's gradient in `θ = (ln σ², ln ℓ, ln σ_n²)`:
/// `∂cost/∂θ_j = ½ Σ_ab W_ab ∂K_ab/∂θ_j` with `W = K⁻¹ − ααᵀ`; `kf` and `ls_factor` as
/// [`kernel_with_length_scale_factor`] gives them.
fn likelihood_gradient(
    x: &[Vec<f64>],
    categorical: &[bool],
    h: &Hyper,
    (kf, ls_factor): (&DMatrix<f64>, &DMatrix<f64>),
    w: &DMatrix<f64>,
) -> Vec<f64> {
    let n = x.len();
    // One inverse squared length scale per feature: θ has dim + 2 entries.
    let dim = h.inv_ls2.len();
    let mut grad = vec![0.0; dim + 2];
    // The length scales' gradient, one sum per feature over the pairs. Without categorical
    // features the per-pair update is branch-free, so it runs as vector instructions across
    // the features (each feature's sum still in pair order: the same result).
    let mut ls_grad = vec![0.0; dim];
    let numeric_only = !categorical.contains(&true);
    let inv_ls2 = &h.inv_ls2[..dim];
    for a in 0..n {
        // Diagonal: ∂K_aa/∂ln σ² = σ², ∂K_aa/∂ln σ_n² = σ_n² − floor, length scales: 0.
        grad[0] += 0.5 * w[(a, a)] * h.amplitude;
        grad[dim + 1] += 0.5 * w[(a, a)] * (h.noise - super::kernel::NOISE_FLOOR);
        let xa = &x[a][..dim];
        for b in 0..a {
            let wab = w[(a, b)]; // counted twice (a, b) and (b, a)
            grad[0] += wab * kf[(a, b)];
            let c = wab * ls_factor[(a, b)];
            let xb = &x[b][..dim];
            if numeric_only {
                for (((g, &p), &q), &inv) in ls_grad.iter_mut().zip(xa).zip(xb).zip(inv_ls2) {
                    *g += c * ((p - q) * (p - q)) * inv;
                }
            } else {
                for (j, (((g, &p), &q), &inv)) in
                    ls_grad.iter_mut().zip(xa).zip(xb).zip(inv_ls2).enumerate()
                {
                    *g += c * feature_distance(h.is_categorical(j), p, q) * inv;
                }
            }
        }
    }
    grad[1..=dim].copy_from_slice(&ls_grad);
    grad
}

/// Adds the prior's terms to `cost` and `grad`, in the order of `θ`: the normal prior
/// `½((θ_j − μ_j)/s_j)²` and a steep quadratic wall `100 (θ_j − bound)²` outside the
/// bounds.
fn add_prior_terms(
    theta: &[f64],
    categorical: &[bool],
    prior: &Prior,
    cost: &mut f64,
    grad: &mut [f64],
) {
    let dim = theta.len() - 2;
    for (j, t) in theta.iter().enumerate() {
        let ((mu, sd), (lo, hi)) = prior.and_bounds(dim, categorical, j);
        *cost += 0.5 * ((t - mu) / sd).powi(2);
        grad[j] += (t - mu) / (sd * sd);
        let excess = if *t < lo {
            t - lo
        } else if *t > hi {
            t - hi
        } else {
            0.0
        };
        *cost += 100.0 * excess * excess;
        grad[j] += 200.0 * excess;
    }
}

/// A cost and its gradient.
type CostAndGradient = (f64, Vec<f64>);

/// The objective handed to argmin. It caches the last evaluation (L-BFGS asks for the cost
/// and the gradient of the same point one after the other), remembers the best point seen,
/// and gives up after `max_evals` evaluations: argmin's line searches have no iteration cap
/// of their own, and a suggestion's cost must stay bounded without a clock.
struct Objective<'a> {
    x: &'a [Vec<f64>],
    y: &'a DVector<f64>,
    categorical: &'a [bool],
    prior: Prior,
    cache: RefCell<Option<(Vec<f64>, Option<CostAndGradient>)>>,
    best: RefCell<(f64, Vec<f64>)>,
    evals: Cell<usize>,
    max_evals: usize,
}

impl Objective<'_> {
    fn eval(&self, theta: &DVector<f64>) -> Result<Option<(f64, Vec<f64>)>, Error> {
        let t: Vec<f64> = theta.iter().copied().collect();
        if let Some((ct, v)) = self.cache.borrow().as_ref()
            && *ct == t
        {
            return Ok(v.clone());
        }
        if self.evals.get() >= self.max_evals || crate::cancel::requested() {
            return Err(Error::msg("evaluation budget spent"));
        }
        self.evals.set(self.evals.get() + 1);
        let v = neg_log_posterior_with(self.x, self.y, self.categorical, &t, &self.prior);
        if let Some((c, _)) = &v
            && *c < self.best.borrow().0
        {
            *self.best.borrow_mut() = (*c, t.clone());
        }
        *self.cache.borrow_mut() = Some((t, v.clone()));
        Ok(v)
    }
}

/// argmin takes its problem by value; this borrows the objective so that its best point
/// survives a run that ends in an error.
struct ObjectiveRef<'a, 'b>(&'b Objective<'a>);

impl CostFunction for ObjectiveRef<'_, '_> {
    type Param = DVector<f64>;
    type Output = f64;
    fn cost(&self, p: &Self::Param) -> Result<f64, Error> {
        // A failed factorization is a very bad point, not an error: the line search backs off.
        Ok(self.0.eval(p)?.map_or(1e30, |(c, _)| c))
    }
}

impl Gradient for ObjectiveRef<'_, '_> {
    type Param = DVector<f64>;
    type Gradient = DVector<f64>;
    fn gradient(&self, p: &Self::Param) -> Result<DVector<f64>, Error> {
        match self.0.eval(p)? {
            Some((_, g)) => Ok(DVector::from_vec(g)),
            None => Err(Error::msg("kernel matrix is not positive definite")),
        }
    }
}

/// Fitting effort.
#[derive(Debug, Clone, Copy)]
pub struct FitOptions {
    /// Random starts (around the prior mean) besides the given ones.
    pub random_starts: usize,
    /// L-BFGS runs, from the best starting points.
    pub runs: usize,
    pub max_iters: u64,
    pub prior: Prior,
}

/// MAP hyperparameters for `(x, y)`: L-BFGS from the best of `starts` plus random draws
/// from the prior. Returns the best `θ` found (a start if every run fails).
pub fn fit_theta(
    x: &[Vec<f64>],
    y: &DVector<f64>,
    categorical: &[bool],
    starts: &[Vec<f64>],
    options: FitOptions,
    rng: &mut impl Rng,
) -> Vec<f64> {
    fit(x, y, categorical, starts, options, rng).0
}

/// [`fit_theta`], also returning the negative log posterior at the returned `θ` (infinite
/// if it could not be evaluated), to compare fits of the same data.
pub fn fit(
    x: &[Vec<f64>],
    y: &DVector<f64>,
    categorical: &[bool],
    starts: &[Vec<f64>],
    options: FitOptions,
    rng: &mut impl Rng,
) -> (Vec<f64>, f64) {
    let dim = x.first().map_or(categorical.len(), Vec::len);
    let mut candidates: Vec<Vec<f64>> = starts
        .iter()
        .filter(|s| s.len() == dim + 2 && s.iter().all(|v| v.is_finite()))
        .cloned()
        .collect();
    let prior = options.prior;
    candidates.push(default_theta_with(dim, categorical, &prior));
    for _ in 0..options.random_starts {
        let t: Vec<f64> = (0..dim + 2)
            .map(|j| {
                let ((mu, sd), (lo, hi)) = prior.and_bounds(dim, categorical, j);
                // A uniform draw over ±1.5 prior sd: crude, but bounded and cheap.
                (mu + sd * 1.5 * (2.0 * rng.random::<f64>() - 1.0)).clamp(lo, hi)
            })
            .collect();
        candidates.push(t);
    }
    let mut scored: Vec<(f64, Vec<f64>)> = candidates
        .into_iter()
        .map(|t| {
            (
                neg_log_posterior_with(x, y, categorical, &t, &prior)
                    .map_or(f64::INFINITY, |v| v.0),
                t,
            )
        })
        .collect();
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best = scored[0].clone();
    for (cost, start) in scored.iter().take(options.runs.max(1)) {
        let objective = Objective {
            x,
            y,
            categorical,
            prior,
            cache: RefCell::new(None),
            best: RefCell::new((*cost, start.clone())),
            evals: Cell::new(0),
            max_evals: 3 * options.max_iters as usize + 10,
        };
        let Ok(condition) = ArmijoCondition::new(1e-4) else {
            continue;
        };
        let linesearch = BacktrackingLineSearch::new(condition);
        let Ok(solver) = LBFGS::new(linesearch, 7).with_tolerance_grad(1e-5) else {
            continue;
        };
        // Errors (budget spent, a failed factorization) end the run; its best point stands.
        let _ = Executor::new(ObjectiveRef(&objective), solver)
            .configure(|s| {
                s.param(DVector::from_vec(start.clone()))
                    .max_iters(options.max_iters)
            })
            .run();
        let (c, t) = objective.best.into_inner();
        if c < best.0 {
            best = (c, t);
        }
    }
    (best.1, best.0)
}

/// A fitted posterior over a set of points. With `alpha` it predicts means; without (a
/// covariance-only posterior including pending points) only variances.
pub struct Posterior {
    pub hyper: Hyper,
    x: Vec<Vec<f64>>,
    /// `L⁻¹` for `K = LLᵀ`: predicting many points is then one matrix product instead of
    /// one triangular solve per point.
    l_inv: DMatrix<f64>,
    alpha: Option<DVector<f64>>,
    /// The outputs conditioned on (for the leave-one-out means).
    y: Option<DVector<f64>>,
    /// The prior mean (`None`: zero) and its values at `x`; `alpha` is then `K⁻¹(y − m(X))`.
    trend: Option<(Trend, DVector<f64>)>,
}

impl Posterior {
    /// Condition on `x` with outputs `y` (`None`: covariance only).
    pub fn new(hyper: Hyper, x: Vec<Vec<f64>>, y: Option<&DVector<f64>>) -> Option<Self> {
        let chol = robust_cholesky(kernel_matrix(&hyper, &x), hyper.noise, hyper.amplitude)?;
        let alpha = y.map(|y| chol.solve(y));
        let l_inv = lower_triangular_inverse(chol.l_dirty());
        Some(Posterior {
            hyper,
            x,
            l_inv,
            alpha,
            y: y.cloned(),
            trend: None,
        })
    }

    /// Condition on `x` with outputs `y` under a prior mean fitted by `spec` (see
    /// [`super::mean`]): `β̄ = (τ⁻² I + (L⁻¹H)ᵀ(L⁻¹H))⁻¹ (L⁻¹H)ᵀ(L⁻¹y)` with this kernel's
    /// `L`, then `α = K⁻¹(y − Hβ̄)`. `categorical` marks the features without a trend.
    pub fn with_trend(
        hyper: Hyper,
        x: Vec<Vec<f64>>,
        y: &DVector<f64>,
        spec: TrendSpec,
        categorical: &[bool],
    ) -> Option<Self> {
        let plain = Posterior::new(hyper, x, None)?;
        let trend = Trend::fit(spec, &plain.x, y, categorical, Some(&plain.l_inv));
        let at_x = trend.values(&plain.x);
        let mut post = Posterior {
            trend: Some((trend, at_x)),
            ..plain
        };
        post.alpha = Some(post.solve_residual(y));
        post.y = Some(y.clone());
        Some(post)
    }

    /// `K⁻¹(y − m(X))` (m = 0 without a trend).
    /// `y` less the trend at the training points (`y` itself without a trend).
    fn residual(&self, y: &DVector<f64>) -> DVector<f64> {
        match &self.trend {
            Some((_, at_x)) => y - at_x,
            None => y.clone(),
        }
    }

    fn solve_residual(&self, y: &DVector<f64>) -> DVector<f64> {
        self.l_inv.tr_mul(&(&self.l_inv * self.residual(y)))
    }

    /// The prior mean's value at `point` (0 without a trend).
    fn trend_value(&self, point: &[f64]) -> f64 {
        self.trend.as_ref().map_or(0.0, |(t, _)| t.value(point))
    }

    /// The fitted prior mean, if any.
    pub fn trend(&self) -> Option<&Trend> {
        self.trend.as_ref().map(|(t, _)| t)
    }

    /// Log marginal likelihood of the outputs conditioned on (Rasmussen & Williams 2006,
    /// eq. 5.8): `−½ yᵀα − ½ ln|K| − n/2 ln 2π`, with `ln|K| = −2 Σ ln (L⁻¹)ᵢᵢ`. `None`
    /// for a covariance-only posterior.
    pub fn log_marginal_likelihood(&self) -> Option<f64> {
        let (alpha, y) = (self.alpha.as_ref()?, self.y.as_ref()?);
        let n = y.len() as f64;
        let half_log_det: f64 = -(0..y.len()).map(|i| self.l_inv[(i, i)].ln()).sum::<f64>();
        // With a trend, of the residual `y − m(X)` (the trend taken as known).
        Some(
            -0.5 * self.residual(y).dot(alpha)
                - half_log_det
                - 0.5 * n * (2.0 * std::f64::consts::PI).ln(),
        )
    }

    /// Leave-one-out log predictive probability of the outputs conditioned on
    /// (Rasmussen & Williams 2006, §5.4.2, eqs. 5.10–5.12): `Σᵢ ln p(yᵢ | y₋ᵢ)` with
    /// `p(yᵢ | y₋ᵢ) = N(μ₋ᵢ, σ²₋ᵢ)`, `σ²₋ᵢ = 1/[K⁻¹]ᵢᵢ` (noise included) and `μ₋ᵢ` as in
    /// [`Posterior::loo_means`]. `None` for a covariance-only posterior.
    pub fn loo_log_predictive(&self) -> Option<f64> {
        let alpha = self.alpha.as_ref()?;
        let n = alpha.len();
        Some(
            (0..n)
                .map(|i| {
                    let kinv_ii = self.l_inv.column(i).rows(i, n - i).norm_squared();
                    // yᵢ − μ₋ᵢ = αᵢ/[K⁻¹]ᵢᵢ.
                    let residual = alpha[i] / kinv_ii;
                    0.5 * kinv_ii.ln()
                        - 0.5 * residual * residual * kinv_ii
                        - 0.5 * (2.0 * std::f64::consts::PI).ln()
                })
                .sum(),
        )
    }

    /// Leave-one-out predictive means of the outputs conditioned on, without refits
    /// (Rasmussen & Williams 2006, §5.4.2, eq. 5.12): with `α = K⁻¹y`,
    /// `μ₋ᵢ = yᵢ − αᵢ/[K⁻¹]ᵢᵢ`, the mean at `xᵢ` of the same GP (same hyperparameters, noise
    /// included) conditioned on every output but `yᵢ`. `[K⁻¹]ᵢᵢ` is the squared norm of
    /// column i of `L⁻¹` (`K⁻¹ = L⁻ᵀL⁻¹`), so this costs O(n²) on top of the factorization.
    /// `None` for a covariance-only posterior.
    pub fn loo_means(&self) -> Option<Vec<f64>> {
        let (alpha, y) = (self.alpha.as_ref()?, self.y.as_ref()?);
        Some(
            (0..y.len())
                .map(|i| {
                    // Column i of L⁻¹ is zero above the diagonal.
                    let kinv_ii = self.l_inv.column(i).rows(i, y.len() - i).norm_squared();
                    y[i] - alpha[i] / kinv_ii
                })
                .collect(),
        )
    }

    /// Posterior means (zeros for a covariance-only posterior) and variances of the latent
    /// function at `points`: `μ = k*ᵀα`, `σ² = k** − ‖L⁻¹k*‖²`.
    pub fn predict(&self, points: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
        let (n, m) = (self.x.len(), points.len());
        let mut ks = DMatrix::zeros(n, m);
        for (c, p) in points.iter().enumerate() {
            for (r, xi) in self.x.iter().enumerate() {
                ks[(r, c)] = matern52(self.hyper.amplitude, self.hyper.r2(xi, p).sqrt());
            }
        }
        let mean = match &self.alpha {
            Some(a) => (ks.transpose() * a)
                .iter()
                .zip(points)
                .map(|(v, p)| v + self.trend_value(p))
                .collect(),
            None => vec![0.0; m],
        };
        let v = &self.l_inv * &ks;
        let var = (0..m)
            .map(|c| (self.hyper.amplitude - v.column(c).norm_squared()).max(1e-12))
            .collect();
        (mean, var)
    }
}

impl Posterior {
    /// Mean and variance at one point, with their gradients with respect to the point's
    /// features (zero for categorical features, whose Hamming term has no gradient):
    /// `∇μ = Σ_i α_i ∇k_i`, `∇σ² = −2 Σ_i w_i ∇k_i` with `w = K⁻¹k* = L⁻ᵀ(L⁻¹k*)`, and for
    /// Matérn-5/2 `∂k_i/∂x_j = −c(r) (x_j − x_ij)/ℓ_j²`, `c(r)` as in
    /// [`length_scale_factor`] (smooth at r = 0). O(n² + n D) per point; the acquisition
    /// refinement calls it on a handful of points.
    pub fn predict_with_gradient(&self, point: &[f64]) -> MeanVarianceGradient {
        let n = self.x.len();
        let dim = point.len();
        let h = &self.hyper;
        let numeric = |j: usize| !h.is_categorical(j);
        let mut ks = DVector::zeros(n);
        // Row i: ∇_x k(x, x_i).
        let mut dk = DMatrix::zeros(n, dim);
        for (i, xi) in self.x.iter().enumerate() {
            let r = h.r2(xi, point).sqrt();
            ks[i] = matern52(h.amplitude, r);
            let c = length_scale_factor(h.amplitude, r);
            for j in (0..dim).filter(|&j| numeric(j)) {
                dk[(i, j)] = -c * (point[j] - xi[j]) * h.inv_ls2[j];
            }
        }
        let (mean, mean_grad) = match &self.alpha {
            Some(a) => {
                let mut grad: Vec<f64> = (dk.transpose() * a).iter().copied().collect();
                if let Some((t, _)) = &self.trend {
                    for (g, tg) in grad.iter_mut().zip(t.gradient(point)) {
                        *g += tg;
                    }
                }
                (ks.dot(a) + self.trend_value(point), grad)
            }
            None => (0.0, vec![0.0; dim]),
        };
        let v = &self.l_inv * &ks;
        let raw = h.amplitude - v.norm_squared();
        let (variance, variance_grad) = if raw > 1e-12 {
            let w = self.l_inv.tr_mul(&v);
            (raw, (dk.transpose() * w).iter().map(|g| -2.0 * g).collect())
        } else {
            // Clamped: flat, as the value returned.
            (1e-12, vec![0.0; dim])
        };
        MeanVarianceGradient {
            mean,
            variance,
            mean_grad,
            variance_grad,
        }
    }
}

impl Posterior {
    /// The points conditioned on.
    pub fn points(&self) -> &[Vec<f64>] {
        &self.x
    }

    /// The outputs conditioned on (`None` for a covariance-only posterior).
    pub fn outputs(&self) -> Option<&DVector<f64>> {
        self.y.as_ref()
    }

    /// The same points, kernel and trend (not refitted) conditioned on other outputs,
    /// reusing the factorization: `α = K⁻¹(y − m(X)) = L⁻ᵀ(L⁻¹(y − m(X)))`, O(n²).
    pub fn with_outputs(&self, y: &DVector<f64>) -> Posterior {
        Posterior {
            hyper: self.hyper.clone(),
            x: self.x.clone(),
            l_inv: self.l_inv.clone(),
            alpha: Some(self.solve_residual(y)),
            y: Some(y.clone()),
            trend: self.trend.clone(),
        }
    }

    /// Posterior means only (zeros for a covariance-only posterior): `μ = k*ᵀα`, O(n) per
    /// point instead of the variance's O(n²).
    pub fn predict_mean(&self, points: &[Vec<f64>]) -> Vec<f64> {
        let Some(alpha) = &self.alpha else {
            return vec![0.0; points.len()];
        };
        points
            .iter()
            .map(|p| {
                self.trend_value(p)
                    + self
                        .x
                        .iter()
                        .zip(alpha.iter())
                        .map(|(xi, a)| {
                            a * matern52(self.hyper.amplitude, self.hyper.r2(xi, p).sqrt())
                        })
                        .sum::<f64>()
            })
            .collect()
    }
}

/// [`Posterior::predict_with_gradient`]'s answer.
#[derive(Debug, Clone)]
pub struct MeanVarianceGradient {
    pub mean: f64,
    pub variance: f64,
    pub mean_grad: Vec<f64>,
    pub variance_grad: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{SeedableRng, rngs::StdRng};

    #[test]
    fn likelihood_gradient_matches_finite_differences() {
        let mut rng = StdRng::seed_from_u64(1);
        let x: Vec<Vec<f64>> = (0..12)
            .map(|_| (0..3).map(|_| rng.random::<f64>()).collect())
            .collect();
        let y = DVector::from_iterator(12, x.iter().map(|p| (5.0 * p[0]).sin() + p[1] * p[1]));
        // One length scale outside its bounds so the penalty's gradient is checked too.
        let theta = [0.2, -1.0, 3.5, -0.3, -4.0];
        let (_, grad) = neg_log_posterior(&x, &y, &[], &theta).expect("positive definite");
        for j in 0..theta.len() {
            let eps = 1e-5;
            let mut tp = theta;
            tp[j] += eps;
            let mut tm = theta;
            tm[j] -= eps;
            let fp = neg_log_posterior(&x, &y, &[], &tp).map_or(f64::NAN, |v| v.0);
            let fm = neg_log_posterior(&x, &y, &[], &tm).map_or(f64::NAN, |v| v.0);
            let numeric = (fp - fm) / (2.0 * eps);
            assert!(
                (grad[j] - numeric).abs() < 1e-4 * numeric.abs().max(1.0),
                "θ_{j}: {} vs {numeric}",
                grad[j]
            );
        }
    }

    #[test]
    fn triangular_inverse_inverts() {
        let m = DMatrix::from_row_slice(3, 3, &[4.0, 2.0, 0.6, 2.0, 5.0, 1.0, 0.6, 1.0, 3.0]);
        let chol = m.clone().cholesky().expect("positive definite");
        let x = lower_triangular_inverse(chol.l_dirty());
        let w = x.transpose() * &x * &m;
        assert!((w - DMatrix::identity(3, 3)).norm() < 1e-12);
    }

    #[test]
    fn blocked_triangular_inverse_equals_one_column_at_a_time_to_the_bit() {
        // The plain substitution, one column and one running sum at a time.
        fn one_column_at_a_time(l: &DMatrix<f64>) -> DMatrix<f64> {
            let n = l.nrows();
            let mut x = DMatrix::zeros(n, n);
            for j in 0..n {
                x[(j, j)] = 1.0 / l[(j, j)];
                for i in j + 1..n {
                    let mut s = 0.0;
                    for k in j..i {
                        s += l[(i, k)] * x[(k, j)];
                    }
                    x[(i, j)] = -s / l[(i, i)];
                }
            }
            x
        }
        let mut rng = StdRng::seed_from_u64(11);
        // Sizes around the block of 4 and a GP's (80 fit points); a kernel matrix of
        // random points, whose factor has every sign and scale a fit meets.
        for n in [1, 2, 3, 4, 5, 7, 8, 9, 80] {
            let x: Vec<Vec<f64>> = (0..n)
                .map(|_| (0..3).map(|_| rng.random::<f64>()).collect())
                .collect();
            let h = Hyper::from_theta_with(&[0.0, -1.0, -1.5, -0.5, -6.0], &[false; 3]);
            let k = DMatrix::from_fn(n, n, |a, b| h.k(&x[a], &x[b]))
                + DMatrix::identity(n, n) * h.noise;
            let chol = k.cholesky().expect("positive definite");
            let mut l = chol.l();
            // Garbage above the diagonal must not be read.
            for i in 0..n {
                for j in i + 1..n {
                    l[(i, j)] = f64::NAN;
                }
            }
            let blocked = lower_triangular_inverse(&l);
            let plain = one_column_at_a_time(&l);
            for (a, b) in blocked.iter().zip(plain.iter()) {
                assert_eq!(a.to_bits(), b.to_bits(), "n = {n}");
            }
        }
    }

    #[test]
    fn leave_one_out_means_and_densities_equal_explicit_refits_without_the_point() {
        let mut rng = StdRng::seed_from_u64(3);
        let x: Vec<Vec<f64>> = (0..15)
            .map(|_| (0..2).map(|_| rng.random::<f64>()).collect())
            .collect();
        let y = DVector::from_iterator(x.len(), x.iter().map(|p| (4.0 * p[0]).sin() + p[1] * p[1]));
        let h = Hyper::from_theta_with(&[0.2, -1.0, -0.5, -4.0], &[false, false]);
        let full = Posterior::new(h.clone(), x.clone(), Some(&y)).expect("factorizes");
        let loo = full.loo_means().expect("has outputs");
        let mut explicit_log_predictive = 0.0;
        for i in 0..x.len() {
            let keep: Vec<usize> = (0..x.len()).filter(|&j| j != i).collect();
            let xs: Vec<Vec<f64>> = keep.iter().map(|&j| x[j].clone()).collect();
            let ys = DVector::from_iterator(keep.len(), keep.iter().map(|&j| y[j]));
            let refit = Posterior::new(h.clone(), xs, Some(&ys)).expect("factorizes");
            let (mean, var) = refit.predict(std::slice::from_ref(&x[i]));
            // The predictive density of yᵢ (noise included) from the refit.
            let v = var[0] + h.noise;
            explicit_log_predictive +=
                -0.5 * (2.0 * std::f64::consts::PI * v).ln() - 0.5 * (y[i] - mean[0]).powi(2) / v;
            assert!(
                (loo[i] - mean[0]).abs() < 1e-8,
                "point {i}: closed form {} against refit {}",
                loo[i],
                mean[0]
            );
        }
        let closed_form = full.loo_log_predictive().expect("has outputs");
        assert!(
            (closed_form - explicit_log_predictive).abs() < 1e-6,
            "{closed_form} against {explicit_log_predictive}"
        );
        let covariance_only = Posterior::new(h.clone(), x.clone(), None).expect("factorizes");
        assert!(covariance_only.loo_means().is_none());
        assert!(covariance_only.loo_log_predictive().is_none());
        // The log marginal likelihood is the negative log posterior without its prior
        // terms: compare with a dense computation.
        let k = kernel_matrix(&h, &x) + DMatrix::identity(x.len(), x.len()) * h.noise;
        let kinv = k.clone().try_inverse().expect("invertible");
        let dense = -0.5 * y.dot(&(&kinv * &y))
            - 0.5 * k.determinant().ln()
            - 0.5 * x.len() as f64 * (2.0 * std::f64::consts::PI).ln();
        let lml = Posterior::new(h, x, Some(&y))
            .expect("factorizes")
            .log_marginal_likelihood()
            .expect("has outputs");
        assert!(
            (lml - dense).abs() < 1e-6 * dense.abs().max(1.0),
            "{lml} against {dense}"
        );
    }

    #[test]
    fn posterior_of_one_point_matches_the_hand_computed_values() {
        // One observation y = 2 at 0, σ² = 1, ℓ = 1, noise ≈ 1e-6: at distance 0.5 the
        // correlation is ρ = (1 + √5/2 + 5/12) e^{−√5/2} = 0.8286..., so μ = 2ρ/(1+σ_n²) and
        // σ² = 1 − ρ²/(1+σ_n²).
        let theta = [0.0, 0.0, -40.0];
        let h = Hyper::from_theta(&theta);
        let y = DVector::from_vec(vec![2.0]);
        let post = Posterior::new(h, vec![vec![0.0]], Some(&y)).expect("factorizes");
        let (mean, var) = post.predict(&[vec![0.5], vec![0.0]]);
        let rho = (1.0 + 5f64.sqrt() / 2.0 + 5.0 / 12.0) * (-5f64.sqrt() / 2.0).exp();
        assert!((rho - 0.828_6).abs() < 1e-3);
        assert!((mean[0] - 2.0 * rho).abs() < 1e-5, "{}", mean[0]);
        assert!((var[0] - (1.0 - rho * rho)).abs() < 1e-5, "{}", var[0]);
        assert!((mean[1] - 2.0).abs() < 1e-5 && var[1] < 1e-5);
    }

    #[test]
    fn fitting_finds_a_long_length_scale_for_an_irrelevant_feature() {
        let mut rng = StdRng::seed_from_u64(2);
        let x: Vec<Vec<f64>> = (0..30)
            .map(|_| (0..2).map(|_| rng.random::<f64>()).collect())
            .collect();
        let y = DVector::from_iterator(30, x.iter().map(|p| (6.0 * p[0]).sin()));
        let y = &y - DVector::from_element(30, y.mean());
        let options = FitOptions {
            random_starts: 3,
            runs: 2,
            max_iters: 50,
            prior: Prior::default(),
        };
        let theta = fit_theta(&x, &y, &[], &[], options, &mut rng);
        assert!(
            theta[2] > theta[1] + 1.0,
            "ℓ_irrelevant ≫ ℓ_relevant: {theta:?}"
        );
    }

    #[test]
    fn likelihood_gradient_with_a_categorical_feature_matches_finite_differences() {
        let mut rng = StdRng::seed_from_u64(3);
        // Feature 1 is a category index in {0, 1, 2}; the target depends on it.
        let x: Vec<Vec<f64>> = (0..15)
            .map(|i| vec![rng.random::<f64>(), (i % 3) as f64, rng.random::<f64>()])
            .collect();
        let y = DVector::from_iterator(15, x.iter().map(|p| (4.0 * p[0]).sin() + p[1] * 0.7));
        let cat = [false, true, false];
        let theta = [0.1, -0.8, 0.4, -0.2, -3.0];
        let (_, grad) = neg_log_posterior(&x, &y, &cat, &theta).expect("positive definite");
        for j in 0..theta.len() {
            let eps = 1e-5;
            let mut tp = theta;
            tp[j] += eps;
            let mut tm = theta;
            tm[j] -= eps;
            let fp = neg_log_posterior(&x, &y, &cat, &tp).map_or(f64::NAN, |v| v.0);
            let fm = neg_log_posterior(&x, &y, &cat, &tm).map_or(f64::NAN, |v| v.0);
            let numeric = (fp - fm) / (2.0 * eps);
            assert!(
                (grad[j] - numeric).abs() < 1e-4 * numeric.abs().max(1.0),
                "θ_{j}: {} vs {numeric}",
                grad[j]
            );
        }
    }

    #[test]
    fn a_relevant_category_gets_a_shorter_length_scale_than_an_irrelevant_one() {
        let mut rng = StdRng::seed_from_u64(4);
        // Two categorical features with 3 levels: the first shifts y by 2 per level, the
        // second does nothing.
        let x: Vec<Vec<f64>> = (0..30)
            .map(|_| {
                vec![
                    rng.random::<f64>(),
                    rng.random_range(0..3) as f64,
                    rng.random_range(0..3) as f64,
                ]
            })
            .collect();
        let y = DVector::from_iterator(30, x.iter().map(|p| p[0] + 2.0 * p[1]));
        let y = (&y - DVector::from_element(30, y.mean())) / y.variance().sqrt();
        let options = FitOptions {
            random_starts: 3,
            runs: 2,
            max_iters: 50,
            prior: Prior::default(),
        };
        let cat = [false, true, true];
        let theta = fit_theta(&x, &y, &cat, &[], options, &mut rng);
        assert!(
            theta[3] > theta[2] + 1.0,
            "ℓ_irrelevant ≫ ℓ_relevant: {theta:?}"
        );
    }

    #[test]
    fn posterior_mean_and_variance_gradients_match_finite_differences() {
        let mut rng = StdRng::seed_from_u64(5);
        // Feature 1 is categorical (no gradient); pending-style covariance-only posterior too.
        let x: Vec<Vec<f64>> = (0..20)
            .map(|i| vec![rng.random::<f64>(), (i % 3) as f64, rng.random::<f64>()])
            .collect();
        let y = DVector::from_iterator(20, x.iter().map(|p| (4.0 * p[0]).sin() - p[2] + p[1]));
        let cat = [false, true, false];
        let hyper = Hyper::from_theta_with(&[0.2, -1.0, 0.0, -0.7, -6.0], &cat);
        let with_mean = Posterior::new(hyper.clone(), x.clone(), Some(&y)).expect("pd");
        let variance_only = Posterior::new(hyper, x, None).expect("pd");
        for post in [&with_mean, &variance_only] {
            for point in [[0.31, 1.0, 0.62], [0.9, 2.0, 0.05], [0.5, 0.0, 0.5]] {
                let g = post.predict_with_gradient(&point);
                let (m0, v0) = post.predict(&[point.to_vec()]);
                assert!((g.mean - m0[0]).abs() < 1e-12 && (g.variance - v0[0]).abs() < 1e-12);
                for j in [0, 2] {
                    let eps = 1e-6;
                    let mut p = point.to_vec();
                    p[j] += eps;
                    let (mp, vp) = post.predict(std::slice::from_ref(&p));
                    p[j] -= 2.0 * eps;
                    let (mm, vm) = post.predict(&[p]);
                    let dm = (mp[0] - mm[0]) / (2.0 * eps);
                    let dv = (vp[0] - vm[0]) / (2.0 * eps);
                    assert!(
                        (g.mean_grad[j] - dm).abs() < 1e-5 * dm.abs().max(1.0),
                        "μ {j}"
                    );
                    assert!(
                        (g.variance_grad[j] - dv).abs() < 1e-5 * dv.abs().max(1.0),
                        "σ² {j}"
                    );
                }
                assert_eq!(g.mean_grad[1], 0.0);
                assert_eq!(g.variance_grad[1], 0.0);
            }
        }
    }

    fn quadratic_trend() -> TrendSpec {
        TrendSpec {
            basis: super::super::mean::TrendBasis::Quadratic,
            prior_sd: 1.0,
            concave: true,
            select: None,
        }
    }

    #[test]
    fn posterior_with_a_trend_reverts_to_the_bowl_away_from_the_data() {
        // A bowl with its top at (0.3, 0.7), seen at scattered points by a GP with short
        // length scales: between the points the zero-mean GP reverts to 0, the trend's GP
        // to the bowl.
        let mut rng = StdRng::seed_from_u64(11);
        let f = |p: &[f64]| 1.0 - 4.0 * (p[0] - 0.3).powi(2) - 4.0 * (p[1] - 0.7).powi(2);
        let x: Vec<Vec<f64>> = (0..25)
            .map(|_| vec![rng.random::<f64>(), rng.random::<f64>()])
            .collect();
        let y = DVector::from_iterator(x.len(), x.iter().map(|p| f(p)));
        let h = Hyper::from_theta_with(&[0.0, -3.0, -3.0, -8.0], &[]);
        let plain = Posterior::new(h.clone(), x.clone(), Some(&y)).expect("pd");
        let trended =
            Posterior::with_trend(h.clone(), x.clone(), &y, quadratic_trend(), &[]).expect("pd");
        // Both interpolate the data (short length scales, little noise).
        let (m, _) = trended.predict(&x);
        for (a, b) in m.iter().zip(y.iter()) {
            assert!((a - b).abs() < 1e-3, "{a} vs {b}");
        }
        // Between the points (grid points at least 0.12 from every data point; length
        // scale 0.05), the trend's GP predicts the bowl, the zero-mean GP about 0.
        let probes: Vec<Vec<f64>> = (0..11)
            .flat_map(|i| (0..11).map(move |j| vec![i as f64 / 10.0, j as f64 / 10.0]))
            .filter(|p| x.iter().all(|q| (p[0] - q[0]).hypot(p[1] - q[1]) > 0.12))
            .collect();
        assert!(probes.len() >= 10, "{}", probes.len());
        let (mt, vt) = trended.predict(&probes);
        let (mp, vp) = plain.predict(&probes);
        let (mut err_trend, mut err_plain) = (0.0, 0.0);
        for (i, p) in probes.iter().enumerate() {
            assert!((mt[i] - f(p)).abs() < 0.3, "{p:?}: {} vs {}", mt[i], f(p));
            assert!(mp[i].abs() < 0.2, "{p:?}: {}", mp[i]);
            assert_eq!(vt[i], vp[i], "the variance is the kernel's");
            err_trend += (mt[i] - f(p)).abs();
            err_plain += (mp[i] - f(p)).abs();
        }
        assert!(err_trend < 0.2 * err_plain, "{err_trend} vs {err_plain}");
        // Deterministic: the same inputs give bit-identical predictions.
        let again = Posterior::with_trend(h, x, &y, quadratic_trend(), &[]).expect("pd");
        assert_eq!(again.predict(&probes), (mt, vt));
    }

    #[test]
    fn posterior_with_a_trend_has_gradients_matching_finite_differences() {
        let mut rng = StdRng::seed_from_u64(12);
        let x: Vec<Vec<f64>> = (0..20)
            .map(|i| vec![rng.random::<f64>(), (i % 3) as f64, rng.random::<f64>()])
            .collect();
        let y = DVector::from_iterator(20, x.iter().map(|p| -3.0 * (p[0] - 0.4).powi(2) + p[2]));
        let cat = [false, true, false];
        let hyper = Hyper::from_theta_with(&[0.2, -1.5, 0.0, -1.0, -6.0], &cat);
        let post = Posterior::with_trend(hyper, x, &y, quadratic_trend(), &cat).expect("pd");
        assert!(post.trend().is_some_and(|t| t.coefficients()[3] < 0.0));
        for point in [[0.31, 1.0, 0.62], [0.9, 2.0, 0.05], [0.02, 0.0, 0.97]] {
            let g = post.predict_with_gradient(&point);
            let (m0, v0) = post.predict(&[point.to_vec()]);
            assert!((g.mean - m0[0]).abs() < 1e-12 && (g.variance - v0[0]).abs() < 1e-12);
            assert!((post.predict_mean(&[point.to_vec()])[0] - m0[0]).abs() < 1e-12);
            for j in [0, 2] {
                let eps = 1e-6;
                let mut p = point.to_vec();
                p[j] += eps;
                let mp = post.predict_mean(std::slice::from_ref(&p))[0];
                p[j] -= 2.0 * eps;
                let mm = post.predict_mean(&[p])[0];
                let dm = (mp - mm) / (2.0 * eps);
                assert!(
                    (g.mean_grad[j] - dm).abs() < 1e-5 * dm.abs().max(1.0),
                    "μ {j}: {} vs {dm}",
                    g.mean_grad[j]
                );
            }
        }
    }

    #[test]
    fn with_outputs_keeps_the_trend_and_conditions_on_the_new_outputs() {
        // Conditioning the trended posterior on its own outputs changes nothing; on outputs
        // shifted by the trend's values at X, the kernel part is that of the plain GP.
        let mut rng = StdRng::seed_from_u64(13);
        let x: Vec<Vec<f64>> = (0..12)
            .map(|_| vec![rng.random::<f64>(), rng.random::<f64>()])
            .collect();
        let y = DVector::from_iterator(12, x.iter().map(|p| -(p[0] - 0.5).powi(2) + p[1]));
        let h = Hyper::from_theta_with(&[0.0, -1.0, -1.0, -6.0], &[]);
        let post =
            Posterior::with_trend(h.clone(), x.clone(), &y, quadratic_trend(), &[]).expect("pd");
        let probes = vec![vec![0.2, 0.2], vec![0.8, 0.6]];
        let same = post.with_outputs(&y);
        assert_eq!(same.predict_mean(&probes), post.predict_mean(&probes));
        let z = DVector::from_iterator(12, (0..12).map(|i| (i as f64).sin()));
        let trend = post.trend().expect("trend").clone();
        let shifted = post.with_outputs(&(&z + trend.values(&x)));
        let plain = Posterior::new(h, x, Some(&z)).expect("pd");
        for (p, (a, b)) in probes.iter().zip(
            shifted
                .predict_mean(&probes)
                .iter()
                .zip(plain.predict_mean(&probes)),
        ) {
            assert!((a - trend.value(p) - b).abs() < 1e-9);
        }
    }
}
