//! Early stopping: whether a running trial should stop, by the study's rule (median or decay
//! curve, on the metric it names) as a policy (`augur_optimizer::EarlyStopping`), compared
//! with the latest completed trials' curves.

use augur_optimizer::multi_fidelity::stops_at_rung;
use augur_optimizer::{Decision, Policy, StudyView};

use super::state_machine::Command;
use super::{Caller, Service, ServiceError, ServiceResult, design, stored_config};
use crate::model::spec::SchedulerName;
use crate::model::{StudyConfig, StudyId, Trial, TrialId, TrialState};
use crate::store::TrialRecord;

/// Completed trials whose curves the early-stopping rule compares a running trial with: the
/// latest ones, so the rule's cost stays bounded however large the study.
const STOPPING_PEERS: i64 = 1_000;

impl Service {
    /// `should_stop` asked by `actor` through the API: it may move the trial to `stopping`,
    /// so it is a report (see `check_reporter` for who may), audited when it stops the trial.
    pub async fn ask_should_stop(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
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
        study_id: StudyId,
        trial_id: TrialId,
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
    pub async fn should_stop(&self, study_id: StudyId, trial_id: TrialId) -> ServiceResult<bool> {
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
    pub async fn stop_verdict(&self, study_id: StudyId, trial_id: TrialId) -> ServiceResult<bool> {
        let study = self.study_record(study_id).await?;
        let config = stored_config(&study)?;
        let trial = self.trial_record(study_id, trial_id).await?;
        if trial.state == TrialState::Stopping {
            return Ok(true);
        }
        if trial.state != TrialState::Active {
            return Ok(false);
        }
        let Some(policy) = &config.early_stopping else {
            return self.rung_verdict(study_id, &config, trial).await;
        };
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
                trial: design::optimizer_number(trial_id),
            }))
    }

    /// ASHA's and Hyperband's answer for a trial that trains on past its budget in one
    /// process (`multi_fidelity::stops_at_rung`): ranked at the highest rung it reached among
    /// every trial of the study measured there. False for other studies.
    async fn rung_verdict(
        &self,
        study_id: StudyId,
        config: &StudyConfig,
        trial: TrialRecord,
    ) -> ServiceResult<bool> {
        let (Some(SchedulerName::Asha | SchedulerName::Hyperband), Some(fidelity), Some(metric)) =
            (config.scheduler, &config.fidelity, config.first_objective())
        else {
            return Ok(false);
        };
        let trials = self.store.all_trials(study_id).await?;
        let rows = match trials.last() {
            Some(last) => {
                self.store
                    .measurements(study_id, TrialId::new(1), last.id)
                    .await?
            }
            None => Vec::new(),
        };
        let views = design::trial_views(&trials, config, design::curves_by_trial(rows));
        let number = design::optimizer_number(trial.id);
        let Some(own) = views.iter().find(|t| t.number == number) else {
            return Ok(false);
        };
        Ok(stops_at_rung(&fidelity.ladder, metric, own, &views).unwrap_or(false))
    }
}
