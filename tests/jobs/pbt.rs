//! Population-based training with real trainer processes on the local executor (and as
//! batch jobs of a real Slurm): at each segment's end the worst trial copies the best one's
//! checkpoint into its own directory and goes on with its values perturbed; the others go on
//! from their own.

use crate::common::{self, routes};

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

/// A trainer whose checkpoint is a model state: `w` falls by a factor per epoch that depends
/// on `--lr` (best at 0.3). It trains from the epochs its checkpoint holds up to `--epochs`,
/// reporting `epoch=E loss=w`, and logs each launch to `$TRAINED`: its range, its lr, the
/// state it started from and ended at, and which trial's training the checkpoint it found
/// came from.
const TRAINER_PY: &str = r#"
import argparse, json, math, os
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--epochs", type=int, required=True)
a = p.parse_args()
trial = int(os.environ["AUGUR_TRIAL_ID"])
path = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"epochs": 0, "w": 1.0, "by": trial}
start, w_from, origin = state["epochs"], state["w"], state["by"]
w = w_from
factor = 1.0 - 0.5 * math.exp(-math.log(a.lr / 0.3) ** 2 / 2)
for epoch in range(start + 1, a.epochs + 1):
    w *= factor
    print("epoch=%d loss=%.12g" % (epoch, w), flush=True)
    json.dump({"epochs": epoch, "w": w, "by": trial}, open(path + ".tmp", "w"))
    os.replace(path + ".tmp", path)
if start >= a.epochs:
    print("epoch=%d loss=%.12g" % (start, w), flush=True)
with open(os.environ["TRAINED"], "a") as f:
    f.write(json.dumps({"trial": trial, "from": start, "to": a.epochs, "lr": a.lr,
                        "w_from": w_from, "w_to": w, "origin": origin}) + "\n")
"#;

/// One launch of the trainer, as it logged it.
#[derive(Debug, Clone)]
struct Launch {
    from: u64,
    to: u64,
    lr: f64,
    w_from: f64,
    w_to: f64,
    origin: i64,
}

fn launches(trained: &std::path::Path) -> BTreeMap<i64, Vec<Launch>> {
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

/// The population every PBT test trains, run by `trial_job`.
pub(crate) fn population_spec(trial_job: Value) -> Value {
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

async fn the_worst_copies_the_best_at_every_segment_end(backend: &str) {
    the_worst_copies_the_best_on(backend, "local").await;
}

on_both_backends!(the_worst_copies_the_best_at_every_segment_end);

/// The same through real Slurm: each segment a batch job, the copy made by the server on the
/// file system the nodes share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pbt_on_slurm_copies_the_best_checkpoint_into_the_worst_trial() {
    crate::slurm::require_slurm();
    the_worst_copies_the_best_on("sqlite", "slurm").await;
}

/// The same run by a pool's two workers (`augur worker --pool`): the worker that gets the
/// worst trial's next segment copies the best one's checkpoint, from the study's directory
/// the workers share, and reports the copy made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_workers_copy_the_best_checkpoint_into_the_worst_trial() {
    the_worst_copies_the_best_on("sqlite", "pool").await;
}

async fn the_worst_copies_the_best_on(backend: &str, executor: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("trainer.py");
    std::fs::write(&script, TRAINER_PY).expect("write trainer");
    let trained = dir.path().join("trained.jsonl");
    let db = common::db(backend).await;
    let app = common::spawn_app(db).await;
    let workers: Vec<common::KillOnDrop> = if executor == "pool" {
        ["a", "b"]
            .iter()
            .map(|name| {
                let child = std::process::Command::new(common::augur_bin())
                    .args([
                        "worker", "--url", &app.base, "--pool", "pbt", "--slots", "1",
                    ])
                    .args(["--client-id", name, "--job-commands", "python3"])
                    // The study's own env names where the trainer logs.
                    .args(["--job-env-allow", "TRAINED"])
                    .env_remove("AUGUR_TOKEN")
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("pool worker");
                common::KillOnDrop(child)
            })
            .collect()
    } else {
        Vec::new()
    };
    let id = app
        .create_study(population_spec(json!({
            "executor": executor,
            "pool": if executor == "pool" { json!("pbt") } else { Value::Null },
            "command": ["python3", script.display().to_string()],
            "env": {"TRAINED": trained.display().to_string()},
            "output_dir": dir.path().join("runs").display().to_string()
        })))
        .await;
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(300))
        .await;
    drop(workers);
    check_population(&app, id, &study, &trained).await;
}

/// A completed PBT study of [`population_spec`] (population 4, lr from 0.001 to 1, segments
/// of 2 epochs up to 6, the worst quarter copying the best), checked against what its
/// trainers logged in `trained` (a line per launch, as [`TRAINER_PY`] writes): every launch
/// from where its checkpoint was, the worst copying the best at each segment's end with its
/// lr explored, the others going on alone, the lineage recording it.
pub(crate) async fn check_population(
    app: &common::TestApp,
    id: i64,
    study: &Value,
    trained: &std::path::Path,
) {
    assert_eq!(study["trial_counts"]["completed"], 4, "{study}");
    let launches = launches(trained);
    assert_eq!(launches.len(), 4, "the population, no more: {launches:?}");
    // Every trial trained 0-2, 2-4, 4-6: each launch from where its checkpoint was.
    for (trial, ls) in &launches {
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
    for (segment, end) in [(0, 2), (1, 4)] {
        // The segment's results, best first.
        let mut ranked: Vec<(f64, i64)> = launches
            .iter()
            .map(|(t, ls)| (ls[segment].w_to, *t))
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (best, worst) = (ranked[0].1, ranked[3].1);
        for (trial, ls) in &launches {
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
}
