//! The service: every operation on studies, trials, tokens and dispatched runs, for the API,
//! the dashboard, the dispatcher and the CLI alike. It keeps its store to itself and hands
//! out its own types (or `model`'s), never store records.

mod annotations;
pub mod artifacts;
mod audit;
mod checks;
pub mod design;
mod error;
pub mod exec;
mod group_commit;
mod job_policy;
pub mod logs;
mod notifications;
mod operations;
mod optimal;
pub mod optuna;
mod paging;
mod pareto;
mod pools;
mod replicas;
mod runners;
mod snapshots;
mod state_machine;
mod stopping;
mod studies;
mod suggest;
mod tokens;
pub mod trial_files;
mod trials;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use error::{InternalError, ServiceError, ServiceResult, error_chain};
pub use job_policy::{JobPolicy, KubernetesPolicy};
pub use notifications::{NotifySettings, SIGNATURE_HEADER, signature};
pub use operations::PoolConnections;
pub use paging::{Changes, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, Page, cursor_after_seq};
pub use pools::MAX_LEASE_WAIT;
pub use replicas::{Peer, Replicas};
pub use runners::{DispatchedTrial, RUNNER_LEASE_TTL, RunnerStudy};
pub use snapshots::StudySnapshot;
pub use state_machine::Completion;
pub use suggest::{DispatchedSuggestions, Suggestions};
pub use tokens::{
    Caller, MIN_CONFIGURED_TOKEN_LEN, NewToken, OPEN_CALLER, TOKEN_CACHE_TTL,
    check_configured_token, hash_token, new_token,
};

use group_commit::GroupCommit;
use state_machine::{Command, Reply};

use crate::model::{Measurement, Study, StudyConfig, StudyId, Trial, TrialId, ValidationError};
use crate::store::{Store, StudyRecord, TrialRecord};

/// Where things are, by concern:
/// - `studies.rs`: create, read, list, stop, change, delete a study;
/// - `suggest.rs`: hand out trials (designers run here, outside the study's lock);
/// - `trials.rs`: add, read, measure, complete, fail, exclude a trial; changes since a cursor;
/// - `stopping.rs`: the early-stopping verdict; `optimal.rs`: best trial or Pareto set;
/// - `replicas.rs`: the replicas sharing the database and which one takes a study's changes;
/// - `runners.rs`: what the dispatcher asks (its studies, leases, attempts, resumable trials);
/// - `tokens.rs`: minting, hashing and checking API tokens (roles, the auth cache, trial
///   tokens for pulled trials); `audit.rs`: the audit trail; `logs.rs`: dispatched trials' logs;
/// - `notifications.rs`: webhooks called after a batch commits (a study's end, a failed trial,
///   a new best), from a background task;
/// - `snapshots.rs`: the dashboard's cache of a study's trials; `operations.rs`: readiness
///   and counts for `/metrics`;
/// - `state_machine.rs`: the one place where trials change state and the cap is enforced,
///   applied in batches by `group_commit.rs`; `checks.rs` and `paging.rs`: input checks and
///   page tokens.
#[derive(Clone)]
pub struct Service {
    store: Arc<dyn Store>,
    commits: GroupCommit,
    /// Model-based suggestions for one study are computed one at a time in this process, so
    /// that each sees the trials the previous one handed out as pending. The lock holds how
    /// long the study's last fit took (see `suggest::LastFit`).
    design_locks: Arc<Mutex<HashMap<StudyId, Arc<tokio::sync::Mutex<suggest::LastFit>>>>>,
    /// Model fits running at once in this process: one per core. More would only share the
    /// cores and make every fit late; a fit waits here (first come, first served) on its
    /// suggestion's time budget.
    design_slots: Arc<tokio::sync::Semaphore>,
    /// Ids of studies that were created, changed, stopped or deleted in this process: the
    /// dispatcher reacts at once instead of at its next poll.
    events: tokio::sync::broadcast::Sender<StudyId>,
    /// See `fixed_study`. Study ids are never reused; an entry's search space may lag the
    /// study's (it only grows), which its users allow for.
    fixed_studies: Arc<Mutex<HashMap<StudyId, FixedStudy>>>,
    snapshots: snapshots::Snapshots,
    tokens: tokens::TokenCache,
    /// Where relative `output_dir`s of dispatched studies resolve (their logs are served).
    runs_base: Arc<PathBuf>,
    /// The commands a `trial_job` may run (`--job-commands`).
    job_policy: Arc<JobPolicy>,
    /// Where committed batches leave news for webhooks (`notifications.rs`).
    notifier: notifications::Notifier,
    /// The operator's settings for webhooks (`--notify-*`).
    notify_settings: Arc<NotifySettings>,
    /// Opens exec sessions in running trials (`exec`): the dispatcher's executors, when this
    /// process dispatches.
    trial_exec: exec::ExecHook,
    /// Worker pools' waiting leases and their one-pick-at-a-time locks (`pools.rs`).
    pools: pools::Pools,
}

