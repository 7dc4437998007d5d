//! The study runner: keeps up to `parallel_trials` of one study's trials running, starting
//! the next one as soon as a slot frees, until the budget is done or the study is stopped.
//! After a restart it resumes the trials it had started (same trial, same directories).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::DispatchConfig;
use super::executor::Executor;
use super::local::LocalExecutor;
use super::slurm::SlurmExecutor;
use super::trial::{AttemptStart, Interrupt, TrialEnd, TrialReporter, TrialSetup, run_trial};
use crate::model::{ExecutorName, Measurement, StudyState, TrialState};
use crate::service::{Completion, Service, ServiceError};

/// The runner lease: renewed every `RENEW_EVERY`; another replica may take the study over
/// once it is `LEASE_TTL` old.
pub const LEASE_TTL: chrono::Duration = chrono::Duration::seconds(15);
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// Re-read the study at least this often (changes made through another replica).
const RECHECK_EVERY: Duration = Duration::from_secs(1);
/// The `client_id` of dispatched trials.
pub const RUNNER_CLIENT: &str = "augur-dispatcher";

/// The per-trial directories' base for a study.
pub fn output_dir(config: &DispatchConfig, study_id: i64, job_output_dir: Option<&str>) -> PathBuf {
    match job_output_dir {
        Some(dir) => config.base_dir.join(dir),
        None => config
            .base_dir
            .join("augur-runs")
            .join(format!("study-{study_id}")),
    }
}

pub async fn run_study(
    service: Service,
    config: Arc<DispatchConfig>,
    study_id: i64,
    mut wake: watch::Receiver<Interrupt>,
) {
    let (interrupt_trials, _) = watch::channel(Interrupt::None);
    let mut tasks: JoinSet<(i64, TrialEnd)> = JoinSet::new();
    let mut running: HashSet<i64> = HashSet::new();
    let mut renew = tokio::time::interval(RENEW_EVERY);
    let mut setup: Option<Arc<TrialSetup>> = None;
    let mut resumed = false;
    // The study as last read. A trial's end does not re-read it (that would put a query in
    // the path from a freed slot to the next job); wake-ups, the periodic recheck and a
    // suggest that reports the study ended do.
    let mut current: Option<crate::store::StudyRecord> = None;
    let mut stale = true;
    loop {
        if stale {
            match service.store().get_study(study_id).await {
                // `None`: the study was deleted.
                Ok(study) => current = study,
                Err(error) => {
                    tracing::warn!(study_id, %error, "runner could not read its study");
                    tokio::time::sleep(RECHECK_EVERY).await;
                    continue;
                }
            }
            stale = false;
        }
        let Some(study) = current
            .clone()
            .filter(|s| s.state == StudyState::Active && s.spec.trial_job.is_some())
        else {
            // Stopped, failed or deleted: cancel what runs. Completed: nothing runs.
            let _ = interrupt_trials.send(Interrupt::Cancel);
            while tasks.join_next().await.is_some() {}
            return;
        };
        let Some(job) = study.spec.trial_job.clone() else {
            return;
        };
        if setup.as_ref().is_none_or(|s| s.job != job) {
            let metric_ids: Vec<String> = study.spec.metrics.iter().map(|m| m.id.clone()).collect();
            let executor: Arc<dyn Executor> = match job.executor {
                ExecutorName::Slurm => {
                    Arc::new(SlurmExecutor::new(job.slurm.clone().unwrap_or_default()))
                }
                _ => Arc::new(LocalExecutor),
            };
            let metric_pattern = TrialSetup::metric_pattern(&job);
            setup = Some(Arc::new(TrialSetup {
                study_id,
                output_dir: output_dir(&config, study_id, job.output_dir.as_deref()),
                job,
                metric_ids,
                early_stopping: study.spec.early_stopping.is_some(),
                augur_url: config.augur_url.clone(),
                base_env: super::job_base_env(&config.job_env),
                executor,
                reporter: Arc::new(ServiceReporter {
                    service: service.clone(),
                    study_id,
                }),
                metric_pattern,
            }));
        }
        let Some(setup) = setup.clone() else { return };

        if !resumed {
            resumed = true;
            for trial in resumable_trials(&service, study_id).await {
                tracing::info!(study_id, trial_id = trial.0, "resuming trial");
                running.insert(trial.0);
                tasks.spawn(spawn_trial(
                    setup.clone(),
                    trial.0,
                    trial.1,
                    None,
                    interrupt_trials.subscribe(),
                ));
            }
        }

        let free = (study.spec.parallel_trials.max(1) as usize).saturating_sub(running.len());
        if free > 0 {
            // Each trial's first launch is counted with its suggestion, with one of these
            // tokens: one commit less between a freed slot and the next job.
            let tokens: Vec<String> = (0..free).map(|_| crate::api::auth::new_token()).collect();
            let hashes = tokens.iter().map(|t| crate::api::auth::hash_token(t));
            match service
                .suggest_dispatched(study_id, RUNNER_CLIENT, hashes.collect())
                .await
            {
                Ok(s) => {
                    if s.study_state != StudyState::Active {
                        stale = true;
                    }
                    for (trial, token) in s.trials.into_iter().zip(tokens) {
                        if running.insert(trial.id) {
                            let first = AttemptStart {
                                number: trial.attempts,
                                token: Some(token),
                            };
                            tasks.spawn(spawn_trial(
                                setup.clone(),
                                trial.id,
                                trial.parameters,
                                Some(first),
                                interrupt_trials.subscribe(),
                            ));
                        }
                    }
                }
                Err(error) => tracing::warn!(study_id, %error, "runner could not get suggestions"),
            }
        }

        tokio::select! {
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                // Trials that ended together free their slots in one suggest.
                let mut ended = vec![done];
                while let Some(more) = tasks.try_join_next() {
                    ended.push(more);
                }
                for (trial_id, end) in ended.into_iter().flatten() {
                    running.remove(&trial_id);
                    tracing::info!(study_id, trial_id, ?end, "trial ended");
                }
            }
            changed = wake.changed() => {
                stale = true;
                let what = if changed.is_ok() { *wake.borrow() } else { Interrupt::Shutdown };
                if what != Interrupt::None {
                    let _ = interrupt_trials.send(what);
                    while tasks.join_next().await.is_some() {}
                    return;
                }
            }
            _ = renew.tick() => {
                let kept = service.store().claim_runner(study_id, &config.owner, chrono::Utc::now(), LEASE_TTL).await;
                if matches!(kept, Ok(false)) {
                    tracing::warn!(study_id, "lost the runner lease; stopping this runner");
                    let _ = interrupt_trials.send(Interrupt::Shutdown);
                    while tasks.join_next().await.is_some() {}
                    return;
                }
            }
            _ = tokio::time::sleep(RECHECK_EVERY) => stale = true,
        }
    }
}

