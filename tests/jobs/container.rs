//! The container executor for real, through rootful Podman (`scripts/podman-setup.sh`
//! installs it and builds a Debian base image once): a trainer image built from that base
//! runs a 3-replica cluster trial as containers that rendezvous through the cluster
//! environment and report through the hypertune file in the mounted trial directory; a
//! crashed replica retries the whole cluster; a stop leaves no container behind; the cap
//! counts trials; the trial token never appears on a command line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use augur::dispatch::container::ContainerEngine;
use serde_json::{Value, json};

use crate::common::{self, TestApp, routes};

/// A replica for the failure cases (see `cluster.rs`'s script, of which this is the part the
/// container tests need).
const REPLICA_PY: &str = r#"
import argparse, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--learning_rate", type=float, default=0.1)
p.add_argument("--mode", default="hang")
a = p.parse_args()
name = os.environ["AUGUR_REPLICA"]
crashed = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "worker-crashed")
print("replica", name, "up", flush=True)
if a.mode == "crash_worker_once":
    if name == "workerpool1-0" and not os.path.exists(crashed):
        open(crashed, "w").write("attempt 1")
        time.sleep(0.5)
        sys.exit(3)
    if name == "workerpool0-0":
        # The first cluster is the one whose worker crashes: its primary never finishes.
        if not os.path.exists(crashed + ".seen"):
            open(crashed + ".seen", "w").write("primary of attempt 1")
            time.sleep(120)
        print("loss=0.25", flush=True)
        sys.exit(0)
time.sleep(1000)
"#;

/// The trainer image: the base image, the all-reduce example, this file's replica script and
/// the real `cloudml-hypertune` package (pure Python, copied from the test venv). Built once
/// per content (its tag is a hash of what goes in), by one test at a time: the tests start
/// together, and two builds of one tag race.
fn trainer_image(engine: &ContainerEngine, base: &str) -> String {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("examples/distributed/allreduce_train.py"))
        .expect("example");
    let python = common::python_with_hypertune();
    let site = Command::new(&python)
        .args([
            "-c",
            "import hypertune, os; print(os.path.dirname(hypertune.__file__))",
        ])
        .output()
        .expect("find hypertune");
    let hypertune_dir = PathBuf::from(String::from_utf8_lossy(&site.stdout).trim());
    let tag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (base, &example, REPLICA_PY).hash(&mut h);
        format!("localhost/augur-test-trainer:{:016x}", h.finish())
    };
    let exists = Command::new(&engine.program)
        .args(&engine.global_args)
        .args(["image", "exists", &tag])
        .status()
        .is_ok_and(|s| s.success());
    if exists {
        return tag;
    }
    let context = tempfile::tempdir().expect("context");
    std::fs::write(context.path().join("allreduce_train.py"), &example).expect("example");
    std::fs::write(context.path().join("replica.py"), REPLICA_PY).expect("replica");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&hypertune_dir)
        .arg(context.path().join("hypertune"))
        .status()
        .expect("cp");
    assert!(
        copied.success(),
        "copy hypertune from {}",
        hypertune_dir.display()
    );
    std::fs::write(
        context.path().join("Containerfile"),
        format!(
            "FROM {base}\nCOPY hypertune /usr/lib/python3/dist-packages/hypertune\n\
             COPY allreduce_train.py replica.py /app/\nWORKDIR /app\n"
        ),
    )
    .expect("Containerfile");
    let built = Command::new(&engine.program)
        .args(&engine.global_args)
        .args(["build", "-q", "--network=host", "-t", &tag])
        .arg(context.path())
        .current_dir(context.path())
        .output()
        .expect("podman build");
    assert!(
        built.status.success(),
        "podman build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    tag
}

/// Containers of study `study` of the test whose trials run under `runs` (any state): the
/// tests run at once on one Podman, and each has a study 1.
fn containers_of(engine: &ContainerEngine, runs: &Path, study: i64) -> Vec<String> {
    containers_labelled(engine, runs, &format!("augur.dev/study={study}")).expect("podman ps")
}

