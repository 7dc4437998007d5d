//! Grid search: the Cartesian product of every parameter's grid values, enumerated in a
//! fixed (lexicographic) order. Trial number `n` gets grid point `n - 1`; past the end the
//! designer returns fewer suggestions, or none, and the service completes the study.

use crate::designer::{Designer, DesignerInput, DesignerOutput};
use crate::space::{Assignment, Parameter, ParameterKind, SearchSpace, Value};

/// Grid points per double parameter (and per wide integer parameter) by default.
pub const DEFAULT_GRID_RESOLUTION: usize = 10;

/// Grid values per parameter:
/// - categorical and discrete: every value;
/// - integer: every integer when there are at most `resolution` of them, else `resolution`
///   points evenly spaced in the scaled space (so log-scaled integers are spaced
///   geometrically) and rounded, duplicates dropped;
/// - double: `resolution` points evenly spaced in the scaled space, both ends included.
///
/// Conditional children are expanded only under the parent values that activate them, so a
/// branch contributes `Σ_v Π_children size` points and no point appears twice. Points are
/// decoded from their index in O(size of the tree) without materializing the grid, which
/// keeps the designer cheap inside the slot-claiming transaction.
pub struct GridDesigner {
    /// Grid points per double parameter, and the cap for integer parameters (at least 1).
    pub resolution: usize,
}

impl Default for GridDesigner {
    fn default() -> Self {
        GridDesigner {
            resolution: DEFAULT_GRID_RESOLUTION,
        }
    }
}

impl Designer for GridDesigner {
    fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput {
        let res = self.resolution.max(1);
        let size = grid_size_with(input.space, res);
        let start = input.first_trial_number.saturating_sub(1);
        let suggestions = (0..input.count as u64)
            .map(|i| start + i)
            // An overflowing size means the grid is larger than any study can be.
            .take_while(|&i| size.is_none_or(|s| i < s))
            .map(|i| grid_point(input.space, res, i))
            .collect();
        DesignerOutput {
            suggestions,
            state: None,
        }
    }

    fn uses_history(&self) -> bool {
        false
    }
}

/// Number of points in the grid of `space` at [`DEFAULT_GRID_RESOLUTION`]; `None` if it
/// does not fit in a `u64`.
pub fn grid_size(space: &SearchSpace) -> Option<u64> {
    grid_size_with(space, DEFAULT_GRID_RESOLUTION)
}

/// Number of points in the grid of `space` with `resolution` points per double.
pub fn grid_size_with(space: &SearchSpace, resolution: usize) -> Option<u64> {
    list_size(&space.parameters, resolution.max(1))
}

/// Grid point `index` (0-based) of `space`. Indices past the end wrap around.
pub fn grid_point(space: &SearchSpace, resolution: usize, index: u64) -> Assignment {
    let mut out = Assignment::new();
    decode_list(&space.parameters, resolution.max(1), index, &mut out);
    out
}

/// The grid values of one parameter (ignoring its children).
fn grid_values(kind: &ParameterKind, res: usize) -> Vec<Value> {
    // Evenly spaced unit coordinates with both ends: 0, 1/(r-1), ..., 1 (the centre if r = 1).
    let units = |r: usize| -> Vec<f64> {
        if r == 1 {
            vec![0.5]
        } else {
            (0..r).map(|i| i as f64 / (r - 1) as f64).collect()
        }
    };
    match kind {
        ParameterKind::Categorical { values } => values.iter().cloned().map(Value::Str).collect(),
        ParameterKind::Discrete { values, .. } => {
            values.iter().copied().map(Value::from_number).collect()
        }
        ParameterKind::Double { min, max, .. } if min >= max => vec![Value::Float(*min)],
        ParameterKind::Double { .. } => units(res).into_iter().map(|u| kind.from_unit(u)).collect(),
        ParameterKind::Integer { min, max, scale } => {
            let count = (*max as i128 - *min as i128 + 1).max(1);
            if count <= res as i128 {
                (*min..=*max).map(Value::Int).collect()
            } else {
                // Space the points like a double of the same range and scale, then round.
                let as_double = ParameterKind::Double {
                    min: *min as f64,
                    max: *max as f64,
                    scale: *scale,
                };
                let mut ints: Vec<i64> = units(res)
                    .into_iter()
                    .filter_map(|u| as_double.from_unit(u).as_f64())
                    .map(|x| (x.round() as i64).clamp(*min, *max))
                    .collect();
                ints.dedup();
                ints.into_iter().map(Value::Int).collect()
            }
        }
    }
}

/// The parameters that `value` of `p` activates, in spec order.
fn activated<'a>(p: &'a Parameter, value: &Value) -> Vec<&'a Parameter> {
    p.children
        .iter()
        .filter(|c| Parameter::activates(c, value))
        .flat_map(|c| c.parameters.iter())
        .collect()
}

fn list_size<'a>(params: impl IntoIterator<Item = &'a Parameter>, res: usize) -> Option<u64> {
    params
        .into_iter()
        .try_fold(1u64, |acc, p| acc.checked_mul(param_size(p, res)?))
}

/// Points contributed by `p` and its subtree: Σ over its values of the product of the
/// activated children's sizes.
fn param_size(p: &Parameter, res: usize) -> Option<u64> {
    grid_values(&p.kind, res).iter().try_fold(0u64, |acc, v| {
        acc.checked_add(list_size(activated(p, v), res)?)
    })
}

