//! `/v1/pools`: worker pools (DESIGN §4.4). Readers see the pools, their workers, queues
//! and utilisation; a pool's workers (`augur worker --pool`) report themselves and lease
//! trials with an operator's (or admin's) token, the role that may run trials. The rules
//! live in `service/pools.rs`.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::routes;

use super::AppState;
use super::access::{Access, AccessRouter};
use super::auth::Actor;
use super::error::{ApiResult, ErrorBody};
use super::extract::ApiJson;
use crate::model::Role;
use crate::model::pool::{PoolDetail, PoolLease, PoolSummary, WorkerReport};

pub fn router() -> AccessRouter {
    let (read, run) = (Access::Role(Role::Reader), Access::Role(Role::Operator));
    AccessRouter::new()
        .routes(read, routes!(list_pools))
        .routes(read, routes!(get_pool))
        .routes(run, routes!(report_worker))
        .routes(run, routes!(lease_trial))
}

const POOL: &str = "the pool's name (1-64 letters, digits, '-', '_', '.')";
const WORKER: &str = "the worker's id (`augur worker --client-id`)";

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<PoolSummary>,
}

/// Every pool a worker or an active study names, in short: live workers, slots busy and
/// idle, queue length, slot-seconds busy and idle so far.
#[utoipa::path(get, path = "/v1/pools", tag = "pools",
    responses(
        (status = 200, description = "The pools, by name", body = PoolList),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
    ))]
pub async fn list_pools(State(state): State<AppState>) -> ApiResult<Json<PoolList>> {
    Ok(Json(PoolList {
        pools: state.service.list_pools().await?,
    }))
}

/// One pool: its workers (host, slots, GPUs, busy and idle, last seen), the studies using
/// it with their pending demand, and its busy and idle slot-seconds per minute for the last
/// hour. A name nothing uses yet is an empty pool.
#[utoipa::path(get, path = "/v1/pools/{pool}", tag = "pools",
    params(("pool" = String, Path, description = POOL)),
    responses(
        (status = 200, description = "The pool", body = PoolDetail),
        (status = 400, description = "Not a pool name", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
    ))]
pub async fn get_pool(
    State(state): State<AppState>,
    Path(pool): Path<String>,
) -> ApiResult<Json<PoolDetail>> {
    Ok(Json(state.service.get_pool(&pool).await?))
}

/// A worker joins the pool (its first report) or says it is still there, with its slots,
/// GPUs and busy slots (`augur worker --pool` reports every 2 s and at each change). Its
/// slot-seconds since its last report are counted busy or idle by its busy count then.
#[utoipa::path(put, path = "/v1/pools/{pool}/workers/{worker}", tag = "pools",
    request_body = WorkerReport,
    params(("pool" = String, Path, description = POOL), ("worker" = String, Path, description = WORKER)),
    responses(
        (status = 204, description = "Recorded"),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not an operator's or admin's token", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn report_worker(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((pool, worker)): Path<(String, String)>,
    ApiJson(report): ApiJson<WorkerReport>,
) -> ApiResult<StatusCode> {
    state
        .service
        .report_pool_worker(&actor, &pool, &worker, report)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// The worker's slot asking (0-255): the trial is handed to `<worker>/<slot>`, and a
    /// slot that asks again while it holds a trial gets that trial back.
    pub slot: u32,
    /// How long to wait for a trial when none is free now (a long poll; default 20, at most
    /// 30 seconds).
    #[serde(default)]
    pub wait_secs: Option<f64>,
    /// The slot's first ask since its worker started: a trial the slot still holds (its
    /// worker was restarted with the same id) comes back first.
    #[serde(default)]
    pub resume: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseResponse {
    /// The trial to run, or `null` when none came within the wait (ask again).
    pub lease: Option<PoolLease>,
}

/// The next trial of any study in the pool for this worker's slot, the study with the
/// fewest running trials per unit of `pool_weight` first, each study capped by its
/// `parallel_trials` and `max_trials`. Waits (long poll) until one is free or `wait_secs`
/// pass. The trial is leased to the slot like a pulled trial (`trial_lease_secs`): without
/// heartbeats it goes back to the pool. The answer's token may only report to the trial;
/// the worker reports with it and hands it to the trial.
#[utoipa::path(post, path = "/v1/pools/{pool}/workers/{worker}/lease", tag = "pools",
    request_body = LeaseRequest,
    params(("pool" = String, Path, description = POOL), ("worker" = String, Path, description = WORKER)),
    responses(
        (status = 200, description = "A trial, or none within the wait", body = LeaseResponse),
        (status = 400, description = "A field is wrong", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "Not an operator's or admin's token", body = ErrorBody),
        (status = 415, description = "Body is not JSON", body = ErrorBody),
    ))]
pub async fn lease_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((pool, worker)): Path<(String, String)>,
    ApiJson(request): ApiJson<LeaseRequest>,
) -> ApiResult<Json<LeaseResponse>> {
    let wait = request.wait_secs.unwrap_or(20.0);
    if !(0.0..=crate::service::MAX_LEASE_WAIT.as_secs_f64()).contains(&wait) {
        return Err(
            crate::service::ServiceError::invalid("wait_secs", "must be between 0 and 30").into(),
        );
    }
    let lease = state
        .service
        .lease_pool_trial(
            &actor,
            &pool,
            &worker,
            request.slot,
            Duration::from_secs_f64(wait),
            request.resume,
        )
        .await?;
    Ok(Json(LeaseResponse { lease }))
}
