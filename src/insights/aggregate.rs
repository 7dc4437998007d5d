//! Pure aggregation behind the dashboard's charts: best-so-far history, bounded samples of
//! large studies, parameter importance (PED-ANOVA), contour grids and 2-D Pareto fronts.
//! No IO: `charts.rs` reads trials through the service, these functions shape them, each in
//! O(n·d) or O(n log n) with outputs of a bounded size, so a 50,000-trial study costs
//! milliseconds, not seconds.

use std::collections::BTreeSet;

use augur_optimizer::Value;
use serde::Serialize;
use utoipa::ToSchema;

use crate::model::spec::{ParameterInput, ParameterType, ScaleName};

/// Most points a chart is sent; more hide nothing a person can see and cost paint time.
pub const MAX_CHART_POINTS: usize = 2000;
/// Bins per numeric axis for importance and contour grids.
pub const GRID_BINS: usize = 20;
/// PED-ANOVA's quantile: the top 10% of trials are compared with all of them.
pub const TOP_QUANTILE: f64 = 0.1;

/// One parameter of the search space, conditional children flattened in.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ParamAxis {
    pub id: String,
    /// `double`, `integer`, `discrete` or `categorical`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Bounds of numeric parameters (the smallest and largest value of discrete ones).
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Plotted on a log axis.
    pub log: bool,
    /// Categories of a categorical parameter, in spec order; a value's code is its index.
    pub categories: Vec<String>,
}

impl ParamAxis {
    pub fn is_categorical(&self) -> bool {
        !self.categories.is_empty() || self.kind == "categorical"
    }

    /// A number for the value: itself, or a category's index. `None` when inactive or
    /// unknown.
    pub fn encode(&self, value: Option<&Value>) -> Option<f64> {
        match value? {
            Value::Str(s) => self
                .categories
                .iter()
                .position(|c| c == s)
                .map(|i| i as f64),
            v => v.as_f64().filter(|x| x.is_finite()),
        }
    }

    /// The bin of an encoded value among `bins` (categories: one bin each).
    fn bin(&self, x: f64, bins: usize) -> Option<usize> {
        if self.is_categorical() {
            let i = x as usize;
            return (i < self.categories.len()).then_some(i);
        }
        let (lo, hi) = (self.min?, self.max?);
        let t = |v: f64| if self.log && v > 0.0 { v.ln() } else { v };
        let (lo, hi, x) = (t(lo), t(hi), t(x));
        // A degenerate (or NaN) range puts everything in one bin.
        if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
            return Some(0);
        }
        let f = ((x - lo) / (hi - lo)).clamp(0.0, 1.0);
        Some(((f * bins as f64) as usize).min(bins - 1))
    }

    /// How many bins this parameter gets: one per category or per integer, at most
    /// `GRID_BINS`.
    fn bin_count(&self) -> usize {
        if self.is_categorical() {
            return self.categories.len().max(1);
        }
        match (self.kind.as_str(), self.min, self.max) {
            ("integer", Some(lo), Some(hi)) => ((hi - lo) as usize + 1).clamp(1, GRID_BINS),
            _ => GRID_BINS,
        }
    }

    /// The centre of a bin in the parameter's own units (geometric on log axes).
    fn bin_centre(&self, b: usize, bins: usize) -> f64 {
        if self.is_categorical() {
            return b as f64;
        }
        let (lo, hi) = (self.min.unwrap_or(0.0), self.max.unwrap_or(1.0));
        let f = (b as f64 + 0.5) / bins as f64;
        if self.log && lo > 0.0 {
            (lo.ln() + f * (hi.ln() - lo.ln())).exp()
        } else {
            lo + f * (hi - lo)
        }
    }
}

/// Every parameter of a spec, parents before their children, each id once.
pub fn flatten_parameters(parameters: &[ParameterInput]) -> Vec<ParamAxis> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    flatten_into(parameters, &mut out, &mut seen);
    out
}

