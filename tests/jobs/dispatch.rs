//! End-to-end dispatch with real processes: the study runner keeps `parallel_trials` jobs
//! running, retries crashes into the same checkpoint directory, kills hung jobs with their
//! whole process group, cancels jobs when a study stops, survives a SIGKILL of the service,
//! and collects metrics from stdout and from the real `cloudml-hypertune` package.

use crate::common::{self, routes};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use augur::model::StudyId;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A trial script: optional crash/hang behaviour, prints `loss=...` from its `--x` value.
const TRIAL_PY: &str = r#"
import argparse, os, subprocess, sys, time
p = argparse.ArgumentParser()
p.add_argument("--x", type=float, required=True)
p.add_argument("--mode", default="ok")
p.add_argument("--sleep", type=float, default=0.2)
a = p.parse_args()
ckpt = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "ckpt")
launches = 0
if "LAUNCHES" in os.environ:
    with open(os.environ["LAUNCHES"], "a") as f:
        f.write(os.environ["AIP_CHECKPOINT_DIR"] + "\n")
    launches = len(open(os.environ["LAUNCHES"]).read().splitlines())
if a.mode == "crash_always":
    if launches == 2:
        time.sleep(1.5)  # the second launch lingers: the test kills the service meanwhile
    sys.exit(4)
if a.mode == "hang_first" and launches == 1:
    time.sleep(1000)
if a.mode == "http_token":
    import json, urllib.error, urllib.request
    env = os.environ
    def post(trial, action, body, token):
        url = "%s/v1/studies/%s/trials/%s/%s" % (env["AUGUR_URL"], env["AUGUR_STUDY_ID"], trial, action)
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
            "Authorization": "Bearer " + token, "Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(req).status
        except urllib.error.HTTPError as e:
            return e.code
    saved = os.path.join(env["AIP_CHECKPOINT_DIR"], "token")
    if not os.path.exists(saved):
        open(saved, "w").write(env["AUGUR_TRIAL_TOKEN"])
        sys.exit(3)
    me, token = env["AUGUR_TRIAL_ID"], env["AUGUR_TRIAL_TOKEN"]
    print("first launch's token:", post(me, "measurements", {"step": 1, "metrics": {"loss": 9}}, open(saved).read()))
    print("other trial:", post(int(me) + 1, "complete", {"metrics": {"loss": 9}}, token))
    print("own trial:", post(me, "complete", {"metrics": {"loss": 0.5}}, token))
    print("token:", token)
    sys.exit(0)
if a.mode == "crash_once" and not os.path.exists(ckpt):
    open(ckpt, "w").write(os.environ["AIP_CHECKPOINT_DIR"])
    sys.exit(3)
if a.mode == "chatty":
    for i in range(3000):
        print("progress line", i)
if a.mode == "hang":
    child = subprocess.Popen(["sleep", "1000"])
    open(os.path.join(os.environ["AIP_MODEL_DIR"], "child.pid"), "w").write(str(child.pid))
    time.sleep(1000)
time.sleep(a.sleep)
if os.path.exists(ckpt):
    print("resumed from", open(ckpt).read())
print("loss=%f" % ((a.x - 0.3) ** 2))
"#;

struct Fixture {
    dir: tempfile::TempDir,
    script: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("trial.py");
    std::fs::write(&script, TRIAL_PY).expect("write script");
    Fixture { dir, script }
}

