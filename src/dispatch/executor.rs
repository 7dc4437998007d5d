//! The executor interface: how a trial's command is started somewhere (a local process, a
//! Slurm job) and watched until it ends. A new executor implements [`Executor`] and gets
//! its arm in [`executor_for`], the one place a `trial_job.executor` is turned into one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::local::{LocalExecutor, RunAs};
use super::slurm::SlurmExecutor;
use crate::model::{ExecutorName, TrialJobSpec};

/// One run (attempt) of a trial's job.
#[derive(Debug, Clone)]
pub struct JobRequest {
    pub study_id: i64,
    pub trial_id: i64,
    pub attempt: u32,
    /// Program and arguments; never passed through a shell.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<PathBuf>,
    /// stdout and stderr of every attempt are appended here.
    pub log_path: PathBuf,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobExit {
    Exited(i32),
    /// Killed by a signal we did not send.
    Signaled(i32),
    /// The executor lost track of it (node failure, job vanished).
    Lost(String),
}

impl JobExit {
    pub fn success(&self) -> bool {
        *self == JobExit::Exited(0)
    }

    pub fn describe(&self) -> String {
        match self {
            JobExit::Exited(code) => format!("exited with code {code}"),
            JobExit::Signaled(sig) => format!("killed by signal {sig}"),
            JobExit::Lost(why) => format!("lost: {why}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("could not start the job: {0}")]
    Launch(String),
    /// A command the executor runs (`sbatch`, `scontrol`, …) failed or could not start.
    #[error("{program}: {message}")]
    Command { program: String, message: String },
    #[error("the {0} executor is not available in this build")]
    Unavailable(&'static str),
}

/// The executor a study's trial job names. Exhaustive: a new executor must be added here,
/// never silently run as another.
/// Local jobs run as `run_as` when given (`--run-jobs-as`).
pub fn executor_for(
    job: &TrialJobSpec,
    run_as: Option<&RunAs>,
) -> Result<Arc<dyn Executor>, ExecutorError> {
    match job.executor {
        ExecutorName::Local => Ok(Arc::new(LocalExecutor {
            run_as: run_as.cloned(),
        })),
        ExecutorName::Slurm => Ok(Arc::new(SlurmExecutor::new(
            job.slurm.clone().unwrap_or_default(),
        ))),
        // Refused by validation; a study stored by a newer version could still name it.
        ExecutorName::Kubernetes => Err(ExecutorError::Unavailable("kubernetes")),
    }
}

#[async_trait]
pub trait Executor: Send + Sync {
    /// Start the job. Each line it prints on stdout is sent to `stdout_lines`; the channel
    /// closes once the job's output is fully read.
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError>;

    /// Kill a job left by an earlier run of the service (`handle` as `RunningJob::handle`
    /// gave it) for this trial, so that a resumed trial never runs twice.
    async fn clean_up_stale(&self, handle: &str, study_id: i64, trial_id: i64);
}

#[async_trait]
pub trait RunningJob: Send {
    /// What identifies the job to its executor (process group id, Slurm job id).
    fn handle(&self) -> String;
    /// Wait until the job ends (cancel-safe: may be dropped and called again).
    async fn wait(&mut self) -> JobExit;
    /// Ask the job to stop (SIGTERM to the process group, `scancel`), wait up to `grace`
    /// for it to end, then kill it outright. Returns once it is gone.
    async fn stop(&mut self, grace: Duration);
}