fn flatten_into(
    parameters: &[ParameterInput],
    out: &mut Vec<ParamAxis>,
    seen: &mut BTreeSet<String>,
) {
    for p in parameters {
        if seen.insert(p.id.clone()) {
            let values = p.values.clone().unwrap_or_default();
            let numbers: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
            let (kind, min, max, categories) = match p.kind {
                ParameterType::Double => ("double", p.min, p.max, vec![]),
                ParameterType::Integer => ("integer", p.min, p.max, vec![]),
                ParameterType::Discrete => (
                    "discrete",
                    numbers.iter().copied().reduce(f64::min),
                    numbers.iter().copied().reduce(f64::max),
                    vec![],
                ),
                ParameterType::Categorical => (
                    "categorical",
                    None,
                    None,
                    values
                        .iter()
                        .map(|v| match v {
                            Value::Str(s) => s.clone(),
                            other => other.as_f64().map_or_else(String::new, |x| x.to_string()),
                        })
                        .collect(),
                ),
            };
            out.push(ParamAxis {
                id: p.id.clone(),
                kind: kind.to_string(),
                min,
                max,
                log: matches!(p.scale, Some(ScaleName::Log)) && min.is_some_and(|m| m > 0.0),
                categories,
            });
        }
        for child in &p.children {
            flatten_into(&child.parameters, out, seen);
        }
    }
}

/// `a` is better than `b` for this goal.
pub fn better(a: f64, b: f64, maximize: bool) -> bool {
    if maximize { a > b } else { a < b }
}

/// The points where the best value so far improves, in trial order: a step line through
/// them (held to the last trial) is the best-so-far curve. `points` are `(trial, value)`
/// sorted by trial.
pub fn best_so_far<K: Copy>(points: &[(K, f64)], maximize: bool) -> Vec<(K, f64)> {
    let mut out: Vec<(K, f64)> = Vec::new();
    for &(trial, value) in points {
        if out
            .last()
            .is_none_or(|&(_, best)| better(value, best, maximize))
        {
            out.push((trial, value));
        }
    }
    out
}

/// At most `max` indices of `0..len`, spread evenly, always including `keep` (which may
/// push the count past `max` by its own length), sorted and distinct.
pub fn sample_indices(len: usize, max: usize, keep: &[usize]) -> Vec<usize> {
    if len <= max {
        return (0..len).collect();
    }
    let mut chosen: BTreeSet<usize> = keep.iter().copied().filter(|&i| i < len).collect();
    let room = max.saturating_sub(chosen.len()).max(1);
    // Even strides over the whole range: the shape of the cloud survives.
    for k in 0..room {
        chosen.insert(k * len / room);
    }
    chosen.into_iter().collect()
}

/// Indices of the `k` best values (ties by position).
pub fn top_k(values: &[f64], k: usize, maximize: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (values[a], values[b]);
        let ord = x.total_cmp(&y);
        if maximize { ord.reverse() } else { ord }
    });
    order.truncate(k);
    order
}

/// Importance of one parameter, and the fraction of it among all.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Importance {
    pub parameter: String,
    /// Share of the total, 0-1; the shares sum to 1 when any is positive.
    pub importance: f64,
}

/// PED-ANOVA (Watanabe et al., IJCAI 2023): a parameter matters as much as the trials in
/// the top `TOP_QUANTILE` concentrate in part of its range. With p the density of a
/// parameter over all trials and p_top over the top ones, its importance is the Pearson
/// divergence D = ∫ p (p_top/p − 1)² dx = Σ_b p_top(b)²/p(b) − 1 over histogram bins,
/// normalised here to shares. `values[i]` is trial i's objective and `columns[j][i]` its
/// encoded value of parameter j (`None` when inactive). O(n·d) plus one sort.
pub fn ped_anova(
    axes: &[ParamAxis],
    columns: &[Vec<Option<f64>>],
    values: &[f64],
    maximize: bool,
) -> Vec<Importance> {
    let n = values.len();
    let mut raw = vec![0.0; axes.len()];
    if n >= 4 {
        let top_n = ((n as f64 * TOP_QUANTILE).ceil() as usize).clamp(2, n);
        let mut is_top = vec![false; n];
        for i in top_k(values, top_n, maximize) {
            is_top[i] = true;
        }
        for (j, axis) in axes.iter().enumerate() {
            let bins = axis.bin_count();
            let (mut all, mut top) = (vec![0.0f64; bins], vec![0.0f64; bins]);
            for (i, x) in columns[j].iter().enumerate().take(n) {
                let Some(b) = x.and_then(|x| axis.bin(x, bins)) else {
                    continue;
                };
                all[b] += 1.0;
                if is_top[i] {
                    top[b] += 1.0;
                }
            }
            let (n_all, n_top): (f64, f64) = (all.iter().sum(), top.iter().sum());
            if n_all < 2.0 || n_top < 1.0 {
                continue;
            }
            raw[j] = all
                .iter()
                .zip(&top)
                .filter(|(a, _)| **a > 0.0)
                .map(|(a, t)| (t / n_top).powi(2) / (a / n_all))
                .sum::<f64>()
                - 1.0;
            raw[j] = raw[j].max(0.0);
        }
    }
    let total: f64 = raw.iter().sum();
    axes.iter()
        .zip(raw)
        .map(|(a, r)| Importance {
            parameter: a.id.clone(),
            importance: if total > 0.0 { r / total } else { 0.0 },
        })
        .collect()
}

