//! Slurm across hosts: slurmctld and `augur serve` on node1, a slurmd on each of node2,
//! node3 and node4 (`scripts/test-cluster.sh slurm`), sharing the file system as nodes on NFS
//! do. A cluster trial with `slurm.nodes: 3` puts one replica on each node, and each reaches
//! the others at the addresses its `CLUSTER_SPEC` gives; TensorFlow trains one model across
//! three nodes; a node lost mid-trial is survived by the retry on the nodes left.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use std::path::{Path, PathBuf};

use crate::common::{self, KillOnDrop, NodeRuntime, TestCluster, routes};

const ADMIN: &str = "slurm-nodes-admin-token";

/// A replica: listens at its own address of `CLUSTER_SPEC`, connects to every other, and says
/// where it runs; the primary reports `loss=` once it reached all.
const REPLICA_PY: &str = r#"
import json, os, socket, sys, threading, time
spec = json.loads(os.environ["CLUSTER_SPEC"])
me = os.environ["AUGUR_REPLICA"]
addresses = {f"{pool}-{i}": a for pool, hosts in spec["cluster"].items() for i, a in enumerate(hosts)}
host, port = addresses[me].rsplit(":", 1)
server = socket.create_server(("", int(port)))
threading.Thread(target=lambda: [server.accept() for _ in range(len(addresses) - 1)], daemon=True).start()
print("replica", me, "on", socket.gethostname(), "at", addresses[me], flush=True)
for other, address in sorted(addresses.items()):
    if other == me:
        continue
    h, p = address.rsplit(":", 1)
    for _ in range(100):
        try:
            socket.create_connection((h, int(p)), timeout=1).close()
            print("reached", other, "at", address, flush=True)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit(f"{me} could not reach {other} at {address}")
time.sleep(1)
if me == "workerpool0-0":
    print("loss=0.5", flush=True)
"#;

/// Three replicas of one trial on three Slurm nodes, one on each, reaching each other by the
/// addresses (node names and ports) Augur gave them; the trial completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_cluster_trial_puts_a_replica_on_each_node_and_they_reach_each_other() {
    let cluster = TestCluster::up(4);
    let conf = cluster.slurm("node1", &["node2", "node3", "node4"]);
    let (dir, script) = fresh_dir(&cluster, "slurm-nodes", "replica.py", REPLICA_PY);
    let (_server, base) = serve_on_node1(&cluster, &dir, &conf, "slurm-nodes-augur.log");
    let spec = json!({
        "name": "three-nodes", "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 1, "parallel_trials": 1, "seed": 5,
        "trial_job": {
            "executor": "slurm",
            "command": ["python3", script.display().to_string()],
            "worker_pools": [{"replicas": 1}, {"replicas": 2}],
            "slurm": {"nodes": 3},
            "output_dir": dir.join("runs").display().to_string()
        }
    });
    let node1 = cluster.runtime("node1", 1);
    let id = create_study(&node1, &base, spec).await;
    let state = wait_ended(&node1, &base, id, Duration::from_secs(120)).await;
    // Every replica's log, from the shared file system.
    let mut logs = String::new();
    let mut pending = vec![dir.join("runs")];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .expect("dir")
                    .flatten()
                    .map(|e| e.path()),
            );
        } else if path.extension().is_none_or(|e| e == "log") {
            logs.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    println!("\n== Slurm across nodes ==\n{logs}");
    assert_eq!(state["trial_counts"]["completed"], 1, "{state}\n{logs}");
    let hosts: BTreeSet<&str> = logs
        .lines()
        .filter_map(|l| {
            l.strip_prefix("replica ")?
                .split(" on ")
                .nth(1)?
                .split(' ')
                .next()
        })
        .collect();
    assert_eq!(
        hosts,
        BTreeSet::from(["node2", "node3", "node4"]),
        "one replica on each node:\n{logs}"
    );
    assert_eq!(
        logs.matches("reached ").count(),
        6,
        "each reached the two others:\n{logs}"
    );
}

/// A 3-replica trial's replicas: each logs where it runs to `$EVENTS`; the primary trains 12
/// half-second epochs from the checkpoint it finds (on the shared file system), saving each,
/// then marks the trial done; the other replicas wait for that mark.
const CHECKPOINTING_PY: &str = r#"
import json, os, socket, time
me, host = os.environ["AUGUR_REPLICA"], socket.gethostname()
ckpt = os.environ["AIP_CHECKPOINT_DIR"]
done = os.path.join(ckpt, "done")
def event(**kw):
    with open(os.environ["EVENTS"], "a") as f:
        f.write(json.dumps(dict(kw, replica=me, host=host, pid=os.getpid())) + "\n")
