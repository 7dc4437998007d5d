//! `augur worker --study ID [--slots N] -- python train.py`: a warm pool of pulled trials on
//! this machine. Each slot asks `suggest` with a stable client id (`<worker>/<slot>`), runs
//! the trial with the same arguments, environment and metric collection as a dispatched
//! job, and reports over HTTP. A worker restarted with the same id gets its unfinished
//! trials back.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::client::Client;
use super::error::{CliError, CliResult};
use super::lease::run_pulled_trial;
use crate::dispatch::executor::{Executor, ExecutorContext, executor_for};
use crate::dispatch::local::LocalExecutor;
use crate::dispatch::reporter::{AttemptStart, TrialReporter};
use crate::dispatch::trial::{Interrupt, TrialSetup};
use crate::dispatch::{DispatchError, DispatchResult};
use crate::model::{
    ExecutorSpec, Measurement, OutputLayout, Study, StudyDir, StudyId, StudyKey, TrialId,
    TrialJobSpec,
};
use crate::service::DispatchedTrial;

pub struct WorkerOptions {
    pub study_id: StudyId,
    pub slots: usize,
    pub client_id: String,
    pub output_dir: Option<PathBuf>,
    /// `NAME=VALUE` to set, or `NAME` to pass on this worker's own value.
    pub env: Vec<String>,
    /// The operator's settings for this machine's executors (its GPUs, the engine a
    /// container study's replicas run in).
    pub executors: crate::dispatch::settings::ExecutorSettings,
    pub command: Vec<String>,
}

/// Where this worker runs a trial's replicas: in containers for a container study (its
/// image), as local processes for every other (Slurm and Kubernetes studies too: the worker
/// runs them on its own machine).
fn worker_executor(job: &TrialJobSpec, options: &WorkerOptions) -> CliResult<Arc<dyn Executor>> {
    let context = ExecutorContext::new(&options.executors, None);
    Ok(match job.executor {
        ExecutorSpec::Container { .. } | ExecutorSpec::Pool(_) => executor_for(job, &context)
            .map_err(|e| CliError::Dispatch(DispatchError::Executor(e)))?,
        ExecutorSpec::Local | ExecutorSpec::Slurm(_) | ExecutorSpec::Kubernetes { .. } => {
            Arc::new(LocalExecutor::new(context))
        }
    })
}

/// What a trial's environment starts from: the inherited allow-list, then `--env`.
pub(super) fn trial_base_env(options: &[String]) -> CliResult<Vec<(String, String)>> {
    let mut pass_on = Vec::new();
    let mut set = Vec::new();
    for item in options {
        match item.split_once('=') {
            Some((name, value)) if !name.is_empty() => {
                set.push((name.to_string(), value.to_string()))
            }
            None if !item.is_empty() => pass_on.push(item.clone()),
            _ => {
                return Err(CliError::Usage(format!(
                    "--env {item:?}: give NAME=VALUE or NAME"
                )));
            }
        }
    }
    let mut env = crate::dispatch::job_base_env(&pass_on);
    env.extend(set);
    Ok(env)
}

/// A worker's id when none is given: this host and process.
pub fn default_client_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

