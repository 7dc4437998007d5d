//! The trial and study state machines, and the parallelism cap: the one place where trials
//! change state. A [`StudyBatch`] applies a batch of [`Command`]s to one study inside one
//! locked transaction (see `group_commit.rs`). Each command is checked against the state
//! left by the commands before it and either applies fully or changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use augur_optimizer::multi_fidelity::Fidelity;
use augur_optimizer::{Assignment, FullBudget};
use chrono::{DateTime, Duration, Utc};

use super::design;
use super::notifications::{Happened, Notifier, StudyNews};
use super::{InternalError, ServiceError, ServiceResult};
use crate::model::extension::trial_value;
use crate::model::{
    FinishedTrial, Measurement, MeasurementSelection, ParameterExtension, Segment, Step,
    StopVerdict, StudyConfig, StudyId, StudyState, StudyUpdate, TrialId, TrialKey, TrialState,
};
use crate::store::{Store, StudyRecord, StudyTx, TrialRecord, TrialToken};

mod optuna;
pub use optuna::OptunaChange;

/// A policy's decisions, made outside the study's lock from the history as it was when the
/// study's next trial number was `next_trial_id`: new points, and for a multi-fidelity
/// scheduler paused trials to resume at a budget and paused trials to stop.
#[derive(Debug, Clone, Default)]
pub struct Precomputed {
    pub points: Vec<Assignment>,
    /// The budget each new point starts at (`None`: the full budget), beside `points`.
    pub budgets: Vec<Option<f64>>,
    pub resumes: Vec<(TrialId, f64)>,
    pub stops: Vec<TrialId>,
    /// PBT: paused trials that copy another's checkpoint and go on with new values.
    pub exploits: Vec<Exploit>,
    /// No new trial will start again (`max_budget` spent).
    pub closed: bool,
    pub next_trial_id: TrialId,
}

/// PBT's exploit of a paused trial: it copies `parent_id`'s checkpoint before its next
/// attempt, at `budget`, with `parameters`.
#[derive(Debug, Clone)]
pub struct Exploit {
    pub trial_id: TrialId,
    pub parent_id: TrialId,
    pub parameters: Assignment,
    pub budget: f64,
}

/// A change to one study. Cloned so that a shared transaction that failed can be replayed
/// study by study (`group_commit.rs`).
#[derive(Debug, Clone)]
pub enum Command {
    /// Hand out up to `count` trials. `precomputed` carries suggestions from a designer that
    /// needs the history (computed outside the lock); otherwise the designer runs here.
    Suggest {
        count: usize,
        client_id: Option<String>,
        precomputed: Option<Precomputed>,
        /// For the study's own dispatcher: no resume by client id (it knows its jobs) and
        /// no lease (it watches its jobs itself).
        dispatched: bool,
        /// For the dispatcher: the first launch of each trial handed out is counted here,
        /// with the token whose hash is at the trial's position (none past the end).
        launch_tokens: Vec<String>,
        /// For a pool worker's slot: the trial at each position gets the token of this hash
        /// (replacing any earlier one), its launches not counted (the worker counts them).
        lease_tokens: Vec<String>,
    },
    /// Add a trial with chosen parameters, completed when `final_measurement` is given.
    AddTrial {
        parameters: Assignment,
        final_measurement: Option<Measurement>,
    },
    AddMeasurement {
        trial_id: TrialId,
        measurement: Measurement,
    },
    Complete {
        trial_id: TrialId,
        outcome: Completion,
    },
    Fail {
        trial_id: TrialId,
        reason: String,
    },
    Heartbeat {
        trial_id: TrialId,
    },
    /// The early-stopping rule said stop: active → stopping.
    MarkStopping {
        trial_id: TrialId,
    },
    SetExcluded {
        trial_id: TrialId,
        excluded: bool,
    },
    Stop,
    /// A failed trial runs again: requested, with the same parameters and directories.
    Retry {
        trial_id: TrialId,
    },
    /// A failed study runs again (once its limits allow): an explicit act, never a PATCH's
    /// side effect.
    Resume,
    Update(StudyUpdate),
    /// Grow the search space (see `model::extension`), and fill in the new parameter's
    /// value in the unfinished trials it names.
    AddParameter(Box<ParameterExtension>),
    /// Count one launch of a dispatched trial (up to `max_attempts`) and store the token it
    /// reports with (`token_hash`). In the batch, not beside it: a write of its own would
    /// wait for the study's lock (SQLite: in its busy handler's sleeps).
    StartAttempt {
        trial_id: TrialId,
        max_attempts: u32,
        token_hash: String,
    },
    /// Give back a launch the service ended itself.
    RefundAttempt {
        trial_id: TrialId,
    },
    /// Store a token for a pulled trial that `client_id` holds (it replaces the trial's
    /// earlier one), as `StartAttempt` does for a dispatched trial.
    IssueToken {
        trial_id: TrialId,
        client_id: String,
        token_hash: String,
    },
    /// Nothing but what every batch does first: send back the trials whose leases ran out.
    /// A pool asks it of a study whose trials all hold their slots and report nothing (their
    /// worker died): no other command would come to free them.
    ExpireLeases,
    /// PBT: the checkpoint the trial's lineage says to copy is copied (its parent may train
    /// on).
    CheckpointCopied {
        trial_id: TrialId,
    },
    /// A change of a trial made by an Optuna client (`service/optuna.rs`).
    Optuna(OptunaChange),
    /// `command` from the study's dispatcher `owner`: applied only while `owner` holds the
    /// study's runner lease. A runner that froze (a stopped VM) past its lease wakes with
    /// outcomes of jobs another replica has run again since: those must not count.
    AsRunner {
        owner: String,
        command: Box<Command>,
    },
}

impl Command {
    /// This command, applied only while `runner` (a dispatcher's owner id) holds the
    /// study's runner lease; `None`: as it is.
    pub fn by_runner(self, runner: Option<&str>) -> Command {
        match runner {
            Some(owner) => Command::AsRunner {
                owner: owner.to_string(),
                command: Box::new(self),
            },
            None => self,
        }
    }
}

/// How a trial completes.
#[derive(Debug, Clone)]
pub enum Completion {
    Metrics {
        metrics: BTreeMap<String, f64>,
        step: Option<Step>,
    },
    Infeasible(String),
    /// Select the final measurement from the reported ones (`measurement_selection`), after
    /// recording these last ones: a dispatched job's output read at its exit, recorded with
    /// the completion in one step.
    Selected(Vec<Measurement>),
}

/// What one suggest handed out.
#[derive(Debug)]
pub struct Handed {
    pub trials: Vec<TrialRecord>,
    /// How many of `trials`, at their end, this batch created: those have no measurements
    /// yet, so nobody need read them.
    pub created: usize,
    /// The study's state after the batch.
    pub study_state: StudyState,
    /// Whether the caller should ask again later (the cap was full, or the budget is spent
    /// while trials that may come back are still running).
    pub retry_later: bool,
}

#[derive(Debug)]
pub enum Reply {
    Suggested(Handed),
    /// The precomputed points were designed before trials that exist now (handed out by
    /// another process meanwhile): nothing was done; design again, seeing them as pending.
    Stale,
    Trial(Box<TrialRecord>),
    Study(Box<StudyRecord>),
    /// The launch's number, or `None`: no launch left.
    Attempt(Option<u32>),
    /// The token was stored.
    Issued,
    /// Whether the change was made (Optuna's `set_trial_state_values`).
    Updated(bool),
}

