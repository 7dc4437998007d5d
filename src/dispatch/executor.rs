//! The executor interface: how one attempt of a trial, a cluster of one or more replicas
//! (DESIGN §4.1), is started somewhere (local processes, a Slurm allocation) and watched
//! until it ends. A new executor implements [`Executor`] and gets its arm in
//! [`executor_for`], the one place a `trial_job.executor` is turned into one.

use super::handle::JobHandle;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::cluster::{Address, ClusterLayout, cluster_env};
use super::container::{ContainerEngine, ContainerExecutor};
use super::exec::ExecVia;
use super::gpus::GpuPool;
use super::kubernetes::{KubeConnection, KubernetesExecutor};
use super::local::{LocalExecutor, RunAs};
use super::ports::PortRegistry;
use super::slurm::SlurmExecutor;
use crate::model::{ExecutorSpec, ReplicaId, Resources, StudyId, TrialId, TrialJobSpec};
use crate::service::exec::{ExecRefused, ExecRequest, ExecTarget};

/// One run (attempt) of a trial's job: its replicas, the primary first.
#[derive(Debug, Clone)]
pub struct JobRequest {
    pub study_id: StudyId,
    /// When the study was made: with its id, it names the study's directory
    /// (`model::StudyKey`), which pods compute for themselves.
    pub study_created_at: chrono::DateTime<chrono::Utc>,
    pub trial_id: TrialId,
    pub attempt: u32,
    /// The trial's environment, the same for every replica (DESIGN §4).
    pub env: Vec<(String, String)>,
    pub workdir: Option<PathBuf>,
    /// The trial's directory (`<output_dir>/study-<id>/<trial>`), where its `AIP_*`
    /// directories are: containers mount it at the same path.
    pub trial_dir: PathBuf,
    /// The study's output directory (`StudyDir::base`): the server's files below it (logs,
    /// scripts, env files) are opened from it without following links
    /// (`service::trial_files`).
    pub output_base: PathBuf,
    pub replicas: Vec<ReplicaRequest>,
    /// Every replica's place in it, when the trial is a cluster (`worker_pools` given);
    /// `None` for a plain one-replica trial, which gets no cluster configuration.
    pub cluster: Option<ClusterLayout>,
    /// PBT, for an executor whose replicas do not see the server's trial directories
    /// ([`Executor::shares_trial_dirs`]): the trial whose checkpoint must replace this one's
    /// before the replicas start. Elsewhere the dispatcher made the copy before the launch.
    pub copy_checkpoint_from: Option<TrialId>,
}

/// One replica of an attempt.
#[derive(Debug, Clone)]
pub struct ReplicaRequest {
    pub id: ReplicaId,
    /// Program and arguments; never passed through a shell.
    pub argv: Vec<String>,
    /// Added to the trial's environment (its pool's `env`, its own metric file).
    pub env: Vec<(String, String)>,
    pub resources: Resources,
    /// The image it runs (container and kubernetes executors).
    pub image: Option<String>,
    /// stdout and stderr of every attempt are appended here (the primary's is the trial's
    /// `job.log`).
    pub log_path: PathBuf,
}

impl JobRequest {
    pub fn primary(&self) -> Option<&ReplicaRequest> {
        self.replicas.first()
    }

    /// The whole environment of `replica`: the trial's, its own, and, in a cluster, its place
    /// given where every replica listens. Later entries win.
    pub fn replica_env(
        &self,
        replica: &ReplicaRequest,
        address: &dyn Fn(ReplicaId) -> Address,
    ) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        env.extend(replica.env.iter().cloned());
        if let Some(layout) = &self.cluster {
            env.extend(cluster_env(layout, address, replica.id, self.trial_id));
        }
        env
    }

    /// The header written to a replica's log at each attempt (naming the replica in a
    /// cluster).
    pub fn log_header(&self, replica: &ReplicaRequest) -> String {
        let name = match self.cluster {
            Some(_) => format!(" {}", replica.id.name()),
            None => String::new(),
        };
        format!(
            "=== augur: trial {} attempt {}{name}: {:?}\n",
            self.trial_id, self.attempt, replica.argv
        )
    }
}

