//! Output warping: make observed metric values friendlier to a stationary GP.

/// Which optional steps of the output warping run.
///
/// Applied to "larger is better" values (minimized metrics are negated first):
/// 1. Infeasible and failed trials get a value below the worst feasible one
///    (`worst − ½·range`), so the GP learns to avoid their region without an outlier.
/// 2. Half-rank warping: values below the median are replaced by
///    `median + s·Φ⁻¹(q)`, where `q` is their rank quantile and `s` the spread of the good
///    half around the median, so a heavy bad tail cannot dominate the fit.
/// 3. Log warping near the best: with `t = (max − y)/(max − min)` in [0, 1],
///    `y ← ½ − ln(1 + (c−1)t)/ln c` (c = 1.5), which stretches differences among the best
///    values.
/// 4. Optionally (off by default, [`Warping::power`]): a Yeo-Johnson power transform
///    (Yeo & Johnson 2000) of the standardized values whose λ maximizes the profile
///    likelihood of a normal model of the transformed values ([`fit_yeo_johnson`]), so a
///    heavy tail is compressed and a roughly symmetric sample is left nearly linear. λ
///    and the standardization it applies to are fitted either on the values warped
///    ([`Power::Fitted`]) or beforehand on another sample ([`Power::Fixed`], see
///    [`fit_power`]).
/// 5. Standardization to zero mean and unit variance.
///
/// [`log_jacobian`] gives `Σ ln w′(yᵢ)` of steps 2, 3 and 5, so that GPs fitted to
/// differently warped targets can be compared by likelihood on the values' own scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Warping {
    /// Step 2, half-rank warping.
    pub rank: bool,
    /// Step 3, log warping near the best.
    pub log: bool,
    /// Step 4, the Yeo-Johnson power transform.
    pub power: Power,
}

/// Step 4 of the output warping.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Power {
    Off,
    /// λ fitted on the (standardized) values being warped.
    Fitted,
    /// `yeo_johnson((y − mean)/sd, lambda)`, from [`fit_power`].
    Fixed {
        lambda: f64,
        mean: f64,
        sd: f64,
    },
}

/// Fit step 4 on `values` (`None` = infeasible or failed; larger is better, as for
/// [`warp`]): the mean and sd of the feasible values and the λ in `[min_lambda, 5]` that
/// maximizes the profile likelihood of their standardized values. [`Power::Off`] with fewer
/// than 3 distinct finite values.
pub fn fit_power(values: &[Option<f64>], min_lambda: f64) -> Power {
    let Some((z, mean, sd)) = standardized_feasible(values) else {
        return Power::Off;
    };
    let lambda = fit_yeo_johnson(&z).clamp(
        min_lambda.min(YEO_JOHNSON_LAMBDA_RANGE.1),
        YEO_JOHNSON_LAMBDA_RANGE.1,
    );
    Power::Fixed { lambda, mean, sd }
}

/// How strongly `values` (as for [`fit_power`]) favour their fitted Yeo-Johnson λ̂ over
/// `lambda0`: `(λ̂, ℓ(λ̂) − ℓ(λ0))` with ℓ the profile log-likelihood of the standardized
/// feasible values. Twice the difference is asymptotically χ²₁ when λ0 is the true λ (Wilks
/// 1938), so a difference above 1.92 rejects λ0 at the 5 % level. `None` with fewer than 3
/// distinct finite values.
pub fn power_evidence(values: &[Option<f64>], lambda0: f64) -> Option<(f64, f64)> {
    let (z, _, _) = standardized_feasible(values)?;
    let lambda = fit_yeo_johnson(&z);
    let gain = yeo_johnson_log_likelihood(&z, lambda) - yeo_johnson_log_likelihood(&z, lambda0);
    gain.is_finite().then_some((lambda, gain.max(0.0)))
}

/// The feasible values: present and finite.
fn feasible_values(values: &[Option<f64>]) -> Vec<f64> {
    values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .collect()
}