/// Mean objective over a grid of two parameters: `z[row for y][column for x]`, `None`
/// where no trial fell.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Grid {
    /// Bin centres in the parameter's units (category labels' indices for categoricals).
    pub x: Vec<f64>,
    pub y: Vec<f64>,
    pub z: Vec<Vec<Option<f64>>>,
}

pub fn contour_grid(
    x_axis: &ParamAxis,
    y_axis: &ParamAxis,
    xs: &[Option<f64>],
    ys: &[Option<f64>],
    values: &[f64],
) -> Grid {
    let (bx, by) = (x_axis.bin_count(), y_axis.bin_count());
    let mut sum = vec![vec![0.0f64; bx]; by];
    let mut count = vec![vec![0u32; bx]; by];
    for ((x, y), v) in xs.iter().zip(ys).zip(values) {
        let (Some(i), Some(j)) = (
            x.and_then(|x| x_axis.bin(x, bx)),
            y.and_then(|y| y_axis.bin(y, by)),
        ) else {
            continue;
        };
        sum[j][i] += v;
        count[j][i] += 1;
    }
    Grid {
        x: (0..bx).map(|b| x_axis.bin_centre(b, bx)).collect(),
        y: (0..by).map(|b| y_axis.bin_centre(b, by)).collect(),
        z: sum
            .iter()
            .zip(&count)
            .map(|(s, c)| {
                s.iter()
                    .zip(c)
                    .map(|(s, &c)| (c > 0).then(|| s / f64::from(c)))
                    .collect()
            })
            .collect(),
    }
}

/// Indices of the non-dominated points of two objectives, sorted by the first. O(n log n):
/// sweep in order of the first objective (best first), keep each point that beats every
/// kept one on the second.
pub fn pareto_front_2d(a: &[f64], b: &[f64], maximize: (bool, bool)) -> Vec<usize> {
    let key = |v: f64, max: bool| if max { -v } else { v };
    let mut order: Vec<usize> = (0..a.len().min(b.len())).collect();
    order.sort_by(|&i, &j| {
        key(a[i], maximize.0)
            .total_cmp(&key(a[j], maximize.0))
            .then(key(b[i], maximize.1).total_cmp(&key(b[j], maximize.1)))
    });
    let mut front = Vec::new();
    let mut best_b = f64::INFINITY;
    for i in order {
        let kb = key(b[i], maximize.1);
        if kb < best_b {
            best_b = kb;
            front.push(i);
        }
    }
    front
}

/// One axis of the parallel coordinates, positions ready to draw.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ParallelAxis {
    pub parameter: String,
    /// Each sampled trial's position: a category's index, log10 of a value on a log axis,
    /// the value itself otherwise; `inactive_at` for a trial where the parameter is
    /// inactive.
    pub values: Vec<f64>,
    /// The axis' extent, `[low, high]`.
    pub range: [f64; 2],
    /// Where the ticks go and what they say; empty: the chart's own ticks.
    pub tickvals: Vec<f64>,
    pub ticktext: Vec<String>,
    /// The position of the "inactive" tick, when some sampled trial lacks the parameter.
    pub inactive_at: Option<f64>,
}

/// The label of inactive values on an axis.
pub const INACTIVE_TICK: &str = "inactive";

/// Numeric ticks drawn on an axis that also carries the inactive tick.
const NUMERIC_TICKS: usize = 5;

