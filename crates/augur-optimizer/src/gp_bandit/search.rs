//! The population search that maximizes an acquisition over the encoded space (numbers
//! in `[0, 1]`, categoricals as level indices): firefly-style moves towards better
//! individuals plus Gaussian mutations with a shrinking step, then a local search over
//! one-parameter discrete moves, which continuous steps cannot make. The acquisition is
//! any batch scorer (larger is better); `project` makes a point feasible.

use rand::{RngExt, rngs::StdRng};
use rand_distr::{Distribution, StandardNormal};

use crate::gp::encoding::Encoder;

/// Evolves `population` (with its `scores`) for `generations` rounds: each individual
/// moves towards a random better one, if the other is better, plus noise; categorical
/// features copy the attractor's level or jump to a random one. A child replaces its
/// parent only if it scores higher, so no score ever falls.
pub(super) fn evolve(
    population: &mut [Vec<f64>],
    scores: &mut [f64],
    levels: &[Option<usize>],
    generations: usize,
    score: &impl Fn(&[Vec<f64>]) -> Vec<f64>,
    project: &impl Fn(Vec<f64>) -> Vec<f64>,
    rng: &mut StdRng,
) {
    let dim = levels.len();
    for g in 0..generations {
        if crate::cancel::requested() {
            break;
        }
        // Step size shrinks geometrically from 0.2 to about 0.001: global moves first,
        // local refinement at the end. Categorical features jump to a random level with
        // a probability that shrinks likewise, from 0.35 to 0.05.
        let progress = g as f64 / (generations - 1).max(1) as f64;
        let step = 0.2 * (0.005f64).powf(progress);
        let jump = 0.05 + 0.3 * (1.0 - progress);
        let children: Vec<Vec<f64>> = (0..population.len())
            .map(|j| {
                let k = rng.random_range(0..population.len());
                let attract = scores[k] > scores[j];
                let pull: f64 = if attract { rng.random::<f64>() } else { 0.0 };
                let x = (0..dim)
                    .map(|d| match levels[d] {
                        Some(l) => {
                            if rng.random::<f64>() < pull {
                                population[k][d]
                            } else if rng.random::<f64>() < jump / dim as f64 * 2.0 {
                                rng.random_range(0..l.max(1)) as f64
                            } else {
                                population[j][d]
                            }
                        }
                        None => {
                            let noise: f64 = StandardNormal.sample(rng);
                            population[j][d]
                                + pull * (population[k][d] - population[j][d])
                                + step * noise
                        }
                    })
                    .collect();
                project(x)
            })
            .collect();
        let child_scores = score(&children);
        for (j, (child, s)) in children.into_iter().zip(child_scores).enumerate() {
            if s > scores[j] {
                population[j] = child;
                scores[j] = s;
            }
        }
    }
}

/// Hill-climbs each of `starts` (indices into `population`) over its one-parameter
/// discrete moves (other categories, neighbouring integers and discrete values), at most
/// four moves each, taking the best move while it raises the score.
pub(super) fn discrete_local_search(
    population: &mut [Vec<f64>],
    scores: &mut [f64],
    starts: &[usize],
    encoder: &Encoder,
    score: &impl Fn(&[Vec<f64>]) -> Vec<f64>,
) {
    for &j in starts {
        for _ in 0..4 {
            let moves = encoder.discrete_neighbours(&population[j]);
            if moves.is_empty() {
                break;
            }
            let move_scores = score(&moves);
            let Some((b, s)) = move_scores
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
            else {
                break;
            };
            if *s <= scores[j] {
                break;
            }
            population[j] = moves[b].clone();
            scores[j] = *s;
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::space::{Parameter, ParameterKind, Scale, SearchSpace};

    /// A concave score with its maximum at `peak` (doubles) and level 2 of a categorical
    /// feature at index 2, worth 1 over the other levels.
    fn bowl(peak: [f64; 2]) -> impl Fn(&[Vec<f64>]) -> Vec<f64> {
        move |xs: &[Vec<f64>]| {
            xs.iter()
                .map(|x| {
                    let level_bonus = if x[2] == 2.0 { 1.0 } else { 0.0 };
                    level_bonus - (x[0] - peak[0]).powi(2) - (x[1] - peak[1]).powi(2)
                })
                .collect()
        }
    }

    fn project(x: Vec<f64>) -> Vec<f64> {
        vec![
            x[0].clamp(0.0, 1.0),
            x[1].clamp(0.0, 1.0),
            x[2].round().clamp(0.0, 3.0),
        ]
    }

    #[test]
    fn evolution_never_lowers_a_score_and_finds_the_peak_and_the_best_level() {
        let score = bowl([0.3, 0.8]);
        let mut rng = StdRng::seed_from_u64(7);
        let mut population: Vec<Vec<f64>> = (0..32)
            .map(|i| vec![(i % 8) as f64 / 7.0, 0.1, (i % 2) as f64])
            .collect();
        let mut scores = score(&population);
        let before = scores.clone();
        evolve(
            &mut population,
            &mut scores,
            &[None, None, Some(4)],
            30,
            &score,
            &project,
            &mut rng,
        );
        assert!(scores.iter().zip(&before).all(|(a, b)| a >= b));
        assert_eq!(
            scores,
            score(&population),
            "scores stay those of the points"
        );
        let best = (0..population.len())
            .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
            .expect("a population");
        // Level 2 was in no starting point: only the categorical jumps reach it.
        assert_eq!(population[best][2], 2.0);
        // Every start scored at most −0.49 (x₁ = 0.1, a level worth 0); the search ends
        // within 0.1 of the peak (gradient refinement, not this search, polishes further).
        assert!(
            scores[best] > 0.99,
            "{:?} scores {}",
            population[best],
            scores[best]
        );
    }

    #[test]
    fn local_search_climbs_discrete_moves_and_leaves_other_points_alone() {
        let space = SearchSpace {
            parameters: vec![Parameter {
                id: "n".into(),
                kind: ParameterKind::Integer {
                    min: 0,
                    max: 10,
                    scale: Scale::Linear,
                },
                children: vec![],
            }],
        };
        let encoder = Encoder::new(&space);
        let at = |n: i64| encoder.encode(&[("n".to_string(), crate::space::Value::Int(n))].into());
        // Peak at n = 7; a start at n = 2 needs five steps, more than the four allowed.
        let score = |xs: &[Vec<f64>]| -> Vec<f64> {
            xs.iter()
                .map(|x| -(encoder.decode(x)["n"].as_f64().unwrap_or(0.0) - 7.0).abs())
                .collect()
        };
        let mut population = vec![at(5), at(2), at(0)];
        let mut scores = score(&population);
        discrete_local_search(&mut population, &mut scores, &[0, 1], &encoder, &score);
        assert_eq!(population, vec![at(7), at(6), at(0)]);
        assert_eq!(scores, vec![0.0, -1.0, -7.0]);
    }
}
