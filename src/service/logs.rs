//! The logs of dispatched trials: stdout and stderr of every attempt, kept in the trial's
//! directory (`model::trial_dirs`), served from their tail; and where those directories are
//! (`augur tensorboard` reads them).

use std::path::Path;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::trial_files::{self, FileAccess};
use super::{InternalError, Service, ServiceError, ServiceResult};
use crate::model::{ReplicaId, StudyDir, StudyId, StudyKey, TrialDirs, TrialId, TrialJobSpec};

/// The largest tail one request may ask for.
pub const MAX_LOG_TAIL_BYTES: u64 = 16 * 1024 * 1024;

impl Service {
    /// The last `tail_bytes` of a dispatched trial's log, from a line start (empty while its
    /// job starts): the primary replica's, or `replica`'s (`workerpool1-2`) in a cluster.
    pub async fn trial_log(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        replica: Option<&str>,
        tail_bytes: u64,
    ) -> ServiceResult<String> {
        if !(1..=MAX_LOG_TAIL_BYTES).contains(&tail_bytes) {
            return Err(ServiceError::invalid(
                "tail_bytes",
                format!("must be between 1 and {MAX_LOG_TAIL_BYTES}"),
            ));
        }
        let (dirs, job) = self
            .dispatched_trial_dirs(study_id, trial_id, "logs")
            .await?;
        let replica = match replica {
            None => ReplicaId::PRIMARY,
            Some(name) => ReplicaId::parse(name)
                .filter(|id| job.replicas().iter().any(|r| r.id == *id))
                .ok_or_else(|| {
                    let names: Vec<String> = job.replicas().iter().map(|r| r.id.name()).collect();
                    ServiceError::invalid(
                        "replica",
                        format!(
                            "{name:?} is no replica of this study's trials: {}",
                            names.join(", ")
                        ),
                    )
                })?,
        };
        let path = dirs.replica_log(replica);
        let (base, shown) = (dirs.base.clone(), path.clone());
        tokio::task::spawn_blocking(move || read_tail(&base, &path, tail_bytes))
            .await
            .map_err(|e| InternalError::Task("log", e))?
            .map_err(|e| match e.kind() {
                // A link or a file the server did not make where its log should be.
                std::io::ErrorKind::PermissionDenied => ServiceError::conflict(e.to_string()),
                _ => InternalError::File {
                    path: shown,
                    source: e,
                }
                .into(),
            })
    }
}

/// Where a dispatched study's trials keep their files on the server's machine (or the file
/// system it shares with the executors): each path with `{trial}` for a trial's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StudyDirectories {
    /// The study's directory.
    pub study: String,
    /// A trial's directory (its job's log, `job.handle`, the params file).
    pub trial: String,
    /// `AIP_MODEL_DIR`.
    pub model: String,
    /// `AIP_CHECKPOINT_DIR`.
    pub checkpoints: String,
    /// `AIP_TENSORBOARD_LOG_DIR`: what `augur tensorboard` shows.
    pub tensorboard: String,
}

/// What a trial's id stands for in `StudyDirectories`' paths.
pub const TRIAL_PLACEHOLDER: &str = "{trial}";

impl Service {
    /// Where the study's trials keep their files (a study with a `trial_job`).
    pub async fn study_directories(&self, study_id: StudyId) -> ServiceResult<StudyDirectories> {
        let dir = self.dispatched_study_dir(study_id, "directories").await?.0;
        let dirs = TrialDirs::named(&dir, TRIAL_PLACEHOLDER);
        let shown = |p: &Path| p.display().to_string();
        Ok(StudyDirectories {
            study: shown(&dir.dir),
            trial: shown(&dirs.root),
            model: shown(&dirs.model),
            checkpoints: shown(&dirs.checkpoints),
            tensorboard: shown(&dirs.logs),
        })
    }

    /// The directories of a trial of a study with a `trial_job`, and that job; `what` (e.g.
    /// `logs`) names what was asked for in the error of a study without one.
    pub(super) async fn dispatched_trial_dirs(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        what: &str,
    ) -> ServiceResult<(TrialDirs, TrialJobSpec)> {
        let (dir, job) = self.dispatched_study_dir(study_id, what).await?;
        self.trial_record(study_id, trial_id).await?;
        Ok((TrialDirs::new(&dir, trial_id), job))
    }

    /// The directory of a study with a `trial_job`, and that job.
    async fn dispatched_study_dir(
        &self,
        study_id: StudyId,
        what: &str,
    ) -> ServiceResult<(StudyDir, TrialJobSpec)> {
        let study = self.study_record(study_id).await?;
        let Some(job) = study.spec.trial_job else {
            return Err(ServiceError::NotFound(format!(
                "{what} of study {study_id}: it has no trial_job, so its trials' {what} are kept \
                 by whoever ran them"
            )));
        };
        let dir = StudyDir::of(
            &self.runs_base,
            StudyKey {
                id: study_id,
                created_at: study.created_at,
            },
            Some(&job),
        );
        Ok((dir, job))
    }
}

/// The last `tail` bytes of the server's file `path` below `base`, from a line start; empty
/// if it does not exist yet. Never through a link (`trial_files`).
fn read_tail(base: &Path, path: &Path, tail: u64) -> std::io::Result<String> {
    use std::io::{Read, Seek};
    let mut file = match trial_files::open_file(base, path, FileAccess::Read) {
        Ok(f) => f,
        Err(e) if trial_files::is_missing(&e) => return Ok(String::new()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let start = len.saturating_sub(tail);
    file.seek(std::io::SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(match (start > 0, text.find('\n')) {
        (true, Some(i)) => text[i + 1..].to_string(),
        _ => text,
    })
}
