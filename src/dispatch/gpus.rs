//! The GPUs of this machine, given to local replicas: each replica that asks for N gets N
//! devices of its own through `CUDA_VISIBLE_DEVICES` (and the container runtime's device
//! flags), never shared with another replica. A trial whose replicas cannot all get theirs
//! waits for them (its timeout has not started), and takes them all at once, so two trials
//! each holding half of what they need never block each other.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::executor::ExecutorError;

/// The devices the server may hand out (`--gpus 0,1,2,3`, or found by `nvidia-smi -L`).
#[derive(Clone, Default)]
pub struct GpuPool {
    devices: Arc<Vec<String>>,
    free: Arc<Mutex<BTreeSet<usize>>>,
    released: Arc<Notify>,
}

/// Devices held by one trial's replicas (`per_replica[i]` for replica i), given back when
/// dropped.
pub struct GpuLease {
    pub per_replica: Vec<Vec<String>>,
    taken: Vec<usize>,
    pool: GpuPool,
}

impl Drop for GpuLease {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.free.lock() {
            free.extend(self.taken.iter().copied());
        }
        self.pool.released.notify_waiters();
    }
}

impl GpuPool {
    pub fn new(devices: Vec<String>) -> GpuPool {
        GpuPool {
            free: Arc::new(Mutex::new((0..devices.len()).collect())),
            devices: Arc::new(devices),
            released: Arc::default(),
        }
    }

    /// The GPUs `nvidia-smi -L` lists (its `GPU <index>:` lines); none without the tool.
    pub fn detect() -> GpuPool {
        let listed = std::process::Command::new("nvidia-smi")
            .arg("-L")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        GpuPool::new(parse_nvidia_smi(&listed))
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// The devices' ids, as `CUDA_VISIBLE_DEVICES` names them.
    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Devices for every replica at once (`wanted[i]` for replica i), waiting until that
    /// many are free. Fails at once when the machine has fewer than the trial needs.
    pub async fn acquire(&self, wanted: &[u32]) -> Result<GpuLease, ExecutorError> {
        let total: usize = wanted.iter().map(|&n| n as usize).sum();
        if total > self.devices.len() {
            return Err(ExecutorError::Launch(format!(
                "the trial's replicas need {total} GPU(s); this server has {} (--gpus)",
                self.devices.len()
            )));
        }
        loop {
            // Registered before looking, so a release between the look and the wait wakes us.
            let released = self.released.notified();
            if let Some(lease) = self.try_take(wanted, total)? {
                return Ok(lease);
            }
            released.await;
        }
    }

    fn try_take(&self, wanted: &[u32], total: usize) -> Result<Option<GpuLease>, ExecutorError> {
        let mut free = self
            .free
            .lock()
            .map_err(|_| ExecutorError::Launch("GPU pool poisoned".into()))?;
        if free.len() < total {
            return Ok(None);
        }
        let taken: Vec<usize> = free.iter().copied().take(total).collect();
        for i in &taken {
            free.remove(i);
        }
        let mut next = taken.iter();
        let per_replica = wanted
            .iter()
            .map(|&n| {
                next.by_ref()
                    .take(n as usize)
                    .map(|&i| self.devices[i].clone())
                    .collect()
            })
            .collect();
        Ok(Some(GpuLease {
            per_replica,
            taken,
            pool: self.clone(),
        }))
    }
}

/// Device indices from `nvidia-smi -L` (`GPU 0: NVIDIA A100 (UUID: …)`).
fn parse_nvidia_smi(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.strip_prefix("GPU ")?.split(':').next())
        .filter(|i| !i.is_empty() && i.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_listing_gives_device_indices() {
        let listing =
            "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\nGPU 1: NVIDIA A100 (UUID: GPU-2)\n";
        assert_eq!(parse_nvidia_smi(listing), ["0", "1"]);
        assert!(parse_nvidia_smi("").is_empty());
    }

    #[tokio::test]
    async fn each_replica_gets_its_own_devices_and_none_is_handed_out_twice() {
        let pool = GpuPool::new((0..8).map(|i| i.to_string()).collect());
        let a = pool.acquire(&[2, 1, 1]).await.expect("a");
        let b = pool.acquire(&[1, 3]).await.expect("b");
        let all: Vec<&String> = a
            .per_replica
            .iter()
            .chain(&b.per_replica)
            .flatten()
            .collect();
        let distinct: BTreeSet<&String> = all.iter().copied().collect();
        assert_eq!((all.len(), distinct.len()), (8, 8));
        assert_eq!(a.per_replica[0].len(), 2);
        assert!(
            pool.acquire(&[9]).await.is_err(),
            "more than the machine has"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trial_waits_for_its_gpus_and_concurrent_trials_never_share_one() {
        let pool = GpuPool::new((0..4).map(|i| i.to_string()).collect());
        let in_use = Arc::new(Mutex::new(BTreeSet::<String>::new()));
        let mut tasks = Vec::new();
        for t in 0..12u32 {
            let (pool, in_use) = (pool.clone(), in_use.clone());
            tasks.push(tokio::spawn(async move {
                let lease = pool.acquire(&[1 + t % 2, 1]).await.expect("lease");
                {
                    let mut used = in_use.lock().expect("lock");
                    for d in lease.per_replica.iter().flatten() {
                        assert!(used.insert(d.clone()), "GPU {d} handed out twice");
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                let mut used = in_use.lock().expect("lock");
                for d in lease.per_replica.iter().flatten() {
                    used.remove(d);
                }
            }));
        }
        for t in tasks {
            t.await.expect("trial");
        }
    }
}
