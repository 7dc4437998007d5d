//! The study runner: keeps up to `parallel_trials` of one study's trials running, starting
//! the next one as soon as a slot frees, until the budget is done or the study is stopped.
//! After a restart it resumes the trials it had started (same trial, same directories).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::DispatchConfig;
use super::environment::job_base_env;
use super::error::DispatchResult;
use super::executor::{ExecutorContext, executor_for};
use super::reporter::{AttemptStart, ServiceReporter};
use super::trial::{Interrupt, TrialEnd, TrialSetup, run_trial};
use crate::model::{ClientId, StudyId, StudyState, TrialId, TrialJobSpec};
use crate::model::{StudyDir, StudyKey};
use crate::service::{DispatchedTrial, RunnerStudy, Service, hash_token, new_token};

/// How often the runner renews its lease (`service::RUNNER_LEASE_TTL`, 15 s).
const RENEW_EVERY: Duration = Duration::from_secs(3);
/// How long one renewal may take (a database cut off answers nothing).
const RENEW_TIMEOUT: Duration = Duration::from_secs(2);
/// A runner that has not renewed its lease for this long stops its jobs and ends: once the
/// lease lapses another replica may take the study and run those trials again, and a job
/// may take `STOP_GRACE` (5 s) to stop. 8 + 5 < 15.
const FENCE_AFTER: Duration = Duration::from_secs(8);
/// Re-read the study at least this often (changes made through another replica).
const RECHECK_EVERY: Duration = Duration::from_secs(1);
/// The `client_id` of dispatched trials.
pub const RUNNER_CLIENT: &str = crate::service::exec::DISPATCHER_CLIENT_ID;

pub async fn run_study(
    service: Service,
    config: Arc<DispatchConfig>,
    executors: ExecutorContext,
    study_id: StudyId,
    wake: watch::Receiver<Interrupt>,
) {
    StudyRunner {
        service,
        config,
        executors,
        study_id,
        interrupt_trials: Arc::new(watch::channel(Interrupt::None).0),
        tasks: JoinSet::new(),
        running: HashSet::new(),
        deferred: HashMap::new(),
        setup: None,
        resumed: false,
        current: None,
        stale: true,
    }
    .run(wake)
    .await
}

/// What the runner does after an event.
enum Next {
    Continue,
    /// Stop every trial this way and end the runner.
    Stop(Interrupt),
}

struct StudyRunner {
    service: Service,
    config: Arc<DispatchConfig>,
    executors: ExecutorContext,
    study_id: StudyId,
    /// Shared with the lease keeper, which stops the trials itself when the lease is lost.
    interrupt_trials: Arc<watch::Sender<Interrupt>>,
    tasks: JoinSet<(TrialId, TrialEnd)>,
    running: HashSet<TrialId>,
    /// Trials handed out again while their last task is still ending (a paused trial that a
    /// scheduler promoted as soon as its attempt was recorded): started when that task is
    /// joined, so one trial never runs twice at once nor is dropped.
    deferred: HashMap<TrialId, (DispatchedTrial, Option<AttemptStart>)>,
    /// Fixed for the study's trials while its job stays the same.
    setup: Option<Arc<TrialSetup>>,
    resumed: bool,
    /// The study as last read. A trial's end does not re-read it (that would put a query in
    /// the path from a freed slot to the next job); wake-ups, the periodic recheck and a
    /// suggest that reports the study ended do (`stale`). `None`: deleted.
    current: Option<RunnerStudy>,
    stale: bool,
}

impl StudyRunner {
    async fn run(mut self, mut wake: watch::Receiver<Interrupt>) {
        // Kept apart from this loop, whose reads can each wait out a database's timeout.
        let (lost_tx, mut lost) = watch::channel(false);
        let keeper = tokio::spawn(keep_lease(
            self.service.clone(),
            self.study_id,
            self.config.owner.clone(),
            self.interrupt_trials.clone(),
            lost_tx,
        ));
        let _keeper = AbortOnDrop(keeper);
        loop {
            if self.stale && !self.refresh().await {
                tokio::time::sleep(RECHECK_EVERY).await;
                continue;
            }
            let Some(study) = self.current.clone().filter(|s| {
                s.state == StudyState::Active
                    && s.config
                        .trial_job
                        .as_ref()
                        .is_some_and(|job| job.executor.pool().is_none())
            }) else {
                // Stopped, failed or deleted: cancel what runs. Completed: nothing runs.
                return self.stop_all(Interrupt::Cancel).await;
            };
            let setup = match self.setup_for(&study) {
                Ok(setup) => setup,
                Err(error) => {
                    tracing::error!(study_id = %self.study_id, %error, "cannot run this study's trials");
                    return self.stop_all(Interrupt::Shutdown).await;
                }
            };
            self.resume_once(&setup).await;
            self.fill_slots(&study, &setup).await;
            if let Next::Stop(how) = self.next_event(&mut wake, &mut lost).await {
                return self.stop_all(how).await;
            }
        }
    }