if me != "workerpool0-0":
    event(kind="start")
    while not os.path.exists(done):
        time.sleep(0.2)
    raise SystemExit(0)
path = os.path.join(ckpt, "state.json")
start = json.load(open(path))["epoch"] if os.path.exists(path) else 0
event(kind="start", start=start)
for epoch in range(start + 1, 13):
    time.sleep(0.5)
    with open(path + ".tmp", "w") as f:
        json.dump({"epoch": epoch}, f)
    os.replace(path + ".tmp", path)
    event(kind="epoch", epoch=epoch)
    print(f"epoch={epoch} loss={1.0 / epoch}", flush=True)
open(done, "w").close()
"#;

/// The node running a 3-node trial's primary loses power mid-trial (every process on it
/// killed): Slurm marks the node down and ends the job (NODE_FAIL, not requeued: Augur's
/// sbatch says `--no-requeue`), and Augur's retry, a second counted attempt, runs on the
/// three nodes left, its primary resuming from the checkpoint the first attempt saved on the
/// shared file system; the trial completes, and no replica of it is left on any node. (With
/// Slurm's requeue instead, the first run of this test saw the job held about three minutes
/// before it ran again, and not counted as an attempt.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lost_mid_trial_fails_the_attempt_and_the_retry_resumes_on_the_nodes_left() {
    let cluster = TestCluster::up(5);
    let workers = ["node2", "node3", "node4", "node5"];
    let conf = cluster.slurm("node1", &workers);
    let (dir, script) = fresh_dir(&cluster, "slurm-node-lost", "replica.py", CHECKPOINTING_PY);
    let events = dir.join("events.jsonl");
    let (_server, base) = serve_on_node1(&cluster, &dir, &conf, "slurm-node-lost-augur.log");
    let spec = json!({
        "name": "node-lost", "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 1, "parallel_trials": 1, "seed": 5,
        "trial_job": {
            "executor": "slurm",
            "command": ["python3", script.display().to_string()],
            "env": {"EVENTS": events.display().to_string()},
            "worker_pools": [{"replicas": 1}, {"replicas": 2}],
            "slurm": {"nodes": 3},
            "max_retries": 2,
            "output_dir": dir.join("runs").display().to_string()
        }
    });
    let read_events = {
        let events = events.clone();
        move || -> Vec<Value> {
            std::fs::read_to_string(&events)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        }
    };
    let node1 = cluster.runtime("node1", 1);
    let id = create_study(&node1, &base, spec).await;
    // Three epochs saved: the primary's node goes.
    let lost = common::eventually("three epochs trained", Duration::from_secs(120), || {
        let read_events = read_events.clone();
        async move {
            let events = read_events();
            let primary = events
                .iter()
                .find(|e| e["replica"] == "workerpool0-0" && e["kind"] == "start")
                .and_then(|e| e["host"].as_str().map(str::to_string));
            let epochs = events.iter().filter(|e| e["kind"] == "epoch").count();
            match primary {
                Some(host) if epochs >= 3 => Ok(host),
                _ => Err(format!("{events:?}")),
            }
        }
    })
    .await;
    cluster.kill_node(&lost);
    let killed_at = std::time::Instant::now();
    let resumed_after = common::eventually("the retry starts", Duration::from_secs(240), || {
        let read_events = read_events.clone();
        async move {
            let starts = read_events()
                .iter()
                .filter(|e| e["kind"] == "start" && e["replica"] == "workerpool0-0")
                .count();
            if starts >= 2 {
                Ok(killed_at.elapsed())
            } else {
                Err(format!("{starts} start(s)"))
            }
        }
    })
    .await;
    let study = wait_ended(&node1, &base, id, Duration::from_secs(240)).await;
    let events = read_events();
    let report: Vec<String> = events.iter().map(Value::to_string).collect();
    println!(
        "\n== node {lost} lost mid-trial: the retry's primary started {:.1} s after ==\n{}",
        resumed_after.as_secs_f64(),
        report.join("\n")
    );
    assert_eq!(study["trial_counts"]["completed"], 1, "{study}");
    let trial = &study["best_trial"];
    assert!(trial["attempts"].as_u64() >= Some(2), "retried: {trial}");
    // The last attempt's primary resumed from the checkpoint, on a node still up, and the
    // replicas of that attempt ran on the three nodes left.
    let starts: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "start" && e["replica"] == "workerpool0-0")
        .collect();
    let last = starts.last().expect("a primary started");
    assert!(
        last["start"].as_u64() >= Some(3),
        "the retry resumed from the checkpoint: {report:?}"
    );
    assert_ne!(last["host"], lost.as_str(), "{report:?}");
    let epochs: Vec<u64> = events
        .iter()
        .filter(|e| e["kind"] == "epoch")
        .filter_map(|e| e["epoch"].as_u64())
        .collect();
    let last_start = last["start"].as_u64().unwrap_or(0);
    assert!(
        epochs.iter().filter(|&&e| e > last_start).count() == (12 - last_start) as usize,
        "the retry trained only what the checkpoint lacked: {epochs:?}"
    );
    // No replica of the trial is left on any node.
    let script_path = script.display().to_string();
    for node in workers {
        assert!(
            cluster.processes_on(node, &script_path).is_empty(),
            "a replica outlived its trial on {node}"
        );
    }
}

