//! Worker pools (DESIGN §4.4) as the API shows them: a pool's workers with their slots and
//! GPUs, the studies waiting for its slots, and its utilisation over time. A pool is a name
//! (`augur worker --pool NAME`, a study's `trial_job.pool`): it exists while a worker or an
//! active study names it, and needs no creating.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Trial;
use crate::model::StudyId;

/// A worker is shown gone, and its slots no longer counted, once it has not reported for
/// this long (it reports every [`WORKER_REPORT_EVERY_SECS`]).
pub const WORKER_GONE_AFTER_SECS: i64 = 6;
/// How often `augur worker --pool` reports its slots, besides each change of its busy count.
pub const WORKER_REPORT_EVERY_SECS: u64 = 2;

/// A worker's report of itself (`PUT /v1/pools/{pool}/workers/{worker}`): it registers the
/// worker in the pool on first use, and renews it after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerReport {
    /// The machine it runs on.
    pub host: String,
    /// Trials it runs at once (1-256).
    pub slots: u32,
    /// The GPUs it hands to trials (`--gpus`), e.g. `["0", "1"]`.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// Slots running a trial now.
    #[serde(default)]
    pub busy: u32,
}

/// One worker of a pool, as last reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolWorker {
    /// Its id (`augur worker --client-id`).
    pub id: String,
    pub host: String,
    pub slots: u32,
    pub gpus: Vec<String>,
    /// Slots running a trial at its last report.
    pub busy: u32,
    pub idle: u32,
    /// Reported within the last 6 seconds; a gone worker's slots are not counted.
    pub live: bool,
    pub registered_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// Slot-seconds it spent running trials, and idle, since it joined.
    pub busy_slot_secs: f64,
    pub idle_slot_secs: f64,
}

/// A study that uses the pool, and what it waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolStudy {
    #[schema(value_type = i64)]
    pub study_id: StudyId,
    pub name: String,
    /// Its weight in the fair share (`trial_job.pool_weight`).
    pub weight: f64,
    /// Trials running (active or stopping).
    pub running: u64,
    /// Trials waiting for a slot: its room under `parallel_trials`, up to what it still
    /// has to run (requested trials and its budget left).
    pub pending: u64,
    pub parallel_trials: u64,
}

/// A pool's busy and idle slot-seconds in one minute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolUsage {
    /// The minute's start.
    pub minute: DateTime<Utc>,
    pub busy_slot_secs: f64,
    pub idle_slot_secs: f64,
}

/// A pool in short: its live workers' slots, its queue and what it has cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolSummary {
    pub name: String,
    /// Workers that reported within the last 6 seconds, and those gone.
    pub workers: u32,
    pub workers_gone: u32,
    /// Live workers' slots, busy and idle.
    pub slots: u32,
    pub busy_slots: u32,
    pub idle_slots: u32,
    /// Trials waiting for a slot, over every study of the pool (`PoolStudy::pending`).
    pub queue_length: u64,
    /// Studies with trials waiting.
    pub studies_waiting: u32,
    /// Active studies that name the pool.
    pub studies: u32,
    /// Slot-seconds of every worker so far: busy, and idle (what the pool cost doing
    /// nothing).
    pub busy_slot_secs: f64,
    pub idle_slot_secs: f64,
    /// busy / (busy + idle) slot-seconds so far; 0 before any.
    pub utilisation: f64,
}

/// A pool in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolDetail {
    #[serde(flatten)]
    pub summary: PoolSummary,
    pub worker_list: Vec<PoolWorker>,
    /// Active studies that name the pool, those with trials waiting first.
    pub study_list: Vec<PoolStudy>,
    /// Busy and idle slot-seconds per minute, the last hour, oldest first.
    pub usage: Vec<PoolUsage>,
}

/// A trial leased to a pool worker's slot: the study it is of, the trial (its `attempts`
/// are the launches lost with earlier workers), and a token that may only report to it,
/// which the worker reports with and hands to the trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolLease {
    #[schema(value_type = i64)]
    pub study_id: StudyId,
    pub trial: Trial,
    pub token: String,
}
