//! Study-level stopping (Vertex AI's `studySpec.studyStoppingConfig`): when a study has
//! stopped making progress, or has run enough trials, it ends before its `max_trials`.

use augur_optimizer::Goal;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;

/// Study-level stopping, as Vertex's `studyStoppingConfig` (snake_case). Each rule is off
/// when absent. A study stops when the first of `max_num_trials`,
/// `max_num_trials_no_progress` and `max_duration_no_progress_secs` says so, but never
/// before it has `min_num_trials` completed trials.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StudyStoppingSpec {
    /// With fewer completed trials than this, the study does not stop by these rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_num_trials: Option<i64>,
    /// Once this many trials exist (of any state), no new one starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_trials: Option<i64>,
    /// Stop when this many completed trials in a row have not improved on the best one
    /// (single objective only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_trials_no_progress: Option<i64>,
    /// Stop when no completed trial has improved on the best one for this many seconds
    /// (single objective only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_no_progress_secs: Option<i64>,
    /// Augur's own (Vertex has no such field): a trial is progress only when it beats the
    /// best by more than this, in the objective's units. 0 (the default): any improvement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_delta_change: Option<f64>,
    /// When a rule of progress fires: true stops the running trials at once; false (the
    /// default) lets them finish, starting no new one, and the study ends when they have.
    /// The trials within `max_num_trials` always finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub should_stop_asap: bool,
}

/// [`StudyStoppingSpec`] validated, with the goal of the objective it watches.
///
/// Study-level stopping (Vertex AI's `studySpec.studyStoppingConfig`): when a study has
/// stopped making progress, or has run enough trials, it ends before its `max_trials`. The
/// wire form ([`StudyStoppingSpec`]), its validation into [`StudyStopping`], and the decision
/// itself ([`StudyStopping::verdict`]): pure, over the study's completed trials in the order
/// they completed. The state machine (`service/state_machine.rs`, `settle_study_state`)
/// asks it before each new trial and after each completion, and acts on the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyStopping {
    pub min_num_trials: u64,
    pub max_num_trials: Option<u64>,
    pub max_num_trials_no_progress: Option<u64>,
    pub max_duration_no_progress: Option<Duration>,
    pub min_delta_change: f64,
    pub should_stop_asap: bool,
    /// The goal of the study's objective; `None` for a study with several objectives,
    /// which only `max_num_trials` may stop.
    pub goal: Option<Goal>,
}

/// Why the study should stop, and whether `should_stop_asap` may stop its running trials:
/// not for `max_num_trials`, whose trials are all within the count (like `max_trials`).
#[derive(Debug, Clone, PartialEq)]
pub struct StopVerdict {
    /// Recorded as the study's `state_reason`.
    pub reason: String,
    pub may_interrupt: bool,
}

/// A completed trial as the rule sees it: its objective value and when it completed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinishedTrial {
    pub objective: f64,
    pub completed_at: DateTime<Utc>,
}

/// A whole number between `min` and 1,000,000, named for its error.
fn count(value: Option<i64>, field: &str, min: i64) -> Result<Option<u64>, ValidationError> {
    match value {
        None => Ok(None),
        Some(v) if (min..=1_000_000).contains(&v) => Ok(Some(v as u64)),
        Some(_) => Err(ValidationError::new(
            format!("study_stopping.{field}"),
            format!("must be between {min} and 1000000"),
        )),
    }
}

impl StudyStoppingSpec {
    /// `objectives` are the goals of the study's objective metrics (safety metrics are none).
    pub fn validate(&self, objectives: &[Goal]) -> Result<StudyStopping, ValidationError> {
        let min_num_trials = count(self.min_num_trials, "min_num_trials", 0)?.unwrap_or(0);
        let max_num_trials = count(self.max_num_trials, "max_num_trials", 1)?;
        let max_num_trials_no_progress = count(
            self.max_num_trials_no_progress,
            "max_num_trials_no_progress",
            1,
        )?;
        let max_duration_no_progress = match self.max_duration_no_progress_secs {
            None => None,
            Some(secs) if (1..=365 * 24 * 3600).contains(&secs) => Some(Duration::seconds(secs)),
            Some(_) => {
                return Err(ValidationError::new(
                    "study_stopping.max_duration_no_progress_secs",
                    "must be between 1 and 31536000 (a year)",
                ));
            }
        };
        let min_delta_change = self.min_delta_change.unwrap_or(0.0);
        if !(min_delta_change.is_finite() && min_delta_change >= 0.0) {
            return Err(ValidationError::new(
                "study_stopping.min_delta_change",
                "must be a finite number, 0 or more",
            ));
        }
        if let Some(max) = max_num_trials
            && min_num_trials > max
        {
            return Err(ValidationError::new(
                "study_stopping.min_num_trials",
                format!("must not be more than max_num_trials ({max})"),
            ));
        }
        // Progress is an improvement of one objective; with several there is no "best".
        let goal = match objectives {
            [goal] => Some(*goal),
            _ => None,
        };
        if goal.is_none() {
            let progress_rules = [
                (
                    "max_num_trials_no_progress",
                    max_num_trials_no_progress.is_some(),
                ),
                (
                    "max_duration_no_progress_secs",
                    max_duration_no_progress.is_some(),
                ),
                ("min_delta_change", self.min_delta_change.is_some()),
            ];
            if let Some((field, _)) = progress_rules.iter().find(|(_, set)| *set) {
                return Err(ValidationError::new(
                    format!("study_stopping.{field}"),
                    format!(
                        "applies to a study with one objective metric; this one has {}",
                        objectives.len()
                    ),
                ));
            }
        }
        Ok(StudyStopping {
            min_num_trials,
            max_num_trials,
            max_num_trials_no_progress,
            max_duration_no_progress,
            min_delta_change,
            should_stop_asap: self.should_stop_asap,
            goal,
        })
    }
}

