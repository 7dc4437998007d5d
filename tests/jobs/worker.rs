//! `augur worker`: a real worker process keeps its slots busy with pulled trials, reports
//! stdout metrics over HTTP, and a worker restarted with the same id resumes its trial.

use crate::common::{self, routes};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const SCRIPT: &str = r#"
import argparse, os, time
p = argparse.ArgumentParser()
p.add_argument("--x", type=float, required=True)
a = p.parse_args()
mark = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "started")
if os.environ.get("HANG_FIRST_RUN") == os.environ["AUGUR_TRIAL_ID"] and not os.path.exists(mark):
    # Whole or not at all: the test reads the pid as soon as the mark exists.
    with open(mark + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(mark + ".tmp", mark)
    time.sleep(1000)
time.sleep(0.1)
print("step=1 loss=%f" % (a.x * 2))
print("step=2 loss=%f" % (a.x))
"#;

fn worker(
    base: &str,
    study: impl std::fmt::Display,
    slots: usize,
    client: &str,
    dir: &std::path::Path,
    hang: bool,
) -> common::KillOnDrop {
    let mut cmd = Command::new(common::augur_bin());
    cmd.args([
        "worker",
        "--url",
        base,
        "--study",
        &study.to_string(),
        "--slots",
        &slots.to_string(),
    ])
    .args(["--client-id", client, "--output-dir"])
    .arg(dir.join("runs"))
    // Trials see none of the worker's environment but what it names.
    .args(["--env", "HANG_FIRST_RUN"])
    .args(["--", "python3"])
    .arg(dir.join("trial.py"))
    .env_remove("AUGUR_TOKEN")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if hang {
        // trial 1 hangs on its first run only
        cmd.env("HANG_FIRST_RUN", "1");
    }
    common::KillOnDrop(cmd.spawn().expect("spawn worker"))
}

fn spec(max_trials: i64, parallel: i64) -> serde_json::Value {
    common::x_spec("pulled", ("loss", "minimize"), max_trials, parallel, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_a_study_to_the_end_over_http() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("trial.py"), SCRIPT).expect("script");
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app.create_study(spec(6, 2)).await;
    let status = worker(&app.base, id, 2, "w", dir.path(), false)
        .wait()
        .await;
    assert!(
        status.success(),
        "the worker exits 0 once the study has no more trials"
    );
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], 6);
    let trials = app.get(&routes::trials(id)).await.body;
    for t in trials["trials"].as_array().expect("trials") {
        let x = t["parameters"]["x"].as_f64().expect("x");
        assert_eq!(t["measurements"].as_array().map(Vec::len), Some(2), "{t}");
        let final_loss = t["final_measurement"]["metrics"]["loss"]
            .as_f64()
            .expect("loss");
        assert!(
            (final_loss - x).abs() < 1e-6,
            "the last stdout line is final: {t}"
        );
        let client = t["client_id"].as_str().expect("client");
        assert!(client == "w/0" || client == "w/1", "{client}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_job_dies_with_it_and_a_restarted_worker_resumes_its_trial() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("trial.py"), SCRIPT).expect("script");
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app.create_study(spec(2, 1)).await;
    let first = worker(&app.base, id, 1, "r", dir.path(), true);
    let mark = || common::study_dir(&dir.path().join("runs"), 1).join("1/checkpoints/started");
    let start = Instant::now();
    while !mark().exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "first trial did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hung: i32 = std::fs::read_to_string(mark())
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    drop(first); // SIGKILL, as a crash would
    // Its reaper kills the job: no trainer goes on in a trial the server may give to
    // another worker.
    common::eventually(
        "the job dies with its worker",
        Duration::from_secs(5),
        || async {
            if common::alive(hung) {
                Err(format!("{hung} alive"))
            } else {
                Ok(())
            }
        },
    )
    .await;

    let status = worker(&app.base, id, 1, "r", dir.path(), true).wait().await;
    assert!(status.success());
    let trials = app.get(&routes::trials(id)).await.body;
    assert_eq!(
        trials["trials"].as_array().map(Vec::len),
        Some(2),
        "{trials}"
    );
    assert_eq!(
        trials["trials"][0]["state"], "completed",
        "trial 1 was resumed, not replaced: {trials}"
    );
    assert_eq!(trials["trials"][0]["client_id"], "r/0");
    assert!(
        !common::alive(hung),
        "the leftover job of trial 1 was killed"
    );
}

/// A trial that tries its `AUGUR_TRIAL_TOKEN`: reads the study list (anything but its own
/// trial), reports a measurement to its own trial, and writes the token and both statuses
/// to `<AIP_MODEL_DIR>/token.json`.
const TOKEN_PROBE: &str = r#"
import json, os, urllib.request, urllib.error
url, token = os.environ["AUGUR_URL"], os.environ.get("AUGUR_TRIAL_TOKEN", "")
study, trial = os.environ["AUGUR_STUDY_ID"], os.environ["AUGUR_TRIAL_ID"]
def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req).status
    except urllib.error.HTTPError as e:
        return e.code