/// What a committed batch did besides answering its commands.
pub(super) struct BatchOutcome {
    pub replies: Vec<ServiceResult<Reply>>,
    /// Trials whose tokens were revoked (the trial finished or went back to `requested`) or
    /// replaced (a new launch or token): their old tokens must be forgotten by the cache.
    pub tokens_changed: Vec<TrialId>,
    /// What webhooks may hear of (`notifications.rs`), handed on after the commit.
    pub news: Option<StudyNews>,
}

pub(super) struct StudyBatch {
    tx: Box<dyn StudyTx>,
    study: StudyRecord,
    /// The study's state before the batch: a change to completed or failed is news.
    initial_state: StudyState,
    config: StudyConfig,
    now: DateTime<Utc>,
    /// Every trial this batch has loaded or created, by id.
    trials: BTreeMap<TrialId, TrialRecord>,
    /// The stored state of each trial loaded, for the study's trial counts.
    stored_states: BTreeMap<TrialId, TrialState>,
    created: BTreeSet<TrialId>,
    changed: BTreeSet<TrialId>,
    measurements: Vec<(TrialId, Measurement)>,
    /// Tokens of the launches counted in this batch.
    tokens: Vec<TrialToken>,
    /// Failed trials stored before this batch, read when first needed.
    stored_failed: Option<u64>,
    /// Trials this batch failed.
    failed_in_batch: u64,
    /// Failed trials this batch made requested again (`Command::Retry`).
    retried_in_batch: u64,
    study_changed: bool,
    /// The study's policy said no new trial will start again (its `max_budget` is spent).
    closed: bool,
    /// Study-level stopping must be asked again (a trial completed or was excluded, trials
    /// are asked for, the study changed): it reads every completed trial, so not after
    /// every command.
    stopping_due: bool,
    /// Study-level stopping's last answer in this batch: why the study should stop.
    stopping_verdict: Option<StopVerdict>,
    /// The dispatcher found holding the study's runner lease in this batch.
    runner_checked: Option<String>,
}

impl StudyBatch {
    /// Apply `commands` in a transaction of their own. The outer error means the
    /// transaction itself failed (nothing applied); inner errors are per command.
    pub async fn run(
        store: &dyn Store,
        study_id: StudyId,
        commands: Vec<Command>,
        notifier: &Notifier,
    ) -> ServiceResult<BatchOutcome> {
        let Some(tx) = store.begin_study(study_id).await? else {
            return Err(ServiceError::NotFound(format!("study {study_id}")));
        };
        let (outcome, tx) = Self::apply_locked(tx, commands, notifier).await?;
        tx.commit()
            .await
            .map_err(|e| ServiceError::from(e).during_commit())?;
        Ok(outcome)
    }

    /// Apply `commands` to the study `tx` holds, writing but not committing: the caller
    /// commits, maybe with other studies (`group_commit.rs`), and only then may anyone hear
    /// of the outcome (and `notifier`, of what it listens to).
    pub async fn apply_locked(
        mut tx: Box<dyn StudyTx>,
        commands: Vec<Command>,
        notifier: &Notifier,
    ) -> ServiceResult<(BatchOutcome, Box<dyn StudyTx>)> {
        let study = tx.study().clone();
        let study_id = study.id;
        let config = study
            .spec
            .validate()
            .map_err(|e| InternalError::data(format!("stored spec of study {study_id}"), e))?;
        let unfinished = tx.unfinished_trials().await?;
        let mut batch = StudyBatch {
            tx,
            initial_state: study.state,
            study,
            config,
            now: Utc::now(),
            stored_states: unfinished.iter().map(|t| (t.id, t.state)).collect(),
            trials: unfinished.into_iter().map(|t| (t.id, t)).collect(),
            created: BTreeSet::new(),
            changed: BTreeSet::new(),
            measurements: Vec::new(),
            tokens: Vec::new(),
            stored_failed: None,
            failed_in_batch: 0,
            closed: false,
            retried_in_batch: 0,
            study_changed: false,
            stopping_due: false,
            stopping_verdict: None,
            runner_checked: None,
        };
        batch.expire_leases();
        let mut results = Vec::with_capacity(commands.len());
        for command in commands {
            let result = batch.apply(command).await;
            batch.settle_study_state().await?;
            results.push(result);
        }
        let listened = notifier.listens(&batch.config.notifications);
        let (tokens_changed, news, tx) = batch.write(listened).await?;
        Ok((
            BatchOutcome {
                replies: results,
                tokens_changed,
                news,
            },
            tx,
        ))
    }

    async fn apply(&mut self, command: Command) -> ServiceResult<Reply> {
        let command = match command {
            Command::AsRunner { owner, command } => {
                self.check_runner(&owner).await?;
                *command
            }
            command => command,
        };
        // What may change study-level stopping's verdict (a suggestion asks it first).
        self.stopping_due |= matches!(
            command,
            Command::Suggest { .. }
                | Command::AddTrial { .. }
                | Command::Complete { .. }
                | Command::Fail { .. }
                | Command::SetExcluded { .. }
                | Command::Update(_)
                | Command::Resume
        );
        match command {
            Command::Suggest {
                count,
                client_id,
                precomputed,
                dispatched,
                launch_tokens,
                lease_tokens,
            } => {
                let reply = self
                    .suggest(count, client_id, precomputed, dispatched)
                    .await?;
                let reply = self.count_first_launches(reply, launch_tokens);
                if let Reply::Suggested(handed) = &reply {
                    for (trial, hash) in handed.trials.iter().zip(lease_tokens) {
                        self.tokens.push(self.trial_token(trial.id, hash));
                    }
                }
                Ok(reply)
            }
            Command::AddTrial {
                parameters,
                final_measurement,
            } => self.add_trial(parameters, final_measurement),
            Command::AddMeasurement {
                trial_id,
                measurement,
            } => self.add_measurement(trial_id, measurement).await,
            Command::Complete { trial_id, outcome } => self.complete(trial_id, outcome).await,
            Command::Fail { trial_id, reason } => self.fail(trial_id, reason).await,
            Command::Heartbeat { trial_id } => {
                let lease = self.lease();
                let trial = self.running_trial(trial_id, "heartbeat").await?;
                renew(trial, lease);
                Ok(self.touched(trial_id))
            }
            Command::MarkStopping { trial_id } => {
                let trial = self.running_trial(trial_id, "stop").await?;
                if trial.state == TrialState::Active {
                    trial.state = TrialState::Stopping;
                }
                Ok(self.touched(trial_id))
            }
            Command::SetExcluded { trial_id, excluded } => {
                let trial = self.trial_mut(trial_id).await?;
                trial.excluded = excluded;
                Ok(self.touched(trial_id))
            }
            // The batch expired the leases at its start.
            Command::ExpireLeases => Ok(Reply::Updated(true)),
            Command::Stop => {
                if self.study.state == StudyState::Active {
                    self.set_study_state(StudyState::Stopped, Some("stopped by a user".into()));
                    self.end_paused().await?;
                }
                Ok(Reply::Study(Box::new(self.study.clone())))
            }
            Command::Update(update) => self.update(update).await,
            Command::Optuna(change) => self.optuna(change).await,
            Command::AsRunner { .. } => {
                Err(InternalError::bug("a runner's command wraps another runner's").into())
            }
            Command::AddParameter(extension) => self.add_parameter(*extension).await,
            Command::Resume => self.resume().await,
            Command::Retry { trial_id } => self.retry(trial_id).await,
            Command::StartAttempt {
                trial_id,
                max_attempts,
                token_hash,
            } => self.start_attempt(trial_id, max_attempts, token_hash).await,
            Command::RefundAttempt { trial_id } => {
                let trial = self.trial_mut(trial_id).await?;
                trial.attempts = trial.attempts.saturating_sub(1);
                self.changed.insert(trial_id);
                Ok(Reply::Attempt(None))
            }
            Command::CheckpointCopied { trial_id } => self.checkpoint_copied(trial_id).await,
            Command::IssueToken {
                trial_id,
                client_id,
                token_hash,
            } => self.issue_token(trial_id, &client_id, token_hash).await,
        }
    }

