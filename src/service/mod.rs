//! Every operation on studies and trials. Reads go straight to the store; every change to a
//! study goes through its group-commit batcher (`group_commit.rs`) and the state machine
//! (`state_machine.rs`), which is where the trial states and the parallelism cap are enforced.

mod error;
mod group_commit;
mod pareto;
mod state_machine;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use augur_optimizer::{Assignment, CompletedTrial, DesignerInput, Goal, Outcome, designer_for};
use chrono::Utc;

pub use error::{ServiceError, ServiceResult};
pub use state_machine::Completion;

use group_commit::GroupCommit;
use state_machine::{Command, Reply};

use crate::model::{
    Measurement, Study, StudySpec, StudyState, StudyUpdate, Trial, TrialState, ValidationError,
};
use crate::store::{Store, StudyRecord, TrialRecord};

/// Page sizes: the default, and the most one request may ask for.
pub const DEFAULT_PAGE_SIZE: i64 = 100;
pub const MAX_PAGE_SIZE: i64 = 1000;
/// Most trials one suggest call may ask for.
pub const MAX_SUGGEST_COUNT: usize = 1000;
/// What a worker is told to wait when the cap is full.
const RETRY_AFTER_SECS: u64 = 1;

/// A page of a list, with the token of the next page when there is one.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_page_token: Option<String>,
}

/// Trials changed since a cursor.
#[derive(Debug)]
pub struct Changes {
    pub trials: Vec<Trial>,
    pub cursor: String,
    pub has_more: bool,
}

#[derive(Debug)]
pub struct Suggestions {
    pub trials: Vec<Trial>,
    pub study_state: StudyState,
    pub retry_after_secs: Option<u64>,
}

/// The dispatcher's suggestions: records (it needs no view), each with its first launch
/// counted (`attempts`).
#[derive(Debug)]
pub struct DispatchedSuggestions {
    pub trials: Vec<TrialRecord>,
    pub study_state: StudyState,
}

#[derive(Clone)]
pub struct Service {
    store: Arc<dyn Store>,
    commits: GroupCommit,
    /// Model-based suggestions for one study are computed one at a time in this process, so
    /// that each sees the trials the previous one handed out as pending.
    design_locks: Arc<Mutex<HashMap<i64, Arc<tokio::sync::Mutex<()>>>>>,
    /// Ids of studies that were created, changed, stopped or deleted in this process: the
    /// dispatcher reacts at once instead of at its next poll.
    events: tokio::sync::broadcast::Sender<i64>,
    /// See `fixed_config`. Study ids are never reused, so entries never go stale.
    fixed_configs: Arc<Mutex<HashMap<i64, Arc<crate::model::StudyConfig>>>>,
}

impl Service {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            commits: GroupCommit::new(store.clone()),
            store,
            design_locks: Arc::default(),
            events: tokio::sync::broadcast::channel(1024).0,
            fixed_configs: Arc::default(),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Study ids as they are created, changed, stopped or deleted in this process.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<i64> {
        self.events.subscribe()
    }

    fn notify(&self, study_id: i64) {
        // No subscriber is fine: then nothing is dispatched in this process.
        let _ = self.events.send(study_id);
    }

    pub async fn create_study(&self, spec: StudySpec) -> ServiceResult<Study> {
        let spec = spec.with_seed(rand::random::<u32>() as u64);
        spec.validate()?;
        let record = self.store.insert_study(&spec, Utc::now()).await?;
        self.notify(record.id);
        self.study_view(record).await
    }

    pub async fn get_study(&self, study_id: i64) -> ServiceResult<Study> {
        let record = self.study_record(study_id).await?;
        self.study_view(record).await
    }

    pub async fn list_studies(
        &self,
        state: Option<StudyState>,
        name_contains: Option<&str>,
        page_size: Option<i64>,
        page_token: Option<&str>,
    ) -> ServiceResult<Page<Study>> {
        let (limit, after) = page_bounds(page_size, page_token)?;
        let records = self
            .store
            .list_studies(state, name_contains, after, limit + 1)
            .await?;
        let (records, next) = split_page(records, limit, |s| s.id);
        let mut items = Vec::with_capacity(records.len());
        for record in records {
            items.push(self.study_view(record).await?);
        }
        Ok(Page {
            items,
            next_page_token: next,
        })
    }

