//! The API's paths with ids in them, one function per route the tests call, named after
//! the route in `openapi.yaml`: `routes::trial_complete(study, trial)` is
//! `/v1/studies/{study}/trials/{trial}/complete`. A query the tests send often has its own
//! function (`trials_in_state`, `all_trials`, `changes_after`, `trial_logs_of_replica`); any
//! other is written on top of the route's path, as in
//! `format!("{}?page_size=10", routes::trials(study))`. `TestApp::url` and
//! `ServerProcess::url` make a full URL of a path.
//!
//! Written out instead: paths without an id (`"/v1/studies"`, `"/v1/tokens"`, `"/healthz"`),
//! and the paths a test means to be odd (an id that is not one, a study that does not
//! exist, an unknown route, a template), so that a literal path reads as deliberate.
//!
//! Ids are `impl Display`: a test passes an `i64`, a name or an id type alike.

use std::fmt::Display;

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

/// `/v1/studies/{study}/trials/{trial}/checkpoint_copied`: a PBT trial's worker has copied
/// its parent's checkpoint.
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

/// `/v1/studies/{study}/trials/{trial}/logs?replica={replica}`: the output of one replica
/// of a distributed trial (`workerpool0-0`, …).
pub fn trial_logs_of_replica(
    study: impl Display,
    trial: impl Display,
    replica: impl Display,
) -> String {
    format!("{}?replica={replica}", trial_logs(study, trial))
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

/// `/v1/tokens/{name}`: revoke (DELETE) a token.
pub fn token(name: impl Display) -> String {
    format!("/v1/tokens/{name}")
}

/// `/studies/{study}`: the dashboard's page of a study.
pub fn study_page(study: impl Display) -> String {
    format!("/studies/{study}")
}

/// `/studies/{study}/trials/{trial}`: the dashboard's page of a trial.
pub fn trial_page(study: impl Display, trial: impl Display) -> String {
    format!("/studies/{study}/trials/{trial}")
}

/// Vertex AI's Vizier routes (`api::vizier`), under `/v1/`, addressed by the resource
/// names Vertex answers with: a location (`projects/p/locations/l`), a study
/// (`…/studies/7`), a trial (`…/studies/7/trials/3`) or an operation. Each function is
/// named after the Vertex method it calls.
pub mod vizier {
    use std::fmt::Display;

    /// `/v1/{name}`: get or delete a study or a trial, or get an operation, by its name.
    pub fn resource(name: impl Display) -> String {
        format!("/v1/{name}")
    }

    /// `/v1/{location}/studies`: create (POST) and list (GET) the location's studies.
    pub fn studies(location: impl Display) -> String {
        format!("/v1/{location}/studies")
    }

    /// `/v1/{location}/studies:lookup`: a study of the location by its display name.
    pub fn lookup_study(location: impl Display) -> String {
        format!("{}:lookup", studies(location))
    }

    /// `/v1/{study}/trials`: add (POST) and list (GET) a study's trials.
    pub fn trials(study: impl Display) -> String {
        format!("/v1/{study}/trials")
    }

    /// `/v1/{study}/trials:suggest`.
    pub fn suggest_trials(study: impl Display) -> String {
        format!("{}:suggest", trials(study))
    }

    /// `/v1/{study}/trials:listOptimalTrials`.
    pub fn list_optimal_trials(study: impl Display) -> String {
        format!("{}:listOptimalTrials", trials(study))
    }

    /// `/v1/{trial}:addTrialMeasurement`.
    pub fn add_trial_measurement(trial: impl Display) -> String {
        format!("/v1/{trial}:addTrialMeasurement")
    }

    /// `/v1/{trial}:checkTrialEarlyStoppingState`.
    pub fn check_trial_early_stopping_state(trial: impl Display) -> String {
        format!("/v1/{trial}:checkTrialEarlyStoppingState")
    }

    /// `/v1/{trial}:complete`.
    pub fn complete_trial(trial: impl Display) -> String {
        format!("/v1/{trial}:complete")
    }

    /// `/v1/{trial}:stop`.
    pub fn stop_trial(trial: impl Display) -> String {
        format!("/v1/{trial}:stop")
    }

    /// `/v1/{operation}:wait`.
    pub fn wait_operation(operation: impl Display) -> String {
        format!("/v1/{operation}:wait")
    }

    /// `/v1/{operation}:cancel`.
    pub fn cancel_operation(operation: impl Display) -> String {
        format!("/v1/{operation}:cancel")
    }
}
