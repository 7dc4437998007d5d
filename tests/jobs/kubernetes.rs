//! The kubernetes executor against an in-process stand-in for the API server
//! (`kube_standin.rs`: no API server runs on this machine), driven through the real `kube`
//! client and a kubeconfig the test writes. Each test says what it proves; together they
//! cover the executor's part of DESIGN §4.2: an Indexed Job per pool and a headless Service
//! per attempt, each replica told its own place in the cluster, the primary's log as the
//! trial's stdout, every way an attempt ends (success, a worker failing first, OOM kill, an
//! image that cannot be pulled, eviction, a vanished pod, a Job past its deadline), stop
//! deleting everything with propagation Background, adoption of an existing attempt, a
//! restarted service deleting its leftovers, the golden manifests of a 3-pool trial and their
//! validation against the official schemas; and ASHA's rungs as attempts that resume from the
//! trial's checkpoint directory on the output volume.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use augur::dispatch::cluster::{Address, ClusterLayout, cluster_env};
use augur::dispatch::environment::{TrialIdentity, trial_env};
use augur::dispatch::executor::{Executor, JobExit, JobRequest, RunningJob};
use augur::dispatch::kubernetes::manifests::{self, AttemptNames};
use augur::dispatch::kubernetes::{KubeConnection, KubeSettings, KubernetesExecutor};
use augur::dispatch::trial::replica_requests;
use augur::model::{
    OutputLayout, ReplicaId, StudyDir, StudyId, StudyKey, TrialDirs, TrialId, TrialJobSpec,
};
use augur_optimizer::Value as Param;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::common::{self, TestApp, routes};
use crate::kube_standin::{Deletion, Kind, StandIn};

const NS: &str = "augur-trials";

/// A trial job on Kubernetes: `pools` replicas per pool, options merged in from `extra`.
fn job_spec(pools: &[u32], extra: Value) -> TrialJobSpec {
    let mut job = json!({
        "executor": "kubernetes",
        "image": "registry.example/trainer:1.4",
        "command": ["python3", "train.py", "--note=$(HOME) costs $5"],
        "env": {"PYTHONUNBUFFERED": "1"},
        "resources": {"cpu": 2, "memory": "4Gi", "gpu": 1},
        "timeout_secs": 3600,
    });
    if !pools.is_empty() {
        let mut list: Vec<Value> = pools.iter().map(|&n| json!({"replicas": n})).collect();
        if let Some(ps) = list.get_mut(2) {
            ps["command"] = json!(["python3", "ps.py"]);
            ps["resources"] = json!({"cpu": 0.5, "memory": "1Gi"});
        }
        job["worker_pools"] = json!(list);
    }
    for (k, v) in extra.as_object().into_iter().flatten() {
        job[k] = v.clone();
    }
    let job: TrialJobSpec = serde_json::from_value(job).expect("a trial job");
    job.validate().expect("a valid trial job");
    job
}

/// When study 3 was made: its directory is `study-3-20261204T093000.000`.
const STUDY_CREATED: &str = "2026-12-04T09:30:00Z";

/// Attempt `attempt` of trial 7 of study 3, its directories under `base`, as `trial.rs`
/// would make it (with a server `PATH` that must not reach the pods).
fn request(job: &TrialJobSpec, base: &Path, attempt: u32) -> JobRequest {
    let (study_id, trial_id) = (3, 7);
    let key = StudyKey {
        id: StudyId::new(study_id),
        created_at: STUDY_CREATED.parse().expect("time"),
    };
    let study = StudyDir::below(base.join("runs"), key, OutputLayout::Study);
    let dirs = TrialDirs::new(&study, TrialId::new(trial_id));
    let params = [("x".to_string(), Param::Float(0.25))].into();
    let replicas = replica_requests(job, &params, TrialId::new(trial_id), &dirs);
    let identity = TrialIdentity {
        augur_url: "http://augur.example:8080",
        study_id: StudyId::new(study_id),
        trial_id: TrialId::new(trial_id),
        dirs: &dirs,
    };
    // The server's PATH (inherited by local jobs) and a variable it passes on by name
    // (`--job-env`), which may be a key.
    let base_env = [
        ("PATH".to_string(), "/server/only/bin".to_string()),
        (
            "TRACKER_API_KEY".to_string(),
            "key-of-the-server".to_string(),
        ),
    ];
    let mut env = trial_env(&base_env, &job.env, &identity);
    env.push((
        "AUGUR_TRIAL_TOKEN".into(),
        format!("token-of-attempt-{attempt}"),
    ));
    JobRequest {
        study_id: StudyId::new(study_id),
        study_created_at: key.created_at,
        trial_id: TrialId::new(trial_id),
        attempt,
        env,
        workdir: None,
        trial_dir: dirs.root.clone(),
        output_base: dirs.base.clone(),
        replicas,
        cluster: job.is_cluster().then(|| ClusterLayout::of(job)),
        copy_checkpoint_from: None,
    }
}

struct Rig {
    standin: Arc<StandIn>,
    executor: KubernetesExecutor,
    job: TrialJobSpec,
    dir: tempfile::TempDir,
}

async fn rig(job: TrialJobSpec) -> Rig {
    let standin = Arc::new(StandIn::start().await);
    let settings = KubeSettings {
        namespace: None,
        kubeconfig: Some(standin.kubeconfig(NS)),
        context: None,
    };
    Rig {
        executor: KubernetesExecutor::new(KubeConnection::new(settings), job.clone()),
        standin,
        job,
        dir: tempfile::tempdir().expect("temp dir"),
    }
}

impl Rig {
    async fn launch(
        &self,
        attempt: u32,
    ) -> (
        JobRequest,
        Box<dyn RunningJob>,
        mpsc::UnboundedReceiver<String>,
    ) {
        let request = request(&self.job, self.dir.path(), attempt);
        let (tx, rx) = mpsc::unbounded_channel();
        // As a trial's attempt does for every executor.
        augur::dispatch::executor::write_log_headers(&request)
            .await
            .expect("log headers");
        let job = self
            .executor
            .launch(&request, tx)
            .await
            .expect("the attempt starts");
        (request, job, rx)
    }

    /// Every pod of the attempt, ungated and running; by replica.
    async fn run_all(&self, attempt: u32, pools: &[u32]) -> BTreeMap<ReplicaId, String> {
        let names = AttemptNames::new(StudyId::new(3), TrialId::new(7), attempt);
        let mut pods = BTreeMap::new();
        for (pool, &n) in pools.iter().enumerate() {
            for index in 0..n as usize {
                let pod = self.standin.wait_pod(&names.job(pool), index).await;
                self.standin.wait_ungated(&pod).await;
                self.standin.run(&pod);
                pods.insert(ReplicaId { pool, index }, pod);
            }
        }
        pods
    }
}

