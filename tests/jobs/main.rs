//! Trials run as jobs, end to end with real processes: the dispatcher with the local
//! executor and a real Slurm (one node, and three of a test cluster), the kubernetes
//! executor against an in-process stand-in for the API server, `augur worker` pulling
//! trials, and the `augur` binary as users run it (`study`, `run`, `token`). One test binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod artifacts;
mod cli;
mod cluster;
mod container;
mod dispatch;
mod exec;
mod job_env;
mod kube_standin;
mod kubernetes;
mod multi_fidelity;
mod pbt;
mod pools;
mod remote_worker;
mod run_as;
mod runner_failover;
mod slurm;
mod slurm_nodes;
mod tensorboard;
mod tensorflow;
mod worker;
