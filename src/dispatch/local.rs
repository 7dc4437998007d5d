//! The local executor: each replica of an attempt is a child process in its own process
//! group, so a timeout or a cancellation kills everything a replica started (data loaders,
//! subprocesses). A cluster's replicas listen on 127.0.0.1 at ports reserved for it
//! (`ports.rs`), and get their GPUs from the machine's pool (`gpus.rs`).

use super::handle::JobHandle;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use super::cluster::Address;
use super::container::ContainerEngine;
use super::exec::{ExecVia, SessionProcess, refused, refused_replica};
use super::executor::{
    Executor, ExecutorContext, ExecutorError, JobExit, JobRequest, ReplicaRequest, RunningJob,
};
use super::gpus::GpuLease;
use super::ports::PortLease;
use crate::model::{ReplicaId, StudyId, TrialId};
use crate::service::exec::{ExecRefused, ExecRequest, ExecTarget};

/// The user local jobs run as (`--run-jobs-as`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: std::path::PathBuf,
}

/// Why `--run-jobs-as` names no user jobs can run as.
#[derive(Debug, thiserror::Error)]
pub enum RunAsError {
    #[error("--run-jobs-as {0}: no such user")]
    NoSuchUser(String),
    #[error("--run-jobs-as {name}: {source}")]
    Lookup {
        name: String,
        #[source]
        source: nix::Error,
    },
}

impl RunAs {
    /// The user of this name, from the system's user database.
    pub fn lookup(name: &str) -> Result<RunAs, RunAsError> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(user)) => Ok(RunAs {
                name: user.name,
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
                home: user.dir,
            }),
            Ok(None) => Err(RunAsError::NoSuchUser(name.to_string())),
            Err(source) => Err(RunAsError::Lookup {
                name: name.to_string(),
                source,
            }),
        }
    }

    /// Hand the user what a replica with environment `env` writes, and tell the replica who
    /// it is (its own home and name, not the server's).
    fn prepare(
        &self,
        base: &std::path::Path,
        env: &mut [(String, String)],
    ) -> Result<(), ExecutorError> {
        self.give_outputs(base, env)?;
        for (name, value) in env.iter_mut() {
            match name.as_str() {
                "HOME" => *value = self.home.display().to_string(),
                "USER" | "LOGNAME" => value.clone_from(&self.name),
                _ => {}
            }
        }
        Ok(())
    }

    /// Hand the user what a replica with environment `env` writes: the directories and the
    /// hypertune file of the trial contract, all below `base` (the study's output directory).
    /// Each is opened without following links and changed through its descriptor
    /// (`fchown`), so a link a job planted never hands it anything else.
    pub(super) fn give_outputs(
        &self,
        base: &std::path::Path,
        env: &[(String, String)],
    ) -> Result<(), ExecutorError> {
        use crate::service::trial_files::{DirOwner, FileAccess, open_dir, open_file};
        let give = |path: &std::path::Path, fd: std::io::Result<std::os::fd::OwnedFd>| {
            let failed = |e: String| {
                ExecutorError::Launch(format!(
                    "cannot give {} to {}: {e}",
                    path.display(),
                    self.name
                ))
            };
            let fd = fd.map_err(|e| failed(e.to_string()))?;
            let (uid, gid) = (
                nix::unistd::Uid::from_raw(self.uid),
                nix::unistd::Gid::from_raw(self.gid),
            );
            nix::unistd::fchown(&fd, Some(uid), Some(gid)).map_err(|e| failed(e.to_string()))
        };
        for (name, value) in env {
            let path = std::path::Path::new(value.as_str());
            if JOB_WRITES_DIRS.contains(&name.as_str()) {
                give(path, open_dir(base, path, DirOwner::Jobs, true))?;
            } else if name == JOB_WRITES_FILE {
                let file =
                    open_file(base, path, FileAccess::JobsFile).map(std::os::fd::OwnedFd::from);
                give(path, file)?;
            }
        }
        Ok(())
    }
}

/// Variables of the trial contract (DESIGN §4) naming what a job writes: directories, and
/// the hypertune file (made beforehand, so that a job may write it in a directory that is
/// not its own).
const JOB_WRITES_DIRS: [&str; 3] = [
    "AIP_MODEL_DIR",
    "AIP_CHECKPOINT_DIR",
    "AIP_TENSORBOARD_LOG_DIR",
];
const JOB_WRITES_FILE: &str = "CLOUD_ML_HP_METRIC_FILE";

