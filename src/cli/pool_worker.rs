//! `augur worker --pool NAME --slots N`: a worker of a named pool, shared by every study
//! whose `trial_job` names the pool (`executor: pool`, DESIGN §4.4).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use tokio::sync::{Mutex, Notify, watch};

use super::client::Client;
use super::error::{CliError, CliResult};
use super::lease::run_pulled_trial;
use super::worker::{HttpReporter, trial_base_env};
use crate::dispatch::DispatchError;
use crate::dispatch::executor::{ExecutorContext, executor_for};
use crate::dispatch::settings::ExecutorSettings;
use crate::dispatch::trial::{Interrupt, TrialSetup};
use crate::model::pool::{PoolLease, WORKER_REPORT_EVERY_SECS};
use crate::model::{OutputLayout, Role, Study, StudyDir, StudyId, StudyKey};
use crate::service::{DispatchedTrial, JobPolicy};

pub struct PoolWorkerOptions {
    pub pool: String,
    pub slots: usize,
    pub client_id: String,
    /// Base of the per-trial directories of studies without an `output_dir` (default
    /// ./augur-runs); a study's own `output_dir` is used as it is.
    pub output_dir: Option<PathBuf>,
    pub env: Vec<String>,
    pub executors: ExecutorSettings,
    /// This worker's own allow-lists: what it runs, whatever the studies ask.
    pub job_commands: Vec<String>,
    pub job_images: Vec<String>,
    pub job_env_allow: Vec<String>,
}

/// How long a slot's lease request waits on the server for a trial (a long poll).
const LEASE_WAIT_SECS: f64 = 20.0;

/// What the slots share.
struct Worker {
    client: Arc<Client>,
    options: PoolWorkerOptions,
    policy: JobPolicy,
    /// One for all studies: the machine's GPUs and ports are handed out across them.
    context: ExecutorContext,
    base_env: Vec<(String, String)>,
    /// Each study's setup, made at its first trial here.
    setups: Mutex<HashMap<StudyId, Arc<StudyRun>>>,
    busy: AtomicU32,
    /// Rung at each change of `busy`: the reporter sends it at once.
    changed: Notify,
}

/// A study as this worker runs it.
struct StudyRun {
    setup: Arc<TrialSetup>,
    reporter: Arc<HttpReporter>,
    lease: Duration,
    /// Why this worker does not run the study's trials, when it does not.
    refused: Option<String>,
}

/// `augur worker --pool NAME --slots N`: a worker of a named pool, shared by every study
/// whose `trial_job` names the pool (`executor: pool`, DESIGN §4.4). Each slot asks the
/// server for the next trial of any study in the pool (`POST /v1/pools/{pool}/workers/
/// {worker}/lease`, a long poll: the server answers as soon as a study has room, the
/// fairest first), runs it as `augur worker --study` runs a pulled trial (same arguments,
/// environment, GPUs from this machine's `--gpus`, metric collection), and reports with the
/// trial's own token. The worker runs only what its own allow-lists permit
/// (`--job-commands`, `--job-images`, `--job-env-allow`, as `augur serve` reads them): a
/// trial it may not run is failed at once, the reason naming this worker and the list. It
/// reports its slots and busy count every few seconds and at each change, which the server
/// turns into the pool's utilisation.
pub async fn run_pool_worker(client: Client, options: PoolWorkerOptions) -> CliResult<()> {
    if !(1..=256).contains(&options.slots) {
        return Err(CliError::Usage("--slots must be between 1 and 256".into()));
    }
    crate::model::executor::check_pool_name(&options.pool)
        .map_err(|why| CliError::Usage(format!("--pool {:?}: {why}", options.pool)))?;
    let policy = JobPolicy::new(options.job_commands.clone(), options.job_images.clone())
        .map_err(CliError::Usage)?
        .with_env_allow(options.job_env_allow.clone());
    if options.job_commands.is_empty() && options.job_images.is_empty() {
        eprintln!(
            "warning: this worker runs any command the pool's studies name (their creators \
             are operators); limit it with --job-commands and --job-images"
        );
    }
    let context = ExecutorContext::new(&options.executors, None);
    let worker = Arc::new(Worker {
        client: Arc::new(client),
        base_env: trial_base_env(&options.env)?,
        options,
        policy,
        context,
        setups: Mutex::default(),
        busy: AtomicU32::new(0),
        changed: Notify::new(),
    });
    // Join the pool before taking work: a refused token or a bad name fails here, at once.
    worker.report().await?;
    let reporter = tokio::spawn(report_loop(worker.clone()));
    let (interrupt, _) = watch::channel(Interrupt::None);
    let mut slots = tokio::task::JoinSet::new();
    for slot in 0..worker.options.slots {
        slots.spawn(run_slot(worker.clone(), slot as u32, interrupt.subscribe()));
    }
    eprintln!(
        "worker {} joined pool {} with {} slot(s)",
        worker.options.client_id, worker.options.pool, worker.options.slots
    );
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let outcome = loop {
        tokio::select! {
            _ = &mut ctrl_c => break Ok(()),
            done = slots.join_next() => match done {
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => break Err(e),
                Some(Err(e)) => break Err(CliError::Dispatch(DispatchError::Task(format!("worker slot crashed: {e}")))),
                None => break Ok(()),
            }
        }
    };
    let _ = interrupt.send(Interrupt::Shutdown);
    while slots.join_next().await.is_some() {}
    reporter.abort();
    eprintln!(
        "worker {} left pool {}; its unfinished trials go back to the pool when their leases \
         run out (or start it again with --client-id {} to resume them)",
        worker.options.client_id, worker.options.pool, worker.options.client_id
    );
    outcome
}