async fn spawn_trial(
    setup: Arc<TrialSetup>,
    trial_id: i64,
    parameters: augur_optimizer::Assignment,
    first: Option<AttemptStart>,
    interrupt: watch::Receiver<Interrupt>,
) -> (i64, TrialEnd) {
    (
        trial_id,
        run_trial(setup, trial_id, parameters, first, interrupt).await,
    )
}

/// Trials this study's dispatcher had started and not finished (the service restarted).
async fn resumable_trials(
    service: &Service,
    study_id: i64,
) -> Vec<(i64, augur_optimizer::Assignment)> {
    let mut out = Vec::new();
    for state in [TrialState::Active, TrialState::Stopping] {
        let mut after = 0;
        loop {
            let page = match service
                .store()
                .list_trials(study_id, Some(state), after, 500)
                .await
            {
                Ok(p) => p,
                Err(error) => {
                    tracing::warn!(study_id, %error, "could not list trials to resume");
                    break;
                }
            };
            let Some(last) = page.last().map(|t| t.id) else {
                break;
            };
            out.extend(
                page.into_iter()
                    .filter(|t| t.client_id.as_deref() == Some(RUNNER_CLIENT))
                    .map(|t| (t.id, t.parameters)),
            );
            after = last;
        }
    }
    out
}

/// Reports a dispatched trial's outcome straight to the service.
struct ServiceReporter {
    service: Service,
    study_id: i64,
}

#[async_trait]
impl TrialReporter for ServiceReporter {
    async fn measurement(&self, trial_id: i64, measurement: Measurement) -> Result<(), String> {
        self.service
            .add_measurement_record(self.study_id, trial_id, measurement)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    async fn complete_with(&self, trial_id: i64, last: Vec<Measurement>) -> Result<bool, String> {
        match self
            .service
            .complete_trial_record(self.study_id, trial_id, Completion::Selected(last))
            .await
        {
            Ok(_) => Ok(true),
            Err(ServiceError::Invalid(_)) => Ok(false),
            // Completed meanwhile (by the job over HTTP).
            Err(ServiceError::Conflict { .. }) => Ok(true),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn fail(&self, trial_id: i64, reason: String) -> Result<(), String> {
        match self
            .service
            .fail_trial_record(self.study_id, trial_id, reason)
            .await
        {
            Ok(_) | Err(ServiceError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn should_stop(&self, trial_id: i64) -> Result<bool, String> {
        self.service
            .should_stop(self.study_id, trial_id)
            .await
            .map_err(|e| e.to_string())
    }

    async fn finished(&self, trial_id: i64) -> Result<bool, String> {
        let trial = self
            .service
            .get_trial(self.study_id, trial_id)
            .await
            .map_err(|e| e.to_string())?;
        Ok(!trial.state.is_unfinished())
    }

    // The count and the token go in the study's next batch, with its other changes.
    async fn start_attempt(
        &self,
        trial_id: i64,
        max_attempts: u32,
    ) -> Result<Option<AttemptStart>, String> {
        let token = crate::api::auth::new_token();
        let hash = crate::api::auth::hash_token(&token);
        let number = self
            .service
            .start_attempt(self.study_id, trial_id, max_attempts, hash)
            .await
            .map_err(|e| e.to_string())?;
        Ok(number.map(|number| AttemptStart {
            number,
            token: Some(token),
        }))
    }

    async fn refund_attempt(&self, trial_id: i64) -> Result<(), String> {
        self.service
            .refund_attempt(self.study_id, trial_id)
            .await
            .map_err(|e| e.to_string())
    }
}
