//! A dispatched trial's artifacts: the files its job left in its model (or checkpoint)
//! directory, listed and read without following links (`trial_files`), for the dashboard's
//! trial page and for `augur trial artifacts`.

use std::fs::File;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::trial_files::{self, JobFile};
use super::{InternalError, Service, ServiceError, ServiceResult};
use crate::model::{StudyId, TrialId};

/// Files listed at most; a listing of more says so (`truncated`).
pub const MAX_ARTIFACTS: usize = 2000;
/// Directories below the root listed at most.
pub const MAX_ARTIFACT_DEPTH: usize = 16;

/// Which of a trial's directories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactRoot {
    /// `AIP_MODEL_DIR`: what the trial exports.
    #[default]
    Model,
    /// `AIP_CHECKPOINT_DIR`: what it resumes from.
    Checkpoints,
}

/// One file of a trial's directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    /// Below the directory, `/`-separated: give it as `path` to read the file.
    pub path: String,
    pub size: u64,
    pub modified: chrono::DateTime<chrono::Utc>,
}

/// The files of one of a trial's directories.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactList {
    pub root: ArtifactRoot,
    /// The directory on the server's machine.
    pub directory: String,
    /// In path order; links, devices and names that are not UTF-8 are left out.
    pub files: Vec<Artifact>,
    /// More files (or deeper directories) than a listing holds: some are not shown.
    pub truncated: bool,
}

impl Service {
    pub async fn trial_artifacts(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        root: ArtifactRoot,
    ) -> ServiceResult<ArtifactList> {
        let (base, dir) = self.artifact_dir(study_id, trial_id, root).await?;
        let walked = dir.clone();
        let (files, truncated) = tokio::task::spawn_blocking(move || {
            trial_files::list_job_files(&base, &walked, MAX_ARTIFACTS, MAX_ARTIFACT_DEPTH)
        })
        .await
        .map_err(|e| InternalError::Task("artifacts", e))?
        .map_err(|e| file_error(&dir, e))?;
        Ok(ArtifactList {
            root,
            directory: dir.display().to_string(),
            files: files.into_iter().map(artifact_of).collect(),
            truncated,
        })
    }

    /// One file of a trial's directory, open to read, and its name.
    pub async fn open_trial_artifact(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        root: ArtifactRoot,
        path: &str,
    ) -> ServiceResult<(File, String)> {
        let (base, dir) = self.artifact_dir(study_id, trial_id, root).await?;
        let (opened, relative) = (dir.clone(), path.to_string());
        let file = tokio::task::spawn_blocking(move || {
            trial_files::open_job_file(&base, &opened, &relative)
        })
        .await
        .map_err(|e| InternalError::Task("artifact", e))?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => ServiceError::invalid("path", e.to_string()),
            std::io::ErrorKind::NotFound => ServiceError::NotFound(format!(
                "{path:?} in the {} directory of trial {trial_id}",
                root_name(root)
            )),
            _ => file_error(&dir, e),
        })?;
        let name = path.rsplit('/').next().unwrap_or(path).to_string();
        Ok((file, name))
    }
}

impl Service {
    /// Where walking starts (`TrialDirs::base`) and the trial's directory `root` names.
    async fn artifact_dir(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        root: ArtifactRoot,
    ) -> ServiceResult<(PathBuf, PathBuf)> {
        let (dirs, _) = self
            .dispatched_trial_dirs(study_id, trial_id, "artifacts")
            .await?;
        let dir = match root {
            ArtifactRoot::Model => dirs.model,
            ArtifactRoot::Checkpoints => dirs.checkpoints,
        };
        Ok((dirs.base, dir))
    }
}

fn root_name(root: ArtifactRoot) -> &'static str {
    match root {
        ArtifactRoot::Model => "model",
        ArtifactRoot::Checkpoints => "checkpoints",
    }
}

fn artifact_of(f: JobFile) -> Artifact {
    Artifact {
        path: f.path,
        size: f.size,
        modified: chrono::DateTime::from_timestamp(f.modified, 0).unwrap_or_default(),
    }
}

/// A link or another's file on the way is the job's doing: 409 with the path named.
fn file_error(dir: &std::path::Path, e: std::io::Error) -> ServiceError {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => ServiceError::conflict(e.to_string()),
        _ => InternalError::File {
            path: dir.to_path_buf(),
            source: e,
        }
        .into(),
    }
}