/// `values` with each infeasible one (`None` or not finite) put half the feasible range
/// below the worst feasible one, how many were feasible and their range; `None` when none
/// was.
fn penalized(values: &[Option<f64>]) -> Option<(Vec<f64>, usize, f64)> {
    let feasible = feasible_values(values);
    if feasible.is_empty() {
        return None;
    }
    let (lo, hi) = feasible
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    let range = (hi - lo).max(1e-12 * hi.abs().max(1.0));
    let penalty = lo - 0.5 * range;
    let all = values
        .iter()
        .map(|v| match v {
            Some(v) if v.is_finite() => *v,
            _ => penalty,
        })
        .collect();
    Some((all, feasible.len(), range))
}

/// The feasible finite `values` standardized, with their mean and sd (population); `None`
/// with fewer than 3 distinct values.
fn standardized_feasible(values: &[Option<f64>]) -> Option<(Vec<f64>, f64, f64)> {
    let y = feasible_values(values);
    if y.len() < 3 || y.iter().all(|v| *v == y[0]) {
        return None;
    }
    let n = y.len() as f64;
    let mean = y.iter().sum::<f64>() / n;
    let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    if !(sd > 0.0 && sd.is_finite()) {
        return None;
    }
    Some((y.iter().map(|v| (v - mean) / sd).collect(), mean, sd))
}

impl Default for Warping {
    fn default() -> Self {
        Warping {
            rank: true,
            log: true,
            power: Power::Off,
        }
    }
}

/// Warp `values` (`None` = infeasible or failed; larger is better) into standardized GP
/// targets with the default steps. All-`None` or constant inputs give zeros.
pub fn warp(values: &[Option<f64>]) -> Vec<f64> {
    warp_with(values, Warping::default())
}

/// [`warp`], with the steps `steps` selects.
pub fn warp_with(values: &[Option<f64>], steps: Warping) -> Vec<f64> {
    let Some((mut y, _, _)) = penalized(values) else {
        return vec![0.0; values.len()];
    };
    if steps.rank {
        half_rank(&mut y);
    }
    if steps.log {
        log_warp(&mut y);
    }
    match steps.power {
        Power::Off => {}
        Power::Fitted => {
            standardize(&mut y);
            let lambda = fit_yeo_johnson(&y);
            for v in y.iter_mut() {
                *v = yeo_johnson(*v, lambda);
            }
        }
        Power::Fixed { lambda, mean, sd } => {
            for v in y.iter_mut() {
                *v = yeo_johnson((*v - mean) / sd, lambda);
            }
        }
    }
    standardize(&mut y);
    y
}

/// Range searched for the Yeo-Johnson λ. λ = 1 is the identity; λ > 1 compresses the
/// lower (bad) tail and stretches the upper one, λ < 1 the reverse; at λ ≥ 2 the lower
/// tail is compressed at least logarithmically.
pub const YEO_JOHNSON_LAMBDA_RANGE: (f64, f64) = (-3.0, 5.0);

/// The Yeo-Johnson transform of `x` with power `lambda`: `((x+1)^λ − 1)/λ` for `x ≥ 0`,
/// `−((1−x)^(2−λ) − 1)/(2−λ)` for `x < 0` (logarithms at λ = 0 and λ = 2). Strictly
/// increasing in `x` for every λ.
pub fn yeo_johnson(x: f64, lambda: f64) -> f64 {
    const EPS: f64 = 1e-9;
    if x >= 0.0 {
        if lambda.abs() < EPS {
            x.ln_1p()
        } else {
            ((lambda * x.ln_1p()).exp_m1()) / lambda
        }
    } else {
        let mu = 2.0 - lambda;
        if mu.abs() < EPS {
            -(-x).ln_1p()
        } else {
            -((mu * (-x).ln_1p()).exp_m1()) / mu
        }
    }
}