    pub async fn delete_study(&self, study_id: i64) -> ServiceResult<()> {
        if self.store.delete_study(study_id).await? {
            self.notify(study_id);
            Ok(())
        } else {
            Err(not_found_study(study_id))
        }
    }

    pub async fn stop_study(&self, study_id: i64) -> ServiceResult<Study> {
        self.change_study(study_id, Command::Stop).await
    }

    pub async fn update_study(&self, study_id: i64, update: StudyUpdate) -> ServiceResult<Study> {
        self.change_study(study_id, Command::Update(update)).await
    }

    async fn change_study(&self, study_id: i64, command: Command) -> ServiceResult<Study> {
        match self.commits.submit(study_id, command).await? {
            Reply::Study(record) => {
                self.notify(study_id);
                self.study_view(*record).await
            }
            other => Err(unexpected(other)),
        }
    }

    /// Hand out up to `count` trials, never exceeding `parallel_trials` unfinished nor
    /// `max_trials` in all (enforced in `state_machine.rs`).
    pub async fn suggest(
        &self,
        study_id: i64,
        count: usize,
        client_id: Option<String>,
    ) -> ServiceResult<Suggestions> {
        let (trials, study_state, retry_later) =
            self.suggest_as(study_id, count, client_id, None).await?;
        Ok(Suggestions {
            trials: self.trial_views(study_id, trials).await?,
            study_state,
            retry_after_secs: retry_later.then_some(RETRY_AFTER_SECS),
        })
    }

    /// Suggestions for the study's own dispatcher (see `Command::Suggest::dispatched`), the
    /// first launch of each counted with the token whose hash is at its position in
    /// `launch_tokens` (one per trial wanted).
    pub async fn suggest_dispatched(
        &self,
        study_id: i64,
        client_id: &str,
        launch_tokens: Vec<String>,
    ) -> ServiceResult<DispatchedSuggestions> {
        let count = launch_tokens.len();
        let (trials, study_state, _) = self
            .suggest_as(
                study_id,
                count,
                Some(client_id.to_string()),
                Some(launch_tokens),
            )
            .await?;
        Ok(DispatchedSuggestions {
            trials,
            study_state,
        })
    }

    /// `launch_tokens`: `Some` for the dispatcher. The trials handed out, the study's state,
    /// and whether to ask again later.
    async fn suggest_as(
        &self,
        study_id: i64,
        count: usize,
        client_id: Option<String>,
        launch_tokens: Option<Vec<String>>,
    ) -> ServiceResult<(Vec<TrialRecord>, StudyState, bool)> {
        let dispatched = launch_tokens.is_some();
        let launch_tokens = launch_tokens.unwrap_or_default();
        if !(1..=MAX_SUGGEST_COUNT).contains(&count) {
            return Err(ServiceError::invalid(
                "count",
                format!("must be between 1 and {MAX_SUGGEST_COUNT}"),
            ));
        }
        if let Some(client) = &client_id
            && (client.is_empty() || client.len() > 256)
        {
            return Err(ServiceError::invalid(
                "client_id",
                "must be 1-256 characters",
            ));
        }
        let fixed = self.fixed_config(study_id).await?;
        let reply = if designer_for(fixed.algorithm).uses_history() {
            // Model-based designers read a snapshot and think outside the study's lock.
            let lock = self.design_lock(study_id)?;
            let _one_at_a_time = lock.lock().await;
            let study = self.study_record(study_id).await?;
            let mut precomputed = None;
            if study.state == StudyState::Active {
                let config = study.spec.validate().map_err(corrupt_spec(study_id))?;
                let trials = self.store.all_trials(study_id).await?;
                let resume_client = client_id.as_deref().filter(|_| !dispatched);
                let wanted = suggestions_needed(&trials, &config, count, resume_client);
                if wanted > 0 {
                    let budget = config.suggestion_time_budget;
                    precomputed = Some(
                        match tokio::time::timeout(
                            budget,
                            self.run_designer(&study, &config, &trials, wanted),
                        )
                        .await
                        {
                            Ok(points) => points?,
                            // The model took too long: answer on time with quasi-random points
                            // (the fit goes on in the background and is discarded).
                            Err(_) => {
                                metrics::counter!("augur_suggestion_budget_exceeded_total")
                                    .increment(1);
                                tracing::warn!(
                                    study_id,
                                    ?budget,
                                    "suggestion time budget exceeded; using quasi-random points"
                                );
                                fallback_points(&study, &config, wanted)
                            }
                        },
                    );
                }
            }
            self.commits
                .submit(
                    study_id,
                    Command::Suggest {
                        count,
                        client_id,
                        precomputed,
                        dispatched,
                        launch_tokens,
                    },
                )
                .await?
        } else {
            self.commits
                .submit(
                    study_id,
                    Command::Suggest {
                        count,
                        client_id,
                        precomputed: None,
                        dispatched,
                        launch_tokens,
                    },
                )
                .await?
        };
        let Reply::Suggested {
            trials,
            study_state,
            retry_later,
        } = reply
        else {
            return Err(unexpected(reply));
        };
        Ok((trials, study_state, retry_later))
    }

