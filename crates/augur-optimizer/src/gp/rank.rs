//! Rank statistics that compare GPs fitted to differently warped targets, by how well each
//! orders the points it has not seen (what the acquisition needs from it).

/// Ranks of `v` from 0 (smallest), ties sharing their average rank.
pub fn average_ranks(v: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut ranks = vec![0.0; v.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && v[order[end]] == v[order[start]] {
            end += 1;
        }
        let rank = 0.5 * (start + end - 1) as f64;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        start = end;
    }
    ranks
}

/// Spearman's rank correlation of `a` and `b` (the Pearson correlation of their average
/// ranks). `None` with fewer than 3 pairs, different lengths or a constant side.
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 3 || a.iter().chain(b).any(|v| !v.is_finite()) {
        return None;
    }
    let (ra, rb) = (average_ranks(a), average_ranks(b));
    let n = a.len() as f64;
    let mean = (n - 1.0) / 2.0;
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        let (dx, dy) = (x - mean, y - mean);
        sab += dx * dy;
        saa += dx * dx;
        sbb += dy * dy;
    }
    (saa > 0.0 && sbb > 0.0).then(|| sab / (saa * sbb).sqrt())
}

/// How well leave-one-out means `loo` order the `observed` values (larger is better for
/// both): Spearman's correlation over the best `top_fraction` of the points by observed
/// value (at least 5 of them, or all), since Bayesian optimization needs the model to tell
/// good points apart more than bad ones. `None` when it is undefined (see [`spearman`]).
///
/// Why by rank: two GPs of one objective, one on the half-rank + log warped targets and one
/// on the standardized values, predict on different scales, so their likelihoods and squared
/// errors cannot be compared. Their leave-one-out means can, by rank: a rank statistic of the
/// LOO means against the observed values is unchanged by any increasing transform of either.
pub fn loo_rank_quality(loo: &[f64], observed: &[f64], top_fraction: f64) -> Option<f64> {
    if loo.len() != observed.len() {
        return None;
    }
    let n = observed.len();
    let keep = ((top_fraction.clamp(0.0, 1.0) * n as f64).ceil() as usize)
        .max(5)
        .min(n);
    let mut order: Vec<usize> = (0..n).collect();
    // Best first; ties by index, so the subset is deterministic.
    order.sort_by(|&a, &b| observed[b].total_cmp(&observed[a]).then(a.cmp(&b)));
    let (l, o): (Vec<f64>, Vec<f64>) = order[..keep].iter().map(|&i| (loo[i], observed[i])).unzip();
    spearman(&l, &o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_share_their_average_rank() {
        assert_eq!(
            average_ranks(&[3.0, 1.0, 3.0, 2.0, 3.0]),
            vec![3.0, 0.0, 3.0, 1.0, 3.0]
        );
        assert_eq!(average_ranks(&[]), Vec::<f64>::new());
    }

    #[test]
    fn spearman_is_one_for_any_increasing_map_and_minus_one_reversed() {
        let a: Vec<f64> = (0..20).map(|i| i as f64 * 0.37 - 2.0).collect();
        let b: Vec<f64> = a.iter().map(|v| v.exp() * 5.0 - 1.0).collect();
        let rev: Vec<f64> = a.iter().map(|v| -v * v * v).collect();
        assert!((spearman(&a, &b).expect("defined") - 1.0).abs() < 1e-12);
        assert!((spearman(&a, &rev).expect("defined") + 1.0).abs() < 1e-12);
        // Known value: one swapped pair among 5 gives 1 − 6·2/(5·24) = 0.9.
        let s = spearman(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0, 2.0, 3.0, 5.0, 4.0]);
        assert!((s.expect("defined") - 0.9).abs() < 1e-12);
        assert_eq!(spearman(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), None);
        assert_eq!(spearman(&[1.0, 2.0], &[1.0, 2.0]), None);
        assert_eq!(spearman(&[1.0, f64::NAN, 3.0], &[1.0, 2.0, 3.0]), None);
    }

    #[test]
    fn rank_quality_of_the_top_ignores_how_the_bad_points_are_ordered() {
        // Observed 0..20; the predictions order the best half perfectly and the worst half
        // backwards.
        let observed: Vec<f64> = (0..20).map(f64::from).collect();
        let loo: Vec<f64> = (0..20)
            .map(|i| if i >= 10 { f64::from(i) } else { -f64::from(i) })
            .collect();
        let top = loo_rank_quality(&loo, &observed, 0.5).expect("defined");
        let all = loo_rank_quality(&loo, &observed, 1.0).expect("defined");
        assert!((top - 1.0).abs() < 1e-12, "top half {top}");
        assert!(all < 0.9, "all points {all}");
        // Invariant to increasing transforms of either side.
        let warped: Vec<f64> = observed.iter().map(|v| (0.3 * v).exp()).collect();
        let squashed: Vec<f64> = loo.iter().map(|v| v.atan()).collect();
        assert_eq!(
            loo_rank_quality(&squashed, &warped, 1.0).map(f64::to_bits),
            Some(all.to_bits())
        );
        assert_eq!(loo_rank_quality(&loo, &observed[..5], 1.0), None);
    }
}