/// The inverse of [`yeo_johnson`]: `x` with `yeo_johnson(x, lambda) == z`, for `z` in the
/// transform's range (for λ < 0 the upper branch is bounded by `−1/λ`, for λ > 2 the lower
/// one by `−1/(λ−2)`; values beyond map to ±∞).
pub fn yeo_johnson_inverse(z: f64, lambda: f64) -> f64 {
    const EPS: f64 = 1e-9;
    if z >= 0.0 {
        if lambda.abs() < EPS {
            z.exp_m1()
        } else {
            let base = lambda * z + 1.0;
            if base <= 0.0 {
                return f64::INFINITY;
            }
            (base.ln() / lambda).exp_m1()
        }
    } else {
        let mu = 2.0 - lambda;
        if mu.abs() < EPS {
            -(-z).exp_m1()
        } else {
            let base = 1.0 - mu * z;
            if base <= 0.0 {
                return f64::NEG_INFINITY;
            }
            -(base.ln() / mu).exp_m1()
        }
    }
}

/// Profile log-likelihood of λ: the transformed values modelled as i.i.d. normal with
/// their own mean and variance, plus the log-Jacobian of the transform.
fn yeo_johnson_log_likelihood(x: &[f64], lambda: f64) -> f64 {
    let n = x.len() as f64;
    let z: Vec<f64> = x.iter().map(|&v| yeo_johnson(v, lambda)).collect();
    let mean = z.iter().sum::<f64>() / n;
    let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    if !var.is_finite() || var <= 0.0 {
        return f64::NEG_INFINITY;
    }
    let jacobian: f64 = x.iter().map(|&v| v.signum() * v.abs().ln_1p()).sum();
    -0.5 * n * var.ln() + (lambda - 1.0) * jacobian
}

/// The Yeo-Johnson λ in [`YEO_JOHNSON_LAMBDA_RANGE`] maximizing the profile likelihood of
/// `x` (a grid of 33 points, then golden-section search around the best). Deterministic;
/// 1 (the identity) for fewer than 3 finite values or a constant sample.
pub fn fit_yeo_johnson(x: &[f64]) -> f64 {
    let x: Vec<f64> = x.iter().copied().filter(|v| v.is_finite()).collect();
    if x.len() < 3 || x.iter().all(|v| *v == x[0]) {
        return 1.0;
    }
    let (lo, hi) = YEO_JOHNSON_LAMBDA_RANGE;
    const GRID: usize = 32;
    let step = (hi - lo) / GRID as f64;
    let ll = |l: f64| {
        let v = yeo_johnson_log_likelihood(&x, l);
        if v.is_nan() { f64::NEG_INFINITY } else { v }
    };
    let mut best = (1.0, ll(1.0));
    for i in 0..=GRID {
        let l = lo + step * i as f64;
        let v = ll(l);
        if v > best.1 {
            best = (l, v);
        }
    }
    if !best.1.is_finite() {
        return 1.0;
    }
    // Golden-section search on the grid cell either side of the best grid point.
    let (mut a, mut b) = ((best.0 - step).max(lo), (best.0 + step).min(hi));
    let r = 0.5 * (5f64.sqrt() - 1.0);
    let mut c = b - r * (b - a);
    let mut d = a + r * (b - a);
    let (mut fc, mut fd) = (ll(c), ll(d));
    for _ in 0..40 {
        if fc >= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - r * (b - a);
            fc = ll(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + r * (b - a);
            fd = ll(d);
        }
    }
    let (l, v) = if fc >= fd { (c, fc) } else { (d, fd) };
    if v > best.1 { l } else { best.0 }
}

/// `Σ ln w′(yᵢ)` over the feasible values of `values` for the warping [`warp_with`]
/// applies with `steps` (no power step), so that `ln p_GP(w(y)) + Σ ln w′(yᵢ)` is a density
/// of the values on their own scale, comparable between warpings (the change of variables
/// of Snelson et al. 2004's warped GPs). The half-rank step is a step function of `y`; its
/// derivative is taken from a smooth surrogate, `median + s Φ⁻¹(F̃(y))` with F̃ the
/// empirical CDF smoothed by a Gaussian kernel (bandwidth 0.9 min(sd, IQR/1.34) n^(−1/5),
/// Silverman 1986). Infeasible values (a fixed penalty, no density) are left out. `None`
/// for a power step or a degenerate sample.
pub fn log_jacobian(values: &[Option<f64>], steps: Warping) -> Option<f64> {
    let log_d = log_derivatives(values, steps)?;
    let total: f64 = log_d
        .iter()
        .zip(values)
        .filter(|(_, v)| v.is_some_and(f64::is_finite))
        .map(|(d, _)| d)
        .sum();
    total.is_finite().then_some(total)
}

