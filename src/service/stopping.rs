//! Early stopping: whether a running trial should stop, by the study's rule (median or decay
//! curve, on the metric it names) as a policy (`augur_optimizer::EarlyStopping`), compared
//! with the latest completed trials' curves.

use augur_optimizer::{Decision, Policy, StudyView};

use super::state_machine::Command;
use super::{Caller, Service, ServiceError, ServiceResult, design, stored_config};
use crate::model::{Trial, TrialState};

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

    /// Stop a running trial because a client asked (Vizier's StopTrial), whatever the rule
    /// says: active → stopping; its worker completes it. A report: see `check_reporter`.
    pub async fn stop_trial(
        &self,
        actor: &Caller,
        study_id: i64,
        trial_id: i64,
    ) -> ServiceResult<Trial> {
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        let trial = self
            .change_trial(study_id, Command::MarkStopping { trial_id })
            .await?;
        self.audit_trial(actor, "trial.stop", study_id, trial_id, None)
            .await;
        Ok(trial)
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
        let Some(policy) = &config.early_stopping else {
            return Ok(false);
        };
        if trial.state != TrialState::Active {
            return Ok(false);
        }
        // The trial and its latest completed peers, with their curves.
        let mut peers = self
            .store
            .latest_completed(study_id, STOPPING_PEERS)
            .await?;
        let mut rows = match (peers.last(), peers.first()) {
            (Some(oldest), Some(newest)) => {
                self.store
                    .measurements(study_id, oldest.id, newest.id)
                    .await?
            }
            _ => Vec::new(),
        };
        rows.extend(
            self.store
                .measurements(study_id, trial_id, trial_id)
                .await?,
        );
        peers.push(trial);
        let views = design::trial_views(&peers, &config, design::curves_by_trial(rows));
        let study = StudyView {
            trials: &views,
            ..design::history_free(&config, 1)
        };
        Ok(policy
            .decide(&study, 0)
            .decisions
            .contains(&Decision::Stop {
                trial: trial_id.max(0) as u64,
            }))
    }
}