impl Worker {
    fn path(&self, suffix: &str) -> String {
        format!(
            "/v1/pools/{}/workers/{}{suffix}",
            self.options.pool,
            urlencoding(&self.options.client_id)
        )
    }

    /// Tell the server this worker's slots, GPUs and busy count.
    async fn report(&self) -> CliResult<()> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let body = json!({
            "host": if host.is_empty() { "unknown".to_string() } else { host },
            "slots": self.options.slots,
            "gpus": self.context.gpus.devices(),
            "busy": self.busy.load(Ordering::SeqCst).min(self.options.slots as u32),
        });
        self.client
            .call(Method::PUT, &self.path(""), Some(&body))
            .await
            .map(drop)
    }

    fn set_busy(&self, delta: i32) {
        if delta > 0 {
            self.busy.fetch_add(delta as u32, Ordering::SeqCst);
        } else {
            self.busy.fetch_sub(delta.unsigned_abs(), Ordering::SeqCst);
        }
        self.changed.notify_one();
    }

    /// The study's setup, read from the server at its first trial here.
    async fn study_run(&self, study_id: StudyId) -> CliResult<Arc<StudyRun>> {
        let mut setups = self.setups.lock().await;
        if let Some(run) = setups.get(&study_id) {
            return Ok(run.clone());
        }
        let study: Study = serde_json::from_value(
            self.client
                .call(Method::GET, &format!("/v1/studies/{study_id}"), None)
                .await?,
        )
        .map_err(|e| CliError::Connection(format!("unexpected study document: {e}")))?;
        let run = Arc::new(self.new_study_run(&study)?);
        setups.insert(study_id, run.clone());
        Ok(run)
    }

    fn new_study_run(&self, study: &Study) -> CliResult<StudyRun> {
        let job = study.spec.trial_job.clone().unwrap_or_default();
        // This worker's lists decide, never the server: a study it may not run is refused
        // here, whatever the server allowed.
        let refused = if job.executor.pool().is_none() {
            Some("the study's trial_job is not executor: pool".to_string())
        } else {
            self.policy.check(&job, Role::Operator).err().map(|e| {
                let (message, field) = match e {
                    crate::service::ServiceError::PermissionDenied { message, field } => {
                        (message, field)
                    }
                    other => (other.to_string(), None),
                };
                // The policy speaks as the server it usually serves.
                let message = message.replace("this server", "this worker");
                format!(
                    "its own allow-lists (--job-commands {:?}, --job-images {:?}) refuse {}: \
                     {message}",
                    self.options.job_commands,
                    self.options.job_images,
                    field.as_deref().unwrap_or("the job"),
                )
            })
        };
        let key = StudyKey {
            id: study.id,
            created_at: study.created_at,
        };
        let study_dir = match (&self.options.output_dir, &job.output_dir) {
            (Some(base), _) => StudyDir::below(base.clone(), key, job.output_layout),
            (None, Some(dir)) => StudyDir::below(PathBuf::from(dir), key, job.output_layout),
            (None, None) => StudyDir::below(
                std::env::current_dir()
                    .map_err(|e| CliError::Usage(format!("the current directory: {e}")))?
                    .join("augur-runs"),
                key,
                OutputLayout::Study,
            ),
        };
        let executor = executor_for(&job, &self.context)
            .map_err(|e| CliError::Dispatch(DispatchError::Executor(e)))?;
        let reporter = Arc::new(HttpReporter::new(self.client.clone(), study.id));
        let setup = Arc::new(TrialSetup {
            study_id: study.id,
            study_created_at: study.created_at,
            metric_pattern: TrialSetup::metric_pattern(&job)?,
            job,
            metric_ids: study.spec.metrics.iter().map(|m| m.id.clone()).collect(),
            early_stopping: study.spec.early_stopping.is_some(),
            fidelity: study.spec.validate().ok().and_then(|c| c.fidelity),
            augur_url: self.client.base().to_string(),
            base_env: self.base_env.clone(),
            study_dir,
            executor,
            reporter: reporter.clone(),
        });
        Ok(StudyRun {
            setup,
            reporter,
            lease: Duration::from_secs(study.spec.trial_lease_secs.max(3) as u64),
            refused,
        })
    }
}