    /// Count a launch of a running trial, with its token, unless its attempts are used up.
    async fn start_attempt(
        &mut self,
        trial_id: TrialId,
        max_attempts: u32,
        token_hash: String,
    ) -> ServiceResult<Reply> {
        let trial = self.running_trial(trial_id, "launch").await?;
        if trial.attempts >= max_attempts {
            return Ok(Reply::Attempt(None));
        }
        trial.attempts += 1;
        let number = trial.attempts;
        self.changed.insert(trial_id);
        self.tokens.push(self.trial_token(trial_id, token_hash));
        Ok(Reply::Attempt(Some(number)))
    }

    /// PBT: the trial's copy of its parent's checkpoint is made (the parent is free again).
    async fn checkpoint_copied(&mut self, trial_id: TrialId) -> ServiceResult<Reply> {
        let trial = self.trial_mut(trial_id).await?;
        let copied = trial
            .lineage
            .as_mut()
            .is_some_and(|l| l.copying_from.take().is_some());
        let reply = Reply::Trial(Box::new(trial.clone()));
        if copied {
            self.changed.insert(trial_id);
        }
        Ok(reply)
    }

    /// A token of its own for a pulled trial, asked for by the client that holds it.
    async fn issue_token(
        &mut self,
        trial_id: TrialId,
        client_id: &str,
        token_hash: String,
    ) -> ServiceResult<Reply> {
        let trial = self.running_trial(trial_id, "issue a token for").await?;
        // A dispatched trial (no lease: its dispatcher watches it) reports with the
        // dispatcher's token for its launch; another would revoke that one.
        if trial.lease_expires_at.is_none() {
            return Err(ServiceError::PermissionDenied {
                message: format!(
                    "trial {trial_id} is run by the server's dispatcher, which gives \
                     each launch its token"
                ),
                field: Some("client_id".into()),
            });
        }
        if trial.client_id.as_deref() != Some(client_id) {
            return Err(ServiceError::PermissionDenied {
                message: format!(
                    "trial {trial_id} is not held by client {client_id:?}: ask for a \
                     token for a trial that suggest handed to this client"
                ),
                field: Some("client_id".into()),
            });
        }
        self.tokens.push(self.trial_token(trial_id, token_hash));
        Ok(Reply::Issued)
    }

    /// Active trials whose lease ran out go back to `requested`, same parameters, so that
    /// another worker takes them.
    ///
    /// A pool study's trial (`executor: pool`) counts each lease that ran out as a lost
    /// launch (`attempts`): once more were lost than `max_retries` allows, it fails instead
    /// of going back, so a trial that kills its workers is not passed around for ever. The
    /// next worker's launches continue the count (the leased trial's `attempts`).
    fn expire_leases(&mut self) {
        let pool_retries = self
            .config
            .trial_job
            .as_ref()
            .filter(|job| job.executor.pool().is_some())
            .map(|job| job.max_retries);
        for trial in self.trials.values_mut() {
            let expired = trial.lease_expires_at.is_some_and(|at| at <= self.now);
            if trial.state.is_unfinished() && trial.state != TrialState::Requested && expired {
                trial.lease_expires_at = None;
                self.changed.insert(trial.id);
                if let Some(max_retries) = pool_retries {
                    trial.attempts += 1;
                    if trial.attempts > max_retries {
                        trial.state = TrialState::Failed;
                        trial.fail_reason = Some(format!(
                            "its pool worker was lost (no heartbeat for trial_lease_secs) {} \
                             time(s), more than max_retries ({max_retries}) allows",
                            trial.attempts
                        ));
                        trial.completed_at = Some(self.now);
                        self.failed_in_batch += 1;
                        continue;
                    }
                }
                trial.state = TrialState::Requested;
                trial.client_id = None;
                trial.started_at = None;
            }
        }
    }

    fn lease(&self) -> Option<DateTime<Utc>> {
        Some(self.now + Duration::seconds(self.config.trial_lease_secs))
    }

    fn unfinished_count(&self) -> u64 {
        self.trials
            .values()
            .filter(|t| t.state.is_unfinished())
            .count() as u64
    }

    /// Trials created so far, from the per-study counter.
    fn created_count(&self) -> u64 {
        (self.study.next_trial_id.get() - 1).max(0) as u64
    }

    fn budget_left(&self) -> u64 {
        if self.closed {
            return 0;
        }
        self.config
            .trial_budget()
            .saturating_sub(self.created_count())
    }

    /// The parallelism cap: how many more trials may be unfinished right now.
    fn free_slots(&self) -> u64 {
        self.config.free_slots(self.unfinished_count())
    }

    async fn suggest(
        &mut self,
        count: usize,
        client_id: Option<String>,
        precomputed: Option<Precomputed>,
        dispatched: bool,
    ) -> ServiceResult<Reply> {
        // Study-level stopping is asked before any new trial (as Vertex asks it before each
        // suggestion): it may end the study here.
        if self.config.study_stopping.is_some() {
            self.settle_study_state().await?;
        }
        if self.study.state != StudyState::Active {
            return Ok(self.suggested(Vec::new(), 0, false));
        }
        // A worker that asks again gets back the trials it already holds.
        if let Some(client) = client_id.as_deref().filter(|_| !dispatched) {
            let held = self.held_by(client);
            if !held.is_empty() {
                return Ok(self.suggested(held, 0, false));
            }
        }
        if precomputed.as_ref().is_some_and(|p| self.is_stale(p)) {
            return Ok(Reply::Stale);
        }
        let mut handed = Vec::new();
        // A scheduler's decisions on paused trials, each taken only if the trial is still
        // paused (another replica's may have taken it): stops first, then promotions into
        // free slots, before new trials.
        let (points, mut resumes, stops, mut exploits) = match precomputed {
            Some(p) => {
                self.closed = p.closed;
                (Some((p.points, p.budgets)), p.resumes, p.stops, p.exploits)
            }
            None => (None, Vec::new(), Vec::new(), Vec::new()),
        };
        // A study that study-level stopping ends once its running trials finish starts no
        // new trial and resumes no paused one; requested trials, already made, still run.
        let stopping = self.stopping_verdict.is_some();
        if stopping {
            resumes.clear();
            exploits.clear();
        }
        for trial_id in stops {
            self.stop_paused(trial_id).await?;
        }
        let lease = if dispatched { None } else { self.lease() };
        // PBT's copies first: they free their parents.
        for exploit in exploits {
            if handed.len() >= count || self.free_slots() == 0 {
                break;
            }
            if let Some(trial) = self.exploit_paused(exploit, &client_id, lease).await? {
                handed.push(trial);
            }
        }
        for (trial_id, budget) in resumes {
            if handed.len() >= count || self.free_slots() == 0 {
                break;
            }
            if let Some(trial) = self
                .resume_paused(trial_id, budget, &client_id, lease)
                .await?
            {
                handed.push(trial);
            }
        }
        // Requested trials (added by a user, or back from an expired lease) go first.
        self.start_requested(count, &client_id, lease, &mut handed);
        let resumed = handed.len();
        let new_count = if stopping {
            0
        } else {
            self.room_for_new(count.saturating_sub(handed.len()))
        };
        if new_count > 0 {
            // The policy's budgets; points chosen here start at the lowest rung.
            let (suggestions, budgets) = match points {
                Some(points) => points,
                None => (self.design(new_count), Vec::new()),
            };
            let first_rung = self.first_rung();
            for (i, parameters) in suggestions.into_iter().take(new_count).enumerate() {
                let budget = budgets.get(i).copied().unwrap_or(first_rung);
                let mut trial = self.new_trial(parameters, TrialState::Active, client_id.clone());
                trial.budget = budget;
                if let Some(t) = self.trials.get_mut(&trial.id) {
                    t.budget = budget;
                }
                if dispatched {
                    trial.lease_expires_at = None;
                    self.trials.insert(trial.id, trial.clone());
                }
                handed.push(trial);
            }
        }
        let retry_later = handed.is_empty();
        let created = handed.len() - resumed;
        Ok(self.suggested(handed, created, retry_later))
    }

