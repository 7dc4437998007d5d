//! Trials as training clusters on the local executor, with real processes (DESIGN §4.1):
//! replicas that find each other through the configuration Augur writes, started and
//! stopped as one (a crashed worker retries the whole cluster into its checkpoint, a hung
//! one is killed at the timeout with every replica, stop and delete kill them all, a
//! SIGKILLed server leaves none behind), ports never shared, the cap counting trials, logs
//! per replica, and GPUs handed out per replica, never twice.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, TestApp, routes};

/// A replica for the failure cases: dumps its environment, then per `--mode`:
/// `ok` the primary reports `loss=` (after 3 s with `slow`), the others wait to be stopped;
/// `crash_worker_once`
/// workerpool1-0 dies on its first launch (the primary would wait 60 s); `hang` every
/// replica hangs (a worker with a child process); `gpu` each replica holds an exclusive
/// `flock` per device of its `CUDA_VISIBLE_DEVICES` for a moment (exit 7 if one is taken;
/// the kernel releases it when a replica is stopped holding it, as a GPU is released).
const REPLICA_PY: &str = r#"
import argparse, fcntl, json, os, subprocess, sys, time
p = argparse.ArgumentParser()
p.add_argument("--x", type=float, required=True)
p.add_argument("--mode", default="ok")
a = p.parse_args()
name = os.environ["AUGUR_REPLICA"]
model, ckpt = os.environ["AIP_MODEL_DIR"], os.environ["AIP_CHECKPOINT_DIR"]
os.makedirs(model, exist_ok=True)
json.dump(dict(os.environ), open(os.path.join(model, name + ".env.json"), "w"))
open(os.path.join(model, name + ".pid"), "a").write("%d\n" % os.getpid())
primary = name == "workerpool0-0"
crashed = os.path.join(ckpt, "worker-crashed")
print("replica", name, "up", flush=True)
if a.mode == "crash_worker_once":
    if name == "workerpool1-0" and not os.path.exists(crashed):
        open(crashed, "w").write("attempt 1")
        # Crash once every replica of this first cluster is up (however loaded the machine).
        names = ["workerpool0-0", "workerpool1-0", "workerpool1-1"]
        for _ in range(400):
            if all(os.path.exists(os.path.join(model, n + ".pid")) for n in names):
                break
            time.sleep(0.05)
        sys.exit(3)
    if primary:
        # The first cluster is the one whose worker crashes: its primary never finishes.
        if os.path.exists(crashed + ".seen"):
            print("resumed after the worker's crash", flush=True)
        else:
            open(crashed + ".seen", "w").write("primary of attempt 1")
            time.sleep(60)
if a.mode == "hang":
    if name == "workerpool1-0":
        child = subprocess.Popen(["sleep", "1000"])
        open(os.path.join(model, "child.pid"), "w").write(str(child.pid))
    time.sleep(1000)
if a.mode == "gpu":
    held = []
    for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(","):
        # flock, not a file that exists: a replica stopped while it holds the device (its
        # trial ended) releases it, as a real GPU is released when its process dies.
        lock = open(os.path.join(os.environ["GPU_LOCKS"], "gpu" + d), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("GPU", d, "is in use by another replica", flush=True)
            sys.exit(7)
        held.append(lock)
    time.sleep(0.6)
    for lock in held:
        lock.close()
    if not primary:
        sys.exit(0)
if primary:
    time.sleep(3 if a.mode == "slow" else 0.2)
    print("loss=%f" % ((a.x - 0.3) ** 2), flush=True)
else:
    time.sleep(1000)
"#;

struct Fixture {
    dir: tempfile::TempDir,
    script: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("replica.py");
    std::fs::write(&script, REPLICA_PY).expect("write script");
    Fixture { dir, script }
}

impl Fixture {
    fn runs(&self, study: &str) -> PathBuf {
        self.dir.path().join("runs").join(study)
    }

    /// Replica processes of this fixture still alive (by process group).
    fn alive(&self) -> usize {
        common::processes_with(&self.script.display().to_string())
    }

    /// Every replica process of this fixture is gone within a moment: killed processes take
    /// a few milliseconds to leave (longer on a loaded machine).
    async fn none_left(&self, what: &str) {
        common::eventually(what, Duration::from_secs(5), || async {
            match self.alive() {
                0 => Ok(()),
                n => Err(format!("{n} replica process groups alive")),
            }
        })
        .await;
    }
}

/// A study whose trials are clusters of `pools` replicas running `command`.
fn cluster_study(
    name: &str,
    command: Vec<String>,
    pools: &[u32],
    output: &Path,
    max_trials: i64,
    parallel: i64,
    job: Value,
) -> Value {
    let pools: Vec<Value> = pools.iter().map(|&n| json!({"replicas": n})).collect();
    let mut trial_job = json!({
        "command": command,
        "worker_pools": pools,
        "output_dir": output.display().to_string(),
        "env": {"PYTHONUNBUFFERED": "1"},
    });
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
        "seed": 11,
        "trial_job": trial_job,
    })
}

