//! Exec and shell sessions into a running trial's replica (`augur trial exec`/`shell`,
//! `GET /v1/studies/{study}/trials/{trial}/exec`): who may open one, on which trials, and
//! the session's shape.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::trial_files::{self, FileAccess};
use super::{Caller, InternalError, Service, ServiceError, ServiceResult};
use crate::model::{ReplicaId, StudyId, TrialDirs, TrialId, TrialJobSpec, TrialState};

/// The `client_id` of the trials this server's dispatcher runs (`dispatch::runner`).
pub const DISPATCHER_CLIENT_ID: &str = "augur-dispatcher";

/// The longest command line a session may run (bytes, all words together).
pub const MAX_EXEC_COMMAND_BYTES: usize = 64 * 1024;

/// What a session runs, validated.
///
/// Exec and shell sessions into a running trial's replica (`augur trial exec`/`shell`,
/// `GET /v1/studies/{study}/trials/{trial}/exec`): who may open one, on which trials, and
/// the session's shape, whatever carries it (the API's WebSocket) and whatever runs it (the
/// executors, `dispatch::exec`, installed with [`Service::set_trial_exec`]: the service
/// cannot use `dispatch`, which uses it).
///
/// Only the study's creator or an admin may open one, and only into a trial this server's
/// dispatcher runs and that is running now: a pulled trial (ask/tell, `augur worker`) runs
/// where its client put it, out of the server's reach. A server that allows only some
/// commands (`--job-commands`) allows a session on its machine or Slurm only those too
/// (`JobPolicy::check_exec`). Each session is in the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Program and arguments; never passed through a shell (unless the program is one).
    pub command: Vec<String>,
    /// Run it on a new pseudo-terminal (a shell), rather than on pipes.
    pub tty: bool,
    /// The terminal's size (with `tty`).
    pub rows: u16,
    pub cols: u16,
    pub replica: ReplicaId,
}

/// A signal a session may send to its command (its process group; in a PTY the foreground
/// job gets Ctrl-C from the terminal as in any terminal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecSignal {
    Interrupt,
    Terminate,
    Kill,
    Hangup,
    Quit,
}

impl ExecSignal {
    /// `INT`, `TERM`, `KILL`, `HUP`, `QUIT` (with or without `SIG`).
    pub fn parse(name: &str) -> Option<ExecSignal> {
        let name = name.strip_prefix("SIG").unwrap_or(name);
        Some(match name {
            "INT" => ExecSignal::Interrupt,
            "TERM" => ExecSignal::Terminate,
            "KILL" => ExecSignal::Kill,
            "HUP" => ExecSignal::Hangup,
            "QUIT" => ExecSignal::Quit,
            _ => return None,
        })
    }
}

/// What the client sends while a session runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    Stdin(Vec<u8>),
    /// No more input: the command's stdin is closed (without a PTY).
    Eof,
    Resize {
        rows: u16,
        cols: u16,
    },
    Signal(ExecSignal),
}

/// How a session's command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecExit {
    Exited(i32),
    Signaled(i32),
}

impl ExecExit {
    /// The status a shell would report: the code, or 128 + the signal.
    pub fn status(self) -> i32 {
        match self {
            ExecExit::Exited(code) => code,
            ExecExit::Signaled(signal) => 128 + signal,
        }
    }
}

/// What a session sends back; `Exit` is the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutput {
    Stdout(Vec<u8>),
    /// Without a PTY only (a terminal has one stream).
    Stderr(Vec<u8>),
    Exit(ExecExit),
}

/// A running session. Dropping `input` ends it: its command is killed.
pub struct ExecSession {
    pub input: mpsc::Sender<ExecInput>,
    pub output: mpsc::Receiver<ExecOutput>,
}

/// A running trial's attempt, as the executor that runs it knows it.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    pub study_id: StudyId,
    pub trial_id: TrialId,
    pub job: TrialJobSpec,
    pub dirs: TrialDirs,
    /// The attempt's `job.handle` (`dispatch::handle::JobHandle` as text).
    pub handle: String,
}

/// Why an executor could not open a session: told to the caller as a conflict (409), with
/// the part of the request it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExecRefused {
    pub message: String,
    pub field: Option<String>,
}

/// Opens sessions in running attempts: the dispatcher's executors (`dispatch::exec`).
#[async_trait]
pub trait TrialExec: Send + Sync {
    async fn open(
        &self,
        target: &ExecTarget,
        request: &ExecRequest,
    ) -> Result<ExecSession, ExecRefused>;
}

/// The installed [`TrialExec`], shared by every clone of the service.
pub(super) type ExecHook = Arc<OnceLock<Arc<dyn TrialExec>>>;

impl Service {
    /// Let this service open sessions through `exec` (the app does, when it dispatches).
    pub fn set_trial_exec(&self, exec: Arc<dyn TrialExec>) {
        let _ = self.trial_exec.set(exec);
    }

