//! End-to-end dispatch through a real one-node Slurm (`sbatch`/`squeue`/`scontrol`/`scancel`):
//! a study runs its trials as batch jobs, never more than `parallel_trials` of them queued or
//! running; metrics come back from the job's output file and over HTTP; a job that exits
//! non-zero and a job cancelled from outside (a lost job) are retried.
//!
//! Needs Slurm running on this machine: `scripts/start-slurm.sh` (which `scripts/test.sh`
//! runs) installs and starts it. Without it these tests fail; they never skip.

use crate::common::{self, routes};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::TestApp;
use serde_json::{Value, json};

/// A trial script. Reports an intermediate measurement over HTTP with its trial token and
/// its final loss on stdout. `--mode` makes it crash once, always, or hang once.
const TRIAL_PY: &str = r#"
import argparse, json, os, sys, time, urllib.request
p = argparse.ArgumentParser()
p.add_argument("--x", type=float, required=True)
p.add_argument("--mode", default="ok")
p.add_argument("--sleep", type=float, default=0.3)
a = p.parse_args()
ckpt = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "ckpt")
if a.mode == "crash_always":
    sys.exit(3)
if a.mode == "chatty":
    for i in range(5000):
        print("progress %d of 5000" % i)
if a.mode in ("crash_once", "hang_once") and not os.path.exists(ckpt):
    open(ckpt, "w").write(os.environ["AIP_CHECKPOINT_DIR"])
    if a.mode == "crash_once":
        sys.exit(3)
    time.sleep(600)
loss = (a.x - 0.3) ** 2
url = "%s/v1/studies/%s/trials/%s/measurements" % (
    os.environ["AUGUR_URL"], os.environ["AUGUR_STUDY_ID"], os.environ["AUGUR_TRIAL_ID"])
body = json.dumps({"step": 0, "metrics": {"loss": loss + 1.0}}).encode()
req = urllib.request.Request(url, data=body, method="POST", headers={
    "Content-Type": "application/json",
    "Authorization": "Bearer " + os.environ["AUGUR_TRIAL_TOKEN"]})
urllib.request.urlopen(req, timeout=10).read()
time.sleep(a.sleep)
if os.path.exists(ckpt):
    print("resumed from", open(ckpt).read())
print("step=1 loss=%.12g" % loss)
"#;

/// Fails (never skips) unless Slurm's client commands are installed and the controller
/// answers.
pub(crate) fn require_slurm() {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("sbatch").is_file()));
    let flag = std::env::var("AUGUR_TEST_SLURM").unwrap_or_default();
    assert!(
        on_path,
        "sbatch is not on PATH: run scripts/start-slurm.sh (scripts/test.sh does) to install and \
         start a one-node Slurm (AUGUR_TEST_SLURM={flag:?})"
    );
    let ping = Command::new("scontrol")
        .arg("ping")
        .output()
        .expect("run scontrol ping");
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(
        text.contains("is UP"),
        "the Slurm controller is not running ({}): run scripts/start-slurm.sh",
        text.trim()
    );
}

/// The study's Slurm jobs still queued or running: `(job id, state)` of every job in
/// `squeue` whose batch script lies under `dir` (each test has its own directory; study ids
/// repeat across tests, so job names do not tell them apart).
fn jobs_under(dir: &Path) -> Vec<(String, String)> {
    let Ok(out) = Command::new("squeue")
        .args(["-h", "-o", "%i|%T|%o"])
        .output()
    else {
        return Vec::new();
    };
    let marker = dir.display().to_string();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, '|');
            let (id, state, command) = (fields.next()?, fields.next()?, fields.next()?);
            command
                .starts_with(&marker)
                .then(|| (id.trim().to_string(), state.trim().to_string()))
        })
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl Fixture {
    fn runs(&self) -> PathBuf {
        self.dir.path().join("runs")
    }
}

/// Whatever a failed test leaves queued is cancelled.
impl Drop for Fixture {
    fn drop(&mut self) {
        for (id, _) in jobs_under(self.dir.path()) {
            let _ = Command::new("scancel").arg(&id).status();
        }
    }
}