/// With `augur serve --run-jobs-as USER` the replicas run as that user (its uid, its group,
/// no other groups), so they cannot read what only the server's user may: the database file,
/// the server's own files; the directories the trial contract gives a job to write (DESIGN
/// §4: model, checkpoints, TensorBoard logs, the hypertune file) are made its own, the
/// trial's directory and the job's logs stay the server's.
pub struct LocalExecutor {
    context: ExecutorContext,
}

impl LocalExecutor {
    pub fn new(context: ExecutorContext) -> Self {
        Self { context }
    }
}

#[async_trait]
impl Executor for LocalExecutor {
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError> {
        let (gpus, ports) = reserve_machine(&self.context, request).await?;
        let address = loopback_addresses(request, ports.as_ref());
        let mut cluster = LocalCluster::new(request.replicas.len(), gpus, ports, None);
        let mut primary_lines = Some(stdout_lines);
        for (i, replica) in request.replicas.iter().enumerate() {
            let mut env = request.replica_env(replica, &address);
            if let Some(devices) = cluster.gpus_of(i) {
                env.push(("CUDA_VISIBLE_DEVICES".to_string(), devices.join(",")));
            }
            let prepared = match &self.context.run_as {
                Some(user) => user.prepare(&request.output_base, &mut env),
                None => Ok(()),
            };
            // Only the primary's stdout carries the trial's metrics.
            let lines = if i == 0 { primary_lines.take() } else { None };
            let launch = Launch {
                argv: replica.argv.clone(),
                env: Some(env),
                workdir: request.workdir.clone(),
                user: self.context.run_as.clone(),
            };
            let started = match prepared {
                Ok(()) => spawn_replica(request, replica, launch, lines, i, &cluster.exits.0).await,
                Err(e) => Err(e),
            };
            cluster.keep(started).await?;
        }
        Ok(Box::new(cluster))
    }

    async fn clean_up_stale(&self, handle: &JobHandle, study_id: StudyId, trial_id: TrialId) {
        if let JobHandle::ProcessGroups(groups) = handle {
            kill_trial_groups(groups, study_id, trial_id);
        }
    }

    /// The command runs beside the replica, as it does: with its process's environment,
    /// working directory and user, read from `/proc` (so a session sees what the replica
    /// sees, `--run-jobs-as`'s user included).
    async fn exec(
        &self,
        handle: &JobHandle,
        target: &ExecTarget,
        request: &ExecRequest,
    ) -> Result<ExecVia, ExecRefused> {
        let JobHandle::ProcessGroups(groups) = handle else {
            return Err(refused(format!("not a local job: {handle}")));
        };
        let (groups, target, request) = (groups.clone(), target.clone(), request.clone());
        tokio::task::spawn_blocking(move || replica_process(&groups, &target, &request))
            .await
            .map_err(|e| refused(format!("exec task: {e}")))?
            .map(ExecVia::Process)
    }
}

/// Kill the processes of `groups` that carry trial `trial_id`'s marks in their environment
/// (process ids are reused: never whatever holds the number now): how many.
pub fn kill_trial_groups(groups: &[i32], study_id: StudyId, trial_id: TrialId) -> usize {
    let marks = [
        format!("AUGUR_STUDY_ID={study_id}"),
        format!("AUGUR_TRIAL_ID={trial_id}"),
    ];
    let mut killed = 0;
    for &pgid in groups {
        for pid in group_members(pgid) {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            if marks.iter().all(|m| vars.contains(&m.as_bytes()))
                && nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
            {
                killed += 1;
            }
        }
    }
    killed
}

/// The session's process for a local replica: the replica's leader (its process group's
/// first process, whose id is the group's) is found among `groups` by the trial's marks in
/// its environment (as `clean_up_stale` does: process ids are reused) and its replica's
/// name (`AUGUR_REPLICA`; a one-replica trial has none and is the primary).
fn replica_process(
    groups: &[i32],
    target: &ExecTarget,
    request: &ExecRequest,
) -> Result<SessionProcess, ExecRefused> {
    use std::os::unix::ffi::OsStrExt;
    let marks = [
        format!("AUGUR_STUDY_ID={}", target.study_id),
        format!("AUGUR_TRIAL_ID={}", target.trial_id),
    ];
    let wanted = request.replica.name();
    for &pid in groups {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = environ
            .split(|b| *b == 0)
            .filter(|v| !v.is_empty())
            .collect();
        if !marks.iter().all(|m| vars.contains(&m.as_bytes())) {
            continue;
        }
        let name = vars
            .iter()
            .find_map(|v| v.strip_prefix(b"AUGUR_REPLICA="))
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_else(|| ReplicaId::PRIMARY.name());
        if name != wanted {
            continue;
        }
        let env = vars
            .iter()
            .filter_map(|v| {
                let at = v.iter().position(|b| *b == b'=')?;
                Some((
                    std::ffi::OsStr::from_bytes(&v[..at]).to_os_string(),
                    std::ffi::OsStr::from_bytes(&v[at + 1..]).to_os_string(),
                ))
            })
            .collect();
        let workdir = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
        let user = process_user(pid).filter(|&(uid, _)| uid != nix::unistd::geteuid().as_raw());
        let mut argv = request.command.clone();
        if argv.is_empty() {
            argv.push("/bin/sh".into());
        }
        return Ok(SessionProcess {
            argv,
            env: Some(env),
            workdir,
            user,
        });
    }
    Err(refused_replica(format!(
        "replica {wanted} of trial {} has no running process on this machine (it has just \
         ended, or another replica of the server runs it)",
        target.trial_id
    )))
}