fn replica_command(f: &Fixture, mode: &str) -> Vec<String> {
    vec![
        "python3".into(),
        f.script.display().to_string(),
        format!("--mode={mode}"),
    ]
}

fn read_env(model_dir: &Path, replica: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(model_dir.join(format!("{replica}.env.json")))
        .unwrap_or_else(|e| panic!("{replica}'s environment in {}: {e}", model_dir.display()));
    serde_json::from_str(&text).expect("env JSON")
}

async fn replica_log(app: &TestApp, study: i64, trial: i64, replica: &str) -> String {
    let url = app.url(&routes::trial_logs_of_replica(study, trial, replica));
    let r = app.http.get(url).send().await.expect("logs");
    assert_eq!(r.status(), StatusCode::OK, "logs of {replica}");
    r.text().await.expect("text")
}

/// The all-reduce example: a primary and two workers rendezvous at the primary's address and
/// train together; two clusters run at once on distinct ports, and the cap counts trials
/// (two trials of three replicas: never more than six processes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_find_each_other_and_train_together_two_clusters_at_once() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/distributed/allreduce_train.py");
    let marker = example.display().to_string();
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
    let mut spec = cluster_study(
        "allreduce",
        vec!["python3".into(), marker.clone(), "--epochs=4".into()],
        &[1, 2],
        &f.runs("allreduce"),
        4,
        2,
        json!({}),
    );
    spec["parameters"] =
        json!([{"id": "learning_rate", "type": "double", "min": 0.01, "max": 0.3}]);
    let id = app.create_study(spec).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    done.store(true, Ordering::Relaxed);
    monitor.join().expect("monitor");
    assert_eq!(s["trial_counts"]["completed"], 4, "{s}");
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak <= 6,
        "{peak} replica processes at once for 2 trials of 3"
    );
    assert!(peak >= 4, "two clusters ran at once (peak {peak})");
    let mut ports_by_trial = Vec::new();
    for trial in 1..=4 {
        let primary = replica_log(&app, id, trial, "workerpool0-0").await;
        assert!(primary.contains("rank 0 of 3"), "{primary}");
        assert!(
            primary.contains("all_reduce_world=3"),
            "the primary all-reduced with 3: {primary}"
        );
        let mut ports = BTreeSet::new();
        for (replica, rank) in [("workerpool1-0", 1), ("workerpool1-1", 2)] {
            let log = replica_log(&app, id, trial, replica).await;
            assert!(
                log.contains(&format!("rank {rank} of 3")),
                "{replica}: {log}"
            );
            assert!(
                log.contains("rendezvous done: 3 replicas"),
                "{replica}: {log}"
            );
            let port = log
                .split("primary at 127.0.0.1:")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .expect("the primary's port")
                .to_string();
            ports.insert(port);
        }
        assert_eq!(
            ports.len(),
            1,
            "the workers agree on the primary: {ports:?}"
        );
        ports_by_trial.push(ports.into_iter().next().unwrap_or_default());
        let trial_json = app.get(&routes::trial(id, trial)).await.body;
        assert!(
            trial_json["final_measurement"]["metrics"]["loss"].is_number(),
            "{trial_json}"
        );
    }
    // Trials 1 and 2 ran at once, as did 3 and 4 (parallel_trials 2).
    assert_ne!(ports_by_trial[0], ports_by_trial[1], "{ports_by_trial:?}");
    assert_ne!(ports_by_trial[2], ports_by_trial[3], "{ports_by_trial:?}");
    let unknown = app
        .http
        .get(app.url(&routes::trial_logs_of_replica(id, 1, "workerpool2-0")))
        .send()
        .await
        .expect("logs");
    assert_eq!(unknown.status(), StatusCode::BAD_REQUEST);
}

