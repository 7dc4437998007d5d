//! Slurm across hosts: slurmctld and `augur serve` on node1, a slurmd on each of node2,
//! node3 and node4 (`scripts/test-cluster.sh slurm`), sharing the file system as nodes on NFS
//! do. A cluster trial with `slurm.nodes: 3` puts one replica on each node, and each reaches
//! the others at the addresses its `CLUSTER_SPEC` gives.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{self, KillOnDrop, TestCluster};

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
    let dir = cluster.dir.join("slurm-nodes");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let script = dir.join("replica.py");
    std::fs::write(&script, REPLICA_PY).expect("script");
    let addr = cluster.addr("node1");
    let base = format!("http://{addr}:8080");
    let _server = KillOnDrop(
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
            .env("SLURM_CONF", &conf)
            .env("AUGUR_LOG", "warn")
            .env_remove("AUGUR_TOKEN")
            .stdout(std::process::Stdio::null())
            .stderr(cluster.log("slurm-nodes-augur.log"))
            .spawn()
            .expect("augur serve"),
    );
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
    let state: Value = node1
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
            let id = created.body["id"].as_i64().expect("id");
            common::eventually("the study completes", Duration::from_secs(120), || async {
                let get = reqwest::Method::GET;
                let study = common::call(
                    &http,
                    &base,
                    Some(ADMIN),
                    get,
                    &format!("/v1/studies/{id}"),
                    None,
                )
                .await;
                match study.body["state"].as_str() {
                    Some("active") | None => Err(format!("{}", study.body)),
                    Some(_) => Ok(study.body),
                }
            })
            .await
        })
        .await;
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
