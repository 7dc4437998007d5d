//! What the dispatcher asks of the service: the studies it should run, the lease that keeps
//! one runner per study across replicas, trials to resume after a restart, and each launch
//! counted (with the trial-scoped token it reports with) in the study's batch.

use augur_optimizer::Assignment;
use chrono::Utc;

use super::state_machine::{Command, Reply};
use super::{Service, ServiceResult, stored_config, unexpected};
use crate::model::{StudyConfig, StudyId, StudyState, TrialId, TrialState};
use crate::store::{StudyRecord, TrialRecord};

/// A runner lease lasts this long unless renewed; another replica may take the study over
/// once it is this old.
pub const RUNNER_LEASE_TTL: chrono::Duration = chrono::Duration::seconds(15);

/// A study as its runner sees it: its state and validated config (with its trial job).
#[derive(Debug, Clone)]
pub struct RunnerStudy {
    pub id: StudyId,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub state: StudyState,
    pub config: StudyConfig,
}

/// A trial handed to the dispatcher, its first launch counted.
#[derive(Debug, Clone)]
pub struct DispatchedTrial {
    pub id: TrialId,
    pub parameters: Assignment,
    /// Launches counted so far (1 for a new trial).
    pub attempts: u32,
    /// The budget of this attempt (multi-fidelity); `None`: the full budget.
    pub budget: Option<f64>,
    /// PBT: the trial whose checkpoint this one copies before its attempt.
    pub copy_from: Option<TrialId>,
}

impl From<TrialRecord> for DispatchedTrial {
    fn from(t: TrialRecord) -> Self {
        DispatchedTrial {
            id: t.id,
            parameters: t.parameters,
            attempts: t.attempts,
            budget: t.budget,
            copy_from: t.lineage.and_then(|l| l.copying_from),
        }
    }
}

impl Service {
    /// The study as its runner needs it; `None` once it is deleted.
    pub async fn runner_study(&self, study_id: StudyId) -> ServiceResult<Option<RunnerStudy>> {
        let Some(record) = self.store.get_study(study_id).await? else {
            return Ok(None);
        };
        Ok(Some(RunnerStudy {
            id: record.id,
            created_at: record.created_at,
            state: record.state,
            config: stored_config(&record)?,
        }))
    }

    /// Ids of the active studies with a `trial_job`: the ones some replica must run. A pool
    /// study's trials are its pool's workers' (`pools.rs`), never a dispatcher's.
    pub async fn dispatched_study_ids(&self) -> ServiceResult<Vec<StudyId>> {
        let dispatched = self
            .active_studies_where(|s| {
                s.spec
                    .trial_job
                    .as_ref()
                    .is_some_and(|job| job.executor.pool().is_none())
            })
            .await?;
        Ok(dispatched.iter().map(|s| s.id).collect())
    }

    /// The active studies that `keep` keeps, read page by page.
    pub(super) async fn active_studies_where(
        &self,
        keep: impl Fn(&StudyRecord) -> bool,
    ) -> ServiceResult<Vec<StudyRecord>> {
        let mut studies = Vec::new();
        let mut after = StudyId::new(0);
        loop {
            let page = self
                .store
                .list_studies(Some(StudyState::Active), None, after, 500)
                .await?;
            let Some(last) = page.last().map(|s| s.id) else {
                return Ok(studies);
            };
            studies.extend(page.into_iter().filter(|s| keep(s)));
            after = last;
        }
    }

    /// Take or renew the right to run the study's trials (`RUNNER_LEASE_TTL`). False while
    /// another owner holds it.
    pub async fn claim_runner(&self, study_id: StudyId, owner: &str) -> ServiceResult<bool> {
        Ok(self
            .store
            .claim_runner(study_id, owner, Utc::now(), RUNNER_LEASE_TTL)
            .await?)
    }

    pub async fn release_runner(&self, study_id: StudyId, owner: &str) -> ServiceResult<()> {
        Ok(self.store.release_runner(study_id, owner).await?)
    }

    /// Trials handed to `client_id` (the dispatcher) that are active or stopping: the ones
    /// it ran before a restart, to resume.
    pub async fn resumable_trials(
        &self,
        study_id: StudyId,
        client_id: &str,
    ) -> ServiceResult<Vec<DispatchedTrial>> {
        let mut out = Vec::new();
        for state in [TrialState::Active, TrialState::Stopping] {
            let mut after = TrialId::new(0);
            loop {
                let page = self
                    .store
                    .list_trials(study_id, Some(state), after, 500)
                    .await?;
                let Some(last) = page.last().map(|t| t.id) else {
                    break;
                };
                out.extend(
                    page.into_iter()
                        .filter(|t| t.client_id.as_deref() == Some(client_id))
                        .map(DispatchedTrial::from),
                );
                after = last;
            }
        }
        Ok(out)
    }

    /// Count a launch of a dispatched trial, up to `max_attempts`, and store the token it
    /// reports with, for `runner` while it holds the study's runner lease (as every report of
    /// a dispatcher). `None`: no launch left.
    pub async fn start_attempt(
        &self,
        study_id: StudyId,
        runner: &str,
        trial_id: TrialId,
        max_attempts: u32,
        token_hash: String,
    ) -> ServiceResult<Option<u32>> {
        let command = Command::StartAttempt {
            trial_id,
            max_attempts,
            token_hash,
        }
        .by_runner(Some(runner));
        match self.commits.submit(study_id, command).await? {
            Reply::Attempt(number) => Ok(number),
            other => Err(unexpected(other)),
        }
    }

    /// Give back a launch that the service ended itself (shutdown, or a leftover job killed
    /// after a restart).
    pub async fn refund_attempt(
        &self,
        study_id: StudyId,
        runner: &str,
        trial_id: TrialId,
    ) -> ServiceResult<()> {
        let command = Command::RefundAttempt { trial_id }.by_runner(Some(runner));
        self.commits.submit(study_id, command).await.map(drop)
    }

    /// PBT: the trial's checkpoint copy is made; the trial it copied may train on.
    pub async fn checkpoint_copied(
        &self,
        study_id: StudyId,
        runner: &str,
        trial_id: TrialId,
    ) -> ServiceResult<()> {
        let command = Command::CheckpointCopied { trial_id }.by_runner(Some(runner));
        self.commits.submit(study_id, command).await.map(drop)
    }
}
