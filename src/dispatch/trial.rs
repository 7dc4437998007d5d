//! Running one trial to its end: directories and environment (DESIGN §4), attempts with
//! retries, metrics from stdout and the hypertune file, timeouts, early stopping, and the
//! outcome reported back. Used by the study runner (in-process) and `augur worker` (HTTP).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use regex::Regex;
use tokio::sync::{mpsc, watch};

use super::collect::{StdoutMetrics, parse_hypertune};
use super::executor::{Executor, JobExit, JobRequest};
use crate::model::job::DEFAULT_METRIC_REGEX;
use crate::model::{Measurement, TrialJobSpec};

/// How long a job asked to stop gets before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often new measurements (stdout lines, the hypertune file) are recorded and the
/// early-stopping rule asked. Those a job reports in its last moments are recorded with its
/// completion, in one step: a trivial trial costs one commit less.
const POLL: Duration = Duration::from_millis(250);

/// Where a trial's outcome goes: the service in-process, or the HTTP API.
#[async_trait]
pub trait TrialReporter: Send + Sync {
    async fn measurement(&self, trial_id: i64, measurement: Measurement) -> Result<(), String>;
    /// Record `last` (measurements not reported yet), then complete from all the trial's
    /// measurements (`measurement_selection`). `Ok(false)` when there is none to select.
    async fn complete_with(&self, trial_id: i64, last: Vec<Measurement>) -> Result<bool, String>;
    async fn fail(&self, trial_id: i64, reason: String) -> Result<(), String>;
    async fn should_stop(&self, trial_id: i64) -> Result<bool, String>;
    /// Whether the trial already finished (the job completed it over HTTP).
    async fn finished(&self, trial_id: i64) -> Result<bool, String>;
    /// Charge one launch against the trial's `max_attempts` before it starts (durably, where
    /// the reporter can) and issue the token it reports with. `Ok(None)`: none left.
    async fn start_attempt(
        &self,
        trial_id: i64,
        max_attempts: u32,
    ) -> Result<Option<AttemptStart>, String>;
    /// Give back a launch that this side ended itself (shutdown, or a leftover job killed
    /// after a restart): it says nothing about the trial.
    async fn refund_attempt(&self, trial_id: i64) -> Result<(), String>;
}

/// A launch, counted.
pub struct AttemptStart {
    /// 1 for the first launch that counts.
    pub number: u32,
    /// `AUGUR_TRIAL_TOKEN` for this launch.
    pub token: Option<String>,
}

/// What stops a running trial from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    None,
    /// The study was stopped or deleted: kill the job and fail the trial.
    Cancel,
    /// The process is shutting down: kill the job, leave the trial to be resumed.
    Shutdown,
}

/// Everything fixed for a study's trials.
pub struct TrialSetup {
    pub study_id: i64,
    pub job: TrialJobSpec,
    pub metric_ids: Vec<String>,
    pub early_stopping: bool,
    pub augur_url: String,
    /// What every job's environment starts from (see `dispatch::job_base_env`).
    pub base_env: Vec<(String, String)>,
    /// Base of the per-trial directories.
    pub output_dir: PathBuf,
    pub executor: Arc<dyn Executor>,
    pub reporter: Arc<dyn TrialReporter>,
    /// `metric_regex` (or the default), compiled once for all trials.
    pub metric_pattern: Result<Regex, String>,
}

impl TrialSetup {
    /// The stdout metric pattern of a job, for `metric_pattern`.
    pub fn metric_pattern(job: &TrialJobSpec) -> Result<Regex, String> {
        Regex::new(job.metric_regex.as_deref().unwrap_or(DEFAULT_METRIC_REGEX))
            .map_err(|e| format!("metric_regex: {e}"))
    }
}

/// The per-trial paths of DESIGN §4.
#[derive(Clone)]
pub struct TrialDirs {
    pub root: PathBuf,
    pub model: PathBuf,
    pub checkpoints: PathBuf,
    pub logs: PathBuf,
    pub metric_file: PathBuf,
    pub params_file: PathBuf,
    pub job_log: PathBuf,
}

impl TrialDirs {
    pub fn new(output_dir: &Path, trial_id: i64) -> TrialDirs {
        let root = output_dir.join(trial_id.to_string());
        TrialDirs {
            model: root.join("model"),
            checkpoints: root.join("checkpoints"),
            logs: root.join("logs"),
            // In the root, not a directory of its own: each new inode is paid for on the
            // way from a freed slot to the next job (see benches/dispatch.rs).
            metric_file: root.join("output.metrics"),
            params_file: root.join("params.json"),
            job_log: root.join("job.log"),
            root,
        }
    }

