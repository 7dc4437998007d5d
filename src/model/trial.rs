//! Studies and trials as the API shows them, and their states.

use std::collections::BTreeMap;

use augur_optimizer::Assignment;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{StudyId, StudySpec, TrialId};

/// `requested → active → (stopping →) completed | infeasible | failed`; in a multi-fidelity
/// study `active → paused → active …` between rungs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TrialState {
    /// Created, waiting for a worker to take it.
    Requested,
    /// Handed to a worker (or a dispatched job) and running.
    Active,
    /// The early-stopping rule asked it to stop; it completes with its selected measurement.
    Stopping,
    Completed,
    Infeasible,
    Failed,
    /// Its attempt ended at a rung below the full budget: it waits for the scheduler to
    /// promote it (resume it from its checkpoint at a larger budget) or stop it, and holds
    /// no slot.
    Paused,
}

impl TrialState {
    pub const ALL: [TrialState; 7] = [
        TrialState::Requested,
        TrialState::Active,
        TrialState::Stopping,
        TrialState::Completed,
        TrialState::Infeasible,
        TrialState::Failed,
        TrialState::Paused,
    ];

    /// Unfinished trials count against `parallel_trials`.
    pub fn is_unfinished(self) -> bool {
        matches!(
            self,
            TrialState::Requested | TrialState::Active | TrialState::Stopping
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TrialState::Requested => "requested",
            TrialState::Active => "active",
            TrialState::Stopping => "stopping",
            TrialState::Completed => "completed",
            TrialState::Infeasible => "infeasible",
            TrialState::Failed => "failed",
            TrialState::Paused => "paused",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// `active → completed | stopped | failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StudyState {
    Active,
    /// Every trial of the budget finished (or the grid was exhausted).
    Completed,
    /// Stopped by a user.
    Stopped,
    /// `max_failed_trials` trials failed.
    Failed,
}

impl StudyState {
    pub const ALL: [StudyState; 4] = [
        StudyState::Active,
        StudyState::Completed,
        StudyState::Stopped,
        StudyState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StudyState::Active => "active",
            StudyState::Completed => "completed",
            StudyState::Stopped => "stopped",
            StudyState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// Metric values at one step of a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Measurement {
    /// Training step (epoch, iteration); one measurement per step, a later report replaces it.
    pub step: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_secs: Option<f64>,
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Trial {
    /// Counts from 1 within a study.
    #[schema(value_type = i64)]
    pub id: TrialId,
    pub state: TrialState,
    /// Values of the active parameters.
    #[schema(value_type = BTreeMap<String, serde_json::Value>)]
    pub parameters: Assignment,
    pub measurements: Vec<Measurement>,
    pub final_measurement: Option<Measurement>,
    pub infeasible_reason: Option<String>,
    pub fail_reason: Option<String>,
    pub client_id: Option<String>,
    /// Completed because the early-stopping rule asked it to stop.
    pub early_stopped: bool,
    /// Kept and shown, but not given to the optimizer nor counted as best.
    pub excluded: bool,
    /// Launches of a trial run by the service (`trial_job`), retries included; 0 for trials
    /// run by workers, which count their own.
    #[serde(default)]
    pub attempts: u32,
    /// Multi-fidelity studies: the budget of its latest attempt (`fidelity.argument`, a
    /// whole number for whole budgets); absent for the full budget of other studies.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_when_integral"
    )]
    #[schema(value_type = Option<f64>)]
    pub budget: Option<f64>,
    /// PBT studies: the trial's values over its segments, and whose checkpoint each started
    /// from; absent until the trial first copies another's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// In a suggestion only: the trial is handed out again to go on from where it stopped (a
    /// multi-fidelity promotion, PBT's next segment), at `budget`, with its measurements so
    /// far; a worker runs it in the trial's own directories and resumes from its checkpoint.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resume: bool,
    /// As a study's `best_trial` or in its optimal trials only: no trial is measured at the
    /// full budget yet (multi-fidelity), so this is the best of the highest rung reached,
    /// at its `budget`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provisional: bool,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    /// Its note, tags and user attributes (`PATCH` the trial to change them). Reads of the
    /// trial carry them; the answers of suggest, reports and completions leave them out.
    #[serde(flatten)]
    pub annotations: super::Annotations,
}

/// PBT: how a trial's values changed over its segments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Lineage {
    /// From its first values on, one per exploit.
    pub segments: Vec<Segment>,
    /// Set while the trial's next attempt must first copy this trial's checkpoint into its
    /// own (the trial copied must not train on meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub copying_from: Option<TrialId>,
}

/// One segment of a PBT trial: the values it trained with from `from_budget` on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Segment {
    /// The budget the segment starts at (0: the trial's start).
    #[serde(serialize_with = "whole_budget")]
    pub from_budget: f64,
    /// The trial whose checkpoint (at `from_budget`) the segment started from; absent: its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub parent: Option<TrialId>,
    #[schema(value_type = BTreeMap<String, serde_json::Value>)]
    pub parameters: Assignment,
}