/// TensorFlow's `MultiWorkerMirroredStrategy` across three Slurm nodes: the chief on one,
/// its two workers on the others, synchronised through the `TF_CONFIG` Augur wrote from the
/// allocation's hosts (`examples/distributed/tf_train.py`, the real TensorFlow of
/// `scripts/tf-venv.sh`); the trial completes with the chief's validation loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensorflow_trains_one_model_across_three_slurm_nodes() {
    let python = tokio::task::spawn_blocking(crate::tensorflow::python_with_tensorflow)
        .await
        .expect("venv");
    let cluster = TestCluster::up(4);
    let conf = cluster.slurm("node1", &["node2", "node3", "node4"]);
    let dir = cluster.dir.join("slurm-tensorflow");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/distributed");
    let (_server, base) = serve_on_node1(&cluster, &dir, &conf, "slurm-tensorflow-augur.log");
    let spec = json!({
        "name": "tensorflow-nodes", "algorithm": "random",
        "metrics": [{"id": "val_loss", "goal": "minimize"}],
        "parameters": [
            {"id": "learning_rate", "type": "double", "min": 0.001, "max": 0.01, "scale": "log"},
            {"id": "units", "type": "integer", "min": 8, "max": 16}
        ],
        "max_trials": 1, "parallel_trials": 1, "seed": 5,
        "trial_job": {
            "executor": "slurm",
            "command": [python.display().to_string(), example.join("tf_train.py").display().to_string(), "--epochs=2"],
            "worker_pools": [{"replicas": 1}, {"replicas": 2}],
            "slurm": {"nodes": 3},
            "env": {"PYTHONUNBUFFERED": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
            "timeout_secs": 900,
            "output_dir": dir.join("runs").display().to_string()
        }
    });
    let node1 = cluster.runtime("node1", 1);
    let id = create_study(&node1, &base, spec).await;
    let study = wait_ended(&node1, &base, id, Duration::from_secs(900)).await;
    let mut logs = String::new();
    let mut pending = vec![dir.join("runs")];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .expect("dir")
                    .flatten()
                    .map(|e| e.path()),
            );
        } else if path.extension().is_some_and(|e| e == "log") {
            logs.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    assert_eq!(study["trial_counts"]["completed"], 1, "{study}\n{logs}");
    let loss = study["best_trial"]["final_measurement"]["metrics"]["val_loss"].as_f64();
    assert!(loss.is_some_and(f64::is_finite), "{study}");
    assert_eq!(
        logs.matches("3 replicas in sync").count(),
        3,
        "chief and both workers in one collective:\n{logs}"
    );
    // The cluster TF_CONFIG names: one host per replica, the three nodes.
    let cluster_spec: Value = logs
        .lines()
        .find_map(|l| l.split(" cluster: ").nth(1))
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or_else(|| panic!("no TF_CONFIG printed:\n{logs}"));
    let hosts: BTreeSet<String> = cluster_spec
        .as_object()
        .into_iter()
        .flat_map(|pools| pools.values())
        .flat_map(|addresses| addresses.as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str()?.rsplit_once(':').map(|(h, _)| h.to_string()))
        .collect();
    assert_eq!(
        hosts,
        BTreeSet::from(["node2".to_string(), "node3".into(), "node4".into()]),
        "{cluster_spec}"
    );
}