    /// The trials `client` holds (a worker asking again gets them back), their leases renewed.
    fn held_by(&mut self, client: &str) -> Vec<TrialRecord> {
        let held: Vec<TrialRecord> = self
            .trials
            .values()
            .filter(|t| {
                t.client_id.as_deref() == Some(client)
                    && matches!(t.state, TrialState::Active | TrialState::Stopping)
            })
            .cloned()
            .collect();
        for t in &held {
            let lease = self.lease();
            if let Some(trial) = self.trials.get_mut(&t.id) {
                trial.lease_expires_at = lease;
            }
            self.changed.insert(t.id);
        }
        held
    }

    /// Points designed without a trial created since (by another replica, or added) would
    /// not see it as pending: two workers would get the same point. Points designed on the
    /// space before it grew would lack its new parameters. Asked before any change.
    fn is_stale(&self, precomputed: &Precomputed) -> bool {
        precomputed.next_trial_id != self.study.next_trial_id
            || precomputed
                .points
                .iter()
                .any(|a| self.config.space.check_assignment(a).is_err())
    }

    /// Start up to `count` requested trials for `client_id`, into `handed`.
    fn start_requested(
        &mut self,
        count: usize,
        client_id: &Option<String>,
        lease: Option<DateTime<Utc>>,
        handed: &mut Vec<TrialRecord>,
    ) {
        let waiting: Vec<TrialId> = self
            .trials
            .values()
            .filter(|t| t.state == TrialState::Requested)
            .map(|t| t.id)
            .take(count)
            .collect();
        for id in waiting {
            if let Some(trial) = self.trials.get_mut(&id) {
                trial.state = TrialState::Active;
                trial.client_id = client_id.clone();
                trial.started_at = Some(self.now);
                trial.lease_expires_at = lease;
                handed.push(trial.clone());
                self.changed.insert(id);
            }
        }
    }

    /// How many of `wanted` new trials may be made now: within the cap, the study's budget
    /// and what study-level stopping still allows.
    fn room_for_new(&self, wanted: usize) -> usize {
        let room = self
            .config
            .study_stopping
            .as_ref()
            .map_or(u64::MAX, |rule| rule.room(self.created_count()));
        (wanted as u64)
            .min(self.free_slots())
            .min(self.budget_left())
            .min(room) as usize
    }

    /// The budget a new trial starts at: the lowest rung under a scheduler; `None` (the full
    /// budget) otherwise.
    fn first_rung(&self) -> Option<f64> {
        self.config.rungs()?.first().copied()
    }

    /// A scheduler promoted a paused trial: it runs again, the same trial in the same
    /// directories, at `budget`, its launches counted afresh for this budget. `None` when it
    /// is no longer paused (taken meanwhile).
    async fn resume_paused(
        &mut self,
        trial_id: TrialId,
        budget: f64,
        client_id: &Option<String>,
        lease: Option<DateTime<Utc>>,
    ) -> ServiceResult<Option<TrialRecord>> {
        let now = self.now;
        let trial = self.trial_mut(trial_id).await?;
        if trial.state != TrialState::Paused {
            return Ok(None);
        }
        trial.state = TrialState::Active;
        trial.budget = Some(budget);
        trial.attempts = 0;
        trial.client_id = client_id.clone();
        trial.lease_expires_at = lease;
        trial.started_at = Some(now);
        let trial = trial.clone();
        self.changed.insert(trial_id);
        Ok(Some(trial))
    }

    /// PBT exploited a paused trial: its lineage gets a segment from the parent's checkpoint
    /// with the new values (its first values kept as the first segment), the copy is marked
    /// to be made before its next attempt, and it resumes at the next budget. `None` when it
    /// is no longer paused, or the values no longer fit the space (it stays paused).
    async fn exploit_paused(
        &mut self,
        exploit: Exploit,
        client_id: &Option<String>,
        lease: Option<DateTime<Utc>>,
    ) -> ServiceResult<Option<TrialRecord>> {
        if self
            .config
            .space
            .check_assignment(&exploit.parameters)
            .is_err()
        {
            return Ok(None);
        }
        let trial = self.trial_mut(exploit.trial_id).await?;
        if trial.state != TrialState::Paused {
            return Ok(None);
        }
        let mut lineage = trial.lineage.take().unwrap_or_default();
        if lineage.segments.is_empty() {
            lineage.segments.push(Segment {
                from_budget: 0.0,
                parent: None,
                parameters: trial.parameters.clone(),
            });
        }
        lineage.segments.push(Segment {
            from_budget: trial.budget.unwrap_or(0.0),
            parent: Some(exploit.parent_id),
            parameters: exploit.parameters.clone(),
        });
        lineage.copying_from = Some(exploit.parent_id);
        trial.lineage = Some(lineage);
        trial.parameters = exploit.parameters;
        self.resume_paused(exploit.trial_id, exploit.budget, client_id, lease)
            .await
    }

    /// A scheduler stopped a paused trial: it completes at its rung, with the measurement it
    /// paused with. It ranks no best (`objective` stays empty): only trials measured at the
    /// full budget do.
    async fn stop_paused(&mut self, trial_id: TrialId) -> ServiceResult<()> {
        let now = self.now;
        let trial = self.trial_mut(trial_id).await?;
        if trial.state != TrialState::Paused {
            return Ok(());
        }
        trial.state = TrialState::Completed;
        trial.early_stopped = true;
        trial.completed_at = Some(now);
        self.changed.insert(trial_id);
        Ok(())
    }

    /// A study that ends before its scheduler settled (stopped by a user, or failed) ends its
    /// paused trials at their rung, as a scheduler's stop would: no trial is left waiting.
    async fn end_paused(&mut self) -> ServiceResult<()> {
        if self.paused_count() == 0 {
            return Ok(());
        }
        for trial in self.tx.paused_trials().await? {
            if !self.trials.contains_key(&trial.id) {
                self.stored_states.insert(trial.id, trial.state);
                self.trials.insert(trial.id, trial);
            }
        }
        let paused: Vec<TrialId> = self
            .trials
            .values()
            .filter(|t| t.state == TrialState::Paused)
            .map(|t| t.id)
            .collect();
        for trial_id in paused {
            self.stop_paused(trial_id).await?;
        }
        Ok(())
    }

