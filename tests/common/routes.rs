//! The API's paths, one function per route the tests call, named after the route in
//! `openapi.yaml`: `routes::trial_complete(study, trial)` is
//! `/v1/studies/{study}/trials/{trial}/complete`. A query the tests send often has its own
//! function (`trials_in_state`, `all_trials`, `changes_after`); any other is written on top
//! of the route's path, as in `format!("{}?page_size=10", routes::trials(study))`. Tests
//! that mean to send an odd path (a bad id, an unknown route, a template) write it out.
//!
//! Ids are `impl Display`, so a test passes an `i64`, a literal or an id type alike.

use std::fmt::Display;

/// `/v1/studies`: create (POST) and list (GET) studies.
pub fn studies() -> String {
    "/v1/studies".to_string()
}

/// `/v1/studies/{study}`: read, change (PATCH) or delete a study.
pub fn study(study: impl Display) -> String {
    format!("/v1/studies/{study}")
}

/// `/v1/studies/{study}/changes`: the change cursor of live views.
pub fn changes(study: impl Display) -> String {
    format!("/v1/studies/{study}/changes")
}

/// `/v1/studies/{study}/changes?after={cursor}`: what changed after `cursor`.
pub fn changes_after(study: impl Display, cursor: impl Display) -> String {
    format!("{}?after={cursor}", changes(study))
}

/// `/v1/studies/{study}/contour`: the dashboard's contour of two parameters.
pub fn contour(study: impl Display) -> String {
    format!("/v1/studies/{study}/contour")
}

/// `/v1/studies/{study}/curves`: the dashboard's learning curves.
pub fn curves(study: impl Display) -> String {
    format!("/v1/studies/{study}/curves")
}

/// `/v1/studies/{study}/directories`: the study's trial directories.
pub fn directories(study: impl Display) -> String {
    format!("/v1/studies/{study}/directories")
}

/// `/v1/studies/{study}/insights`: the dashboard's importance and history.
pub fn insights(study: impl Display) -> String {
    format!("/v1/studies/{study}/insights")
}

/// `/v1/studies/{study}/notifications`: the study's notifications.
pub fn notifications(study: impl Display) -> String {
    format!("/v1/studies/{study}/notifications")
}

/// `/v1/studies/{study}/optimal_trials`: the best trial, or the Pareto front.
pub fn optimal_trials(study: impl Display) -> String {
    format!("/v1/studies/{study}/optimal_trials")
}

/// `/v1/studies/{study}/parameters`: grow the search space.
pub fn parameters(study: impl Display) -> String {
    format!("/v1/studies/{study}/parameters")
}

/// `/v1/studies/{study}/resume`: resume a stopped study.
pub fn resume(study: impl Display) -> String {
    format!("/v1/studies/{study}/resume")
}

/// `/v1/studies/{study}/stop`: stop a study.
pub fn stop(study: impl Display) -> String {
    format!("/v1/studies/{study}/stop")
}

/// `/v1/studies/{study}/suggest`: ask for trials.
pub fn suggest(study: impl Display) -> String {
    format!("/v1/studies/{study}/suggest")
}

/// `/v1/studies/{study}/table`: the dashboard's trial table.
pub fn table(study: impl Display) -> String {
    format!("/v1/studies/{study}/table")
}

/// `/v1/studies/{study}/trials`: add (POST) and list (GET) a study's trials.
pub fn trials(study: impl Display) -> String {
    format!("/v1/studies/{study}/trials")
}

/// `/v1/studies/{study}/trials?state={state}`: the study's trials in `state`.
pub fn trials_in_state(study: impl Display, state: impl Display) -> String {
    format!("{}?state={state}", trials(study))
}

/// `/v1/studies/{study}/trials?page_size=1000`: the largest page, every trial of a test's
/// study.
pub fn all_trials(study: impl Display) -> String {
    format!("{}?page_size=1000", trials(study))
}

/// `/v1/studies/{study}/trials/{trial}`: read or change (PATCH) a trial.
pub fn trial(study: impl Display, trial: impl Display) -> String {
    format!("/v1/studies/{study}/trials/{trial}")
}

/// `/v1/studies/{study}/trials/{trial}/artifacts`: list a trial's files.
pub fn trial_artifacts(study: impl Display, trial: impl Display) -> String {
    format!("{}/artifacts", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/artifacts/content`: one of a trial's files.
pub fn trial_artifact_content(study: impl Display, trial: impl Display) -> String {
    format!("{}/artifacts/content", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/checkpoint_copied`.
pub fn trial_checkpoint_copied(study: impl Display, trial: impl Display) -> String {
    format!("{}/checkpoint_copied", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/complete`.
pub fn trial_complete(study: impl Display, trial: impl Display) -> String {
    format!("{}/complete", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/exec`: a shell in a running trial (WebSocket).
pub fn trial_exec(study: impl Display, trial: impl Display) -> String {
    format!("{}/exec", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/fail`.
pub fn trial_fail(study: impl Display, trial: impl Display) -> String {
    format!("{}/fail", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/heartbeat`.
pub fn trial_heartbeat(study: impl Display, trial: impl Display) -> String {
    format!("{}/heartbeat", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/logs`: a trial's job output.
pub fn trial_logs(study: impl Display, trial: impl Display) -> String {
    format!("{}/logs", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/measurements`: report a measurement.
pub fn trial_measurements(study: impl Display, trial: impl Display) -> String {
    format!("{}/measurements", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/retry`: run a failed trial again.
pub fn trial_retry(study: impl Display, trial: impl Display) -> String {
    format!("{}/retry", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/should_stop`: the early-stopping decision.
pub fn trial_should_stop(study: impl Display, trial: impl Display) -> String {
    format!("{}/should_stop", self::trial(study, trial))
}

/// `/v1/studies/{study}/trials/{trial}/token`: a token for the trial's job.
pub fn trial_token(study: impl Display, trial: impl Display) -> String {
    format!("{}/token", self::trial(study, trial))
}

/// `/v1/pools`: list the worker pools.
pub fn pools() -> String {
    "/v1/pools".to_string()
}

/// `/v1/pools/{pool}`: one pool and its workers.
pub fn pool(pool: impl Display) -> String {
    format!("/v1/pools/{pool}")
}

/// `/v1/pools/{pool}/workers/{worker}`: a worker joins (PUT) a pool.
pub fn pool_worker(pool: impl Display, worker: impl Display) -> String {
    format!("{}/workers/{worker}", self::pool(pool))
}

/// `/v1/pools/{pool}/workers/{worker}/lease`: a worker asks for a trial.
pub fn pool_worker_lease(pool: impl Display, worker: impl Display) -> String {
    format!("{}/lease", pool_worker(pool, worker))
}

/// `/v1/tokens`: create (POST) and list (GET) tokens.
pub fn tokens() -> String {
    "/v1/tokens".to_string()
}

/// `/v1/tokens/{name}`: revoke (DELETE) a token.
pub fn token(name: impl Display) -> String {
    format!("/v1/tokens/{name}")
}

/// `/v1/audit`: the audit trail.
pub fn audit() -> String {
    "/v1/audit".to_string()
}

/// `/studies/{study}`: the dashboard's page of a study.
pub fn study_page(study: impl Display) -> String {
    format!("/studies/{study}")
}

/// `/studies/{study}/trials/{trial}`: the dashboard's page of a trial.
pub fn trial_page(study: impl Display, trial: impl Display) -> String {
    format!("/studies/{study}/trials/{trial}")
}
