//! The public benchmark suite (`shared/reference/README.md`), all minimized: simple regret =
//! best value found − `optimum`. Used by the statistical tests, the latency bench and the
//! quality bench (`examples/quality.rs`).

use crate::space::{Assignment, Child, Parameter, ParameterKind, Scale, SearchSpace, Value};

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

/// Levy 10D on [−10, 20]^10: the optimum (x = 1) is far from the centre (x = 5, where
/// Levy is about 20, against 1.44 at the centre of the public box).
pub const LEVY10_OFFCENTRE: TestFunction = TestFunction {
    name: "levy10_offcentre",
    bounds: &[(-10.0, 20.0); 10],
    optimum: 0.0,
    budget: 100,
    f: levy,
};
/// Rosenbrock 6D on [−3, 7]^6: the optimum (x = 1) is far from the centre (x = 2, value
/// 405 against 3 at the centre of the public 4D box).
pub const ROSENBROCK6_OFFCENTRE: TestFunction = TestFunction {
    name: "rosenbrock6_offcentre",
    bounds: &[(-3.0, 7.0); 6],
    optimum: 0.0,
    budget: 100,
    f: rosenbrock,
};

/// The whole suite, in the reference order.
///
/// The suite: Branin, Hartmann6, Rosenbrock 4D, Ackley 5D on the asymmetric box [−5, 10]^5,
/// Levy 10D; off-centre boxes of Levy and Rosenbrock (the optimum far from the box centre, so
/// that a designer gains nothing by trying the centre); and mixed-space problems with
/// categorical, log-scaled integer and conditional parameters ([`MIXED_SUITE`]).
/// `benches/quality/reference.py` defines the same functions for the Python references, and
/// both check the values at the points of [`AGREEMENT_POINTS`].
pub const SUITE: [TestFunction; 7] = [
    BRANIN,
    HARTMANN6,
    ROSENBROCK4,
    ACKLEY5,
    LEVY10,
    LEVY10_OFFCENTRE,
    ROSENBROCK6_OFFCENTRE,
];

/// A benchmark problem over an arbitrary (mixed, conditional) search space.
#[derive(Debug, Clone, Copy)]
pub struct MixedFunction {
    pub name: &'static str,
    pub space: fn() -> SearchSpace,
    /// The objective at a valid assignment of `space()`.
    pub f: fn(&Assignment) -> f64,
    /// The global minimum f*, found by [`MixedFunction::exhaustive_optimum`].
    pub optimum: f64,
    pub budget: usize,
}

/// A model training run's shape: `lr` (log double), `batch` (log integer 16..1024),
/// `optimizer` (categorical sgd/adam/rmsprop) whose value moves the optimal `lr` and
/// `batch`, `momentum` (active only with sgd, and moving sgd's optimal `lr`), `dropout`
/// (linear double) and `layers` (integer 1..8):
/// `f = base + 0.6 (log10 lr − l*)² + 0.05 (log2 batch − b*)² + 1.5 (dropout − 0.25)²
///      + 0.02 (layers − 3.6)²`, with per optimizer
/// sgd: `base = −0.1 + 0.6 (momentum − 0.9)²`, `l* = −1.2 + log10(1 − momentum)`, `b* = 8.4`;
/// adam: `base = 0`, `l* = −3.3`, `b* = 6.3`; rmsprop: `base = 0.15`, `l* = −2.8`, `b* = 7`.
/// The best branch (sgd with momentum 0.9) must be found through the conditional
/// parameter; adam is an easy trap 0.1 above it.
pub const TRAIN5: MixedFunction = MixedFunction {
    name: "mixed_train5",
    space: train5_space,
    f: train5,
    optimum: -0.096_799_961_329_591_29,
    budget: 50,
};

/// Ackley over a categorical `level` (a, b, c, d) that moves the optimum of three doubles
/// `x0..x2` and two integers `n0, n1`, all on [−5, 10]: `f = ackley(v − s_level) + o_level`
/// with shifts `s = (−2, 3.3, 6, 0.5)` and offsets `o = (0.6, 0, 0.3, 0.9)`. Level `b` has
/// the lowest offset, but its integers cannot reach 3.3 (its best is 2.43), so f* = 0.3 at
/// level `c` with every coordinate at 6, as exhaustive search confirms.
pub const ACKLEY_MIXED6: MixedFunction = MixedFunction {
    name: "mixed_ackley6",
    space: ackley_mixed_space,
    f: ackley_mixed,
    optimum: 0.300_000_000_000_000_4,
    budget: 50,
};

/// The mixed-space problems.
pub const MIXED_SUITE: [MixedFunction; 2] = [TRAIN5, ACKLEY_MIXED6];

fn double(id: &str, min: f64, max: f64, scale: Scale) -> Parameter {
    Parameter {
        id: id.into(),
        kind: ParameterKind::Double { min, max, scale },
        children: vec![],
    }
}

