//! The optimal trials: the best one, or the Pareto set of a study with several objectives,
//! among the trials that are safe by the study's safety thresholds.

use augur_optimizer::{Goal, MetricSpec, is_safe, objective_metrics};

use super::{Service, ServiceResult, pareto, stored_config};
use crate::model::{StudyConfig, StudyId, StudySpec, Trial, TrialState};
use crate::store::TrialRecord;

impl Service {
    /// The best trial, or the Pareto set of a multi-objective study; safe trials only.
    pub async fn optimal_trials(&self, study_id: StudyId) -> ServiceResult<Vec<Trial>> {
        let study = self.study_record(study_id).await?;
        let config = stored_config(&study)?;
        let records = self.optimal_records(study_id, &config).await?;
        if records.is_empty()
            && let Some(best) = self.provisional_best(study_id, &study.spec).await?
        {
            let view = self.trial_view(study_id, best).await?;
            return Ok(vec![Trial {
                provisional: true,
                ..view
            }]);
        }
        self.trial_views(study_id, records).await
    }

    /// Under a scheduler, while no trial is measured at the full budget: the best of the
    /// highest rung that safe trials reached (paused or stopped there), for the callers to
    /// show as provisional. One objective only; `None` otherwise.
    pub(super) async fn provisional_best(
        &self,
        study_id: StudyId,
        spec: &StudySpec,
    ) -> ServiceResult<Option<TrialRecord>> {
        if spec.scheduler.is_none() {
            return Ok(None);
        }
        let config = spec.validate().map_err(super::corrupt_spec(study_id))?;
        let Some(metric) = config.first_objective().cloned() else {
            return Ok(None);
        };
        if objective_metrics(&config.metrics).len() != 1 {
            return Ok(None);
        }
        let reached: Vec<TrialRecord> = self
            .store
            .all_trials(study_id)
            .await?
            .into_iter()
            .filter(|t| {
                !t.excluded
                    && t.budget.is_some()
                    && matches!(t.state, TrialState::Paused | TrialState::Completed)
            })
            .filter(|t| {
                t.final_measurement.as_ref().is_some_and(|m| {
                    config.metrics.iter().all(|s| m.metrics.contains_key(&s.id))
                        && is_safe(&config.metrics, &m.metrics)
                })
            })
            .collect();
        let Some(top) = reached.iter().filter_map(|t| t.budget).reduce(f64::max) else {
            return Ok(None);
        };
        let at_top = reached
            .into_iter()
            .filter(|t| t.budget == Some(top))
            .collect();
        Ok(best_of(at_top, &metric))
    }

    pub(super) async fn optimal_records(
        &self,
        study_id: StudyId,
        config: &StudyConfig,
    ) -> ServiceResult<Vec<TrialRecord>> {
        let objectives: Vec<MetricSpec> = objective_metrics(&config.metrics)
            .into_iter()
            .cloned()
            .collect();
        let constrained = config.metrics.iter().any(MetricSpec::is_safety);
        if let [only] = objectives.as_slice()
            && !constrained
        {
            // The store ranks trials by their objective (`objective` column) by itself,
            // whatever the study's size.
            let maximize = only.goal == Goal::Maximize;
            return Ok(self
                .store
                .best_trial(study_id, maximize)
                .await?
                .into_iter()
                .collect());
        }
        let safe: Vec<TrialRecord> = self
            .store
            .all_trials(study_id)
            .await?
            .into_iter()
            .filter(|t| t.state == TrialState::Completed && !t.excluded)
            .filter(|t| {
                t.final_measurement.as_ref().is_some_and(|m| {
                    config.metrics.iter().all(|s| m.metrics.contains_key(&s.id))
                        && is_safe(&config.metrics, &m.metrics)
                })
            })
            .collect();
        Ok(match objectives.as_slice() {
            [only] => best_of(safe, only).into_iter().collect(),
            _ => pareto::pareto_front(safe, &objectives),
        })
    }

    /// The study's best trial as its view shows it: of its one objective (safe trials only),
    /// none for a multi-objective study.
    pub(super) async fn best_trial_record(
        &self,
        study_id: StudyId,
        spec: &StudySpec,
    ) -> ServiceResult<Option<TrialRecord>> {
        let unconstrained = spec.metrics.iter().all(|m| m.safety_threshold.is_none());
        if let ([only], true) = (spec.metrics.as_slice(), unconstrained) {
            let maximize = only.goal == crate::model::MetricGoal::Maximize;
            return Ok(self.store.best_trial(study_id, maximize).await?);
        }
        if unconstrained {
            return Ok(None);
        }
        let config = spec.validate().map_err(super::corrupt_spec(study_id))?;
        if objective_metrics(&config.metrics).len() != 1 {
            return Ok(None);
        }
        Ok(self
            .optimal_records(study_id, &config)
            .await?
            .into_iter()
            .next())
    }
}

/// The trial with the best value of `metric`; the earliest among equals.
fn best_of(trials: Vec<TrialRecord>, metric: &MetricSpec) -> Option<TrialRecord> {
    let value = |t: &TrialRecord| {
        t.final_measurement
            .as_ref()
            .and_then(|m| m.metrics.get(&metric.id).copied())
            .unwrap_or(f64::NAN)
    };
    trials
        .into_iter()
        .filter(|t| value(t).is_finite())
        .reduce(|best, t| {
            let better = match metric.goal {
                Goal::Maximize => value(&t) > value(&best),
                Goal::Minimize => value(&t) < value(&best),
            };
            if better { t } else { best }
        })
}