/// The real uid and gid of process `pid` (`Uid:`/`Gid:` of `/proc/<pid>/status`).
fn process_user(pid: i32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let first = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok())
    };
    Some((first("Uid:")?, first("Gid:")?))
}

/// What a cluster holds of this machine while it runs: the GPUs its replicas asked for
/// (waited for first: the wait is no part of the attempt's run) and, for a cluster, a port
/// per replica.
pub(super) async fn reserve_machine(
    context: &ExecutorContext,
    request: &JobRequest,
) -> Result<(Option<GpuLease>, Option<PortLease>), ExecutorError> {
    let wanted: Vec<u32> = request
        .replicas
        .iter()
        .map(|r| r.resources.gpu.unwrap_or(0))
        .collect();
    let gpus = if wanted.iter().any(|&n| n > 0) {
        Some(context.gpus.acquire(&wanted).await?)
    } else {
        None
    };
    let ports = match &request.cluster {
        Some(layout) => Some(context.ports.reserve(layout.len())?),
        None => None,
    };
    Ok((gpus, ports))
}

/// Where each replica of a cluster on this machine listens: 127.0.0.1 at its port.
pub(super) fn loopback_addresses(
    request: &JobRequest,
    ports: Option<&PortLease>,
) -> impl Fn(ReplicaId) -> Address + Sync + use<> {
    let by_replica: Vec<(ReplicaId, String)> = request
        .replicas
        .iter()
        .zip(ports.map(|l| l.ports.clone()).unwrap_or_default())
        .map(|(r, port)| (r.id, port.to_string()))
        .collect();
    move |id| Address {
        host: "127.0.0.1".to_string(),
        port: by_replica
            .iter()
            .find(|(r, _)| *r == id)
            .map_or_else(String::new, |(_, p)| p.clone()),
    }
}

/// How one replica's process is started: the program and arguments, and its environment
/// (`None`: this process's own, for a tool such as a container engine that starts the
/// replica elsewhere).
pub(super) struct Launch {
    pub argv: Vec<String>,
    pub env: Option<Vec<(String, String)>>,
    pub workdir: Option<std::path::PathBuf>,
    /// Run as this user rather than the server's (`--run-jobs-as`).
    pub user: Option<RunAs>,
}

/// Start one replica: its process group, its log, its exit reported on `exits` as
/// `(replica position, status)`.
pub(super) async fn spawn_replica(
    request: &JobRequest,
    replica: &ReplicaRequest,
    launch: Launch,
    stdout_lines: Option<mpsc::UnboundedSender<String>>,
    position: usize,
    exits: &mpsc::UnboundedSender<(usize, std::io::Result<ExitStatus>)>,
) -> Result<LocalReplica, ExecutorError> {
    let (program, args) = launch
        .argv
        .split_first()
        .ok_or_else(|| ExecutorError::Launch("empty command".into()))?;
    // Its header is written already (`attempt.rs`, for every executor).
    let log = super::executor::open_log(&request.output_base, &replica.log_path).await?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    if let Some(env) = launch.env {
        // Only what the request names: never the server's own environment.
        command.env_clear().envs(env);
    }
    if let Some(dir) = &launch.workdir {
        command.current_dir(dir);
    }
    if let Some(user) = &launch.user {
        // Setting the uid also drops the server's supplementary groups (std does so when no
        // groups are given).
        command.uid(user.uid).gid(user.gid);
    }
    let mut child = command.spawn().map_err(|source| ExecutorError::Spawn {
        program: program.to_string(),
        source,
    })?;
    let pgid = child.id().map(|id| id as i32).unwrap_or(0);
    let (log_lines, log_rx) = mpsc::unbounded_channel::<String>();
    if let Some(out) = child.stdout.take() {
        tokio::spawn(pump(out, log_lines.clone(), stdout_lines));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(pump(err, log_lines, None));
    }
    let writer = tokio::spawn(write_log(log, log_rx));
    let exits = exits.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        let _ = exits.send((position, status));
    });
    Ok(LocalReplica {
        id: replica.id,
        pgid,
        writer: Some(writer),
    })
}