/// A fresh directory `name` under the cluster's, holding `script` as `file`: the directory
/// and the script's path.
/// `augur trial exec --replica R` into a 3-node cluster trial, from node1: each session runs
/// on its replica's node (the one the replica itself reports), with that replica's
/// environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_each_replica_runs_on_that_replicas_node() {
    let cluster = TestCluster::up(4);
    let conf = cluster.slurm("node1", &["node2", "node3", "node4"]);
    // Each replica says where it runs, then waits until a session marks the trial done.
    let trainer = "echo \"$AUGUR_REPLICA $(hostname)\" >> \"$AIP_MODEL_DIR/../replica-hosts\"; \
                   while [ ! -f \"$AIP_MODEL_DIR/done\" ]; do sleep 0.2; done; echo loss=1";
    let (dir, _) = fresh_dir(&cluster, "slurm-exec", "unused", "");
    let (_server, base) = serve_on_node1(&cluster, &dir, &conf, "slurm-exec-augur.log");
    let spec = json!({
        "name": "exec-nodes", "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 1, "parallel_trials": 1, "seed": 5,
        "trial_job": {
            "executor": "slurm",
            "command": ["/bin/sh", "-c", trainer],
            "worker_pools": [{"replicas": 1}, {"replicas": 2}],
            "slurm": {"nodes": 3},
            "output_dir": dir.join("runs").display().to_string()
        }
    });
    let node1 = cluster.runtime("node1", 1);
    let id = create_study(&node1, &base, spec).await;
    let trial_dir = || common::study_dir(&dir.join("runs"), id).join("1");
    let started = common::eventually("3 replicas started", Duration::from_secs(60), || async {
        let text = std::fs::read_to_string(trial_dir().join("replica-hosts")).unwrap_or_default();
        if text.lines().count() == 3 {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    let mut nodes = BTreeSet::new();
    for line in started.lines() {
        let (replica, host) = line.split_once(' ').expect("replica host");
        let out = cluster
            .command("node1", common::augur_bin())
            .args(["trial", "exec", &id.to_string(), "1"])
            .args(["--replica", replica, "--", "/bin/sh", "-c"])
            .arg("echo \"$AUGUR_REPLICA $(hostname)\"")
            .env("AUGUR_TOKEN", ADMIN)
            .env("AUGUR_URL", &base)
            .output()
            .expect("augur trial exec");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(said.trim(), format!("{replica} {host}"), "{started}");
        nodes.insert(host.to_string());
    }
    assert_eq!(
        nodes,
        BTreeSet::from(["node2".into(), "node3".into(), "node4".into()])
    );
    std::fs::write(trial_dir().join("model/done"), "").expect("done");
    let state = wait_ended(&node1, &base, id, Duration::from_secs(60)).await;
    assert_eq!(state["trial_counts"]["completed"], 1, "{state}");
}

fn fresh_dir(cluster: &TestCluster, name: &str, file: &str, script: &str) -> (PathBuf, PathBuf) {
    let dir = cluster.dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let path = dir.join(file);
    std::fs::write(&path, script).expect("script");
    (dir, path)
}

/// `augur serve` on node1 (its SQLite file in `dir`, Slurm's `conf`), logging to `log`: the
/// server and its URL.
fn serve_on_node1(
    cluster: &TestCluster,
    dir: &Path,
    conf: &Path,
    log: &str,
) -> (KillOnDrop, String) {
    let addr = cluster.addr("node1");
    let server = KillOnDrop(
        cluster
            .command("node1", common::augur_bin())
            .args([
                "serve",
                "--token",
                ADMIN,
                "--listen",
                &format!("{addr}:8080"),
            ])
            .arg("--database-url")
            .arg(format!("sqlite://{}", dir.join("augur.db").display()))
            .env("SLURM_CONF", conf)
            .env("AUGUR_LOG", "warn")
            .env_remove("AUGUR_TOKEN")
            .stdout(std::process::Stdio::null())
            .stderr(cluster.log(log))
            .spawn()
            .expect("augur serve"),
    );
    (server, format!("http://{addr}:8080"))
}

/// Create `spec` through `base` (from node1) once the server is ready: the study's id.
async fn create_study(node1: &NodeRuntime, base: &str, spec: Value) -> i64 {
    let base = base.to_string();
    node1
        .run(async move {
            let http = common::http();
            common::eventually("ready", Duration::from_secs(30), || async {
                match http.get(format!("{base}/readyz")).send().await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            let post = reqwest::Method::POST;
            let created =
                common::call(&http, &base, Some(ADMIN), post, "/v1/studies", Some(spec)).await;
            assert_eq!(created.status, 201, "{}", created.body);
            created.body["id"].as_i64().expect("id")
        })
        .await
}

/// The study once it is no longer active (from node1), waiting at most `limit`.
async fn wait_ended(node1: &NodeRuntime, base: &str, id: i64, limit: Duration) -> Value {
    let base = base.to_string();
    node1
        .run(async move {
            let http = common::http();
            common::eventually("the study ends", limit, || async {
                let get = reqwest::Method::GET;
                let path = routes::study(id);
                let study = common::call(&http, &base, Some(ADMIN), get, &path, None).await;
                match study.body["state"].as_str() {
                    Some("active") | None => Err(format!("{}", study.body)),
                    Some(_) => Ok(study.body),
                }
            })
            .await
        })
        .await
}
