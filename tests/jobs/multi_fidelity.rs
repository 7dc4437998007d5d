//! Multi-fidelity studies with real trainer processes on the local executor: ASHA pauses
//! trials at rungs and resumes the same trial, from its own checkpoint, at the next budget.

use crate::common::{self, routes};

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

/// A trainer that resumes: it reads the epochs its checkpoint holds, trains only the missing
/// ones up to `--epochs` (reporting `epoch=E loss=…` after each), and logs each launch's
/// range and `AUGUR_BUDGET` to `$TRAINED` (or, without it, to `trained.jsonl` in its trial
/// directory: all a container sees of the host).
pub(crate) const TRAINER_PY: &str = r#"
import argparse, json, os, time
p = argparse.ArgumentParser()
p.add_argument("--x", type=float, required=True)
p.add_argument("--epochs", type=int, required=True)
a = p.parse_args()
ckpt = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "epochs")
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
trial_dir = os.path.dirname(os.environ["AIP_CHECKPOINT_DIR"])
with open(os.environ.get("TRAINED", os.path.join(trial_dir, "trained.jsonl")), "a") as f:
    f.write(json.dumps({"trial": int(os.environ["AUGUR_TRIAL_ID"]), "from": start,
                        "to": a.epochs, "budget": os.environ["AUGUR_BUDGET"]}) + "\n")
def loss(epoch):
    # Curves cross: a slow learner (large x) can end better than it starts.
    return (a.x - 0.3) ** 2 + (0.2 + a.x) * epoch ** -0.7
for epoch in range(start + 1, a.epochs + 1):
    time.sleep(float(os.environ.get("EPOCH_SECS", "0")))
    print("epoch=%d loss=%f" % (epoch, loss(epoch)), flush=True)
    open(ckpt, "w").write(str(epoch))
if start >= a.epochs:
    # Relaunched after its checkpoint already reached the budget (the service died before
    # it heard the result): nothing to train, report the checkpoint's result again.
    print("epoch=%d loss=%f" % (start, loss(start)), flush=True)
"#;

fn loss(x: f64, epoch: u64) -> f64 {
    (x - 0.3).powi(2) + (0.2 + x) * (epoch as f64).powf(-0.7)
}

/// A temporary directory with the trainer, the log of what each launch trained, and the runs.
struct Trainer {
    dir: tempfile::TempDir,
    script: std::path::PathBuf,
    trained: std::path::PathBuf,
}

impl Trainer {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let script = dir.path().join("trainer.py");
        std::fs::write(&script, TRAINER_PY).expect("write trainer");
        let trained = dir.path().join("trained.jsonl");
        Trainer {
            dir,
            script,
            trained,
        }
    }

    /// A local `trial_job` running the trainer, with `env` besides `TRAINED`.
    fn trial_job(&self, mut env: Value) -> Value {
        env["TRAINED"] = json!(self.trained.display().to_string());
        json!({
            "command": ["python3", self.script.display().to_string()],
            "env": env,
            "output_dir": self.dir.path().join("runs").display().to_string()
        })
    }
}

/// A study of 9 configurations, 3 at a time, on rungs 1, 3 and 9 epochs.
pub(crate) fn asha_spec(name: &str) -> Value {
    json!({
        "name": name,
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 9,
        "parallel_trials": 3,
        "seed": 11,
        "fidelity": {"argument": "epochs", "min": 1, "max": 9, "reduction_factor": 3},
        "scheduler": "asha"
    })
}

async fn asha_trials_resume_from_their_checkpoints_at_each_rung(db: common::TestDb) {
    let trainer = Trainer::new();
    let app = common::spawn_app(db).await;
    let mut spec = asha_spec("asha");
    spec["trial_job"] = trainer.trial_job(json!({}));
    let id = app.create_study(spec).await;
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    assert_ladder_climbed_by_resuming(&app, &study, &trainer.trained).await;
    // Each rung's launch is counted once, as the first of its attempts (the trial's launch at
    // the last rung is the one the API shows).
    let trials = app.get(&routes::trials(id)).await.body;
    for t in trials["trials"].as_array().expect("trials") {
        assert_eq!(t["attempts"], 1, "{t}");
    }
}

