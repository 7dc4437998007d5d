//! Running one trial to its end: its directories and environment (DESIGN §4), a leftover job
//! of an earlier run of the service cleaned up, attempts counted and retried, and the
//! outcome reported. One attempt's life (metrics, timeout, early stopping) is `attempt.rs`.
//! Used by the study runner (in-process) and `augur worker` (over HTTP).

use super::handle::JobHandle;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use tokio::sync::watch;

use super::attempt::{Attempt, run_attempt};
use super::checkpoint;
use super::cluster::ClusterLayout;
use super::environment::{TrialIdentity, trial_env};
use super::error::{DispatchError, DispatchResult};
use super::executor::{Executor, JobRequest, ReplicaRequest};
use super::reporter::{AttemptStart, TrialReporter};
use crate::model::job::DEFAULT_METRIC_REGEX;
use crate::model::job::value_text;
use crate::model::spec::FidelityConfig;
use crate::model::{Measurement, StudyDir, StudyId, TrialDirs, TrialId, TrialJobSpec};
use crate::service::DispatchedTrial;
use crate::service::trial_files::{self, DirOwner, FileAccess};

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
    pub study_id: StudyId,
    /// When the study was made (`model::StudyKey`).
    pub study_created_at: chrono::DateTime<chrono::Utc>,
    pub job: TrialJobSpec,
    pub metric_ids: Vec<String>,
    pub early_stopping: bool,
    pub augur_url: String,
    /// What every job's environment starts from (see `environment::job_base_env`).
    pub base_env: Vec<(String, String)>,
    /// Where the per-trial directories are.
    pub study_dir: StudyDir,
    pub executor: Arc<dyn Executor>,
    pub reporter: Arc<dyn TrialReporter>,
    /// `metric_regex` (or the default), compiled once for all trials.
    pub metric_pattern: Regex,
    /// Multi-fidelity: the argument that takes each attempt's budget.
    pub fidelity: Option<FidelityConfig>,
}