/// `ln w′(yᵢ)` per value (infeasible ones included, at their penalty), as for
/// [`log_jacobian`]; the final standardization's sd is treated as fixed.
fn log_derivatives(values: &[Option<f64>], steps: Warping) -> Option<Vec<f64>> {
    if steps.power != Power::Off {
        return None;
    }
    let (raw, feasible, range) = penalized(values)?;
    if feasible < 3 {
        return None;
    }
    // ln w′ per value, accumulated step by step (the chain rule), on the same values the
    // warping itself transforms.
    let mut log_d = vec![0.0; raw.len()];
    let mut y = raw.clone();
    if steps.rank {
        let n = y.len();
        let mut sorted = y.clone();
        sorted.sort_by(f64::total_cmp);
        let (median, spread) = median_and_good_spread(&y, |k| sorted[k]);
        let mean = y.iter().sum::<f64>() / n as f64;
        let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        let iqr = sorted[(3 * n) / 4] - sorted[n / 4];
        let h = 0.9 * sd.min(iqr / 1.34).max(1e-12 * range) * (n as f64).powf(-0.2);
        if spread > 0.0 {
            for (i, v) in y.iter().enumerate() {
                if *v < median {
                    let (mut cdf, mut pdf) = (0.0, 0.0);
                    for yj in &sorted {
                        let z = (v - yj) / h;
                        cdf += normal_cdf(z);
                        pdf += (-0.5 * z * z).exp();
                    }
                    let q = (cdf / n as f64).clamp(1e-12, 1.0 - 1e-12);
                    let pdf = pdf / (n as f64 * h * (2.0 * std::f64::consts::PI).sqrt());
                    let z = inverse_normal_cdf(q);
                    let phi = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
                    log_d[i] += (spread * pdf / phi).max(1e-300).ln();
                }
            }
        }
        half_rank(&mut y);
    }
    if steps.log {
        const C: f64 = 1.5;
        let (lo, hi) = y
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        if hi - lo > 0.0 {
            for (i, v) in y.iter().enumerate() {
                let t = (hi - v) / (hi - lo);
                log_d[i] += ((C - 1.0) / ((1.0 + (C - 1.0) * t) * C.ln() * (hi - lo))).ln();
            }
        }
        log_warp(&mut y);
    }
    let n = y.len() as f64;
    let mean = y.iter().sum::<f64>() / n;
    let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    if sd.is_nan() || sd <= 0.0 {
        return None;
    }
    Some(log_d.iter().map(|d| d - sd.ln()).collect())
}

fn half_rank(y: &mut [f64]) {
    let n = y.len();
    if n < 3 {
        return;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| y[a].total_cmp(&y[b]));
    let (median, spread) = median_and_good_spread(y, |k| y[order[k]]);
    if spread <= 0.0 {
        return;
    }
    for (rank, &i) in order.iter().enumerate() {
        if y[i] < median {
            let q = (rank as f64 + 0.5) / n as f64;
            // Never move a value above the median, nor above where it was.
            y[i] = (median + spread * inverse_normal_cdf(q)).min(median);
        }
    }
}

fn log_warp(y: &mut [f64]) {
    const C: f64 = 1.5;
    let (lo, hi) = y
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    if hi - lo <= 0.0 {
        return;
    }
    for v in y.iter_mut() {
        let t = (hi - *v) / (hi - lo);
        *v = 0.5 - (1.0 + (C - 1.0) * t).ln() / C.ln();
    }
}

fn standardize(y: &mut [f64]) {
    let n = y.len() as f64;
    let mean = y.iter().sum::<f64>() / n;
    let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    for v in y.iter_mut() {
        *v = if sd > 0.0 { (*v - mean) / sd } else { 0.0 };
    }
}