/// Mixed-radix decoding: the last parameter of a list varies fastest.
fn decode_list<'a>(
    params: impl IntoIterator<Item = &'a Parameter>,
    res: usize,
    index: u64,
    out: &mut Assignment,
) {
    let params: Vec<&Parameter> = params.into_iter().collect();
    let mut rest = index;
    let mut digits = vec![0u64; params.len()];
    for (k, p) in params.iter().enumerate().rev() {
        let size = param_size(p, res).unwrap_or(u64::MAX).max(1);
        digits[k] = rest % size;
        rest /= size;
    }
    for (p, digit) in params.into_iter().zip(digits) {
        decode_param(p, res, digit, out);
    }
}

fn decode_param(p: &Parameter, res: usize, index: u64, out: &mut Assignment) {
    let values = grid_values(&p.kind, res);
    let mut rest = index;
    for v in &values {
        let children = activated(p, v);
        let size = list_size(children.iter().copied(), res).unwrap_or(u64::MAX);
        if rest < size {
            decode_list(children, res, rest, out);
            out.insert(p.id.clone(), v.clone());
            return;
        }
        rest -= size;
    }
    // Only reached for an out-of-range index, which `decode_list` never produces.
    if let Some(v) = values.into_iter().next() {
        out.insert(p.id.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::designer::{Goal, MetricSpec};
    use crate::space::{Child, Scale};
    use std::collections::BTreeSet;

    fn p(id: &str, kind: ParameterKind) -> Parameter {
        Parameter {
            id: id.into(),
            kind,
            children: vec![],
        }
    }

    fn conditional_space() -> SearchSpace {
        let mut kernel = p(
            "kernel",
            ParameterKind::Categorical {
                values: vec!["rbf".into(), "poly".into()],
            },
        );
        kernel.children.push(Child {
            when: vec![Value::Str("poly".into())],
            parameters: vec![p(
                "degree",
                ParameterKind::Integer {
                    min: 2,
                    max: 4,
                    scale: Scale::Linear,
                },
            )],
        });
        SearchSpace {
            parameters: vec![
                p(
                    "c",
                    ParameterKind::Double {
                        min: 1e-3,
                        max: 1e3,
                        scale: Scale::Log,
                    },
                ),
                kernel,
                p(
                    "batch",
                    ParameterKind::Discrete {
                        values: vec![16.0, 32.0],
                        scale: Scale::Linear,
                    },
                ),
            ],
        }
    }

    fn suggest(space: &SearchSpace, first: u64, count: usize) -> Vec<Assignment> {
        let metrics = [MetricSpec {
            id: "m".into(),
            goal: Goal::Minimize,
            safety_threshold: None,
        }];
        let input = DesignerInput {
            space,
            metrics: &metrics,
            completed: &[],
            pending: &[],
            count,
            first_trial_number: first,
            seed: 0,
            previous_state: None,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        };
        GridDesigner::default().suggest(&input).suggestions
    }

    #[test]
    fn conditional_grid_enumerates_each_point_once() {
        let space = conditional_space();
        // c: 10 points; kernel: rbf (1) + poly x degree (3) = 4; batch: 2.
        assert_eq!(grid_size(&space), Some(10 * 4 * 2));
        let points = suggest(&space, 1, 80);
        assert_eq!(points.len(), 80);
        let distinct: BTreeSet<String> = points.iter().map(|a| format!("{a:?}")).collect();
        assert_eq!(distinct.len(), 80, "no duplicates");
        for a in &points {
            assert_eq!(space.check_assignment(a), Ok(()));
        }
        assert_eq!(
            points.iter().filter(|a| a.contains_key("degree")).count(),
            60
        );
    }

    #[test]
    fn past_the_end_returns_fewer_then_no_suggestions() {
        let space = conditional_space();
        assert_eq!(suggest(&space, 78, 5).len(), 3);
        assert!(suggest(&space, 81, 5).is_empty());
        assert_eq!(
            suggest(&space, 78, 5),
            suggest(&space, 1, 80)[77..].to_vec()
        );
    }

    #[test]
    fn log_scaled_doubles_are_spaced_geometrically_with_both_ends() {
        let values = grid_values(
            &ParameterKind::Double {
                min: 1e-3,
                max: 1e3,
                scale: Scale::Log,
            },
            7,
        );
        let xs: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
        let expected = [1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3];
        for (x, e) in xs.iter().zip(expected) {
            assert!((x / e - 1.0).abs() < 1e-9, "{x} vs {e}");
        }
    }

    #[test]
    fn wide_integers_are_capped_at_the_resolution() {
        let narrow = grid_values(
            &ParameterKind::Integer {
                min: 1,
                max: 8,
                scale: Scale::Linear,
            },
            10,
        );
        assert_eq!(narrow.len(), 8);
        let wide = grid_values(
            &ParameterKind::Integer {
                min: 1,
                max: 1024,
                scale: Scale::Log,
            },
            11,
        );
        let ints: Vec<f64> = wide.iter().filter_map(Value::as_f64).collect();
        assert_eq!(
            ints,
            [1., 2., 4., 8., 16., 32., 64., 128., 256., 512., 1024.]
        );
    }

    #[test]
    fn huge_grids_report_no_size_but_still_suggest() {
        let space = SearchSpace {
            parameters: (0..40)
                .map(|i| {
                    p(
                        &format!("x{i}"),
                        ParameterKind::Double {
                            min: 0.0,
                            max: 1.0,
                            scale: Scale::Linear,
                        },
                    )
                })
                .collect(),
        };
        assert_eq!(grid_size(&space), None);
        assert_eq!(suggest(&space, 1, 3).len(), 3);
    }
}