/// Containers carrying `label` (`key=value`) whose trial directory is under `runs`.
fn containers_labelled(
    engine: &ContainerEngine,
    runs: &Path,
    label: &str,
) -> std::io::Result<Vec<String>> {
    let out = Command::new(&engine.program)
        .args(&engine.global_args)
        .args(["ps", "--all", "--filter", &format!("label={label}")])
        .args([
            "--format",
            "{{.Names}}\t{{index .Labels \"augur.dev/trial-dir\"}}",
        ])
        .output()?;
    let mine = runs.display().to_string();
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, dir)| dir.starts_with(&mine))
        .map(|(name, _)| name.to_string())
        .collect())
}

struct Setup {
    app: TestApp,
    engine: ContainerEngine,
    image: String,
    runs: tempfile::TempDir,
}

/// A failed test's containers go with it: every Augur container of this test's directory.
impl Drop for Setup {
    fn drop(&mut self) {
        // No panic here: this runs while a failed test unwinds.
        let label = "app.kubernetes.io/managed-by=augur";
        let Ok(names) = containers_labelled(&self.engine, self.runs.path(), label) else {
            return;
        };
        for name in names {
            let _ = Command::new(&self.engine.program)
                .args(&self.engine.global_args)
                .args(["rm", "--force", "--time", "0", &name])
                .output();
        }
    }
}

async fn setup() -> Setup {
    setup_with(|_| {}).await
}

/// The server, its engine and the trainer image, with the server's configuration changed by
/// `configure`.
async fn setup_with(configure: impl FnOnce(&mut augur::ServerConfig) + Send + 'static) -> Setup {
    let (engine, base) = tokio::task::spawn_blocking(common::podman)
        .await
        .expect("podman");
    let image = {
        let engine = engine.clone();
        tokio::task::spawn_blocking(move || trainer_image(&engine, &base))
            .await
            .expect("image")
    };
    let runs = tempfile::tempdir().expect("runs");
    let app = {
        let engine = engine.clone();
        common::spawn_app_configured(common::sqlite_db(), move |c| {
            c.executors.containers = engine;
            configure(c);
        })
        .await
    };
    Setup {
        app,
        engine,
        image,
        runs,
    }
}

fn study(
    s: &Setup,
    name: &str,
    command: Value,
    max_trials: i64,
    parallel: i64,
    job: Value,
) -> Value {
    let mut trial_job = json!({
        "executor": "container",
        "image": s.image,
        "command": command,
        "worker_pools": [{"replicas": 1}, {"replicas": 2}],
        "output_dir": s.runs.path().join(name).display().to_string(),
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
        "parameters": [{"id": "learning_rate", "type": "double", "min": 0.01, "max": 0.3}],
        "max_trials": max_trials,
        "parallel_trials": parallel,
        "seed": 2,
        "trial_job": trial_job,
    })
}

/// Live processes whose command line holds `needle`; with `python_only`, only the replicas'
/// own interpreters (not the engine's client nor the container's init, whose command lines
/// repeat the replica's).
fn processes_matching(needle: &str, python_only: bool) -> usize {
    common::pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let line = String::from_utf8_lossy(&c);
                    line.contains(needle) && (!python_only || line.starts_with("python3\0"))
                })
                .unwrap_or(false)
        })
        .filter(|pid| common::alive(*pid))
        .count()
}