fn study(
    f: &Fixture,
    name: &str,
    max_trials: i64,
    parallel: i64,
    extra_args: &[&str],
    job: Value,
) -> Value {
    let mut command = vec![json!("python3"), json!(f.script.display().to_string())];
    command.extend(extra_args.iter().map(|a| json!(a)));
    let mut trial_job =
        json!({"command": command, "output_dir": f.dir.path().join("runs").display().to_string()});
    if let (Some(t), Some(extra)) = (trial_job.as_object_mut(), job.as_object()) {
        for (k, v) in extra {
            t.insert(k.clone(), v.clone());
        }
    }
    json!({
        "name": name,
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": max_trials,
        "parallel_trials": parallel,
        "seed": 3,
        "trial_job": trial_job
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_trials_four_at_a_time_never_more_than_four_processes() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let marker = f.script.display().to_string();
    let peak = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (peak, done, marker) = (peak.clone(), done.clone(), marker.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(common::processes_with(&marker), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let id = app
        .create_study(study(&f, "twenty", 20, 4, &[], json!({})))
        .await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    done.store(true, Ordering::Relaxed);
    monitor.join().expect("monitor");
    assert_eq!(s["trial_counts"]["completed"], 20, "{s}");
    assert_eq!(s["trial_counts"]["total"], 20);
    let peak = peak.load(Ordering::Relaxed);
    assert!(peak <= 4, "{peak} trial processes were alive at once");
    assert!(peak >= 2, "trials ran in parallel (peak {peak})");
    // Metrics came from stdout; each trial has its directories and log.
    let best = app.get(&routes::optimal_trials(id)).await.body;
    let trial = best["trials"][0]["id"].as_i64().expect("best");
    let root = common::study_dir(&f.dir.path().join("runs"), id).join(trial.to_string());
    for sub in ["model", "checkpoints", "logs"] {
        assert!(root.join(sub).is_dir(), "{sub}");
    }
    let logs = app
        .http
        .get(app.url(&routes::trial_logs(id, trial)))
        .send()
        .await
        .expect("logs");
    assert_eq!(logs.status(), StatusCode::OK);
    let text = logs.text().await.expect("text");
    assert!(text.contains("loss="), "{text}");
    assert!(
        text.contains(&format!("--x={}", best["trials"][0]["parameters"]["x"])),
        "argv is logged: {text}"
    );
}

/// Creates the study, waits until it completes (60 s at most) and reads its first trial.
async fn first_trial_at_the_end(app: &common::TestApp, spec: Value) -> Value {
    let id = app.create_study(spec).await;
    app.wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    app.get(&routes::trial(id, 1)).await.body
}

/// Each replica writes the arguments it was started with; the primary waits for the
/// worker's before it reports.
const ARGV_PY: &str = r#"
import json, os, sys, time
name = os.environ["AUGUR_REPLICA"]
model = os.environ["AIP_MODEL_DIR"]
with open(os.path.join(model, "argv-%s.json" % name), "w") as f:
    json.dump(sys.argv[1:], f)
if name != "workerpool0-0":
    time.sleep(1000)
for _ in range(400):
    if os.path.exists(os.path.join(model, "argv-workerpool1-0.json")):
        break
    time.sleep(0.05)
print("loss=1")
"#;

/// A local job with `args` (Vertex's `containerSpec.args`) runs its command, then its args,
/// then the trial's values, each pool with its own args where it has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_job_runs_its_command_then_its_args_then_the_values() {
    let f = fixture();
    let script = f.dir.path().join("argv.py");
    std::fs::write(&script, ARGV_PY).expect("script");
    let app = common::spawn_app(common::sqlite_db()).await;
    let runs = f.dir.path().join("runs");
    let spec = one_trial_of_x(
        "args",
        json!({
            "command": ["python3", script.display().to_string()],
            "args": ["--epochs=5", "--run=t${trial_id}"],
            "output_dir": runs.display().to_string(),
            "worker_pools": [{}, {"args": ["--role=worker"]}]
        }),
    );
    let trial = first_trial_at_the_end(&app, spec).await;
    assert_eq!(trial["state"], "completed", "{trial}");
    let x = trial["parameters"]["x"].as_i64().expect("x");
    let model = common::study_dir(&runs, 1).join("1/model");
    let argv = |replica: &str| -> Vec<String> {
        let text = std::fs::read_to_string(model.join(format!("argv-{replica}.json")))
            .expect("the replica wrote its arguments");
        serde_json::from_str(&text).expect("JSON")
    };
    assert_eq!(
        argv("workerpool0-0"),
        [
            "--epochs=5".to_string(),
            "--run=t1".into(),
            format!("--x={x}")
        ]
    );
    assert_eq!(
        argv("workerpool1-0"),
        ["--role=worker".to_string(), format!("--x={x}")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_trial_is_retried_and_finds_its_checkpoint() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = study(
        &f,
        "crash",
        1,
        1,
        &["--mode=crash_once"],
        json!({"max_retries": 1}),
    );
    let trial = first_trial_at_the_end(&app, spec).await;
    assert_eq!(trial["state"], "completed", "{trial}");
    assert_eq!(trial["attempts"], 2, "{trial}");
    let log =
        std::fs::read_to_string(common::study_dir(&f.dir.path().join("runs"), 1).join("1/job.log"))
            .expect("log");
    assert_eq!(
        log.matches("=== augur: trial 1 attempt").count(),
        2,
        "{log}"
    );
    let ckpt_dir = common::study_dir(&f.dir.path().join("runs"), 1).join("1/checkpoints/");
    assert!(
        log.contains(&format!("resumed from {}", ckpt_dir.display())),
        "same checkpoint dir: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_beyond_max_retries_fail_the_trial() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = study(
        &f,
        "crash-no-retry",
        1,
        1,
        &["--mode=crash_once"],
        json!({"max_retries": 0}),
    );
    let trial = first_trial_at_the_end(&app, spec).await;
    assert_eq!(trial["state"], "failed");
    assert_eq!(
        trial["fail_reason"],
        "exited with code 3 (after 1 attempt(s))"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_trial_is_killed_at_its_timeout_with_its_process_group() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app
        .create_study(study(
            &f,
            "hang",
            1,
            1,
            &["--mode=hang"],
            json!({"timeout_secs": 1}),
        ))
        .await;
    let started = Instant::now();
    app.wait_for_state(id, "completed", Duration::from_secs(30))
        .await;
    assert!(started.elapsed() < Duration::from_secs(15));
    let trial = app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(trial["state"], "failed");
    assert!(
        trial["fail_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("timed out after 1 s")),
        "{trial}"
    );
    let child: i32 = std::fs::read_to_string(
        common::study_dir(&f.dir.path().join("runs"), 1).join("1/model/child.pid"),
    )
    .expect("child pid")
    .trim()
    .parse()
    .expect("pid");
    assert!(
        !common::alive(child),
        "the trial's child process {child} survived"
    );
    assert_eq!(common::processes_with(&f.script.display().to_string()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_study_kills_running_jobs() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app
        .create_study(study(&f, "stop", 10, 2, &["--mode=hang"], json!({})))
        .await;
    let marker = f.script.display().to_string();
    let start = Instant::now();
    while common::processes_with(&marker) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "jobs did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped = app.post(&routes::stop(id), json!({})).await;
    assert_eq!(stopped.body["state"], "stopped");
    let start = Instant::now();
    while common::processes_with(&marker) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "jobs still running after stop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.wait_for_cancelled_trials(id, 2, Duration::from_secs(10))
        .await;
    let study_dir = common::study_dir(&f.dir.path().join("runs"), 1);
    for pid_file in ["1/model/child.pid", "2/model/child.pid"] {
        if let Ok(pid) = std::fs::read_to_string(study_dir.join(pid_file)) {
            assert!(
                !common::alive(pid.trim().parse().expect("pid")),
                "{pid_file}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_service_mid_study_then_restart_finishes_exactly_max_trials() {
    let f = fixture();
    let db = common::sqlite_db();
    let port = common::free_port();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let http = common::http();
    let base = server.base.clone();
    let spec = study(&f, "kill", 12, 3, &["--sleep=0.4"], json!({}));
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
    let start = Instant::now();
    loop {
        let s = common::call(
            &http,
            &base,
            None,
            reqwest::Method::GET,
            &routes::study(id),
            None,
        )
        .await
        .body;
        if s["trial_counts"]["completed"].as_i64().unwrap_or(0) >= 4 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let start = Instant::now();
    let s = loop {
        let s = common::call(
            &http,
            &base,
            None,
            reqwest::Method::GET,
            &routes::study(id),
            None,
        )
        .await
        .body;
        if s["state"] == "completed" {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "{s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let failed = common::get_body(&http, &base, &routes::trials_in_state(id, "failed")).await;
    server.kill();
    assert_eq!(s["trial_counts"]["total"], 12, "{s}");
    assert_eq!(s["trial_counts"]["completed"], 12, "{s}\nfailed: {failed}");
    assert_eq!(
        common::processes_with(&f.script.display().to_string()),
        0,
        "no job outlived the study"
    );
}

/// Create a study on a server process; returns its id.
async fn create_on(http: &reqwest::Client, base: &str, spec: Value) -> i64 {
    let created = common::call(
        http,
        base,
        None,
        reqwest::Method::POST,
        "/v1/studies",
        Some(spec),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    created.body["id"].as_i64().expect("id")
}

/// Wait until the study on a server process has left `active`; returns it.
async fn wait_until_ended(http: &reqwest::Client, base: &str, id: i64) -> Value {
    common::eventually("the study ended", Duration::from_secs(60), || async {
        let s = common::get_body(http, base, &routes::study(id)).await;
        if s["state"] != "active" {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
    .await
}

/// The lines each launch of the trial script appended (its `AIP_CHECKPOINT_DIR`).
fn launches(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

async fn wait_for_launches(path: &Path, n: usize) {
    common::eventually(&format!("launch {n}"), Duration::from_secs(30), || async {
        let seen = launches(path).len();
        if seen >= n {
            Ok(())
        } else {
            Err(format!("{seen} launch(es)"))
        }
    })
    .await;
}

/// Retries are counted in the database: a trial that crashes every time keeps the failures
/// it used across a SIGKILL and restart of the service (before the fix it got all its
/// retries again: 5 launches), and every launch gets the same checkpoint directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_restart_does_not_renew_a_trials_retries_sqlite() {
    a_service_restart_does_not_renew_a_trials_retries("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_restart_does_not_renew_a_trials_retries_postgres() {
    a_service_restart_does_not_renew_a_trials_retries("postgres").await;
}

async fn a_service_restart_does_not_renew_a_trials_retries(backend: &str) {
    let f = fixture();
    let db = common::db(backend).await;
    let port = common::free_port();
    let log = f.dir.path().join("launches");
    let spec = study(
        &f,
        "retries",
        1,
        1,
        &["--mode=crash_always"],
        json!({"max_retries": 2, "env": {"LAUNCHES": log.display().to_string()}}),
    );
    let http = common::http();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let id = create_on(&http, &server.base, spec).await;
    // Launch 1 crashed at once; launch 2 lingers, and crashes after the service is gone.
    wait_for_launches(&log, 2).await;
    server.kill();
    let marker = f.script.display().to_string();
    common::eventually(
        "the unwatched launch ended",
        Duration::from_secs(15),
        || async {
            match common::processes_with(&marker) {
                0 => Ok(()),
                n => Err(format!("{n} job(s) alive")),
            }
        },
    )
    .await;
    assert_eq!(launches(&log).len(), 2);

    let server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    wait_until_ended(&http, &server.base, id).await;
    let trial = common::get_body(&http, &server.base, &routes::trial(id, 1)).await;
    let seen = launches(&log);
    // Launch 1 failed (counted); launch 2 ended unseen, with the service (given back);
    // after the restart launches 3 and 4 are attempts 2 and 3, the last allowed.
    assert_eq!(
        seen.len(),
        4,
        "launches across both runs: {seen:?}\n{trial}"
    );
    assert_eq!(trial["state"], "failed", "{trial}");
    assert_eq!(
        trial["fail_reason"], "exited with code 4 (after 3 attempt(s))",
        "{trial}"
    );
    assert_eq!(trial["attempts"], 3, "{trial}");
    let checkpoints = format!(
        "{}/",
        common::study_dir(&f.dir.path().join("runs"), 1)
            .join("1/checkpoints")
            .display()
    );
    assert!(seen.iter().all(|d| *d == checkpoints), "{seen:?}");
    let job_log =
        std::fs::read_to_string(common::study_dir(&f.dir.path().join("runs"), 1).join("1/job.log"))
            .expect("log");
    let headers: Vec<&str> = job_log
        .lines()
        .filter_map(|l| l.strip_prefix("=== augur: trial 1 attempt "))
        .filter_map(|l| l.split(':').next())
        .collect();
    assert_eq!(headers, ["1", "2", "2", "3"], "{job_log}");
}

/// The other side of counting: a launch that the service's own death interrupted (here its
/// job is still running at the restart, and the new runner kills it) is given back, so a
/// trial with `max_retries: 0` still runs to completion after a SIGKILL of the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_interrupted_by_the_service_dying_is_not_charged_to_the_trial() {
    let f = fixture();
    let db = common::sqlite_db();
    let port = common::free_port();
    let log = f.dir.path().join("launches");
    let spec = study(
        &f,
        "interrupted",
        1,
        1,
        &["--mode=hang_first"],
        json!({"env": {"LAUNCHES": log.display().to_string()}}),
    );
    let http = common::http();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let id = create_on(&http, &server.base, spec).await;
    wait_for_launches(&log, 1).await;
    server.kill();
    let marker = f.script.display().to_string();
    assert_eq!(
        common::processes_with(&marker),
        1,
        "the hanging launch outlives the service"
    );

    let server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let s = wait_until_ended(&http, &server.base, id).await;
    let trial = common::get_body(&http, &server.base, &routes::trial(id, 1)).await;
    assert_eq!(trial["state"], "completed", "{s}\n{trial}");
    assert_eq!(
        trial["attempts"], 1,
        "the interrupted launch given back: {trial}"
    );
    assert_eq!(launches(&log).len(), 2);
    assert_eq!(
        common::processes_with(&marker),
        0,
        "the leftover job was killed"
    );
}

/// On a server that requires tokens, each launch gets its own trial token (issued in the
/// transaction that counts the launch): it completes its own trial over HTTP, is refused
/// for another trial, and the token of the trial's previous launch no longer works. Once the
/// trial is completed its token is deleted (a server that checked it within the last 30 s
/// still trusts it until then, but its trial is finished: 409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_launch_reports_with_its_own_trial_scoped_token() {
    let f = fixture();
    let app = common::spawn_app_with(common::sqlite_db(), Some("admin")).await;
    let spec = study(
        &f,
        "token",
        2,
        1,
        &["--mode=http_token"],
        json!({"max_retries": 1}),
    );
    let trial = first_trial_at_the_end(&app, spec).await;
    assert_eq!(trial["state"], "completed", "{trial}");
    assert_eq!(
        trial["final_measurement"]["metrics"]["loss"], 0.5,
        "{trial}"
    );
    let log =
        std::fs::read_to_string(common::study_dir(&f.dir.path().join("runs"), 1).join("1/job.log"))
            .expect("log");
    for line in [
        "first launch's token: 401",
        "other trial: 403",
        "own trial: 200",
    ] {
        assert!(log.contains(line), "{line:?} in {log}");
    }
    let token = log
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("the job printed its token");
    let store = augur::store::connect(&app.db.url).await.expect("store");
    let found = store
        .find_token(&augur::service::hash_token(token))
        .await
        .expect("find");
    assert_eq!(found, None, "the completed trial's token is deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vertex_style_trainer_reports_through_cloudml_hypertune_and_resumes_its_checkpoint() {
    let python = tokio::task::spawn_blocking(common::python_with_hypertune)
        .await
        .expect("venv");
    let out = tempfile::tempdir().expect("dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/hypertune");
    let spec = json!({
        "name": "hypertune", "algorithm": "quasi_random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [
            {"id": "learning_rate", "type": "double", "min": 0.01, "max": 0.4, "scale": "log"},
            {"id": "momentum", "type": "double", "min": 0.0, "max": 0.9}
        ],
        "max_trials": 4, "parallel_trials": 2,
        "trial_job": {
            "command": [python.display().to_string(), "trainer.py", "--num_epochs=6"],
            "workdir": example.display().to_string(),
            "env": {"CRASH_ONCE_AT_EPOCH": "3"},
            "max_retries": 1,
            "output_dir": out.path().display().to_string()
        }
    });
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app.create_study(spec).await;
    app.wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    let trials = app.get(&routes::trials(id)).await.body;
    for t in trials["trials"].as_array().expect("trials") {
        assert_eq!(t["state"], "completed", "{t}");
        let steps: Vec<i64> = t["measurements"]
            .as_array()
            .expect("m")
            .iter()
            .map(|m| m["step"].as_i64().expect("step"))
            .collect();
        assert_eq!(
            steps,
            vec![1, 2, 3, 4, 5, 6],
            "one measurement per epoch from the hypertune file: {t}"
        );
        assert_eq!(t["final_measurement"]["step"], 6);
        let n = t["id"].as_i64().expect("id");
        let model: Value = serde_json::from_str(
            &std::fs::read_to_string(
                common::study_dir(out.path(), id).join(format!("{n}/model/model.json")),
            )
            .expect("model saved"),
        )
        .expect("model json");
        assert_eq!(
            model["restarts"], 1,
            "crashed at epoch 3, resumed from its checkpoint"
        );
    }
}

/// The trial loop drops the job's `wait()` whenever a stdout line or a tick wins; a job that
/// prints a lot and then its metric as its very last line right before exiting must still
/// have that line read (it once failed with "no metric reported").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_line_of_a_chatty_job_is_never_lost() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = study(
        &f,
        "chatty",
        24,
        8,
        &["--mode=chatty", "--sleep=0"],
        json!({}),
    );
    let id = app.create_study(spec).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    let failed = app.get(&routes::trials_in_state(id, "failed")).await.body;
    assert_eq!(s["trial_counts"]["completed"], 24, "{failed}");
}

/// The probe's finding: with the documented `AUGUR_TOKEN`/`AUGUR_DATABASE_URL`
/// configuration every job saw the admin token and the database URL. A job starts from a
/// clean environment: the allow-list, its spec's `env`, what the server passes on by name
/// (`--job-env`), and DESIGN §4's variables.
#[tokio::test]
async fn a_dispatched_trial_starts_from_a_clean_environment() {
    let f = fixture();
    let db = common::sqlite_db();
    let port = common::free_port();
    let server_env = [
        ("AUGUR_TOKEN", "server-admin-secret"),
        ("AUGUR_DATABASE_URL", db.url.as_str()),
        ("CLOUD_CREDENTIALS", "do-not-leak"),
        ("WANDB_API_KEY", "passed-on-by-name"),
        ("AUGUR_LOG", "warn"),
    ];
    let child = Command::new(common::augur_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--job-env",
            "WANDB_API_KEY",
        ])
        .envs(server_env)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn augur serve");
    let server = common::ServerProcess {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    server.wait_ready().await;
    let http = common::http();
    let mut spec = study(
        &f,
        "clean-env",
        1,
        1,
        &[],
        json!({"env": {"PYTHONUNBUFFERED": "1"}}),
    );
    spec["trial_job"]["command"] = common::env_dump_command();
    let created = http
        .post(server.url("/v1/studies"))
        .bearer_auth("server-admin-secret")
        .json(&spec)
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), StatusCode::CREATED);
    let id = created.json::<Value>().await.expect("study")["id"]
        .as_i64()
        .expect("id");
    let runs = f.dir.path().join("runs");
    // `env -0 >` writes the file in one go once the shell runs: complete when it names the trial.
    let env = common::eventually("the job's environment", Duration::from_secs(30), || {
        let model_dir = common::study_dir(&runs, 1).join("1/model");
        async move {
            let env = common::read_job_env(&model_dir)?;
            if env.contains_key("AUGUR_TRIAL_ID") {
                Ok(env)
            } else {
                Err(format!("{env:?}"))
            }
        }
    })
    .await;
    let env = &env;
    common::assert_clean_job_env(env, &server_env, &["PYTHONUNBUFFERED", "WANDB_API_KEY"]);
    assert_eq!(env["WANDB_API_KEY"], "passed-on-by-name");
    assert_eq!(env["PYTHONUNBUFFERED"], "1");
    assert_ne!(env["AUGUR_TRIAL_TOKEN"], "server-admin-secret");
    assert_eq!(env["AUGUR_STUDY_ID"], id.to_string());
}

/// The same study file run again against a fresh database (its study is number 1 again, in
/// the same `output_dir`) finds none of the first run's checkpoints, and leaves its models
/// alone: each study's directory is named by its id and when it was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_study_in_a_fresh_database_finds_none_of_an_earlier_ones_checkpoints() {
    let dir = tempfile::tempdir().expect("dir");
    let runs = dir.path().join("runs");
    // Loss 0 for a trial that starts from nothing, 9 for one that found a checkpoint.
    let script = "if [ -e \"$AIP_CHECKPOINT_DIR/ckpt\" ]; then echo loss=9; else echo loss=0; \
                  fi; echo run > \"$AIP_CHECKPOINT_DIR/ckpt\"; echo mine > \"$AIP_MODEL_DIR/model\"";
    let spec = json!({
        "name": "same-file", "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 2, "parallel_trials": 1, "seed": 3,
        "trial_job": {"command": ["/bin/sh", "-c", script], "output_dir": runs.display().to_string()}
    });
    let mut ended = Vec::new();
    for _ in 0..2 {
        let app = common::spawn_app(common::sqlite_db()).await;
        let id = app.create_study(spec.clone()).await;
        assert_eq!(id, 1, "a fresh database numbers its studies from 1");
        ended.push(
            app.wait_for_state(id, "completed", Duration::from_secs(60))
                .await,
        );
    }
    for study in &ended {
        assert_eq!(
            study["best_trial"]["final_measurement"]["metrics"]["loss"], 0.0,
            "a trial found another study's checkpoint: {study}"
        );
    }
    let dirs: Vec<String> = std::fs::read_dir(&runs)
        .expect("runs")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs.len(), 2, "one directory per study: {dirs:?}");
    assert!(dirs.iter().all(|d| d.starts_with("study-1-")), "{dirs:?}");
    // `augur study best` names the best trial's model directory, in its study's directory.
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app.create_study(spec).await;
    let done = app
        .wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    let best = done["best_trial"]["id"].as_i64().expect("best");
    let out = std::process::Command::new(common::augur_bin())
        .args(["study", "best", &id.to_string(), "--url", &app.base])
        .env_remove("AUGUR_TOKEN")
        .output()
        .expect("augur study best");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Three studies numbered 1 share `runs`: this one's is named by when it was made too.
    let key = augur::model::StudyKey {
        id: StudyId::new(id),
        created_at: done["created_at"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .expect("created_at"),
    };
    let model = runs.join(key.dir_name()).join(format!("{best}/model"));
    assert!(
        stdout.contains(&format!("  model: {}", model.display())) && model.join("model").is_file(),
        "{stdout}"
    );
}

/// `augur trial retry`: a dispatched trial that failed runs again in its own directories
/// (it finds what its first run left) and completes; the study, completed with its budget
/// spent, goes on for it and completes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_trial_runs_again_in_its_own_directories() {
    let dir = tempfile::tempdir().expect("dir");
    let runs = dir.path().join("runs");
    // Fails the first time (leaving a mark in its checkpoint directory), completes after.
    let script = "if [ -e \"$AIP_CHECKPOINT_DIR/mark\" ]; then echo loss=1; \
                  else touch \"$AIP_CHECKPOINT_DIR/mark\"; exit 3; fi";
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app
        .create_study(json!({
            "name": "retry", "algorithm": "random",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
            "max_trials": 1, "seed": 3,
            "trial_job": {"command": ["/bin/sh", "-c", script], "output_dir": runs.display().to_string()}
        }))
        .await;
    let ended = app
        .wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    assert_eq!(ended["trial_counts"]["failed"], 1, "{ended}");
    let out = std::process::Command::new(common::augur_bin())
        .args(["trial", "retry", &id.to_string(), "1", "--url", &app.base])
        .env_remove("AUGUR_TOKEN")
        .output()
        .expect("augur trial retry");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ended = common::eventually(
        "the retried trial completes",
        Duration::from_secs(60),
        || {
            let app = &app;
            async move {
                let s = app.get(&routes::study(id)).await.body;
                if s["state"] == "completed" && s["trial_counts"]["completed"] == 1 {
                    Ok(s)
                } else {
                    Err(s.to_string())
                }
            }
        },
    )
    .await;
    assert_eq!(ended["trial_counts"]["failed"], 0, "{ended}");
    let trial = app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(
        trial["final_measurement"]["metrics"]["loss"], 1.0,
        "{trial}"
    );
    let log = std::fs::read_to_string(common::study_dir(&runs, id).join("1/job.log")).expect("log");
    assert_eq!(
        log.matches("=== augur: trial 1 attempt").count(),
        2,
        "both runs in one log: {log}"
    );
}
/// A random study of one trial over an integer `x` in 1..=3, minimizing `loss`, run by
/// `trial_job`.
fn one_trial_of_x(name: &str, trial_job: Value) -> Value {
    json!({
        "name": name,
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "integer", "min": 1, "max": 3}],
        "max_trials": 1,
        "seed": 3,
        "trial_job": trial_job,
    })
}

/// A worker pool whose own command names `${params_file}` finds the file, though the main
/// command does not name it (issue 28: the file was written only for the main command).
#[tokio::test]
async fn a_pools_own_command_naming_the_params_file_finds_it() {
    let f = fixture();
    let script = f.dir.path().join("params.py");
    std::fs::write(
        &script,
        r#"
import json, os, sys, time
model = os.environ["AIP_MODEL_DIR"]
if os.environ["AUGUR_REPLICA"] != "workerpool0-0":
    path = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--config=")][0]
    with open(path) as f:
        seen = json.load(f)
    with open(os.path.join(model, "seen.json"), "w") as f:
        json.dump(seen, f)
    time.sleep(1000)
for _ in range(400):
    if os.path.exists(os.path.join(model, "seen.json")):
        break
    time.sleep(0.05)
print("loss=1")
"#,
    )
    .expect("script");
    let app = common::spawn_app(common::sqlite_db()).await;
    let runs = f.dir.path().join("runs");
    let spec = one_trial_of_x(
        "pool-params-file",
        json!({
            "command": ["python3", script.display().to_string()],
            "output_dir": runs.display().to_string(),
            "worker_pools": [{}, {"command": ["python3", script.display().to_string(), "--config=${params_file}"]}]
        }),
    );
    let trial = first_trial_at_the_end(&app, spec).await;
    assert_eq!(trial["state"], "completed", "{trial}");
    let seen = std::fs::read_to_string(common::study_dir(&runs, 1).join("1/model/seen.json"))
        .expect("the worker read the params file");
    let seen: Value = serde_json::from_str(&seen).expect("JSON");
    assert_eq!(seen, trial["parameters"]);
}

/// A dispatched study with `study_stopping` ends before `max_trials` once three trials in a
/// row make no progress; without `should_stop_asap` the trials running then finish (none
/// fails, none is left), and no new one starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatched_study_stops_when_its_trials_stop_making_progress() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut spec = study(&f, "no-progress", 40, 2, &["--sleep=0.05"], json!({}));
    spec["study_stopping"] = json!({"max_num_trials_no_progress": 3});
    let id = app.create_study(spec).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    let reason = s["state_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("max_num_trials_no_progress: 3"),
        "the rule ended it: {s}"
    );
    let total = s["trial_counts"]["total"].as_i64().unwrap_or_default();
    assert!((4..40).contains(&total), "it stopped early: {s}");
    assert_eq!(
        s["trial_counts"]["completed"], total,
        "every trial finished: {s}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = app.get(&routes::study(id)).await.body;
    assert_eq!(
        later["trial_counts"]["total"], total,
        "none started after: {later}"
    );
}

/// With `should_stop_asap`, a dispatched study ends as soon as its trials stop making
/// progress: the dispatcher stops the jobs still running (their trials fail, cancelled) and
/// leaves nothing unfinished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_stop_asap_ends_a_dispatched_study_and_stops_its_jobs() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut spec = study(&f, "asap", 40, 3, &["--sleep=0.3"], json!({}));
    spec["study_stopping"] = json!({"max_num_trials_no_progress": 2, "should_stop_asap": true});
    let id = app.create_study(spec).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    let reason = s["state_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("max_num_trials_no_progress: 2"), "{s}");
    let counts = &s["trial_counts"];
    let total = counts["total"].as_i64().unwrap_or_default();
    assert!(total < 40, "it stopped early: {s}");
    common::eventually("no trial left running", Duration::from_secs(20), || async {
        let trials = app.get(&routes::trials(id)).await.body;
        let states: Vec<String> = trials["trials"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|t| t["state"].as_str().map(str::to_string))
            .collect();
        if states.iter().all(|s| s == "completed" || s == "failed") {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    })
    .await;
    let marker = f.script.display().to_string();
    common::eventually("no job process left", Duration::from_secs(5), || async {
        match common::processes_with(&marker) {
            0 => Ok(()),
            n => Err(format!("{n} job processes alive")),
        }
    })
    .await;
}