fn integer(id: &str, min: i64, max: i64, scale: Scale) -> Parameter {
    Parameter {
        id: id.into(),
        kind: ParameterKind::Integer { min, max, scale },
        children: vec![],
    }
}

fn categorical(id: &str, values: &[&str]) -> Parameter {
    Parameter {
        id: id.into(),
        kind: ParameterKind::Categorical {
            values: values.iter().map(|v| v.to_string()).collect(),
        },
        children: vec![],
    }
}

fn train5_space() -> SearchSpace {
    let mut optimizer = categorical("optimizer", &["sgd", "adam", "rmsprop"]);
    optimizer.children.push(Child {
        when: vec![Value::Str("sgd".into())],
        parameters: vec![double("momentum", 0.0, 0.99, Scale::Linear)],
    });
    SearchSpace {
        parameters: vec![
            double("lr", 1e-5, 1.0, Scale::Log),
            integer("batch", 16, 1024, Scale::Log),
            optimizer,
            double("dropout", 0.0, 0.8, Scale::Linear),
            integer("layers", 1, 8, Scale::Linear),
        ],
    }
}

fn num(a: &Assignment, id: &str) -> f64 {
    a.get(id).and_then(Value::as_f64).unwrap_or(0.0)
}

fn cat<'a>(a: &'a Assignment, id: &str) -> &'a str {
    match a.get(id) {
        Some(Value::Str(s)) => s,
        _ => "",
    }
}

fn train5(a: &Assignment) -> f64 {
    let (base, lstar, bstar) = match cat(a, "optimizer") {
        "sgd" => {
            let m = num(a, "momentum");
            (
                -0.1 + 0.6 * (m - 0.9).powi(2),
                -1.2 + (1.0 - m).log10(),
                8.4,
            )
        }
        "adam" => (0.0, -3.3, 6.3),
        _ => (0.15, -2.8, 7.0),
    };
    base + 0.6 * (num(a, "lr").log10() - lstar).powi(2)
        + 0.05 * (num(a, "batch").log2() - bstar).powi(2)
        + 1.5 * (num(a, "dropout") - 0.25).powi(2)
        + 0.02 * (num(a, "layers") - 3.6).powi(2)
}

const ACKLEY_SHIFTS: [f64; 4] = [-2.0, 3.3, 6.0, 0.5];
const ACKLEY_OFFSETS: [f64; 4] = [0.6, 0.0, 0.3, 0.9];

fn ackley_mixed_space() -> SearchSpace {
    SearchSpace {
        parameters: vec![
            categorical("level", &["a", "b", "c", "d"]),
            double("x0", -5.0, 10.0, Scale::Linear),
            double("x1", -5.0, 10.0, Scale::Linear),
            double("x2", -5.0, 10.0, Scale::Linear),
            integer("n0", -5, 10, Scale::Linear),
            integer("n1", -5, 10, Scale::Linear),
        ],
    }
}

fn ackley_mixed(a: &Assignment) -> f64 {
    let level = match cat(a, "level") {
        "a" => 0,
        "b" => 1,
        "c" => 2,
        _ => 3,
    };
    let s = ACKLEY_SHIFTS[level];
    let v: Vec<f64> = ["x0", "x1", "x2", "n0", "n1"]
        .iter()
        .map(|id| num(a, id) - s)
        .collect();
    ackley(&v) + ACKLEY_OFFSETS[level]
}

impl MixedFunction {
    /// f* by exhaustive search over the discrete part (every categorical level and every
    /// integer value), with the continuous part at its known minimizer given the discrete
    /// part (both problems are built so that it is known in closed form).
    pub fn exhaustive_optimum(&self) -> f64 {
        let mut best = f64::INFINITY;
        match self.name {
            "mixed_train5" => {
                for opt in ["sgd", "adam", "rmsprop"] {
                    for batch in 16..=1024i64 {
                        for layers in 1..=8i64 {
                            let lstar = match opt {
                                "sgd" => -1.2 + (1.0f64 - 0.9).log10(),
                                "adam" => -3.3,
                                _ => -2.8,
                            };
                            let mut a = Assignment::new();
                            a.insert("optimizer".into(), Value::Str(opt.into()));
                            a.insert("lr".into(), Value::Float(10f64.powf(lstar)));
                            a.insert("batch".into(), Value::Int(batch));
                            a.insert("dropout".into(), Value::Float(0.25));
                            a.insert("layers".into(), Value::Int(layers));
                            if opt == "sgd" {
                                a.insert("momentum".into(), Value::Float(0.9));
                            }
                            best = best.min(train5(&a));
                        }
                    }
                }
            }
            _ => {
                for (level, s) in ["a", "b", "c", "d"].iter().zip(ACKLEY_SHIFTS) {
                    for n0 in -5..=10i64 {
                        for n1 in -5..=10i64 {
                            let mut a = Assignment::new();
                            a.insert("level".into(), Value::Str(level.to_string()));
                            for id in ["x0", "x1", "x2"] {
                                a.insert(id.into(), Value::Float(s));
                            }
                            a.insert("n0".into(), Value::Int(n0));
                            a.insert("n1".into(), Value::Int(n1));
                            best = best.min(ackley_mixed(&a));
                        }
                    }
                }
            }
        }
        best
    }
}