fn whole_budget<S: serde::Serializer>(budget: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    whole_when_integral(&Some(*budget), serializer)
}

/// A budget as JSON: `9`, not `9.0`, when it is whole (what trainers and clients expect of
/// epochs).
fn whole_when_integral<S: serde::Serializer>(
    budget: &Option<f64>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match budget {
        Some(b) if b.fract() == 0.0 && b.abs() < 9.0e15 => serializer.serialize_i64(*b as i64),
        Some(b) => serializer.serialize_f64(*b),
        None => serializer.serialize_none(),
    }
}

/// Trials of a study by state, and in all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrialCounts {
    pub requested: u64,
    pub active: u64,
    pub stopping: u64,
    pub completed: u64,
    pub infeasible: u64,
    pub failed: u64,
    /// Multi-fidelity studies: trials waiting at a rung.
    pub paused: u64,
    pub total: u64,
}

impl TrialCounts {
    pub fn add(&mut self, state: TrialState, n: u64) {
        *self.slot(state) += n;
        self.total += n;
    }

    /// The counts from stored per-state columns (requested, active, stopping, completed,
    /// infeasible, failed, paused), the total their sum.
    pub fn from_columns(columns: [i64; 7]) -> Self {
        let mut counts = TrialCounts::default();
        for (state, n) in TrialState::ALL.into_iter().zip(columns) {
            counts.add(state, n.max(0) as u64);
        }
        counts
    }

    /// The per-state counts in the order of [`TrialCounts::from_columns`].
    pub fn columns(&self) -> [i64; 7] {
        [
            self.requested,
            self.active,
            self.stopping,
            self.completed,
            self.infeasible,
            self.failed,
            self.paused,
        ]
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// A trial moved from `from` (`None`: it is new) to `to`.
    pub fn moved(&mut self, from: Option<TrialState>, to: TrialState) {
        if from == Some(to) {
            return;
        }
        if let Some(from) = from {
            let slot = self.slot(from);
            *slot = slot.saturating_sub(1);
            self.total = self.total.saturating_sub(1);
        }
        self.add(to, 1);
    }

    fn slot(&mut self, state: TrialState) -> &mut u64 {
        match state {
            TrialState::Requested => &mut self.requested,
            TrialState::Active => &mut self.active,
            TrialState::Stopping => &mut self.stopping,
            TrialState::Completed => &mut self.completed,
            TrialState::Infeasible => &mut self.infeasible,
            TrialState::Failed => &mut self.failed,
            TrialState::Paused => &mut self.paused,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Study {
    #[schema(value_type = i64)]
    pub id: StudyId,
    pub name: String,
    pub state: StudyState,
    /// Why the study ended, when it failed or was stopped.
    pub state_reason: Option<String>,
    /// The spec with defaults filled in (and the seed chosen, when none was given).
    pub spec: StudySpec,
    pub trial_counts: TrialCounts,
    /// The best completed trial (first metric), absent for multi-metric studies: see
    /// `optimal_trials`.
    pub best_trial: Option<Trial>,
    /// The name of the token that created the study (`open` on an open server); absent for
    /// studies from before tokens had roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Its note, tags and user attributes (`PATCH` the study to change them).
    #[serde(flatten)]
    pub annotations: super::Annotations,
}

/// What the dashboard needs of a trial, read for every trial of a study at once: no
/// timestamps, reasons or client ids, and only the metrics of the final measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialPoint {
    pub id: TrialId,
    pub state: TrialState,
    pub parameters: Assignment,
    /// The final measurement's metrics, if the trial has one.
    pub final_metrics: Option<BTreeMap<String, f64>>,
    pub early_stopped: bool,
    pub excluded: bool,
    /// Its latest attempt's budget (multi-fidelity); `None`: the full budget.
    pub budget: Option<f64>,
}