impl TrialSetup {
    /// The stdout metric pattern of a job, for `metric_pattern`.
    pub fn metric_pattern(job: &TrialJobSpec) -> DispatchResult<Regex> {
        Ok(Regex::new(
            job.metric_regex.as_deref().unwrap_or(DEFAULT_METRIC_REGEX),
        )?)
    }
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

/// Write the trial's `job.handle` (`TrialDirs::handle_file`), never through a link, on a
/// blocking thread (file IO stays off the async workers). Replaced whole, in one step: an
/// empty handle means a launch whose failure was counted, so a service killed while
/// writing must not leave one (it would take the launch it was recording for a failure).
pub(super) async fn write_handle(dirs: &TrialDirs, handle: String) -> std::io::Result<()> {
    let (base, path) = (dirs.base.clone(), dirs.handle_file());
    tokio::task::spawn_blocking(move || {
        trial_files::replace_file(&base, &path, handle.as_bytes(), 0o644)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Remove the trial's `job.handle` (a link is removed, not followed), on a blocking thread.
async fn remove_handle(dirs: &TrialDirs) {
    let path = dirs.handle_file();
    let removed = tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await;
    if let Ok(Err(e)) = removed
        && !trial_files::is_missing(&e)
    {
        tracing::warn!(error = %e, "could not remove a finished attempt's job handle");
    }
}

/// The trial's `job.handle`, read on a blocking thread, never through a link.
async fn read_handle(dirs: &TrialDirs) -> std::io::Result<String> {
    let (base, path) = (dirs.base.clone(), dirs.handle_file());
    tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        trial_files::open_file(&base, &path, FileAccess::Read)
            .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
            .map(|_| text)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Run `trial` with its values until it completes, fails for good, or is interrupted: at its
/// budget (a multi-fidelity attempt's; `None`: the full budget), after copying the
/// checkpoint PBT gave it. `first`: its first launch, when already counted (the study
/// runner counts it with the suggestion).
pub async fn run_trial(
    setup: Arc<TrialSetup>,
    trial: DispatchedTrial,
    mut first: Option<AttemptStart>,
    mut interrupt: watch::Receiver<Interrupt>,
) -> TrialEnd {
    let DispatchedTrial {
        id: trial_id,
        mut parameters,
        budget,
        mut copy_from,
        ..
    } = trial;
    // The budget reaches the trainer as its argument (rendered like the values, and in the
    // params file) and as AUGUR_BUDGET.
    let budget = setup
        .fidelity
        .as_ref()
        .map(|f| value_text(&f.add_to(&mut parameters, budget)));
    let reporter = setup.reporter.clone();
    let dirs = TrialDirs::new(&setup.study_dir, trial_id);
    resume_leftover(&setup, trial_id, &dirs, first.is_none()).await;
    // Directories are made on a blocking thread (a mkdir can take a millisecond), meanwhile
    // a resumed trial's launch is counted.
    let mut prepared = Some(prepare_dirs(&setup, &dirs, &parameters));
    let replicas = replica_requests(&setup.job, &parameters, trial_id, &dirs);
    let identity = TrialIdentity {
        augur_url: &setup.augur_url,
        study_id: setup.study_id,
        trial_id,
        dirs: &dirs,
    };
    let mut env = trial_env(&setup.base_env, &setup.job.env, &identity);
    if let Some(budget) = budget {
        env.push(("AUGUR_BUDGET".to_string(), budget));
    }
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
                let why = format!("cannot count attempts: {e}");
                return give_up(&*reporter, trial_id, why).await;
            }
        };
        if let Some(task) = prepared.take() {
            let made = task
                .await
                .unwrap_or_else(|e| Err(DispatchError::Task(format!("directory task: {e}"))));
            if let Err(why) = made {
                return give_up(&*reporter, trial_id, why.to_string()).await;
            }
        }
        let copy_in_attempt = match copy_for_attempt(&setup, trial_id, &mut copy_from, &dirs).await
        {
            Ok(copy) => copy,
            Err(why) => return give_up(&*reporter, trial_id, why).await,
        };
        let mut request = attempt_request(&setup, trial_id, start, &env, &replicas, &dirs);
        request.copy_checkpoint_from = copy_in_attempt;
        let (outcome, last) = run_attempt(&setup, &request, &dirs, timeout, &mut interrupt).await;
        match settle(&setup, trial_id, outcome, last).await {
            // A multi-fidelity attempt whose result is recorded leaves no handle: the trial
            // may be promoted, and its next launch must look unstarted (no handle) to a
            // restarted service, not finished (an empty one).
            Settled::Ended(TrialEnd::Completed) if setup.fidelity.is_some() => {
                remove_handle(&dirs).await;
                return TrialEnd::Completed;
            }
            Settled::Ended(end) => return end,
            Settled::Retry(why) => last_failure = why,
        }
        tracing::warn!(study_id = %setup.study_id, %trial_id, attempt = request.attempt, reason = %last_failure, "trial attempt failed");
        // This launch's failure is seen, and stays counted. (A launch that finished the
        // trial keeps its handle: a finished trial is not resumed. Until its outcome is
        // recorded, a restart gives the launch back and runs it again.) Emptied, not
        // removed: an unlink now and a create next launch cost two inode updates.
        let _ = write_handle(&dirs, String::new()).await;
    }
    let reason = if last_failure.is_empty() {
        // Every attempt was used up before a restart of the service.
        format!("all {max_attempts} attempt(s) failed before the service restarted")
    } else {
        format!("{last_failure} (after {max_attempts} attempt(s))")
    };
    give_up(&*reporter, trial_id, reason).await
}

/// A launch an earlier run of the service left (its job killed), given back when this is
/// that launch `resumed` (not counted with its suggestion).
async fn resume_leftover(setup: &TrialSetup, trial_id: TrialId, dirs: &TrialDirs, resumed: bool) {
    let interrupted = clean_up_leftover(setup, trial_id, dirs, resumed).await;
    // Only a resumed launch gives one back. A launch counted with its suggestion that finds
    // a handle is a promoted trial's next rung: the handle is its last rung's, which ended
    // and was accounted for.
    if interrupted
        && resumed
        && let Err(e) = setup.reporter.refund_attempt(trial_id).await
    {
        tracing::warn!(%trial_id, error = %e, "could not give back an interrupted launch");
    }
}

/// PBT: the copy of `copy_from`'s checkpoint the next attempt needs. Made here once where
/// the replicas share the trial directories (`copy_from` then emptied); else left to every
/// attempt, where it runs (a failed one may have trained on the copy): returned for its
/// request, and the parent waits until the trial's segment completes.
async fn copy_for_attempt(
    setup: &TrialSetup,
    trial_id: TrialId,
    copy_from: &mut Option<TrialId>,
    dirs: &TrialDirs,
) -> Result<Option<TrialId>, String> {
    if !setup.executor.shares_trial_dirs() {
        return Ok(*copy_from);
    }
    if let Some(parent) = copy_from.take() {
        copy_parent_checkpoint(setup, trial_id, parent, dirs).await?;
    }
    Ok(None)
}

/// PBT: the trial takes `parent`'s checkpoint as its own; the parent waits, paused, until
/// the copy is reported made.
async fn copy_parent_checkpoint(
    setup: &TrialSetup,
    trial_id: TrialId,
    parent: TrialId,
    dirs: &TrialDirs,
) -> Result<(), String> {
    checkpoint::copy_from_parent(&setup.study_dir, parent, dirs)
        .await
        .map_err(|e| format!("cannot copy trial {parent}'s checkpoint: {e}"))?;
    setup
        .reporter
        .checkpoint_copied(trial_id)
        .await
        .map_err(|e| format!("cannot record the checkpoint copied from trial {parent}: {e}"))
}

/// What the executor launches for one attempt: the trial's replicas with its environment
/// and this launch's own token.
fn attempt_request(
    setup: &TrialSetup,
    trial_id: TrialId,
    start: AttemptStart,
    env: &[(String, String)],
    replicas: &[ReplicaRequest],
    dirs: &TrialDirs,
) -> JobRequest {
    let mut env = env.to_vec();
    if let Some(token) = start.token {
        env.push(("AUGUR_TRIAL_TOKEN".to_string(), token));
    }
    JobRequest {
        study_id: setup.study_id,
        study_created_at: setup.study_created_at,
        trial_id,
        attempt: start.number,
        env,
        workdir: setup.job.workdir.as_ref().map(PathBuf::from),
        trial_dir: dirs.root.clone(),
        output_base: dirs.base.clone(),
        replicas: replicas.to_vec(),
        cluster: setup
            .job
            .is_cluster()
            .then(|| ClusterLayout::of(&setup.job)),
        copy_checkpoint_from: None,
    }
}

/// Every replica of the trial's cluster (one, without `worker_pools`), with its command
/// rendered for these values, its pool's environment, its resources and its log.
pub fn replica_requests(
    job: &TrialJobSpec,
    parameters: &augur_optimizer::Assignment,
    trial_id: TrialId,
    dirs: &TrialDirs,
) -> Vec<ReplicaRequest> {
    let params_file = dirs.params_file.display().to_string();
    job.replicas()
        .into_iter()
        .map(|plan| {
            let mut env: Vec<(String, String)> = plan
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !plan.id.is_primary() {
                let metric_file = dirs.replica_metric_file(plan.id);
                env.push((
                    "CLOUD_ML_HP_METRIC_FILE".to_string(),
                    metric_file.display().to_string(),
                ));
            }
            ReplicaRequest {
                id: plan.id,
                argv: job.render_command(
                    plan.command,
                    plan.args,
                    parameters,
                    trial_id,
                    &params_file,
                ),
                env,
                resources: plan.resources.cloned().unwrap_or_default(),
                image: plan.image.map(str::to_string),
                log_path: dirs.replica_log(plan.id),
            }
        })
        .collect()
}

/// Kill a job an earlier run of the service left for this trial, if any. True when a launch
/// must be given back: one whose outcome was never recorded (the service stopped or died
/// during it, or before the trial's completion was stored: it ended with the service,
/// killed now, at shutdown, or by its broken stdout pipe, and says nothing about the
/// trial), or, for a resumed trial (`resumed`) with no handle at all, the first launch
/// counted with its suggestion but never started. Seen failures stay counted.
async fn clean_up_leftover(
    setup: &TrialSetup,
    trial_id: TrialId,
    dirs: &TrialDirs,
    resumed: bool,
) -> bool {
    match read_handle(dirs).await {
        Ok(handle) if !handle.trim().is_empty() => {
            match handle.trim().parse::<JobHandle>() {
                Ok(handle) => {
                    setup
                        .executor
                        .clean_up_stale(&handle, setup.study_id, trial_id)
                        .await;
                }
                Err(e) => {
                    tracing::warn!(study_id = %setup.study_id, %trial_id, error = %e, "leftover job not looked for");
                }
            }
            // Cleared before the refund: a crash between the two over-counts, never
            // under-counts.
            let _ = write_handle(dirs, String::new()).await;
            true
        }
        Err(e) => resumed && trial_files::is_missing(&e),
        Ok(_) => false,
    }
}

/// Make the trial's directories on a blocking thread, and the params file only for a
/// command that names `${params_file}`.
fn prepare_dirs(
    setup: &TrialSetup,
    dirs: &TrialDirs,
    parameters: &augur_optimizer::Assignment,
) -> tokio::task::JoinHandle<DispatchResult<()>> {
    let params_json = setup
        .job
        .uses_params_file()
        .then(|| serde_json::to_string_pretty(parameters).unwrap_or_else(|_| "{}".into()));
    let (dirs, cluster) = (dirs.clone(), setup.job.is_cluster());
    tokio::task::spawn_blocking(move || create_dirs(&dirs, params_json, cluster))
}

/// Create the trial's directories (a cluster's `replicas/` too), and its params file when
/// given. Each is made from the one above it without following links; one that exists must
/// be what the server made (`trial_files`): a trial directory planted by a job, or another
/// user's, is refused, and the trial fails saying so.
fn create_dirs(dirs: &TrialDirs, params_json: Option<String>, cluster: bool) -> DispatchResult<()> {
    let base = &dirs.base;
    trial_files::open_dir(base, &dirs.root, DirOwner::Server, true)
        .map_err(DispatchError::Directories)?;
    for dir in [&dirs.model, &dirs.checkpoints, &dirs.logs] {
        trial_files::open_dir(base, dir, DirOwner::Jobs, true)
            .map_err(DispatchError::Directories)?;
    }
    if cluster {
        trial_files::open_dir(base, &dirs.replicas_dir(), DirOwner::Server, true)
            .map_err(DispatchError::Directories)?;
    }
    if let Some(json) = params_json {
        use std::io::Write;
        trial_files::open_file(base, &dirs.params_file, FileAccess::Rewrite(0o644))
            .and_then(|mut f| f.write_all(json.as_bytes()))
            .map_err(DispatchError::Directories)?;
    }
    Ok(())
}

/// What an attempt's outcome means for the trial.
enum Settled {
    /// The trial ended (or was left to be resumed).
    Ended(TrialEnd),
    /// The attempt failed for this reason; another may follow.
    Retry(String),
}

/// Record an attempt's outcome: complete, fail, leave for resumption, or ask for a retry.
async fn settle(
    setup: &TrialSetup,
    trial_id: TrialId,
    outcome: Attempt,
    mut last: Vec<Measurement>,
) -> Settled {
    let reporter = &*setup.reporter;
    let completes = match &outcome {
        Attempt::EarlyStopped => true,
        Attempt::Ended(exit) => exit.success(),
        _ => false,
    };
    if !completes {
        for m in last.drain(..) {
            super::attempt::report(reporter, trial_id, m).await;
        }
    }
    let end = match outcome {
        // `job.handle` stays: the resumed trial gives this launch back.
        Attempt::Interrupted(Interrupt::Shutdown) => TrialEnd::Abandoned,
        Attempt::Interrupted(_) => {
            let why = "cancelled: the study was stopped".to_string();
            give_up(reporter, trial_id, why).await
        }
        Attempt::EarlyStopped => match reporter.complete_with(trial_id, last).await {
            Ok(true) => TrialEnd::EarlyStopped,
            Ok(false) => {
                let why = "stopped early without a measurement".to_string();
                give_up(reporter, trial_id, why).await
            }
            Err(e) => TrialEnd::Failed(e.to_string()),
        },
        Attempt::LaunchFailed(why) => give_up(reporter, trial_id, why).await,
        // A success needs no look first: completing a trial the job already finished over
        // HTTP answers "conflict", taken as done.
        Attempt::Ended(exit) if exit.success() => {
            match reporter.complete_with(trial_id, last).await {
                Ok(true) => TrialEnd::Completed,
                Ok(false) => give_up(reporter, trial_id, "no metric reported".into()).await,
                Err(e) => TrialEnd::Failed(e.to_string()),
            }
        }
        Attempt::Ended(exit) => {
            // The job may have completed its trial over HTTP before it failed.
            if let Ok(true) = reporter.finished(trial_id).await {
                return Settled::Ended(TrialEnd::Completed);
            }
            return Settled::Retry(exit.describe());
        }
        Attempt::TimedOut(secs) => return Settled::Retry(format!("timed out after {secs} s")),
    };
    Settled::Ended(end)
}

async fn give_up(reporter: &dyn TrialReporter, trial_id: TrialId, reason: String) -> TrialEnd {
    if let Err(e) = reporter.fail(trial_id, reason.clone()).await {
        tracing::warn!(%trial_id, error = %e, "could not mark the trial failed");
    }
    TrialEnd::Failed(reason)
}