async fn wait_exit(job: &mut Box<dyn RunningJob>) -> JobExit {
    tokio::time::timeout(Duration::from_secs(20), job.wait())
        .await
        .expect("the attempt ends")
}

fn background_deletions(standin: &StandIn, kind: Kind) -> Vec<String> {
    standin
        .deletions()
        .into_iter()
        .filter(|d| d.kind == kind && d.propagation.as_deref() == Some("Background"))
        .map(|d| d.name)
        .collect()
}

#[tokio::test]
async fn a_three_pool_trial_is_one_indexed_job_per_pool_and_each_replica_is_told_its_own_place() {
    let pools = [1, 2, 1];
    let rig = rig(job_spec(&pools, json!({}))).await;
    let (request, mut job, mut stdout) = rig.launch(1).await;
    let names = AttemptNames::new(StudyId::new(3), TrialId::new(7), 1);
    assert_eq!(
        rig.standin.names(Kind::Job),
        [
            "augur-s3-t7-a1-wp0",
            "augur-s3-t7-a1-wp1",
            "augur-s3-t7-a1-wp2"
        ]
    );
    assert_eq!(rig.standin.names(Kind::Service), ["augur-s3-t7-a1"]);
    assert_eq!(rig.standin.names(Kind::Secret), ["augur-s3-t7-a1"]);
    assert_eq!(
        job.handle().to_string(),
        format!("kubernetes:{NS}/augur-s3-t7-a1")
    );
    let workers = rig.standin.get(Kind::Job, &names.job(1)).expect("job");
    assert_eq!(workers["spec"]["completionMode"], "Indexed");
    assert_eq!(workers["spec"]["completions"], 2);
    assert_eq!(workers["spec"]["backoffLimit"], 0);
    assert_eq!(workers["spec"]["activeDeadlineSeconds"], 3600);
    assert_eq!(workers["metadata"]["labels"]["augur.dev/replica-pool"], "1");

    // Secrets are in the Secret: the Jobs only name them.
    let job_text = workers.to_string();
    assert!(!job_text.contains("token-of-attempt-1") && !job_text.contains("key-of-the-server"));
    let secret = rig
        .standin
        .get(Kind::Secret, "augur-s3-t7-a1")
        .expect("secret");
    assert_eq!(secret["stringData"]["TRACKER_API_KEY"], "key-of-the-server");

    let pods = rig.run_all(1, &pools).await;
    // Each replica sees exactly what the local executor would tell it, with the Service's
    // stable names as addresses.
    let layout = ClusterLayout::of(&rig.job);
    let address = |id: ReplicaId| Address {
        host: names.replica_host(id),
        port: "2222".into(),
    };
    for (id, pod) in &pods {
        let env = rig.standin.container_env(pod);
        for (name, want) in cluster_env(&layout, &address, *id, TrialId::new(7)) {
            assert_eq!(env.get(&name), Some(&want), "{name} of {}", id.name());
        }
        assert_eq!(env["AUGUR_TRIAL_TOKEN"], "token-of-attempt-1");
        assert_eq!(env["AUGUR_URL"], "http://augur.example:8080");
        assert_eq!(env["PYTHONUNBUFFERED"], "1");
        assert!(!env.contains_key("PATH"), "the server's PATH reached a pod");
        assert_eq!(env["TRACKER_API_KEY"], "key-of-the-server");
        assert_eq!(env["AIP_CHECKPOINT_DIR"], "/augur/output/7/checkpoints/");
        let metric_file = if id.is_primary() {
            "/augur/output/7/output.metrics".to_string()
        } else {
            format!("/augur/output/7/replicas/{}.metrics", id.name())
        };
        assert_eq!(env["CLOUD_ML_HP_METRIC_FILE"], metric_file);
        let argv = rig.standin.container_argv(pod);
        let replica = request
            .replicas
            .iter()
            .find(|r| r.id == *id)
            .expect("replica");
        assert_eq!(
            argv, replica.argv,
            "the command reaches the container unexpanded"
        );
    }
    let worker = rig
        .standin
        .container_env(&pods[&ReplicaId { pool: 1, index: 1 }]);
    assert_eq!(worker["RANK"], "2");
    assert_eq!(worker["MASTER_ADDR"], "augur-s3-t7-a1-wp0-0.augur-s3-t7-a1");

    let primary = &pods[&ReplicaId::PRIMARY];
    rig.standin.print(primary, "epoch 1 loss=0.5");
    rig.standin
        .print(&pods[&ReplicaId { pool: 1, index: 0 }], "worker says hi");
    rig.standin.print(primary, "loss=0.25");
    rig.standin.exit(primary, 0);
    assert_eq!(wait_exit(&mut job).await, JobExit::Exited(0));
    let mut lines = Vec::new();
    while let Ok(line) = stdout.try_recv() {
        lines.push(line);
    }
    assert_eq!(lines, ["epoch 1 loss=0.5", "loss=0.25"]);
    let primary_log = std::fs::read_to_string(&request.replicas[0].log_path).expect("job.log");
    assert!(
        primary_log.contains("=== augur: trial 7 attempt 1 workerpool0-0"),
        "{primary_log}"
    );
    assert!(
        primary_log.ends_with("epoch 1 loss=0.5\nloss=0.25\n"),
        "{primary_log}"
    );
    let worker_log = std::fs::read_to_string(&request.replicas[1].log_path).expect("worker log");
    assert!(worker_log.contains("worker says hi"), "{worker_log}");
    // The attempt is over: nothing of it is left, all deleted with propagation Background.
    rig.standin
        .wait_until("no objects left", |s| {
            s.names(Kind::Job).is_empty() && s.names(Kind::Pod).is_empty()
        })
        .await;
    assert!(rig.standin.names(Kind::Service).is_empty());
    assert!(rig.standin.names(Kind::Secret).is_empty());
    assert_eq!(background_deletions(&rig.standin, Kind::Job).len(), 3);
}

#[tokio::test]
async fn no_line_of_the_primary_is_lost_when_its_wait_is_dropped_for_every_line() {
    let rig = rig(job_spec(&[1, 1], json!({}))).await;
    let (_, mut job, mut stdout) = rig.launch(1).await;
    let pods = rig.run_all(1, &[1, 1]).await;
    let primary = &pods[&ReplicaId::PRIMARY];
    for i in 0..300 {
        rig.standin.print(primary, &format!("step {i}"));
    }
    rig.standin.print(primary, "loss=0.125");
    rig.standin.exit(primary, 0);
    // As the trial loop does: a line that arrives first drops the wait, which is called again.
    let mut lines = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let exit = loop {
        tokio::select! {
            exit = job.wait() => break exit,
            Some(line) = stdout.recv() => lines.push(line),
            _ = tokio::time::sleep_until(deadline) => panic!("the attempt did not end"),
        }
    };
    while let Ok(line) = stdout.try_recv() {
        lines.push(line);
    }
    assert_eq!(exit, JobExit::Exited(0));
    assert_eq!(lines.len(), 301);
    assert_eq!(lines.last().map(String::as_str), Some("loss=0.125"));
}