impl Service {
    /// `runs_base`: where the per-trial directories of dispatched studies with a relative (or
    /// no) `output_dir` live.
    pub fn new(store: Arc<dyn Store>, runs_base: PathBuf) -> Self {
        let tokens = tokens::TokenCache::default();
        let notifier = notifications::Notifier::default();
        Self {
            commits: GroupCommit::new(store.clone(), tokens.clone(), notifier.clone()),
            notifier,
            notify_settings: Arc::default(),
            store,
            design_locks: Arc::default(),
            design_slots: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, usize::from),
            )),
            events: tokio::sync::broadcast::channel(1024).0,
            fixed_studies: Arc::default(),
            snapshots: snapshots::Snapshots::default(),
            tokens,
            runs_base: Arc::new(runs_base),
            job_policy: Arc::default(),
            trial_exec: Arc::default(),
            pools: pools::Pools::default(),
        }
    }

    /// The same service with `count` commit lanes (1 to 8) instead of one per core
    /// (`--commit-lanes`).
    pub fn with_commit_lanes(mut self, count: usize) -> Self {
        self.commits = self.commits.with_lanes(count);
        self
    }

    /// The same service, allowing `trial_job` commands by `policy`.
    pub fn with_job_policy(mut self, policy: JobPolicy) -> Self {
        self.job_policy = Arc::new(policy);
        self
    }

    /// Study ids as they are created, changed, stopped or deleted in this process.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<StudyId> {
        self.events.subscribe()
    }

    fn notify(&self, study_id: StudyId) {
        // A new or changed study may have room for a pool's waiting slots.
        self.pools.wake();
        // No subscriber is fine: then nothing is dispatched in this process.
        let _ = self.events.send(study_id);
    }

    async fn study_record(&self, study_id: StudyId) -> ServiceResult<StudyRecord> {
        self.store
            .get_study(study_id)
            .await?
            .ok_or_else(|| not_found_study(study_id))
    }

    async fn trial_record(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> ServiceResult<TrialRecord> {
        match self.store.get_trial(study_id, trial_id).await? {
            Some(t) => Ok(t),
            None => {
                self.study_record(study_id).await?;
                Err(ServiceError::NotFound(format!(
                    "trial {trial_id} of study {study_id}"
                )))
            }
        }
    }

    /// The study's validated config, read once per process: only its parts that never
    /// change after creation (algorithm, metrics, trial job) may be used from it, since
    /// `max_trials`, `parallel_trials` and `max_failed_trials` can be changed by any
    /// replica. Its search space may be older than the study's, which only grows
    /// (`add_parameter`): a check it refuses is made again on the stored one (see
    /// `add_trial`), and the designers read the stored one. Saves a read and a validation on
    /// every suggest, measurement and completion.
    async fn fixed_config(&self, study_id: StudyId) -> ServiceResult<Arc<StudyConfig>> {
        Ok(self.fixed_study(study_id).await?.config)
    }

    /// What never changes of a study once created: its validated config (but see
    /// `fixed_config` on its search space) and its creator.
    async fn fixed_study(&self, study_id: StudyId) -> ServiceResult<FixedStudy> {
        if let Some(fixed) = self
            .fixed_studies
            .lock()
            .ok()
            .and_then(|c| c.get(&study_id).cloned())
        {
            return Ok(fixed);
        }
        let study = self.study_record(study_id).await?;
        let fixed = FixedStudy {
            config: Arc::new(stored_config(&study)?),
            created_by: study.created_by.map(Arc::from),
        };
        if let Ok(mut cache) = self.fixed_studies.lock() {
            cache.insert(study_id, fixed.clone());
        }
        Ok(fixed)
    }

    /// Drop this process's copy of the study's config (its space grew).
    fn forget_fixed_study(&self, study_id: StudyId) {
        if let Ok(mut cache) = self.fixed_studies.lock() {
            cache.remove(&study_id);
        }
    }

    /// Apply a trial command in the study's next batch; the trial as it is after it.
    async fn change_trial_record(
        &self,
        study_id: StudyId,
        command: Command,
    ) -> ServiceResult<TrialRecord> {
        match self.commits.submit(study_id, command).await? {
            Reply::Trial(record) => Ok(*record),
            other => Err(unexpected(other)),
        }
    }

    async fn change_trial(&self, study_id: StudyId, command: Command) -> ServiceResult<Trial> {
        let record = self.change_trial_record(study_id, command).await?;
        self.answer_view(study_id, record).await
    }

    /// The view of a trial a committed change returned: its measurements are read after
    /// the commit, so an outage now is no longer "nothing was done".
    async fn answer_view(&self, study_id: StudyId, record: TrialRecord) -> ServiceResult<Trial> {
        Ok(self
            .read_trial_views(study_id, vec![record], Reads::Answer)
            .await
            .map_err(ServiceError::after_commit)?
            .remove(0))
    }

    async fn trial_view(&self, study_id: StudyId, record: TrialRecord) -> ServiceResult<Trial> {
        Ok(self.trial_views(study_id, vec![record]).await?.remove(0))
    }

    /// Trials as the API shows them, with their measurements (one query for all).
    async fn trial_views(
        &self,
        study_id: StudyId,
        records: Vec<TrialRecord>,
    ) -> ServiceResult<Vec<Trial>> {
        self.read_trial_views(study_id, records, Reads::Request)
            .await
    }

    async fn read_trial_views(
        &self,
        study_id: StudyId,
        records: Vec<TrialRecord>,
        reads: Reads,
    ) -> ServiceResult<Vec<Trial>> {
        let (Some(first), Some(last)) = (
            records.iter().map(|t| t.id).min(),
            records.iter().map(|t| t.id).max(),
        ) else {
            return Ok(Vec::new());
        };
        let measurements = match reads {
            Reads::Request => self.store.measurements(study_id, first, last).await?,
            Reads::Answer => {
                self.store
                    .answer_measurements(study_id, first, last)
                    .await?
            }
        };
        let mut by_trial: HashMap<TrialId, Vec<Measurement>> = HashMap::new();
        for (trial_id, m) in measurements {
            by_trial.entry(trial_id).or_default().push(m);
        }
        // Reads of trials carry their annotations; answers of reports, which a busy server
        // sends by the thousand a second, do not (they change none).
        let mut annotations = match reads {
            Reads::Request => self.store.annotations(study_id, first, last).await?,
            Reads::Answer => Default::default(),
        };
        Ok(records
            .into_iter()
            .map(|t| {
                let measurements = by_trial.remove(&t.id).unwrap_or_default();
                let notes = annotations.remove(&t.id).unwrap_or_default();
                Trial {
                    annotations: notes,
                    ..trial_of(t, measurements)
                }
            })
            .collect())
    }

    /// `trial_views` of trials whose last `created` were created by the batch that handed
    /// them out: their measurements are not read, there are none. (A new trial is most of
    /// what a busy server hands out, and this read was half of its requests' connections.)
    /// The others' are read as an answer: the batch is committed.
    async fn handed_trial_views(
        &self,
        study_id: StudyId,
        mut records: Vec<TrialRecord>,
        created: usize,
    ) -> ServiceResult<Vec<Trial>> {
        let new = records.split_off(records.len().saturating_sub(created));
        let mut views = self
            .read_trial_views(study_id, records, Reads::Answer)
            .await?;
        // Trained before at a smaller budget: it goes on from its checkpoint.
        for view in &mut views {
            view.resume = view.budget.is_some() && !view.measurements.is_empty();
        }
        views.extend(new.into_iter().map(|t| trial_of(t, Vec::new())));
        Ok(views)
    }

    async fn study_view(&self, record: StudyRecord) -> ServiceResult<Study> {
        let id = record.id;
        let mut annotations = self.store.study_annotations(id, id).await?;
        self.annotated_study_view(record, &mut annotations).await
    }

    /// `study_view` with the study's annotations taken from those already read (for a page
    /// of studies, one read for all).
    async fn annotated_study_view(
        &self,
        record: StudyRecord,
        annotations: &mut std::collections::BTreeMap<StudyId, crate::model::Annotations>,
    ) -> ServiceResult<Study> {
        let best_trial = match self.best_trial_record(record.id, &record.spec).await? {
            Some(t) => Some(self.trial_view(record.id, t).await?),
            None => match self.provisional_best(record.id, &record.spec).await? {
                Some(t) => Some(Trial {
                    provisional: true,
                    ..self.trial_view(record.id, t).await?
                }),
                None => None,
            },
        };
        Ok(Study {
            annotations: annotations.remove(&record.id).unwrap_or_default(),
            ..study_of(record, best_trial)
        })
    }
}