/// The standard normal CDF `Φ(z) = ½ erfc(−z/√2)`, with `erfc` by the Chebyshev fit of
/// Numerical Recipes (Press et al. 2007, §6.2, `erfccheb`; fractional error < 1.2e-7).
pub fn normal_cdf(z: f64) -> f64 {
    if !z.is_finite() {
        return if z > 0.0 { 1.0 } else { 0.0 };
    }
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// Φ⁻¹(p) by Acklam's rational approximation (relative error < 1.2e-9).
pub fn inverse_normal_cdf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.024_25 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.024_25 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// The half-rank step's centre and scale: the median of `y` (`sorted(k)` is its k-th
/// smallest value) and the root mean square distance above it of the values at or above it.
fn median_and_good_spread(y: &[f64], sorted: impl Fn(usize) -> f64) -> (f64, f64) {
    let n = y.len();
    let median = if n % 2 == 1 {
        sorted(n / 2)
    } else {
        0.5 * (sorted(n / 2 - 1) + sorted(n / 2))
    };
    let good: Vec<f64> = y
        .iter()
        .filter(|v| **v >= median)
        .map(|v| v - median)
        .collect();
    let spread = (good.iter().map(|d| d * d).sum::<f64>() / good.len().max(1) as f64).sqrt();
    (median, spread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warping_keeps_the_order_and_puts_infeasible_trials_last() {
        let values = [Some(1.0), Some(-1e6), None, Some(3.0), Some(2.0), Some(2.5)];
        let y = warp(&values);
        let mean = y.iter().sum::<f64>() / y.len() as f64;
        assert!(mean.abs() < 1e-9);
        assert!(y[3] > y[5] && y[5] > y[4] && y[4] > y[0] && y[0] > y[1]);
        assert!(y[2] <= y[1], "infeasible is worst");
        // The outlier at -1e6 no longer dwarfs everything else.
        assert!(y[1] > -4.0);
    }

    #[test]
    fn normal_cdf_matches_known_values_and_inverts_the_quantile_function() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.959_963_985) - 0.975).abs() < 1e-7);
        assert!((normal_cdf(-3.090_232_306) - 0.001).abs() < 1e-7);
        for p in [0.01, 0.2, 0.5, 0.77, 0.999] {
            assert!((normal_cdf(inverse_normal_cdf(p)) - p).abs() < 1e-6 * p.max(0.01));
        }
        assert_eq!(normal_cdf(f64::INFINITY), 1.0);
        assert_eq!(normal_cdf(f64::NEG_INFINITY), 0.0);
    }

    #[test]
    fn inverse_normal_cdf_matches_known_quantiles() {
        assert!(inverse_normal_cdf(0.5).abs() < 1e-9);
        assert!((inverse_normal_cdf(0.975) - 1.959_963_985).abs() < 1e-6);
        assert!((inverse_normal_cdf(0.001) + 3.090_232_306).abs() < 1e-6);
    }

    /// `n` exact standard normal quantiles, a deterministic "sample".
    fn normal_quantiles(n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| inverse_normal_cdf((i as f64 + 0.5) / n as f64))
            .collect()
    }

    #[test]
    fn yeo_johnson_is_strictly_increasing_and_invertible() {
        let xs: Vec<f64> = (-80..=80).map(|i| i as f64 * 0.125).collect();
        for lambda in [
            -3.0,
            -1.0,
            -1e-12,
            0.0,
            0.5,
            1.0,
            1.7,
            2.0,
            2.0 + 1e-12,
            3.0,
            5.0,
        ] {
            let zs: Vec<f64> = xs.iter().map(|&x| yeo_johnson(x, lambda)).collect();
            for w in zs.windows(2) {
                assert!(w[1] > w[0], "λ = {lambda}: not increasing");
            }
            for (&x, &z) in xs.iter().zip(&zs) {
                let back = yeo_johnson_inverse(z, lambda);
                assert!(
                    (back - x).abs() < 1e-9 * (1.0 + x.abs()),
                    "λ = {lambda}: {x} → {z} → {back}"
                );
            }
            assert_eq!(yeo_johnson(0.0, lambda), 0.0);
        }
        // λ = 1 is the identity.
        for &x in &xs {
            assert!((yeo_johnson(x, 1.0) - x).abs() < 1e-12);
        }
        // Outside a bounded branch's range the inverse is infinite, not NaN.
        assert_eq!(yeo_johnson_inverse(2.0, -1.0), f64::INFINITY);
        assert_eq!(yeo_johnson_inverse(-2.0, 3.0), f64::NEG_INFINITY);
    }

    #[test]
    fn fitted_lambda_recovers_a_known_transform() {
        let q = normal_quantiles(400);
        for lambda in [-0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0] {
            // x = T⁻¹(z) with z normal: T(x, λ) is normal, so the fit should find λ.
            let x: Vec<f64> = q
                .iter()
                .map(|&z| yeo_johnson_inverse(0.3 + 0.3 * z, lambda))
                .collect();
            assert!(x.iter().all(|v| v.is_finite()));
            let fitted = fit_yeo_johnson(&x);
            assert!(
                (fitted - lambda).abs() < 0.1,
                "λ = {lambda}: fitted {fitted}"
            );
        }
    }

    #[test]
    fn power_warping_compresses_a_heavy_tail_and_leaves_a_symmetric_sample_linear() {
        // A symmetric sample: λ stays near 1 and the warped values stay affine in the input.
        let sym = normal_quantiles(101);
        let lambda = fit_yeo_johnson(&sym);
        assert!((lambda - 1.0).abs() < 0.15, "symmetric: λ = {lambda}");
        // A minimized metric spanning orders of magnitude (Rosenbrock-like), negated to
        // "larger is better": the bad tail is compressed (λ > 1).
        let heavy: Vec<Option<f64>> = normal_quantiles(60)
            .iter()
            .map(|z| Some(-(2.0 * z + 4.0).exp()))
            .collect();
        let steps = Warping {
            rank: false,
            log: false,
            power: Power::Fitted,
        };
        let plain = warp_with(
            &heavy,
            Warping {
                power: Power::Off,
                ..steps
            },
        );
        let warped = warp_with(&heavy, steps);
        let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(min(&plain) < -4.0, "the tail dominates unwarped");
        assert!(min(&warped) > -3.5, "compressed: {}", min(&warped));
        let mut standardized: Vec<f64> = heavy.iter().flatten().copied().collect();
        standardize(&mut standardized);
        assert!(fit_yeo_johnson(&standardized) > 1.5);
    }

    #[test]
    fn power_evidence_rejects_a_far_lambda_only_with_enough_values() {
        // Symmetric values (λ ≈ 1): λ0 = 2 is clearly worse with 101 values (a χ²₁
        // statistic far above 3.84), much less so with 7, and λ0 = λ̂ costs nothing.
        let many: Vec<Option<f64>> = normal_quantiles(101).into_iter().map(Some).collect();
        let few: Vec<Option<f64>> = normal_quantiles(7).into_iter().map(Some).collect();
        let (lambda, gain) = power_evidence(&many, 2.0).expect("enough values");
        assert!((lambda - 1.0).abs() < 0.15 && gain > 5.0, "{lambda} {gain}");
        let (_, small) = power_evidence(&few, 2.0).expect("enough values");
        assert!(small < gain / 5.0, "7 values: {small}, 101: {gain}");
        let (_, none) = power_evidence(&many, lambda).expect("enough values");
        assert!(none.abs() < 1e-9);
        // Infeasible trials are ignored; too few distinct values give no evidence.
        assert_eq!(
            power_evidence(&[Some(1.0), None, Some(1.0), Some(1.0)], 2.0),
            None
        );
    }

    #[test]
    fn power_warping_keeps_the_order_and_is_deterministic() {
        let values = [Some(1.0), Some(-1e6), None, Some(3.0), Some(2.0), Some(2.5)];
        let steps = Warping {
            rank: false,
            log: false,
            power: Power::Fitted,
        };
        let y = warp_with(&values, steps);
        let mean = y.iter().sum::<f64>() / y.len() as f64;
        assert!(mean.abs() < 1e-9);
        assert!(y[3] > y[5] && y[5] > y[4] && y[4] > y[0] && y[0] > y[1]);
        assert!(y[2] <= y[1], "infeasible is worst");
        assert!(y.iter().all(|v| v.is_finite()));
        let again = warp_with(&values, steps);
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // With the other steps too, and degenerate inputs.
        let all = Warping {
            rank: true,
            log: true,
            power: Power::Fitted,
        };
        let z = warp_with(&values, all);
        assert!(z[3] > z[5] && z[5] > z[4] && z[4] > z[0] && z[0] > z[1]);
        assert_eq!(warp_with(&[Some(2.0), Some(2.0)], all), vec![0.0, 0.0]);
        assert_eq!(warp_with(&[None, None], all), vec![0.0, 0.0]);
        assert_eq!(fit_yeo_johnson(&[1.0, f64::NAN]), 1.0);
    }

    #[test]
    fn log_derivatives_match_finite_differences_of_the_warping() {
        // 201 values: moving one shifts the mean and sd, which the Jacobian treats as
        // fixed, by O(1/n), so 2 % is a fair tolerance. Interior values only (moving the
        // extremes moves the log warping's range).
        let values: Vec<Option<f64>> = (0..201)
            .map(|i| Some(-(i as f64 * 0.05).exp() + (i as f64 * 1.3).sin()))
            .collect();
        let eps = 1e-5;
        for steps in [
            Warping {
                rank: false,
                log: false,
                power: Power::Off,
            },
            Warping {
                rank: false,
                log: true,
                power: Power::Off,
            },
        ] {
            let log_d = log_derivatives(&values, steps).expect("defined");
            for i in [3, 50, 120, 180] {
                let (mut up, mut down) = (values.clone(), values.clone());
                up[i] = up[i].map(|v| v + eps);
                down[i] = down[i].map(|v| v - eps);
                let numeric = (warp_with(&up, steps)[i] - warp_with(&down, steps)[i]) / (2.0 * eps);
                let exact = log_d[i].exp();
                assert!(
                    (exact / numeric - 1.0).abs() < 0.02,
                    "{steps:?}, value {i}: {exact} against {numeric}"
                );
            }
        }
        // With the half-rank step (a step function, so no finite difference) the sum stays
        // finite; infeasible values add nothing; a power step or too few values give None.
        let total = log_jacobian(&values, Warping::default()).expect("defined");
        let mut with_none = values.clone();
        with_none.push(None);
        let with_none = log_jacobian(&with_none, Warping::default()).expect("defined");
        assert!(total.is_finite() && with_none.is_finite());
        assert_eq!(log_jacobian(&[Some(1.0), None], Warping::default()), None);
        let power = Warping {
            power: Power::Fitted,
            ..Warping::default()
        };
        assert_eq!(log_jacobian(&values, power), None);
    }

    #[test]
    fn power_fitted_on_one_sample_applies_to_others() {
        let heavy: Vec<Option<f64>> = normal_quantiles(30)
            .iter()
            .map(|z| Some(-(2.0 * z + 4.0).exp()))
            .collect();
        let Power::Fixed { lambda, mean, sd } = fit_power(&heavy, 1.0) else {
            panic!("expected a fitted transform");
        };
        assert!(lambda > 1.5 && sd > 0.0 && mean < 0.0, "λ = {lambda}");
        // A symmetric sample with the least λ set above its fit gets that least λ.
        let sym: Vec<Option<f64>> = normal_quantiles(30).into_iter().map(Some).collect();
        assert!(matches!(fit_power(&sym, 1.3), Power::Fixed { lambda, .. } if lambda == 1.3));
        assert_eq!(fit_power(&[Some(1.0), None, Some(1.0)], 1.0), Power::Off);
        assert_eq!(fit_power(&[Some(1.0), Some(f64::NAN)], 1.0), Power::Off);
        // Applied to a larger history (values beyond the fitted sample included), the
        // warping keeps the order.
        let steps = Warping {
            rank: false,
            log: false,
            power: fit_power(&heavy, 1.0),
        };
        let mut more = heavy.clone();
        more.extend([Some(-1e9), Some(0.0), None, Some(-0.5)]);
        let y = warp_with(&more, steps);
        assert!(y.iter().all(|v| v.is_finite()));
        let n = heavy.len();
        assert!(y[n + 1] > y[n + 3] && y[n + 3] > y[0] && y[0] > y[n] && y[n] >= y[n + 2]);
    }
}
