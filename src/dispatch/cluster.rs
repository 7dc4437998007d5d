//! A trial's training cluster as its replicas see it (DESIGN §4.1): the configuration Augur,
//! not the training script, writes for every replica. Pure.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::model::vertex::custom_job_spec;
use crate::model::{ReplicaId, TrialId, TrialJobSpec};

/// Where one replica listens. Strings, not a socket address: the Slurm executor fills in
/// hosts and ports only inside the allocation, from placeholders (see `slurm.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub host: String,
    pub port: String,
}

impl Address {
    fn joined(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// How many replicas each pool has (0: the pool is skipped), and the job they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLayout {
    pools: Vec<usize>,
    /// The trial job in Vertex's `CustomJobSpec` JSON: the `job` member of `CLUSTER_SPEC` and
    /// `TF_CONFIG`, made once per attempt.
    job: Value,
}

/// TensorFlow's name for each pool: chief, worker, ps, evaluator.
const TF_TASK_TYPES: [&str; 4] = ["chief", "worker", "ps", "evaluator"];

impl ClusterLayout {
    pub fn of(job: &TrialJobSpec) -> ClusterLayout {
        let mut pools = vec![0; job.worker_pools.len().max(1)];
        for r in job.replicas() {
            pools[r.id.pool] += 1;
        }
        ClusterLayout {
            pools,
            job: custom_job_spec(job),
        }
    }

    /// Every replica, the primary first, pool by pool.
    pub fn replicas(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.pools
            .iter()
            .enumerate()
            .flat_map(|(pool, &n)| (0..n).map(move |index| ReplicaId { pool, index }))
    }

