//! The changes an Optuna client makes to its trials (`service/optuna.rs`), applied in the
//! study's batch like every other trial change: so two workers asking to run the same
//! waiting trial get one `true` and one `false`, on any replica. Optuna's trials hold no
//! lease (a crashed worker's trial stays running, as in Optuna) and count against neither
//! the study's cap nor its budget; their states map as `OptunaState::to_augur` says.

use std::collections::BTreeMap;

use augur_optimizer::{Assignment, Value};
use chrono::{DateTime, Utc};

use super::{Reply, StudyBatch};
use crate::model::{Measurement, TrialId, TrialState};
use crate::service::optuna::OptunaState;
use crate::service::{ServiceError, ServiceResult};

#[derive(Debug, Clone)]
pub enum OptunaChange {
    /// A new trial in `state`; its times default to now as the state needs them.
    Create {
        state: OptunaState,
        parameters: Assignment,
        final_metrics: Option<BTreeMap<String, f64>>,
        intermediate: Vec<Measurement>,
        started_at: Option<DateTime<Utc>>,
        completed_at: Option<DateTime<Utc>>,
    },
    /// Set one parameter of an unfinished trial (Optuna's internal float).
    SetParameter {
        trial_id: TrialId,
        name: String,
        value: f64,
    },
    /// Move an unfinished trial to `state`; with `from_waiting_only`, only a waiting trial
    /// moves (answered `Updated(false)` otherwise).
    SetState {
        trial_id: TrialId,
        state: OptunaState,
        final_metrics: Option<BTreeMap<String, f64>>,
        from_waiting_only: bool,
        started_at: Option<DateTime<Utc>>,
        completed_at: Option<DateTime<Utc>>,
    },
    SetIntermediate {
        trial_id: TrialId,
        measurement: Measurement,
    },
}

impl StudyBatch {
    pub(super) async fn optuna(&mut self, change: OptunaChange) -> ServiceResult<Reply> {
        match change {
            OptunaChange::Create {
                state,
                parameters,
                final_metrics,
                intermediate,
                started_at,
                completed_at,
            } => {
                let (augur_state, early_stopped) = state.to_augur();
                let now = self.now;
                let mut trial = self.new_trial(parameters, augur_state, None);
                trial.lease_expires_at = None;
                trial.early_stopped = early_stopped;
                trial.started_at = match state {
                    OptunaState::Waiting => None,
                    _ => Some(started_at.unwrap_or(now)),
                };
                if state.is_finished() {
                    trial.completed_at = Some(completed_at.unwrap_or(now));
                }
                trial.objective = final_metrics.as_ref().and_then(|m| self.objective(m));
                trial.final_measurement = final_metrics.map(|metrics| Measurement {
                    step: intermediate.iter().map(|m| m.step).max().unwrap_or(0),
                    elapsed_secs: None,
                    metrics,
                });
                let id = trial.id;
                self.trials.insert(id, trial.clone());
                for measurement in intermediate {
                    self.record_measurement(id, measurement);
                }
                Ok(Reply::Trial(Box::new(trial)))
            }
            OptunaChange::SetParameter {
                trial_id,
                name,
                value,
            } => {
                let trial = self.unfinished_optuna_trial(trial_id).await?;
                trial.parameters.insert(name, Value::Float(value));
                Ok(self.touched(trial_id))
            }
            OptunaChange::SetState {
                trial_id,
                state,
                final_metrics,
                from_waiting_only,
                started_at,
                completed_at,
            } => {
                let objective = final_metrics.as_ref().and_then(|m| self.objective(m));
                let now = self.now;
                let trial = self.unfinished_optuna_trial(trial_id).await?;
                if from_waiting_only && trial.state != TrialState::Requested {
                    return Ok(Reply::Updated(false));
                }
                let (augur_state, early_stopped) = state.to_augur();
                trial.state = augur_state;
                trial.early_stopped = early_stopped;
                trial.lease_expires_at = None;
                match state {
                    OptunaState::Running => trial.started_at = Some(started_at.unwrap_or(now)),
                    // An enqueued trial settles here after its attributes: not started yet.
                    OptunaState::Waiting => trial.started_at = None,
                    _ => {}
                }
                if state.is_finished() {
                    trial.completed_at = Some(completed_at.unwrap_or(now));
                    if let Some(metrics) = final_metrics {
                        let step = trial.final_measurement.as_ref().map_or(0, |m| m.step);
                        trial.final_measurement = Some(Measurement {
                            step,
                            elapsed_secs: None,
                            metrics,
                        });
                        trial.objective = objective;
                    }
                }
                self.touched(trial_id);
                Ok(Reply::Updated(true))
            }
            OptunaChange::SetIntermediate {
                trial_id,
                measurement,
            } => {
                self.unfinished_optuna_trial(trial_id).await?;
                self.record_measurement(trial_id, measurement);
                Ok(self.touched(trial_id))
            }
        }
    }

    /// A trial Optuna may still change: not finished (Optuna's `UpdateFinishedTrialError`
    /// is this conflict).
    async fn unfinished_optuna_trial(
        &mut self,
        trial_id: TrialId,
    ) -> ServiceResult<&mut crate::store::TrialRecord> {
        let trial = self.trial_mut(trial_id).await?;
        if OptunaState::of(trial.state, trial.early_stopped).is_finished() {
            return Err(ServiceError::conflict(format!(
                "trial {trial_id} is already {}",
                trial.state.as_str()
            )));
        }
        Ok(trial)
    }
}
