//! The multi-fidelity bench's two problems, pure and deterministic: a learning-curve benchmark
//! whose structure is known (Hartmann3's final loss, curves that cross), and a real trainer (a
//! one-hidden-layer MLP on two moons) that resumes from its checkpoint as a checkpointing
//! training script does. A trial's metric after epoch `e` is its `loss`; smaller is better.

use augur_optimizer::{Assignment, Parameter, ParameterKind, Scale, SearchSpace};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use rand_distr::StandardNormal;

/// What a trial has trained so far, as a trainer would save it: the epochs done and the
/// weights after the last one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoint {
    pub epoch: u64,
    pub weights: Vec<f64>,
}

/// A problem as the simulated workers see it.
pub trait Problem {
    fn name(&self) -> &'static str;
    fn space(&self) -> SearchSpace;
    /// Trains `parameters` on from `checkpoint` up to epoch `to` (only the epochs it lacks),
    /// updating it; the metric after each new epoch, in order.
    fn train(&self, parameters: &Assignment, checkpoint: &mut Checkpoint, to: u64) -> Vec<f64>;
}

fn double(id: &str, min: f64, max: f64, scale: Scale) -> Parameter {
    Parameter {
        id: id.into(),
        kind: ParameterKind::Double { min, max, scale },
        children: vec![],
    }
}

fn get(a: &Assignment, id: &str) -> f64 {
    a.get(id)
        .and_then(|v| v.as_f64())
        .expect("the simulation only trains complete assignments of its own space")
}

/// Hartmann3's global minimum, at (0.114614, 0.555649, 0.852547).
const HARTMANN3_MIN: f64 = -3.862_782_147_820_756;

/// Hartmann3 on [0, 1]³ (Dixon and Szegő 1978):
/// `f(x) = −Σᵢ αᵢ exp(−Σⱼ Aᵢⱼ (xⱼ − Pᵢⱼ)²)`.
pub fn hartmann3(x: [f64; 3]) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 3]; 4] = [
        [3.0, 10.0, 30.0],
        [0.1, 10.0, 35.0],
        [3.0, 10.0, 30.0],
        [0.1, 10.0, 35.0],
    ];
    const P: [[f64; 3]; 4] = [
        [0.3689, 0.1170, 0.2673],
        [0.4699, 0.4387, 0.7470],
        [0.1091, 0.8732, 0.5547],
        [0.0381, 0.5743, 0.8828],
    ];
    -(0..4)
        .map(|i| {
            let r: f64 = (0..3).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            ALPHA[i] * (-r).exp()
        })
        .sum::<f64>()
}

/// Learning curves over Hartmann3: configuration `x ∈ [0, 1]³` has the loss
/// `final(x) + slowness(x)·(e^−rate(x) − T^−rate(x))` after epoch `e`, where `final(x)` is
/// Hartmann3's regret (so the loss at the full budget `T` is exactly the regret, 0 at best)
/// and `slowness ∈ [0.5, 3]`, `rate ∈ [0.5, 1]` vary with `x` independently of `final`: the
/// curves cross, and a low rung ranks configurations only roughly as the top one does.
pub struct LearningCurves {
    /// The full budget `T` (epochs).
    pub full_budget: u64,
}

impl LearningCurves {
    fn point(a: &Assignment) -> [f64; 3] {
        [get(a, "x0"), get(a, "x1"), get(a, "x2")]
    }

    /// The loss of `a` after `epoch` epochs.
    pub fn loss(&self, a: &Assignment, epoch: u64) -> f64 {
        let x = Self::point(a);
        let final_loss = hartmann3(x) - HARTMANN3_MIN;
        let slowness = 0.5 + 2.5 * (0.5 + 0.5 * (7.0 * x[0] - 5.0 * x[1] + 4.0 * x[2]).sin());
        let rate = 0.5 + 0.5 * (0.5 + 0.5 * (5.0 * x[0] + 3.0 * x[1] + 1.0).cos());
        let t = self.full_budget as f64;
        final_loss + slowness * ((epoch as f64).powf(-rate) - t.powf(-rate))
    }
}

impl Problem for LearningCurves {
    fn name(&self) -> &'static str {
        "curves_hartmann3"
    }

    fn space(&self) -> SearchSpace {
        SearchSpace {
            parameters: (0..3)
                .map(|i| double(&format!("x{i}"), 0.0, 1.0, Scale::Linear))
                .collect(),
        }
    }

    fn train(&self, parameters: &Assignment, checkpoint: &mut Checkpoint, to: u64) -> Vec<f64> {
        let losses = (checkpoint.epoch + 1..=to)
            .map(|e| self.loss(parameters, e))
            .collect();
        checkpoint.epoch = checkpoint.epoch.max(to);
        losses
    }
}

/// A labelled point of the two-moons data set.
struct Example {
    x: [f64; 2],
    y: f64,
}

/// Two interleaved half-moons with Gaussian noise, as `examples/quickstart/train.py` makes.
fn two_moons(n: usize, noise: f64, seed: u64) -> Vec<Example> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let upper = rng.random::<f64>() < 0.5;
            let t = std::f64::consts::PI * rng.random::<f64>();
            let n0: f64 = rng.sample(StandardNormal);
            let n1: f64 = rng.sample(StandardNormal);
            let (x, y) = if upper {
                (t.cos() + 1.0, 0.5 - t.sin())
            } else {
                (t.cos(), t.sin())
            };
            Example {
                x: [x + noise * n0, y + noise * n1],
                y: if upper { 1.0 } else { 0.0 },
            }
        })
        .collect()
}

