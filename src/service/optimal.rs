//! The optimal trials: the best one, or the Pareto set of a study with several metrics.

use augur_optimizer::Goal;

use super::{Service, ServiceResult, pareto, stored_config};
use crate::model::{Trial, TrialState};
use crate::store::TrialRecord;

impl Service {
    /// The best trial, or the Pareto set of a multi-metric study.
    pub async fn optimal_trials(&self, study_id: i64) -> ServiceResult<Vec<Trial>> {
        let study = self.study_record(study_id).await?;
        let config = stored_config(&study)?;
        let records = if config.metrics.len() == 1 {
            let maximize = config.metrics[0].goal == Goal::Maximize;
            self.store
                .best_trial(study_id, maximize)
                .await?
                .into_iter()
                .collect()
        } else {
            let completed: Vec<TrialRecord> = self
                .store
                .all_trials(study_id)
                .await?
                .into_iter()
                .filter(|t| {
                    t.state == TrialState::Completed && !t.excluded && t.final_measurement.is_some()
                })
                .collect();
            pareto::pareto_front(completed, &config.metrics)
        };
        self.trial_views(study_id, records).await
    }
}
