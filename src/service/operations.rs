//! What operators ask: whether the database answers (`/readyz`) and trials by state over
//! every study (`/metrics`).

use std::time::Duration;

use super::{Service, ServiceError, ServiceResult};
use crate::model::TrialCounts;

/// How long readiness waits for the database: while it is down, the pool keeps trying to
/// connect for up to its acquire timeout (10 s), and a probe must not wait that long.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// One connection pool's connections: `reads` (request handlers), `commits` (study
/// transactions) or `answers` (answers of committed changes); the last two PostgreSQL's
/// only.
#[derive(Debug, Clone, Copy)]
pub struct PoolConnections {
    pub pool: &'static str,
    pub idle: usize,
    pub busy: usize,
}

impl Service {
    /// Ok when the database answers, within a second.
    pub async fn ping(&self) -> ServiceResult<()> {
        match tokio::time::timeout(PING_TIMEOUT, self.store.ping()).await {
            Ok(answered) => Ok(answered?),
            Err(_) => Err(ServiceError::Unavailable(format!(
                "the database did not answer within {PING_TIMEOUT:?}"
            ))),
        }
    }

    /// Trials by state over every study.
    pub async fn trial_counts_all(&self) -> ServiceResult<TrialCounts> {
        Ok(self.store.count_all_trials().await?)
    }

    /// This process's database connection pools, right now.
    pub fn store_connections(&self) -> Vec<PoolConnections> {
        self.store
            .connections()
            .into_iter()
            .map(|pool| PoolConnections {
                pool: pool.pool,
                idle: pool.idle,
                busy: (pool.open as usize).saturating_sub(pool.idle),
            })
            .collect()
    }

    /// `postgres` or `sqlite`.
    pub fn backend(&self) -> &'static str {
        self.store.backend()
    }
}