    /// The study's validated config, read once per process: only its parts that never
    /// change after creation (algorithm, metrics, search space) may be used from it, since
    /// `max_trials`, `parallel_trials` and `max_failed_trials` can be changed by any replica.
    /// Saves a read and a validation on every suggest, measurement and completion.
    async fn fixed_config(&self, study_id: i64) -> ServiceResult<Arc<crate::model::StudyConfig>> {
        if let Some(config) = self
            .fixed_configs
            .lock()
            .ok()
            .and_then(|c| c.get(&study_id).cloned())
        {
            return Ok(config);
        }
        let study = self.study_record(study_id).await?;
        let config = Arc::new(study.spec.validate().map_err(corrupt_spec(study_id))?);
        if let Ok(mut cache) = self.fixed_configs.lock() {
            cache.insert(study_id, config.clone());
        }
        Ok(config)
    }

    fn design_lock(&self, study_id: i64) -> ServiceResult<Arc<tokio::sync::Mutex<()>>> {
        let mut locks = self
            .design_locks
            .lock()
            .map_err(|_| ServiceError::Internal("design lock registry poisoned".into()))?;
        Ok(locks.entry(study_id).or_default().clone())
    }

    async fn run_designer(
        &self,
        study: &StudyRecord,
        config: &crate::model::StudyConfig,
        trials: &[TrialRecord],
        count: usize,
    ) -> ServiceResult<Vec<Assignment>> {
        let completed: Vec<CompletedTrial> = trials
            .iter()
            .filter(|t| !t.excluded && !t.state.is_unfinished())
            .map(|t| CompletedTrial {
                parameters: t.parameters.clone(),
                outcome: outcome_of(t, config),
            })
            .collect();
        let pending: Vec<Assignment> = trials
            .iter()
            .filter(|t| t.state.is_unfinished())
            .map(|t| t.parameters.clone())
            .collect();
        let space = config.space.clone();
        let metrics = config.metrics.clone();
        let seed = config.seed;
        let first_trial_number = study.next_trial_id.max(1) as u64;
        let previous_state = study.designer_state.clone();
        let algorithm = config.algorithm;
        // The optimizer is CPU-bound: keep it off the async workers.
        let output = tokio::task::spawn_blocking(move || {
            let input = DesignerInput {
                space: &space,
                metrics: &metrics,
                completed: &completed,
                pending: &pending,
                count,
                first_trial_number,
                seed,
                previous_state: previous_state.as_ref(),
                prior_studies: &[],
                desired_min_safe_trials_fraction: None,
            };
            designer_for(algorithm).suggest(&input)
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("designer task: {e}")))?;
        if let Some(state) = &output.state {
            // A cache for warm starts: losing it costs time, never correctness.
            if let Err(error) = self.store.set_designer_state(study.id, state).await {
                tracing::warn!(study_id = study.id, %error, "could not keep designer state");
            }
        }
        Ok(output.suggestions)
    }