/// Forward a pipe's lines to the log, and stdout's also to the metric parser.
async fn pump(
    pipe: impl AsyncRead + Unpin,
    log: mpsc::UnboundedSender<String>,
    stdout_lines: Option<mpsc::UnboundedSender<String>>,
) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(tx) = &stdout_lines {
            let _ = tx.send(line.clone());
        }
        let _ = log.send(line);
    }
}

async fn write_log(mut file: tokio::fs::File, mut lines: mpsc::UnboundedReceiver<String>) {
    while let Some(line) = lines.recv().await {
        if file.write_all(line.as_bytes()).await.is_err() || file.write_all(b"\n").await.is_err() {
            break;
        }
    }
    let _ = file.flush().await;
}

pub(super) struct LocalReplica {
    id: ReplicaId,
    pgid: i32,
    writer: Option<tokio::task::JoinHandle<()>>,
}

impl LocalReplica {
    fn signal_group(&self, signal: Signal) {
        if self.pgid > 0 {
            // ESRCH: the group is already gone.
            let _ = killpg(Pid::from_raw(self.pgid), signal);
        }
    }
}

pub(super) type ExitChannel = (
    mpsc::UnboundedSender<(usize, std::io::Result<ExitStatus>)>,
    mpsc::UnboundedReceiver<(usize, std::io::Result<ExitStatus>)>,
);

/// The replicas of one attempt, each a process group of this machine (the replica itself,
/// or the container engine's client attached to it).
pub(super) struct LocalCluster {
    pub(super) replicas: Vec<LocalReplica>,
    /// Each replica's exit, as its waiter task reports it.
    pub(super) exits: ExitChannel,
    /// Exits received so far, by replica position.
    seen: Vec<Option<JobExit>>,
    /// Held until the cluster is gone: its GPUs and ports go back then.
    gpus: Option<GpuLease>,
    _ports: Option<PortLease>,
    /// Replicas that are containers: stopped through their engine (signals to the engine's
    /// client would leave the containers running), by name.
    containers: Option<(Arc<ContainerEngine>, Vec<String>)>,
    /// What `RunningJob::handle` says, when not the process groups (containers).
    handle: Option<JobHandle>,
}

impl LocalCluster {
    pub(super) fn new(
        replicas: usize,
        gpus: Option<GpuLease>,
        ports: Option<PortLease>,
        containers: Option<(Arc<ContainerEngine>, Vec<String>)>,
    ) -> LocalCluster {
        LocalCluster {
            replicas: Vec::with_capacity(replicas),
            exits: mpsc::unbounded_channel(),
            seen: vec![None; replicas],
            gpus,
            _ports: ports,
            containers,
            handle: None,
        }
    }

    /// Keep a replica just started; if it could not start, stop those started before it: no
    /// replica outlives a cluster that could not start whole.
    pub(super) async fn keep(
        &mut self,
        started: Result<LocalReplica, ExecutorError>,
    ) -> Result<(), ExecutorError> {
        match started {
            Ok(replica) => {
                self.replicas.push(replica);
                Ok(())
            }
            Err(e) => {
                self.stop(Duration::ZERO).await;
                Err(e)
            }
        }
    }

    /// Identify the attempt by this instead of its process groups.
    pub(super) fn set_handle(&mut self, handle: JobHandle) {
        self.handle = Some(handle);
    }

    /// The GPUs given to the replica at `position`, if any.
    pub(super) fn gpus_of(&self, position: usize) -> Option<&Vec<String>> {
        self.gpus.as_ref().and_then(|g| g.per_replica.get(position))
    }

    fn signal_all(&self, signal: Signal) {
        for replica in &self.replicas {
            replica.signal_group(signal);
        }
    }

    /// Take in every exit reported so far.
    fn drain_exits(&mut self) {
        while let Ok((position, status)) = self.exits.1.try_recv() {
            self.record(position, status);
        }
    }