fn fixture() -> Fixture {
    require_slurm();
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
    mode: &str,
    max_retries: u32,
) -> Value {
    json!({
        "name": name,
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": max_trials,
        "parallel_trials": parallel,
        "seed": 5,
        "trial_job": {
            "executor": "slurm",
            "command": ["python3", f.script.display().to_string(), format!("--mode={mode}")],
            "max_retries": max_retries,
            "output_dir": f.runs().join(name).display().to_string()
        }
    })
}

async fn trials(app: &TestApp, id: i64) -> Vec<Value> {
    let body = app
        .get(&format!("{}?page_size=100", routes::trials(id)))
        .await
        .body;
    body["trials"].as_array().cloned().unwrap_or_default()
}

fn job_log(f: &Fixture, study: &str, trial: i64) -> String {
    std::fs::read_to_string(
        common::study_dir(&f.runs().join(study), 1)
            .join(trial.to_string())
            .join("job.log"),
    )
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_trials_two_at_a_time_run_through_sbatch() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let peak = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (peak, seen, done, dir) = (
            peak.clone(),
            seen.clone(),
            done.clone(),
            f.dir.path().to_path_buf(),
        );
        std::thread::spawn(move || {
            let mut ids = std::collections::BTreeSet::new();
            while !done.load(Ordering::Relaxed) {
                let jobs = jobs_under(&dir);
                peak.fetch_max(jobs.len(), Ordering::Relaxed);
                ids.extend(jobs.into_iter().map(|(id, _)| id));
                seen.store(ids.len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let id = app.create_study(study(&f, "eight", 8, 2, "ok", 0)).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(90))
        .await;
    done.store(true, Ordering::Relaxed);
    monitor.join().expect("monitor");
    assert_eq!(s["trial_counts"]["completed"], 8, "{s}");
    assert_eq!(s["trial_counts"]["total"], 8, "{s}");
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak <= 2,
        "{peak} Slurm jobs of the study were in squeue at once"
    );
    assert!(peak >= 1, "the monitor saw the study's jobs in squeue");
    assert!(
        seen.load(Ordering::Relaxed) >= 2,
        "several jobs were seen in squeue"
    );
    assert!(
        jobs_under(f.dir.path()).is_empty(),
        "no job outlived the study"
    );

    for t in trials(&app, id).await {
        let n = t["id"].as_i64().expect("trial id");
        assert_eq!(t["state"], "completed", "{t}");
        let x = t["parameters"]["x"].as_f64().expect("x");
        let want = (x - 0.3).powi(2);
        // The final measurement is the stdout line from the job's output file …
        let final_loss = t["final_measurement"]["metrics"]["loss"]
            .as_f64()
            .expect("final loss");
        assert!(
            (final_loss - want).abs() < 1e-9,
            "trial {n}: loss {final_loss}, want {want}: {t}"
        );
        assert_eq!(t["final_measurement"]["step"], 1, "{t}");
        // … and the job reached the server over HTTP with its trial token.
        let http = t["measurements"]
            .as_array()
            .expect("measurements")
            .iter()
            .find(|m| m["step"] == 0)
            .cloned();
        let http_loss = http.and_then(|m| m["metrics"]["loss"].as_f64());
        assert!(
            http_loss.is_some_and(|l| (l - want - 1.0).abs() < 1e-9),
            "trial {n}: {t}"
        );
        let log = job_log(&f, "eight", n);
        assert_eq!(
            log.matches("=== augur: trial").count(),
            1,
            "one attempt: {log}"
        );
        assert!(log.contains("loss="), "{log}");
        let script = common::study_dir(&f.runs().join("eight"), 1)
            .join(n.to_string())
            .join("slurm-attempt-1.sh");
        assert!(script.is_file(), "the batch script of trial {n} is kept");
    }
    // The logs are served like a local job's.
    let logs = app
        .http
        .get(app.url(&routes::trial_logs(id, 1)))
        .send()
        .await
        .expect("logs");
    assert!(logs.status().is_success());
    assert!(logs.text().await.expect("text").contains("step=1 loss="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_exiting_non_zero_is_retried_then_fails_for_good() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let once = app
        .create_study(study(&f, "crash-once", 1, 1, "crash_once", 1))
        .await;
    let always = app
        .create_study(study(&f, "crash-always", 1, 1, "crash_always", 1))
        .await;
    app.wait_for_state(once, "completed", Duration::from_secs(60))
        .await;
    app.wait_for_state(always, "completed", Duration::from_secs(60))
        .await;

    let t = &trials(&app, once).await[0];
    assert_eq!(t["state"], "completed", "retried after exit code 3: {t}");
    let log = job_log(&f, "crash-once", 1);
    assert_eq!(
        log.matches("=== augur: trial 1 attempt").count(),
        2,
        "{log}"
    );
    let ckpt = common::study_dir(&f.runs().join("crash-once"), 1).join("1/checkpoints/");
    assert!(
        log.contains(&format!("resumed from {}", ckpt.display())),
        "same checkpoint dir: {log}"
    );

    let t = &trials(&app, always).await[0];
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(
        t["fail_reason"], "exited with code 3 (after 2 attempt(s))",
        "{t}"
    );
    assert!(jobs_under(f.dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_from_outside_is_retried() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app
        .create_study(study(&f, "lost", 1, 1, "hang_once", 1))
        .await;
    // The first attempt leaves its checkpoint and hangs: cancel it behind Augur's back.
    let marker = || common::study_dir(&f.runs().join("lost"), 1).join("1/checkpoints/ckpt");
    let start = Instant::now();
    let job = loop {
        let jobs = jobs_under(f.dir.path());
        if marker().exists() && jobs.len() == 1 {
            break jobs[0].0.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the first attempt did not start: {jobs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let handle =
        std::fs::read_to_string(common::study_dir(&f.runs().join("lost"), 1).join("1/job.handle"))
            .expect("job handle");
    assert_eq!(handle.trim(), format!("slurm:{job}"));
    let cancelled = Command::new("scancel").arg(&job).status().expect("scancel");
    assert!(cancelled.success());

    app.wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    let t = &trials(&app, id).await[0];
    assert_eq!(
        t["state"], "completed",
        "retried after its job was cancelled: {t}"
    );
    let log = job_log(&f, "lost", 1);
    assert_eq!(
        log.matches("=== augur: trial 1 attempt").count(),
        2,
        "{log}"
    );
    let handle =
        std::fs::read_to_string(common::study_dir(&f.runs().join("lost"), 1).join("1/job.handle"))
            .expect("job handle");
    assert_ne!(
        handle.trim(),
        format!("slurm:{job}"),
        "a new job ran the retry"
    );
    assert!(jobs_under(f.dir.path()).is_empty());
}

/// `squeue`/`scontrol` lookups of single jobs answered by the controller so far (`sdiag`).
fn single_job_queries() -> u64 {
    let out = Command::new("sdiag").output().expect("run sdiag");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("REQUEST_JOB_INFO_SINGLE"))
        .and_then(|l| l.split("count:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatty_job_neither_floods_the_controller_nor_loses_its_last_lines() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let before = single_job_queries();
    let started = Instant::now();
    let id = app
        .create_study(study(&f, "chatty", 2, 2, "chatty", 0))
        .await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    let queries = single_job_queries().saturating_sub(before);
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        s["trial_counts"]["completed"], 2,
        "the metric after 5,000 lines was read: {s}"
    );
    for n in [1, 2] {
        let log = job_log(&f, "chatty", n);
        assert!(
            log.contains("progress 4999 of 5000"),
            "trial {n}'s log is whole"
        );
    }
    // Two jobs polled every half second need a few dozen lookups; other tests in this binary
    // add some. One lookup per printed line would be thousands.
    assert!(
        queries < 600,
        "{queries} job lookups by squeue/scontrol in {secs:.1} s for 2 jobs of 5,000 lines each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_study_cancels_its_slurm_jobs() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app
        .create_study(study(&f, "stop", 6, 2, "hang_once", 0))
        .await;
    let start = Instant::now();
    while !(1..=2).all(|n| {
        common::study_dir(&f.runs().join("stop"), 1)
            .join(format!("{n}/checkpoints/ckpt"))
            .exists()
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "jobs did not start: {:?}",
            jobs_under(f.dir.path())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(jobs_under(f.dir.path()).len(), 2);
    let stopped = app.post(&routes::stop(id), json!({})).await;
    assert_eq!(stopped.body["state"], "stopped");
    app.wait_for_cancelled_trials(id, 2, Duration::from_secs(20))
        .await;
    // The runner marks a trial failed only once its job has left the queue.
    assert!(
        jobs_under(f.dir.path()).is_empty(),
        "{:?}",
        jobs_under(f.dir.path())
    );
}

/// A Slurm job sees no more of the server's environment than a local one (sbatch exports the
/// submitter's whole environment by default), and its batch script, which holds the trial
/// token, is readable by its owner only.
#[tokio::test]
async fn a_slurm_job_starts_from_a_clean_environment_and_its_script_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut spec = study(&f, "clean-env", 1, 1, "ok", 0);
    spec["trial_job"]["command"] = common::env_dump_command();
    spec["trial_job"]["env"] = json!({"PYTHONUNBUFFERED": "1"});
    let id = app.create_study(spec).await;
    let done = app
        .wait_for_state(id, "completed", Duration::from_secs(90))
        .await;
    assert_eq!(done["trial_counts"]["completed"], 1, "{done}");
    let trial_dir = common::study_dir(&f.runs().join("clean-env"), 1).join("1");
    let env = &common::read_job_env(&trial_dir.join("model")).expect("the job's environment");
    // The in-process server's environment is this test's (CARGO_*, AUGUR_TEST_*: cargo and
    // scripts/test.sh set them). A batch job also gets the user's login environment on the
    // node (Slurm's --get-user-env, implied by --export=NONE): that is the user's, not the
    // server's, so only variables the login shell cannot have are checked.
    let servers_own: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("CARGO_") || k.starts_with("AUGUR_"))
        .collect();
    assert!(servers_own.iter().any(|k| k == "CARGO_MANIFEST_DIR"));
    for key in &servers_own {
        assert!(!env.contains_key(key), "the job saw the server's {key}");
    }
    common::assert_augur_job_env(env);
    assert_eq!(env["PYTHONUNBUFFERED"], "1");
    let script = trial_dir.join("slurm-attempt-1.sh");
    let mode = std::fs::metadata(&script)
        .expect("script")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "{} has mode {mode:o}",
        script.display()
    );
}

/// A cluster replica under Slurm: prints the configuration it was given; the primary reports
/// `loss=` after a second, `--mode=fail` makes workerpool1-0 die at once.
const REPLICA_PY: &str = r#"
import argparse, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--x", type=float, required=True)
p.add_argument("--mode", default="ok")
a = p.parse_args()
name = os.environ["AUGUR_REPLICA"]
print("replica", name, "task", os.environ.get("SLURM_PROCID"), "on", os.environ.get("SLURMD_NODENAME"), flush=True)
print("cluster_spec", os.environ["CLUSTER_SPEC"], flush=True)
print("tf_config", os.environ["TF_CONFIG"], flush=True)
print("torch", os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"), os.environ.get("RANK"), os.environ.get("WORLD_SIZE"), flush=True)
if name == "workerpool0-0":
    time.sleep(30 if a.mode == "fail" else 1.5)
    print("loss=%f" % ((a.x - 0.3) ** 2), flush=True)
elif a.mode == "fail" and name == "workerpool1-0":
    sys.exit(3)
else:
    time.sleep(120)
"#;

fn cluster_study(f: &Fixture, name: &str, mode: &str) -> Value {
    let script = f.dir.path().join("replica.py");
    std::fs::write(&script, REPLICA_PY).expect("write script");
    let mut spec = study(f, name, 1, 1, mode, 0);
    spec["trial_job"]["command"] = json!([
        "python3",
        script.display().to_string(),
        format!("--mode={mode}")
    ]);
    spec["trial_job"]["worker_pools"] = json!([{"replicas": 1}, {"replicas": 2}]);
    // Three tasks on this machine's two CPUs.
    spec["trial_job"]["slurm"] = json!({"sbatch_args": ["--overcommit"]});
    spec
}

/// A 3-replica cluster trial is one allocation whose tasks `srun` starts: each task finds its
/// replica by SLURM_PROCID and is told the allocation's hosts and its own place; the primary's
/// end stops the others and completes the trial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_trial_runs_its_replicas_as_the_tasks_of_one_srun() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app.create_study(cluster_study(&f, "cluster", "ok")).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    assert_eq!(s["trial_counts"]["completed"], 1, "{s}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let mut addresses = std::collections::BTreeSet::new();
    for (rank, replica) in ["workerpool0-0", "workerpool1-0", "workerpool1-1"]
        .iter()
        .enumerate()
    {
        let url = app.url(&routes::trial_logs_of_replica(id, 1, replica));
        let log = app
            .http
            .get(url)
            .send()
            .await
            .expect("logs")
            .text()
            .await
            .expect("text");
        assert!(
            log.contains(&format!("replica {replica} task {rank}")),
            "{replica}: {log}"
        );
        let line = |prefix: &str| -> Value {
            let text = log
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("{replica} printed no {prefix}: {log}"));
            serde_json::from_str(text).expect("JSON")
        };
        let spec = line("cluster_spec ");
        let (pool, index) = if rank == 0 { (0, 0) } else { (1, rank - 1) };
        assert_eq!(spec["task"]["type"], format!("workerpool{pool}"), "{spec}");
        assert_eq!(spec["task"]["index"], index, "{spec}");
        let workers = spec["cluster"]["workerpool1"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(workers.len(), 2, "{spec}");
        for a in spec["cluster"]["workerpool0"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(&workers)
        {
            let a = a.as_str().unwrap_or_default();
            assert!(
                a.starts_with(&format!("{}:", host.trim())),
                "an allocation host: {a}"
            );
            addresses.insert(a.to_string());
        }
        let tf = line("tf_config ");
        assert_eq!(
            tf["task"]["type"],
            if rank == 0 { "chief" } else { "worker" },
            "{tf}"
        );
        assert_eq!(tf["cluster"]["worker"], json!(workers));
    }
    assert_eq!(addresses.len(), 3, "a port per task: {addresses:?}");
    assert!(
        jobs_under(f.dir.path()).is_empty(),
        "{:?}",
        jobs_under(f.dir.path())
    );
}

/// A task that fails before the primary ends fails the attempt: `srun` stops every task and
/// the trial fails (no retries left), with nothing left in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_task_fails_the_cluster_attempt() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = app
        .create_study(cluster_study(&f, "cluster-fail", "fail"))
        .await;
    app.wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    let trial = app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(trial["state"], "failed", "{trial}");
    assert!(
        trial["fail_reason"]
            .as_str()
            .unwrap_or("")
            .contains("exited with code"),
        "{trial}"
    );
    assert!(
        jobs_under(f.dir.path()).is_empty(),
        "{:?}",
        jobs_under(f.dir.path())
    );
}

/// The operator's `--slurm-arg` options reach every job's `sbatch`, before the spec's own
/// (which may only be the options a spec is allowed: `tests/api/job_policy.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_sbatch_options_reach_every_job_with_the_specs() {
    let f = fixture();
    let marker = format!("augur-operator-{}", std::process::id());
    let app = common::spawn_app_configured(common::sqlite_db(), |c| {
        c.executors.slurm_args = vec![format!("--comment={marker}")];
    })
    .await;
    let mut spec = study(&f, "operator", 1, 1, "hang_once", 0);
    spec["trial_job"]["slurm"] = json!({"sbatch_args": ["--time=7"]});
    let id = app.create_study(spec).await;
    let under = f.dir.path().display().to_string();
    let seen = common::eventually("the job queued", Duration::from_secs(60), || {
        let (under, marker) = (under.clone(), marker.clone());
        async move {
            let out = Command::new("squeue")
                .args(["-h", "-o", "%k|%l|%o"])
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.lines()
                .find(|l| l.contains(&under))
                .filter(|l| l.starts_with(&format!("{marker}|")))
                .map(str::to_string)
                .ok_or(text)
        }
    })
    .await;
    assert!(seen.contains("|7:00|"), "the spec's --time=7: {seen}");
    let stopped = app.post(&routes::stop(id), json!({})).await;
    assert_eq!(stopped.body["state"], "stopped", "{}", stopped.body);
    app.wait_for_cancelled_trials(id, 1, Duration::from_secs(20))
        .await;
}