    /// Read the study again; false when it could not be read (try again later).
    async fn refresh(&mut self) -> bool {
        match self.service.runner_study(self.study_id).await {
            Ok(study) => {
                self.current = study;
                self.stale = false;
                true
            }
            Err(error) => {
                tracing::warn!(study_id = %self.study_id, %error, "runner could not read its study");
                false
            }
        }
    }

    /// The trials' setup, made again when the study's job changed.
    fn setup_for(&mut self, study: &RunnerStudy) -> DispatchResult<Arc<TrialSetup>> {
        let Some(job) = study.config.trial_job.clone() else {
            return Err(crate::dispatch::error::DispatchError::Task(
                "the study has no trial_job".into(),
            ));
        };
        if let Some(setup) = self.setup.as_ref().filter(|s| s.job == job) {
            return Ok(setup.clone());
        }
        let setup = Arc::new(self.new_setup(study, job)?);
        self.setup = Some(setup.clone());
        Ok(setup)
    }

    fn new_setup(&self, study: &RunnerStudy, job: TrialJobSpec) -> DispatchResult<TrialSetup> {
        Ok(TrialSetup {
            study_id: self.study_id,
            study_created_at: study.created_at,
            study_dir: StudyDir::of(
                &self.config.base_dir,
                StudyKey {
                    id: self.study_id,
                    created_at: study.created_at,
                },
                Some(&job),
            ),
            executor: executor_for(&job, &self.executors)?,
            metric_pattern: TrialSetup::metric_pattern(&job)?,
            job,
            metric_ids: study.config.metrics.iter().map(|m| m.id.clone()).collect(),
            early_stopping: study.config.early_stopping.is_some(),
            fidelity: study.config.fidelity.clone(),
            augur_url: self.config.augur_url.clone(),
            base_env: job_base_env(&self.config.job_env),
            reporter: Arc::new(ServiceReporter {
                service: self.service.clone(),
                study_id: self.study_id,
                owner: self.config.owner.clone(),
            }),
        })
    }

    /// Once per runner: take up the trials this study's dispatcher had started before the
    /// service restarted.
    async fn resume_once(&mut self, setup: &Arc<TrialSetup>) {
        if self.resumed {
            return;
        }
        self.resumed = true;
        let trials = match self
            .service
            .resumable_trials(self.study_id, RUNNER_CLIENT)
            .await
        {
            Ok(trials) => trials,
            Err(error) => {
                tracing::warn!(study_id = %self.study_id, %error, "could not list trials to resume");
                return;
            }
        };
        for trial in trials {
            tracing::info!(
                study_id = %self.study_id,
                trial_id = %trial.id,
                "resuming trial"
            );
            self.start(setup, trial, None);
        }
    }

    /// Ask for as many trials as slots are free and start them.
    async fn fill_slots(&mut self, study: &RunnerStudy, setup: &Arc<TrialSetup>) {
        let free = study.config.free_slots(self.running.len() as u64) as usize;
        if free == 0 {
            return;
        }
        // Each trial's first launch is counted with its suggestion, with one of these
        // tokens: one commit less between a freed slot and the next job.
        let tokens: Vec<String> = (0..free).map(|_| new_token()).collect();
        let hashes = tokens.iter().map(|t| hash_token(t)).collect();
        let client = ClientId::try_from(RUNNER_CLIENT.to_string());
        let suggested = match client {
            Ok(client) => {
                self.service
                    .suggest_dispatched(self.study_id, &self.config.owner, client, hashes)
                    .await
            }
            Err(e) => Err(e.into()),
        };
        match suggested {
            Ok(s) => {
                if s.study_state != StudyState::Active {
                    self.stale = true;
                }
                for (trial, token) in s.trials.into_iter().zip(tokens) {
                    let first = AttemptStart {
                        number: trial.attempts,
                        token: Some(token),
                    };
                    self.start(setup, trial, Some(first));
                }
            }
            Err(error) => {
                tracing::warn!(study_id = %self.study_id, %error, "runner could not get suggestions")
            }
        }
    }