    pub async fn add_trial(
        &self,
        study_id: i64,
        parameters: Assignment,
        final_metrics: Option<BTreeMap<String, f64>>,
    ) -> ServiceResult<Trial> {
        let config = self.fixed_config(study_id).await?;
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
        self.change_trial(
            study_id,
            Command::AddTrial {
                parameters,
                final_measurement,
            },
        )
        .await
    }

    pub async fn list_trials(
        &self,
        study_id: i64,
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
        study_id: i64,
        cursor: Option<&str>,
        page_size: Option<i64>,
    ) -> ServiceResult<Changes> {
        let (limit, _) = page_bounds(page_size, None)?;
        let after = match cursor {
            None | Some("") => (0, 0),
            Some(c) => c
                .split_once('.')
                .and_then(|(s, i)| Some((s.parse::<i64>().ok()?, i.parse::<i64>().ok()?)))
                .filter(|(s, i)| *s >= 0 && *i >= 0)
                .ok_or_else(|| {
                    ServiceError::invalid("after", "not a cursor from a previous answer")
                })?,
        };
        self.study_record(study_id).await?;
        let records = self
            .store
            .changed_trials(study_id, after, limit + 1)
            .await?;
        let has_more = records.len() as i64 > limit;
        let records: Vec<TrialRecord> = records.into_iter().take(limit as usize).collect();
        let next = records.last().map_or(after, |t| (t.change_seq, t.id));
        Ok(Changes {
            trials: self.trial_views(study_id, records).await?,
            cursor: format_cursor(next),
            has_more,
        })
    }

    pub async fn get_trial(&self, study_id: i64, trial_id: i64) -> ServiceResult<Trial> {
        let record = self.trial_record(study_id, trial_id).await?;
        self.trial_view(study_id, record).await
    }

    pub async fn add_measurement(
        &self,
        study_id: i64,
        trial_id: i64,
        measurement: Measurement,
    ) -> ServiceResult<Trial> {
        let record = self
            .add_measurement_record(study_id, trial_id, measurement)
            .await?;
        self.trial_view(study_id, record).await
    }

    /// `add_measurement` answered with the record: for the study runner, which needs no
    /// view (a read of the trial's measurements).
    pub async fn add_measurement_record(
        &self,
        study_id: i64,
        trial_id: i64,
        measurement: Measurement,
    ) -> ServiceResult<TrialRecord> {
        let config = self.fixed_config(study_id).await?;
        check_measurement(&config, &measurement)?;
        self.change_trial_record(
            study_id,
            Command::AddMeasurement {
                trial_id,
                measurement,
            },
        )
        .await
    }

    pub async fn complete_trial(
        &self,
        study_id: i64,
        trial_id: i64,
        outcome: Completion,
    ) -> ServiceResult<Trial> {
        let record = self
            .complete_trial_record(study_id, trial_id, outcome)
            .await?;
        self.trial_view(study_id, record).await
    }

    /// `complete_trial` answered with the record (see `add_measurement_record`).
    pub async fn complete_trial_record(
        &self,
        study_id: i64,
        trial_id: i64,
        outcome: Completion,
    ) -> ServiceResult<TrialRecord> {
        self.check_completion(study_id, &outcome).await?;
        self.change_trial_record(study_id, Command::Complete { trial_id, outcome })
            .await
    }

