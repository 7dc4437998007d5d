//! What operators ask: whether the database answers (`/readyz`) and trials by state over
//! every study (`/metrics`).

use super::{Service, ServiceResult};
use crate::model::TrialCounts;

impl Service {
    /// Ok when the database answers.
    pub async fn ping(&self) -> ServiceResult<()> {
        Ok(self.store.ping().await?)
    }

    /// Trials by state over every study.
    pub async fn trial_counts_all(&self) -> ServiceResult<TrialCounts> {
        Ok(self.store.count_all_trials().await?)
    }

    /// `postgres` or `sqlite`.
    pub fn backend(&self) -> &'static str {
        self.store.backend()
    }
}
