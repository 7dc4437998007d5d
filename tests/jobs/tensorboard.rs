//! `augur tensorboard` over a study whose trials wrote real event files (TensorFlow's
//! `tf.summary` into `AIP_TENSORBOARD_LOG_DIR`), with the `tensorboard` that TensorFlow
//! installs from PyPI (`scripts/tf-venv.sh`), read back over TensorBoard's own HTTP API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::tensorflow::python_with_tensorflow;
use crate::common::{self, routes};

/// Writes `loss = lr × (3 − step)` at steps 0, 1, 2 as TensorBoard scalars, and reports it.
const TRAINER: &str = r#"
import os, sys
import tensorflow as tf
lr = float(next(a for a in sys.argv if a.startswith("--lr="))[5:])
writer = tf.summary.create_file_writer(os.environ["AIP_TENSORBOARD_LOG_DIR"])
with writer.as_default():
    for step in range(3):
        tf.summary.scalar("loss", lr * (3 - step), step=step)
writer.flush()
print(f"loss={lr}")
"#;

/// GET a TensorBoard JSON path; `None` while it does not answer.
async fn tensorboard_json(port: u16, path: &str) -> Option<Value> {
    let r = common::http()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

/// Wait until TensorBoard lists exactly `want` as its runs.
async fn wait_for_runs(port: u16, want: &[&str], cli: &mut Child) -> Value {
    let start = Instant::now();
    let mut last = Value::Null;
    while start.elapsed() < Duration::from_secs(120) {
        if let Ok(Some(status)) = cli.try_wait() {
            panic!("augur tensorboard exited early ({status}); runs seen: {last}");
        }
        if let Some(runs) = tensorboard_json(port, "/data/runs").await {
            let mut names: Vec<&str> = runs
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            names.sort_unstable();
            if names == want {
                return runs;
            }
            last = runs;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("TensorBoard never listed {want:?}; last: {last}");
}

/// The scalar `loss` of `run` as (step, value) pairs.
async fn losses(port: u16, run: &str) -> Vec<(i64, f64)> {
    let path = format!("/data/plugin/scalars/scalars?run={run}&tag=loss");
    let points = tensorboard_json(port, &path).await.expect("scalars");
    points
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| Some((p[1].as_i64()?, p[2].as_f64()?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensorboard_shows_each_trial_as_a_run_and_follows_new_trials() {
    let python = tokio::task::spawn_blocking(python_with_tensorflow)
        .await
        .expect("venv");
    let tensorboard = python.with_file_name("tensorboard");
    assert!(tensorboard.exists(), "{} missing", tensorboard.display());
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("trainer.py");
    std::fs::write(&script, TRAINER).expect("trainer");
    let runs_base = dir.path().join("runs");
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = json!({
        "name": "tensorboard",
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "lr", "type": "double", "min": 0.1, "max": 1.0}],
        "max_trials": 1,
        "parallel_trials": 1,
        "seed": 4,
        "trial_job": {
            "command": [python.display().to_string(), script.display().to_string()],
            "env": {"TF_CPP_MIN_LOG_LEVEL": "2"},
            "output_dir": runs_base.display().to_string()
        }
    });
    let id = app.create_study(spec).await;
    app.wait_for_state(id, "completed", Duration::from_secs(300))
        .await;
    let dirs = app.get(&routes::directories(id)).await;
    assert_eq!(dirs.status, 200, "{}", dirs.body);
    let study_dir = common::study_dir(&runs_base, id);
    assert_eq!(dirs.body["study"], study_dir.display().to_string());
    assert_eq!(
        dirs.body["tensorboard"],
        study_dir.join("{trial}/logs").display().to_string()
    );

    let port = common::free_port();
    let mut cli: Child = Command::new(common::augur_bin())
        .args(["tensorboard", &id.to_string(), "--url", &app.base])
        .args(["--port", &port.to_string(), "--refresh-secs", "1"])
        .arg("--tensorboard")
        .arg(&tensorboard)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("augur tensorboard");
    wait_for_runs(port, &["trial-1"], &mut cli).await;
    // Each run is its own trial's directory: the scalars are the ones its values wrote.
    let trial = app.get(&routes::trial(id, 1)).await.body;
    let lr = trial["parameters"]["lr"].as_f64().expect("lr");
    let points = losses(port, "trial-1").await;
    assert_eq!(points.len(), 3, "{points:?}");
    for (step, loss) in points {
        assert!(
            (loss - lr * (3 - step) as f64).abs() < 1e-5,
            "step {step}: {loss} vs lr {lr}"
        );
    }
    let url = format!("http://127.0.0.1:{port}/");
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(
        study["user_attrs"]["augur:tensorboard_url"], url,
        "the dashboard's link: {study}"
    );

    // A trial started later shows up without a restart.
    let patched = app
        .call(
            reqwest::Method::PATCH,
            &routes::study(id),
            Some(json!({"max_trials": 2})),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.body);
    let resumed = app.post(&routes::resume(id), json!({})).await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    app.wait_for_state(id, "completed", Duration::from_secs(300))
        .await;
    wait_for_runs(port, &["trial-1", "trial-2"], &mut cli).await;
    assert_eq!(losses(port, "trial-2").await.len(), 3);

    // SIGTERM: TensorBoard stops, the link goes, the runs' directory of links is removed.
    let pid = nix::unistd::Pid::from_raw(cli.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = cli.wait().expect("wait");
    assert!(status.success(), "{status}");
    let study = app.get(&routes::study(id)).await.body;
    assert!(
        study["user_attrs"].get("augur:tensorboard_url").is_none(),
        "{study}"
    );
    let links: PathBuf =
        std::env::temp_dir().join(format!("augur-tensorboard-study-{id}-{}", pid.as_raw()));
    assert!(!links.exists(), "{} left behind", links.display());
    let start = Instant::now();
    while tensorboard_json(port, "/data/runs").await.is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "TensorBoard outlived augur tensorboard"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_study_without_a_trial_job_has_no_directories() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app
        .create_study(common::x_spec("pulled", ("loss", "minimize"), 3, 1, 1))
        .await;
    let r = app.get(&routes::directories(id)).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no trial_job")),
        "{}",
        r.body
    );
}
