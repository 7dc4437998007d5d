//! Liveness, readiness, Prometheus metrics and the OpenAPI document.

use super::access::{Access, AccessRouter};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::routes;

use super::AppState;
use super::error::ErrorBody;
use crate::model::Role;
use crate::model::TrialState;
use crate::service::PoolConnections;

pub fn router() -> AccessRouter {
    // Probes come without tokens; the metrics and the document are a reader's.
    AccessRouter::new()
        .routes(Access::Public, routes!(healthz))
        .routes(Access::Public, routes!(readyz))
        .routes(Access::Role(Role::Reader), routes!(metrics))
        .routes(Access::Role(Role::Reader), routes!(openapi_yaml))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HealthStatus {
    /// `ok`, or `unavailable` when the database cannot be reached.
    pub status: String,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Up", body = HealthStatus)))]
pub async fn healthz() -> axum::Json<HealthStatus> {
    axum::Json(HealthStatus {
        status: "ok".into(),
    })
}

/// The database is reachable.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = HealthStatus),
        (status = 503, description = "The database cannot be reached", body = HealthStatus),
    ))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.service.ping().await {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(HealthStatus {
                status: "ok".into(),
            }),
        ),
        Err(error) => {
            tracing::warn!(%error, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(HealthStatus {
                    status: "unavailable".into(),
                }),
            )
        }
    }
}

/// Prometheus metrics: requests and latencies by route, group-commit batch sizes, trials by
/// state, and this process's database connections by pool.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format", content_type = "text/plain", body = String),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
    ))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // Trials by state are read at scrape time, so every replica reports the shared truth.
    match state.service.trial_counts_all().await {
        Ok(counts) => {
            for s in TrialState::ALL {
                let n = match s {
                    TrialState::Requested => counts.requested,
                    TrialState::Active => counts.active,
                    TrialState::Stopping => counts.stopping,
                    TrialState::Completed => counts.completed,
                    TrialState::Infeasible => counts.infeasible,
                    TrialState::Failed => counts.failed,
                    TrialState::Paused => counts.paused,
                };
                metrics::gauge!("augur_trials", "state" => s.as_str()).set(n as f64);
            }
        }
        Err(error) => tracing::warn!(%error, "could not count trials for /metrics"),
    }
    // This app's pools, written beside the process-wide recorder's text rather than through
    // it: the recorder is shared by every app in the process (tests run several), a pool is not.
    let mut text = state.metrics.render();
    text.push_str(&connection_gauges(&state.service.store_connections()));
    match state.service.list_pools().await {
        Ok(pools) => text.push_str(&pool_gauges(&pools)),
        Err(error) => tracing::warn!(%error, "could not read the pools for /metrics"),
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// `augur_db_connections{pool,state}` in Prometheus text format: idle and busy connections
/// per pool; requests waiting long for a connection show here first.
fn connection_gauges(pools: &[PoolConnections]) -> String {
    let mut text = String::from("# TYPE augur_db_connections gauge\n");
    for pool in pools {
        for (state, n) in [("idle", pool.idle), ("busy", pool.busy)] {
            text.push_str(&format!(
                "augur_db_connections{{pool=\"{}\",state=\"{state}\"}} {n}\n",
                pool.pool
            ));
        }
    }
    text
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.yaml", tag = "operations",
    responses(
        (status = 200, description = "The OpenAPI document", content_type = "application/yaml", body = Object),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
    ))]
pub async fn openapi_yaml(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        state.openapi_yaml.to_string(),
    )
}

/// `augur_pool_slots{pool,state}` (live workers' slots, busy and idle),
/// `augur_pool_queue_length{pool}` (trials waiting for a slot) and `augur_pool_workers{pool}`
/// in Prometheus text format, read from the store at scrape time like the trial counts.
fn pool_gauges(pools: &[crate::model::pool::PoolSummary]) -> String {
    use std::fmt::Write;
    if pools.is_empty() {
        return String::new();
    }
    // One gauge: its help, then a sample per (labels, value). Pool names are letters, digits,
    // '-', '_' and '.': nothing to escape in a label.
    let gauge = |text: &mut String, name: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(text, "{name}{{{labels}}} {value}");
        }
    };
    let pool = |p: &crate::model::pool::PoolSummary| format!("pool=\"{}\"", p.name);
    let mut text = String::new();
    let slots: Vec<(String, u64)> = pools
        .iter()
        .flat_map(|p| {
            [
                (
                    format!("{},state=\"busy\"", pool(p)),
                    u64::from(p.busy_slots),
                ),
                (
                    format!("{},state=\"idle\"", pool(p)),
                    u64::from(p.idle_slots),
                ),
            ]
        })
        .collect();
    gauge(
        &mut text,
        "augur_pool_slots",
        "Slots of a pool's live workers, busy or idle.",
        &slots,
    );
    let queue: Vec<(String, u64)> = pools.iter().map(|p| (pool(p), p.queue_length)).collect();
    gauge(
        &mut text,
        "augur_pool_queue_length",
        "Trials waiting for a pool's slots.",
        &queue,
    );
    let workers: Vec<(String, u64)> = pools
        .iter()
        .map(|p| (pool(p), u64::from(p.workers)))
        .collect();
    gauge(
        &mut text,
        "augur_pool_workers",
        "Live workers of a pool.",
        &workers,
    );
    text
}