/// A pulled worker (`augur worker`) runs the same study: it gets each promotion as the same
/// trial at a larger budget, in the same directories on its machine, and exits once the
/// study has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulled_worker_resumes_promoted_trials_from_their_checkpoints() {
    let trainer = Trainer::new();
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app.create_study(asha_spec("pulled-asha")).await;
    let mut worker = std::process::Command::new(common::augur_bin());
    worker
        .args(["worker", "--url", &app.base, "--study", &id.to_string()])
        .args(["--slots", "3", "--client-id", "w", "--output-dir"])
        .arg(trainer.dir.path().join("runs"))
        .arg("--env")
        .arg(format!("TRAINED={}", trainer.trained.display()))
        .args(["--", "python3"])
        .arg(&trainer.script)
        .env_remove("AUGUR_TOKEN")
        .stdout(std::process::Stdio::null());
    let status = common::KillOnDrop(worker.spawn().expect("worker"))
        .wait()
        .await;
    assert!(
        status.success(),
        "the worker exits 0 once the study has ended"
    );
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_ladder_climbed_by_resuming(&app, &study, &trainer.trained).await;
}

/// Two pool workers (`augur worker --pool`, two slots each) run an ASHA study: a promotion
/// is leased as the same trial at a larger budget, to whichever slot is free, in the trial's
/// own directories (the study's `output_dir`, which both workers share), so every trial
/// resumes from its checkpoint whichever worker trains it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_workers_resume_promoted_trials_from_their_checkpoints() {
    let trainer = Trainer::new();
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut spec = asha_spec("pool-asha");
    spec["trial_job"] = json!({
        "executor": "pool",
        "pool": "mf",
        "command": ["python3", trainer.script.display().to_string()],
        "output_dir": trainer.dir.path().join("runs").display().to_string(),
    });
    let id = app.create_study(spec).await;
    let worker = |name: &str| {
        let child = std::process::Command::new(common::augur_bin())
            .args(["worker", "--url", &app.base, "--pool", "mf"])
            .args([
                "--slots",
                "2",
                "--client-id",
                name,
                "--job-commands",
                "python3",
            ])
            .arg("--env")
            .arg(format!("TRAINED={}", trainer.trained.display()))
            .env_remove("AUGUR_TOKEN")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("pool worker");
        common::KillOnDrop(child)
    };
    let workers = [worker("a"), worker("b")];
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    drop(workers);
    assert_ladder_climbed_by_resuming(&app, &study, &trainer.trained).await;
    let trials = app.get(&routes::trials(id)).await.body;
    let slots: std::collections::BTreeSet<&str> = trials["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .filter_map(|t| t["client_id"].as_str())
        .collect();
    assert!(
        slots.iter().any(|s| s.starts_with("a/")) && slots.iter().any(|s| s.starts_with("b/")),
        "both workers ran trials: {slots:?}"
    );
}