    /// Whether `actor` may open a session into `trial` now, and where it would run: the
    /// study's creator or an admin, a trial of this server's dispatcher, running, with its
    /// job started. Checked before the session's transport is set up, so that a refusal is an
    /// ordinary HTTP error.
    pub async fn exec_target(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> ServiceResult<ExecTarget> {
        self.check_manager(actor, study_id).await?;
        let trial = self.trial_record(study_id, trial_id).await?;
        let (dirs, job) = match self.dispatched_trial_dirs(study_id, trial_id, "exec").await {
            Ok(found) => found,
            Err(ServiceError::NotFound(_)) => {
                return Err(not_dispatched(
                    study_id,
                    trial_id,
                    "its study has no trial_job: its trials run wherever the client that \
                     asked for them runs them (ask/tell)",
                ));
            }
            Err(e) => return Err(e),
        };
        if trial.client_id.as_deref() != Some(DISPATCHER_CLIENT_ID) {
            return Err(not_dispatched(
                study_id,
                trial_id,
                &format!(
                    "it was pulled by client {:?} (`augur worker` or ask/tell), which runs it \
                     on its own machine",
                    trial.client_id.as_deref().unwrap_or("")
                ),
            ));
        }
        if !matches!(trial.state, TrialState::Active | TrialState::Stopping) {
            return Err(ServiceError::Conflict {
                message: format!(
                    "trial {trial_id} of study {study_id} is {}, not running: a session opens \
                     only into a running trial",
                    trial.state.as_str()
                ),
                field: Some("state".into()),
            });
        }
        let (base, path) = (dirs.base.clone(), dirs.handle_file());
        let handle = tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            trial_files::open_file(&base, &path, FileAccess::Read)
                .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
                .map(|_| text)
        })
        .await
        .map_err(|e| InternalError::Task("job handle", e))?;
        let handle = match handle {
            Ok(text) if !text.trim().is_empty() => text.trim().to_string(),
            Ok(_) => return Err(not_started(study_id, trial_id)),
            Err(e) if trial_files::is_missing(&e) => return Err(not_started(study_id, trial_id)),
            Err(e) => {
                return Err(ServiceError::Conflict {
                    message: format!("trial {trial_id}'s job handle cannot be read: {e}"),
                    field: None,
                });
            }
        };
        Ok(ExecTarget {
            study_id,
            trial_id,
            job,
            dirs,
            handle,
        })
    }

    /// Open a session running `command` in `target`'s `replica` (the primary when `None`),
    /// and write it to the audit trail.
    pub async fn open_exec(
        &self,
        actor: &Caller,
        target: &ExecTarget,
        command: Vec<String>,
        tty: bool,
        size: Option<(u16, u16)>,
        replica: Option<&str>,
    ) -> ServiceResult<ExecSession> {
        let request = exec_request(&target.job, command, tty, size, replica)?;
        self.job_policy.check_exec(&target.job, &request.command)?;
        let Some(exec) = self.trial_exec.get() else {
            return Err(ServiceError::Conflict {
                message: "this server runs no dispatcher (`augur serve --no-dispatch`?): \
                          it runs no trial to open a session in"
                    .into(),
                field: None,
            });
        };
        let session = exec
            .open(target, &request)
            .await
            .map_err(|e| ServiceError::Conflict {
                message: e.message,
                field: e.field,
            })?;
        let detail = format!(
            "{} {}: {:?}",
            request.replica.name(),
            if request.tty { "shell" } else { "exec" },
            request.command
        );
        self.audit_trial(
            actor,
            "trial.exec",
            target.study_id,
            target.trial_id,
            Some(detail),
        )
        .await;
        Ok(session)
    }
}

fn not_dispatched(study_id: StudyId, trial_id: TrialId, why: &str) -> ServiceError {
    ServiceError::Conflict {
        message: format!(
            "trial {trial_id} of study {study_id} is not run by this server's dispatcher: {why}"
        ),
        field: Some("trial".into()),
    }
}

fn not_started(study_id: StudyId, trial_id: TrialId) -> ServiceError {
    ServiceError::Conflict {
        message: format!(
            "trial {trial_id} of study {study_id} has no running job yet (it is starting, or \
             between attempts): try again in a moment"
        ),
        field: Some("state".into()),
    }
}

/// The request, validated against the study's job (its replicas).
fn exec_request(
    job: &TrialJobSpec,
    command: Vec<String>,
    tty: bool,
    size: Option<(u16, u16)>,
    replica: Option<&str>,
) -> ServiceResult<ExecRequest> {
    if command.is_empty() || command[0].is_empty() {
        return Err(ServiceError::invalid("command", "must name a program"));
    }
    if command.iter().any(|w| w.contains('\0')) {
        return Err(ServiceError::invalid("command", "a word holds a NUL byte"));
    }
    if command.iter().map(String::len).sum::<usize>() > MAX_EXEC_COMMAND_BYTES {
        return Err(ServiceError::invalid(
            "command",
            format!("longer than {MAX_EXEC_COMMAND_BYTES} bytes"),
        ));
    }
    let (rows, cols) = size.unwrap_or((24, 80));
    if rows == 0 || cols == 0 {
        return Err(ServiceError::invalid(
            "rows",
            "rows and cols must be positive",
        ));
    }
    let replicas = job.replicas();
    let replica = match replica {
        None => ReplicaId::PRIMARY,
        Some(name) => ReplicaId::parse(name)
            .filter(|id| replicas.iter().any(|r| r.id == *id))
            .ok_or_else(|| {
                let names: Vec<String> = replicas.iter().map(|r| r.id.name()).collect();
                ServiceError::invalid(
                    "replica",
                    format!(
                        "{name:?} is no replica of this study's trials: {}",
                        names.join(", ")
                    ),
                )
            })?,
    };
    Ok(ExecRequest {
        command,
        tty,
        rows,
        cols,
        replica,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_with_or_without_sig() {
        assert_eq!(ExecSignal::parse("INT"), Some(ExecSignal::Interrupt));
        assert_eq!(ExecSignal::parse("SIGTERM"), Some(ExecSignal::Terminate));
        assert_eq!(ExecSignal::parse("STOP"), None);
    }

    #[test]
    fn an_exit_reads_as_a_shell_status() {
        assert_eq!(ExecExit::Exited(3).status(), 3);
        assert_eq!(ExecExit::Signaled(2).status(), 130);
    }
}
