//! A worker's trial dies with the worker (`augur reap-trial`, a child of the worker on a
//! pipe).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};

use crate::dispatch::handle::JobHandle;
use crate::model::{StudyId, TrialId};

/// What a worker writes before closing the reaper's stdin: the trial ended in its hands.
const DONE: &[u8] = b"done\n";

/// The reaper of one running trial; [`TrialReaper::disarm`] once the trial has ended.
pub(super) struct TrialReaper {
    // Dropped without a kill: tokio reaps it once it exits.
    _child: Child,
    stdin: Option<ChildStdin>,
}

impl TrialReaper {
    /// Start the reaper of trial `trial_id` of `study_id`, whose handle is `handle_file`.
    /// `None` (with a warning) if it cannot start: the trial still runs, as before.
    pub(super) fn start(handle_file: &Path, study_id: StudyId, trial_id: TrialId) -> Option<Self> {
        let exe = std::env::current_exe().ok()?;
        let spawned = Command::new(exe)
            .arg("reap-trial")
            .arg(handle_file)
            .args([study_id.to_string(), trial_id.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            // Its own group: a Ctrl-C meant for the worker does not reach it.
            .process_group(0)
            .kill_on_drop(false)
            .spawn();
        match spawned {
            Ok(mut child) => {
                let stdin = child.stdin.take();
                Some(TrialReaper {
                    _child: child,
                    stdin,
                })
            }
            Err(error) => {
                tracing::warn!(%error, %trial_id, "cannot start the trial's reaper: its job may outlive this worker");
                None
            }
        }
    }

    /// The trial ended here: the reaper exits without killing anything.
    pub(super) async fn disarm(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(DONE).await;
        }
    }
}

/// `augur reap-trial HANDLE_FILE STUDY TRIAL`: wait for stdin to close; unless it said
/// `done`, kill the trial's local process groups.
///
/// A worker's trial dies with the worker. `augur worker` starts, for each trial it runs,
/// `augur reap-trial` with a pipe on its stdin; if the worker dies (even by SIGKILL) the
/// pipe closes unannounced and the reaper kills the trial's local process groups (those of
/// its `job.handle` that carry the trial's marks), so that no trainer goes on in a trial
/// directory that the server hands to another worker. A worker that ends the trial itself
/// says `done` first.
pub fn reap_trial(handle_file: PathBuf, study_id: StudyId, trial_id: TrialId) {
    let mut said = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut said);
    if said == DONE {
        return;
    }
    let Ok(text) = std::fs::read_to_string(&handle_file) else {
        return;
    };
    if let Ok(JobHandle::ProcessGroups(groups)) = text.trim().parse::<JobHandle>() {
        let killed = crate::dispatch::local::kill_trial_groups(&groups, study_id, trial_id);
        eprintln!(
            "augur: the worker of study {study_id} trial {trial_id} is gone: killed {killed} of its processes"
        );
    }
}