    fn start(
        &mut self,
        setup: &Arc<TrialSetup>,
        trial: DispatchedTrial,
        first: Option<AttemptStart>,
    ) {
        if !self.running.insert(trial.id) {
            // Its last task has reported but not been joined yet: start it then. (A trial
            // that resume_once and a suggestion both hand over is started once: the
            // suggestion's comes with its counted launch and replaces the other.)
            if first.is_some() || !self.deferred.contains_key(&trial.id) {
                self.deferred.insert(trial.id, (trial, first));
            }
            return;
        }
        let (setup, interrupt) = (setup.clone(), self.interrupt_trials.subscribe());
        self.tasks.spawn(async move {
            let id = trial.id;
            (id, run_trial(setup, trial, first, interrupt).await)
        });
    }

    /// Wait for a trial to end, a wake-up, the lease's renewal or the periodic recheck.
    async fn next_event(
        &mut self,
        wake: &mut watch::Receiver<Interrupt>,
        lost: &mut watch::Receiver<bool>,
    ) -> Next {
        tokio::select! {
            Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                // Trials that ended together free their slots in one suggest.
                let mut ended = vec![done];
                while let Some(more) = self.tasks.try_join_next() {
                    ended.push(more);
                }
                for (trial_id, end) in ended.into_iter().flatten() {
                    self.running.remove(&trial_id);
                    tracing::info!(study_id = %self.study_id, %trial_id, ?end, "trial ended");
                    if let (Some((trial, first)), Some(setup)) =
                        (self.deferred.remove(&trial_id), self.setup.clone())
                    {
                        self.start(&setup, trial, first);
                    }
                }
                Next::Continue
            }
            changed = wake.changed() => {
                self.stale = true;
                let what = if changed.is_ok() { *wake.borrow() } else { Interrupt::Shutdown };
                if what == Interrupt::None { Next::Continue } else { Next::Stop(what) }
            }
            _ = lost.changed() => Next::Stop(Interrupt::Shutdown),
            _ = tokio::time::sleep(RECHECK_EVERY) => {
                self.stale = true;
                Next::Continue
            }
        }
    }

    /// Interrupt every running trial and wait until all have ended.
    async fn stop_all(mut self, how: Interrupt) {
        let _ = self.interrupt_trials.send(how);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Aborts its task when dropped (the runner's lease keeper ends with the runner).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Renew the study's runner lease every `RENEW_EVERY` until it is lost: another owner holds
/// it, or it could not be renewed for `FENCE_AFTER` (a replica cut from the database cannot
/// know whether another has taken the study). Then the trials are stopped at once, left to be
/// resumed by whoever runs the study next, and the runner is told (`lost`).
async fn keep_lease(
    service: Service,
    study_id: StudyId,
    owner: String,
    interrupt_trials: Arc<watch::Sender<Interrupt>>,
    lost: watch::Sender<bool>,
) {
    let mut renewed_at = tokio::time::Instant::now();
    let mut every = tokio::time::interval(RENEW_EVERY);
    every.tick().await;
    loop {
        every.tick().await;
        let kept =
            tokio::time::timeout(RENEW_TIMEOUT, service.claim_runner(study_id, &owner)).await;
        let why = match kept {
            Ok(Ok(true)) => {
                renewed_at = tokio::time::Instant::now();
                continue;
            }
            Ok(Ok(false)) => "another owner holds the runner lease".to_string(),
            Ok(Err(e)) if renewed_at.elapsed() >= FENCE_AFTER => {
                format!("cannot renew the runner lease: {e}")
            }
            Err(_) if renewed_at.elapsed() >= FENCE_AFTER => {
                "cannot renew the runner lease: no answer".to_string()
            }
            _ => continue,
        };
        tracing::warn!(%study_id, reason = %why, "stopping this runner's jobs: another replica may take the study");
        interrupt_trials.send_replace(Interrupt::Shutdown);
        let _ = lost.send(true);
        return;
    }
}
