//! Where a dispatched trial's files are (DESIGN §4): one layout for the dispatcher that
//! creates them, `augur worker`, and the service that serves their logs.

use std::path::{Path, PathBuf};

use super::ReplicaId;

/// The base of a study's per-trial directories: its `trial_job.output_dir` (relative ones
/// under `runs_base`), or `<runs_base>/augur-runs/study-<id>`.
pub fn study_output_dir(runs_base: &Path, study_id: i64, job_output_dir: Option<&str>) -> PathBuf {
    match job_output_dir {
        Some(dir) => runs_base.join(dir),
        None => runs_base
            .join("augur-runs")
            .join(format!("study-{study_id}")),
    }
}

/// The per-trial paths: `<output_dir>/<trial>/{model,checkpoints,logs}/`, the hypertune
/// metric file, the params file and the job's log. The same on every attempt, so a retried
/// trial finds its checkpoints.
#[derive(Debug, Clone)]
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

    /// Where a replica's stdout and stderr go: the trial's `job.log` for the primary, and
    /// `replicas/<workerpoolP-I>.log` for the others.
    pub fn replica_log(&self, replica: ReplicaId) -> PathBuf {
        if replica.is_primary() {
            self.job_log.clone()
        } else {
            self.replicas_dir().join(format!("{}.log", replica.name()))
        }
    }

    /// The hypertune file of a replica: the trial's for the primary (its metrics are the
    /// trial's), one of its own for every other, so that they do not overwrite each other.
    pub fn replica_metric_file(&self, replica: ReplicaId) -> PathBuf {
        if replica.is_primary() {
            self.metric_file.clone()
        } else {
            self.replicas_dir()
                .join(format!("{}.metrics", replica.name()))
        }
    }

    /// The directory of the non-primary replicas' logs and metric files.
    pub fn replicas_dir(&self) -> PathBuf {
        self.root.join("replicas")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_output_dirs_live_under_the_base_and_absent_ones_per_study() {
        let base = Path::new("/srv/augur");
        assert_eq!(
            study_output_dir(base, 3, Some("runs/svc")),
            Path::new("/srv/augur/runs/svc")
        );
        assert_eq!(
            study_output_dir(base, 3, Some("/data/runs")),
            Path::new("/data/runs")
        );
        assert_eq!(
            study_output_dir(base, 3, None),
            Path::new("/srv/augur/augur-runs/study-3")
        );
        let dirs = TrialDirs::new(Path::new("/data/runs"), 7);
        assert_eq!(dirs.checkpoints, Path::new("/data/runs/7/checkpoints"));
        assert_eq!(dirs.job_log, Path::new("/data/runs/7/job.log"));
    }
}
