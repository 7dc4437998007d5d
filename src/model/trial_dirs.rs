//! Where a dispatched trial's files are (DESIGN §4): one layout for the dispatcher that
//! creates them, `augur worker`, and the service that serves their logs.

use std::path::{Path, PathBuf};

use super::{OutputLayout, ReplicaId, TrialJobSpec};

/// Where a study's trial directories are: below `base`, the directory the operator named
/// (`trial_job.output_dir`, relative ones under the server's runs base) or
/// `<runs base>/augur-runs`, in `dir`, the study's own (`<base>/study-<id>`; `<base>` itself
/// for `output_layout: trial`). Everything below `base` is the server's to make, and is
/// reached without following links (`service::trial_files`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StudyDir {
    pub base: PathBuf,
    pub dir: PathBuf,
}

impl StudyDir {
    /// The directories of study `study_id`'s trials, for its `trial_job` (`None`: a job with
    /// no `output_dir`, e.g. `augur worker`'s, under `runs_base`).
    pub fn of(runs_base: &Path, study_id: i64, job: Option<&TrialJobSpec>) -> StudyDir {
        match job.and_then(|j| j.output_dir.as_deref().map(|d| (d, j.output_layout))) {
            Some((dir, layout)) => StudyDir::below(runs_base.join(dir), study_id, layout),
            None => StudyDir::below(runs_base.join("augur-runs"), study_id, OutputLayout::Study),
        }
    }

    /// The study's directory in `base` for `layout`.
    pub fn below(base: PathBuf, study_id: i64, layout: OutputLayout) -> StudyDir {
        let dir = match layout {
            OutputLayout::Study => base.join(format!("study-{study_id}")),
            OutputLayout::Trial => base.clone(),
        };
        StudyDir { base, dir }
    }
}

/// The per-trial paths: `<study dir>/<trial>/{model,checkpoints,logs}/`, the hypertune
/// metric file, the params file and the job's log. The same on every attempt, so a retried
/// trial finds its checkpoints. The trial's directory and `replicas/` are the server's (its
/// logs, handle and scripts live there); the job writes only its own directories and files.
#[derive(Debug, Clone)]
pub struct TrialDirs {
    /// Where walking without links starts (`StudyDir::base`).
    pub base: PathBuf,
    pub root: PathBuf,
    pub model: PathBuf,
    pub checkpoints: PathBuf,
    pub logs: PathBuf,
    pub metric_file: PathBuf,
    pub params_file: PathBuf,
    pub job_log: PathBuf,
}

impl TrialDirs {
    pub fn new(study: &StudyDir, trial_id: i64) -> TrialDirs {
        let root = study.dir.join(trial_id.to_string());
        TrialDirs {
            base: study.base.clone(),
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

    /// `job.handle`: what identifies the trial's running job to the executor. Non-empty
    /// only while a launch's outcome is unrecorded.
    pub fn handle_file(&self) -> PathBuf {
        self.root.join("job.handle")
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
    fn relative_output_dirs_live_under_the_base_and_each_study_has_its_own() {
        let base = Path::new("/srv/augur");
        let job = |dir: Option<&str>, layout| TrialJobSpec {
            output_dir: dir.map(str::to_string),
            output_layout: layout,
            ..TrialJobSpec::default()
        };
        let dirs = |dir, layout| StudyDir::of(base, 3, Some(&job(dir, layout)));
        assert_eq!(
            dirs(Some("runs/svc"), OutputLayout::Study),
            StudyDir {
                base: "/srv/augur/runs/svc".into(),
                dir: "/srv/augur/runs/svc/study-3".into()
            }
        );
        assert_eq!(
            dirs(Some("/data/runs"), OutputLayout::Trial).dir,
            Path::new("/data/runs")
        );
        let default = StudyDir {
            base: "/srv/augur/augur-runs".into(),
            dir: "/srv/augur/augur-runs/study-3".into(),
        };
        assert_eq!(dirs(None, OutputLayout::Study), default);
        assert_eq!(dirs(None, OutputLayout::Trial), default);
        assert_eq!(StudyDir::of(base, 3, None), default);
        let trial = TrialDirs::new(&dirs(Some("/data/runs"), OutputLayout::Study), 7);
        assert_eq!(
            trial.checkpoints,
            Path::new("/data/runs/study-3/7/checkpoints")
        );
        assert_eq!(trial.job_log, Path::new("/data/runs/study-3/7/job.log"));
        assert_eq!(trial.base, Path::new("/data/runs"));
    }
}