pub async fn run_worker(client: Client, options: WorkerOptions) -> CliResult<()> {
    if options.command.is_empty() {
        return Err(CliError::Usage("give the training command after `--`, e.g. `augur worker --study 1 -- python3 train.py`".into()));
    }
    if !(1..=256).contains(&options.slots) {
        return Err(CliError::Usage("--slots must be between 1 and 256".into()));
    }
    let study: Study = serde_json::from_value(
        client
            .call(
                Method::GET,
                &format!("/v1/studies/{}", options.study_id),
                None,
            )
            .await?,
    )
    .map_err(|e| CliError::Connection(format!("unexpected study document: {e}")))?;
    // The study's trial_job settings (argument style, env, timeout, retries) apply, with this
    // command.
    let mut job = study.spec.trial_job.clone().unwrap_or_default();
    job.command = options.command.clone();
    job.workdir = None;
    // `--output-dir` (in the study's layout), or ./augur-runs/study-<id>.
    let key = StudyKey {
        id: study.id,
        created_at: study.created_at,
    };
    let study_dir = match &options.output_dir {
        Some(d) => StudyDir::below(d.clone(), key, job.output_layout),
        None => StudyDir::below(
            std::env::current_dir()
                .map_err(|e| CliError::Usage(format!("the current directory: {e}")))?
                .join("augur-runs"),
            key,
            OutputLayout::Study,
        ),
    };
    let client = Arc::new(client);
    let metric_pattern = TrialSetup::metric_pattern(&job)?;
    let executor = worker_executor(&job, &options)?;
    let reporter = Arc::new(HttpReporter::new(client.clone(), study.id));
    let setup = Arc::new(TrialSetup {
        study_id: study.id,
        study_created_at: study.created_at,
        job,
        metric_ids: study.spec.metrics.iter().map(|m| m.id.clone()).collect(),
        early_stopping: study.spec.early_stopping.is_some(),
        fidelity: study.spec.validate().ok().and_then(|c| c.fidelity),
        augur_url: client.base().to_string(),
        base_env: trial_base_env(&options.env)?,
        study_dir,
        executor,
        reporter: reporter.clone(),
        metric_pattern,
    });
    let lease = Duration::from_secs(study.spec.trial_lease_secs.max(3) as u64);
    let (interrupt, _) = watch::channel(Interrupt::None);
    let mut slots = tokio::task::JoinSet::new();
    for slot in 0..options.slots {
        let slot_client = format!("{}/{slot}", options.client_id);
        slots.spawn(run_slot(
            client.clone(),
            setup.clone(),
            reporter.clone(),
            slot_client,
            lease,
            interrupt.subscribe(),
        ));
    }
    eprintln!(
        "worker {} runs study {} with {} slot(s)",
        options.client_id, study.id, options.slots
    );
    let mut completed = 0usize;
    // One listener for the worker's life: a fresh `ctrl_c()` per turn could miss one.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => {
                let _ = interrupt.send(Interrupt::Shutdown);
                while slots.join_next().await.is_some() {}
                eprintln!("stopped; start the worker again with --client-id {} to resume its trials", options.client_id);
                return Ok(());
            }
            done = slots.join_next() => match done {
                Some(Ok(Ok(n))) => completed += n,
                Some(Ok(Err(e))) => {
                    let _ = interrupt.send(Interrupt::Shutdown);
                    while slots.join_next().await.is_some() {}
                    return Err(e);
                }
                Some(Err(e)) => return Err(CliError::Dispatch(DispatchError::Task(format!("worker slot crashed: {e}")))),
                None => break,
            }
        }
    }
    println!(
        "study {} has no more trials; this worker ran {completed}",
        study.id
    );
    Ok(())
}

/// One slot: ask for a trial, run it, repeat until the study has no more. Returns how many
/// trials it ran.
async fn run_slot(
    client: Arc<Client>,
    setup: Arc<TrialSetup>,
    reporter: Arc<HttpReporter>,
    client_id: String,
    lease: Duration,
    mut interrupt: watch::Receiver<Interrupt>,
) -> CliResult<usize> {
    let mut ran = 0;
    loop {
        if *interrupt.borrow() != Interrupt::None {
            return Ok(ran);
        }
        let body = json!({"count": 1, "client_id": client_id});
        let answer = client
            .call(
                Method::POST,
                &format!("/v1/studies/{}/suggest", setup.study_id),
                Some(&body),
            )
            .await?;
        let Some(trial) = answer["trials"].as_array().and_then(|t| t.first()).cloned() else {
            match answer["retry_after_secs"].as_u64() {
                Some(secs) => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(secs.max(1))) => continue,
                        _ = interrupt.changed() => return Ok(ran),
                    }
                }
                None => return Ok(ran),
            }
        };
        let trial_id = trial["id"]
            .as_i64()
            .map(TrialId::new)
            .ok_or_else(|| CliError::Connection("suggest answered a trial without an id".into()))?;
        let parameters = serde_json::from_value(trial["parameters"].clone())
            .map_err(|e| CliError::Connection(format!("trial {trial_id}: {e}")))?;
        reporter.hold(trial_id, &client_id);
        // A multi-fidelity trial's budget: a promotion resumes the same trial, in the same
        // directories, at a larger one.
        let budget = trial["budget"].as_f64();
        let run = DispatchedTrial {
            id: trial_id,
            parameters,
            attempts: 0,
            budget,
            copy_from: trial["lineage"]["copying_from"].as_i64().map(TrialId::new),
        };
        let end = run_pulled_trial(&setup, run, client.clone(), lease, interrupt.clone()).await;
        reporter.release(trial_id);
        eprintln!("trial {trial_id}: {end:?}");
        ran += 1;
        if interrupt.has_changed().unwrap_or(true)
            || *interrupt.borrow_and_update() != Interrupt::None
        {
            return Ok(ran);
        }
    }
}

