//! Trials run as jobs, end to end with real processes: the dispatcher with the local
//! executor and a real one-node Slurm, `augur worker` pulling trials, and the `augur`
//! binary as users run it (`study`, `run`, `token`). One test binary for all of them.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod cli;
mod dispatch;
mod run_as;
mod slurm;
mod worker;