    async fn check_completion(&self, study_id: i64, outcome: &Completion) -> ServiceResult<()> {
        let config = self.fixed_config(study_id).await?;
        match outcome {
            Completion::Selected(last) => {
                for measurement in last {
                    check_measurement(&config, measurement)?;
                }
            }
            Completion::Metrics { metrics, step } => {
                check_metrics(&config, metrics, "metrics", true)?;
                if step.is_some_and(|s| s < 0) {
                    return Err(ServiceError::invalid("step", "must be >= 0"));
                }
            }
            Completion::Infeasible(reason) if reason.trim().is_empty() => {
                return Err(ServiceError::invalid(
                    "infeasible_reason",
                    "must not be blank",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    pub async fn fail_trial(
        &self,
        study_id: i64,
        trial_id: i64,
        reason: String,
    ) -> ServiceResult<Trial> {
        let record = self.fail_trial_record(study_id, trial_id, reason).await?;
        self.trial_view(study_id, record).await
    }

    /// `fail_trial` answered with the record (see `add_measurement_record`).
    pub async fn fail_trial_record(
        &self,
        study_id: i64,
        trial_id: i64,
        reason: String,
    ) -> ServiceResult<TrialRecord> {
        self.change_trial_record(study_id, Command::Fail { trial_id, reason })
            .await
    }

    pub async fn heartbeat(&self, study_id: i64, trial_id: i64) -> ServiceResult<Trial> {
        self.change_trial(study_id, Command::Heartbeat { trial_id })
            .await
    }

    pub async fn set_excluded(
        &self,
        study_id: i64,
        trial_id: i64,
        excluded: bool,
    ) -> ServiceResult<Trial> {
        self.change_trial(study_id, Command::SetExcluded { trial_id, excluded })
            .await
    }

    /// Whether the study's early-stopping rule says this trial should stop; if so an active
    /// trial moves to `stopping`.
    pub async fn should_stop(&self, study_id: i64, trial_id: i64) -> ServiceResult<bool> {
        let study = self.study_record(study_id).await?;
        let config = study.spec.validate().map_err(corrupt_spec(study_id))?;
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
        // The latest completed trials stand for all of them: the rule's cost stays bounded
        // however large the study, as every running trial asks after every measurement.
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
        let own = curves_by_trial(
            self.store
                .measurements(study_id, trial_id, trial_id)
                .await?,
            &metric.id,
        )
        .remove(&trial_id)
        .unwrap_or_default();
        let stop = augur_optimizer::stopping::should_stop(rule, metric.goal, &own, &completed);
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

    /// The best trial, or the Pareto set of a multi-metric study.
    pub async fn optimal_trials(&self, study_id: i64) -> ServiceResult<Vec<Trial>> {
        let study = self.study_record(study_id).await?;
        let config = study.spec.validate().map_err(corrupt_spec(study_id))?;
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

    async fn change_trial(&self, study_id: i64, command: Command) -> ServiceResult<Trial> {
        let record = self.change_trial_record(study_id, command).await?;
        self.trial_view(study_id, record).await
    }

    async fn trial_view(&self, study_id: i64, record: TrialRecord) -> ServiceResult<Trial> {
        Ok(self.trial_views(study_id, vec![record]).await?.remove(0))
    }

    async fn change_trial_record(
        &self,
        study_id: i64,
        command: Command,
    ) -> ServiceResult<TrialRecord> {
        match self.commits.submit(study_id, command).await? {
            Reply::Trial(record) => Ok(*record),
            other => Err(unexpected(other)),
        }
    }

    /// Count a launch of a dispatched trial, up to `max_attempts`, and store the token it
    /// reports with. `None`: no launch left.
    pub async fn start_attempt(
        &self,
        study_id: i64,
        trial_id: i64,
        max_attempts: u32,
        token_hash: String,
    ) -> ServiceResult<Option<u32>> {
        let command = Command::StartAttempt {
            trial_id,
            max_attempts,
            token_hash,
        };
        match self.commits.submit(study_id, command).await? {
            Reply::Attempt(number) => Ok(number),
            other => Err(unexpected(other)),
        }
    }

    /// Give back a launch that the service ended itself (shutdown, or a leftover job killed
    /// after a restart).
    pub async fn refund_attempt(&self, study_id: i64, trial_id: i64) -> ServiceResult<()> {
        let command = Command::RefundAttempt { trial_id };
        self.commits.submit(study_id, command).await.map(drop)
    }

    async fn study_record(&self, study_id: i64) -> ServiceResult<StudyRecord> {
        self.store
            .get_study(study_id)
            .await?
            .ok_or_else(|| not_found_study(study_id))
    }

    async fn trial_record(&self, study_id: i64, trial_id: i64) -> ServiceResult<TrialRecord> {
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

    async fn study_view(&self, record: StudyRecord) -> ServiceResult<Study> {
        let counts = self.store.count_trials(record.id).await?;
        let best_trial = match record.spec.metrics.as_slice() {
            [only] => {
                let maximize = only.goal == crate::model::MetricGoal::Maximize;
                match self.store.best_trial(record.id, maximize).await? {
                    Some(t) => Some(self.trial_views(record.id, vec![t]).await?.remove(0)),
                    None => None,
                }
            }
            _ => None,
        };
        Ok(Study {
            id: record.id,
            name: record.name,
            state: record.state,
            state_reason: record.state_reason,
            spec: record.spec,
            trial_counts: counts,
            best_trial,
            created_at: record.created_at,
            updated_at: record.updated_at,
        })
    }

    /// Trials as the API shows them, with their measurements (one query for all).
    async fn trial_views(
        &self,
        study_id: i64,
        records: Vec<TrialRecord>,
    ) -> ServiceResult<Vec<Trial>> {
        let (Some(first), Some(last)) = (
            records.iter().map(|t| t.id).min(),
            records.iter().map(|t| t.id).max(),
        ) else {
            return Ok(Vec::new());
        };
        let mut by_trial: HashMap<i64, Vec<Measurement>> = HashMap::new();
        for (trial_id, m) in self.store.measurements(study_id, first, last).await? {
            by_trial.entry(trial_id).or_default().push(m);
        }
        Ok(records
            .into_iter()
            .map(|t| Trial {
                measurements: by_trial.remove(&t.id).unwrap_or_default(),
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
                created_at: t.created_at,
                started_at: t.started_at,
                completed_at: t.completed_at,
            })
            .collect())
    }
}

/// Quasi-random points for when the model misses its time budget.
fn fallback_points(
    study: &StudyRecord,
    config: &crate::model::StudyConfig,
    count: usize,
) -> Vec<Assignment> {
    let input = DesignerInput {
        space: &config.space,
        metrics: &config.metrics,
        completed: &[],
        pending: &[],
        count,
        first_trial_number: study.next_trial_id.max(1) as u64,
        seed: config.seed,
        previous_state: None,
        prior_studies: &[],
        desired_min_safe_trials_fraction: None,
    };
    designer_for(augur_optimizer::Algorithm::QuasiRandom)
        .suggest(&input)
        .suggestions
}

/// How many new points a model-based designer should propose for this call: none when the
/// client resumes its trials, when requested trials are waiting, or when the cap is full.
fn suggestions_needed(
    trials: &[TrialRecord],
    config: &crate::model::StudyConfig,
    count: usize,
    client_id: Option<&str>,
) -> usize {
    let unfinished: Vec<&TrialRecord> = trials.iter().filter(|t| t.state.is_unfinished()).collect();
    if client_id.is_some_and(|c| unfinished.iter().any(|t| t.client_id.as_deref() == Some(c))) {
        return 0;
    }
    let waiting = unfinished
        .iter()
        .filter(|t| t.state == TrialState::Requested)
        .count();
    let free = (config.parallel_trials as usize).saturating_sub(unfinished.len());
    let budget = (config.trial_budget() as usize).saturating_sub(trials.len());
    count.saturating_sub(waiting).min(free).min(budget)
}

fn outcome_of(trial: &TrialRecord, config: &crate::model::StudyConfig) -> Outcome {
    match (trial.state, &trial.final_measurement) {
        (TrialState::Completed, Some(m))
            if config
                .metrics
                .iter()
                .all(|spec| m.metrics.contains_key(&spec.id)) =>
        {
            Outcome::Measured(m.metrics.clone())
        }
        (TrialState::Failed, _) => Outcome::Failed,
        _ => Outcome::Infeasible,
    }
}

/// `(step, value)` learning curves of one metric, by trial, sorted by step.
/// Completed trials whose curves the early-stopping rule compares a running trial with: the
/// latest ones.
const STOPPING_PEERS: i64 = 1_000;

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

/// An intermediate measurement: a step >= 0, a sane elapsed time, the study's metrics.
fn check_measurement(
    config: &crate::model::StudyConfig,
    measurement: &Measurement,
) -> ServiceResult<()> {
    if measurement.step < 0 {
        return Err(ServiceError::invalid("step", "must be >= 0"));
    }
    if measurement
        .elapsed_secs
        .is_some_and(|s| !(s.is_finite() && s >= 0.0))
    {
        return Err(ServiceError::invalid(
            "elapsed_secs",
            "must be a finite number >= 0",
        ));
    }
    check_metrics(config, &measurement.metrics, "metrics", false)
}

/// Every metric must be one of the study's, with a finite value; `require_all` demands
/// every metric of the study (final measurements).
fn check_metrics(
    config: &crate::model::StudyConfig,
    metrics: &BTreeMap<String, f64>,
    field: &str,
    require_all: bool,
) -> ServiceResult<()> {
    for (id, value) in metrics {
        if !config.metrics.iter().any(|m| &m.id == id) {
            return Err(ServiceError::invalid(
                format!("{field}.{id}"),
                "not a metric of this study",
            ));
        }
        if !value.is_finite() {
            return Err(ServiceError::invalid(
                format!("{field}.{id}"),
                "must be a finite number",
            ));
        }
    }
    if require_all {
        if let Some(missing) = config.metrics.iter().find(|m| !metrics.contains_key(&m.id)) {
            return Err(ServiceError::invalid(
                format!("{field}.{}", missing.id),
                "is required",
            ));
        }
    } else if metrics.is_empty() {
        return Err(ServiceError::invalid(
            field,
            "must report at least one metric",
        ));
    }
    Ok(())
}

fn page_bounds(page_size: Option<i64>, page_token: Option<&str>) -> ServiceResult<(i64, i64)> {
    let limit = page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    if !(1..=MAX_PAGE_SIZE).contains(&limit) {
        return Err(ServiceError::invalid(
            "page_size",
            format!("must be between 1 and {MAX_PAGE_SIZE}"),
        ));
    }
    let after = match page_token {
        None | Some("") => 0,
        Some(token) => token
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ServiceError::invalid("page_token", "not a token from a previous page")
            })?,
    };
    Ok((limit, after))
}

/// Keep `limit` items; the next page token is the last kept id when more were found.
fn split_page<T>(
    mut items: Vec<T>,
    limit: i64,
    id: impl Fn(&T) -> i64,
) -> (Vec<T>, Option<String>) {
    if items.len() as i64 > limit {
        items.truncate(limit as usize);
        let next = items.last().map(|t| id(t).to_string());
        (items, next)
    } else {
        (items, None)
    }
}

/// The `/changes` cursor after position `(change_seq, trial id)`.
fn format_cursor(after: (i64, i64)) -> String {
    format!("{}.{}", after.0, after.1)
}

/// The `/changes` cursor past every change up to `change_seq` (e.g. a snapshot's).
pub fn cursor_after_seq(change_seq: i64) -> String {
    format_cursor((change_seq, i64::MAX))
}

fn not_found_study(study_id: i64) -> ServiceError {
    ServiceError::NotFound(format!("study {study_id}"))
}

fn corrupt_spec(study_id: i64) -> impl Fn(ValidationError) -> ServiceError {
    move |e| ServiceError::Internal(format!("stored spec of study {study_id} is invalid: {e}"))
}

fn unexpected(reply: Reply) -> ServiceError {
    ServiceError::Internal(format!("unexpected reply {reply:?}"))
}