/// What the trainer logged of a finished 9-configuration study on rungs 1, 3, 9: every
/// launch continued where the trial's last one ended, at a rung, told its budget; 9 trials
/// at 1 epoch, the top third at 3, one at 9, the best at 3 epochs of those that got there.
pub(crate) async fn assert_ladder_climbed_by_resuming(
    app: &common::TestApp,
    study: &Value,
    trained: &std::path::Path,
) {
    let id = study["id"].as_i64().expect("id");
    assert_eq!(study["trial_counts"]["completed"], 9, "{study}");
    assert_eq!(study["trial_counts"]["paused"], 0, "{study}");
    let launches = launches(trained);
    assert_eq!(launches.len(), 9, "{launches:?}");
    for (trial, ranges) in &launches {
        let mut trained_to = 0;
        for &(from, to) in ranges {
            assert_eq!(
                from, trained_to,
                "trial {trial} trained again what it had: {ranges:?}"
            );
            assert!(to > from, "trial {trial}: {ranges:?}");
            trained_to = to;
        }
    }
    let reached = |epochs: u64| -> Vec<i64> {
        launches
            .iter()
            .filter(|(_, r)| r.last().is_some_and(|&(_, to)| to >= epochs))
            .map(|(t, _)| *t)
            .collect()
    };
    assert_eq!(reached(3).len(), 3, "{launches:?}");
    assert_eq!(reached(9).len(), 1, "{launches:?}");
    let trials = app.get(&routes::trials(id)).await.body;
    let x_of = |trial: i64| -> f64 {
        trials["trials"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["id"] == trial))
            .and_then(|t| t["parameters"]["x"].as_f64())
            .expect("x")
    };
    let best_at_3 = reached(3)
        .into_iter()
        .min_by(|a, b| loss(x_of(*a), 3).total_cmp(&loss(x_of(*b), 3)))
        .expect("some trial at 3");
    assert_eq!(reached(9), vec![best_at_3]);

    // The API shows each trial's budget and its curve, every epoch once.
    let top = app.get(&routes::trial(id, best_at_3)).await.body;
    assert_eq!(top["budget"], 9, "{top}");
    assert_eq!(top["early_stopped"], false);
    let steps: Vec<i64> = top["measurements"]
        .as_array()
        .expect("measurements")
        .iter()
        .filter_map(|m| m["step"].as_i64())
        .collect();
    assert_eq!(steps, (1..=9).collect::<Vec<_>>());
    // Only a trial measured at the full budget is the best.
    assert_eq!(study["best_trial"]["id"], best_at_3, "{study}");
    let stopped = trials["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .filter(|t| t["budget"] == 1)
        .collect::<Vec<_>>();
    assert_eq!(stopped.len(), 6);
    assert!(
        stopped
            .iter()
            .all(|t| t["early_stopped"] == true && t["state"] == "completed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asha_resumes_trials_from_their_checkpoints_sqlite() {
    asha_trials_resume_from_their_checkpoints_at_each_rung(common::sqlite_db()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asha_resumes_trials_from_their_checkpoints_postgres() {
    asha_trials_resume_from_their_checkpoints_at_each_rung(common::postgres_db().await).await;
}

/// A service SIGKILLed while trials are paused and running, then restarted on the same
/// database, finishes the study with every decision taken once: 3 trials promoted to 3
/// epochs, 1 to 9, none paused at the end, and every launch resumes from the trial's own
/// checkpoint (at most the epoch the killed attempt reached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_service_resumes_a_paused_study_and_decides_each_promotion_once() {
    let trainer = Trainer::new();
    let db = common::sqlite_db();
    let port = common::free_port();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let http = common::http();
    let base = server.base.clone();
    let mut spec = asha_spec("killed");
    spec["trial_job"] = trainer.trial_job(json!({"EPOCH_SECS": "0.15"}));
    let created = common::call(
        &http,
        &base,
        None,
        reqwest::Method::POST,
        "/v1/studies",
        Some(spec),
    )
    .await;
    let id = created.body["id"].as_i64().expect("id");
    let study = |http: reqwest::Client, base: String| async move {
        common::get_body(&http, &base, &routes::study(id)).await
    };
    common::eventually("trials paused", Duration::from_secs(60), || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let s = study(http, base).await;
            if s["trial_counts"]["paused"].as_i64().unwrap_or(0) >= 2 {
                Ok(())
            } else {
                Err(s.to_string())
            }
        }
    })
    .await;
    server.kill();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let end = common::eventually("the study ended", Duration::from_secs(90), || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let s = study(http, base).await;
            if s["state"] == "completed" {
                Ok(s)
            } else {
                Err(s.to_string())
            }
        }
    })
    .await;
    let failed = common::get_body(&http, &base, &routes::trials_in_state(id, "failed")).await;
    server.kill();
    assert_eq!(end["trial_counts"]["completed"], 9, "failed: {failed}");
    assert_eq!(end["trial_counts"]["paused"], 0, "{end}");
    let launches = launches(&trainer.trained);
    for (trial, ranges) in &launches {
        let mut budget = 0;
        for &(from, to) in ranges {
            assert!(to >= budget, "trial {trial} went down a rung: {ranges:?}");
            // A launch the kill cut short may have reached its budget already (from == to):
            // it reports the checkpoint's result again.
            assert!(
                from <= to,
                "trial {trial} trained past its budget: {ranges:?}"
            );
            budget = to;
        }
    }
    let reached = |epochs: u64| {
        launches
            .values()
            .filter(|r| r.iter().any(|&(_, to)| to >= epochs))
            .count()
    };
    assert_eq!(
        (reached(1), reached(3), reached(9)),
        (9, 3, 1),
        "{launches:?}"
    );
    assert_eq!(
        common::processes_with(&trainer.script.display().to_string()),
        0,
        "no trainer outlived the study"
    );
}