/// Every replica gets the trial's arguments and environment plus its place: CLUSTER_SPEC,
/// TF_CONFIG, the torch variables, AUGUR_REPLICA; only the primary gets the trial's metric
/// file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_is_told_its_place_in_every_convention() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = cluster_study(
        "env",
        replica_command(&f, "ok"),
        &[1, 2, 1],
        &f.runs("env"),
        1,
        1,
        json!({}),
    );
    let id = app.create_study(spec).await;
    app.wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    let model = common::study_dir(&f.runs("env"), 1).join("1/model");
    let primary = read_env(&model, "workerpool0-0");
    let worker = read_env(&model, "workerpool1-1");
    let ps = read_env(&model, "workerpool2-0");
    let spec: Value = serde_json::from_str(&worker["CLUSTER_SPEC"]).expect("CLUSTER_SPEC");
    assert_eq!(
        spec["task"],
        json!({"type": "workerpool1", "index": 1, "trial": "1"})
    );
    let all: Vec<String> = ["workerpool0", "workerpool1", "workerpool2"]
        .iter()
        .flat_map(|p| spec["cluster"][p].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    assert_eq!(all.len(), 4, "{spec}");
    assert_eq!(
        all.iter().collect::<BTreeSet<_>>().len(),
        4,
        "every replica its own port: {all:?}"
    );
    // Every replica's TF_CONFIG: its task with the trial's id (a string, as Vertex's), one
    // cluster, and the job as Vertex's CustomJobSpec.
    let pools: Vec<Value> = [1, 2, 1]
        .iter()
        .map(|n: &u32| {
            json!({
                "replicaCount": n.to_string(),
                "containerSpec": {
                    "command": replica_command(&f, "ok"),
                    "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                },
                "machineSpec": {"machineType": "n1-standard-4"},
            })
        })
        .collect();
    let output = format!("file://{}", f.runs("env").display());
    let job = json!({
        "workerPoolSpecs": pools,
        "baseOutputDirectory": {"outputUriPrefix": output},
    });
    for (env, task_type, index) in [
        (&primary, "chief", 0),
        (&worker, "worker", 1),
        (&ps, "ps", 0),
    ] {
        let tf: Value = serde_json::from_str(&env["TF_CONFIG"]).expect("TF_CONFIG");
        assert_eq!(
            tf["task"],
            json!({"type": task_type, "index": index, "trial": "1"}),
            "{tf}"
        );
        assert_eq!(tf["job"], job, "{tf}");
        assert_eq!(tf["environment"], "cloud");
        let cluster_spec: Value = serde_json::from_str(&env["CLUSTER_SPEC"]).expect("CLUSTER_SPEC");
        assert_eq!(cluster_spec["job"], job);
    }
    let tf: Value = serde_json::from_str(&ps["TF_CONFIG"]).expect("TF_CONFIG");
    assert_eq!(tf["cluster"]["chief"], spec["cluster"]["workerpool0"]);
    assert_eq!(tf["cluster"]["worker"], spec["cluster"]["workerpool1"]);
    assert_eq!(
        format!("{}:{}", primary["MASTER_ADDR"], primary["MASTER_PORT"]),
        spec["cluster"]["workerpool0"][0]
            .as_str()
            .unwrap_or_default()
    );
    assert_eq!(
        (worker["RANK"].as_str(), worker["WORLD_SIZE"].as_str()),
        ("2", "3")
    );
    assert_eq!(primary["RANK"], "0");
    assert!(!ps.contains_key("RANK"));
    for env in [&primary, &worker, &ps] {
        assert_eq!(env["AUGUR_TRIAL_ID"], "1");
        assert_eq!(env["AIP_CHECKPOINT_DIR"], primary["AIP_CHECKPOINT_DIR"]);
        assert_eq!(env["AUGUR_TRIAL_TOKEN"], primary["AUGUR_TRIAL_TOKEN"]);
    }
    assert_ne!(
        worker["CLOUD_ML_HP_METRIC_FILE"],
        primary["CLOUD_ML_HP_METRIC_FILE"]
    );
    assert_eq!(worker["AUGUR_REPLICA"], "workerpool1-1");
    assert!(
        replica_log(&app, id, 1, "workerpool1-1")
            .await
            .contains("replica workerpool1-1 up"),
        "per-replica log"
    );
    f.none_left("the workers were stopped when the primary ended")
        .await;
}

/// A worker that dies fails the attempt: every replica is stopped and the whole cluster runs
/// again, into the same checkpoint directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_worker_stops_the_cluster_which_is_retried_from_its_checkpoint() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = cluster_study(
        "crash",
        replica_command(&f, "crash_worker_once"),
        &[1, 2],
        &f.runs("crash"),
        1,
        1,
        json!({"max_retries": 1}),
    );
    let id = app.create_study(spec).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    assert_eq!(s["trial_counts"]["completed"], 1, "{s}");
    let trial = app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(trial["attempts"], 2, "{trial}");
    let primary = replica_log(&app, id, 1, "workerpool0-0").await;
    assert!(
        primary.contains("resumed after the worker's crash"),
        "{primary}"
    );
    assert_eq!(
        primary.matches("=== augur: trial 1 attempt").count(),
        2,
        "{primary}"
    );
    // Every replica ran twice: the first cluster was stopped whole.
    let model = common::study_dir(&f.runs("crash"), 1).join("1/model");
    for replica in ["workerpool0-0", "workerpool1-0", "workerpool1-1"] {
        let pids = std::fs::read_to_string(model.join(format!("{replica}.pid"))).expect("pids");
        assert_eq!(pids.lines().count(), 2, "{replica}: {pids}");
        for pid in pids.lines() {
            assert!(
                !common::alive(pid.trim().parse().expect("pid")),
                "{replica} {pid}"
            );
        }
    }
    f.none_left("no replica outlived its attempt").await;
}