/// Whether some process's command line holds `needle`.
fn on_a_command_line(needle: &str) -> bool {
    processes_matching(needle, false) > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_trial_runs_as_containers_that_find_each_other_and_report_through_hypertune() {
    let s = setup().await;
    let marker = "/app/allreduce_train.py";
    let (peak, done, token_seen) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let monitor = {
        let (peak, done, token_seen) = (peak.clone(), done.clone(), token_seen.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(processes_matching(marker, true), Ordering::Relaxed);
                if on_a_command_line("AUGUR_TRIAL_TOKEN=") {
                    token_seen.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let spec = study(
        &s,
        "allreduce",
        json!(["python3", marker, "--epochs=3"]),
        4,
        2,
        json!({}),
    );
    let id = s.app.create_study(spec).await;
    let st = s
        .app
        .wait_for_state(id, "completed", Duration::from_secs(300))
        .await;
    done.store(true, Ordering::Relaxed);
    monitor.join().expect("monitor");
    assert_eq!(st["trial_counts"]["completed"], 4, "{st}");
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak <= 6,
        "{peak} replica containers at once for 2 trials of 3"
    );
    assert!(
        !token_seen.load(Ordering::Relaxed),
        "a trial token on a command line"
    );
    for trial in 1..=4 {
        let t = s.app.get(&routes::trial(id, trial)).await.body;
        // The hypertune file's entries, one per epoch, as measurements.
        let steps: Vec<i64> = t["measurements"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["step"].as_i64())
            .collect();
        assert!(steps.contains(&3), "trial {trial}: {t}");
        for (replica, rank) in [("workerpool0-0", 0), ("workerpool1-1", 2)] {
            let url = s
                .app
                .url(&routes::trial_logs_of_replica(id, trial, replica));
            let log = s
                .app
                .http
                .get(url)
                .send()
                .await
                .expect("logs")
                .text()
                .await
                .expect("text");
            assert!(
                log.contains(&format!("rank {rank} of 3")),
                "{replica}: {log}"
            );
            assert!(
                log.contains("rendezvous done: 3 replicas"),
                "{replica}: {log}"
            );
        }
        let env_dir = common::study_dir(&s.runs.path().join("allreduce"), id)
            .join(format!("{trial}/.container-env"));
        for entry in std::fs::read_dir(&env_dir).expect("env files").flatten() {
            use std::os::unix::fs::PermissionsExt;
            let mode = entry.metadata().expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", entry.path().display());
        }
    }
    assert!(
        containers_of(&s.engine, s.runs.path(), id).is_empty(),
        "{:?}",
        containers_of(&s.engine, s.runs.path(), id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_container_retries_the_whole_cluster_and_a_stop_leaves_none_behind() {
    let s = setup().await;
    let command = |mode: &str| json!(["python3", "/app/replica.py", format!("--mode={mode}")]);
    let spec = study(
        &s,
        "crash",
        command("crash_worker_once"),
        1,
        1,
        json!({"max_retries": 1}),
    );
    let id = s.app.create_study(spec).await;
    s.app
        .wait_for_state(id, "completed", Duration::from_secs(180))
        .await;
    let trial = s.app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(trial["state"], "completed", "{trial}");
    assert_eq!(trial["attempts"], 2, "{trial}");
    assert!(containers_of(&s.engine, s.runs.path(), id).is_empty());

    let spec = study(&s, "stopped", command("hang"), 4, 2, json!({}));
    let id = s.app.create_study(spec).await;
    common::eventually("six containers running", Duration::from_secs(120), || {
        let (engine, runs) = (s.engine.clone(), s.runs.path().to_path_buf());
        async move {
            let n = containers_of(&engine, &runs, id).len();
            if n >= 6 { Ok(()) } else { Err(format!("{n}")) }
        }
    })
    .await;
    let stopped = s.app.post(&routes::stop(id), json!({})).await;
    assert_eq!(stopped.body["state"], "stopped", "{}", stopped.body);
    common::eventually("no container left", Duration::from_secs(60), || {
        let (engine, runs) = (s.engine.clone(), s.runs.path().to_path_buf());
        async move {
            let left = containers_of(&engine, &runs, id);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        }
    })
    .await;
}

/// `--run-jobs-as` reaches containers too: the replica runs as that user (`--user`), writes
/// the model directory handed to it on the host, and its metrics reach the study.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_job_runs_as_the_run_jobs_as_user() {
    let uid = crate::run_as::test_user();
    let s = setup_with(|c| c.run_jobs_as = Some(crate::run_as::USER.into())).await;
    let write_uid = "import os; \
        open(os.environ['AIP_MODEL_DIR'] + 'uid', 'w').write(str(os.getuid())); \
        print('loss=0.5', flush=True)";
    let spec = study(
        &s,
        "run-as",
        json!(["python3", "-c", write_uid]),
        1,
        1,
        json!({"worker_pools": [{"replicas": 1}]}),
    );
    let id = s.app.create_study(spec).await;
    let st = s
        .app
        .wait_for_state(id, "completed", Duration::from_secs(180))
        .await;
    assert_eq!(st["trial_counts"]["completed"], 1, "{st}");
    let written = common::study_dir(&s.runs.path().join("run-as"), id).join("1/model/uid");
    let text =
        std::fs::read_to_string(&written).unwrap_or_else(|e| panic!("{}: {e}", written.display()));
    assert_eq!(text, uid.to_string(), "the job's uid");
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(&written).expect("metadata").uid();
    assert_eq!(owner, uid, "the file belongs to the job's user on the host");
    let trial = s.app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(
        trial["final_measurement"]["metrics"]["loss"], 0.5,
        "{trial}"
    );
}

/// The lines `scripts/podman-setup.sh` prints for people work as printed: the build line
/// makes the example trainer image from `examples/container/Containerfile`, and the run line
/// (with this build's binary for `cargo run --release --`, on a copy of the example study so
/// that its `runs/` lands outside the repository) trains every trial in a container of it.
#[tokio::test]
async fn the_example_trainer_image_builds_and_its_study_runs_with_the_lines_podman_setup_prints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf();
    let printed = tokio::task::spawn_blocking({
        let root = root.clone();
        move || {
            let out = Command::new(root.join("scripts/podman-setup.sh"))
                .output()
                .expect("podman-setup");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    })
    .await
    .expect("setup");
    let line = |prefix: &str| -> String {
        printed
            .lines()
            .find_map(|l| l.strip_prefix("#   ").filter(|l| l.starts_with(prefix)))
            .unwrap_or_else(|| panic!("podman-setup printed no `{prefix}` line: {printed}"))
            .to_string()
    };
    let build = line("podman ");
    let run = line("cargo run --release -- run -f examples/container/study.yaml ");
    let built = Command::new("bash")
        .args(["-c", &build])
        .current_dir(&root)
        .output()
        .expect("bash");
    assert!(
        built.status.success(),
        "{build}: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    let work = tempfile::tempdir().expect("work");
    let study = work.path().join("study.yaml");
    std::fs::copy(root.join("examples/container/study.yaml"), &study).expect("copy study");
    let run = run
        .replace(
            "cargo run --release --",
            &common::augur_bin().display().to_string(),
        )
        .replace(
            "examples/container/study.yaml",
            &study.display().to_string(),
        );
    let ran = tokio::task::spawn_blocking({
        let dir = work.path().to_path_buf();
        move || {
            Command::new("bash")
                .args(["-c", &run])
                .current_dir(dir)
                .env_remove("AUGUR_DATABASE_URL")
                .output()
                .expect("augur run")
        }
    })
    .await
    .expect("run");
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(
        stdout.contains("8 completed, 0 infeasible, 0 failed of 8 trials"),
        "{stdout}"
    );
    // Each trial ran in a container of the example image (its handle names the container),
    // and wrote its model through the mounted directory.
    let dir = common::study_dir(&work.path().join("runs"), 1);
    for trial in 1..=8 {
        let handle = std::fs::read_to_string(dir.join(format!("{trial}/job.handle")))
            .unwrap_or_else(|e| panic!("trial {trial}'s handle: {e}"));
        assert!(handle.starts_with("containers:augur-s1-t"), "{handle}");
        assert!(
            dir.join(format!("{trial}/model/model.json")).is_file(),
            "trial {trial} saved no model"
        );
    }
}

/// ASHA with the container executor: each rung of a trial is a container of the trainer
/// image that resumes from the checkpoint in the trial's mounted directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asha_resumes_container_trials_from_their_checkpoints() {
    let s = setup().await;
    let mut spec = crate::multi_fidelity::asha_spec("asha-container");
    let runs = s.runs.path().join("asha");
    spec["trial_job"] = json!({
        "executor": "container",
        "image": s.image,
        "command": ["python3", "-c", crate::multi_fidelity::TRAINER_PY],
        "output_dir": runs.display().to_string(),
    });
    let id = s.app.create_study(spec).await;
    let study = s
        .app
        .wait_for_state(id, "completed", Duration::from_secs(300))
        .await;
    crate::multi_fidelity::assert_ladder_climbed_by_resuming(&s.app, &study, &runs).await;
    assert!(
        containers_of(&s.engine, s.runs.path(), id).is_empty(),
        "no container left"
    );
}
