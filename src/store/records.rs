//! What the store reads and writes, typed; conversion from raw rows lives here so that a
//! corrupt document surfaces as `StoreError::Corrupt`, never as a panic.

use std::collections::BTreeMap;

use augur_optimizer::Assignment;
use chrono::{DateTime, Utc};
use sqlx::types::Json;

use super::{StoreError, StoreResult};
use crate::model::{
    Lineage, Measurement, Role, StudyId, StudySpec, StudyState, TrialCounts, TrialId, TrialKey,
    TrialPoint, TrialState,
};

#[derive(Debug, Clone, PartialEq)]
pub struct StudyRecord {
    pub id: StudyId,
    pub name: String,
    pub state: StudyState,
    pub state_reason: Option<String>,
    pub spec: StudySpec,
    /// The id the next new trial gets.
    pub next_trial_id: TrialId,
    /// Bumped by every committed batch that changed the study or its trials.
    pub change_seq: i64,
    pub designer_state: Option<serde_json::Value>,
    /// The name of the token that created the study (`open` in open mode); `None` for
    /// studies from before roles.
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Its trials by state, as its batches left them (the service keeps them).
    pub trial_counts: TrialCounts,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrialRecord {
    pub study_id: StudyId,
    pub id: TrialId,
    pub state: TrialState,
    pub parameters: Assignment,
    pub client_id: Option<String>,
    pub final_measurement: Option<Measurement>,
    /// The first metric's final value, for ordering by best.
    pub objective: Option<f64>,
    pub infeasible_reason: Option<String>,
    pub fail_reason: Option<String>,
    pub early_stopped: bool,
    pub excluded: bool,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    /// The study's `change_seq` of the batch that last created or changed this trial.
    pub change_seq: i64,
    /// Launches of a dispatched trial counted so far (its retries are `attempts - 1`); in a
    /// multi-fidelity study, at its current budget.
    pub attempts: u32,
    /// The budget of its latest attempt (multi-fidelity studies); `None`: the full budget.
    pub budget: Option<f64>,
    /// PBT: its values by segment, and a checkpoint copy its next attempt must make first.
    pub lineage: Option<Lineage>,
}

/// A dispatched trial's token for one launch: `name` identifies it (one per trial, replaced
/// on every launch), `hash` is what is stored of the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialToken {
    pub name: String,
    pub hash: String,
    pub trial_id: TrialId,
}

impl TrialToken {
    /// Names of trial tokens start with this, and no other token's may (`augur token
    /// create` refuses them): a launch replaces the token of its name.
    pub const NAME_PREFIX: &str = "trial:";

    pub fn name(trial: TrialKey) -> String {
        format!("{}{}:{}", Self::NAME_PREFIX, trial.study, trial.trial)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenRecord {
    pub name: String,
    /// The one trial a trial's token may report to.
    pub scope: Option<TrialKey>,
    /// What a token not scoped to a trial may do (ignored for a trial-scoped one).
    pub role: Role,
    /// Refused after this; `None`: never.
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// When it was last seen, to within a minute.
    pub last_used_at: Option<DateTime<Utc>>,
}

/// A place in a study's order of changes (by `change_seq`, then trial id), as a `/changes`
/// cursor names it: the trials after it are the changes its reader has not seen yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ChangeCursor {
    pub change_seq: i64,
    pub trial: TrialId,
}

/// One entry of the audit trail, as written.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub at: DateTime<Utc>,
    /// The token's name (`open` on an open server, `cli:<user>` for `augur token` on the
    /// database).
    pub actor: String,
    /// What was done, e.g. `study.create`, `trial.exclude`, `token.revoke`.
    pub action: String,
    pub study_id: Option<StudyId>,
    pub trial_id: Option<TrialId>,
    /// What else is worth knowing (a study's name, a token's name and role, a change).
    pub detail: Option<String>,
}

/// A stored audit entry, with its place in the trail.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    pub id: i64,
    pub entry: AuditEntry,
}

/// A webhook call as first written: an event of a study to one URL, no attempt yet.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDelivery {
    pub study_id: StudyId,
    /// `study_completed`, `study_failed`, `trial_failed`, `best_improved`.
    pub event: String,
    pub trial_id: Option<TrialId>,
    /// `study` (the study's own webhook) or `server` (the server's default).
    pub target: String,
    /// As shown: the server's default URL is shown without its path (it may hold a token).
    pub url: String,
    pub created_at: DateTime<Utc>,
}

/// How a webhook call went so far.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryProgress {
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: i32,
    /// The last answer's HTTP status, if one came.
    pub last_status: Option<i32>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// A stored webhook call.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    pub id: i64,
    pub delivery: NewDelivery,
    pub progress: DeliveryProgress,
}