/// A hung cluster is killed at its timeout: every replica's process group, children too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cluster_is_killed_at_its_timeout_with_every_replica_and_child() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = cluster_study(
        "hang",
        replica_command(&f, "hang"),
        &[1, 2],
        &f.runs("hang"),
        1,
        1,
        json!({"timeout_secs": 2}),
    );
    let id = app.create_study(spec).await;
    // Its only trial failed: the budget is spent, so the study is done.
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    let trial = app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(trial["state"], "failed", "{trial}");
    assert!(
        trial["fail_reason"]
            .as_str()
            .unwrap_or("")
            .contains("timed out"),
        "{trial}\n{s}"
    );
    let child =
        std::fs::read_to_string(common::study_dir(&f.runs("hang"), 1).join("1/model/child.pid"))
            .expect("child");
    assert!(
        !common::alive(child.trim().parse().expect("pid")),
        "the worker's child was killed"
    );
    assert_eq!(f.alive(), 0);
}

/// Stopping a study, and deleting one, stop every replica of its running clusters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_delete_kill_every_replica() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    for (name, end) in [("stopped", "stop"), ("deleted", "delete")] {
        let spec = cluster_study(
            name,
            replica_command(&f, "hang"),
            &[1, 2],
            &f.runs(name),
            4,
            2,
            json!({}),
        );
        let id = app.create_study(spec).await;
        common::eventually("six replicas running", Duration::from_secs(30), || async {
            let n = common::processes_with(&f.runs(name).display().to_string())
                .max(count_pid_files(&f.runs(name), id));
            if n >= 6 { Ok(()) } else { Err(format!("{n}")) }
        })
        .await;
        let r = if end == "stop" {
            app.post(&routes::stop(id), json!({})).await
        } else {
            app.call(reqwest::Method::DELETE, &routes::study(id), None)
                .await
        };
        assert!(r.status.is_success(), "{end}: {}", r.body);
        common::eventually("every replica gone", Duration::from_secs(20), || async {
            let n = f.alive();
            if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} replica groups alive"))
            }
        })
        .await;
    }
}

/// Replicas that wrote their pid under study `study_id`'s output directory.
fn count_pid_files(runs: &Path, study_id: i64) -> usize {
    (1..=8)
        .map(|t| {
            std::fs::read_dir(common::study_dir(runs, study_id).join(format!("{t}/model")))
                .map(|d| {
                    d.filter_map(Result::ok)
                        .filter(|e| e.file_name().to_string_lossy().ends_with(".pid"))
                        .count()
                })
                .unwrap_or(0)
        })
        .sum()
}