/// Reports a pulled trial's outcome over the HTTP API.
pub(super) struct HttpReporter {
    client: Arc<Client>,
    study_id: StudyId,
    /// Launches per trial, counted by this worker process only: the API counts the launches
    /// of dispatched trials alone (`attempts`), so a restarted worker starts its trials'
    /// retries afresh.
    attempts: std::sync::Mutex<std::collections::HashMap<TrialId, u32>>,
    /// The slot's client id each running trial was suggested to: the server gives a
    /// trial's token only to its holder.
    holders: std::sync::Mutex<std::collections::HashMap<TrialId, String>>,
    /// Trials leased from a pool (`augur worker --pool`): the token the lease came with and
    /// a client that reports with it. A pool worker's own token may not report to another
    /// creator's study; the trial's token may, to that trial alone.
    leased: std::sync::Mutex<std::collections::HashMap<TrialId, (Arc<Client>, String)>>,
}

impl HttpReporter {
    pub(super) fn new(client: Arc<Client>, study_id: StudyId) -> Self {
        HttpReporter {
            client,
            study_id,
            attempts: Default::default(),
            holders: Default::default(),
            leased: Default::default(),
        }
    }

    /// A trial leased from a pool: reported with `token` from here on, its launches counted
    /// from `lost` (those lost with earlier workers, which the server counted).
    pub(super) fn lease(&self, trial_id: TrialId, token: &str, lost: u32) {
        if let Ok(mut leased) = self.leased.lock() {
            leased.insert(
                trial_id,
                (Arc::new(self.client.with_token(token)), token.into()),
            );
        }
        if let Ok(mut attempts) = self.attempts.lock() {
            attempts.insert(trial_id, lost);
        }
    }

    /// The trial's lease is over (it ended here).
    pub(super) fn end_lease(&self, trial_id: TrialId) {
        if let Ok(mut leased) = self.leased.lock() {
            leased.remove(&trial_id);
        }
        if let Ok(mut attempts) = self.attempts.lock() {
            attempts.remove(&trial_id);
        }
    }

    /// The client that reports to this trial: with the trial's own token when leased.
    pub(super) fn client_for(&self, trial_id: TrialId) -> Arc<Client> {
        self.leased
            .lock()
            .ok()
            .and_then(|l| l.get(&trial_id).map(|(c, _)| c.clone()))
            .unwrap_or_else(|| self.client.clone())
    }

    fn path(&self, trial_id: TrialId, action: &str) -> String {
        format!("/v1/studies/{}/trials/{trial_id}{action}", self.study_id)
    }

    fn hold(&self, trial_id: TrialId, client_id: &str) {
        if let Ok(mut holders) = self.holders.lock() {
            holders.insert(trial_id, client_id.to_string());
        }
    }

    fn release(&self, trial_id: TrialId) {
        if let Ok(mut holders) = self.holders.lock() {
            holders.remove(&trial_id);
        }
    }

    /// A token that may only report to this trial, from the server (never this worker's
    /// own). `None` from a server too old to issue one: the trial then gets no token.
    async fn trial_token(&self, trial_id: TrialId) -> DispatchResult<Option<String>> {
        if let Some(token) = self
            .leased
            .lock()
            .ok()
            .and_then(|l| l.get(&trial_id).map(|(_, t)| t.clone()))
        {
            return Ok(Some(token));
        }
        let client_id = self
            .holders
            .lock()
            .ok()
            .and_then(|h| h.get(&trial_id).cloned())
            .ok_or_else(|| DispatchError::Task(format!("trial {trial_id} has no holder")))?;
        let (status, body) = self
            .client
            .call_status(
                Method::POST,
                &self.path(trial_id, "/token"),
                Some(&json!({"client_id": client_id})),
            )
            .await
            .map_err(remote)?;
        match status {
            s if s.is_success() => body["token"]
                .as_str()
                .map(|t| Some(t.to_string()))
                .ok_or_else(|| remote("the server answered a token request without a token")),
            StatusCode::NOT_FOUND if body["error"]["message"] == "no such route" => {
                tracing::warn!(
                    %trial_id,
                    "the server issues no trial tokens (older than this worker): the trial gets none"
                );
                Ok(None)
            }
            s => Err(remote(format!("token: {s}: {}", body["error"]["message"]))),
        }
    }
}

#[async_trait]
impl TrialReporter for HttpReporter {
    async fn measurement(&self, trial_id: TrialId, measurement: Measurement) -> DispatchResult<()> {
        let body = serde_json::to_value(&measurement).map_err(remote)?;
        self.client_for(trial_id)
            .call(
                Method::POST,
                &self.path(trial_id, "/measurements"),
                Some(&body),
            )
            .await
            .map(|_| ())
            .map_err(remote)
    }

