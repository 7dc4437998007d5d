//! The public benchmark suite (`shared/reference/README.md`): Branin, Hartmann6,
//! Rosenbrock 4D, Ackley 5D on the asymmetric box [−5, 10]^5, Levy 10D. All minimized;
//! simple regret = best value found − `optimum`. Used by the statistical tests, the latency
//! bench and the quality bench (`examples/quality.rs`).

use crate::space::{Assignment, Parameter, ParameterKind, Scale, SearchSpace};

/// One benchmark function over a box.
#[derive(Debug, Clone, Copy)]
pub struct TestFunction {
    pub name: &'static str,
    /// Bounds per coordinate.
    pub bounds: &'static [(f64, f64)],
    /// The global minimum f*.
    pub optimum: f64,
    /// The trial budget of the protocol.
    pub budget: usize,
    pub f: fn(&[f64]) -> f64,
}

impl TestFunction {
    pub fn dim(&self) -> usize {
        self.bounds.len()
    }

    /// The search space: one linear double `x0..x{d-1}` per coordinate.
    pub fn space(&self) -> SearchSpace {
        SearchSpace {
            parameters: self
                .bounds
                .iter()
                .enumerate()
                .map(|(i, &(min, max))| Parameter {
                    id: format!("x{i}"),
                    kind: ParameterKind::Double {
                        min,
                        max,
                        scale: Scale::Linear,
                    },
                    children: vec![],
                })
                .collect(),
        }
    }

    /// The function's value at an assignment of [`TestFunction::space`] (missing
    /// coordinates read as the box's lower bound).
    pub fn evaluate(&self, a: &Assignment) -> f64 {
        let x: Vec<f64> = (0..self.dim())
            .map(|i| {
                a.get(&format!("x{i}"))
                    .and_then(|v| v.as_f64())
                    .unwrap_or(self.bounds[i].0)
            })
            .collect();
        (self.f)(&x)
    }
}

pub const BRANIN: TestFunction = TestFunction {
    name: "branin",
    bounds: &[(-5.0, 10.0), (0.0, 15.0)],
    optimum: 0.397_887_357_729_738,
    budget: 50,
    f: branin,
};
pub const HARTMANN6: TestFunction = TestFunction {
    name: "hartmann6",
    bounds: &[(0.0, 1.0); 6],
    optimum: -3.322_368_011_415_51,
    budget: 100,
    f: hartmann6,
};
pub const ROSENBROCK4: TestFunction = TestFunction {
    name: "rosenbrock4",
    bounds: &[(-2.0, 2.0); 4],
    optimum: 0.0,
    budget: 50,
    f: rosenbrock,
};
pub const ACKLEY5: TestFunction = TestFunction {
    name: "ackley5",
    bounds: &[(-5.0, 10.0); 5],
    optimum: 0.0,
    budget: 50,
    f: ackley,
};
pub const LEVY10: TestFunction = TestFunction {
    name: "levy10",
    bounds: &[(-10.0, 10.0); 10],
    optimum: 0.0,
    budget: 100,
    f: levy,
};

/// The whole suite, in the reference order.
pub const SUITE: [TestFunction; 5] = [BRANIN, HARTMANN6, ROSENBROCK4, ACKLEY5, LEVY10];

/// `a(x2 − b x1² + c x1 − r)² + s(1 − t) cos x1 + s`, with the standard constants.
pub fn branin(x: &[f64]) -> f64 {
    let (a, b, c) = (
        1.0,
        5.1 / (4.0 * std::f64::consts::PI.powi(2)),
        5.0 / std::f64::consts::PI,
    );
    let (r, s, t) = (6.0, 10.0, 1.0 / (8.0 * std::f64::consts::PI));
    a * (x[1] - b * x[0] * x[0] + c * x[0] - r).powi(2) + s * (1.0 - t) * x[0].cos() + s
}

/// `−Σ_i α_i exp(−Σ_j A_ij (x_j − P_ij)²)` with the standard A, P, α.
pub fn hartmann6(x: &[f64]) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    -(0..4)
        .map(|i| {
            let inner: f64 = (0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            ALPHA[i] * (-inner).exp()
        })
        .sum::<f64>()
}

/// `Σ 100(x_{i+1} − x_i²)² + (1 − x_i)²`.
pub fn rosenbrock(x: &[f64]) -> f64 {
    x.windows(2)
        .map(|w| 100.0 * (w[1] - w[0] * w[0]).powi(2) + (1.0 - w[0]).powi(2))
        .sum()
}

/// `−a exp(−b √(mean x²)) − exp(mean cos(c x)) + a + e`, a = 20, b = 0.2, c = 2π.
pub fn ackley(x: &[f64]) -> f64 {
    let n = x.len() as f64;
    let sq = x.iter().map(|v| v * v).sum::<f64>() / n;
    let cs = x
        .iter()
        .map(|v| (2.0 * std::f64::consts::PI * v).cos())
        .sum::<f64>()
        / n;
    -20.0 * (-0.2 * sq.sqrt()).exp() - cs.exp() + 20.0 + std::f64::consts::E
}

/// Levy: `sin²(πw_1) + Σ (w_i − 1)²(1 + 10 sin²(πw_i + 1)) + (w_d − 1)²(1 + sin²(2πw_d))`,
/// `w_i = 1 + (x_i − 1)/4`.
pub fn levy(x: &[f64]) -> f64 {
    use std::f64::consts::PI;
    let w: Vec<f64> = x.iter().map(|v| 1.0 + (v - 1.0) / 4.0).collect();
    let d = w.len();
    let mid: f64 = w[..d - 1]
        .iter()
        .map(|wi| (wi - 1.0).powi(2) * (1.0 + 10.0 * (PI * wi + 1.0).sin().powi(2)))
        .sum();
    (PI * w[0]).sin().powi(2)
        + mid
        + (w[d - 1] - 1.0).powi(2) * (1.0 + (2.0 * PI * w[d - 1]).sin().powi(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_minimizers_reach_the_stated_optimum() {
        assert!((branin(&[std::f64::consts::PI, 2.275]) - BRANIN.optimum).abs() < 1e-6);
        let h = [0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573];
        assert!((hartmann6(&h) - HARTMANN6.optimum).abs() < 1e-4);
        assert!(rosenbrock(&[1.0; 4]).abs() < 1e-12);
        assert!(ackley(&[0.0; 5]).abs() < 1e-12);
        assert!(levy(&[1.0; 10]).abs() < 1e-12);
    }
}