#[tokio::test]
async fn a_worker_that_fails_first_fails_the_attempt_and_the_other_pools_are_deleted() {
    let pools = [1, 2];
    let rig = rig(job_spec(&pools, json!({}))).await;
    let (_, mut job, _stdout) = rig.launch(1).await;
    let pods = rig.run_all(1, &pools).await;
    rig.standin.exit(&pods[&ReplicaId { pool: 1, index: 1 }], 3);
    let exit = wait_exit(&mut job).await;
    assert_eq!(
        exit,
        JobExit::ReplicaFailed {
            replica: "workerpool1-1".into(),
            exit: Box::new(JobExit::Exited(3))
        }
    );
    assert_eq!(exit.describe(), "replica workerpool1-1 exited with code 3");
    rig.standin
        .wait_until("every pod gone", |s| s.names(Kind::Pod).is_empty())
        .await;
    let jobs = background_deletions(&rig.standin, Kind::Job);
    assert!(jobs.contains(&"augur-s3-t7-a1-wp0".to_string()), "{jobs:?}");
    assert!(jobs.contains(&"augur-s3-t7-a1-wp1".to_string()), "{jobs:?}");
}

#[tokio::test]
async fn an_oom_killed_primary_fails_the_attempt_saying_so() {
    let rig = rig(job_spec(&[], json!({}))).await;
    let (_, mut job, _stdout) = rig.launch(1).await;
    let pods = rig.run_all(1, &[1]).await;
    rig.standin.oom_kill(&pods[&ReplicaId::PRIMARY]);
    let exit = wait_exit(&mut job).await;
    assert!(
        matches!(&exit, JobExit::Failed(why) if why.starts_with("OOMKilled") && why.contains("resources.memory")),
        "{exit:?}"
    );
    assert!(!exit.success());
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_fails_after_the_bounded_wait() {
    let rig = rig(job_spec(
        &[1, 1],
        json!({"kubernetes": {"image_pull_timeout_secs": 1}}),
    ))
    .await;
    let (_, mut job, _stdout) = rig.launch(1).await;
    let started = std::time::Instant::now();
    let names = AttemptNames::new(StudyId::new(3), TrialId::new(7), 1);
    let primary = rig.standin.wait_pod(&names.job(0), 0).await;
    let worker = rig.standin.wait_pod(&names.job(1), 0).await;
    rig.standin.run(&primary);
    rig.standin.image_pull_fails(&worker, "ErrImagePull");
    rig.standin.image_pull_fails(&worker, "ImagePullBackOff");
    let exit = wait_exit(&mut job).await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "no wait at all"
    );
    let JobExit::ReplicaFailed { replica, exit } = exit else {
        panic!("{exit:?}")
    };
    assert_eq!(replica, "workerpool1-0");
    assert!(
        matches!(&*exit, JobExit::Failed(why) if why.contains("could not be pulled within 1 s") && why.contains("registry.example/trainer:1.4")),
        "{exit:?}"
    );
}

#[tokio::test]
async fn an_evicted_pod_fails_the_attempt_with_the_kubelets_reason() {
    let rig = rig(job_spec(&[], json!({}))).await;
    let (_, mut job, _stdout) = rig.launch(1).await;
    let pods = rig.run_all(1, &[1]).await;
    rig.standin.evict(&pods[&ReplicaId::PRIMARY]);
    let exit = wait_exit(&mut job).await;
    assert!(
        matches!(&exit, JobExit::Failed(why) if why.contains("evicted: The node was low on resource: memory.")),
        "{exit:?}"
    );
}

#[tokio::test]
async fn a_pod_that_vanishes_with_its_node_fails_the_attempt_as_lost() {
    let rig = rig(job_spec(&[], json!({}))).await;
    let (_, mut job, _stdout) = rig.launch(2).await;
    let pods = rig.run_all(2, &[1]).await;
    rig.standin.vanish(&pods[&ReplicaId::PRIMARY]);
    let exit = wait_exit(&mut job).await;
    assert!(
        matches!(&exit, JobExit::Lost(why) if why.contains("vanished")),
        "{exit:?}"
    );
    assert!(
        exit.describe()
            .starts_with("lost: pod augur-s3-t7-a2-wp0-0")
    );
}

#[tokio::test]
async fn a_job_past_its_active_deadline_fails_the_attempt() {
    let rig = rig(job_spec(&[], json!({"timeout_secs": 60}))).await;
    let (_, mut job, _stdout) = rig.launch(1).await;
    rig.run_all(1, &[1]).await;
    rig.standin.deadline_exceeded("augur-s3-t7-a1-wp0");
    let exit = wait_exit(&mut job).await;
    assert!(
        matches!(&exit, JobExit::Failed(why) if why.contains("exceeded its active deadline (60 s")),
        "{exit:?}"
    );
}

#[tokio::test]
async fn stop_deletes_every_object_with_background_propagation_and_returns_once_the_pods_are_gone()
{
    let pools = [1, 3];
    let rig = rig(job_spec(&pools, json!({}))).await;
    let (_, mut job, _stdout) = rig.launch(1).await;
    rig.run_all(1, &pools).await;
    tokio::time::timeout(Duration::from_secs(40), job.stop(Duration::from_secs(1)))
        .await
        .expect("stop returns");
    assert!(
        rig.standin.names(Kind::Pod).is_empty(),
        "pods left after stop"
    );
    assert!(rig.standin.names(Kind::Job).is_empty());
    assert!(rig.standin.names(Kind::Service).is_empty());
    assert!(rig.standin.names(Kind::Secret).is_empty());
    let mut jobs = background_deletions(&rig.standin, Kind::Job);
    jobs.sort();
    assert_eq!(jobs, ["augur-s3-t7-a1-wp0", "augur-s3-t7-a1-wp1"]);
    // The Service and the Secret go with the primary's Job (their owner), or on their own.
    assert!(
        rig.standin
            .deletions()
            .iter()
            .any(|d| d.kind == Kind::Service && d.name == "augur-s3-t7-a1"),
        "{:?}",
        rig.standin.deletions()
    );
    assert!(
        rig.standin
            .deletions()
            .iter()
            .all(|d: &Deletion| d.propagation.is_some()),
        "a deletion without a propagation policy: {:?}",
        rig.standin.deletions()
    );
}