    /// Trials paused now: the stored count, with this batch's changes.
    fn paused_count(&self) -> u64 {
        let mut paused = self.study.trial_counts.paused as i64;
        for (id, trial) in &self.trials {
            let was = self.stored_states.get(id) == Some(&TrialState::Paused);
            let is = trial.state == TrialState::Paused;
            paused += i64::from(is) - i64::from(was);
        }
        paused.max(0) as u64
    }

    /// The step a scheduler's trial attempting `budget` reports its result at: the budget.
    fn rung_step(&self, budget: Option<f64>) -> Option<i64> {
        self.config.scheduler?;
        budget.map(|b| augur_optimizer::multi_fidelity::Fidelity::step(b) as i64)
    }

    /// Whether a trial whose attempt at `budget` ends now pauses at its rung: a scheduler's
    /// trial below the full budget.
    fn pauses_at(&self, budget: Option<f64>) -> bool {
        match (self.config.scheduler, &self.config.fidelity, budget) {
            (Some(_), Some(fidelity), Some(b)) => b < fidelity.ladder.max,
            _ => false,
        }
    }

    /// The dispatcher's trials just handed out: count each one's first launch, with its
    /// token. (A trial the dispatcher takes has never been launched: a requested trial was
    /// added by a user, and dispatched trials have no lease to lose.)
    fn count_first_launches(&mut self, reply: Reply, launch_tokens: Vec<String>) -> Reply {
        let Reply::Suggested(mut suggested) = reply else {
            return reply;
        };
        for (handed, token_hash) in suggested.trials.iter_mut().zip(launch_tokens) {
            if let Some(trial) = self.trials.get_mut(&handed.id) {
                trial.attempts += 1;
                handed.attempts = trial.attempts;
                self.changed.insert(handed.id);
                self.tokens.push(self.trial_token(handed.id, token_hash));
            }
        }
        Reply::Suggested(suggested)
    }

    fn trial_token(&self, trial_id: TrialId, hash: String) -> TrialToken {
        TrialToken {
            name: TrialToken::name(TrialKey::new(self.study.id, trial_id)),
            hash,
            trial_id,
        }
    }

    /// Run a designer that does not need the history, with the exact trial numbers.
    /// Points chosen inside the batch: by the study's designer when it needs no history, else
    /// quasi-random ones (a model-based designer's points come precomputed; without them its
    /// suggestion ran out of time). Numbered from the study's next trial, so never repeated.
    fn design(&self, count: usize) -> Vec<Assignment> {
        let mut policy = design::policy_for(&self.config);
        if policy.uses_history() {
            policy = Box::new(FullBudget::of(augur_optimizer::Algorithm::QuasiRandom));
        }
        let study = design::history_free(
            &self.config,
            design::optimizer_number(self.study.next_trial_id).max(1),
        );
        policy.decide(&study, count).new_points()
    }

    fn suggested(&self, trials: Vec<TrialRecord>, created: usize, retry_later: bool) -> Reply {
        let active = self.study.state == StudyState::Active;
        Reply::Suggested(Handed {
            trials,
            created,
            study_state: self.study.state,
            retry_later: retry_later && active,
        })
    }

    fn new_trial(
        &mut self,
        parameters: Assignment,
        state: TrialState,
        client_id: Option<String>,
    ) -> TrialRecord {
        let id = self.study.next_trial_id;
        self.study.next_trial_id = id.next();
        self.study_changed = true;
        let running = state == TrialState::Active;
        let trial = TrialRecord {
            study_id: self.study.id,
            id,
            state,
            parameters,
            client_id,
            final_measurement: None,
            objective: None,
            infeasible_reason: None,
            fail_reason: None,
            early_stopped: false,
            excluded: false,
            lease_expires_at: if running { self.lease() } else { None },
            created_at: self.now,
            started_at: running.then_some(self.now),
            completed_at: None,
            change_seq: 0,
            attempts: 0,
            budget: None,
            lineage: None,
        };
        self.trials.insert(id, trial.clone());
        self.created.insert(id);
        trial
    }

    fn add_trial(
        &mut self,
        parameters: Assignment,
        final_measurement: Option<Measurement>,
    ) -> ServiceResult<Reply> {
        if self.study.state != StudyState::Active {
            return Err(ServiceError::conflict(format!(
                "study {} is {}; trials can only be added to an active study",
                self.study.id,
                self.study.state.as_str()
            )));
        }
        if self.budget_left() == 0 {
            return Err(ServiceError::conflict(format!(
                "the study's budget of {} trials is spent; raise max_trials first",
                self.config.max_trials
            )));
        }
        match final_measurement {
            None => {
                if self.free_slots() == 0 {
                    return Err(ServiceError::conflict(format!(
                        "parallel_trials ({}) trials are already unfinished; complete one first",
                        self.config.parallel_trials
                    )));
                }
                let trial = self.new_trial(parameters, TrialState::Requested, None);
                Ok(Reply::Trial(Box::new(trial)))
            }
            Some(measurement) => {
                let mut trial = self.new_trial(parameters, TrialState::Completed, None);
                trial.objective = self.objective(&measurement.metrics);
                trial.final_measurement = Some(measurement);
                trial.completed_at = Some(self.now);
                self.trials.insert(trial.id, trial.clone());
                Ok(Reply::Trial(Box::new(trial)))
            }
        }
    }

    /// The value the store ranks trials by (its `objective` column): the study's first
    /// objective metric (safety metrics constrain, they are no objective).
    fn objective(&self, metrics: &BTreeMap<String, f64>) -> Option<f64> {
        self.config
            .first_objective()
            .and_then(|m| metrics.get(&m.id))
            .copied()
    }

    /// The trial, loading it if this batch has not yet.
    async fn trial_mut(&mut self, trial_id: TrialId) -> ServiceResult<&mut TrialRecord> {
        if !self.trials.contains_key(&trial_id)
            && let Some(trial) = self.tx.trials_by_id(&[trial_id]).await?.pop()
        {
            self.stored_states.insert(trial_id, trial.state);
            self.trials.insert(trial_id, trial);
        }
        self.trials.get_mut(&trial_id).ok_or_else(|| {
            ServiceError::NotFound(format!("trial {trial_id} of study {}", self.study.id))
        })
    }

    /// A trial that a worker is running (active or stopping).
    async fn running_trial(
        &mut self,
        trial_id: TrialId,
        action: &str,
    ) -> ServiceResult<&mut TrialRecord> {
        let trial = self.trial_mut(trial_id).await?;
        if !matches!(trial.state, TrialState::Active | TrialState::Stopping) {
            return Err(ServiceError::conflict(format!(
                "cannot {action} trial {trial_id}: it is {}",
                trial.state.as_str()
            )));
        }
        Ok(trial)
    }

    fn touched(&mut self, trial_id: TrialId) -> Reply {
        self.changed.insert(trial_id);
        match self.trials.get(&trial_id) {
            Some(t) => Reply::Trial(Box::new(t.clone())),
            None => Reply::Study(Box::new(self.study.clone())),
        }
    }