/// `log(1 + eᶻ)` without overflow.
fn softplus(z: f64) -> f64 {
    z.max(0.0) + (-z.abs()).exp().ln_1p()
}

/// A one-hidden-layer MLP (`tanh`, one logistic output) trained by mini-batch SGD with L2
/// on a seeded two-moons set; the metric is the validation cross-entropy after each epoch.
/// Hyperparameters: `learning_rate` (log), `l2` (log), `hidden` units (integer, log).
///
/// Resuming is exact: the initial weights depend only on the width, and epoch `e` shuffles
/// the training set with a seed of its own, so training 1 → 3 → 9 epochs in three attempts
/// gives the weights of training 9 in one (checked at the driver's start).
pub struct MlpTrainer {
    train: Vec<Example>,
    valid: Vec<Example>,
    batch: usize,
}

impl MlpTrainer {
    pub fn new() -> Self {
        MlpTrainer {
            train: two_moons(256, 0.3, 1),
            valid: two_moons(512, 0.3, 2),
            batch: 8,
        }
    }

    /// Weights laid out as `[W₁ (h × 2), b₁ (h), w₂ (h), b₂]`, `W₁` and `w₂` drawn
    /// `N(0, 1/fan_in)`.
    fn initial_weights(hidden: usize) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(0x5eed + hidden as u64);
        let mut w = vec![0.0; 4 * hidden + 1];
        for v in &mut w[..2 * hidden] {
            *v = rng.sample::<f64, _>(StandardNormal) / 2f64.sqrt();
        }
        for v in &mut w[3 * hidden..4 * hidden] {
            *v = rng.sample::<f64, _>(StandardNormal) / (hidden as f64).sqrt();
        }
        w
    }

    /// The hidden activations and the output logit for `x`.
    fn forward(w: &[f64], hidden: usize, x: [f64; 2], h: &mut [f64]) -> f64 {
        let mut z = w[4 * hidden];
        for j in 0..hidden {
            h[j] = (w[2 * j] * x[0] + w[2 * j + 1] * x[1] + w[2 * hidden + j]).tanh();
            z += w[3 * hidden + j] * h[j];
        }
        z
    }

    /// Mean cross-entropy on the validation set.
    fn validation_loss(&self, w: &[f64], hidden: usize) -> f64 {
        let mut h = vec![0.0; hidden];
        let total: f64 = self
            .valid
            .iter()
            .map(|e| {
                let z = Self::forward(w, hidden, e.x, &mut h);
                softplus(z) - e.y * z
            })
            .sum();
        total / self.valid.len() as f64
    }

    /// One epoch of mini-batch SGD; the order depends on the epoch alone.
    fn epoch(&self, w: &mut [f64], hidden: usize, lr: f64, l2: f64, epoch: u64) {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        order.shuffle(&mut StdRng::seed_from_u64(0xe90c + epoch));
        let mut h = vec![0.0; hidden];
        let mut grad = vec![0.0; w.len()];
        for batch in order.chunks(self.batch) {
            grad.iter_mut().for_each(|g| *g = 0.0);
            for &i in batch {
                let e = &self.train[i];
                let z = Self::forward(w, hidden, e.x, &mut h);
                // d(loss)/dz for the logistic cross-entropy.
                let dz = 1.0 / (1.0 + (-z).exp()) - e.y;
                grad[4 * hidden] += dz;
                for j in 0..hidden {
                    grad[3 * hidden + j] += dz * h[j];
                    let da = dz * w[3 * hidden + j] * (1.0 - h[j] * h[j]);
                    grad[2 * j] += da * e.x[0];
                    grad[2 * j + 1] += da * e.x[1];
                    grad[2 * hidden + j] += da;
                }
            }
            let scale = 1.0 / batch.len() as f64;
            for (wi, gi) in w.iter_mut().zip(&grad) {
                *wi -= lr * (gi * scale + l2 * *wi);
            }
        }
    }
}

impl Problem for MlpTrainer {
    fn name(&self) -> &'static str {
        "mlp_two_moons"
    }

    fn space(&self) -> SearchSpace {
        SearchSpace {
            parameters: vec![
                double("learning_rate", 1e-3, 1.0, Scale::Log),
                double("l2", 1e-6, 1e-1, Scale::Log),
                Parameter {
                    id: "hidden".into(),
                    kind: ParameterKind::Integer {
                        min: 2,
                        max: 64,
                        scale: Scale::Log,
                    },
                    children: vec![],
                },
            ],
        }
    }

    fn train(&self, parameters: &Assignment, checkpoint: &mut Checkpoint, to: u64) -> Vec<f64> {
        let lr = get(parameters, "learning_rate");
        let l2 = get(parameters, "l2");
        let hidden = get(parameters, "hidden") as usize;
        if checkpoint.weights.is_empty() {
            checkpoint.weights = Self::initial_weights(hidden);
        }
        let mut losses = Vec::new();
        for e in checkpoint.epoch + 1..=to {
            self.epoch(&mut checkpoint.weights, hidden, lr, l2, e);
            checkpoint.epoch = e;
            losses.push(self.validation_loss(&checkpoint.weights, hidden));
        }
        losses
    }
}
