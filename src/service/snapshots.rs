//! The dashboard's view of a study's trials: a snapshot of every trial's light view
//! (`TrialPoint`) as of the study's `change_seq`. A cache, never the truth: a request whose
//! study has moved on reads only the trials changed since (the same cursor as `changes`), so
//! a live dashboard costs O(changes) per refresh, and concurrent requests for one study wait
//! for a single load instead of each reading 50,000 rows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{InternalError, Service, ServiceResult, not_found_study};
use crate::model::{Measurement, StudyId, StudySpec, TrialId, TrialPoint};

/// Studies kept in the cache; the least recently used goes first.
const CACHED_STUDIES: usize = 8;
/// More changes than this since the snapshot: read everything again instead.
const MAX_INCREMENT: i64 = 10_000;

/// A study and all its trials (by id), as of `change_seq`.
#[derive(Debug, Clone)]
pub struct StudySnapshot {
    pub id: StudyId,
    pub spec: StudySpec,
    /// The study's change counter when it was read: `cursor_after_seq(change_seq)` asks
    /// `changes` for everything later.
    pub change_seq: i64,
    pub trials: Arc<Vec<TrialPoint>>,
}

#[derive(Clone, Default)]
pub(super) struct Snapshots {
    studies: Arc<Mutex<HashMap<StudyId, SnapshotSlot>>>,
}

/// One study's snapshot; its lock makes concurrent requests wait for a single load.
type SnapshotSlot = Arc<tokio::sync::Mutex<Option<Snapshot>>>;

struct Snapshot {
    /// Tells a study apart from a later one that reuses its id.
    created_at: chrono::DateTime<chrono::Utc>,
    change_seq: i64,
    trials: Arc<Vec<TrialPoint>>,
    used: std::time::Instant,
}

impl Snapshots {
    fn slot(&self, study: StudyId) -> ServiceResult<SnapshotSlot> {
        let mut map = self
            .studies
            .lock()
            .map_err(|_| InternalError::Broken("the snapshot cache"))?;
        if !map.contains_key(&study) && map.len() >= CACHED_STUDIES {
            // Evict the least recently used study that nobody is loading right now.
            let oldest = map
                .iter()
                .filter_map(|(id, slot)| Some((*id, slot.try_lock().ok()?.as_ref()?.used)))
                .min_by_key(|(_, used)| *used)
                .map(|(id, _)| id);
            if let Some(id) = oldest {
                map.remove(&id);
            }
        }
        Ok(map.entry(study).or_default().clone())
    }
}

impl Service {
    /// The study and all its trials (by id), as of at least the study's current change.
    pub async fn study_snapshot(&self, study_id: StudyId) -> ServiceResult<StudySnapshot> {
        let record = self
            .store
            .get_study(study_id)
            .await?
            .ok_or_else(|| not_found_study(study_id))?;
        let slot = self.snapshots.slot(study_id)?;
        let mut cached = slot.lock().await;
        let same_study = |s: &Snapshot| s.created_at == record.created_at;
        let trials = match cached.take() {
            Some(snap) if same_study(&snap) && snap.change_seq == record.change_seq => snap.trials,
            Some(snap) if same_study(&snap) && snap.change_seq < record.change_seq => {
                let changed = self
                    .store
                    .trial_points(study_id, Some(snap.change_seq), MAX_INCREMENT + 1)
                    .await?;
                if changed.len() as i64 > MAX_INCREMENT {
                    Arc::new(self.store.trial_points(study_id, None, 0).await?)
                } else {
                    Arc::new(merge_by_id(&snap.trials, changed))
                }
            }
            // None, or a snapshot from before the study was deleted and made again.
            _ => Arc::new(self.store.trial_points(study_id, None, 0).await?),
        };
        *cached = Some(Snapshot {
            created_at: record.created_at,
            change_seq: record.change_seq,
            trials: trials.clone(),
            used: std::time::Instant::now(),
        });
        Ok(StudySnapshot {
            id: record.id,
            // Handed to the dashboard's charts: no webhook secret leaves the service.
            spec: record.spec.redacted(),
            change_seq: record.change_seq,
            trials,
        })
    }

    /// Measurements of trials `first..=last` of a study, by trial then step.
    pub async fn trial_measurements(
        &self,
        study_id: StudyId,
        first_trial: TrialId,
        last_trial: TrialId,
    ) -> ServiceResult<Vec<(TrialId, Measurement)>> {
        Ok(self
            .store
            .measurements(study_id, first_trial, last_trial)
            .await?)
    }
}

/// `base` (sorted by id) with `changed` replacing or adding trials, still sorted by id.
fn merge_by_id(base: &[TrialPoint], mut changed: Vec<TrialPoint>) -> Vec<TrialPoint> {
    changed.sort_by_key(|t| t.id);
    changed.dedup_by_key(|t| t.id);
    let mut out = Vec::with_capacity(base.len() + changed.len());
    let mut next = changed.into_iter().peekable();
    for t in base {
        while next.peek().is_some_and(|c| c.id < t.id) {
            out.extend(next.next());
        }
        if next.peek().is_some_and(|c| c.id == t.id) {
            out.extend(next.next());
        } else {
            out.push(t.clone());
        }
    }
    out.extend(next);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TrialState;

    fn trial(id: i64, state: TrialState) -> TrialPoint {
        TrialPoint {
            id: TrialId::new(id),
            state,
            parameters: Default::default(),
            final_metrics: None,
            early_stopped: false,
            excluded: false,
            budget: None,
        }
    }

    #[test]
    fn merging_changes_replaces_and_appends_by_id() {
        let base: Vec<TrialPoint> = (1..=4).map(|i| trial(i, TrialState::Active)).collect();
        let changed = vec![
            trial(6, TrialState::Requested),
            trial(2, TrialState::Completed),
            trial(5, TrialState::Active),
        ];
        let merged = merge_by_id(&base, changed);
        let ids: Vec<i64> = merged.iter().map(|t| t.id.get()).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5, 6]);
        assert_eq!(merged[1].state, TrialState::Completed);
        assert_eq!(merged[0].state, TrialState::Active);
    }
}