#[tokio::test]
async fn an_existing_attempt_of_the_same_name_is_adopted_not_an_error() {
    let rig = rig(job_spec(&[], json!({}))).await;
    let (_, first, _stdout) = rig.launch(1).await;
    let uid = rig
        .standin
        .get(Kind::Job, "augur-s3-t7-a1-wp0")
        .expect("job")["metadata"]["uid"]
        .clone();
    // The service lost track of its attempt (it died before recording the handle), and the
    // same launch runs again.
    drop(first);
    let (_, mut again, mut stdout) = rig.launch(1).await;
    let job = rig
        .standin
        .get(Kind::Job, "augur-s3-t7-a1-wp0")
        .expect("job");
    assert_eq!(
        job["metadata"]["uid"], uid,
        "the Job was made anew, not adopted"
    );
    let pods = rig.run_all(1, &[1]).await;
    rig.standin
        .print(&pods[&ReplicaId::PRIMARY], "accuracy=0.9");
    rig.standin.exit(&pods[&ReplicaId::PRIMARY], 0);
    assert_eq!(wait_exit(&mut again).await, JobExit::Exited(0));
    assert_eq!(stdout.recv().await.as_deref(), Some("accuracy=0.9"));
}

#[tokio::test]
async fn clean_up_stale_deletes_a_trials_leftovers_by_label_and_a_new_attempt_clears_older_ones() {
    let rig = rig(job_spec(&[1, 1], json!({}))).await;
    let (_, first, _stdout) = rig.launch(1).await;
    rig.run_all(1, &[1, 1]).await;
    let handle = first.handle();
    // The service died: its attempt is left running in the cluster.
    drop(first);
    rig.executor
        .clean_up_stale(&handle, StudyId::new(3), TrialId::new(7))
        .await;
    assert!(rig.standin.names(Kind::Job).is_empty());
    assert!(rig.standin.names(Kind::Pod).is_empty());
    assert!(rig.standin.names(Kind::Service).is_empty());
    assert!(rig.standin.names(Kind::Secret).is_empty());
    assert_eq!(background_deletions(&rig.standin, Kind::Job).len(), 2);
    let listed =
        rig.standin.requests().iter().any(|(m, p)| {
            m == "GET" && p.contains("/jobs?") && p.contains("augur.dev%2Fstudy%3D3")
        });
    assert!(listed, "the leftovers were not found by label");

    // An attempt whose handle was never recorded is cleared by the next attempt's launch.
    let (_, orphan, _stdout) = rig.launch(2).await;
    drop(orphan);
    let (_, _third, _stdout) = rig.launch(3).await;
    assert_eq!(
        rig.standin.names(Kind::Job),
        ["augur-s3-t7-a3-wp0", "augur-s3-t7-a3-wp1"]
    );
}

/// The manifests of a 3-pool trial with every option, as YAML documents.
fn three_pool_manifests() -> (String, String) {
    let job = job_spec(
        &[1, 2, 1],
        json!({
            "output_dir": "runs/svc-digits",
            "kubernetes": {
                "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "service_account": "trainer",
                "image_pull_secrets": ["registry-credentials"],
                "labels": {"team": "vision"},
                "annotations": {"sidecar.istio.io/inject": "false"},
                "output_volume": {"persistent_volume_claim": {"claim_name": "augur-runs", "mount_path": "/mnt/runs"}},
            },
        }),
    );
    let request = request(&job, Path::new("/srv/augur"), 2);
    let made = manifests::attempt_manifests(&request, &job, "augur").expect("manifests");
    let mut docs = Vec::new();
    if let Some(secret) = &made.secret {
        docs.push(yaml_serde::to_string(secret).expect("yaml"));
    }
    docs.push(yaml_serde::to_string(&made.service).expect("yaml"));
    for (_, j) in &made.jobs {
        docs.push(yaml_serde::to_string(j).expect("yaml"));
    }
    let per_index = yaml_serde::to_string(&made.per_index).expect("yaml");
    (docs.join("---\n"), per_index)
}