/// Each trial's launches as `(from, to)` epochs, in order, from the trainer's log; each was
/// told its budget (`AUGUR_BUDGET`, the same as `--epochs`), and every budget is a rung.
/// The launches the trainer logged in `trained`: a file, or a directory whose trial
/// directories each hold a `trained.jsonl`. By trial, in the order they ran.
fn launches(trained: &std::path::Path) -> BTreeMap<i64, Vec<(u64, u64)>> {
    let mut launches: BTreeMap<i64, Vec<(u64, u64)>> = BTreeMap::new();
    for line in logged_lines(trained) {
        let l: Value = serde_json::from_str(&line).expect("json line");
        let (from, to) = (
            l["from"].as_u64().expect("from"),
            l["to"].as_u64().expect("to"),
        );
        assert_eq!(
            l["budget"],
            to.to_string(),
            "AUGUR_BUDGET is the --epochs of {l}"
        );
        assert!([1, 3, 9].contains(&to), "a budget off the rungs: {l}");
        launches
            .entry(l["trial"].as_i64().expect("trial"))
            .or_default()
            .push((from, to));
    }
    launches
}

/// Hyperband dispatched on the local executor: one cycle of brackets (9 trials from 1 epoch,
/// 5 from 3, 3 from 9) runs to the end, every trial resuming where it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyperband_brackets_run_to_the_end_resuming_from_checkpoints() {
    let trainer = Trainer::new();
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut spec = asha_spec("hyperband");
    spec["scheduler"] = json!("hyperband");
    spec["max_trials"] = json!(17);
    spec["trial_job"] = trainer.trial_job(json!({}));
    let id = app.create_study(spec).await;
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    assert_eq!(study["trial_counts"]["completed"], 17, "{study}");
    let launches = launches(&trainer.trained);
    assert_eq!(launches.len(), 17);
    for (trial, ranges) in &launches {
        let first = if *trial <= 9 {
            1
        } else if *trial <= 14 {
            3
        } else {
            9
        };
        assert_eq!(
            ranges[0],
            (0, first),
            "trial {trial} starts at its bracket's rung"
        );
        for pair in ranges.windows(2) {
            assert_eq!(
                pair[1].0, pair[0].1,
                "trial {trial} resumes where it stopped: {ranges:?}"
            );
        }
    }
    let reached = |epochs: u64| {
        launches
            .values()
            .filter(|r| r.last().is_some_and(|&(_, to)| to >= epochs))
            .count()
    };
    // Bracket 2: 9 → 3 → 1; bracket 1: 5 → 1; bracket 0: 3 at 9 epochs from the start.
    assert_eq!(
        (reached(3), reached(9)),
        (3 + 5 + 3, 1 + 1 + 3),
        "{launches:?}"
    );
}

/// The lines of `trained`, or of every `trained.jsonl` under it.
fn logged_lines(trained: &std::path::Path) -> Vec<String> {
    if trained.is_file() {
        let text = std::fs::read_to_string(trained).expect("trained");
        return text.lines().map(str::to_string).collect();
    }
    let mut lines = Vec::new();
    let mut dirs = vec![trained.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == "trained.jsonl") {
                let text = std::fs::read_to_string(&path).expect("trained");
                lines.extend(text.lines().map(str::to_string));
            }
        }
    }
    lines
}

/// ASHA through real Slurm: each rung of a trial is a batch job that resumes from the
/// trial's checkpoint (the nodes share the file system).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asha_resumes_slurm_trials_from_their_checkpoints() {
    crate::slurm::require_slurm();
    let trainer = Trainer::new();
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut spec = asha_spec("asha-slurm");
    spec["trial_job"] = trainer.trial_job(json!({}));
    spec["trial_job"]["executor"] = json!("slurm");
    let id = app.create_study(spec).await;
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(300))
        .await;
    assert_ladder_climbed_by_resuming(&app, &study, &trainer.trained).await;
}
