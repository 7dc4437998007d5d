//! Output warping: make observed metric values friendlier to a stationary GP.
//!
//! Applied to "larger is better" values (minimized metrics are negated first):
//! 1. Infeasible and failed trials get a value below the worst feasible one
//!    (`worst − ½·range`), so the GP learns to avoid their region without an outlier.
//! 2. Half-rank warping: values below the median are replaced by
//!    `median + s·Φ⁻¹(q)`, where `q` is their rank quantile and `s` the spread of the good
//!    half around the median, so a heavy bad tail cannot dominate the fit.
//! 3. Log warping near the best: with `t = (max − y)/(max − min)` in [0, 1],
//!    `y ← ½ − ln(1 + (c−1)t)/ln c` (c = 1.5), which stretches differences among the best
//!    values.
//! 4. Standardization to zero mean and unit variance.

/// Warp `values` (`None` = infeasible or failed; larger is better) into standardized GP
/// targets. All-`None` or constant inputs give zeros.
pub fn warp(values: &[Option<f64>]) -> Vec<f64> {
    warp_with(values, true, true)
}

/// [`warp`], with step 2 only if `rank`, step 3 only if `log`.
pub fn warp_with(values: &[Option<f64>], rank: bool, log: bool) -> Vec<f64> {
    let feasible: Vec<f64> = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    if feasible.is_empty() {
        return vec![0.0; values.len()];
    }
    let (lo, hi) = feasible
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    let range = (hi - lo).max(1e-12 * hi.abs().max(1.0));
    let penalty = lo - 0.5 * range;
    let mut y: Vec<f64> = values
        .iter()
        .map(|v| match v {
            Some(v) if v.is_finite() => *v,
            _ => penalty,
        })
        .collect();
    if rank {
        half_rank(&mut y);
    }
    if log {
        log_warp(&mut y);
    }
    standardize(&mut y);
    y
}

fn half_rank(y: &mut [f64]) {
    let n = y.len();
    if n < 3 {
        return;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| y[a].total_cmp(&y[b]));
    let median = if n % 2 == 1 {
        y[order[n / 2]]
    } else {
        0.5 * (y[order[n / 2 - 1]] + y[order[n / 2]])
    };
    let good: Vec<f64> = y
        .iter()
        .filter(|v| **v >= median)
        .map(|v| v - median)
        .collect();
    let spread = (good.iter().map(|d| d * d).sum::<f64>() / good.len().max(1) as f64).sqrt();
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
}