    async fn add_measurement(
        &mut self,
        trial_id: TrialId,
        measurement: Measurement,
    ) -> ServiceResult<Reply> {
        let lease = self.lease();
        let rungs = self.config.rungs();
        let trial = self.running_trial(trial_id, "add a measurement to").await?;
        // An in-process trainer (a pulled trial that cannot stop and resume) trains on past
        // its budget: it climbs to the highest rung its steps reach, where `should_stop`
        // ranks it (ASHA's stopping variant) and where a completion counts.
        if let (Some(rungs), Some(budget), Some(_)) = (rungs, trial.budget, trial.lease_expires_at)
            && measurement.step as f64 > budget
            && let Some(reached) = rungs
                .iter()
                .rev()
                .find(|r| Fidelity::step(**r) as i64 <= measurement.step)
            && *reached > budget
        {
            trial.budget = Some(*reached);
        }
        renew(trial, lease);
        self.record_measurement(trial_id, measurement);
        Ok(self.touched(trial_id))
    }

    /// Replaces one at the same step (a job may report a step again).
    fn record_measurement(&mut self, trial_id: TrialId, measurement: Measurement) {
        self.measurements
            .retain(|(t, m)| !(*t == trial_id && m.step == measurement.step));
        self.measurements.push((trial_id, measurement));
    }

    async fn complete(&mut self, trial_id: TrialId, outcome: Completion) -> ServiceResult<Reply> {
        let trial = self.trial_mut(trial_id).await?;
        if !trial.state.is_unfinished() {
            return Err(ServiceError::conflict(format!(
                "trial {trial_id} is already {}",
                trial.state.as_str()
            )));
        }
        let early_stopped = trial.state == TrialState::Stopping;
        let budget = trial.budget;
        // A scheduler's trial below the full budget pauses at its rung instead; its result is
        // kept as a measurement at the rung's step, for the scheduler to rank.
        let rung_step = self.rung_step(budget);
        // A trial told to stop ends where it is.
        let done = if !early_stopped && self.pauses_at(budget) {
            TrialState::Paused
        } else {
            TrialState::Completed
        };
        let (state, final_measurement, infeasible_reason) = match outcome {
            Completion::Infeasible(reason) => (TrialState::Infeasible, None, Some(reason)),
            Completion::Metrics { metrics, step } => {
                let step = step.map(Step::get).or(rung_step).unwrap_or(0);
                let measurement = Measurement {
                    step,
                    elapsed_secs: None,
                    metrics,
                };
                if rung_step.is_some() {
                    self.record_measurement(trial_id, measurement.clone());
                }
                (done, Some(measurement), None)
            }
            Completion::Selected(last) => {
                for measurement in last {
                    self.record_measurement(trial_id, measurement);
                }
                let selected = self.select_measurement(trial_id).await?;
                (done, Some(selected), None)
            }
        };
        // Only a trial measured at the full budget ranks as best.
        let objective = final_measurement
            .as_ref()
            .filter(|_| state == TrialState::Completed)
            .and_then(|m| self.objective(&m.metrics));
        let now = self.now;
        let trial = self.trial_mut(trial_id).await?;
        trial.state = state;
        trial.final_measurement = final_measurement;
        trial.objective = objective;
        trial.infeasible_reason = infeasible_reason;
        trial.early_stopped = early_stopped;
        trial.completed_at = (state != TrialState::Paused).then_some(now);
        trial.lease_expires_at = None;
        // PBT: an attempt that ended made its copy, or went on without one (an ask/tell
        // client that never said so): either way the parent must not wait for it forever.
        if let Some(lineage) = trial.lineage.as_mut() {
            lineage.copying_from = None;
        }
        Ok(self.touched(trial_id))
    }

    /// The final measurement of a trial completed without metrics: its last, or its best by
    /// the first metric, among those that report every metric of the study.
    async fn select_measurement(&mut self, trial_id: TrialId) -> ServiceResult<Measurement> {
        let mut all: BTreeMap<i64, Measurement> = self
            .tx
            .measurements(trial_id)
            .await?
            .into_iter()
            .map(|m| (m.step, m))
            .collect();
        for (t, m) in &self.measurements {
            if *t == trial_id {
                all.insert(m.step, m.clone());
            }
        }
        let complete = all.into_values().filter(|m| {
            self.config
                .metrics
                .iter()
                .all(|spec| m.metrics.contains_key(&spec.id))
        });
        let first = &self.config.metrics[0];
        let chosen = match self.config.measurement_selection {
            MeasurementSelection::Last => complete.max_by_key(|m| m.step),
            MeasurementSelection::Best => {
                let better = |m: &Measurement| {
                    let v = m.metrics.get(&first.id).copied().unwrap_or(f64::NAN);
                    match first.goal {
                        augur_optimizer::Goal::Maximize => v,
                        augur_optimizer::Goal::Minimize => -v,
                    }
                };
                complete.max_by(|a, b| better(a).total_cmp(&better(b)))
            }
        };
        chosen.ok_or_else(|| {
            ServiceError::invalid(
                "metrics",
                format!(
                    "trial {trial_id} has no measurement with every metric of the study to select; \
                     send metrics or infeasible_reason"
                ),
            )
        })
    }

    async fn fail(&mut self, trial_id: TrialId, reason: String) -> ServiceResult<Reply> {
        let now = self.now;
        let trial = self.trial_mut(trial_id).await?;
        if !trial.state.is_unfinished() {
            return Err(ServiceError::conflict(format!(
                "trial {trial_id} is already {}",
                trial.state.as_str()
            )));
        }
        trial.state = TrialState::Failed;
        trial.fail_reason = Some(reason);
        trial.completed_at = Some(now);
        trial.lease_expires_at = None;
        self.failed_in_batch += 1;
        Ok(self.touched(trial_id))
    }

    /// `fail_fast_trials`: when this batch brings the study's failures to N, its first N
    /// trials all failed with the same reason, and none of its trials has completed, why the
    /// study fails (`None`: it goes on). Only as the failures reach N: a study reopened
    /// after it (a PATCH) is not failed again by the same trials.
    async fn first_trials_failed_alike(&mut self) -> ServiceResult<Option<String>> {
        let n = self.config.fail_fast_trials;
        let counts = &self.study.trial_counts;
        if n == 0
            || (self.study.next_trial_id.get() as u64) <= n
            || counts.completed + counts.infeasible > 0
        {
            return Ok(None);
        }
        let failed = self.failed_count().await?;
        if failed < n || failed - self.failed_in_batch >= n {
            return Ok(None);
        }
        let first: Vec<TrialId> = (1..=n as i64).map(TrialId::new).collect();
        let stored = self.tx.trials_by_id(&first).await?;
        // This batch's changes first: a trial it failed is not written yet.
        let reasons: Vec<Option<String>> = first
            .iter()
            .map(|id| {
                let trial = self
                    .trials
                    .get(id)
                    .or_else(|| stored.iter().find(|t| t.id == *id))?;
                (trial.state == TrialState::Failed)
                    .then(|| trial.fail_reason.clone().unwrap_or_default())
            })
            .collect();
        let Some(Some(reason)) = reasons.first() else {
            return Ok(None);
        };
        if reasons.iter().any(|r| r.as_ref() != Some(reason)) {
            return Ok(None);
        }
        Ok(Some(format!(
            "the first {n} trials all failed, none completed: {reason} (fail_fast_trials: {n}; \
             fix what runs the trials, then resume the study: augur study resume ID)"
        )))
    }

    async fn failed_count(&mut self) -> ServiceResult<u64> {
        let stored = match self.stored_failed {
            Some(n) => n,
            None => {
                let n = self.tx.count_failed().await?;
                self.stored_failed = Some(n);
                n
            }
        };
        Ok((stored + self.failed_in_batch).saturating_sub(self.retried_in_batch))
    }