impl StudyStopping {
    /// How many more trials one suggestion may make, so that a batch of them does not run
    /// past `max_num_trials`. Once there, the verdict says stop, unless `min_num_trials`
    /// holds it back: then as many as the study's other limits allow.
    pub fn room(&self, created: u64) -> u64 {
        match self.max_num_trials {
            Some(max) if created < max => max - created,
            _ => u64::MAX,
        }
    }

    /// Whether the study should stop now, and why (the reason the study records), given how
    /// many trials it has made (`created`, of any state) and its completed trials in the order
    /// they completed. Vertex's order of the rules: `min_num_trials` first (fewer completed
    /// trials: never stop), then the trial count, then the trials and the time without
    /// progress. Progress is a trial better than the best before it by more than
    /// `min_delta_change` (the first completed trial is progress); the time without progress
    /// runs from the completion of the last trial that made some, so it needs one.
    pub fn verdict(
        &self,
        created: u64,
        completed: &[FinishedTrial],
        now: DateTime<Utc>,
    ) -> Option<StopVerdict> {
        let stop = |reason: String, may_interrupt| {
            Some(StopVerdict {
                reason,
                may_interrupt,
            })
        };
        if (completed.len() as u64) < self.min_num_trials {
            return None;
        }
        if let Some(max) = self.max_num_trials
            && created >= max
        {
            return stop(
                format!("study_stopping: {created} trials made (max_num_trials: {max})"),
                false,
            );
        }
        let goal = self.goal?;
        let mut best: Option<f64> = None;
        let mut last_progress: Option<DateTime<Utc>> = None;
        let mut without_progress = 0u64;
        for trial in completed {
            let progress = match best {
                None => true,
                Some(b) => match goal {
                    Goal::Maximize => trial.objective > b + self.min_delta_change,
                    Goal::Minimize => trial.objective < b - self.min_delta_change,
                },
            };
            if progress {
                best = Some(trial.objective);
                last_progress = Some(trial.completed_at);
                without_progress = 0;
            } else {
                without_progress += 1;
            }
        }
        if let Some(max) = self.max_num_trials_no_progress
            && without_progress >= max
        {
            return stop(
                format!(
                    "study_stopping: {without_progress} completed trials without progress \
                     (max_num_trials_no_progress: {max})"
                ),
                true,
            );
        }
        if let (Some(max), Some(at)) = (self.max_duration_no_progress, last_progress)
            && now - at >= max
        {
            return stop(
                format!(
                    "study_stopping: no progress for {} s (max_duration_no_progress_secs: {})",
                    (now - at).num_seconds(),
                    max.num_seconds()
                ),
                true,
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap_or_default()
    }

    /// Trials completing a minute apart with these objective values.
    fn trials(values: &[f64]) -> Vec<FinishedTrial> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| FinishedTrial {
                objective: *v,
                completed_at: at(60 * i as i64),
            })
            .collect()
    }

    fn rule(spec: StudyStoppingSpec) -> StudyStopping {
        spec.validate(&[Goal::Maximize]).expect("valid")
    }

    #[test]
    fn trials_without_progress_stop_the_study_once_there_are_that_many_in_a_row() {
        let r = rule(StudyStoppingSpec {
            max_num_trials_no_progress: Some(3),
            ..Default::default()
        });
        let now = at(3600);
        assert!(r.verdict(4, &trials(&[0.5, 0.4, 0.3, 0.2]), now).is_some());
        assert_eq!(r.verdict(3, &trials(&[0.5, 0.4, 0.3]), now), None);
        // A new best starts the count again.
        assert_eq!(r.verdict(5, &trials(&[0.5, 0.4, 0.6, 0.3, 0.2]), now), None);
        let verdict = r.verdict(6, &trials(&[0.5, 0.4, 0.6, 0.3, 0.2, 0.1]), now);
        let reason = verdict.as_ref().map(|v| v.reason.as_str()).unwrap_or("");
        assert!(reason.contains("max_num_trials_no_progress: 3"), "{reason}");
        assert!(verdict.is_some_and(|v| v.may_interrupt));
    }

