//! Quasi-random search: an Owen-scrambled Sobol sequence (Burley 2020, via `sobol_burley`).

use std::collections::HashMap;

use crate::designer::{Designer, DesignerInput, DesignerOutput, trial_seed};
use crate::space::{Assignment, SearchSpace};

/// Points per scrambled sequence: `sobol_burley` supports indices below 2^16. Past that we
/// continue with an independently scrambled sequence (a fresh seed per block), which keeps
/// each block of 2^16 points low-discrepancy.
const BLOCK: u64 = 1 << 16;
/// Dimensions per scrambled sequence (`sobol_burley::NUM_DIMENSIONS`); higher dimensions
/// reuse the direction numbers with an independent scramble seed.
const DIMS: u64 = sobol_burley::NUM_DIMENSIONS as u64;

/// Coordinate `dimension` of point `index` of the scrambled Sobol sequence for `seed`, in
/// [0, 1). Deterministic and O(1).
pub fn sobol_coordinate(seed: u64, index: u64, dimension: u64) -> f64 {
    let block = index / BLOCK;
    let dim_block = dimension / DIMS;
    // Fold the 64-bit study seed and the block numbers into the 32-bit scramble seed.
    let mixed = trial_seed(seed ^ dim_block.wrapping_mul(0xA24B_AED4_963E_E407), block);
    let seed32 = (mixed ^ (mixed >> 32)) as u32;
    let u = sobol_burley::sample((index % BLOCK) as u32, (dimension % DIMS) as u32, seed32);
    f64::from(u)
}

/// Point `index` of the scrambled Sobol sequence in `[0, 1)^dims`.
pub fn sobol_point(seed: u64, index: u64, dims: usize) -> Vec<f64> {
    (0..dims as u64)
        .map(|d| sobol_coordinate(seed, index, d))
        .collect()
}

/// The assignment at sequence position `index` (0-based) for `space`.
///
/// Trial number `n` gets point `n - 1` of the sequence, so suggestions depend only on
/// `(seed, trial number)` and are cheap enough to compute inside the slot-claiming
/// transaction. Every parameter of the tree (in [`SearchSpace::all_parameters`] order) owns
/// one fixed dimension, used only when the parameter is active, so conditional spaces keep
/// the low-discrepancy property within each branch. Categoricals take bucket
/// `floor(u * k)` of their coordinate, integers and discrete values snap to the nearest
/// feasible value (see [`crate::space::ParameterKind::from_unit`]).
pub fn quasi_random_assignment(space: &SearchSpace, seed: u64, index: u64) -> Assignment {
    let dims: HashMap<&str, u64> = space
        .all_parameters()
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p.id.as_str(), i as u64))
        .collect();
    space.sample_with(|p| {
        let d = dims.get(p.id.as_str()).copied().unwrap_or(0);
        p.kind.from_unit(sobol_coordinate(seed, index, d))
    })
}

pub struct QuasiRandomDesigner;

impl Designer for QuasiRandomDesigner {
    fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput {
        let start = input.first_trial_number.saturating_sub(1);
        let suggestions = (0..input.count as u64)
            .map(|i| quasi_random_assignment(input.space, input.seed, start + i))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::designer::MetricSpec;
    use crate::space::{Child, Parameter, ParameterKind, Scale, Value};
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    fn p(id: &str, kind: ParameterKind) -> Parameter {
        Parameter {
            id: id.into(),
            kind,
            children: vec![],
        }
    }

    fn mixed_space() -> SearchSpace {
        let mut kernel = p(
            "kernel",
            ParameterKind::Categorical {
                values: vec!["rbf".into(), "poly".into(), "linear".into()],
            },
        );
        kernel.children.push(Child {
            when: vec![Value::Str("poly".into())],
            parameters: vec![p(
                "degree",
                ParameterKind::Integer {
                    min: 2,
                    max: 5,
                    scale: Scale::Linear,
                },
            )],
        });
        SearchSpace {
            parameters: vec![
                p(
                    "lr",
                    ParameterKind::Double {
                        min: 1e-5,
                        max: 1.0,
                        scale: Scale::Log,
                    },
                ),
                p(
                    "momentum",
                    ParameterKind::Double {
                        min: 0.5,
                        max: 0.999,
                        scale: Scale::ReverseLog,
                    },
                ),
                p(
                    "batch",
                    ParameterKind::Discrete {
                        values: vec![16.0, 32.0, 64.0, 128.0],
                        scale: Scale::Log,
                    },
                ),
                kernel,
            ],
        }
    }

    fn suggest(space: &SearchSpace, seed: u64, first: u64, count: usize) -> Vec<Assignment> {
        let metrics = [MetricSpec {
            id: "m".into(),
            goal: crate::Goal::Minimize,
            safety_threshold: None,
        }];
        let input = DesignerInput {
            space,
            metrics: &metrics,
            completed: &[],
            pending: &[],
            count,
            first_trial_number: first,
            seed,
            previous_state: None,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        };
        QuasiRandomDesigner.suggest(&input).suggestions
    }

    #[test]
    fn every_point_is_a_valid_assignment_including_conditional_children() {
        let space = mixed_space();
        let points = suggest(&space, 3, 1, 200);
        assert_eq!(points.len(), 200);
        let mut saw_degree = false;
        for a in &points {
            assert_eq!(space.check_assignment(a), Ok(()));
            saw_degree |= a.contains_key("degree");
        }
        assert!(saw_degree, "the conditional child is reached");
        let kernels: std::collections::BTreeSet<_> = points
            .iter()
            .map(|a| format!("{:?}", a["kernel"]))
            .collect();
        assert_eq!(kernels.len(), 3, "every category is visited");
    }

    #[test]
    fn same_seed_and_trial_number_give_the_same_point_whatever_the_batching() {
        let space = mixed_space();
        let one_batch = suggest(&space, 11, 1, 10);
        let mut piecewise = suggest(&space, 11, 1, 4);
        piecewise.extend(suggest(&space, 11, 5, 6));
        assert_eq!(one_batch, piecewise);
        assert_ne!(one_batch, suggest(&space, 12, 1, 10), "the seed matters");
    }

    /// Empty cells of an 8x8 grid after 64 points: a (0, 6, 2)-net leaves none, while
    /// uniform random points leave about 64 * (63/64)^64 ≈ 23.
    fn empty_cells(points: &[(f64, f64)]) -> usize {
        let mut hit = [[false; 8]; 8];
        for &(x, y) in points {
            hit[(x * 8.0) as usize][(y * 8.0) as usize] = true;
        }
        hit.iter().flatten().filter(|h| !**h).count()
    }

    #[test]
    fn sixty_four_points_cover_the_square_better_than_random() {
        for seed in 0..5 {
            let sobol: Vec<_> = (0..64)
                .map(|i| (sobol_coordinate(seed, i, 0), sobol_coordinate(seed, i, 1)))
                .collect();
            let mut rng = StdRng::seed_from_u64(seed);
            let random: Vec<_> = (0..64)
                .map(|_| (rng.random::<f64>(), rng.random::<f64>()))
                .collect();
            assert_eq!(empty_cells(&sobol), 0, "seed {seed}");
            assert!(empty_cells(&random) > 10, "seed {seed}");
        }
    }

    #[test]
    fn coordinates_stay_in_the_unit_interval_past_the_sequence_limits() {
        for index in [0, 1, BLOCK - 1, BLOCK, 3 * BLOCK + 7] {
            for dim in [0, 1, DIMS - 1, DIMS, 3 * DIMS + 1] {
                let u = sobol_coordinate(9, index, dim);
                assert!((0.0..1.0).contains(&u));
            }
        }
    }
}
