//! Shared test helpers, one file per concern: real databases (`db`), the server in this
//! process (`app`) and the JSON client to any server (`client`), real `augur` and other
//! child processes (`processes`), study specs (`specs`), trial jobs (`jobs`), waiting
//! (`wait`), a TCP relay that makes faults (`relay`), hosts of network namespaces
//! (`cluster`), the API's paths (`routes`). Tests name every helper as `common::X`,
//! re-exported here, and each path as `routes::X`.
#![allow(
    dead_code,
    unused_macros,
    reason = "each test binary uses a different part of these helpers"
)]

// First, so that `on_both_backends!` is in scope for the test binaries (`#[macro_use]`).
#[macro_use]
mod db;
mod app;
mod client;
mod cluster;
mod jobs;
pub mod pbt;
mod processes;
mod relay;
pub mod routes;
mod specs;
mod wait;

#[allow(
    unused_imports,
    reason = "each test binary uses a different part of these helpers"
)]
pub use self::{
    app::{TestApp, spawn_app, spawn_app_configured, spawn_app_with},
    client::{Response, call, get_body, http, http_builder, metric_sample},
    cluster::{NodePostgres, NodeRuntime, TestCluster},
    db::{
        TestDb, admin_sql_from_drop, db, postgres_admin_url, postgres_db, settled_pg_counter,
        sqlite_db,
    },
    jobs::{
        assert_augur_job_env, assert_clean_job_env, env_dump_command, podman,
        python_with_hypertune, read_job_env, study_dir,
    },
    processes::{
        KillOnDrop, ServerProcess, alive, alive_in_group, augur_bin, free_port, pids, proc_stat,
        processes_with,
    },
    relay::{LinkFaults, Relay},
    specs::{spec, x_spec},
    wait::{eventually, until_replicas_live},
};
