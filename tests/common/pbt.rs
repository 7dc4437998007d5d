//! Population-based training as the tests train it: one population (4 trials, lr from
//! 0.001 to 1, segments of 2 epochs up to 6), a trainer whose checkpoint is a model state,
//! and the checks of a finished study against what its trainers did.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{TestApp, routes};

/// The factor the trainer's model state `w` falls by per epoch at learning rate `lr` (best
/// at 0.3), as `tests/jobs/pbt.rs`'s Python trainer computes it.
pub fn decay(lr: f64) -> f64 {
    1.0 - 0.5 * (-(lr / 0.3).ln().powi(2) / 2.0).exp()
}

/// One launch of the trainer, as it logged it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Launch {
    pub from: u64,
    pub to: u64,
    pub lr: f64,
    pub w_from: f64,
    pub w_to: f64,
    pub origin: i64,
}

pub fn launches(trained: &std::path::Path) -> BTreeMap<i64, Vec<Launch>> {
    let mut launches: BTreeMap<i64, Vec<Launch>> = BTreeMap::new();
    for line in std::fs::read_to_string(trained).expect("trained").lines() {
        let l: Value = serde_json::from_str(line).expect("json line");
        let number = |k: &str| l[k].as_f64().unwrap_or_else(|| panic!("{k} in {l}"));
        launches
            .entry(l["trial"].as_i64().expect("trial"))
            .or_default()
            .push(Launch {
                from: number("from") as u64,
                to: number("to") as u64,
                lr: number("lr"),
                w_from: number("w_from"),
                w_to: number("w_to"),
                origin: l["origin"].as_i64().expect("origin"),
            });
    }
    launches
}

/// The population every PBT test trains, run by `trial_job` (`Value::Null`: by ask/tell
/// clients).
pub fn population_spec(trial_job: Value) -> Value {
    json!({
        "name": "pbt",
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "lr", "type": "double", "min": 0.001, "max": 1, "scale": "log"}],
        "max_trials": 4,
        "parallel_trials": 2,
        "seed": 5,
        "fidelity": {"argument": "epochs", "min": 2, "max": 6},
        "scheduler": "pbt",
        "pbt": {"quantile_fraction": 0.25, "resample_probability": 0},
        "trial_job": trial_job
    })
}

/// A completed study of [`population_spec`] checked against its trainers' `launches` by
/// trial: every launch from where its checkpoint was, the worst copying the best at each
/// segment's end with its lr explored, the others going on alone, the lineage recording it.
/// Returns the exploits, `(copier, parent, at epoch)`.
pub async fn check_population(
    app: &TestApp,
    id: i64,
    study: &Value,
    launches: &BTreeMap<i64, Vec<Launch>>,
) -> Vec<(i64, i64, u64)> {
    assert_eq!(study["trial_counts"]["completed"], 4, "{study}");
    assert_eq!(launches.len(), 4, "the population, no more: {launches:?}");
    // Every trial trained 0-2, 2-4, 4-6: each launch from where its checkpoint was.
    for (trial, ls) in launches {
        let ranges: Vec<(u64, u64)> = ls.iter().map(|l| (l.from, l.to)).collect();
        assert_eq!(ranges, [(0, 2), (2, 4), (4, 6)], "trial {trial}");
    }
    let trials = app.get(&routes::trials(id)).await.body;
    let trial_json = |n: i64| -> Value {
        trials["trials"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["id"] == n))
            .cloned()
            .expect("trial")
    };
    let mut exploits = Vec::new();
    for (segment, end) in [(0, 2), (1, 4)] {
        // The segment's results, best first.
        let mut ranked: Vec<(f64, i64)> = launches
            .iter()
            .map(|(t, ls)| (ls[segment].w_to, *t))
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (best, worst) = (ranked[0].1, ranked[3].1);
        exploits.push((worst, best, end));
        for (trial, ls) in launches {
            let next = &ls[segment + 1];
            if *trial == worst {
                let parent = &launches[&best][segment];
                assert_eq!(
                    next.origin, best,
                    "epoch {end}: trial {trial} copies {best}"
                );
                assert_eq!(
                    next.w_from, parent.w_to,
                    "epoch {end}: the copy is the parent's checkpoint at {end}, before it trained on"
                );
                let ratio = next.lr / parent.lr;
                assert!(
                    (ratio - 0.8).abs() < 1e-9 || (ratio - 1.2).abs() < 1e-9 || next.lr == 1.0,
                    "epoch {end}: lr {} explored from the parent's {}",
                    next.lr,
                    parent.lr
                );
            } else {
                assert_eq!(
                    next.origin, *trial,
                    "epoch {end}: trial {trial} goes on alone"
                );
                assert_eq!(next.w_from, ls[segment].w_to, "epoch {end}: trial {trial}");
                assert_eq!(next.lr, ls[segment].lr, "trial {trial} keeps its values");
            }
        }
        // The lineage shows it: a segment from the parent at this budget, with the values
        // the trainer got.
        let lineage = &trial_json(worst)["lineage"]["segments"];
        let from_parent = lineage
            .as_array()
            .and_then(|s| s.iter().find(|s| s["from_budget"] == end))
            .unwrap_or_else(|| panic!("epoch {end}: no segment in {lineage}"));
        assert_eq!(from_parent["parent"], best, "{lineage}");
        assert_eq!(
            from_parent["parameters"]["lr"].as_f64(),
            Some(launches[&worst][segment + 1].lr),
            "{lineage}"
        );
    }
    // Nothing is left to copy, and the best is measured at the full budget.
    for t in trials["trials"].as_array().expect("trials") {
        assert!(t["lineage"]["copying_from"].is_null(), "{t}");
        assert_eq!(t["budget"], 6, "{t}");
    }
    let best = launches
        .iter()
        .min_by(|a, b| a.1[2].w_to.total_cmp(&b.1[2].w_to))
        .map(|(t, _)| *t);
    assert_eq!(study["best_trial"]["id"].as_i64(), best, "{study}");
    exploits
}