    /// Create the directories, and the params file when the command uses one.
    fn create(&self, params_json: Option<String>) -> Result<(), String> {
        for dir in [&self.model, &self.checkpoints, &self.logs] {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        if let Some(json) = params_json {
            std::fs::write(&self.params_file, json)
                .map_err(|e| format!("cannot write {}: {e}", self.params_file.display()))?;
        }
        Ok(())
    }
}

/// The path as the job sees it, with a trailing slash as Vertex AI gives directories.
fn dir_env(p: &Path) -> String {
    let s = p.display().to_string();
    if s.ends_with('/') { s } else { format!("{s}/") }
}

/// How a trial's run ended, for the caller's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrialEnd {
    Completed,
    Failed(String),
    EarlyStopped,
    /// Interrupted by shutdown: left active, to be resumed.
    Abandoned,
}

/// Run `trial_id` with `parameters` until it completes, fails for good, or is interrupted.
/// `first`: its first launch, when already counted (the study runner counts it with the
/// suggestion).
pub async fn run_trial(
    setup: Arc<TrialSetup>,
    trial_id: i64,
    parameters: augur_optimizer::Assignment,
    mut first: Option<AttemptStart>,
    mut interrupt: watch::Receiver<Interrupt>,
) -> TrialEnd {
    let reporter = setup.reporter.clone();
    let dirs = TrialDirs::new(&setup.output_dir, trial_id);
    // `job.handle` is non-empty only while a launch's outcome is unrecorded: the service or
    // worker stopped (or died) during the launch, or before the trial's completion was
    // stored. That job must not run beside the new one, and its launch is given back: it
    // ended with the service (killed now, at shutdown, or by its broken stdout pipe) or its
    // outcome was lost with it, so it says nothing about the trial. Seen failures stay
    // counted.
    let handle_file = dirs.root.join("job.handle");
    let interrupted = match std::fs::read_to_string(&handle_file) {
        Ok(handle) if !handle.trim().is_empty() => {
            setup
                .executor
                .clean_up_stale(handle.trim(), setup.study_id, trial_id)
                .await;
            // Cleared before the refund: a crash between the two over-counts, never
            // under-counts.
            let _ = std::fs::write(&handle_file, "");
            true
        }
        // A resumed trial that never got as far as a job: the service died between counting
        // its first launch (with the suggestion) and starting it.
        Err(e) => first.is_none() && e.kind() == std::io::ErrorKind::NotFound,
        Ok(_) => false,
    };
    if interrupted && let Err(e) = reporter.refund_attempt(trial_id).await {
        tracing::warn!(trial_id, error = %e, "could not give back an interrupted launch");
    }
    // Directories are made on a blocking thread (a mkdir can take a millisecond), meanwhile
    // a resumed trial's launch is counted; only a command that names `${params_file}` gets
    // the file.
    let params_json = setup
        .job
        .command
        .iter()
        .any(|a| a.contains("${params_file}"))
        .then(|| serde_json::to_string_pretty(&parameters).unwrap_or_else(|_| "{}".into()));
    let mut prepared = Some({
        let dirs = dirs.clone();
        tokio::task::spawn_blocking(move || dirs.create(params_json))
    });
    let argv = setup.job.render_argv(
        &parameters,
        trial_id,
        &dirs.params_file.display().to_string(),
    );
    // Later entries win: the spec's `env` over the inherited, Augur's own over both.
    let mut env: Vec<(String, String)> = setup.base_env.clone();
    env.extend(setup.job.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend([
        ("AUGUR_URL".to_string(), setup.augur_url.clone()),
        ("AUGUR_STUDY_ID".to_string(), setup.study_id.to_string()),
        ("AUGUR_TRIAL_ID".to_string(), trial_id.to_string()),
        ("CLOUD_ML_TRIAL_ID".to_string(), trial_id.to_string()),
        (
            "CLOUD_ML_HP_METRIC_FILE".to_string(),
            dirs.metric_file.display().to_string(),
        ),
        ("AIP_MODEL_DIR".to_string(), dir_env(&dirs.model)),
        ("AIP_CHECKPOINT_DIR".to_string(), dir_env(&dirs.checkpoints)),
        ("AIP_TENSORBOARD_LOG_DIR".to_string(), dir_env(&dirs.logs)),
    ]);
    let timeout = setup.job.timeout_secs.map(Duration::from_secs);
    let max_attempts = setup.job.max_retries + 1;
    let mut last_failure = String::new();
    loop {
        // Counted durably before the launch, so that a restart does not renew the retries.
        let counted = match first.take() {
            Some(start) => Ok(Some(start)),
            None => reporter.start_attempt(trial_id, max_attempts).await,
        };
        let start = match counted {
            Ok(Some(start)) => start,
            Ok(None) => break,
            Err(e) => {
                return give_up(&*reporter, trial_id, format!("cannot count attempts: {e}")).await;
            }
        };
        if let Some(task) = prepared.take() {
            let made = task
                .await
                .unwrap_or_else(|e| Err(format!("directory task: {e}")));
            if let Err(why) = made {
                return give_up(&*reporter, trial_id, why).await;
            }
        }
        let start_number = start.number;
        let mut env = env.clone();
        if let Some(token) = start.token {
            env.push(("AUGUR_TRIAL_TOKEN".to_string(), token));
        }
        let request = JobRequest {
            study_id: setup.study_id,
            trial_id,
            attempt: start_number,
            argv: argv.clone(),
            env,
            workdir: setup.job.workdir.as_ref().map(PathBuf::from),
            log_path: dirs.job_log.clone(),
        };
        let (outcome, mut last) =
            run_attempt(&setup, &request, &dirs, timeout, &mut interrupt).await;
        let completes = match &outcome {
            Attempt::EarlyStopped => true,
            Attempt::Ended(exit) => exit.success(),
            _ => false,
        };
        if !completes {
            for m in last.drain(..) {
                report(&*reporter, trial_id, m).await;
            }
        }
        match outcome {
            // `job.handle` stays: the resumed trial gives this launch back.
            Attempt::Interrupted(Interrupt::Shutdown) => return TrialEnd::Abandoned,
            Attempt::Interrupted(_) => {
                return give_up(
                    &*reporter,
                    trial_id,
                    "cancelled: the study was stopped".into(),
                )
                .await;
            }
            Attempt::EarlyStopped => {
                return match reporter.complete_with(trial_id, last).await {
                    Ok(true) => TrialEnd::EarlyStopped,
                    Ok(false) => {
                        give_up(
                            &*reporter,
                            trial_id,
                            "stopped early without a measurement".into(),
                        )
                        .await
                    }
                    Err(e) => TrialEnd::Failed(e),
                };
            }
            Attempt::LaunchFailed(why) => return give_up(&*reporter, trial_id, why).await,
            Attempt::Ended(exit) => {
                // A success needs no look first: completing a trial the job already finished
                // over HTTP answers "conflict", taken as done.
                if !exit.success()
                    && let Ok(true) = reporter.finished(trial_id).await
                {
                    return TrialEnd::Completed;
                }
                if exit.success() {
                    return match reporter.complete_with(trial_id, last).await {
                        Ok(true) => TrialEnd::Completed,
                        Ok(false) => {
                            give_up(&*reporter, trial_id, "no metric reported".into()).await
                        }
                        Err(e) => TrialEnd::Failed(e),
                    };
                }
                last_failure = exit.describe();
            }
            Attempt::TimedOut(secs) => last_failure = format!("timed out after {secs} s"),
        }
        tracing::warn!(study_id = setup.study_id, trial_id, attempt = start_number, reason = %last_failure, "trial attempt failed");
        // This launch's failure is seen, and stays counted. (A launch that finished the
        // trial keeps its handle: a finished trial is not resumed. Until its outcome is
        // recorded, a restart gives the launch back and runs it again.) Emptied, not
        // removed: an unlink now and a create next launch cost two inode updates.
        let _ = std::fs::write(&handle_file, "");
    }
    let reason = if last_failure.is_empty() {
        // Every attempt was used up before a restart of the service.
        format!("all {max_attempts} attempt(s) failed before the service restarted")
    } else {
        format!("{last_failure} (after {max_attempts} attempt(s))")
    };
    give_up(&*reporter, trial_id, reason).await
}

async fn give_up(reporter: &dyn TrialReporter, trial_id: i64, reason: String) -> TrialEnd {
    if let Err(e) = reporter.fail(trial_id, reason.clone()).await {
        tracing::warn!(trial_id, error = %e, "could not mark the trial failed");
    }
    TrialEnd::Failed(reason)
}

enum Attempt {
    Ended(JobExit),
    TimedOut(u64),
    EarlyStopped,
    Interrupted(Interrupt),
    LaunchFailed(String),
}

/// One launch, to its end. Also returns the measurements read but not recorded yet (those
/// since the last `POLL`), for the caller to record with the outcome.
async fn run_attempt(
    setup: &TrialSetup,
    request: &JobRequest,
    dirs: &TrialDirs,
    timeout: Option<Duration>,
    interrupt: &mut watch::Receiver<Interrupt>,
) -> (Attempt, Vec<Measurement>) {
    let (stdout_tx, mut stdout_rx) = mpsc::unbounded_channel::<String>();
    let mut job = match setup.executor.launch(request, stdout_tx).await {
        Ok(job) => job,
        Err(e) => return (Attempt::LaunchFailed(e.to_string()), Vec::new()),
    };
    // Remember the job so that a restarted service can kill a leftover (see runner.rs).
    let _ = std::fs::write(dirs.root.join("job.handle"), job.handle());
    let mut stdout_metrics = match &setup.metric_pattern {
        Ok(p) => StdoutMetrics::with_pattern(p.clone(), setup.metric_ids.clone()),
        Err(e) => {
            job.stop(STOP_GRACE).await;
            return (Attempt::LaunchFailed(e.clone()), Vec::new());
        }
    };
    let mut hypertune = HypertuneTail::new(dirs.metric_file.clone(), setup.metric_ids.clone());
    let trial_id = request.trial_id;
    let reporter = &setup.reporter;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut poll = tokio::time::interval(POLL);
    let mut unrecorded: Vec<Measurement> = Vec::new();
    let mut stdout_open = true;
    let result = loop {
        tokio::select! {
            exit = job.wait() => break Attempt::Ended(exit),
            line = stdout_rx.recv(), if stdout_open => match line {
                Some(line) => unrecorded.extend(stdout_metrics.parse_line(&line)),
                None => stdout_open = false,
            },
            _ = poll.tick() => {
                unrecorded.extend(hypertune.read_new());
                if unrecorded.is_empty() {
                    continue;
                }
                for m in unrecorded.drain(..) {
                    report(&**reporter, trial_id, m).await;
                }
                if setup.early_stopping && let Ok(true) = reporter.should_stop(trial_id).await {
                    job.stop(STOP_GRACE).await;
                    break Attempt::EarlyStopped;
                }
            }
            _ = sleep_until(deadline) => {
                job.stop(STOP_GRACE).await;
                break Attempt::TimedOut(timeout.map_or(0, |t| t.as_secs()));
            }
            changed = interrupt.changed() => {
                let what = if changed.is_ok() { *interrupt.borrow() } else { Interrupt::Shutdown };
                if what != Interrupt::None {
                    job.stop(STOP_GRACE).await;
                    break Attempt::Interrupted(what);
                }
            }
        }
    };
    // Whatever the job printed or wrote last still counts.
    while let Ok(line) = stdout_rx.try_recv() {
        unrecorded.extend(stdout_metrics.parse_line(&line));
    }
    unrecorded.extend(hypertune.read_new());
    (result, unrecorded)
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn report(reporter: &dyn TrialReporter, trial_id: i64, m: Measurement) {
    if let Err(e) = reporter.measurement(trial_id, m).await {
        tracing::warn!(trial_id, error = %e, "could not record a measurement");
    }
}

/// Follows the hypertune file: it is rewritten whole on every report, so it is re-read
/// when it changed and only measurements not yet reported (or changed) are returned.
struct HypertuneTail {
    path: PathBuf,
    metric_ids: Vec<String>,
    last_text: String,
    reported: BTreeMap<i64, BTreeMap<String, u64>>,
}

impl HypertuneTail {
    fn new(path: PathBuf, metric_ids: Vec<String>) -> Self {
        Self {
            path,
            metric_ids,
            last_text: String::new(),
            reported: BTreeMap::new(),
        }
    }

    fn read_new(&mut self) -> Vec<Measurement> {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return Vec::new();
        };
        if text == self.last_text {
            return Vec::new();
        }
        let measurements = parse_hypertune(&text, &self.metric_ids);
        self.last_text = text;
        measurements
            .into_iter()
            .filter(|m| {
                let bits: BTreeMap<String, u64> = m
                    .metrics
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_bits()))
                    .collect();
                if self.reported.get(&m.step) == Some(&bits) {
                    return false;
                }
                self.reported.insert(m.step, bits);
                true
            })
            .collect()
    }
}