/// Compare with the committed file, or write it when `AUGUR_UPDATE_GOLDEN=1`.
fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/jobs/golden")
        .join(name);
    if std::env::var("AUGUR_UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("golden dir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (AUGUR_UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(
        expected == actual,
        "{} differs from what Augur generates now; if the change is intended, regenerate \
         it with AUGUR_UPDATE_GOLDEN=1 and review the diff.\n--- generated:\n{actual}",
        path.display()
    );
}

#[test]
fn the_manifests_of_a_three_pool_trial_are_pinned_by_a_golden_file() {
    let (objects, per_index) = three_pool_manifests();
    golden("kubernetes-3-pools.yaml", &objects);
    golden("kubernetes-3-pools-per-index.yaml", &per_index);
}

#[test]
fn every_manifest_augur_generates_validates_against_the_official_schemas() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-manifests");
    std::fs::create_dir_all(&out).expect("dir");
    let mut files = Vec::new();
    let mut write = |name: &str, docs: Vec<String>| {
        let path = out.join(name);
        std::fs::write(&path, docs.join("---\n")).expect("write manifest");
        files.push(path);
    };
    write("three-pools.yaml", vec![three_pool_manifests().0]);
    let variants = [
        ("one-replica.yaml", job_spec(&[], json!({})), None),
        (
            "object-store.yaml",
            job_spec(
                &[1, 3, 1, 1],
                json!({"output_dir": "gs://bucket/runs", "timeout_secs": null,
                       "kubernetes": {"output_volume": "object_store", "namespace": "ml"}}),
            ),
            None,
        ),
        // A PBT segment that copies trial 5's checkpoint: the primary's init container.
        (
            "pbt-copy.yaml",
            job_spec(
                &[1, 2],
                json!({"output_dir": "pbt", "kubernetes": {"output_volume":
                    {"persistent_volume_claim": {"claim_name": "runs", "mount_path": "/mnt/runs"}}}}),
            ),
            Some(5),
        ),
    ];
    for (name, job, copy_from) in variants {
        let mut request = request(&job, Path::new("/srv/augur"), 1);
        request.copy_checkpoint_from = copy_from.map(TrialId::new);
        let made = manifests::attempt_manifests(&request, &job, "augur").expect("manifests");
        for (pool, j) in &made.jobs {
            let pod = j.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            let copies = pod.is_some_and(|p| p.init_containers.is_some());
            assert_eq!(
                copies,
                copy_from.is_some() && *pool == 0,
                "{name}: only the primary's pod copies, and only when told to (pool {pool})"
            );
        }
        let mut docs = vec![yaml_serde::to_string(&made.service).expect("yaml")];
        docs.extend(
            made.secret
                .iter()
                .map(|s| yaml_serde::to_string(s).expect("yaml")),
        );
        docs.extend(
            made.jobs
                .iter()
                .map(|(_, j)| yaml_serde::to_string(j).expect("yaml")),
        );
        write(name, docs);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kubernetes-validate.sh");
    let output = std::process::Command::new("bash")
        .arg(script)
        .args(&files)
        .output()
        .expect("run kubernetes-validate");
    assert!(
        output.status.success(),
        "kubernetes-validate rejected a manifest:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The tests' kubelet for whole studies: runs every pod once it is ungated; a primary prints
/// `accuracy=<1 - |lr - 0.01|>` (from its `--lr=` argument) and exits 0 unless `hang`; other
/// replicas run until they are deleted.
fn kubelet(standin: Arc<StandIn>, hang: bool) -> tokio::task::JoinHandle<()> {
    kubelet_skipping(standin, hang, Vec::new())
}

/// [`kubelet`], leaving the pods named in `skip` as they are.
fn kubelet_skipping(
    standin: Arc<StandIn>,
    hang: bool,
    skip: Vec<String>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut handled: std::collections::HashSet<String> = skip.into_iter().collect();
        loop {
            for (name, pod) in standin.run_new_pods(&mut handled) {
                let primary = pod["metadata"]["labels"]["augur.dev/replica-pool"] == "0";
                if primary && !hang {
                    let argv = standin.container_argv(&name);
                    let lr: f64 = argv
                        .iter()
                        .find_map(|a| a.strip_prefix("--lr="))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0.5);
                    standin.print(&name, &format!("accuracy={}", 1.0 - (lr - 0.01).abs()));
                    standin.exit(&name, 0);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

async fn server_on(standin: &StandIn) -> (TestApp, tempfile::TempDir) {
    server_configured(standin, |_| {}).await
}

/// [`server_on`], with more of the server's configuration set by `configure`.
async fn server_configured(
    standin: &StandIn,
    configure: impl FnOnce(&mut augur::ServerConfig),
) -> (TestApp, tempfile::TempDir) {
    let db = common::sqlite_db();
    let runs = tempfile::tempdir().expect("temp dir");
    let mut config = augur::ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.public_url = Some("http://augur.augur.svc:8080".into());
    config.base_dir = Some(runs.path().to_path_buf());
    config.executors.kubernetes = KubeSettings {
        namespace: Some(NS.into()),
        kubeconfig: Some(standin.kubeconfig("ignored")),
        context: None,
    };
    configure(&mut config);
    let app = augur::App::build(config).await.expect("server starts");
    let addr = app.addr();
    tokio::spawn(app.run());
    let app = TestApp {
        addr,
        base: format!("http://{addr}"),
        http: common::http(),
        token: None,
        db,
    };
    (app, runs)
}

fn kube_study(max_trials: i64, parallel: i64, pools: Value) -> Value {
    let mut spec = common::spec("random", max_trials, parallel);
    spec["trial_job"] = json!({
        "executor": "kubernetes",
        "image": "registry.example/trainer:1.4",
        "command": ["python3", "train.py"],
        "worker_pools": pools,
    });
    spec
}

#[tokio::test]
async fn a_study_on_kubernetes_completes_its_trials_from_the_primarys_log_in_the_namespace_given() {
    let standin = Arc::new(StandIn::start().await);
    let _kubelet = kubelet(standin.clone(), false);
    let (app, _runs) = server_on(&standin).await;
    let id = app
        .create_study(kube_study(4, 2, json!([{"replicas": 1}, {"replicas": 2}])))
        .await;
    app.wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    let trials = app.get(&routes::trials(id)).await.body;
    for t in trials["trials"].as_array().expect("trials") {
        assert_eq!(t["state"], "completed", "{t}");
        assert!(
            t["final_measurement"]["metrics"]["accuracy"].is_number(),
            "{t}"
        );
    }
    let jobs_created = standin
        .requests()
        .iter()
        .filter(|(m, p)| {
            m == "POST" && p.starts_with(&format!("/apis/batch/v1/namespaces/{NS}/jobs"))
        })
        .count();
    assert_eq!(
        jobs_created, 8,
        "two Jobs per trial, in the server's namespace"
    );
    standin
        .wait_until("every attempt deleted", |s| s.names(Kind::Job).is_empty())
        .await;
}

#[tokio::test]
async fn stopping_a_study_deletes_its_running_jobs_in_the_background() {
    let standin = Arc::new(StandIn::start().await);
    let _kubelet = kubelet(standin.clone(), true);
    let (app, _runs) = server_on(&standin).await;
    let id = app
        .create_study(kube_study(4, 2, json!([{"replicas": 1}, {"replicas": 1}])))
        .await;
    standin
        .wait_until("two trials running", |s| s.names(Kind::Job).len() == 4)
        .await;
    let stopped = app.post(&routes::stop(id), json!({})).await;
    assert!(stopped.status.is_success(), "{}", stopped.body);
    app.wait_for_cancelled_trials(id, 2, Duration::from_secs(30))
        .await;
    assert!(standin.names(Kind::Job).is_empty());
    assert!(standin.names(Kind::Pod).is_empty());
    assert_eq!(background_deletions(&standin, Kind::Job).len(), 4);
}

#[tokio::test]
async fn deleting_a_study_deletes_its_running_jobs_in_the_background() {
    let standin = Arc::new(StandIn::start().await);
    let _kubelet = kubelet(standin.clone(), true);
    let (app, _runs) = server_on(&standin).await;
    let id = app
        .create_study(kube_study(4, 2, json!([{"replicas": 1}, {"replicas": 2}])))
        .await;
    standin
        .wait_until("two trials running", |s| s.names(Kind::Job).len() == 4)
        .await;
    let deleted = app
        .call(reqwest::Method::DELETE, &routes::study(id), None)
        .await;
    assert!(deleted.status.is_success(), "{}", deleted.body);
    standin
        .wait_until("every Job and pod deleted", |s| {
            s.names(Kind::Job).is_empty() && s.names(Kind::Pod).is_empty()
        })
        .await;
    assert_eq!(background_deletions(&standin, Kind::Job).len(), 4);
}

#[tokio::test]
async fn an_early_stopped_trial_has_its_jobs_deleted_in_the_background() {
    let standin = Arc::new(StandIn::start().await);
    // Trial 1 rises to 0.9 and completes; trial 2 stays at 0.1 and would run forever.
    let kubelet = {
        let standin = standin.clone();
        tokio::spawn(async move {
            let mut handled = std::collections::HashSet::new();
            loop {
                for pod in standin.objects(Kind::Pod) {
                    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
                    if pod["metadata"]["labels"]["augur.dev/replica-pool"] != "0"
                        || !handled.insert(name.clone())
                    {
                        continue;
                    }
                    standin.run(&name);
                    let good = standin.container_env(&name)["AUGUR_TRIAL_ID"] == "1";
                    for step in 1..=3 {
                        let accuracy = if good {
                            0.5 + 0.1 * f64::from(step)
                        } else {
                            0.1
                        };
                        standin.print(&name, &format!("step={step} accuracy={accuracy}"));
                    }
                    if good {
                        standin.exit(&name, 0);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let (app, _runs) = server_on(&standin).await;
    let mut spec = kube_study(2, 1, json!([{"replicas": 1}, {"replicas": 1}]));
    spec["early_stopping"] = json!({"rule": "median", "min_completed_trials": 1});
    let id = app.create_study(spec).await;
    app.wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    kubelet.abort();
    let second = app.get(&routes::trial(id, 2)).await.body;
    assert_eq!(second["state"], "completed", "{second}");
    assert_eq!(second["early_stopped"], true, "{second}");
    let mut jobs = background_deletions(&standin, Kind::Job);
    jobs.sort();
    assert!(
        jobs.contains(&"augur-s1-t2-a1-wp0".to_string())
            && jobs.contains(&"augur-s1-t2-a1-wp1".to_string()),
        "{jobs:?}"
    );
    assert!(standin.names(Kind::Pod).is_empty());
}

#[tokio::test]
async fn a_trial_past_its_timeout_is_retried_and_its_jobs_are_deleted() {
    let standin = Arc::new(StandIn::start().await);
    let _kubelet = kubelet(standin.clone(), true);
    let (app, _runs) = server_on(&standin).await;
    let mut spec = kube_study(1, 1, json!([{"replicas": 1}]));
    spec["trial_job"]["timeout_secs"] = json!(1);
    spec["trial_job"]["max_retries"] = json!(1);
    let id = app.create_study(spec).await;
    let trial = common::eventually("the trial fails", Duration::from_secs(30), || {
        let app = &app;
        async move {
            let t = app.get(&routes::trial(id, 1)).await.body;
            if t["state"] == "failed" {
                Ok(t)
            } else {
                Err(t.to_string())
            }
        }
    })
    .await;
    assert_eq!(
        trial["fail_reason"], "timed out after 1 s (after 2 attempt(s))",
        "{trial}"
    );
    let mut jobs = background_deletions(&standin, Kind::Job);
    jobs.sort();
    assert_eq!(jobs, ["augur-s1-t1-a1-wp0", "augur-s1-t1-a2-wp0"]);
}

#[tokio::test]
async fn a_restarted_service_deletes_the_attempt_it_left_and_runs_the_trial_again() {
    let standin = Arc::new(StandIn::start().await);
    let dir = tempfile::tempdir().expect("temp dir");
    let db = format!("sqlite://{}", dir.path().join("augur.db").display());
    let kubeconfig = standin.kubeconfig(NS);
    let start = |port: u16| {
        let child = std::process::Command::new(common::augur_bin())
            .args([
                "serve",
                "--database-url",
                &db,
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .args([
                "--public-url",
                "http://augur.augur.svc:8080",
                "--kubeconfig",
            ])
            .arg(&kubeconfig)
            .current_dir(dir.path())
            .env("AUGUR_LOG", "warn")
            .env_remove("AUGUR_TOKEN")
            .env_remove("KUBECONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("augur serve");
        common::ServerProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    };
    let port = common::free_port();
    let mut server = start(port);
    server.wait_ready().await;
    let http = common::http();
    let created = common::call(
        &http,
        &server.base,
        None,
        reqwest::Method::POST,
        "/v1/studies",
        Some(kube_study(1, 1, json!([{"replicas": 1}, {"replicas": 1}]))),
    )
    .await;
    assert_eq!(
        created.status,
        reqwest::StatusCode::CREATED,
        "{}",
        created.body
    );
    let names = AttemptNames::new(StudyId::new(1), TrialId::new(1), 1);
    let first = standin.wait_pod(&names.job(0), 0).await;
    standin.wait_pod(&names.job(1), 0).await;
    standin.run(&first);
    // Killed once the attempt is recorded (its handle written after the launch).
    let handle = common::study_dir(&dir.path().join("augur-runs"), 1).join("1/job.handle");
    common::eventually("the attempt's handle", Duration::from_secs(10), || {
        let handle = handle.clone();
        async move {
            match std::fs::read_to_string(&handle) {
                Ok(text) if text.starts_with("kubernetes:") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let old_uid = standin.get(Kind::Job, &names.job(0)).expect("job")["metadata"]["uid"].clone();
    // The service is killed mid-trial: its Jobs keep running in the cluster.
    server.kill();
    assert_eq!(standin.names(Kind::Job).len(), 2);
    let _kubelet = kubelet_skipping(standin.clone(), false, standin.names(Kind::Pod));
    let mut server = start(port);
    server.wait_ready().await;
    let trial = common::eventually(
        "the resumed trial completes",
        Duration::from_secs(60),
        || {
            let (http, base) = (&http, &server.base);
            async move {
                let t = common::call(
                    http,
                    base,
                    None,
                    reqwest::Method::GET,
                    &routes::trial(1, 1),
                    None,
                )
                .await
                .body;
                if t["state"] == "completed" {
                    Ok(t)
                } else {
                    Err(t.to_string())
                }
            }
        },
    )
    .await;
    assert!(
        trial["final_measurement"]["metrics"]["accuracy"].is_number(),
        "{trial}"
    );
    // The leftover was found by label and deleted in the background before the new attempt
    // (the interrupted launch given back: the same attempt number, a new Job).
    let deletions = background_deletions(&standin, Kind::Job);
    assert!(
        deletions.contains(&names.job(0)) && deletions.contains(&names.job(1)),
        "{deletions:?}"
    );
    let relisted = standin
        .requests()
        .iter()
        .any(|(m, p)| m == "GET" && p.contains("/jobs?") && p.contains("augur.dev%2Ftrial%3D1"));
    assert!(relisted);
    let jobs_made = standin
        .requests()
        .iter()
        .filter(|(m, p)| m == "POST" && p.split('?').next().is_some_and(|p| p.ends_with("/jobs")))
        .count();
    assert_eq!(jobs_made, 4, "one attempt before the restart, one after");
    let uid = standin
        .objects(Kind::Job)
        .first()
        .map(|j| j["metadata"]["uid"].clone());
    assert_ne!(uid, Some(old_uid), "the leftover Job was kept");
    server.kill();
}

/// `augur trial exec` into a pod goes through the pod API's `exec` (the real client against
/// the stand-in, which runs the command here with the container's environment): the replica
/// asked for, its stdout and stderr apart, stdin to its end (protocol v5's close), the exit
/// code from the final Status; a replica without a running pod is refused.
#[tokio::test]
async fn exec_runs_a_command_in_a_replicas_pod_through_the_pod_api() {
    use augur::dispatch::exec::ExecVia;
    use augur::service::exec::{ExecExit, ExecInput, ExecOutput, ExecRequest, ExecTarget};
    let pools = [1, 2];
    let rig = rig(job_spec(&pools, json!({}))).await;
    let (request, job, _stdout) = rig.launch(1).await;
    rig.run_all(1, &pools).await;
    let key = StudyKey {
        id: StudyId::new(3),
        created_at: STUDY_CREATED.parse().expect("time"),
    };
    let study = StudyDir::below(rig.dir.path().join("runs"), key, OutputLayout::Study);
    let target = ExecTarget {
        study_id: request.study_id,
        trial_id: request.trial_id,
        job: rig.job.clone(),
        dirs: TrialDirs::new(&study, TrialId::new(7)),
        handle: job.handle().to_string(),
    };
    let exec = |replica: ReplicaId| ExecRequest {
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo \"$AUGUR_REPLICA\"; cat; echo oops >&2; exit 7".into(),
        ],
        tty: false,
        rows: 24,
        cols: 80,
        replica,
    };
    let via = rig
        .executor
        .exec(
            &job.handle(),
            &target,
            &exec(ReplicaId { pool: 1, index: 1 }),
        )
        .await
        .expect("a session");
    let ExecVia::Session(mut session) = via else {
        panic!("the pod API's exec is a session of its own, not a local process");
    };
    session
        .input
        .send(ExecInput::Stdin(b"typed\n".to_vec()))
        .await
        .expect("stdin");
    session.input.send(ExecInput::Eof).await.expect("eof");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let exit = loop {
        let next = tokio::time::timeout(Duration::from_secs(20), session.output.recv())
            .await
            .expect("output in time")
            .expect("an exit before the end");
        match next {
            ExecOutput::Stdout(b) => out.extend(b),
            ExecOutput::Stderr(b) => err.extend(b),
            ExecOutput::Exit(exit) => break exit,
        }
    };
    assert_eq!(String::from_utf8_lossy(&out), "workerpool1-1\ntyped\n");
    assert_eq!(String::from_utf8_lossy(&err), "oops\n");
    assert_eq!(exit, ExecExit::Exited(7));
    let exec_path = "/api/v1/namespaces/augur-trials/pods/";
    assert!(
        rig.standin
            .requests()
            .iter()
            .any(|(_, p)| p.starts_with(exec_path)
                && p.contains("/exec?")
                && p.contains("container=trainer")),
        "{:?}",
        rig.standin.requests()
    );

    let refused = rig
        .executor
        .exec(
            &job.handle(),
            &target,
            &exec(ReplicaId { pool: 1, index: 5 }),
        )
        .await;
    let Err(refused) = refused else {
        panic!("a replica without a pod");
    };
    assert_eq!(refused.field.as_deref(), Some("replica"), "{refused}");
}

/// One launch the multi-fidelity kubelet below ran: the trial, the epochs its checkpoint
/// directory held before and after, the budget it was told, and that directory.
#[derive(Debug, Clone)]
struct Launch {
    trial: i64,
    from: u64,
    to: u64,
    budget_env: String,
    checkpoint_dir: String,
}

/// ASHA on Kubernetes: each rung is a new attempt (Jobs of its own) of the same trial, told
/// its budget (`--epochs=`, `AUGUR_BUDGET`) and given the same `AIP_CHECKPOINT_DIR` on the
/// output volume. The kubelet here trains as a resuming trainer does, from what that
/// directory holds (kept per directory, as a volume would): every launch goes on where the
/// trial's last one ended, 9 trials at 1 epoch, the top third at 3, the best of those at 9.
#[tokio::test]
async fn asha_on_kubernetes_resumes_each_trial_from_its_checkpoint_on_the_output_volume() {
    let standin = Arc::new(StandIn::start().await);
    let launches = Arc::new(std::sync::Mutex::new(Vec::<Launch>::new()));
    let loss = |x: f64, epochs: u64| (x - 0.3).abs() + 1.0 / epochs as f64;
    let _kubelet = {
        let (standin, launches) = (standin.clone(), launches.clone());
        tokio::spawn(async move {
            let mut handled = std::collections::HashSet::new();
            let mut volume: BTreeMap<String, u64> = BTreeMap::new();
            loop {
                for (name, _) in standin.run_new_pods(&mut handled) {
                    let env = standin.container_env(&name);
                    let argv = standin.container_argv(&name);
                    let arg = |key: &str| -> Option<String> {
                        argv.iter()
                            .find_map(|a| a.strip_prefix(&format!("--{key}=")))
                            .map(str::to_string)
                    };
                    let to: u64 = arg("epochs").and_then(|e| e.parse().ok()).unwrap_or(0);
                    let x: f64 = arg("x").and_then(|v| v.parse().ok()).unwrap_or(1.0);
                    let dir = env.get("AIP_CHECKPOINT_DIR").cloned().unwrap_or_default();
                    let from = volume.get(&dir).copied().unwrap_or(0);
                    for epoch in from + 1..=to {
                        standin.print(&name, &format!("epoch={epoch} loss={}", loss(x, epoch)));
                    }
                    volume.insert(dir.clone(), to.max(from));
                    launches.lock().expect("launches").push(Launch {
                        trial: env
                            .get("AUGUR_TRIAL_ID")
                            .and_then(|t| t.parse().ok())
                            .unwrap_or(0),
                        from,
                        to,
                        budget_env: env.get("AUGUR_BUDGET").cloned().unwrap_or_default(),
                        checkpoint_dir: dir,
                    });
                    standin.exit(&name, 0);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let (app, _runs) = server_configured(&standin, |config| {
        config.kubernetes_policy.claims = vec!["augur-runs".into()];
    })
    .await;
    let mut spec = crate::multi_fidelity::asha_spec("asha-on-kubernetes");
    spec["trial_job"] = json!({
        "executor": "kubernetes",
        "image": "registry.example/trainer:1.4",
        "command": ["python3", "train.py"],
        "output_dir": "asha",
        "kubernetes": {"output_volume": {"persistent_volume_claim": {"claim_name": "augur-runs", "mount_path": "/mnt/runs"}}},
    });
    let id = app.create_study(spec).await;
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    assert_eq!(study["trial_counts"]["completed"], 9, "{study}");
    assert_eq!(study["trial_counts"]["paused"], 0, "{study}");
    let launches = launches.lock().expect("launches").clone();
    let mut by_trial: BTreeMap<i64, Vec<Launch>> = BTreeMap::new();
    for l in launches {
        by_trial.entry(l.trial).or_default().push(l);
    }
    assert_eq!(by_trial.len(), 9, "{by_trial:?}");
    let mut dirs = std::collections::HashSet::new();
    for (trial, ls) in &by_trial {
        let mut trained = 0;
        for l in ls {
            assert_eq!(
                l.from, trained,
                "trial {trial} trained again what it had: {ls:?}"
            );
            assert!([1, 3, 9].contains(&l.to), "budgets are rungs: {ls:?}");
            assert_eq!(l.budget_env, l.to.to_string(), "AUGUR_BUDGET: {ls:?}");
            assert_eq!(
                l.checkpoint_dir, ls[0].checkpoint_dir,
                "one checkpoint dir: {ls:?}"
            );
            trained = l.to;
        }
        assert!(
            ls[0].checkpoint_dir.starts_with("/mnt/runs/asha/")
                && dirs.insert(&ls[0].checkpoint_dir),
            "each trial's own directory on the volume: {ls:?}"
        );
    }
    let reached = |epochs: u64| {
        by_trial
            .values()
            .filter(|ls| ls.last().is_some_and(|l| l.to >= epochs))
            .count()
    };
    assert_eq!((reached(3), reached(9)), (3, 1), "{by_trial:?}");
    standin
        .wait_until("every attempt deleted", |s| s.names(Kind::Job).is_empty())
        .await;
}

/// One trial's checkpoint on the tests' stand-in volume: the epochs it holds, the model state
/// and which trial trained the last of them.
#[derive(Debug, Clone, Copy)]
struct VolumeCheckpoint {
    epochs: u64,
    w: f64,
    by: i64,
}

/// PBT on Kubernetes: the copy of the best trial's checkpoint is made in the worst trial's
/// primary pod, by its init container, on the claim. The tests' kubelet runs the init
/// container's copy on its stand-in volume (a map of checkpoint directories), then the trainer
/// of `tests/jobs/pbt.rs` from what the pod's `AIP_CHECKPOINT_DIR` holds.
#[tokio::test]
async fn pbt_on_kubernetes_copies_the_best_checkpoint_in_the_primarys_pod() {
    let standin = Arc::new(StandIn::start().await);
    let dir = tempfile::tempdir().expect("temp dir");
    let trained = dir.path().join("trained.jsonl");
    let copies = Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let _kubelet = {
        let (standin, trained, copies) = (standin.clone(), trained.clone(), copies.clone());
        tokio::spawn(async move {
            let mut handled = std::collections::HashSet::new();
            let mut volume: BTreeMap<String, VolumeCheckpoint> = BTreeMap::new();
            loop {
                for (name, pod) in standin.run_new_pods(&mut handled) {
                    if let Some(init) = pod["spec"]["initContainers"].as_array() {
                        let copy = &init[0];
                        assert_eq!(copy["name"], manifests::CHECKPOINT_COPY, "{pod}");
                        assert_eq!(copy["command"], json!(["sh", "-c"]), "{pod}");
                        let args: Vec<String> = copy["args"]
                            .as_array()
                            .expect("args")
                            .iter()
                            .map(|a| a.as_str().expect("arg").replace("$$", "$"))
                            .collect();
                        let (from, to) = (args[2].clone(), args[3].clone());
                        let Some(state) = volume.get(&from).copied() else {
                            standin.exit(&name, 1);
                            continue;
                        };
                        volume.insert(to.clone(), state);
                        copies.lock().expect("copies").push((from, to));
                    }
                    let env = standin.container_env(&name);
                    let argv = standin.container_argv(&name);
                    let arg = |key: &str| -> f64 {
                        argv.iter()
                            .find_map(|a| a.strip_prefix(&format!("--{key}=")))
                            .and_then(|v| v.parse().ok())
                            .unwrap_or_else(|| panic!("--{key} in {argv:?}"))
                    };
                    let (lr, to) = (arg("lr"), arg("epochs") as u64);
                    let trial: i64 = env["AUGUR_TRIAL_ID"].parse().expect("trial id");
                    let checkpoint = env["AIP_CHECKPOINT_DIR"].trim_end_matches('/').to_string();
                    let start = volume
                        .get(&checkpoint)
                        .copied()
                        .unwrap_or(VolumeCheckpoint {
                            epochs: 0,
                            w: 1.0,
                            by: trial,
                        });
                    // The trainer of `tests/jobs/pbt.rs`.
                    let factor = common::pbt::decay(lr);
                    let mut state = start;
                    for epoch in start.epochs + 1..=to {
                        state = VolumeCheckpoint {
                            epochs: epoch,
                            w: state.w * factor,
                            by: trial,
                        };
                        standin.print(&name, &format!("epoch={epoch} loss={}", state.w));
                    }
                    volume.insert(checkpoint, state);
                    let line = json!({"trial": trial, "from": start.epochs, "to": to, "lr": lr,
                        "w_from": start.w, "w_to": state.w, "origin": start.by});
                    let mut log = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&trained)
                        .expect("trained log");
                    std::io::Write::write_all(&mut log, format!("{line}\n").as_bytes())
                        .expect("log a launch");
                    standin.exit(&name, 0);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let (app, _runs) = server_configured(&standin, |config| {
        config.kubernetes_policy.claims = vec!["augur-runs".into()];
    })
    .await;
    let id = app
        .create_study(common::pbt::population_spec(json!({
            "executor": "kubernetes",
            "image": "registry.example/trainer:1.4",
            "command": ["python3", "train.py"],
            "output_dir": "pbt",
            "kubernetes": {"output_volume": {"persistent_volume_claim": {"claim_name": "augur-runs", "mount_path": "/mnt/runs"}}},
        })))
        .await;
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(120))
        .await;
    crate::pbt::check_population(&app, id, &study, &trained).await;
    // Two exploits (the worst of four copies the best at 2 and at 4 epochs), each one copy,
    // from one trial's checkpoint directory on the claim to another's.
    let copies = copies.lock().expect("copies").clone();
    assert_eq!(copies.len(), 2, "{copies:?}");
    for (from, to) in &copies {
        assert!(
            from.starts_with("/mnt/runs/pbt/") && from.ends_with("/checkpoints") && from != to,
            "{copies:?}"
        );
    }
    standin
        .wait_until("every attempt deleted", |s| s.names(Kind::Job).is_empty())
        .await;
}