#[derive(sqlx::FromRow)]
pub(super) struct DeliveryRow {
    pub id: i64,
    pub study_id: StudyId,
    pub event: String,
    pub trial_id: Option<TrialId>,
    pub target: String,
    pub url: String,
    pub state: String,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<DeliveryRow> for DeliveryRecord {
    fn from(r: DeliveryRow) -> Self {
        DeliveryRecord {
            id: r.id,
            delivery: NewDelivery {
                study_id: r.study_id,
                event: r.event,
                trial_id: r.trial_id,
                target: r.target,
                url: r.url,
                created_at: r.created_at,
            },
            progress: DeliveryProgress {
                state: r.state,
                attempts: r.attempts,
                last_status: r.last_status,
                last_error: r.last_error,
                updated_at: r.updated_at,
            },
        }
    }
}

/// A server process sharing the database, and the URL the others reach it at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRecord {
    pub id: String,
    pub url: String,
}

#[derive(sqlx::FromRow)]
pub(super) struct StudyRow {
    pub id: StudyId,
    pub name: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub spec: Json<serde_json::Value>,
    pub next_trial_id: TrialId,
    pub change_seq: i64,
    pub designer_state: Option<Json<serde_json::Value>>,
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub n_requested: i64,
    pub n_active: i64,
    pub n_stopping: i64,
    pub n_completed: i64,
    pub n_infeasible: i64,
    pub n_failed: i64,
    pub n_paused: i64,
}