    #[test]
    fn a_minimized_objective_makes_progress_downwards() {
        let r = StudyStoppingSpec {
            max_num_trials_no_progress: Some(2),
            ..Default::default()
        }
        .validate(&[Goal::Minimize])
        .expect("valid");
        assert_eq!(r.verdict(3, &trials(&[0.5, 0.4, 0.3]), at(0)), None);
        assert!(r.verdict(3, &trials(&[0.3, 0.4, 0.5]), at(0)).is_some());
    }

    #[test]
    fn min_num_trials_holds_every_rule_back_until_that_many_have_completed() {
        let r = rule(StudyStoppingSpec {
            min_num_trials: Some(5),
            max_num_trials: Some(5),
            max_num_trials_no_progress: Some(1),
            ..Default::default()
        });
        let flat = trials(&[0.5, 0.5, 0.5, 0.5]);
        assert_eq!(r.verdict(9, &flat, at(0)), None, "4 completed < 5");
        assert!(r.verdict(9, &trials(&[0.5; 5]), at(0)).is_some());
    }

    #[test]
    fn max_num_trials_counts_trials_made_of_any_state() {
        let r = rule(StudyStoppingSpec {
            max_num_trials: Some(4),
            ..Default::default()
        });
        assert_eq!(r.verdict(3, &trials(&[0.1, 0.2]), at(0)), None);
        let verdict = r.verdict(4, &trials(&[0.1, 0.2]), at(0));
        let reason = verdict.as_ref().map(|v| v.reason.as_str()).unwrap_or("");
        assert!(reason.contains("max_num_trials: 4"), "{reason}");
        assert!(
            verdict.is_some_and(|v| !v.may_interrupt),
            "the trials within the count always finish"
        );
        assert_eq!(
            r.room(1),
            3,
            "a suggestion of many makes no more than the rest"
        );
        assert_eq!(r.room(4), u64::MAX, "past it the verdict decides");
    }

    #[test]
    fn time_without_progress_runs_from_the_last_trial_that_made_some() {
        let r = rule(StudyStoppingSpec {
            max_duration_no_progress_secs: Some(300),
            ..Default::default()
        });
        // Best at 0 s (0.9), then worse trials at 60 and 120 s.
        let done = trials(&[0.9, 0.1, 0.2]);
        assert_eq!(r.verdict(3, &done, at(299)), None);
        assert!(r.verdict(3, &done, at(300)).is_some());
        assert_eq!(
            r.verdict(0, &[], at(100_000)),
            None,
            "no trial: no progress to lack"
        );
    }

    #[test]
    fn an_improvement_within_min_delta_change_is_no_progress() {
        let r = rule(StudyStoppingSpec {
            max_num_trials_no_progress: Some(2),
            min_delta_change: Some(0.1),
            ..Default::default()
        });
        // 0.55 and 0.59 beat 0.5 by less than 0.1: two trials without progress.
        assert!(r.verdict(3, &trials(&[0.5, 0.55, 0.59]), at(0)).is_some());
        assert_eq!(r.verdict(3, &trials(&[0.5, 0.55, 0.61]), at(0)), None);
    }

    #[test]
    fn bad_values_are_named_by_their_field() {
        let field = |spec: StudyStoppingSpec, objectives: &[Goal]| {
            spec.validate(objectives).err().map(|e| e.field)
        };
        let one = [Goal::Maximize];
        assert_eq!(
            field(
                StudyStoppingSpec {
                    min_delta_change: Some(-1.0),
                    ..Default::default()
                },
                &one
            ),
            Some("study_stopping.min_delta_change".into())
        );
        assert_eq!(
            field(
                StudyStoppingSpec {
                    max_num_trials_no_progress: Some(0),
                    ..Default::default()
                },
                &one
            ),
            Some("study_stopping.max_num_trials_no_progress".into())
        );
        assert_eq!(
            field(
                StudyStoppingSpec {
                    min_num_trials: Some(9),
                    max_num_trials: Some(3),
                    ..Default::default()
                },
                &one
            ),
            Some("study_stopping.min_num_trials".into())
        );
        assert_eq!(
            field(
                StudyStoppingSpec {
                    max_duration_no_progress_secs: Some(60),
                    ..Default::default()
                },
                &[Goal::Maximize, Goal::Minimize]
            ),
            Some("study_stopping.max_duration_no_progress_secs".into())
        );
        assert_eq!(
            field(
                StudyStoppingSpec {
                    max_num_trials: Some(3),
                    ..Default::default()
                },
                &[Goal::Maximize, Goal::Minimize]
            ),
            None,
            "a trial count needs no single objective"
        );
    }
}