    pub fn len(&self) -> usize {
        self.pools.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The replicas of `torch.distributed`'s world: the primary and the workers.
    fn world_size(&self) -> usize {
        self.pools.iter().take(2).sum()
    }

    /// `{"workerpool0": ["h:p"], …}` of the pools that have replicas, in pool order.
    fn pool_addresses(&self, address: &dyn Fn(ReplicaId) -> Address) -> Vec<(usize, Vec<String>)> {
        self.pools
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(pool, &n)| {
                let list = (0..n)
                    .map(|index| address(ReplicaId { pool, index }).joined())
                    .collect();
                (pool, list)
            })
            .collect()
    }
}

/// The variables that tell replica `me` of trial `trial_id` its place in the cluster, given
/// where every replica listens.
///
/// A trial's training cluster as its replicas see it (DESIGN §4.1): the configuration Augur,
/// not the training script, writes for every replica, in the three conventions trainers
/// read: Vertex AI's `CLUSTER_SPEC`, TensorFlow's `TF_CONFIG`, and PyTorch's
/// `MASTER_ADDR`/`MASTER_PORT`/`WORLD_SIZE`/`RANK`/`LOCAL_RANK`; plus `AUGUR_REPLICA`.
/// Pure: the executor says where each replica listens (`Address`), this says what each
/// replica is told.
pub fn cluster_env(
    layout: &ClusterLayout,
    address: &dyn Fn(ReplicaId) -> Address,
    me: ReplicaId,
    trial_id: TrialId,
) -> Vec<(String, String)> {
    let pools = layout.pool_addresses(address);
    let primary = address(ReplicaId::PRIMARY);
    let mut env = vec![
        ("AUGUR_REPLICA".to_string(), me.name()),
        (
            "CLUSTER_SPEC".to_string(),
            cluster_spec(layout, &pools, me, trial_id).to_string(),
        ),
        (
            "TF_CONFIG".to_string(),
            tf_config(layout, &pools, me, trial_id).to_string(),
        ),
        ("MASTER_ADDR".to_string(), primary.host.clone()),
        ("MASTER_PORT".to_string(), primary.port.clone()),
    ];
    // torch.distributed's world is the primary (rank 0) and the workers (1…); parameter
    // servers and evaluators only learn where the primary is.
    if me.pool <= 1 {
        let rank = if me.pool == 0 { 0 } else { me.index + 1 };
        env.extend([
            ("WORLD_SIZE".to_string(), layout.world_size().to_string()),
            ("RANK".to_string(), rank.to_string()),
            // Each replica sees only its own devices, like a VM of Vertex AI: device 0 is its.
            ("LOCAL_RANK".to_string(), "0".to_string()),
        ]);
    }
    env
}

/// The `task` member of both configurations: the replica's type and index, and the trial's
/// id as a string, as Vertex sets it in a tuning job's trials.
fn task(task_type: &str, me: ReplicaId, trial_id: TrialId) -> Value {
    json!({"type": task_type, "index": me.index, "trial": trial_id.to_string()})
}

/// Vertex AI's `CLUSTER_SPEC`.
fn cluster_spec(
    layout: &ClusterLayout,
    pools: &[(usize, Vec<String>)],
    me: ReplicaId,
    trial_id: TrialId,
) -> Value {
    let cluster: serde_json::Map<String, Value> = pools
        .iter()
        .map(|(pool, list)| (format!("workerpool{pool}"), json!(list)))
        .collect();
    json!({
        "cluster": cluster,
        "environment": "cloud",
        "task": task(&format!("workerpool{}", me.pool), me, trial_id),
        "job": layout.job,
    })
}

/// TensorFlow's `TF_CONFIG`: chief, worker and ps in `cluster`; an evaluator is told its
/// task but is no member of the cluster. Vertex adds the task's `trial` and the `job`, which
/// TensorFlow ignores.
fn tf_config(
    layout: &ClusterLayout,
    pools: &[(usize, Vec<String>)],
    me: ReplicaId,
    trial_id: TrialId,
) -> Value {
    let cluster: BTreeMap<&str, &Vec<String>> = pools
        .iter()
        .filter(|(pool, _)| *pool < 3)
        .map(|(pool, list)| (TF_TASK_TYPES[*pool], list))
        .collect();
    let task_type = TF_TASK_TYPES.get(me.pool).copied().unwrap_or("worker");
    json!({
        "cluster": cluster,
        "task": task(task_type, me, trial_id),
        "environment": "cloud",
        "job": layout.job,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WorkerPoolSpec;

    fn pool(replicas: u32) -> Option<WorkerPoolSpec> {
        Some(WorkerPoolSpec {
            replicas,
            ..Default::default()
        })
    }

    fn layout(pools: Vec<Option<WorkerPoolSpec>>) -> ClusterLayout {
        ClusterLayout::of(&TrialJobSpec {
            command: vec!["train".into()],
            worker_pools: pools,
            ..Default::default()
        })
    }

    fn at(r: ReplicaId) -> Address {
        Address {
            host: format!("h{}", r.pool),
            port: (1000 + r.pool * 10 + r.index).to_string(),
        }
    }

    fn env_of(layout: &ClusterLayout, me: ReplicaId) -> BTreeMap<String, String> {
        cluster_env(layout, &at, me, TrialId::new(7))
            .into_iter()
            .collect()
    }

    fn json_of(env: &BTreeMap<String, String>, key: &str) -> Value {
        serde_json::from_str(&env[key]).expect("JSON")
    }

    #[test]
    fn a_chief_two_workers_and_a_ps_get_vertex_and_tensorflow_configs() {
        let layout = layout(vec![pool(1), pool(2), pool(1)]);
        assert_eq!(layout.len(), 4);
        let worker = ReplicaId { pool: 1, index: 1 };
        let env = env_of(&layout, worker);
        assert_eq!(env["AUGUR_REPLICA"], "workerpool1-1");
        let spec = json_of(&env, "CLUSTER_SPEC");
        assert_eq!(spec["cluster"]["workerpool0"], json!(["h0:1000"]));
        assert_eq!(
            spec["cluster"]["workerpool1"],
            json!(["h1:1010", "h1:1011"])
        );
        assert_eq!(spec["cluster"]["workerpool2"], json!(["h2:1020"]));
        assert_eq!(
            spec["task"],
            json!({"type": "workerpool1", "index": 1, "trial": "7"})
        );
        assert_eq!(spec["environment"], "cloud");
        let tf = json_of(&env, "TF_CONFIG");
        assert_eq!(tf["cluster"]["chief"], json!(["h0:1000"]));
        assert_eq!(tf["cluster"]["worker"], json!(["h1:1010", "h1:1011"]));
        assert_eq!(tf["cluster"]["ps"], json!(["h2:1020"]));
        assert_eq!(
            tf["task"],
            json!({"type": "worker", "index": 1, "trial": "7"})
        );
        let pools = json!([
            {"replicaCount": "1", "containerSpec": {"command": ["train"]}, "machineSpec": {"machineType": "n1-standard-4"}},
            {"replicaCount": "2", "containerSpec": {"command": ["train"]}, "machineSpec": {"machineType": "n1-standard-4"}},
            {"replicaCount": "1", "containerSpec": {"command": ["train"]}, "machineSpec": {"machineType": "n1-standard-4"}},
        ]);
        assert_eq!(tf["job"], json!({"workerPoolSpecs": pools}));
        assert_eq!(spec["job"], tf["job"], "one job spec in both conventions");
    }

    #[test]
    fn torch_ranks_count_the_primary_then_the_workers_only() {
        let layout = layout(vec![pool(1), pool(3), pool(1)]);
        let primary = env_of(&layout, ReplicaId::PRIMARY);
        assert_eq!(
            (primary["RANK"].as_str(), primary["WORLD_SIZE"].as_str()),
            ("0", "4")
        );
        assert_eq!(
            (
                primary["MASTER_ADDR"].as_str(),
                primary["MASTER_PORT"].as_str()
            ),
            ("h0", "1000")
        );
        let third_worker = env_of(&layout, ReplicaId { pool: 1, index: 2 });
        assert_eq!(third_worker["RANK"], "3");
        assert_eq!(third_worker["MASTER_PORT"], "1000");
        let ps = env_of(&layout, ReplicaId { pool: 2, index: 0 });
        assert!(
            !ps.contains_key("RANK"),
            "a parameter server is no torch rank"
        );
        assert_eq!(ps["MASTER_ADDR"], "h0");
    }

    #[test]
    fn evaluators_are_told_their_task_but_are_not_in_the_tensorflow_cluster() {
        let layout = layout(vec![pool(1), pool(1), None, pool(1)]);
        let evaluator = ReplicaId { pool: 3, index: 0 };
        assert_eq!(
            layout.replicas().collect::<Vec<_>>(),
            [
                ReplicaId::PRIMARY,
                ReplicaId { pool: 1, index: 0 },
                evaluator
            ]
        );
        let env = env_of(&layout, evaluator);
        let tf = json_of(&env, "TF_CONFIG");
        assert_eq!(tf["task"]["type"], "evaluator");
        assert!(tf["cluster"].get("evaluator").is_none());
        assert!(
            tf["cluster"].get("ps").is_none(),
            "a skipped pool is absent"
        );
        let spec = json_of(&env, "CLUSTER_SPEC");
        assert_eq!(spec["cluster"]["workerpool3"], json!(["h3:1030"]));
        assert!(spec["cluster"].get("workerpool2").is_none());
    }
}