/// The parallel-coordinates axis of a parameter over encoded values (`None`: inactive).
/// A conditional parameter is inactive where its parent took another value: those trials
/// get a tick of their own below the others instead of being dropped from the chart.
pub fn parallel_axis(axis: &ParamAxis, column: &[Option<f64>]) -> ParallelAxis {
    let log = axis.log && !axis.is_categorical();
    let place = |x: f64| if log { x.log10() } else { x };
    let (mut range, mut tickvals, mut ticktext) = if axis.is_categorical() {
        let top = axis.categories.len().saturating_sub(1).max(1) as f64;
        let ticks: Vec<f64> = (0..axis.categories.len()).map(|i| i as f64).collect();
        ([0.0, top], ticks, axis.categories.clone())
    } else {
        let seen = column.iter().flatten().copied();
        let lo = axis
            .min
            .or_else(|| seen.clone().reduce(f64::min))
            .unwrap_or(0.0);
        let hi = axis.max.or_else(|| seen.reduce(f64::max)).unwrap_or(1.0);
        ([place(lo), place(hi)], vec![], vec![])
    };
    // The distance between ticks: one category, a whole number of an integer axis' units,
    // a quarter of other axes.
    let span = range[1] - range[0];
    let span = if span.is_finite() && span > 0.0 {
        span
    } else {
        1.0
    };
    let step = if axis.is_categorical() {
        1.0
    } else if axis.kind == "integer" && !log {
        (span / (NUMERIC_TICKS as f64 - 1.0)).ceil()
    } else {
        span / (NUMERIC_TICKS as f64 - 1.0)
    };
    let inactive_at = column.iter().any(Option::is_none).then(|| range[0] - step);
    if let Some(at) = inactive_at {
        if tickvals.is_empty() {
            // Setting any tick replaces the chart's own, so the numeric ones go in too.
            let mut x = range[0];
            while x <= range[1] + step * 1e-9 {
                tickvals.push(x);
                ticktext.push(tick_label(x));
                x += step;
            }
        }
        tickvals.insert(0, at);
        ticktext.insert(0, INACTIVE_TICK.to_string());
        range[0] = at;
    }
    ParallelAxis {
        parameter: axis.id.clone(),
        values: column
            .iter()
            .map(|v| match v {
                Some(x) if axis.is_categorical() => *x,
                Some(x) => place(*x),
                None => inactive_at.unwrap_or(f64::NAN),
            })
            .collect(),
        range,
        tickvals,
        ticktext,
        inactive_at,
    }
}

