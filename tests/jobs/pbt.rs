//! Population-based training with real trainer processes on the local executor (and as
//! batch jobs of a real Slurm): at each segment's end the worst trial copies the best one's
//! checkpoint into its own directory and goes on with its values perturbed; the others go on
//! from their own.

use crate::common::{self, pbt};

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
        .create_study(pbt::population_spec(json!({
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

/// A completed study, checked against what its trainers logged in `trained` (a line per
/// launch, as [`TRAINER_PY`] writes).
pub(crate) async fn check_population(
    app: &common::TestApp,
    id: i64,
    study: &Value,
    trained: &std::path::Path,
) {
    let launches = pbt::launches(trained);
    pbt::check_population(app, id, study, &launches).await;
}
