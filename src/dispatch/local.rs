//! The local executor: each job is a child process in its own process group, so a timeout
//! or a cancellation kills everything the trial started (data loaders, subprocesses).
//! With `augur serve --run-jobs-as USER` the job runs as that user (its uid, its group, no
//! other groups), so it cannot read what only the server's user may: the database file,
//! the server's own files; the directories the trial contract gives it to write (DESIGN §4:
//! model, checkpoints, TensorBoard logs, the hypertune file) are made its own, the trial's
//! directory and the job's log stay the server's.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::executor::{Executor, ExecutorError, JobExit, JobRequest, RunningJob};

/// The user local jobs run as (`--run-jobs-as`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: std::path::PathBuf,
}

impl RunAs {
    /// The user of this name, from the system's user database.
    pub fn lookup(name: &str) -> Result<RunAs, String> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(user)) => Ok(RunAs {
                name: user.name,
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
                home: user.dir,
            }),
            Ok(None) => Err(format!("--run-jobs-as {name}: no such user")),
            Err(e) => Err(format!("--run-jobs-as {name}: {e}")),
        }
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

#[derive(Debug, Clone, Default)]
pub struct LocalExecutor {
    /// Run jobs as this user rather than the server's.
    pub run_as: Option<RunAs>,
}

impl LocalExecutor {
    /// Hand the job what it writes, and tell it who it is.
    fn prepare_for(&self, request: &JobRequest) -> Result<Vec<(String, String)>, ExecutorError> {
        let mut env = request.env.clone();
        let Some(user) = &self.run_as else {
            return Ok(env);
        };
        let give = |path: &std::path::Path| {
            std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)).map_err(|e| {
                ExecutorError::Launch(format!(
                    "cannot give {} to {}: {e}",
                    path.display(),
                    user.name
                ))
            })
        };
        for (name, value) in &request.env {
            if JOB_WRITES_DIRS.contains(&name.as_str()) {
                give(std::path::Path::new(value))?;
            } else if name == JOB_WRITES_FILE {
                let path = std::path::Path::new(value);
                if !path.exists() {
                    std::fs::File::create(path)
                        .map_err(|e| ExecutorError::Launch(format!("{}: {e}", path.display())))?;
                }
                give(path)?;
            }
        }
        // Its own home and name, not the server's.
        for (name, value) in env.iter_mut() {
            match name.as_str() {
                "HOME" => *value = user.home.display().to_string(),
                "USER" | "LOGNAME" => value.clone_from(&user.name),
                _ => {}
            }
        }
        Ok(env)
    }
}

#[async_trait]
impl Executor for LocalExecutor {
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError> {
        let (program, args) = request
            .argv
            .split_first()
            .ok_or_else(|| ExecutorError::Launch("empty command".into()))?;
        let mut log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&request.log_path)
            .await
            .map_err(|e| {
                ExecutorError::Launch(format!("log file {}: {e}", request.log_path.display()))
            })?;
        let header = format!(
            "=== augur: trial {} attempt {}: {:?}\n",
            request.trial_id, request.attempt, request.argv
        );
        log.write_all(header.as_bytes())
            .await
            .map_err(|e| ExecutorError::Launch(e.to_string()))?;
        let env = self.prepare_for(request)?;
        let mut command = Command::new(program);
        command
            .args(args)
            // Only what the request names: never the server's own environment.
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        if let Some(dir) = &request.workdir {
            command.current_dir(dir);
        }
        if let Some(user) = &self.run_as {
            // Setting the uid also drops the server's supplementary groups (std does so when
            // no groups are given).
            command.uid(user.uid).gid(user.gid);
        }
        let mut child = command
            .spawn()
            .map_err(|e| ExecutorError::Launch(format!("{program}: {e}")))?;
        let pgid = child.id().map(|id| id as i32).unwrap_or(0);
        let (log_lines, log_rx) = mpsc::unbounded_channel::<String>();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(pump(out, log_lines.clone(), Some(stdout_lines)));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(pump(err, log_lines, None));
        }
        let writer = tokio::spawn(write_log(log, log_rx));
        Ok(Box::new(LocalJob {
            child,
            pgid,
            writer: Some(writer),
        }))
    }

    async fn clean_up_stale(&self, handle: &str, study_id: i64, trial_id: i64) {
        let Some(pgid) = handle
            .strip_prefix("pgid:")
            .and_then(|p| p.parse::<i32>().ok())
        else {
            return;
        };
        // Process ids are reused: kill only processes of that group that carry this trial's
        // environment, never whatever holds the number now.
        let marks = [
            format!("AUGUR_STUDY_ID={study_id}"),
            format!("AUGUR_TRIAL_ID={trial_id}"),
        ];
        for pid in group_members(pgid) {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            if marks.iter().all(|m| vars.contains(&m.as_bytes())) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
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

struct LocalJob {
    child: Child,
    pgid: i32,
    writer: Option<tokio::task::JoinHandle<()>>,
}

impl LocalJob {
    /// Wait until every line the job printed has been read (and sent on). Cancel-safe: the
    /// trial loop drops `wait()` whenever another event wins its `select!`, and a dropped
    /// wait must not lose the last lines (the final metric is often the last line).
    async fn finish_output(&mut self) {
        if let Some(writer) = self.writer.as_mut() {
            let _ = writer.await;
            self.writer = None;
        }
    }

    fn signal_group(&self, signal: Signal) {
        if self.pgid > 0 {
            // ESRCH: the group is already gone.
            let _ = killpg(Pid::from_raw(self.pgid), signal);
        }
    }
}

#[async_trait]
impl RunningJob for LocalJob {
    fn handle(&self) -> String {
        format!("pgid:{}", self.pgid)
    }

    async fn wait(&mut self) -> JobExit {
        let status = self.child.wait().await;
        // The leader is gone; make sure nothing it started lingers (it may have left
        // children behind in its group).
        self.signal_group(Signal::SIGKILL);
        self.finish_output().await;
        match status {
            Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                (Some(code), _) => JobExit::Exited(code),
                (None, Some(sig)) => JobExit::Signaled(sig),
                (None, None) => JobExit::Lost("no exit status".into()),
            },
            Err(e) => JobExit::Lost(e.to_string()),
        }
    }

    async fn stop(&mut self, grace: Duration) {
        self.signal_group(Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            self.signal_group(Signal::SIGKILL);
            let _ = self.child.wait().await;
        }
        self.signal_group(Signal::SIGKILL);
        self.finish_output().await;
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