    /// A failed trial back to `requested` (same parameters, same directories, its
    /// launches counted afresh), for the next suggestion or the dispatcher. The study must
    /// be running, or completed (it goes on for this trial); a failed study is resumed
    /// first, explicitly. The trial takes a slot under `parallel_trials`.
    async fn retry(&mut self, trial_id: TrialId) -> ServiceResult<Reply> {
        let id = self.study.id;
        match self.study.state {
            StudyState::Active | StudyState::Completed => {}
            StudyState::Failed => {
                return Err(ServiceError::conflict(format!(
                    "study {id} failed: resume it first (augur study resume {id})"
                )));
            }
            StudyState::Stopped => {
                return Err(ServiceError::conflict(format!(
                    "study {id} was stopped: its trials do not run again"
                )));
            }
        }
        let state = self.trial_mut(trial_id).await?.state;
        if state != TrialState::Failed {
            return Err(ServiceError::conflict(format!(
                "trial {trial_id} is {}: only a failed trial is retried",
                state.as_str()
            )));
        }
        if self.free_slots() == 0 {
            return Err(ServiceError::conflict(format!(
                "study {id} runs parallel_trials ({}) trials already: retry once one ends",
                self.config.parallel_trials
            )));
        }
        let trial = self.trial_mut(trial_id).await?;
        trial.state = TrialState::Requested;
        trial.fail_reason = None;
        trial.started_at = None;
        trial.completed_at = None;
        trial.client_id = None;
        trial.lease_expires_at = None;
        trial.attempts = 0;
        self.retried_in_batch += 1;
        if self.study.state == StudyState::Completed {
            self.set_study_state(StudyState::Active, None);
        }
        Ok(self.touched(trial_id))
    }

    async fn update(&mut self, update: StudyUpdate) -> ServiceResult<Reply> {
        if self.study.state == StudyState::Stopped {
            return Err(ServiceError::conflict(format!(
                "study {} was stopped",
                self.study.id
            )));
        }
        let (spec, config) = self.study.spec.apply_update(&update)?;
        self.study.spec = spec;
        self.config = config;
        self.study_changed = true;
        // A study that ended on its budget goes on when it is raised. A failed one stays
        // failed: it runs again only when asked to (`resume`), not as a PATCH's side effect.
        let failed = self.failed_count().await?;
        let failures_ok = self.config.max_failed_trials.is_none_or(|max| failed < max);
        if self.study.state == StudyState::Completed && self.budget_left() > 0 && failures_ok {
            self.set_study_state(StudyState::Active, None);
        }
        Ok(Reply::Study(Box::new(self.study.clone())))
    }

    /// Grow the search space, and fill in the new parameter in the trials named: all of it,
    /// or (on any refusal) none. A stopped study's space is left as it is, and so is a
    /// grid's, whose points are numbered over the space.
    async fn add_parameter(&mut self, extension: ParameterExtension) -> ServiceResult<Reply> {
        let id = self.study.id;
        if self.study.state == StudyState::Stopped {
            return Err(ServiceError::conflict(format!(
                "study {id} was stopped: its search space no longer changes"
            )));
        }
        if self.config.algorithm == augur_optimizer::Algorithm::Grid {
            return Err(ServiceError::conflict(format!(
                "study {id} searches a grid, whose points are numbered over a fixed search \
                 space: create a new study for a larger space"
            )));
        }
        let extended = self.study.spec.extend_space(&extension)?;
        let config = match &extended {
            Some((_, config)) => config.clone(),
            None => self.config.clone(),
        };
        let parameter = &extension.parameter.id;
        let mut values = Vec::with_capacity(extension.trials.len());
        for (i, given) in extension.trials.iter().enumerate() {
            let field = format!("trials[{i}]");
            let trial = match self.trial_mut(given.id).await {
                Ok(trial) => trial,
                Err(ServiceError::NotFound(what)) => {
                    return Err(ServiceError::invalid(
                        format!("{field}.id"),
                        format!("no {what}"),
                    ));
                }
                Err(other) => return Err(other),
            };
            if !trial.state.is_unfinished() {
                return Err(ServiceError::Conflict {
                    message: format!(
                        "trial {} is {}: only an unfinished trial takes a value of a new \
                         parameter",
                        given.id,
                        trial.state.as_str()
                    ),
                    field: Some(format!("{field}.id")),
                });
            }
            if let Some(value) =
                trial_value(&config, parameter, &trial.parameters, &given.value, &field)?
            {
                values.push((given.id, value));
            }
        }
        if let Some((spec, config)) = extended {
            self.study.spec = spec;
            self.config = config;
            self.study_changed = true;
        }
        for (trial_id, value) in values {
            let trial = self.trial_mut(trial_id).await?;
            trial.parameters.insert(parameter.clone(), value);
            self.changed.insert(trial_id);
        }
        Ok(Reply::Study(Box::new(self.study.clone())))
    }

    /// Run a failed study again: refused while its failures are at `max_failed_trials` or
    /// its budget is spent (raise them first), and for a study a user stopped. An active
    /// study is left as it is.
    async fn resume(&mut self) -> ServiceResult<Reply> {
        let id = self.study.id;
        match self.study.state {
            StudyState::Active => {}
            StudyState::Failed => {
                let failed = self.failed_count().await?;
                if let Some(max) = self.config.max_failed_trials
                    && failed >= max
                {
                    return Err(ServiceError::conflict(format!(
                        "study {id} has {failed} failed trials and max_failed_trials is {max}: \
                         raise it first (PATCH)"
                    )));
                }
                if self.budget_left() == 0 {
                    return Err(ServiceError::conflict(format!(
                        "study {id} has no trials left to run: raise max_trials first (PATCH)"
                    )));
                }
                self.set_study_state(StudyState::Active, None);
            }
            StudyState::Completed => {
                return Err(ServiceError::conflict(format!(
                    "study {id} completed: raise max_trials (PATCH) to run more trials"
                )));
            }
            StudyState::Stopped => {
                return Err(ServiceError::conflict(format!(
                    "study {id} was stopped by a user and does not run again: create it again"
                )));
            }
        }
        Ok(Reply::Study(Box::new(self.study.clone())))
    }

    fn set_study_state(&mut self, state: StudyState, reason: Option<String>) {
        self.study.state = state;
        self.study.state_reason = reason;
        self.study_changed = true;
    }

    /// After each command: an active study fails on too many failed trials, and completes
    /// when its budget is spent and nothing is left running.
    async fn settle_study_state(&mut self) -> ServiceResult<()> {
        if self.study.state != StudyState::Active {
            return Ok(());
        }
        if let (Some(max), true) = (self.config.max_failed_trials, self.failed_in_batch > 0) {
            let failed = self.failed_count().await?;
            if failed >= max {
                self.set_study_state(
                    StudyState::Failed,
                    Some(format!("{failed} trials failed (max_failed_trials: {max})")),
                );
                return self.end_paused().await;
            }
        }
        if self.failed_in_batch > 0
            && let Some(reason) = self.first_trials_failed_alike().await?
        {
            self.set_study_state(StudyState::Failed, Some(reason));
            return self.end_paused().await;
        }
        if let Some(verdict) = self.study_stopping_verdict().await? {
            // Paused trials would need a new run: they end here. With `should_stop_asap` the
            // study ends now (its dispatcher stops its jobs; pulled trials are told to stop
            // by `should_stop`); otherwise once its running trials have finished.
            self.end_paused().await?;
            let asap = verdict.may_interrupt
                && self
                    .config
                    .study_stopping
                    .as_ref()
                    .is_some_and(|s| s.should_stop_asap);
            if asap {
                let running: Vec<TrialId> = self
                    .trials
                    .values()
                    .filter(|t| t.state == TrialState::Active)
                    .map(|t| t.id)
                    .collect();
                for id in running {
                    if let Some(trial) = self.trials.get_mut(&id) {
                        trial.state = TrialState::Stopping;
                        self.changed.insert(id);
                    }
                }
            }
            let running = self
                .trials
                .values()
                .any(|t| matches!(t.state, TrialState::Active | TrialState::Stopping));
            if asap || !running {
                self.set_study_state(StudyState::Completed, Some(verdict.reason));
            }
            return Ok(());
        }
        if self.budget_left() == 0 && self.unfinished_count() == 0 && self.paused_count() == 0 {
            self.set_study_state(StudyState::Completed, None);
        }
        Ok(())
    }