seen = {
    "token": token,
    "studies": call("GET", "/v1/studies"),
    "other_trial": call("POST", "/v1/studies/%s/trials/%d/heartbeat" % (study, 1 + int(trial))),
    "own": call("POST", "/v1/studies/%s/trials/%s/measurements" % (study, trial),
                {"step": 1, "metrics": {"loss": 0.5}}),
}
open(os.path.join(os.environ["AIP_MODEL_DIR"], "token.json"), "w").write(json.dumps(seen))
print("loss=0.5")
"#;

/// Issue 10, finding 3: `augur worker` gave each trial its own (admin) token. Each pulled
/// trial now gets a token from the server that may only report to that trial, and stops
/// working once the trial ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_hands_its_trials_trial_tokens_not_its_own() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("trial.py"), TOKEN_PROBE).expect("script");
    let admin = "worker-admin-token";
    let app = common::spawn_app_with(common::sqlite_db(), Some(admin)).await;
    let id = app.create_study(spec(2, 2)).await;
    let w = Command::new(common::augur_bin())
        .args(["worker", "--url", &app.base, "--study", &id.to_string()])
        .args(["--slots", "2", "--client-id", "t", "--output-dir"])
        .arg(dir.path().join("runs"))
        .args(["--", "python3"])
        .arg(dir.path().join("trial.py"))
        .env("AUGUR_TOKEN", admin)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn worker");
    let status = common::KillOnDrop(w).wait().await;
    assert!(status.success());
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["trial_counts"]["completed"], 2, "{study}");
    for trial in 1..=2 {
        let path = common::study_dir(&dir.path().join("runs"), id)
            .join(format!("{trial}/model/token.json"));
        let seen: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("token.json"))
                .expect("json");
        let token = seen["token"].as_str().expect("token");
        assert!(!token.is_empty(), "trial {trial} got no token");
        assert_ne!(token, admin, "trial {trial} got the worker's own token");
        assert_eq!(seen["studies"], 403, "trial {trial}: {seen}");
        assert_eq!(seen["other_trial"], 403, "trial {trial}: {seen}");
        assert_eq!(seen["own"], 200, "trial {trial}: {seen}");
        // The trial ended: its token is gone.
        let after = common::call(
            &app.http,
            &app.base,
            Some(token),
            reqwest::Method::GET,
            &routes::trial(id, trial),
            None,
        )
        .await;
        assert_eq!(
            after.status,
            reqwest::StatusCode::UNAUTHORIZED,
            "trial {trial}'s token outlived it"
        );
    }
}

/// `augur worker --study NAME` works on the one active study of that name (a finished one of
/// the same name does not count), and refuses a name that several active studies share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_finds_its_study_by_name() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("trial.py"), SCRIPT).expect("script");
    let app = common::spawn_app(common::sqlite_db()).await;
    let finished = app.create_study(spec(1, 1)).await;
    let stopped = app.post(&routes::stop(finished), json!({})).await;
    assert_eq!(stopped.body["state"], "stopped", "{}", stopped.body);
    let id = app.create_study(spec(3, 1)).await;
    let status = worker(&app.base, "pulled", 1, "by-name", dir.path(), false)
        .wait()
        .await;
    assert!(status.success());
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["trial_counts"]["completed"], 3, "{study}");

    app.create_study(spec(3, 1)).await;
    app.create_study(spec(3, 1)).await;
    let out = Command::new(common::augur_bin())
        .args([
            "worker", "--url", &app.base, "--study", "pulled", "--", "true",
        ])
        .env_remove("AUGUR_TOKEN")
        .output()
        .expect("worker");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("2 active studies are named"), "{stderr}");
}
