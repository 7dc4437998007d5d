//! Early stopping: whether a running trial should stop, by the study's rule (median or decay
//! curve, `augur_optimizer::stopping`), compared with the latest completed trials' curves.

use std::collections::HashMap;

use super::state_machine::Command;
use super::{Caller, Service, ServiceError, ServiceResult, stored_config};
use crate::model::{Measurement, TrialState};

/// Completed trials whose curves the early-stopping rule compares a running trial with: the
/// latest ones, so the rule's cost stays bounded however large the study.
const STOPPING_PEERS: i64 = 1_000;

impl Service {
    /// `should_stop` asked by `actor` through the API: it may move the trial to `stopping`,
    /// so it is a report (see `check_reporter` for who may), audited when it stops the trial.
    pub async fn ask_should_stop(
        &self,
        actor: &Caller,
        study_id: i64,
        trial_id: i64,
    ) -> ServiceResult<bool> {
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        let stopped = self.should_stop(study_id, trial_id).await?;
        if stopped {
            self.audit_trial(actor, "trial.stop", study_id, trial_id, None)
                .await;
        }
        Ok(stopped)
    }

    /// Whether the study's early-stopping rule says this trial should stop; if so an active
    /// trial moves to `stopping`.
    pub async fn should_stop(&self, study_id: i64, trial_id: i64) -> ServiceResult<bool> {
        let stop = self.stop_verdict(study_id, trial_id).await?;
        if stop {
            match self
                .commits
                .submit(study_id, Command::MarkStopping { trial_id })
                .await
            {
                Ok(_) => {}
                // It finished meanwhile: nothing left to stop.
                Err(ServiceError::Conflict { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(stop)
    }

    /// The rule's verdict on the trial, changing nothing: true for a trial already stopping.
    pub async fn stop_verdict(&self, study_id: i64, trial_id: i64) -> ServiceResult<bool> {
        let study = self.study_record(study_id).await?;
        let config = stored_config(&study)?;
        let trial = self.trial_record(study_id, trial_id).await?;
        if trial.state == TrialState::Stopping {
            return Ok(true);
        }
        let Some(rule) = &config.early_stopping else {
            return Ok(false);
        };
        if trial.state != TrialState::Active {
            return Ok(false);
        }
        let metric = &config.metrics[0];
        let peers = self
            .store
            .latest_completed_ids(study_id, STOPPING_PEERS)
            .await?;
        let mut curves = match (peers.last(), peers.first()) {
            (Some(&oldest), Some(&newest)) => curves_by_trial(
                self.store.measurements(study_id, oldest, newest).await?,
                &metric.id,
            ),
            _ => HashMap::new(),
        };
        let completed: Vec<Vec<(u64, f64)>> =
            peers.iter().filter_map(|id| curves.remove(id)).collect();
        let own_rows = self
            .store
            .measurements(study_id, trial_id, trial_id)
            .await?;
        let own = curves_by_trial(own_rows, &metric.id)
            .remove(&trial_id)
            .unwrap_or_default();
        Ok(augur_optimizer::stopping::should_stop(
            rule,
            metric.goal,
            &own,
            &completed,
        ))
    }
}

/// `(step, value)` learning curves of one metric, by trial, sorted by step.
fn curves_by_trial(rows: Vec<(i64, Measurement)>, metric: &str) -> HashMap<i64, Vec<(u64, f64)>> {
    let mut curves: HashMap<i64, Vec<(u64, f64)>> = HashMap::new();
    for (trial_id, m) in rows {
        if let Some(v) = m.metrics.get(metric) {
            curves
                .entry(trial_id)
                .or_default()
                .push((m.step.max(0) as u64, *v));
        }
    }
    curves
}