    fn record(&mut self, position: usize, status: std::io::Result<ExitStatus>) {
        if let Some(slot) = self.seen.get_mut(position) {
            *slot = Some(exit_of(status));
        }
        // The replica's leader is gone; nothing it started may linger in its group.
        if let Some(replica) = self.replicas.get(position) {
            replica.signal_group(Signal::SIGKILL);
        }
    }

    /// Whether every started replica has exited.
    fn all_exited(&self) -> bool {
        self.seen
            .iter()
            .take(self.replicas.len())
            .all(Option::is_some)
    }

    /// Wait (cancel-safe) until every replica has exited.
    async fn reap_all(&mut self) {
        self.drain_exits();
        while !self.all_exited() {
            match self.exits.1.recv().await {
                Some((position, status)) => self.record(position, status),
                None => return,
            }
        }
    }

    /// Wait until every line the replicas printed has been read (and sent on). Cancel-safe:
    /// the trial loop drops `wait()` whenever another event wins its `select!`, and a
    /// dropped wait must not lose the last lines (the final metric is often the last line).
    async fn finish_output(&mut self) {
        for replica in &mut self.replicas {
            if let Some(writer) = replica.writer.as_mut() {
                let _ = writer.await;
                replica.writer = None;
            }
        }
    }

    /// SIGTERM to every replica still running, SIGKILL after `grace`; returns once all are
    /// gone. Containers are stopped by their engine, which does the same inside them.
    pub(super) async fn stop(&mut self, grace: Duration) {
        self.drain_exits();
        if let Some((engine, names)) = self.containers.clone()
            && !self.all_exited()
        {
            engine.stop(&names, grace).await;
            let _ = tokio::time::timeout(grace + Duration::from_secs(5), self.reap_all()).await;
        }
        if !self.all_exited() {
            self.signal_all(Signal::SIGTERM);
            if tokio::time::timeout(grace, self.reap_all()).await.is_err() {
                self.signal_all(Signal::SIGKILL);
                self.reap_all().await;
            }
        }
        self.signal_all(Signal::SIGKILL);
        if let Some((engine, names)) = &self.containers {
            // Gone with `--rm`; whatever an engine left behind goes now.
            engine.remove(names).await;
        }
        self.finish_output().await;
    }

    /// The attempt's end once it is decided: the primary exited, or another replica failed.
    fn decided(&self) -> Option<JobExit> {
        if let Some(Some(primary)) = self.seen.first() {
            return Some(primary.clone());
        }
        self.seen
            .iter()
            .zip(&self.replicas)
            .skip(1)
            .find_map(|(exit, replica)| match exit {
                // A worker that finished its part before the primary is no failure.
                Some(exit) if !exit.success() => Some(JobExit::ReplicaFailed {
                    replica: replica.id.name(),
                    exit: Box::new(exit.clone()),
                }),
                _ => None,
            })
    }
}

fn exit_of(status: std::io::Result<ExitStatus>) -> JobExit {
    match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => JobExit::Exited(code),
            (None, Some(sig)) => JobExit::Signaled(sig),
            (None, None) => JobExit::Lost("no exit status".into()),
        },
        Err(e) => JobExit::Lost(e.to_string()),
    }
}

/// How long the other replicas get once the primary has finished.
const WIND_DOWN_GRACE: Duration = Duration::from_secs(5);

#[async_trait]
impl RunningJob for LocalCluster {
    fn handle(&self) -> JobHandle {
        if let Some(handle) = &self.handle {
            return handle.clone();
        }
        JobHandle::ProcessGroups(self.replicas.iter().map(|r| r.pgid).collect())
    }

    async fn wait(&mut self) -> JobExit {
        loop {
            self.drain_exits();
            if let Some(end) = self.decided() {
                // The primary is done (or a replica failed): no replica outlives the attempt.
                self.stop(WIND_DOWN_GRACE).await;
                return end;
            }
            match self.exits.1.recv().await {
                Some((position, status)) => self.record(position, status),
                None => return JobExit::Lost("the replicas' waiters are gone".into()),
            }
        }
    }

    async fn stop(&mut self, grace: Duration) {
        LocalCluster::stop(self, grace).await;
    }
}

/// Processes whose process group is `pgid` (from /proc).
fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .is_some_and(|stat| {
                    // "pid (comm) state ppid pgrp …": comm may contain spaces and parentheses.
                    stat.rfind(')')
                        .and_then(|i| stat.get(i + 2..))
                        .and_then(|rest| rest.split_whitespace().nth(2))
                        .and_then(|g| g.parse::<i32>().ok())
                        == Some(pgid)
                })
        })
        .collect()
}
