//! Where a trial's progress and outcome go: straight to the service for the dispatcher's
//! trials ([`ServiceReporter`]), or over HTTP for `augur worker`'s (`cli/worker.rs`).

use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::error::DispatchResult;
use crate::model::{Measurement, StudyId, TrialId};
use crate::service::{Completion, Service, ServiceError, ServiceResult, hash_token, new_token};

/// How long a report waits out a database outage (a restart, a failover) before it gives
/// up: the trial's job keeps running meanwhile, and its report is made once the database is
/// back.
pub const OUTAGE_PATIENCE: Duration = Duration::from_secs(120);

/// `call` again, backing off from 0.2 s to 5 s, while the database is unavailable or a
/// report's outcome is unknown (caught in its commit), for up to [`OUTAGE_PATIENCE`]. Every
/// report is safe to repeat: a measurement replaces itself, a second completion or failure
/// is a conflict taken as done. (A launch counted just before the connection broke may be
/// counted twice: one retry less for that trial.)
pub async fn patiently<T, F, Fut>(what: &str, mut call: F) -> ServiceResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ServiceResult<T>>,
{
    let started = Instant::now();
    let mut wait = Duration::from_millis(200);
    loop {
        match call().await {
            Err(ServiceError::Unavailable(why) | ServiceError::Unanswered(why))
                if started.elapsed() < OUTAGE_PATIENCE =>
            {
                tracing::warn!(%why, ?wait, "{what}: the database is unavailable; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

/// A launch, counted.
pub struct AttemptStart {
    /// 1 for the first launch that counts.
    pub number: u32,
    /// `AUGUR_TRIAL_TOKEN` for this launch.
    pub token: Option<String>,
}

#[async_trait]
pub trait TrialReporter: Send + Sync {
    async fn measurement(&self, trial_id: TrialId, measurement: Measurement) -> DispatchResult<()>;
    /// Record `last` (measurements not reported yet), then complete from all the trial's
    /// measurements (`measurement_selection`). `Ok(false)` when there is none to select.
    async fn complete_with(
        &self,
        trial_id: TrialId,
        last: Vec<Measurement>,
    ) -> DispatchResult<bool>;
    async fn fail(&self, trial_id: TrialId, reason: String) -> DispatchResult<()>;
    async fn should_stop(&self, trial_id: TrialId) -> DispatchResult<bool>;
    /// Whether the trial already finished (the job completed it over HTTP).
    async fn finished(&self, trial_id: TrialId) -> DispatchResult<bool>;
    /// Charge one launch against the trial's `max_attempts` before it starts (durably, where
    /// the reporter can) and issue the token it reports with. `Ok(None)`: none left.
    async fn start_attempt(
        &self,
        trial_id: TrialId,
        max_attempts: u32,
    ) -> DispatchResult<Option<AttemptStart>>;
    /// Give back a launch that this side ended itself (shutdown, or a leftover job killed
    /// after a restart): it says nothing about the trial.
    async fn refund_attempt(&self, trial_id: TrialId) -> DispatchResult<()>;
    /// PBT: the checkpoint the trial was to copy is copied (its parent may train on).
    async fn checkpoint_copied(&self, trial_id: TrialId) -> DispatchResult<()>;
}

/// Reports a dispatched trial's outcome straight to the service.
pub struct ServiceReporter {
    pub service: Service,
    pub study_id: StudyId,
    /// The dispatcher's owner id: its reports count only while it holds the runner lease.
    pub owner: String,
}

#[async_trait]
impl TrialReporter for ServiceReporter {
    async fn measurement(&self, trial_id: TrialId, measurement: Measurement) -> DispatchResult<()> {
        Ok(patiently("measurement", || {
            self.service.record_measurement(
                self.study_id,
                &self.owner,
                trial_id,
                measurement.clone(),
            )
        })
        .await?)
    }

    async fn complete_with(
        &self,
        trial_id: TrialId,
        last: Vec<Measurement>,
    ) -> DispatchResult<bool> {
        let completed = patiently("completion", || {
            let outcome = Completion::Selected(last.clone());
            self.service
                .record_completion(self.study_id, &self.owner, trial_id, outcome)
        })
        .await;
        match completed {
            Ok(()) => Ok(true),
            Err(ServiceError::Invalid(_)) => Ok(false),
            // Completed meanwhile (by the job over HTTP).
            Err(ServiceError::Conflict { .. }) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    async fn fail(&self, trial_id: TrialId, reason: String) -> DispatchResult<()> {
        let failed = patiently("failure", || {
            self.service
                .record_failure(self.study_id, &self.owner, trial_id, reason.clone())
        })
        .await;
        match failed {
            Ok(()) | Err(ServiceError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    // Asked every 250 ms: an outage makes it say "no" (the caller ignores errors) rather
    // than wait.
    async fn should_stop(&self, trial_id: TrialId) -> DispatchResult<bool> {
        Ok(self.service.should_stop(self.study_id, trial_id).await?)
    }

    async fn finished(&self, trial_id: TrialId) -> DispatchResult<bool> {
        let unfinished = patiently("trial state", || {
            self.service.trial_unfinished(self.study_id, trial_id)
        })
        .await?;
        Ok(!unfinished)
    }

    // The count and the token go in the study's next batch, with its other changes.
    async fn start_attempt(
        &self,
        trial_id: TrialId,
        max_attempts: u32,
    ) -> DispatchResult<Option<AttemptStart>> {
        let token = new_token();
        let number = patiently("launch", || {
            self.service.start_attempt(
                self.study_id,
                &self.owner,
                trial_id,
                max_attempts,
                hash_token(&token),
            )
        })
        .await?;
        Ok(number.map(|number| AttemptStart {
            number,
            token: Some(token),
        }))
    }

    async fn refund_attempt(&self, trial_id: TrialId) -> DispatchResult<()> {
        Ok(patiently("refund", || {
            self.service
                .refund_attempt(self.study_id, &self.owner, trial_id)
        })
        .await?)
    }

    async fn checkpoint_copied(&self, trial_id: TrialId) -> DispatchResult<()> {
        Ok(patiently("checkpoint copied", || {
            self.service
                .checkpoint_copied(self.study_id, &self.owner, trial_id)
        })
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A report caught in its commit (outcome unknown) is sent again, as after an outage:
    /// every report is safe to repeat, and giving up leaves the trial active until its
    /// lease runs out.
    #[tokio::test]
    async fn a_report_answered_unanswered_or_unavailable_is_sent_again() {
        let calls = AtomicU32::new(0);
        let outcome = patiently("complete", || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 => Err(ServiceError::Unavailable("restarting".into())),
                    1 => Err(ServiceError::Unanswered("commit cut".into())),
                    _ => Ok(n),
                }
            }
        })
        .await;
        assert!(matches!(outcome, Ok(2)), "{outcome:?}");
        // Any other error is the caller's at once.
        let refused = patiently("complete", || async {
            Err::<(), _>(ServiceError::conflict("finished"))
        })
        .await;
        assert!(matches!(refused, Err(ServiceError::Conflict { .. })));
    }
}