/// The parts of a study that never change after it is created, and its search space as it
/// was when read (see `fixed_config`).
#[derive(Clone)]
struct FixedStudy {
    config: Arc<StudyConfig>,
    /// The token that created it; `None` for studies from before roles (admins' alone).
    created_by: Option<Arc<str>>,
}

/// Which connections a read takes: a new request's, or those kept for the answer of a
/// change already committed ([`Store::answer_measurements`]).
#[derive(Clone, Copy)]
enum Reads {
    Request,
    Answer,
}

/// A study as the API shows it.
fn study_of(record: StudyRecord, best_trial: Option<Trial>) -> Study {
    Study {
        id: record.id,
        name: record.name,
        state: record.state,
        state_reason: record.state_reason,
        // Webhooks' secrets are kept, never shown.
        spec: record.spec.redacted(),
        trial_counts: record.trial_counts,
        best_trial,
        created_by: record.created_by,
        created_at: record.created_at,
        updated_at: record.updated_at,
        annotations: Default::default(),
    }
}

/// A stored study's config. Its spec was validated when it was stored: failing now is a bug
/// or a hand edit, not the caller's fault.
fn stored_config(study: &StudyRecord) -> ServiceResult<StudyConfig> {
    study.spec.validate().map_err(corrupt_spec(study.id))
}

fn not_found_study(study_id: StudyId) -> ServiceError {
    ServiceError::NotFound(format!("study {study_id}"))
}

fn corrupt_spec(study_id: StudyId) -> impl Fn(ValidationError) -> ServiceError {
    move |e| InternalError::data(format!("stored spec of study {study_id} is invalid"), e).into()
}

fn unexpected(reply: Reply) -> ServiceError {
    InternalError::bug(format!("unexpected reply {reply:?}")).into()
}

/// A trial as the API shows it.
fn trial_of(t: TrialRecord, measurements: Vec<Measurement>) -> Trial {
    Trial {
        measurements,
        id: t.id,
        state: t.state,
        parameters: t.parameters,
        final_measurement: t.final_measurement,
        infeasible_reason: t.infeasible_reason,
        fail_reason: t.fail_reason,
        client_id: t.client_id,
        early_stopped: t.early_stopped,
        excluded: t.excluded,
        attempts: t.attempts,
        budget: t.budget,
        lineage: t.lineage,
        resume: false,
        provisional: false,
        created_at: t.created_at,
        started_at: t.started_at,
        completed_at: t.completed_at,
        annotations: Default::default(),
    }
}