/// A tick's number in at most four significant digits, without trailing zeros.
fn tick_label(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let digits = (3 - x.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{x:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(id: &str, min: f64, max: f64) -> ParamAxis {
        ParamAxis {
            id: id.into(),
            kind: "double".into(),
            min: Some(min),
            max: Some(max),
            log: false,
            categories: vec![],
        }
    }

    #[test]
    fn best_so_far_keeps_only_improvements() {
        let points = [(1, 0.5), (2, 0.4), (3, 0.7), (4, 0.7), (5, 0.9)];
        assert_eq!(
            best_so_far(&points, true),
            vec![(1, 0.5), (3, 0.7), (5, 0.9)]
        );
        assert_eq!(best_so_far(&points, false), vec![(1, 0.5), (2, 0.4)]);
    }

    #[test]
    fn sampling_is_bounded_and_keeps_what_must_be_kept() {
        let s = sample_indices(50_000, 2000, &[49_999, 12_345]);
        assert!(s.len() <= 2002, "{}", s.len());
        assert!(s.contains(&12_345) && s.contains(&49_999) && s.contains(&0));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sample_indices(10, 2000, &[]), (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn ped_anova_ranks_the_parameter_that_drives_the_objective_first() {
        // y depends on x only; z is noise from a fixed sequence.
        let n = 2000;
        let xs: Vec<Option<f64>> = (0..n).map(|i| Some(i as f64 / n as f64)).collect();
        let zs: Vec<Option<f64>> = (0..n)
            .map(|i| Some(((i * 7919) % n) as f64 / n as f64))
            .collect();
        let y: Vec<f64> = xs
            .iter()
            .map(|x| -(x.unwrap_or(0.0) - 0.3).powi(2))
            .collect();
        let axes = [numeric("x", 0.0, 1.0), numeric("z", 0.0, 1.0)];
        let imp = ped_anova(&axes, &[xs, zs], &y, true);
        assert_eq!(imp[0].parameter, "x");
        assert!(imp[0].importance > 0.9, "{imp:?}");
        let sum: f64 = imp.iter().map(|i| i.importance).sum();
        assert!((sum - 1.0).abs() < 1e-9);
    }

    #[test]
    fn ped_anova_handles_categories_inactive_values_and_tiny_studies() {
        let axis = ParamAxis {
            id: "k".into(),
            kind: "categorical".into(),
            min: None,
            max: None,
            log: false,
            categories: vec!["a".into(), "b".into()],
        };
        let col = vec![Some(0.0), Some(1.0), None, Some(0.0), Some(1.0), Some(1.0)];
        let y = vec![1.0, 0.0, 0.5, 1.0, 0.0, 0.0];
        let imp = ped_anova(std::slice::from_ref(&axis), &[col], &y, true);
        assert!((imp[0].importance - 1.0).abs() < 1e-9, "{imp:?}");
        assert_eq!(
            ped_anova(&[axis], &[vec![Some(0.0)]], &[1.0], true)[0].importance,
            0.0
        );
    }

    #[test]
    fn contour_grid_averages_per_cell_and_leaves_empty_cells_empty() {
        let (ax, ay) = (numeric("x", 0.0, 1.0), numeric("y", 0.0, 1.0));
        let xs = [Some(0.01), Some(0.02), Some(0.99)];
        let ys = [Some(0.01), Some(0.01), Some(0.99)];
        let g = contour_grid(&ax, &ay, &xs, &ys, &[1.0, 3.0, 5.0]);
        assert_eq!(g.x.len(), GRID_BINS);
        assert_eq!(g.z[0][0], Some(2.0));
        assert_eq!(g.z[GRID_BINS - 1][GRID_BINS - 1], Some(5.0));
        assert_eq!(g.z[5][5], None);
        assert!((g.x[0] - 0.025).abs() < 1e-12);
    }

    #[test]
    fn log_axes_bin_geometrically() {
        let mut a = numeric("lr", 1e-4, 1.0);
        a.log = true;
        assert_eq!(a.bin(1e-4, 4), Some(0));
        assert_eq!(a.bin(1e-2, 4), Some(2));
        assert!((a.bin_centre(0, 4) - 10f64.powf(-3.5)).abs() < 1e-12);
    }

    #[test]
    fn pareto_front_keeps_only_non_dominated_points() {
        // maximize both: (1,5) (3,3) (5,1) are the front; (2,2) and (3,1) are dominated.
        let a = [1.0, 3.0, 5.0, 2.0, 3.0];
        let b = [5.0, 3.0, 1.0, 2.0, 1.0];
        let mut f = pareto_front_2d(&a, &b, (true, true));
        f.sort_unstable();
        assert_eq!(f, vec![0, 1, 2]);
    }

    #[test]
    fn inactive_values_get_a_tick_of_their_own_below_a_categorical_axis() {
        let axis = ParamAxis {
            id: "kernel".into(),
            kind: "categorical".into(),
            min: None,
            max: None,
            log: false,
            categories: vec!["rbf".into(), "poly".into(), "linear".into()],
        };
        let p = parallel_axis(&axis, &[Some(2.0), None, Some(0.0)]);
        assert_eq!(p.values, vec![2.0, -1.0, 0.0]);
        assert_eq!(p.range, [-1.0, 2.0]);
        assert_eq!(p.tickvals, vec![-1.0, 0.0, 1.0, 2.0]);
        assert_eq!(p.ticktext, ["inactive", "rbf", "poly", "linear"]);
        assert_eq!(p.inactive_at, Some(-1.0));
    }

    #[test]
    fn a_log_axis_with_inactive_values_keeps_its_numeric_ticks() {
        let axis = ParamAxis {
            log: true,
            ..numeric("momentum", 0.001, 10.0)
        };
        let p = parallel_axis(&axis, &[Some(0.01), None, Some(1.0)]);
        // log10 runs -3..1: the inactive tick sits one tick step (1.0) below.
        assert_eq!(p.inactive_at, Some(-4.0));
        assert_eq!(p.values, vec![-2.0, -4.0, 0.0]);
        assert_eq!(p.range, [-4.0, 1.0]);
        assert_eq!(p.tickvals, vec![-4.0, -3.0, -2.0, -1.0, 0.0, 1.0]);
        assert_eq!(p.ticktext, ["inactive", "-3", "-2", "-1", "0", "1"]);
    }

    #[test]
    fn an_integer_axis_ticks_whole_numbers_and_puts_inactive_one_below() {
        let axis = ParamAxis {
            kind: "integer".into(),
            ..numeric("degree", 2.0, 5.0)
        };
        let p = parallel_axis(&axis, &[None, Some(3.0)]);
        assert_eq!(p.values, vec![1.0, 3.0]);
        assert_eq!(p.tickvals, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(p.ticktext, ["inactive", "2", "3", "4", "5"]);
    }

    #[test]
    fn an_axis_where_every_value_is_active_is_left_to_the_chart() {
        let p = parallel_axis(&numeric("x", 0.0, 2.0), &[Some(0.5), Some(1.5)]);
        assert_eq!(p.values, vec![0.5, 1.5]);
        assert_eq!(p.range, [0.0, 2.0]);
        assert!(p.tickvals.is_empty() && p.ticktext.is_empty());
        assert_eq!(p.inactive_at, None);
        assert_eq!(tick_label(0.000_123_456), "0.0001235");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(12_345.0), "12345");
    }
}
