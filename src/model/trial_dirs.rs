//! Where a dispatched trial's files are (DESIGN §4): one layout for the dispatcher that
//! creates them, `augur worker`, and the service that serves their logs.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use super::{OutputLayout, ReplicaId, TrialJobSpec};
use crate::model::{StudyId, TrialId};

/// What tells a study's directory from every other study's, of this database or another:
/// its id and when it was made, to the millisecond (`study-<id>-<YYYYMMDDTHHMMSS.mmm>`; the
/// service stores creation times to the millisecond, so every reader names it alike). Ids
/// alone restart at 1 in a new database, and a study run again against a fresh one found
/// the first's checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StudyKey {
    pub id: StudyId,
    pub created_at: DateTime<Utc>,
}

impl StudyKey {
    /// The study's directory name (`output_layout: study`).
    pub fn dir_name(&self) -> String {
        format!(
            "study-{}-{}",
            self.id,
            self.created_at.format("%Y%m%dT%H%M%S%.3f")
        )
    }
}

/// Where a study's trial directories are: below `base`, the directory the operator named
/// (`trial_job.output_dir`, relative ones under the server's runs base) or
/// `<runs base>/augur-runs`, in `dir`, the study's own (`<base>/study-<id>-<created>`;
/// `<base>/study-<id>` for studies from before it, `<base>` itself for `output_layout:
/// trial`). Everything below `base` is the server's to make, and is reached without
/// following links (`service::trial_files`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StudyDir {
    pub base: PathBuf,
    pub dir: PathBuf,
}

impl StudyDir {
    /// The directories of `study`'s trials, for its `trial_job` (`None`: a job with no
    /// `output_dir`, e.g. `augur worker`'s, under `runs_base`).
    pub fn of(runs_base: &Path, study: StudyKey, job: Option<&TrialJobSpec>) -> StudyDir {
        let layout = job.map(|j| j.output_layout).unwrap_or_default();
        match job.and_then(|j| j.output_dir.as_deref()) {
            Some(dir) => StudyDir::below(runs_base.join(dir), study, layout),
            // `trial` needs an output_dir of the study's own.
            None => StudyDir::below(
                runs_base.join("augur-runs"),
                study,
                match layout {
                    OutputLayout::StudyId => OutputLayout::StudyId,
                    _ => OutputLayout::Study,
                },
            ),
        }
    }

    /// The study's directory in `base` for `layout`.
    pub fn below(base: PathBuf, study: StudyKey, layout: OutputLayout) -> StudyDir {
        let dir = match layout {
            OutputLayout::Study => base.join(study.dir_name()),
            OutputLayout::StudyId => base.join(format!("study-{}", study.id)),
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
    pub fn new(study: &StudyDir, trial_id: TrialId) -> TrialDirs {
        TrialDirs::named(study, &trial_id.to_string())
    }

    /// The directories of the trial whose directory is `name`: `TrialDirs::new`'s, or with
    /// a placeholder such as `{trial}` for a template a client fills in.
    pub fn named(study: &StudyDir, name: &str) -> TrialDirs {
        let root = study.dir.join(name);
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

    fn key(id: i64, created: &str) -> StudyKey {
        StudyKey {
            id: StudyId::new(id),
            created_at: created.parse().expect("time"),
        }
    }

    #[test]
    fn relative_output_dirs_live_under_the_base_and_each_study_has_its_own() {
        let base = Path::new("/srv/augur");
        let study = key(3, "2026-12-04T15:54:07.123456Z");
        let job = |dir: Option<&str>, layout| TrialJobSpec {
            output_dir: dir.map(str::to_string),
            output_layout: layout,
            ..TrialJobSpec::default()
        };
        let dirs = |dir, layout| StudyDir::of(base, study, Some(&job(dir, layout)));
        assert_eq!(
            dirs(Some("runs/svc"), OutputLayout::Study),
            StudyDir {
                base: "/srv/augur/runs/svc".into(),
                dir: "/srv/augur/runs/svc/study-3-20261204T155407.123".into()
            }
        );
        assert_eq!(
            dirs(Some("/data/runs"), OutputLayout::Trial).dir,
            Path::new("/data/runs")
        );
        assert_eq!(
            dirs(Some("/data/runs"), OutputLayout::StudyId).dir,
            Path::new("/data/runs/study-3")
        );
        let default = StudyDir {
            base: "/srv/augur/augur-runs".into(),
            dir: "/srv/augur/augur-runs/study-3-20261204T155407.123".into(),
        };
        assert_eq!(dirs(None, OutputLayout::Study), default);
        assert_eq!(dirs(None, OutputLayout::Trial), default);
        assert_eq!(StudyDir::of(base, study, None), default);
        assert_eq!(
            dirs(None, OutputLayout::StudyId).dir,
            Path::new("/srv/augur/augur-runs/study-3")
        );
        let trial = TrialDirs::new(
            &dirs(Some("/data/runs"), OutputLayout::Study),
            TrialId::new(7),
        );
        assert_eq!(
            trial.checkpoints,
            Path::new("/data/runs/study-3-20261204T155407.123/7/checkpoints")
        );
        assert_eq!(trial.base, Path::new("/data/runs"));
    }

    #[test]
    fn the_same_study_id_in_another_database_has_another_directory() {
        let first = key(1, "2026-12-01T09:00:00Z");
        let again = key(1, "2026-12-04T10:30:15Z");
        let base = PathBuf::from("/runs");
        assert_ne!(
            StudyDir::below(base.clone(), first, OutputLayout::Study).dir,
            StudyDir::below(base, again, OutputLayout::Study).dir
        );
    }
}