/// Changes of the busy count within this long go in one report: short trials would
/// otherwise send two reports each, writes that compete with the trials' own.
const REPORT_COALESCE: Duration = Duration::from_millis(500);

/// The worker's reports: soon after its busy count changes, and every few seconds.
async fn report_loop(worker: Arc<Worker>) {
    loop {
        tokio::select! {
            _ = worker.changed.notified() => tokio::time::sleep(REPORT_COALESCE).await,
            _ = tokio::time::sleep(Duration::from_secs(WORKER_REPORT_EVERY_SECS)) => {}
        }
        if let Err(error) = worker.report().await {
            tracing::warn!(%error, "could not report to the pool");
        }
    }
}

/// One slot: lease the pool's next trial, run it, repeat until interrupted.
async fn run_slot(
    worker: Arc<Worker>,
    slot: u32,
    mut interrupt: watch::Receiver<Interrupt>,
) -> CliResult<()> {
    let path = worker.path("/lease");
    // The first ask resumes what this slot held before a restart (same --client-id).
    let mut resume = true;
    loop {
        if *interrupt.borrow() != Interrupt::None {
            return Ok(());
        }
        let body = json!({"slot": slot, "wait_secs": LEASE_WAIT_SECS, "resume": resume});
        let answer = tokio::select! {
            answer = worker.client.call(Method::POST, &path, Some(&body)) => answer?,
            _ = interrupt.changed() => return Ok(()),
        };
        resume = false;
        if answer["lease"].is_null() {
            continue;
        }
        let lease: PoolLease = serde_json::from_value(answer["lease"].clone())
            .map_err(|e| CliError::Connection(format!("unexpected lease: {e}")))?;
        worker.set_busy(1);
        let ended = run_leased(&worker, slot, lease, interrupt.clone()).await;
        worker.set_busy(-1);
        ended?;
        if interrupt.has_changed().unwrap_or(true)
            || *interrupt.borrow_and_update() != Interrupt::None
        {
            return Ok(());
        }
    }
}

/// Run one leased trial to its end (or fail it when this worker may not run it).
async fn run_leased(
    worker: &Worker,
    slot: u32,
    lease: PoolLease,
    interrupt: watch::Receiver<Interrupt>,
) -> CliResult<()> {
    let (study_id, trial_id) = (lease.study_id, lease.trial.id);
    let run = worker.study_run(study_id).await?;
    run.reporter
        .lease(trial_id, &lease.token, lease.trial.attempts);
    let client = run.reporter.client_for(trial_id);
    if let Some(why) = &run.refused {
        let reason = format!(
            "pool worker {} does not run this study's trials: {why}",
            worker.options.client_id
        );
        eprintln!("study {study_id} trial {trial_id}: refused: {reason}");
        let path = format!("/v1/studies/{study_id}/trials/{trial_id}/fail");
        let outcome = client
            .call_status(Method::POST, &path, Some(&json!({"reason": reason})))
            .await;
        run.reporter.end_lease(trial_id);
        return outcome.map(drop);
    }
    let trial = DispatchedTrial {
        id: trial_id,
        parameters: lease.trial.parameters.clone(),
        attempts: lease.trial.attempts,
        budget: lease.trial.budget,
        copy_from: lease.trial.lineage.as_ref().and_then(|l| l.copying_from),
    };
    let end = run_pulled_trial(&run.setup, trial, client, run.lease, interrupt).await;
    run.reporter.end_lease(trial_id);
    eprintln!("slot {slot}: study {study_id} trial {trial_id}: {end:?}");
    Ok(())
}

/// A worker id as one path segment.
fn urlencoding(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
