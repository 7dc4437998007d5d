//! The distributed TensorFlow example for real: each trial a chief and two workers that train
//! one Keras model with `MultiWorkerMirroredStrategy`, reading only the `TF_CONFIG` Augur
//! writes, reporting through `cloudml-hypertune`. TensorFlow (CPU) is installed once into
//! `target/tf-venv` by `scripts/tf-venv.sh`, which this test runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::common::{self, routes};

/// The venv's interpreter (made on first use: ~280 MB from PyPI).
pub fn python_with_tensorflow() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/tf-venv.sh");
    let out = Command::new(&script)
        .output()
        .expect("run scripts/tf-venv.sh");
    assert!(
        out.status.success(),
        "scripts/tf-venv.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tensorflow_cluster_trains_together_from_the_tf_config_augur_writes() {
    let python = tokio::task::spawn_blocking(python_with_tensorflow)
        .await
        .expect("venv");
    let runs = tempfile::tempdir().expect("dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/distributed");
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = json!({
        "name": "tensorflow",
        "algorithm": "gp_bandit",
        "metrics": [{"id": "val_loss", "goal": "minimize"}],
        "parameters": [
            {"id": "learning_rate", "type": "double", "min": 0.0003, "max": 0.03, "scale": "log"},
            {"id": "units", "type": "integer", "min": 8, "max": 64, "scale": "log"}
        ],
        "max_trials": 2,
        "parallel_trials": 1,
        "seed": 5,
        "trial_job": {
            "command": [python.display().to_string(), example.join("tf_train.py").display().to_string(), "--epochs=2"],
            "worker_pools": [{"replicas": 1}, {"replicas": 2}],
            "env": {"PYTHONUNBUFFERED": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"},
            "timeout_secs": 900,
            "output_dir": runs.path().display().to_string()
        }
    });
    let id = app.create_study(spec).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(1200))
        .await;
    assert_eq!(s["trial_counts"]["completed"], 2, "{s}");
    for trial in 1..=2 {
        let t = app.get(&routes::trial(id, trial)).await.body;
        let loss = t["final_measurement"]["metrics"]["val_loss"]
            .as_f64()
            .expect("val_loss");
        assert!(
            loss.is_finite() && loss < 2.0,
            "trial {trial} learnt something: {t}"
        );
        // One measurement per epoch (the hypertune file), the stdout line at the last one.
        let steps: Vec<i64> = t["measurements"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m["step"].as_i64())
            .collect();
        assert_eq!(steps, vec![1, 2], "a learning curve, each epoch once: {t}");
        let log = |replica: &str| {
            let url = app.url(&routes::trial_logs_of_replica(id, trial, replica));
            let http = app.http.clone();
            async move {
                http.get(url)
                    .send()
                    .await
                    .expect("logs")
                    .text()
                    .await
                    .expect("text")
            }
        };
        let chief = log("workerpool0-0").await;
        assert!(
            chief.contains("3 replicas in sync"),
            "the chief's collective spans 3: {chief}"
        );
        assert!(
            chief.contains(&format!("this is chief 0 of trial {trial}")),
            "the chief read TF_CONFIG.task.trial: {chief}"
        );
        for i in 0..2 {
            let worker = log(&format!("workerpool1-{i}")).await;
            let task: serde_json::Value = worker
                .lines()
                .find_map(|l| l.strip_prefix("TF_CONFIG task: "))
                .and_then(|rest| rest.split(" cluster: ").next())
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_else(|| panic!("worker {i} printed no TF_CONFIG task: {worker}"));
            assert_eq!(
                task,
                json!({"type": "worker", "index": i, "trial": trial.to_string()}),
                "worker {i}"
            );
            assert!(
                worker.contains(&format!("this is worker {i} of trial {trial}")),
                "worker {i} read TF_CONFIG.task.trial: {worker}"
            );
            assert!(
                worker.contains("3 replicas in sync"),
                "worker {i}: {worker}"
            );
        }
        assert!(
            common::study_dir(runs.path(), id)
                .join(format!("{trial}/model/model.keras"))
                .exists(),
            "the chief saved the model into AIP_MODEL_DIR"
        );
    }
}
