//! The operator's settings for this machine's executors: one value, from the command line
//! (`serve`, `run` and `worker` flatten one group of options) to every executor's context.

use std::sync::Arc;

use super::container::ContainerEngine;
use super::executor::ExecutorContext;
use super::gpus::GpuPool;
use super::kubernetes::{KubeConnection, KubeSettings};
use super::local::RunAs;
use super::ports::PortRegistry;

#[derive(Debug, Clone, Default)]
pub struct ExecutorSettings {
    /// The GPUs local replicas may be given (`--gpus`); `None`: those `nvidia-smi -L` lists.
    pub gpus: Option<Vec<String>>,
    /// How the container executor runs images (Podman or Docker, with the operator's
    /// options).
    pub containers: ContainerEngine,
    /// How the kubernetes executor reaches its cluster (`--kubeconfig`, …).
    pub kubernetes: KubeSettings,
    /// The operator's `sbatch` options for every Slurm job (`--slurm-arg`).
    pub slurm_args: Vec<String>,
}

impl ExecutorContext {
    /// What every executor of this process shares: the machine's GPUs and ports, the
    /// engine, the cluster connection; local replicas run as `run_as` when given.
    pub fn new(settings: &ExecutorSettings, run_as: Option<RunAs>) -> Self {
        ExecutorContext {
            gpus: match &settings.gpus {
                Some(list) => GpuPool::new(list.clone()),
                None => GpuPool::detect(),
            },
            ports: PortRegistry::default(),
            containers: Arc::new(settings.containers.clone()),
            kubernetes: KubeConnection::new(settings.kubernetes.clone()),
            run_as,
            slurm_args: Arc::new(settings.slurm_args.clone()),
        }
    }
}
