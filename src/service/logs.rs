//! The logs of dispatched trials: stdout and stderr of every attempt, kept in the trial's
//! directory (`model::trial_dirs`), served from their tail.

use std::path::Path;

use super::{Service, ServiceError, ServiceResult};
use crate::model::trial_dirs::study_output_dir;
use crate::model::{ReplicaId, TrialDirs};

/// The largest tail one request may ask for.
pub const MAX_LOG_TAIL_BYTES: u64 = 16 * 1024 * 1024;

impl Service {
    /// The last `tail_bytes` of a dispatched trial's log, from a line start (empty while its
    /// job starts): the primary replica's, or `replica`'s (`workerpool1-2`) in a cluster.
    pub async fn trial_log(
        &self,
        study_id: i64,
        trial_id: i64,
        replica: Option<&str>,
        tail_bytes: u64,
    ) -> ServiceResult<String> {
        if !(1..=MAX_LOG_TAIL_BYTES).contains(&tail_bytes) {
            return Err(ServiceError::invalid(
                "tail_bytes",
                format!("must be between 1 and {MAX_LOG_TAIL_BYTES}"),
            ));
        }
        let study = self.study_record(study_id).await?;
        self.trial_record(study_id, trial_id).await?;
        let Some(job) = &study.spec.trial_job else {
            return Err(ServiceError::NotFound(format!(
                "logs of study {study_id}: it has no trial_job, so its trials' logs are kept by \
                 whoever ran them"
            )));
        };
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
        let output_dir = study_output_dir(&self.runs_base, study_id, job.output_dir.as_deref());
        let path = TrialDirs::new(&output_dir, trial_id).replica_log(replica);
        read_tail(&path, tail_bytes)
            .await
            .map_err(|e| ServiceError::Internal(format!("{}: {e}", path.display())))
    }
}

/// The last `tail` bytes of a file, from a line start; empty if it does not exist yet.
async fn read_tail(path: &Path, tail: u64) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e),
    };
    let len = file.metadata().await?.len();
    let start = len.saturating_sub(tail);
    file.seek(std::io::SeekFrom::Start(start)).await?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(match (start > 0, text.find('\n')) {
        (true, Some(i)) => text[i + 1..].to_string(),
        _ => text,
    })
}
