//! Trials: add one with chosen parameters, read and list them, report measurements,
//! complete, fail, heartbeat, exclude; and the changes since a cursor for live views.

use std::collections::BTreeMap;

use augur_optimizer::Assignment;

use super::checks::{check_measurement, check_metrics, check_reason};
use super::paging::{format_cursor, page_bounds, parse_cursor, split_page};
use super::state_machine::Command;
use super::{Caller, Changes, Completion, Page, Service, ServiceError, ServiceResult};
use crate::model::{Measurement, StudyId, Trial, TrialId, TrialState};
use crate::store::{ChangeCursor, TrialRecord};

impl Service {
    pub async fn add_trial(
        &self,
        actor: &Caller,
        study_id: StudyId,
        parameters: Assignment,
        final_metrics: Option<BTreeMap<String, f64>>,
    ) -> ServiceResult<Trial> {
        self.check_reporter(actor, study_id, None).await?;
        let mut config = self.fixed_config(study_id).await?;
        if config.space.check_assignment(&parameters).is_err() {
            // The space may have grown since this process read it (on another replica).
            self.forget_fixed_study(study_id);
            config = self.fixed_config(study_id).await?;
        }
        config
            .space
            .check_assignment(&parameters)
            .map_err(|(id, why)| ServiceError::invalid(format!("parameters.{id}"), why))?;
        let final_measurement = match final_metrics {
            Some(metrics) => {
                check_metrics(&config, &metrics, "final_measurement.metrics", true)?;
                Some(Measurement {
                    step: 0,
                    elapsed_secs: None,
                    metrics,
                })
            }
            None => None,
        };
        let completed = final_measurement.is_some();
        let command = Command::AddTrial {
            parameters,
            final_measurement,
        };
        let trial = self.change_trial(study_id, command).await?;
        let detail = if completed { "completed" } else { "requested" };
        self.audit(
            actor,
            "trial.add",
            Some(study_id),
            Some(trial.id),
            Some(detail.into()),
        )
        .await;
        Ok(trial)
    }

    pub async fn list_trials(
        &self,
        study_id: StudyId,
        state: Option<TrialState>,
        page_size: Option<i64>,
        page_token: Option<&str>,
    ) -> ServiceResult<Page<Trial>> {
        let (limit, after) = page_bounds(page_size, page_token)?;
        self.study_record(study_id).await?;
        let records = self
            .store
            .list_trials(study_id, state, after, limit + 1)
            .await?;
        let (records, next) = split_page(records, limit, |t| t.id);
        Ok(Page {
            items: self.trial_views(study_id, records).await?,
            next_page_token: next,
        })
    }

    /// Trials created or changed since `cursor` (from a previous answer; none = from the
    /// start), oldest change first, and the cursor to ask with next. Dashboards poll this
    /// instead of reloading every trial.
    pub async fn trial_changes(
        &self,
        study_id: StudyId,
        cursor: Option<&str>,
        page_size: Option<i64>,
    ) -> ServiceResult<Changes> {
        let (limit, _) = page_bounds::<i64>(page_size, None)?;
        let after = parse_cursor(cursor)?;
        self.study_record(study_id).await?;
        let records = self
            .store
            .changed_trials(study_id, after, limit + 1)
            .await?;
        let has_more = records.len() as i64 > limit;
        let records: Vec<TrialRecord> = records.into_iter().take(limit as usize).collect();
        let next = records.last().map_or(after, |t| ChangeCursor {
            change_seq: t.change_seq,
            trial: t.id,
        });
        Ok(Changes {
            trials: self.trial_views(study_id, records).await?,
            cursor: format_cursor(next),
            has_more,
        })
    }

    pub async fn get_trial(&self, study_id: StudyId, trial_id: TrialId) -> ServiceResult<Trial> {
        let record = self.trial_record(study_id, trial_id).await?;
        self.trial_view(study_id, record).await
    }

