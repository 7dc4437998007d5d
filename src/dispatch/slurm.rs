//! The Slurm executor: each attempt is an `sbatch` job whose script `exec`s the trial's argv
//! (every word single-quoted, never interpolated).

use super::handle::JobHandle;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::cluster::Address;
use super::exec::{ExecVia, SessionProcess, refused, refused_replica};
use super::executor::write_private;
use super::executor::{Executor, ExecutorError, JobExit, JobRequest, ReplicaRequest, RunningJob};
use crate::model::SlurmOptions;
use crate::model::{ReplicaId, Resources, StudyId, TrialId};
use crate::service::exec::{ExecRefused, ExecRequest, ExecTarget};

/// How often a job's state is asked of the controller, and its output file read.
const POLL: Duration = Duration::from_millis(500);
/// How long `stop` waits for a killed job to leave the queue.
const GONE_WAIT: Duration = Duration::from_secs(30);
/// What `squeue`/`scontrol` print for a job id the controller does not know (finished
/// long ago and purged, or never existed).
const UNKNOWN_JOB: &str = "Invalid job id";
/// Job states in which a job still holds (or waits for) its allocation.
const ACTIVE_STATES: [&str; 10] = [
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "STAGE_OUT",
];

/// The Slurm executor: each attempt is an `sbatch` job whose script `exec`s the trial's argv
/// (every word single-quoted, never interpolated); state comes from `squeue`/`scontrol`
/// (there may be no accounting daemon, so no `sacct`), stdout from the job's output file on
/// the shared filesystem, and `scancel` stops it.
///
/// A job is looked up at most once per `POLL`, however often the caller wakes up (the
/// trial loop re-enters [`RunningJob::wait`] on every output line and timer tick). A job is
/// reported lost only when the controller says it does not know it; while the controller
/// cannot be reached the job is assumed to be still running (the trial's timeout bounds that).
pub struct SlurmExecutor {
    options: SlurmOptions,
    /// The operator's options (`augur serve --slurm-arg`), before the spec's.
    operator_args: std::sync::Arc<Vec<String>>,
}

impl SlurmExecutor {
    pub fn new(options: SlurmOptions, operator_args: std::sync::Arc<Vec<String>>) -> Self {
        Self {
            options,
            operator_args,
        }
    }
}

/// `word` as one single-quoted shell word.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A name `export` accepts.
fn is_shell_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The job's name: how a stale job is recognised as this trial's.
fn job_name(study_id: StudyId, trial_id: TrialId) -> String {
    format!("augur-{study_id}-{trial_id}")
}

/// A path for `sbatch --output`, where `%` starts a pattern (`%j`): `%%` is a literal `%`.
fn output_pattern(path: &Path) -> String {
    path.display().to_string().replace('%', "%%")
}

/// The files of one attempt, beside the trial's log.
struct AttemptFiles {
    /// The batch script `sbatch` runs.
    script: PathBuf,
    /// A cluster's per-task script, which `srun` runs once per replica.
    replica_script: PathBuf,
    /// Where the primary replica's exit code is written (a cluster's job ends with it).
    primary_exit: PathBuf,
    /// A cluster's hosts and ports, rank by rank, as the batch script found them (an
    /// `export` line): what a session in a replica other than the first needs.
    cluster: PathBuf,
}

impl AttemptFiles {
    fn of(request: &JobRequest, primary: &ReplicaRequest) -> AttemptFiles {
        let dir = primary
            .log_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        AttemptFiles::beside(&dir.join(format!("slurm-attempt-{}.sh", request.attempt)))
    }

    /// The files of the attempt whose batch script is `script`.
    fn beside(script: &Path) -> AttemptFiles {
        let stem = script.with_extension("").display().to_string();
        AttemptFiles {
            script: script.to_path_buf(),
            replica_script: PathBuf::from(format!("{stem}-replica.sh")),
            primary_exit: PathBuf::from(format!("{stem}.primary-exit")),
            cluster: PathBuf::from(format!("{stem}.cluster")),
        }
    }
}

