//! Study specs for tests, as the JSON a client sends: `spec` with every parameter type,
//! `x_spec` with one double for tests about anything but the search space.

use serde_json::{Value, json};

/// A small spec with every parameter type and a conditional child.
pub fn spec(algorithm: &str, max_trials: i64, parallel_trials: i64) -> Value {
    json!({
        "name": format!("{algorithm}-test"),
        "algorithm": algorithm,
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [
            {"id": "lr", "type": "double", "min": 0.0001, "max": 1.0, "scale": "log"},
            {"id": "layers", "type": "integer", "min": 1, "max": 8},
            {"id": "batch", "type": "discrete", "values": [16, 32, 64, 128]},
            {"id": "kernel", "type": "categorical", "values": ["rbf", "poly"],
             "children": [{"when": ["poly"], "parameters": [{"id": "degree", "type": "integer", "min": 2, "max": 5}]}]}
        ],
        "max_trials": max_trials,
        "parallel_trials": parallel_trials,
        "seed": 7
    })
}

/// The smallest spec: random search over one double `x` in [0, 1], for tests about anything
/// but the search space; `metric` is `(id, goal)`. Change other fields with `spec["…"] = …`.
pub fn x_spec(
    name: &str,
    metric: (&str, &str),
    max_trials: i64,
    parallel_trials: i64,
    seed: i64,
) -> Value {
    json!({
        "name": name, "algorithm": "random",
        "metrics": [{"id": metric.0, "goal": metric.1}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": max_trials, "parallel_trials": parallel_trials, "seed": seed
    })
}