    async fn complete_with(
        &self,
        trial_id: TrialId,
        last: Vec<Measurement>,
    ) -> DispatchResult<bool> {
        // The last measurements with the completion, in one request and one change.
        let body = json!({"measurements": &last});
        let (status, answer) = self
            .client_for(trial_id)
            .call_status(Method::POST, &self.path(trial_id, "/complete"), Some(&body))
            .await
            .map_err(remote)?;
        match status {
            s if s.is_success() => return Ok(true),
            StatusCode::CONFLICT => return Ok(true),
            // Refused (a server older than `measurements` in a completion, a measurement
            // it does not take, nothing to select): as before, one request each, each
            // refusal logged, then the completion alone.
            StatusCode::BAD_REQUEST => {}
            s => {
                return Err(remote(format!(
                    "complete: {s}: {}",
                    answer["error"]["message"]
                )));
            }
        }
        for measurement in last {
            if let Err(e) = self.measurement(trial_id, measurement).await {
                tracing::warn!(%trial_id, error = %e, "could not record a measurement");
            }
        }
        let (status, body) = self
            .client_for(trial_id)
            .call_status(
                Method::POST,
                &self.path(trial_id, "/complete"),
                Some(&json!({})),
            )
            .await
            .map_err(remote)?;
        match status {
            s if s.is_success() => Ok(true),
            StatusCode::CONFLICT => Ok(true),
            StatusCode::BAD_REQUEST if body["error"]["field"] == "metrics" => Ok(false),
            s => Err(remote(format!(
                "complete: {s}: {}",
                body["error"]["message"]
            ))),
        }
    }

    async fn fail(&self, trial_id: TrialId, reason: String) -> DispatchResult<()> {
        let (status, body) = self
            .client_for(trial_id)
            .call_status(
                Method::POST,
                &self.path(trial_id, "/fail"),
                Some(&json!({"reason": reason})),
            )
            .await
            .map_err(remote)?;
        if status.is_success() || status == StatusCode::CONFLICT {
            Ok(())
        } else {
            Err(remote(format!(
                "fail: {status}: {}",
                body["error"]["message"]
            )))
        }
    }

    async fn should_stop(&self, trial_id: TrialId) -> DispatchResult<bool> {
        let v = self
            .client_for(trial_id)
            .call(Method::POST, &self.path(trial_id, "/should_stop"), None)
            .await
            .map_err(remote)?;
        Ok(v["should_stop"] == Value::Bool(true))
    }

    async fn finished(&self, trial_id: TrialId) -> DispatchResult<bool> {
        let v = self
            .client_for(trial_id)
            .call(Method::GET, &self.path(trial_id, ""), None)
            .await
            .map_err(remote)?;
        Ok(!matches!(
            v["state"].as_str(),
            Some("requested" | "active" | "stopping")
        ))
    }

    async fn start_attempt(
        &self,
        trial_id: TrialId,
        max_attempts: u32,
    ) -> DispatchResult<Option<AttemptStart>> {
        let number = {
            let mut attempts = self
                .attempts
                .lock()
                .map_err(|_| DispatchError::Task("attempt counter poisoned".into()))?;
            let n = attempts.entry(trial_id).or_insert(0);
            if *n >= max_attempts {
                return Ok(None);
            }
            *n += 1;
            *n
        };
        // A token of the trial's own for each launch (replacing the last launch's): the
        // worker's token, which may do whatever the worker may, never reaches the trial.
        let token = self.trial_token(trial_id).await?;
        Ok(Some(AttemptStart { number, token }))
    }

    /// PBT: this worker copied the parent's checkpoint (from the study's directory, which
    /// the pool's workers share) into the trial's own.
    async fn checkpoint_copied(&self, trial_id: TrialId) -> DispatchResult<()> {
        self.client_for(trial_id)
            .call(
                Method::POST,
                &self.path(trial_id, "/checkpoint_copied"),
                None,
            )
            .await
            .map(drop)
            .map_err(remote)
    }

    async fn refund_attempt(&self, trial_id: TrialId) -> DispatchResult<()> {
        if let Ok(mut attempts) = self.attempts.lock()
            && let Some(n) = attempts.get_mut(&trial_id)
        {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }
}

/// A report the server refused or could not take, as dispatch sees it.
fn remote(e: impl std::fmt::Display) -> DispatchError {
    DispatchError::Remote(e.to_string())
}