    /// Study-level stopping's verdict (`model::study_stopping`), asked again only when it
    /// may have changed: the stored completed trials with this batch's over them.
    async fn study_stopping_verdict(&mut self) -> ServiceResult<Option<StopVerdict>> {
        let Some(rule) = self.config.study_stopping.clone() else {
            return Ok(None);
        };
        if !std::mem::take(&mut self.stopping_due) {
            return Ok(self.stopping_verdict.clone());
        }
        let mut completed: BTreeMap<TrialId, FinishedTrial> = self
            .tx
            .completed_objectives()
            .await?
            .into_iter()
            .map(|(id, objective, completed_at)| {
                (
                    id,
                    FinishedTrial {
                        objective,
                        completed_at,
                    },
                )
            })
            .collect();
        // This batch's trials are not written yet: theirs is the current word.
        for (id, trial) in &self.trials {
            completed.remove(id);
            if let (TrialState::Completed, false, Some(objective), Some(completed_at)) = (
                trial.state,
                trial.excluded,
                trial.objective,
                trial.completed_at,
            ) {
                completed.insert(
                    *id,
                    FinishedTrial {
                        objective,
                        completed_at,
                    },
                );
            }
        }
        let mut ordered: Vec<(TrialId, FinishedTrial)> = completed.into_iter().collect();
        ordered.sort_by_key(|(id, t)| (t.completed_at, *id));
        let ordered: Vec<FinishedTrial> = ordered.into_iter().map(|(_, t)| t).collect();
        self.stopping_verdict = rule.verdict(self.created_count(), &ordered, self.now);
        Ok(self.stopping_verdict.clone())
    }

    /// Refuse the commands of a dispatcher that no longer holds the study's runner lease (one
    /// taken over by another, or lapsed: then another may take it at any moment). Read in the
    /// study's transaction, whose row lock orders it with the new owner's commands.
    async fn check_runner(&mut self, owner: &str) -> ServiceResult<()> {
        if self.runner_checked.as_deref() == Some(owner) {
            return Ok(());
        }
        let lease = self.tx.runner_lease().await?;
        match lease {
            Some((holder, expires_at)) if holder == owner && expires_at > self.now => {
                self.runner_checked = Some(holder);
                Ok(())
            }
            _ => Err(ServiceError::Conflict {
                message: format!(
                    "study {}'s runner lease is no longer held by {owner}: another dispatcher \
                     may be running its trials",
                    self.study.id
                ),
                field: Some("runner".into()),
            }),
        }
    }

    /// Sends the batch's writes; the trials whose tokens changed, the batch's news for
    /// webhooks, and the transaction.
    async fn write(
        mut self,
        listened: bool,
    ) -> ServiceResult<(Vec<TrialId>, Option<StudyNews>, Box<dyn StudyTx>)> {
        let touched_trials = !self.created.is_empty() || !self.changed.is_empty();
        if touched_trials || self.study_changed {
            self.study.change_seq += 1;
            self.study_changed = true;
            let seq = self.study.change_seq;
            for id in self.created.iter().chain(self.changed.iter()) {
                if let Some(t) = self.trials.get_mut(id) {
                    t.change_seq = seq;
                }
            }
        }
        let created: Vec<TrialRecord> = self
            .created
            .iter()
            .filter_map(|id| self.trials.get(id).cloned())
            .collect();
        let changed: Vec<TrialRecord> = self
            .changed
            .iter()
            .filter(|id| !self.created.contains(id))
            .filter_map(|id| self.trials.get(id).cloned())
            .collect();
        // Without anyone to tell, no news is gathered (it clones the finished trials).
        let news = if listened {
            self.news(&created, &changed)
        } else {
            None
        };
        for trial in &created {
            self.study.trial_counts.moved(None, trial.state);
        }
        for trial in &changed {
            let stored = self.stored_states.get(&trial.id).copied();
            self.study.trial_counts.moved(stored, trial.state);
        }
        self.tx.insert_trials(&created).await?;
        self.tx.update_trials(&changed).await?;
        self.tx
            .upsert_measurements(&self.measurements, self.now)
            .await?;

        if self.study_changed {
            self.study.updated_at = self.now;
            self.tx.update_study(&self.study).await?;
        }
        // A trial that finished may not report any more: its token goes; so does the token
        // of a pulled trial whose lease ran out (back to `requested`, another worker's next).
        // (A launch counted in this batch of a trial that also finished in it gets none.)
        let finished: Vec<TrialId> = changed
            .iter()
            .filter(|t| !t.state.is_unfinished() || t.state == TrialState::Requested)
            .map(|t| t.id)
            .collect();
        self.tx.revoke_trial_tokens(&finished).await?;
        self.tokens.retain(|t| !finished.contains(&t.trial_id));
        // After the trials: a token belongs to one.
        self.tx.replace_trial_tokens(&self.tokens, self.now).await?;
        let mut tokens_changed = finished;
        tokens_changed.extend(self.tokens.iter().map(|t| t.trial_id));
        Ok((tokens_changed, news, self.tx))
    }

    /// What of this batch webhooks may hear of: trials that failed or completed with an
    /// objective's value in it, and the study's completing or failing. `None`: nothing.
    fn news(&self, created: &[TrialRecord], changed: &[TrialRecord]) -> Option<StudyNews> {
        let mut happened = Vec::new();
        for trial in created.iter().chain(changed) {
            let was = self.stored_states.get(&trial.id).copied();
            if was == Some(trial.state) {
                continue;
            }
            match trial.state {
                TrialState::Failed => happened.push(Happened::TrialFailed(Box::new(trial.clone()))),
                TrialState::Completed if trial.objective.is_some() && !trial.excluded => {
                    happened.push(Happened::TrialCompleted(Box::new(trial.clone())))
                }
                _ => {}
            }
        }
        let ended = matches!(self.study.state, StudyState::Completed | StudyState::Failed);
        if ended && self.study.state != self.initial_state {
            happened.push(Happened::StudyEnded);
        }
        if happened.is_empty() {
            return None;
        }
        Some(StudyNews {
            study_id: self.study.id,
            study_name: self.study.name.clone(),
            state: self.study.state,
            state_reason: self.study.state_reason.clone(),
            targets: self.config.notifications.clone(),
            happened,
        })
    }
}

/// Renew a leased trial's lease; dispatched trials have none (their dispatcher watches them).
fn renew(trial: &mut TrialRecord, lease: Option<DateTime<Utc>>) {
    if trial.lease_expires_at.is_some() {
        trial.lease_expires_at = lease;
    }
}
