//! The Slurm executor: each attempt is an `sbatch` job whose script `exec`s the trial's argv
//! (every word single-quoted, never interpolated); state comes from `squeue`/`scontrol`
//! (there may be no accounting daemon, so no `sacct`), stdout from the job's output file on
//! the shared filesystem, and `scancel` stops it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::process::Command;
use tokio::sync::mpsc;

use super::executor::{Executor, ExecutorError, JobExit, JobRequest, RunningJob};
use crate::model::job::SlurmOptions;

const POLL: Duration = Duration::from_millis(500);

pub struct SlurmExecutor {
    options: SlurmOptions,
}

impl SlurmExecutor {
    pub fn new(options: SlurmOptions) -> Self {
        Self { options }
    }
}

/// `word` as one single-quoted shell word.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The batch script for one attempt.
fn batch_script(request: &JobRequest, options: &SlurmOptions) -> String {
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name=augur-{}-{}\n", request.study_id, request.trial_id));
    s.push_str(&format!("#SBATCH --output={}\n", request.log_path.display()));
    s.push_str("#SBATCH --open-mode=append\n");
    if let Some(p) = &options.partition {
        s.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(dir) = &request.workdir {
        s.push_str(&format!("cd {} || exit 97\n", quote(&dir.display().to_string())));
    }
    for (k, v) in &request.env {
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    let argv: Vec<String> = request.argv.iter().map(|w| quote(w)).collect();
    s.push_str(&format!("exec {}\n", argv.join(" ")));
    s
}

async fn run(program: &str, args: &[String]) -> Result<String, String> {
    let out = Command::new(program).args(args).output().await.map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{program} failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

#[async_trait]
impl Executor for SlurmExecutor {
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError> {
        let dir = request.log_path.parent().map(Path::to_path_buf).unwrap_or_default();
        let script = dir.join(format!("slurm-attempt-{}.sh", request.attempt));
        tokio::fs::write(&script, batch_script(request, &self.options))
            .await
            .map_err(|e| ExecutorError::Launch(format!("{}: {e}", script.display())))?;
        let offset = tokio::fs::metadata(&request.log_path).await.map(|m| m.len()).unwrap_or(0);
        let mut args = vec!["--parsable".to_string()];
        args.extend(self.options.sbatch_args.iter().cloned());
        args.push(script.display().to_string());
        let out = run("sbatch", &args).await.map_err(ExecutorError::Launch)?;
        let job_id = out.trim().split(';').next().unwrap_or("").to_string();
        if job_id.is_empty() || !job_id.chars().all(|c| c.is_ascii_digit()) {
            return Err(ExecutorError::Launch(format!("sbatch printed no job id: {out:?}")));
        }
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let tail = tokio::spawn(tail_file(request.log_path.clone(), offset, stdout_lines, done_rx));
        Ok(Box::new(SlurmJob { job_id, tail: Some(tail), done: done_tx, exit: None }))
    }

    async fn clean_up_stale(&self, handle: &str, _study_id: i64, _trial_id: i64) {
        if let Some(id) = handle.strip_prefix("slurm:").filter(|id| id.chars().all(|c| c.is_ascii_digit())) {
            let _ = run("scancel", &[id.to_string()]).await;
        }
    }
}

/// Send the lines appended to `path` after `offset` until `done`, then the rest.
async fn tail_file(path: PathBuf, mut offset: u64, lines: mpsc::UnboundedSender<String>, mut done: tokio::sync::watch::Receiver<bool>) {
    let mut partial = String::new();
    loop {
        let finished = *done.borrow();
        if let Ok(mut file) = tokio::fs::File::open(&path).await {
            if file.seek(std::io::SeekFrom::Start(offset)).await.is_ok() {
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

struct SlurmJob {
    job_id: String,
    tail: Option<tokio::task::JoinHandle<()>>,
    done: tokio::sync::watch::Sender<bool>,
    exit: Option<JobExit>,
}

impl SlurmJob {
    /// `Some(exit)` once the job has ended.
    async fn poll(&self) -> Option<JobExit> {
        let queued = run("squeue", &["-h".into(), "-j".into(), self.job_id.clone(), "-o".into(), "%T".into()]).await;
        if let Ok(state) = &queued {
            let state = state.trim();
            if matches!(state, "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "REQUEUED" | "RESIZING") {
                return None;
            }
        }
        // Gone from the queue (or in a final state): ask scontrol how it ended.
        match run("scontrol", &["show".into(), "job".into(), self.job_id.clone(), "-o".into()]).await {
            Ok(text) => Some(exit_from_scontrol(&text)),
            Err(e) => Some(JobExit::Lost(format!("slurm job {} vanished: {e}", self.job_id))),
        }
    }

    async fn finish(&mut self) {
        let _ = self.done.send(true);
        if let Some(tail) = self.tail.take() {
            let _ = tail.await;
        }
    }
}

/// `JobState=… ExitCode=code:signal` from `scontrol show job -o`.
fn exit_from_scontrol(text: &str) -> JobExit {
    let field = |name: &str| {
        text.split_whitespace().find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('='))).unwrap_or("")
    };
    let state = field("JobState");
    let (code, signal) = field("ExitCode").split_once(':').unwrap_or(("", ""));
    let code: i32 = code.parse().unwrap_or(-1);
    let signal: i32 = signal.parse().unwrap_or(0);
    match state {
        "COMPLETED" => JobExit::Exited(code.max(0)),
        "FAILED" | "OUT_OF_MEMORY" if signal == 0 => JobExit::Exited(if code == 0 { 1 } else { code }),
        "FAILED" | "OUT_OF_MEMORY" | "CANCELLED" | "TIMEOUT" | "PREEMPTED" if signal != 0 => JobExit::Signaled(signal),
        "NODE_FAIL" | "BOOT_FAIL" | "DEADLINE" | "PREEMPTED" | "REVOKED" => JobExit::Lost(format!("slurm state {state}")),
        other => JobExit::Lost(format!("slurm state {other:?}")),
    }
}

#[async_trait]
impl RunningJob for SlurmJob {
    fn handle(&self) -> String {
        format!("slurm:{}", self.job_id)
    }

    async fn wait(&mut self) -> JobExit {
        if let Some(exit) = &self.exit {
            return exit.clone();
        }
        loop {
            if let Some(exit) = self.poll().await {
                self.finish().await;
                self.exit = Some(exit.clone());
                return exit;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn stop(&mut self, grace: Duration) {
        let _ = run("scancel", &["--signal=TERM".into(), "--full".into(), self.job_id.clone()]).await;
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            if self.poll().await.is_some() {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        let _ = run("scancel", &[self.job_id.clone()]).await;
        self.finish().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_quotes_every_word() {
        let request = JobRequest {
            study_id: 1,
            trial_id: 2,
            attempt: 1,
            argv: vec!["python3".into(), "train.py".into(), "--name=it's $HOME".into()],
            env: vec![("AUGUR_TRIAL_ID".into(), "2".into())],
            workdir: Some(PathBuf::from("/work dir")),
            log_path: PathBuf::from("/runs/2/job.log"),
        };
        let s = batch_script(&request, &SlurmOptions { partition: Some("debug".into()), sbatch_args: vec![] });
        assert!(s.contains("#SBATCH --partition=debug\n"));
        assert!(s.contains("cd '/work dir' || exit 97\n"));
        assert!(s.contains("export AUGUR_TRIAL_ID='2'\n"));
        assert!(s.ends_with("exec 'python3' 'train.py' '--name=it'\\''s $HOME'\n"), "{s}");
    }

    #[test]
    fn exit_codes_from_scontrol() {
        assert_eq!(exit_from_scontrol("JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0"), JobExit::Exited(0));
        assert_eq!(exit_from_scontrol("JobId=5 JobState=FAILED ExitCode=3:0"), JobExit::Exited(3));
        assert_eq!(exit_from_scontrol("JobState=CANCELLED ExitCode=0:15"), JobExit::Signaled(15));
        assert!(matches!(exit_from_scontrol("JobState=NODE_FAIL ExitCode=0:0"), JobExit::Lost(_)));
    }
}