/// What executors of this process share: the machine's GPUs, the ports local clusters hold,
/// and the container engine the server is configured with.
#[derive(Clone, Default)]
pub struct ExecutorContext {
    pub gpus: GpuPool,
    pub ports: PortRegistry,
    pub containers: Arc<ContainerEngine>,
    /// The process's Kubernetes client (made on first use).
    pub kubernetes: KubeConnection,
    /// Local replicas run as this user (`--run-jobs-as`), not the server's.
    pub run_as: Option<RunAs>,
    /// The operator's `sbatch` options for every Slurm job (`--slurm-arg`).
    pub slurm_args: Arc<Vec<String>>,
}

/// How an attempt ended: as its primary replica did, or as a replica that failed first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobExit {
    Exited(i32),
    /// Killed by a signal we did not send.
    Signaled(i32),
    /// The executor lost track of it (node failure, job vanished).
    Lost(String),
    /// The platform ended it, for the reason given (OOM-killed, its image could not be
    /// pulled, evicted, past its deadline).
    Failed(String),
    /// A replica other than the primary failed before the primary ended: the attempt fails
    /// (every replica was stopped).
    ReplicaFailed {
        replica: String,
        exit: Box<JobExit>,
    },
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
            JobExit::Failed(why) => why.clone(),
            JobExit::ReplicaFailed { replica, exit } => {
                format!("replica {replica} {}", exit.describe())
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("could not start the job: {0}")]
    Launch(String),
    /// The job's program could not be started.
    #[error("could not start the job: {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// A file of the job's (its log, batch script, environment file) could not be written.
    #[error("could not start the job: {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// No Kubernetes client could be made from the operator's settings.
    #[error("could not start the job: kubernetes: {0}")]
    KubernetesConnect(#[source] std::sync::Arc<super::kubernetes::ConnectError>),
    /// The Kubernetes API refused a call or could not be reached.
    #[error("could not start the job: kubernetes: {what}: {source}")]
    Kubernetes {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A command the executor runs (`sbatch`, `scontrol`, …) failed or could not start.
    #[error("{program}: {message}")]
    Command { program: String, message: String },
    #[error("the {0} executor is not available in this build")]
    Unavailable(&'static str),
}

/// The executor a study's trial job names. Exhaustive: a new executor must be added here,
/// never silently run as another.
pub fn executor_for(
    job: &TrialJobSpec,
    context: &ExecutorContext,
) -> Result<Arc<dyn Executor>, ExecutorError> {
    match &job.executor {
        ExecutorSpec::Local => Ok(Arc::new(LocalExecutor::new(context.clone()))),
        ExecutorSpec::Slurm(options) => Ok(Arc::new(SlurmExecutor::new(
            options.clone(),
            context.slurm_args.clone(),
        ))),
        ExecutorSpec::Kubernetes { .. } => Ok(Arc::new(KubernetesExecutor::new(
            context.kubernetes.clone(),
            job.clone(),
        ))),
        ExecutorSpec::Container { .. } => Ok(Arc::new(ContainerExecutor::new(context.clone()))),
        // Only a pool's worker (`augur worker --pool`) runs these, on its own machine: in a
        // container when the study names an image, else as local processes. The server's
        // dispatcher never takes a pool study (`Service::dispatched_study_ids`).
        ExecutorSpec::Pool(options) if options.image.is_some() => {
            Ok(Arc::new(ContainerExecutor::new(context.clone())))
        }
        ExecutorSpec::Pool(_) => Ok(Arc::new(LocalExecutor::new(context.clone()))),
    }
}

#[async_trait]
pub trait Executor: Send + Sync {
    /// Start every replica of the attempt. Each line the primary prints on stdout is sent
    /// to `stdout_lines` (its metrics are the trial's); the channel closes once its output is
    /// fully read. May wait for resources (GPUs) before starting anything.
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError>;

    /// Whether the replicas use the trial directories the dispatcher makes (on the server's
    /// file system, or one it shares). Kubernetes pods use a volume of their own instead,
    /// so PBT's copy of another trial's checkpoint is made in the pod
    /// ([`JobRequest::copy_checkpoint_from`]).
    fn shares_trial_dirs(&self) -> bool {
        true
    }

    /// Kill a job left by an earlier run of the service (`handle` as `RunningJob::handle`
    /// gave it) for this trial, so that a resumed trial never runs twice. A handle of
    /// another executor's kind is none of its jobs: left alone.
    async fn clean_up_stale(&self, handle: &JobHandle, study_id: StudyId, trial_id: TrialId);

    /// How a session's command reaches `request.replica` of the running attempt `handle`
    /// (as `RunningJob::handle` gave it): the local process that runs it (`dispatch::exec`
    /// starts it), or a session of its own. An executor that cannot reach its replicas
    /// refuses, saying so.
    async fn exec(
        &self,
        handle: &JobHandle,
        target: &ExecTarget,
        request: &ExecRequest,
    ) -> Result<ExecVia, ExecRefused> {
        let _ = (handle, target, request);
        Err(super::exec::refused(
            "this executor cannot open a session in its trials' replicas",
        ))
    }
}

#[async_trait]
pub trait RunningJob: Send {
    /// What identifies the attempt to its executor (process groups, Slurm job id).
    fn handle(&self) -> JobHandle;
    /// Wait until the attempt ends: the primary exited (the other replicas are then
    /// stopped), or another replica failed first (all are stopped). Cancel-safe: may be
    /// dropped and called again.
    async fn wait(&mut self) -> JobExit;
    /// Ask every replica to stop (SIGTERM to each process group, `scancel`), wait up to
    /// `grace` for them to end, then kill them outright. Returns once all are gone.
    async fn stop(&mut self, grace: Duration);
}

/// Write `text` to `path` below `base` (making its directories), readable by its owner only
/// and never through a link: batch scripts and env files hold the trial's token.
pub async fn write_private(
    base: &std::path::Path,
    path: &std::path::Path,
    text: &str,
) -> std::io::Result<()> {
    use crate::service::trial_files::{FileAccess, open_file};
    use std::io::Write;
    let (base, path, text) = (base.to_path_buf(), path.to_path_buf(), text.to_string());
    tokio::task::spawn_blocking(move || {
        let mut file = open_file(&base, &path, FileAccess::Rewrite(0o600))?;
        file.write_all(text.as_bytes())?;
        file.flush()
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Open the server's log `path` below `base` to append to (made when missing), never
/// through a link (`service::trial_files`).
/// Each replica's log starts each attempt with a header (`JobRequest::log_header`), written
/// here for every executor before it launches; the job's output follows it.
pub async fn write_log_headers(request: &JobRequest) -> Result<(), ExecutorError> {
    use tokio::io::AsyncWriteExt;
    for replica in &request.replicas {
        let mut log = open_log(&request.output_base, &replica.log_path).await?;
        let failed = |source| ExecutorError::File {
            path: replica.log_path.display().to_string(),
            source,
        };
        log.write_all(request.log_header(replica).as_bytes())
            .await
            .map_err(failed)?;
        log.flush().await.map_err(failed)?;
    }
    Ok(())
}

pub async fn open_log(
    base: &std::path::Path,
    path: &std::path::Path,
) -> Result<tokio::fs::File, ExecutorError> {
    use crate::service::trial_files::{FileAccess, open_file};
    let (base, path) = (base.to_path_buf(), path.to_path_buf());
    let shown = path.display().to_string();
    let file_error = |source| ExecutorError::File {
        path: shown.clone(),
        source,
    };
    tokio::task::spawn_blocking(move || open_file(&base, &path, FileAccess::Append))
        .await
        .map_err(|e| file_error(std::io::Error::other(e)))?
        .map(tokio::fs::File::from_std)
        .map_err(file_error)
}
