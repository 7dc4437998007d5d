//! The service, black-box: the HTTP API against a real server on port 0 (in this process, or
//! real `augur serve` processes), each case on a real SQLite file and a real PostgreSQL
//! database; the store's conformance suite on both backends; the OpenAPI snapshot; the cap
//! under concurrency; durability across SIGKILLs and faults between hosts; the GP through the
//! service. One test binary (one link of the crate) for all of them.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
mod support;

mod annotations;
mod auth;
mod bad_inputs;
mod concurrency;
mod dashboard;
mod durability;
mod gp;
mod guessing;
mod job_policy;
mod limits;
mod login;
mod multi_fidelity;
mod multi_node;
mod notifications;
mod openapi;
mod outage;
mod ownership;
mod parameters;
mod pbt;
mod pools;
mod repeats;
mod replicas;
mod roles;
mod store;
mod studies;
mod study_stopping;
mod suggest;
mod tls;
mod tokens;
mod trials;
mod untrusted_text;
mod upgrade;
mod vizier;
