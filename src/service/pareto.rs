//! The Pareto set of a multi-metric study: trials no other trial beats on every metric.

use augur_optimizer::{Goal, MetricSpec};

use crate::store::TrialRecord;

/// Trials not dominated by any other, in id order. A dominates B when A is at least as good
/// on every metric and better on one. O(n · front size).
pub(super) fn pareto_front(trials: Vec<TrialRecord>, metrics: &[MetricSpec]) -> Vec<TrialRecord> {
    // Each trial as a vector of "larger is better" values.
    let score = |t: &TrialRecord| -> Option<Vec<f64>> {
        let m = t.final_measurement.as_ref()?;
        metrics
            .iter()
            .map(|spec| {
                let v = *m.metrics.get(&spec.id)?;
                Some(if spec.goal == Goal::Maximize { v } else { -v })
            })
            .collect()
    };
    let dominates = |a: &[f64], b: &[f64]| {
        a.iter().zip(b).all(|(x, y)| x >= y) && a.iter().zip(b).any(|(x, y)| x > y)
    };
    let mut front: Vec<(Vec<f64>, TrialRecord)> = Vec::new();
    for trial in trials {
        let Some(s) = score(&trial) else { continue };
        if front.iter().any(|(f, _)| dominates(f, &s)) {
            continue;
        }
        front.retain(|(f, _)| !dominates(&s, f));
        front.push((s, trial));
    }
    let mut out: Vec<TrialRecord> = front.into_iter().map(|(_, t)| t).collect();
    out.sort_by_key(|t| t.id);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::Utc;

    use super::*;
    use crate::model::{Measurement, StudyId, TrialId, TrialState};

    fn trial(id: i64, acc: f64, latency: f64) -> TrialRecord {
        TrialRecord {
            study_id: StudyId::new(1),
            id: TrialId::new(id),
            state: TrialState::Completed,
            parameters: BTreeMap::new(),
            client_id: None,
            final_measurement: Some(Measurement {
                step: 0,
                elapsed_secs: None,
                metrics: [("acc".to_string(), acc), ("latency".to_string(), latency)].into(),
            }),
            objective: Some(acc),
            infeasible_reason: None,
            fail_reason: None,
            early_stopped: false,
            excluded: false,
            lease_expires_at: None,
            created_at: Utc::now(),
            started_at: None,
            completed_at: None,
            change_seq: 0,
            attempts: 0,
            budget: None,
            lineage: None,
        }
    }

    #[test]
    fn front_keeps_only_undominated_trials_for_mixed_goals() {
        let metrics = vec![
            MetricSpec {
                id: "acc".into(),
                goal: Goal::Maximize,
                safety_threshold: None,
            },
            MetricSpec {
                id: "latency".into(),
                goal: Goal::Minimize,
                safety_threshold: None,
            },
        ];
        // 2 dominates 1 (better acc, lower latency); 3 and 4 trade off; 5 equals 3 (kept:
        // equal points do not dominate each other).
        let trials = vec![
            trial(1, 0.80, 20.0),
            trial(2, 0.85, 15.0),
            trial(3, 0.90, 30.0),
            trial(4, 0.70, 5.0),
            trial(5, 0.90, 30.0),
            trial(6, 0.60, 40.0),
        ];
        let ids: Vec<i64> = pareto_front(trials, &metrics)
            .iter()
            .map(|t| t.id.get())
            .collect();
        assert_eq!(ids, vec![2, 3, 4, 5]);
    }
}