impl TryFrom<StudyRow> for StudyRecord {
    type Error = StoreError;
    fn try_from(r: StudyRow) -> Result<Self, StoreError> {
        let state = StudyState::parse(&r.state)
            .ok_or_else(|| StoreError::Corrupt(format!("study {}: state {:?}", r.id, r.state)))?;
        let spec = serde_json::from_value(r.spec.0)
            .map_err(|e| StoreError::Corrupt(format!("study {}: spec: {e}", r.id)))?;
        Ok(StudyRecord {
            id: r.id,
            name: r.name,
            state,
            state_reason: r.state_reason,
            spec,
            next_trial_id: r.next_trial_id,
            change_seq: r.change_seq,
            designer_state: r.designer_state.map(|j| j.0),
            created_by: r.created_by,
            created_at: r.created_at,
            updated_at: r.updated_at,
            trial_counts: TrialCounts::from_columns([
                r.n_requested,
                r.n_active,
                r.n_stopping,
                r.n_completed,
                r.n_infeasible,
                r.n_failed,
                r.n_paused,
            ]),
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct TrialRow {
    pub study_id: StudyId,
    pub id: TrialId,
    pub state: String,
    pub parameters: Json<serde_json::Value>,
    pub client_id: Option<String>,
    pub final_measurement: Option<Json<serde_json::Value>>,
    pub objective: Option<f64>,
    pub infeasible_reason: Option<String>,
    pub fail_reason: Option<String>,
    pub early_stopped: bool,
    pub excluded: bool,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    pub change_seq: i64,
    pub attempts: i32,
    pub budget: Option<f64>,
    pub lineage: Option<Json<serde_json::Value>>,
}

impl TryFrom<TrialRow> for TrialRecord {
    type Error = StoreError;
    fn try_from(r: TrialRow) -> Result<Self, StoreError> {
        let (study_id, id) = (r.study_id, r.id);
        let corrupt = |what: &str, e: String| {
            StoreError::Corrupt(format!("trial {study_id}/{id}: {what}: {e}"))
        };
        let state = TrialState::parse(&r.state).ok_or_else(|| corrupt("state", r.state.clone()))?;
        // The documents are moved into their types, not copied first.
        let parameters = serde_json::from_value(r.parameters.0)
            .map_err(|e| corrupt("parameters", e.to_string()))?;
        let final_measurement = r
            .final_measurement
            .map(|j| serde_json::from_value(j.0))
            .transpose()
            .map_err(|e| corrupt("final_measurement", e.to_string()))?;
        let lineage = r
            .lineage
            .map(|j| serde_json::from_value(j.0))
            .transpose()
            .map_err(|e| corrupt("lineage", e.to_string()))?;
        Ok(TrialRecord {
            study_id: r.study_id,
            id: r.id,
            state,
            parameters,
            client_id: r.client_id,
            final_measurement,
            objective: r.objective,
            infeasible_reason: r.infeasible_reason,
            fail_reason: r.fail_reason,
            early_stopped: r.early_stopped,
            excluded: r.excluded,
            lease_expires_at: r.lease_expires_at,
            created_at: r.created_at,
            started_at: r.started_at,
            completed_at: r.completed_at,
            change_seq: r.change_seq,
            attempts: r.attempts.max(0) as u32,
            budget: r.budget,
            lineage,
        })
    }
}

/// The JSON columns come as text (`CAST(… AS TEXT)` on both backends) and are parsed once,
/// straight into their types.
#[derive(sqlx::FromRow)]
pub(super) struct TrialPointRow {
    pub study_id: StudyId,
    pub id: TrialId,
    pub state: String,
    pub parameters: String,
    pub final_measurement: Option<String>,
    pub early_stopped: bool,
    pub excluded: bool,
    pub budget: Option<f64>,
}

impl TryFrom<TrialPointRow> for TrialPoint {
    type Error = StoreError;
    fn try_from(r: TrialPointRow) -> Result<Self, StoreError> {
        /// Only the metrics of a stored `Measurement`; its other fields are skipped.
        #[derive(serde::Deserialize)]
        struct FinalMetrics {
            metrics: BTreeMap<String, f64>,
        }
        let corrupt = |what: &str, e: String| {
            StoreError::Corrupt(format!("trial {}/{}: {what}: {e}", r.study_id, r.id))
        };
        let state = TrialState::parse(&r.state).ok_or_else(|| corrupt("state", r.state.clone()))?;
        let parameters = serde_json::from_str(&r.parameters)
            .map_err(|e| corrupt("parameters", e.to_string()))?;
        let final_metrics = match &r.final_measurement {
            Some(text) => Some(
                serde_json::from_str::<FinalMetrics>(text)
                    .map_err(|e| corrupt("final_measurement", e.to_string()))?
                    .metrics,
            ),
            None => None,
        };
        Ok(TrialPoint {
            id: r.id,
            state,
            parameters,
            final_metrics,
            early_stopped: r.early_stopped,
            excluded: r.excluded,
            budget: r.budget,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct MeasurementRow {
    pub trial_id: TrialId,
    pub step: i64,
    pub elapsed_secs: Option<f64>,
    pub metrics: Json<std::collections::BTreeMap<String, f64>>,
}

impl From<MeasurementRow> for (TrialId, Measurement) {
    fn from(r: MeasurementRow) -> Self {
        (
            r.trial_id,
            Measurement {
                step: r.step,
                elapsed_secs: r.elapsed_secs,
                metrics: r.metrics.0,
            },
        )
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct TokenRow {
    pub name: String,
    pub study_id: Option<StudyId>,
    pub trial_id: Option<TrialId>,
    pub role: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

impl TryFrom<TokenRow> for TokenRecord {
    type Error = StoreError;
    fn try_from(r: TokenRow) -> Result<Self, StoreError> {
        let role = Role::parse(&r.role)
            .ok_or_else(|| StoreError::Corrupt(format!("token {:?}: role {:?}", r.name, r.role)))?;
        Ok(TokenRecord {
            name: r.name,
            scope: r
                .study_id
                .zip(r.trial_id)
                .map(|(study, trial)| TrialKey::new(study, trial)),
            role,
            expires_at: r.expires_at,
            created_at: r.created_at,
            last_used_at: r.last_used_at,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct AuditRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub study_id: Option<StudyId>,
    pub trial_id: Option<TrialId>,
    pub detail: Option<String>,
}

impl From<AuditRow> for AuditRecord {
    fn from(r: AuditRow) -> Self {
        AuditRecord {
            id: r.id,
            entry: AuditEntry {
                at: r.at,
                actor: r.actor,
                action: r.action,
                study_id: r.study_id,
                trial_id: r.trial_id,
                detail: r.detail,
            },
        }
    }
}

pub(super) fn to_json<T: serde::Serialize>(v: &T) -> Result<Json<serde_json::Value>, StoreError> {
    serde_json::to_value(v)
        .map(Json)
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Annotations from their rows, by the rows' first column (a trial's id, or a study's):
/// `(key, note, tags as JSON)` and `(key, name, value as JSON)`. `what` names the key in
/// the error of a row that does not parse.
pub(super) fn annotations_by_key<K: Ord + Copy + std::fmt::Display>(
    notes: Vec<(K, Option<String>, String)>,
    attrs: Vec<(K, String, String)>,
    what: &str,
) -> StoreResult<BTreeMap<K, crate::model::Annotations>> {
    let mut out: BTreeMap<K, crate::model::Annotations> = Default::default();
    for (key, note, tags) in notes {
        let entry = out.entry(key).or_default();
        entry.note = note;
        entry.tags = serde_json::from_str(&tags)
            .map_err(|e| StoreError::Corrupt(format!("tags of {what} {key}: {e}")))?;
    }
    for (key, name, value) in attrs {
        let value = serde_json::from_str(&value).map_err(|e| {
            StoreError::Corrupt(format!("user attribute {name} of {what} {key}: {e}"))
        })?;
        out.entry(key).or_default().user_attrs.insert(name, value);
    }
    Ok(out)
}

/// A pool worker's report (`augur worker --pool`): what it has and how much of it is busy.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolWorkerReport {
    pub pool: String,
    pub worker: String,
    pub host: String,
    pub slots: i64,
    /// JSON array of its GPU ids.
    pub gpus: String,
    /// Busy slots now (at most `slots`).
    pub busy: i64,
}

/// A pool worker as stored: its last report and its slot-seconds so far.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PoolWorkerRecord {
    pub pool: String,
    pub worker: String,
    pub host: String,
    pub slots: i64,
    pub gpus: String,
    pub busy: i64,
    pub registered_at_ms: i64,
    pub last_seen_ms: i64,
    pub busy_slot_secs: f64,
    pub idle_slot_secs: f64,
}

/// A pool's busy and idle slot-seconds in one minute.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PoolUsageRecord {
    /// The minute's start, Unix milliseconds.
    pub minute_ms: i64,
    pub busy_slot_secs: f64,
    pub idle_slot_secs: f64,
}