/// `export NAME='value'` lines; only plain names may pass (the name is not quoted).
fn exports(env: &[(String, String)]) -> Result<String, ExecutorError> {
    let mut s = String::new();
    for (k, v) in env {
        if !is_shell_name(k) {
            return Err(ExecutorError::Launch(format!(
                "environment variable name {k:?} cannot be passed to a Slurm job"
            )));
        }
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    Ok(s)
}

/// The batch script for one attempt. Options go on `sbatch`'s command line (see
/// [`sbatch_args`]), where no `#SBATCH` parsing can split a path with spaces. A one-replica
/// trial `exec`s its command; a cluster's script finds each task's host and port and starts
/// every replica with one `srun` (see [`replica_script`]).
fn batch_script(request: &JobRequest, files: &AttemptFiles) -> Result<String, ExecutorError> {
    let primary = request
        .primary()
        .ok_or_else(|| ExecutorError::Launch("no replica to run".into()))?;
    let mut s = String::from("#!/bin/bash\n");
    if let Some(dir) = &request.workdir {
        s.push_str(&format!(
            "cd {} || exit 97\n",
            quote(&dir.display().to_string())
        ));
    }
    let Some(layout) = &request.cluster else {
        let no_cluster = |_| Address {
            host: String::new(),
            port: String::new(),
        };
        s.push_str(&exports(&request.replica_env(primary, &no_cluster))?);
        let argv: Vec<String> = primary.argv.iter().map(|w| quote(w)).collect();
        s.push_str(&format!("exec {}\n", argv.join(" ")));
        return Ok(s);
    };
    s.push_str(&exports(&request.env)?);
    s.push_str(&format!(
        r#"# Each task's host, rank by rank: Slurm places tasks on the allocation's nodes in blocks
# (SLURM_TASKS_PER_NODE, e.g. "2(x3),1"). Ports: a range per job and node (job id mod 700),
# one port per task on the node, so concurrent jobs on a node do not collide.
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
base=$((20000 + (SLURM_JOB_ID % 700) * 64))
hosts=(); ports=(); n=0
for spec in ${{SLURM_TASKS_PER_NODE//,/ }}; do
  count=${{spec%%(*}}; repeat=1
  case $spec in *'(x'*) repeat=${{spec#*(x}}; repeat=${{repeat%)}};; esac
  for ((r = 0; r < repeat; r++)); do
    for ((t = 0; t < count; t++)); do hosts+=("${{nodes[n]}}"); ports+=($((base + t))); done
    n=$((n + 1))
  done
done
export AUGUR_CLUSTER_HOSTS="${{hosts[*]}}" AUGUR_CLUSTER_PORTS="${{ports[*]}}"
printf "export AUGUR_CLUSTER_HOSTS='%s' AUGUR_CLUSTER_PORTS='%s'\n" "${{hosts[*]}}" "${{ports[*]}}" > {cluster_file}
rm -f {exit_file}
srun --ntasks={tasks} --distribution=block --kill-on-bad-exit=1 --export=ALL /bin/bash {replica_script}
code=$?
# The attempt ends as its primary did; without its exit code, a replica failed first.
if [ -s {exit_file} ]; then exit "$(cat {exit_file})"; fi
exit $(( code == 0 ? 1 : code ))
"#,
        exit_file = quote(&files.primary_exit.display().to_string()),
        cluster_file = quote(&files.cluster.display().to_string()),
        replica_script = quote(&files.replica_script.display().to_string()),
        tasks = layout.len(),
    ));
    Ok(s)
}

/// A cluster's per-task script: `srun` runs it once per replica; it finds its replica by
/// `SLURM_PROCID`, fills the hosts and ports of the allocation into the cluster
/// configuration (placeholders `__AUGUR_HOST_k__`/`__AUGUR_PORT_k__`), writes to its
/// replica's log, and runs the replica's command. The primary records its exit code and
/// then stops the other tasks. With `AUGUR_SESSION_RANK` (a session's step, see
/// [`srun_replica_exec_argv`]) it sets up that replica's environment and runs its own
/// arguments instead.
fn replica_script(request: &JobRequest, files: &AttemptFiles) -> Result<String, ExecutorError> {
    let placeholder = |id: ReplicaId| {
        let rank = request
            .replicas
            .iter()
            .position(|r| r.id == id)
            .unwrap_or(0);
        Address {
            host: format!("__AUGUR_HOST_{rank}__"),
            port: format!("__AUGUR_PORT_{rank}__"),
        }
    };
    let mut s = String::from(
        r#"#!/bin/bash
hosts=($AUGUR_CLUSTER_HOSTS); ports=($AUGUR_CLUSTER_PORTS)
# The value with every replica's host and port filled in.
fill() {
  local v=$1 k
  for k in "${!hosts[@]}"; do
    v=${v//__AUGUR_HOST_${k}__/${hosts[k]}}
    v=${v//__AUGUR_PORT_${k}__/${ports[k]}}
  done
  printf '%s' "$v"
}
case "${AUGUR_SESSION_RANK:-$SLURM_PROCID}" in
"#,
    );
    for (rank, replica) in request.replicas.iter().enumerate() {
        s.push_str(&format!("{rank})\n"));
        for (k, v) in request
            .replica_env(replica, &placeholder)
            .iter()
            .skip(request.env.len())
        {
            if !is_shell_name(k) {
                return Err(ExecutorError::Launch(format!(
                    "environment variable name {k:?} cannot be passed to a Slurm job"
                )));
            }
            if v.contains("__AUGUR_") {
                s.push_str(&format!("  export {k}=\"$(fill {})\"\n", quote(v)));
            } else {
                s.push_str(&format!("  export {k}={}\n", quote(v)));
            }
        }
        let argv: Vec<String> = replica.argv.iter().map(|w| quote(w)).collect();
        s.push_str(&format!("  argv=({})\n", argv.join(" ")));
        s.push_str(&format!(
            "  log={}\n  ;;\n",
            quote(&replica.log_path.display().to_string()),
        ));
    }
    s.push_str(&format!(
        r#"*) echo "augur: no replica for task $SLURM_PROCID" >&2; exit 98 ;;
esac
if [ -n "$AUGUR_SESSION_RANK" ]; then
  unset AUGUR_SESSION_RANK
  exec "$@"
fi
# The primary writes to the job's own log, which Augur follows for its metrics.
exec >>"$log" 2>&1
if [ "$SLURM_PROCID" = 0 ]; then
  "${{argv[@]}}"
  code=$?
  echo "$code" > {exit_file}
  # The attempt ends with the primary: stop the other replicas (SIGTERM, then SIGKILL).
  [ {tasks} -gt 1 ] && scancel --quiet "$SLURM_JOB_ID.$SLURM_STEP_ID"
  exit "$code"
fi
exec "${{argv[@]}}"
"#,
        exit_file = quote(&files.primary_exit.display().to_string()),
        tasks = request.replicas.len(),
    ));
    Ok(s)
}

fn sbatch_args(
    request: &JobRequest,
    options: &SlurmOptions,
    operator_args: &[String],
    log: &Path,
    script: &Path,
) -> Vec<String> {
    let mut args = vec![
        "--parsable".to_string(),
        format!(
            "--job-name={}",
            job_name(request.study_id, request.trial_id)
        ),
        format!("--output={}", output_pattern(log)),
        "--open-mode=append".to_string(),
        // sbatch would copy the server's whole environment into the job: the script
        // exports exactly the request's variables instead.
        "--export=NONE".to_string(),
        // A job whose node fails ends as NODE_FAIL, and Augur's own retry (counted against
        // `max_retries`, a new token) runs it again at once: Slurm's requeue would hold it
        // for minutes (BeginTime) and run it uncounted. `sbatch_args: [--requeue]` wins.
        "--no-requeue".to_string(),
    ];
    if request.cluster.is_some() {
        args.push(format!("--ntasks={}", request.replicas.len()));
        if let Some(nodes) = options.nodes {
            args.push(format!("--nodes={nodes}"));
        }
    }
    args.extend(resource_args(request));
    if let Some(p) = &options.partition {
        args.push(format!("--partition={p}"));
    }
    // The operator's, then the spec's (only those `model::job` allows): they override ours.
    args.extend(operator_args.iter().cloned());
    args.extend(options.sbatch_args.iter().cloned());
    args.push(script.display().to_string());
    args
}

/// Per-task resources: one `srun` starts every replica alike, so each task asks for what
/// the most demanding replica needs.
fn resource_args(request: &JobRequest) -> Vec<String> {
    let all = || request.replicas.iter().map(|r| &r.resources);
    let mut args = Vec::new();
    let cpus = all().filter_map(|r| r.cpu).fold(0.0_f64, f64::max);
    if cpus > 0.0 {
        args.push(format!("--cpus-per-task={}", cpus.ceil() as u64));
    }
    if let Some(bytes) = all().filter_map(Resources::memory_bytes).max() {
        let per_cpu = bytes.div_ceil(cpus.ceil().max(1.0) as u64);
        args.push(format!("--mem-per-cpu={}M", per_cpu.div_ceil(1 << 20)));
    }
    if let Some(gpus) = all().filter_map(|r| r.gpu).max().filter(|&g| g > 0) {
        args.push(format!("--gpus-per-task={gpus}"));
    }
    args
}

async fn run(program: &str, args: &[String]) -> Result<String, ExecutorError> {
    let failed = |message: String| ExecutorError::Command {
        program: program.to_string(),
        message,
    };
    let out = Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(failed(format!("failed: {stderr}")))
    }
}

/// Whether the controller said it does not know the job.
fn unknown_job(e: &ExecutorError) -> bool {
    e.to_string().contains(UNKNOWN_JOB)
}

/// The job's state as `squeue` prints it (empty once it has left the queue). `--jobs=` and
/// not `-j ID`: `-j` takes an optional argument, which must be attached.
async fn squeue_state(job_id: &str) -> Result<String, ExecutorError> {
    run(
        "squeue",
        &[
            "-h".into(),
            format!("--jobs={job_id}"),
            "-o".into(),
            "%T".into(),
        ],
    )
    .await
}

/// Where the job's log below `base` ends (Slurm appends the job's output after it), opened
/// without following a link.
async fn log_end(base: &Path, path: &Path) -> Result<u64, ExecutorError> {
    let file = super::executor::open_log(base, path).await?;
    let metadata = file
        .metadata()
        .await
        .map_err(|source| ExecutorError::File {
            path: path.display().to_string(),
            source,
        })?;
    Ok(metadata.len())
}

#[async_trait]
impl Executor for SlurmExecutor {
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError> {
        let primary = request
            .primary()
            .filter(|p| !p.argv.is_empty())
            .ok_or_else(|| ExecutorError::Launch("empty command".into()))?;
        let files = AttemptFiles::of(request, primary);
        let private = |path: PathBuf, text: String| async move {
            write_private(&request.output_base, &path, &text)
                .await
                .map_err(|source| ExecutorError::File {
                    path: path.display().to_string(),
                    source,
                })
        };
        private(files.script.clone(), batch_script(request, &files)?).await?;
        if request.cluster.is_some() {
            private(
                files.replica_script.clone(),
                replica_script(request, &files)?,
            )
            .await?;
        }
        // The job's output is read from after the attempt's header (`attempt.rs`).
        let offset = log_end(&request.output_base, &primary.log_path).await?;
        let args = sbatch_args(
            request,
            &self.options,
            &self.operator_args,
            &primary.log_path,
            &files.script,
        );
        let out = run("sbatch", &args).await?;
        let job_id = out.trim().split(';').next().unwrap_or("").to_string();
        if job_id.is_empty() || !job_id.chars().all(|c| c.is_ascii_digit()) {
            return Err(ExecutorError::Launch(format!(
                "sbatch printed no job id: {out:?}"
            )));
        }
        let (done_tx, done_rx) = watch::channel(false);
        let tail = tokio::spawn(tail_file(
            primary.log_path.clone(),
            offset,
            stdout_lines,
            done_rx,
        ));
        Ok(Box::new(SlurmJob {
            job_id,
            tail: Some(tail),
            done: done_tx,
            exit: None,
            next_poll: Instant::now(),
            unreachable_since: None,
        }))
    }

    async fn clean_up_stale(&self, handle: &JobHandle, study_id: StudyId, trial_id: TrialId) {
        let JobHandle::Slurm { job_id: id } = handle else {
            return;
        };
        // Job ids restart when the controller's state is wiped: cancel the job only if it
        // is still this trial's.
        let Ok(text) = run(
            "scontrol",
            &["show".into(), "job".into(), id.to_string(), "-o".into()],
        )
        .await
        else {
            return;
        };
        if field(&text, "JobName") == job_name(study_id, trial_id)
            && ACTIVE_STATES.contains(&field(&text, "JobState"))
        {
            tracing::info!(
                %study_id,
                %trial_id,
                job_id = id,
                "cancelling a Slurm job left by an earlier run"
            );
            let _ = run("scancel", &[id.to_string()]).await;
        }
    }

    /// A step of its own in the attempt's running job (`srun --jobid --overlap`, beside the
    /// trial's step, on its resources), on the primary's node, with the environment and
    /// working directory of the job's batch script (its `cd` and `export` lines).
    async fn exec(
        &self,
        handle: &JobHandle,
        target: &ExecTarget,
        request: &ExecRequest,
    ) -> Result<ExecVia, ExecRefused> {
        let JobHandle::Slurm { job_id } = handle else {
            return Err(refused(format!("not a Slurm job: {handle}")));
        };
        let text = run(
            "scontrol",
            &["show".into(), "job".into(), job_id.clone(), "-o".into()],
        )
        .await
        .map_err(|e| refused(format!("Slurm job {job_id}: {e}")))?;
        if field(&text, "JobName") != job_name(target.study_id, target.trial_id) {
            return Err(refused(format!(
                "Slurm job {job_id} is not trial {}'s",
                target.trial_id
            )));
        }
        if field(&text, "JobState") != "RUNNING" {
            return Err(refused(format!(
                "Slurm job {job_id} is {}, not running",
                field(&text, "JobState")
            )));
        }
        let script = field(&text, "Command");
        let argv = if target.job.is_cluster() {
            let rank = target
                .job
                .replicas()
                .iter()
                .position(|plan| plan.id == request.replica)
                .ok_or_else(|| {
                    refused_replica(format!(
                        "the trial has no replica {}",
                        request.replica.name()
                    ))
                })?;
            let files = AttemptFiles::beside(Path::new(script));
            let hosts = tokio::fs::read_to_string(&files.cluster)
                .await
                .map_err(|_| refused("the trial's cluster is still starting: try again"))?;
            let host = cluster_host(&hosts, rank)
                .ok_or_else(|| refused(format!("no host of rank {rank} in {hosts:?}")))?;
            srun_replica_exec_argv(job_id, host, &files, rank, request)
        } else if request.replica == ReplicaId::PRIMARY {
            srun_exec_argv(job_id, script, request)
        } else {
            return Err(refused_replica(format!(
                "the trial has one replica ({}), not {}",
                ReplicaId::PRIMARY.name(),
                request.replica.name()
            )));
        };
        Ok(ExecVia::Process(SessionProcess {
            argv,
            ..SessionProcess::default()
        }))
    }
}

/// The host of rank `rank` in a cluster file's `export AUGUR_CLUSTER_HOSTS='h0 h1 …'` line.
fn cluster_host(text: &str, rank: usize) -> Option<&str> {
    let hosts = text
        .split("AUGUR_CLUSTER_HOSTS='")
        .nth(1)?
        .split('\'')
        .next()?;
    hosts.split_whitespace().nth(rank)
}

/// `srun` for a session in replica `rank` of a cluster trial's job: one task on that
/// replica's node, its own step (`--overlap`), which runs the attempt's replica script as
/// that replica would (the batch script's `cd` and `export` lines, the cluster's hosts and
/// ports, then the replica's own environment), with the session's command instead of the
/// replica's.
fn srun_replica_exec_argv(
    job_id: &str,
    host: &str,
    files: &AttemptFiles,
    rank: usize,
    request: &ExecRequest,
) -> Vec<String> {
    let mut argv: Vec<String> = ["srun", "--overlap", "--quiet", "--ntasks=1", "--nodes=1"]
        .map(str::to_string)
        .to_vec();
    argv.push(format!("--jobid={job_id}"));
    argv.push(format!("--nodelist={host}"));
    if request.tty {
        argv.push("--pty".to_string());
    }
    argv.extend([
        "/bin/bash".to_string(),
        "-c".to_string(),
        r#"source <(grep -E '^(cd|export) ' "$0") && source "$1" && script=$2 && export AUGUR_SESSION_RANK=$3 && shift 3 && exec /bin/bash "$script" "$@""#.to_string(),
        files.script.display().to_string(),
        files.cluster.display().to_string(),
        files.replica_script.display().to_string(),
        rank.to_string(),
    ]);
    argv.extend(request.command.iter().cloned());
    argv
}

/// `srun` for a session in job `job_id` whose batch script is `script`: one task on the
/// job's first node (the primary's), its own step beside the trial's (`--overlap`), the
/// script's `cd` and `export` lines read first (what the trial's command saw).
fn srun_exec_argv(job_id: &str, script: &str, request: &ExecRequest) -> Vec<String> {
    let mut argv: Vec<String> = [
        "srun",
        "--overlap",
        "--quiet",
        "--ntasks=1",
        "--nodes=1",
        "--relative=0",
    ]
    .map(str::to_string)
    .to_vec();
    argv.push(format!("--jobid={job_id}"));
    if request.tty {
        argv.push("--pty".to_string());
    }
    argv.extend([
        "/bin/bash".to_string(),
        "-c".to_string(),
        r#"source <(grep -E '^(cd|export) ' "$0") && exec "$@""#.to_string(),
        script.to_string(),
    ]);
    argv.extend(request.command.iter().cloned());
    argv
}

/// Send the lines appended to `path` after `offset` until `done`, then the rest.
async fn tail_file(
    path: PathBuf,
    mut offset: u64,
    lines: mpsc::UnboundedSender<String>,
    mut done: watch::Receiver<bool>,
) {
    let mut partial = String::new();
    loop {
        let finished = *done.borrow();
        if let Ok(mut file) = tokio::fs::File::open(&path).await
            && file.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
        {
            let mut buf = Vec::new();
            if let Ok(n) = file.read_to_end(&mut buf).await {
                offset += n as u64;
                partial.push_str(&String::from_utf8_lossy(&buf));
                while let Some(i) = partial.find('\n') {
                    let line: String = partial.drain(..=i).collect();
                    let _ = lines.send(line.trim_end_matches('\n').to_string());
                }
            }
        }
        if finished {
            if !partial.is_empty() {
                let _ = lines.send(std::mem::take(&mut partial));
            }
            return;
        }
        let _ = tokio::time::timeout(POLL, done.changed()).await;
    }
}

/// What one look at the controller found.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Queued or running (or the controller could not tell).
    Active,
    Ended(JobExit),
}

struct SlurmJob {
    job_id: String,
    tail: Option<tokio::task::JoinHandle<()>>,
    done: watch::Sender<bool>,
    /// Set as soon as the end is known, before the output is drained: a `wait` dropped
    /// while draining must not poll a job that may meanwhile have been purged.
    exit: Option<JobExit>,
    /// No lookup before this instant, however often `wait` is entered.
    next_poll: Instant,
    /// Since when `squeue`/`scontrol` fail for another reason than an unknown job.
    unreachable_since: Option<Instant>,
}

impl SlurmJob {
    async fn poll(&mut self) -> Seen {
        match squeue_state(&self.job_id).await {
            Ok(state) if ACTIVE_STATES.contains(&state.trim()) => {
                self.unreachable_since = None;
                return Seen::Active;
            }
            // Gone from the queue, in a final state, or unknown: scontrol tells how it ended.
            Ok(_) => {}
            Err(e) if unknown_job(&e) => {}
            Err(e) => return self.unreachable(&e),
        }
        let args = [
            "show".into(),
            "job".into(),
            self.job_id.clone(),
            "-o".into(),
        ];
        match run("scontrol", &args).await {
            Ok(text) => {
                self.unreachable_since = None;
                seen_from_scontrol(&text)
            }
            Err(e) if unknown_job(&e) => Seen::Ended(JobExit::Lost(format!(
                "slurm job {} vanished: {e}",
                self.job_id
            ))),
            Err(e) => self.unreachable(&e),
        }
    }

    /// The controller did not answer: the job may well still run, so it is not lost.
    fn unreachable(&mut self, error: &ExecutorError) -> Seen {
        if self.unreachable_since.is_none() {
            tracing::warn!(job_id = %self.job_id, %error, "cannot reach the Slurm controller; assuming the job still runs");
            self.unreachable_since = Some(Instant::now());
        }
        Seen::Active
    }

    /// Wait for the next poll slot, then look. Cancel-safe.
    async fn poll_when_due(&mut self) -> Seen {
        tokio::time::sleep_until(self.next_poll).await;
        self.next_poll = Instant::now() + POLL;
        self.poll().await
    }

    /// Read the rest of the output. Cancel-safe: the tail task is awaited by reference and
    /// forgotten only once it has finished.
    async fn finish(&mut self) {
        let _ = self.done.send(true);
        if let Some(tail) = self.tail.as_mut() {
            let _ = tail.await;
            self.tail = None;
        }
    }
}

/// `key=value` from `scontrol show job -o` (fields are space-separated).
fn field<'a>(text: &'a str, name: &str) -> &'a str {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
}

/// The job's state from `scontrol show job -o`: still active, or how it ended.
fn seen_from_scontrol(text: &str) -> Seen {
    // squeue and scontrol are two calls: the job may have moved on in between, or, when
    // squeue failed, still be queued.
    if ACTIVE_STATES.contains(&field(text, "JobState")) {
        return Seen::Active;
    }
    Seen::Ended(exit_from_scontrol(text))
}

/// `JobState=… ExitCode=code:signal` from `scontrol show job -o`, for a job that ended.
fn exit_from_scontrol(text: &str) -> JobExit {
    let state = field(text, "JobState");
    let (code, signal) = field(text, "ExitCode").split_once(':').unwrap_or(("", ""));
    let code: i32 = code.parse().unwrap_or(-1);
    let signal: i32 = signal.parse().unwrap_or(0);
    match state {
        "COMPLETED" => JobExit::Exited(code.max(0)),
        "FAILED" | "OUT_OF_MEMORY" if signal == 0 => {
            JobExit::Exited(if code == 0 { 1 } else { code })
        }
        "FAILED" | "OUT_OF_MEMORY" | "CANCELLED" | "TIMEOUT" | "PREEMPTED" if signal != 0 => {
            JobExit::Signaled(signal)
        }
        "NODE_FAIL" | "BOOT_FAIL" | "DEADLINE" | "PREEMPTED" | "REVOKED" => {
            JobExit::Lost(format!("slurm state {state}"))
        }
        other => JobExit::Lost(format!("slurm state {other:?}")),
    }
}

#[async_trait]
impl RunningJob for SlurmJob {
    fn handle(&self) -> JobHandle {
        JobHandle::Slurm {
            job_id: self.job_id.to_string(),
        }
    }

    async fn wait(&mut self) -> JobExit {
        loop {
            if let Some(exit) = self.exit.clone() {
                self.finish().await;
                return exit;
            }
            if let Seen::Ended(exit) = self.poll_when_due().await {
                self.exit = Some(exit);
            }
        }
    }

    async fn stop(&mut self, grace: Duration) {
        if self.exit.is_none() {
            // A pending job cannot be signalled; scancel it outright. A running one gets
            // SIGTERM (its batch shell `exec`ed the trial) and `grace` to end.
            self.next_poll = Instant::now();
            let pending =
                matches!(squeue_state(&self.job_id).await, Ok(state) if state.trim() == "PENDING");
            if !pending {
                let _ = run(
                    "scancel",
                    &["--signal=TERM".into(), "--full".into(), self.job_id.clone()],
                )
                .await;
                let deadline = Instant::now() + grace;
                while self.exit.is_none() && Instant::now() < deadline {
                    if let Seen::Ended(exit) = self.poll_when_due().await {
                        self.exit = Some(exit);
                    }
                }
            }
        }
        if self.exit.is_none() {
            let _ = run("scancel", &[self.job_id.clone()]).await;
            // Return once it has left the queue, so the freed slot is really free.
            let deadline = Instant::now() + GONE_WAIT;
            while self.exit.is_none() && Instant::now() < deadline {
                if let Seen::Ended(exit) = self.poll_when_due().await {
                    self.exit = Some(exit);
                }
            }
        }
        self.finish().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: ReplicaId, argv: &[&str], log: &str) -> ReplicaRequest {
        ReplicaRequest {
            id,
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: Vec::new(),
            resources: Resources::default(),
            image: None,
            log_path: PathBuf::from(log),
        }
    }

    fn request() -> JobRequest {
        JobRequest {
            study_id: StudyId::new(1),
            study_created_at: chrono::DateTime::UNIX_EPOCH,
            trial_id: TrialId::new(2),
            attempt: 1,
            env: vec![("AUGUR_TRIAL_ID".into(), "2".into())],
            workdir: Some(PathBuf::from("/work dir")),
            trial_dir: PathBuf::from("/runs 100%/2"),
            output_base: PathBuf::from("/runs 100%"),
            replicas: vec![replica(
                ReplicaId::PRIMARY,
                &["python3", "train.py", "--name=it's $HOME"],
                "/runs 100%/2/job.log",
            )],
            cluster: None,
            copy_checkpoint_from: None,
        }
    }

    /// A chief, two workers and an evaluator.
    fn cluster_request() -> JobRequest {
        let job = crate::model::TrialJobSpec {
            command: vec!["train".into()],
            worker_pools: [1, 2, 0, 1]
                .iter()
                .map(|&n| {
                    (n > 0).then(|| crate::model::WorkerPoolSpec {
                        replicas: n,
                        ..Default::default()
                    })
                })
                .collect(),
            ..Default::default()
        };
        let mut r = request();
        r.cluster = Some(super::super::cluster::ClusterLayout::of(&job));
        r.replicas = job
            .replicas()
            .iter()
            .map(|p| {
                replica(
                    p.id,
                    &["train", "--lr=0.1"],
                    &format!("/runs/2/{}.log", p.id.name()),
                )
            })
            .collect();
        r.replicas[3].resources.gpu = Some(2);
        r
    }

    fn files() -> AttemptFiles {
        AttemptFiles::of(&request(), &request().replicas[0])
    }

    #[test]
    fn script_quotes_every_word() {
        let s = batch_script(&request(), &files()).expect("script");
        assert!(s.contains("cd '/work dir' || exit 97\n"));
        assert!(s.contains("export AUGUR_TRIAL_ID='2'\n"));
        assert!(
            s.ends_with("exec 'python3' 'train.py' '--name=it'\\''s $HOME'\n"),
            "{s}"
        );
        assert!(!s.contains("CLUSTER_SPEC"), "one replica, no cluster: {s}");
    }

    #[test]
    fn a_cluster_starts_every_replica_with_one_srun_and_ends_as_its_primary() {
        let r = cluster_request();
        let files = AttemptFiles::of(&r, &r.replicas[0]);
        let s = batch_script(&r, &files).expect("script");
        assert!(
            s.contains("srun --ntasks=4 --distribution=block --kill-on-bad-exit=1"),
            "{s}"
        );
        assert!(s.contains("slurm-attempt-1.primary-exit"), "{s}");
        let tasks = replica_script(&r, &files).expect("replica script");
        for rank in 0..4 {
            assert!(
                tasks.contains(&format!("\n{rank})\n")),
                "task {rank}: {tasks}"
            );
        }
        assert!(
            tasks.contains("export AUGUR_REPLICA='workerpool3-0'"),
            "{tasks}"
        );
        // The cluster's addresses are filled in inside the allocation.
        assert!(tasks.contains("export CLUSTER_SPEC=\"$(fill '"), "{tasks}");
        assert!(
            tasks.contains("__AUGUR_HOST_2__:__AUGUR_PORT_2__"),
            "{tasks}"
        );
        let args = sbatch_args(
            &r,
            &SlurmOptions::default(),
            &[],
            Path::new("/l"),
            Path::new("/s"),
        );
        assert!(args.contains(&"--ntasks=4".to_string()), "{args:?}");
        assert!(args.contains(&"--gpus-per-task=2".to_string()), "{args:?}");
    }

    #[test]
    fn env_names_that_a_shell_would_interpret_are_refused() {
        let mut r = request();
        r.env.push(("X;touch /tmp/pwned;Y".into(), "v".into()));
        assert!(batch_script(&r, &files()).is_err());
        assert!(
            is_shell_name("_A1")
                && !is_shell_name("1A")
                && !is_shell_name("A-B")
                && !is_shell_name("")
        );
    }

    #[test]
    fn sbatch_options_on_the_command_line_the_operators_then_the_specs_last() {
        let options = SlurmOptions {
            partition: Some("debug".into()),
            sbatch_args: vec!["--mem=1G".into()],
            nodes: None,
        };
        let args = sbatch_args(
            &request(),
            &options,
            &["--account=ml".to_string()],
            Path::new("/runs 100%/2/job.log"),
            Path::new("/runs/2/slurm-attempt-1.sh"),
        );
        assert_eq!(
            args,
            [
                "--parsable",
                "--job-name=augur-1-2",
                "--output=/runs 100%%/2/job.log",
                "--open-mode=append",
                "--export=NONE",
                "--no-requeue",
                "--partition=debug",
                "--account=ml",
                "--mem=1G",
                "/runs/2/slurm-attempt-1.sh"
            ]
        );
    }

    #[test]
    fn a_replicas_session_runs_its_script_on_its_host() {
        let text = "export AUGUR_CLUSTER_HOSTS='n2 n3 n3' AUGUR_CLUSTER_PORTS='1 1 2'\n";
        assert_eq!(cluster_host(text, 2), Some("n3"));
        assert_eq!(cluster_host(text, 3), None);
        let files = AttemptFiles::beside(Path::new("/t/slurm-attempt-2.sh"));
        assert_eq!(files.cluster, Path::new("/t/slurm-attempt-2.cluster"));
        let request = ExecRequest {
            command: vec!["nvidia-smi".into()],
            tty: false,
            rows: 24,
            cols: 80,
            replica: ReplicaId::PRIMARY,
        };
        let argv = srun_replica_exec_argv("7", "n3", &files, 2, &request);
        assert!(argv.contains(&"--nodelist=n3".to_string()), "{argv:?}");
        assert_eq!(
            argv[argv.len() - 5..],
            [
                "/t/slurm-attempt-2.sh",
                "/t/slurm-attempt-2.cluster",
                "/t/slurm-attempt-2-replica.sh",
                "2",
                "nvidia-smi"
            ]
        );
    }

    #[test]
    fn exit_codes_from_scontrol() {
        assert_eq!(
            exit_from_scontrol("JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0"),
            JobExit::Exited(0)
        );
        assert_eq!(
            exit_from_scontrol("JobId=5 JobState=FAILED ExitCode=3:0"),
            JobExit::Exited(3)
        );
        assert_eq!(
            exit_from_scontrol("JobState=CANCELLED ExitCode=0:15"),
            JobExit::Signaled(15)
        );
        assert!(matches!(
            exit_from_scontrol("JobState=NODE_FAIL ExitCode=0:0"),
            JobExit::Lost(_)
        ));
        assert!(matches!(
            exit_from_scontrol("JobState=CANCELLED ExitCode=0:0"),
            JobExit::Lost(_)
        ));
    }

    #[test]
    fn a_job_scontrol_still_shows_active_is_not_lost() {
        assert_eq!(
            seen_from_scontrol("JobId=5 JobState=RUNNING ExitCode=0:0"),
            Seen::Active
        );
        assert_eq!(
            seen_from_scontrol("JobId=5 JobState=COMPLETING ExitCode=0:0"),
            Seen::Active
        );
        assert_eq!(
            seen_from_scontrol("JobId=5 JobState=PENDING Reason=Resources"),
            Seen::Active
        );
        assert_eq!(
            seen_from_scontrol("JobId=5 JobState=COMPLETED ExitCode=0:0"),
            Seen::Ended(JobExit::Exited(0))
        );
        assert_eq!(
            field(
                "JobId=5 JobName=augur-1-2 DerivedExitCode=9:0 ExitCode=0:0",
                "ExitCode"
            ),
            "0:0"
        );
        assert_eq!(field("JobId=5 JobName=augur-1-2", "JobName"), "augur-1-2");
    }
}