/// Points (as JSON objects) and the values both implementations must give there;
/// `reference.py --self-test` checks the same table.
pub const AGREEMENT_POINTS: [(&str, &str, f64); 6] = [
    (
        "mixed_train5",
        r#"{"lr": 0.001, "batch": 64, "optimizer": "sgd", "momentum": 0.5, "dropout": 0.1, "layers": 2}"#,
        1.717_096_644_339_474_2,
    ),
    (
        "mixed_train5",
        r#"{"lr": 0.0005, "batch": 512, "optimizer": "adam", "dropout": 0.7, "layers": 8}"#,
        1.055_450_636_534_640_8,
    ),
    (
        "mixed_train5",
        r#"{"lr": 0.2, "batch": 16, "optimizer": "rmsprop", "dropout": 0.0, "layers": 1}"#,
        3.477_546_225_607_873_5,
    ),
    (
        "mixed_ackley6",
        r#"{"level": "b", "x0": 3.3, "x1": 3.3, "x2": 3.3, "n0": 3, "n1": 4}"#,
        2.425_012_541_648_815_7,
    ),
    (
        "mixed_ackley6",
        r#"{"level": "a", "x0": 0.0, "x1": -1.5, "x2": 7.25, "n0": -5, "n1": 10}"#,
        16.863_527_155_910_973,
    ),
    (
        "levy10_offcentre",
        r#"{"x0": 5, "x1": 5, "x2": 5, "x3": 5, "x4": 5, "x5": 5, "x6": 5, "x7": 5, "x8": 5, "x9": 5}"#,
        73.726_607_644_621_4,
    ),
];

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
/// The latency benches' fixture (`benches/suggest.rs`, `examples/suggest_cpu.rs`): `d`
/// doubles `x0..` on Levy's box [−10, 10], and `n` completed trials at quasi-random points
/// (seed 7) scored by Levy as metric `y`.
pub fn levy_history(d: usize, n: u64) -> (SearchSpace, Vec<crate::designer::CompletedTrial>) {
    let space = SearchSpace {
        parameters: (0..d)
            .map(|i| Parameter {
                id: format!("x{i}"),
                kind: ParameterKind::Double {
                    min: -10.0,
                    max: 10.0,
                    scale: Scale::Linear,
                },
                children: vec![],
            })
            .collect(),
    };
    let completed = (0..n)
        .map(|k| {
            let a = crate::quasi_random::quasi_random_assignment(&space, 7, k);
            let x: Vec<f64> = (0..d)
                .map(|i| a[&format!("x{i}")].as_f64().unwrap_or(0.0))
                .collect();
            crate::designer::CompletedTrial {
                parameters: a,
                outcome: crate::designer::Outcome::Measured(std::collections::BTreeMap::from([(
                    "y".to_string(),
                    levy(&x),
                )])),
            }
        })
        .collect();
    (space, completed)
}

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

    #[test]
    fn mixed_problems_state_the_optimum_that_exhaustive_search_finds() {
        for f in MIXED_SUITE {
            let found = f.exhaustive_optimum();
            assert!(
                (found - f.optimum).abs() < 1e-9,
                "{}: {found} vs {}",
                f.name,
                f.optimum
            );
        }
    }

    #[test]
    fn agreement_points_are_valid_and_give_the_shared_values() {
        type Evaluate = Box<dyn Fn(&Assignment) -> f64>;
        let all = |name: &str| -> (SearchSpace, Evaluate) {
            if let Some(f) = MIXED_SUITE.iter().find(|f| f.name == name) {
                let f = *f;
                return ((f.space)(), Box::new(move |a| (f.f)(a)));
            }
            let f = *SUITE
                .iter()
                .find(|f| f.name == name)
                .expect("known function");
            (f.space(), Box::new(move |a| f.evaluate(a)))
        };
        for (name, point, value) in AGREEMENT_POINTS {
            let a: Assignment = serde_json::from_str(point).expect("a JSON object");
            let (space, f) = all(name);
            assert_eq!(space.check_assignment(&a), Ok(()), "{name} {point}");
            let got = f(&a);
            assert!(
                (got - value).abs() < 1e-9 * value.abs().max(1.0),
                "{name} {point}: {got} vs {value}"
            );
        }
    }
}