/// SIGKILL of `augur serve` while clusters run, then a restart: the resumed trials kill the
/// leftover replicas first, none is orphaned, and the study ends with exactly `max_trials`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_server_mid_trial_leaves_no_orphan_replica() {
    let f = fixture();
    let db = common::sqlite_db();
    let port = common::free_port();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let http = common::http();
    let base = server.base.clone();
    // The primary takes long enough for the kill to land mid-trial.
    let command = replica_command(&f, "slow");
    let spec = cluster_study(
        "killed",
        command,
        &[1, 2],
        &f.runs("killed"),
        3,
        1,
        json!({"max_retries": 0}),
    );
    let id = common::call(
        &http,
        &base,
        None,
        reqwest::Method::POST,
        "/v1/studies",
        Some(spec),
    )
    .await
    .body["id"]
        .as_i64()
        .expect("id");
    common::eventually("a cluster running", Duration::from_secs(30), || async {
        let n = count_pid_files(&f.runs("killed"), 1);
        if n >= 3 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    server.kill();
    let mut server = common::ServerProcess::start(&db.url, port);
    server.wait_ready().await;
    let s = common::eventually("the study completed", Duration::from_secs(90), || {
        let (http, base) = (&http, &base);
        async move {
            let s = common::call(
                http,
                base,
                None,
                reqwest::Method::GET,
                &routes::study(id),
                None,
            )
            .await
            .body;
            if s["state"] == "completed" {
                Ok(s)
            } else {
                Err(s.to_string())
            }
        }
    })
    .await;
    server.kill();
    assert_eq!(s["trial_counts"]["total"], 3, "{s}");
    assert_eq!(s["trial_counts"]["completed"], 3, "{s}");
    assert_eq!(f.alive(), 0, "no replica outlived the service or its trial");
}

/// With `--gpus 0,1,2`, each replica asking for one gets its own: two trials of two replicas
/// cannot both run (four GPUs wanted, three there), so one waits, and no device is ever held
/// by two replicas at once (the replicas' device locks would clash: exit 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_go_one_replica_each_and_a_trial_waits_for_its_own() {
    let f = fixture();
    let locks = f.dir.path().join("gpu-locks");
    std::fs::create_dir_all(&locks).expect("locks dir");
    let db = common::sqlite_db();
    let mut config = augur::ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.executors.gpus = Some(vec!["0".into(), "1".into(), "2".into()]);
    let app = augur::App::build(config).await.expect("server");
    let addr = app.addr();
    tokio::spawn(app.run());
    let app = TestApp {
        addr,
        base: format!("http://{addr}"),
        http: common::http(),
        token: None,
        db,
    };
    let spec = cluster_study(
        "gpus",
        replica_command(&f, "gpu"),
        &[1, 1],
        &f.runs("gpus"),
        6,
        2,
        json!({"resources": {"gpu": 1}, "env": {"GPU_LOCKS": locks.display().to_string(), "PYTHONUNBUFFERED": "1"}}),
    );
    let started = Instant::now();
    let id = app.create_study(spec).await;
    let s = app
        .wait_for_state(id, "completed", Duration::from_secs(90))
        .await;
    let trials = app.get(&routes::trials(id)).await.body;
    assert_eq!(s["trial_counts"]["completed"], 6, "{s}\ntrials: {trials}");
    let mut devices = BTreeSet::new();
    for trial in 1..=6 {
        let model = common::study_dir(&f.runs("gpus"), 1).join(format!("{trial}/model"));
        let a = read_env(&model, "workerpool0-0")["CUDA_VISIBLE_DEVICES"].clone();
        let b = read_env(&model, "workerpool1-0")["CUDA_VISIBLE_DEVICES"].clone();
        assert_ne!(a, b, "trial {trial}: two replicas, two devices");
        assert_eq!((a.split(',').count(), b.split(',').count()), (1, 1));
        devices.extend([a, b]);
    }
    assert!(
        devices
            .iter()
            .all(|d| ["0", "1", "2"].contains(&d.as_str())),
        "{devices:?}"
    );
    assert!(
        started.elapsed() > Duration::from_millis(6 * 600 / 2),
        "trials could not all overlap"
    );
}

/// A cluster that cannot start whole (a worker's program does not exist) stops the replicas
/// started before it: none outlives the failed launch, and the trial fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_cannot_start_whole_leaves_no_replica() {
    let f = fixture();
    let app = common::spawn_app(common::sqlite_db()).await;
    let name = "half-started";
    let spec = cluster_study(
        name,
        replica_command(&f, "hang"),
        &[1, 1],
        &f.runs(name),
        1,
        1,
        json!({
            "worker_pools": [
                {"replicas": 1},
                {"replicas": 1, "command": ["/nonexistent/augur-test-program"]}
            ],
            "max_retries": 0,
        }),
    );
    let id = app.create_study(spec).await;
    common::eventually("the trial failed", Duration::from_secs(30), || async {
        let trial = app.get(&routes::trial(id, 1)).await.body;
        if trial["state"] == "failed" {
            Ok(())
        } else {
            Err(format!("{trial}"))
        }
    })
    .await;
    // Long enough for a primary left running to show up (it hangs for 1,000 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    f.none_left("no replica of the half-started cluster").await;
}