    /// Whether the trial is still requested, active or stopping.
    pub async fn trial_unfinished(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> ServiceResult<bool> {
        let record = self.trial_record(study_id, trial_id).await?;
        Ok(record.state.is_unfinished())
    }

    /// Record `actor`'s measurement of a running trial (see `check_reporter` for who may).
    /// Not audited: a trial reports many, and a measurement ends nothing.
    pub async fn add_measurement(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        measurement: Measurement,
    ) -> ServiceResult<Trial> {
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        let record = self
            .measurement_command(study_id, trial_id, measurement, None)
            .await?;
        self.answer_view(study_id, record).await
    }

    /// `add_measurement` without the trial's view (a read of all its measurements): for the
    /// study runner `runner` (while it holds the study's runner lease), which reports every
    /// 250 ms and needs no answer.
    pub async fn record_measurement(
        &self,
        study_id: StudyId,
        runner: &str,
        trial_id: TrialId,
        measurement: Measurement,
    ) -> ServiceResult<()> {
        self.measurement_command(study_id, trial_id, measurement, Some(runner))
            .await
            .map(drop)
    }

    async fn measurement_command(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        measurement: Measurement,
        runner: Option<&str>,
    ) -> ServiceResult<TrialRecord> {
        let config = self.fixed_config(study_id).await?;
        check_measurement(&config, &measurement)?;
        let command = Command::AddMeasurement {
            trial_id,
            measurement,
        }
        .by_runner(runner);
        self.change_trial_record(study_id, command).await
    }

    /// `actor` completes a trial (see `check_reporter` for who may). Audited with what it
    /// reported when the actor is not the study's own reporter (an admin completing another
    /// creator's trial): a completion decides the best trial. The creator's and the trial
    /// token's own completions come by the thousand, like measurements, and are not.
    pub async fn complete_trial(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        outcome: Completion,
    ) -> ServiceResult<Trial> {
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        if let Completion::Infeasible(reason) = &outcome {
            check_reason("infeasible_reason", reason)?;
        }
        let detail = match &outcome {
            Completion::Metrics { metrics, .. } => serde_json::to_string(metrics).ok(),
            Completion::Infeasible(reason) => Some(format!("infeasible: {reason}")),
            Completion::Selected(_) => Some("by measurement selection".into()),
        };
        let record = self
            .completion_command(study_id, trial_id, outcome, None)
            .await?;
        if !self.is_own_reporter(actor, study_id).await {
            self.audit_trial(actor, "trial.complete", study_id, trial_id, detail)
                .await;
        }
        self.answer_view(study_id, record).await
    }

    /// `complete_trial` without the trial's view, for `runner` (see `record_measurement`).
    pub async fn record_completion(
        &self,
        study_id: StudyId,
        runner: &str,
        trial_id: TrialId,
        outcome: Completion,
    ) -> ServiceResult<()> {
        self.completion_command(study_id, trial_id, outcome, Some(runner))
            .await
            .map(drop)
    }

    async fn completion_command(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        outcome: Completion,
        runner: Option<&str>,
    ) -> ServiceResult<TrialRecord> {
        let config = self.fixed_config(study_id).await?;
        match &outcome {
            Completion::Selected(last) => {
                for measurement in last {
                    check_measurement(&config, measurement)?;
                }
            }
            Completion::Metrics { metrics, .. } => {
                check_metrics(&config, metrics, "metrics", true)?
            }
            Completion::Infeasible(reason) if reason.trim().is_empty() => {
                return Err(ServiceError::invalid(
                    "infeasible_reason",
                    "must not be blank",
                ));
            }
            Completion::Infeasible(_) => {}
        }
        let command = Command::Complete { trial_id, outcome }.by_runner(runner);
        let record = self.change_trial_record(study_id, command).await?;
        // A slot freed: a pool's waiting leases look again.
        self.pools.wake();
        Ok(record)
    }

    /// `actor` fails a trial (see `check_reporter` for who may); audited with the reason.
    pub async fn fail_trial(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        reason: String,
    ) -> ServiceResult<Trial> {
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        check_reason("reason", &reason)?;
        let detail = Some(reason.clone());
        let record = self
            .change_trial_record(study_id, Command::Fail { trial_id, reason })
            .await?;
        self.pools.wake();
        self.audit_trial(actor, "trial.fail", study_id, trial_id, detail)
            .await;
        self.answer_view(study_id, record).await
    }

    /// `fail_trial` without the trial's view, for `runner` (see `record_measurement`).
    pub async fn record_failure(
        &self,
        study_id: StudyId,
        runner: &str,
        trial_id: TrialId,
        reason: String,
    ) -> ServiceResult<()> {
        let command = Command::Fail { trial_id, reason }.by_runner(Some(runner));
        self.change_trial_record(study_id, command).await.map(drop)
    }

    /// Extend a running trial's lease (see `check_reporter` for who may). Not audited: it
    /// changes no state, and comes every few seconds.
    pub async fn heartbeat(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> ServiceResult<Trial> {
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        self.change_trial(study_id, Command::Heartbeat { trial_id })
            .await
    }

    /// PBT: a pulled trial's worker copied its parent's checkpoint (see `check_reporter` for
    /// who may). Not audited, as the dispatcher's own copies are not.
    pub async fn report_checkpoint_copied(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> ServiceResult<Trial> {
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        self.change_trial(study_id, Command::CheckpointCopied { trial_id })
            .await
    }

    /// Run a failed trial again, with the same parameters and directories (a retried
    /// trial finds its checkpoints): a change to the study, so its creator's or an admin's.
    pub async fn retry_trial(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> ServiceResult<Trial> {
        self.check_manager(actor, study_id).await?;
        let trial = self
            .change_trial(study_id, Command::Retry { trial_id })
            .await?;
        self.notify(study_id);
        self.audit(actor, "trial.retry", Some(study_id), Some(trial_id), None)
            .await;
        Ok(trial)
    }

    /// Hide a trial from the optimizer (or show it again): a change to the study, so its
    /// creator's or an admin's.
    pub async fn set_excluded(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        excluded: bool,
    ) -> ServiceResult<Trial> {
        self.check_manager(actor, study_id).await?;
        let trial = self
            .change_trial(study_id, Command::SetExcluded { trial_id, excluded })
            .await?;
        let action = if excluded {
            "trial.exclude"
        } else {
            "trial.include"
        };
        self.audit(actor, action, Some(study_id), Some(trial_id), None)
            .await;
        Ok(trial)
    }
}
