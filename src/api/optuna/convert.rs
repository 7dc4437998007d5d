//! Optuna's messages to the service's types and back: trial ids, states, datetimes, and
//! attribute values (JSON text on the wire, JSON values in Augur).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value as JsonValue;

use super::error::{OptunaError, OptunaResult};
use super::proto;
use crate::model::{StudyId, TrialId, TrialKey};
use crate::service::optuna::{OptunaState, OptunaStudy, OptunaTemplate, OptunaTrial};

/// Optuna names a trial by one id across studies; Augur by its study and its number there.
/// The study id is the high half: ids grow with the trial within a study, which
/// `GetTrials`' `trial_id_greater_than` relies on.
const STUDY_SHIFT: u32 = 32;
const TRIAL_MASK: i64 = (1 << STUDY_SHIFT) - 1;

/// Optuna's trial id of Augur's trial `trial_id` of `study_id`.
pub fn trial_key(study_id: StudyId, trial_id: TrialId) -> OptunaResult<i64> {
    let (study, trial) = (study_id.get(), trial_id.get());
    if !(0..(1 << 31)).contains(&study) || !(0..=TRIAL_MASK).contains(&trial) {
        return Err(OptunaError::Api(crate::api::error::ApiError::Internal(
            format!("study {study_id} trial {trial_id} has no Optuna trial id"),
        )));
    }
    Ok((study << STUDY_SHIFT) | trial)
}

/// The study and Augur trial an Optuna trial id names.
pub fn trial_of_key(key: i64) -> OptunaResult<TrialKey> {
    let (study, trial) = (key >> STUDY_SHIFT, key & TRIAL_MASK);
    if key <= 0 || study == 0 || trial == 0 {
        return Err(OptunaError::not_found(format!("trial {key}")));
    }
    Ok(TrialKey::new(StudyId::new(study), TrialId::new(trial)))
}

/// `trial_id_greater_than` as an Augur trial id within `study_id`.
pub fn after_in_study(study_id: StudyId, key: i64) -> TrialId {
    let study = study_id.get();
    TrialId::new(if key < (study << STUDY_SHIFT) {
        0
    } else if key >= ((study + 1) << STUDY_SHIFT) {
        i64::MAX
    } else {
        key & TRIAL_MASK
    })
}

/// Optuna's `included_trial_ids` that are trials of `study_id`, as Augur's ids.
pub fn included_in_study(study_id: StudyId, keys: &[i64]) -> Vec<TrialId> {
    keys.iter()
        .filter_map(|k| trial_of_key(*k).ok())
        .filter(|key| key.study == study_id)
        .map(|key| key.trial)
        .collect()
}

pub fn maximize_of(directions: &[i32]) -> OptunaResult<Vec<bool>> {
    directions
        .iter()
        .map(|d| match proto::StudyDirection::try_from(*d) {
            Ok(proto::StudyDirection::Minimize) => Ok(false),
            Ok(proto::StudyDirection::Maximize) => Ok(true),
            Err(_) => Err(OptunaError::invalid(
                "directions",
                format!("{d} is no study direction"),
            )),
        })
        .collect()
}

fn directions(maximize: &[bool]) -> Vec<i32> {
    maximize
        .iter()
        .map(|m| {
            if *m {
                proto::StudyDirection::Maximize as i32
            } else {
                proto::StudyDirection::Minimize as i32
            }
        })
        .collect()
}

pub fn state_of(state: i32) -> OptunaResult<OptunaState> {
    Ok(match proto::TrialState::try_from(state) {
        Ok(proto::TrialState::Running) => OptunaState::Running,
        Ok(proto::TrialState::Complete) => OptunaState::Complete,
        Ok(proto::TrialState::Pruned) => OptunaState::Pruned,
        Ok(proto::TrialState::Fail) => OptunaState::Fail,
        Ok(proto::TrialState::Waiting) => OptunaState::Waiting,
        Err(_) => {
            return Err(OptunaError::invalid(
                "state",
                format!("{state} is no trial state"),
            ));
        }
    })
}

fn proto_state(state: OptunaState) -> i32 {
    (match state {
        OptunaState::Running => proto::TrialState::Running,
        OptunaState::Complete => proto::TrialState::Complete,
        OptunaState::Pruned => proto::TrialState::Pruned,
        OptunaState::Fail => proto::TrialState::Fail,
        OptunaState::Waiting => proto::TrialState::Waiting,
    }) as i32
}

/// An attribute value or distribution: JSON text (what the client's `json.dumps` wrote).
pub fn json_of(field: &str, text: &str) -> OptunaResult<JsonValue> {
    serde_json::from_str(text)
        .map_err(|e| OptunaError::invalid(field, format!("not JSON Augur can keep: {e}")))
}

fn json_map(
    attrs: HashMap<String, String>,
    field: &str,
) -> OptunaResult<BTreeMap<String, JsonValue>> {
    attrs
        .into_iter()
        .map(|(k, v)| Ok((k, json_of(field, &v)?)))
        .collect()
}

fn text_map(attrs: BTreeMap<String, JsonValue>) -> HashMap<String, String> {
    attrs.into_iter().map(|(k, v)| (k, v.to_string())).collect()
}

/// ISO 8601 with microseconds and the UTC offset, as Optuna writes them; "" for none.
fn datetime_text(at: Option<DateTime<Utc>>) -> String {
    at.map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, false))
        .unwrap_or_default()
}

fn datetime_of(field: &str, text: &str) -> OptunaResult<Option<DateTime<Utc>>> {
    if text.is_empty() {
        return Ok(None);
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| Some(t.with_timezone(&Utc)))
        .map_err(|e| OptunaError::invalid(field, format!("{text:?} is no ISO 8601 time: {e}")))
}

pub fn study_message(study: OptunaStudy) -> proto::Study {
    proto::Study {
        study_id: study.id.get(),
        study_name: study.name,
        directions: directions(&study.maximize),
        user_attributes: text_map(study.user_attrs),
        system_attributes: text_map(study.system_attrs),
    }
}

pub fn study_directions(study: &OptunaStudy) -> Vec<i32> {
    directions(&study.maximize)
}

pub fn attr_texts(attrs: BTreeMap<String, JsonValue>) -> HashMap<String, String> {
    text_map(attrs)
}

pub fn trial_message(trial: OptunaTrial) -> OptunaResult<proto::Trial> {
    Ok(proto::Trial {
        trial_id: trial_key(trial.study_id, trial.id)?,
        number: trial.number(),
        state: proto_state(trial.state),
        values: trial.values.unwrap_or_default(),
        datetime_start: datetime_text(trial.started_at),
        datetime_complete: datetime_text(trial.completed_at),
        params: trial.params.into_iter().collect(),
        distributions: text_map(trial.distributions),
        user_attributes: text_map(trial.user_attrs),
        system_attributes: text_map(trial.system_attrs),
        intermediate_values: trial.intermediate_values.into_iter().collect(),
    })
}

/// The client's template of a new trial (an enqueued or added one).
pub fn template_of(trial: proto::Trial) -> OptunaResult<OptunaTemplate> {
    let state = state_of(trial.state)?;
    let distributions = json_map(trial.distributions, "template_trial.distributions")?;
    if let Some(name) = trial
        .params
        .keys()
        .find(|p| !distributions.contains_key(*p))
    {
        return Err(OptunaError::invalid(
            "template_trial.params",
            format!("parameter {name:?} has no distribution"),
        ));
    }
    Ok(OptunaTemplate {
        study_id: StudyId::new(0),
        id: TrialId::new(0),
        state,
        // Only a finished trial has values; Optuna sends none as an empty list.
        values: (state.is_finished() && !trial.values.is_empty()).then_some(trial.values),
        started_at: datetime_of("template_trial.datetime_start", &trial.datetime_start)?,
        completed_at: datetime_of("template_trial.datetime_complete", &trial.datetime_complete)?,
        params: trial.params.into_iter().collect(),
        distributions,
        user_attrs: json_map(trial.user_attributes, "template_trial.user_attributes")?,
        system_attrs: json_map(trial.system_attributes, "template_trial.system_attributes")?,
        intermediate_values: trial.intermediate_values.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trial_id_names_its_study_and_trial_and_grows_with_the_trial() {
        let key = trial_key(StudyId::new(7), TrialId::new(3)).expect("in range");
        assert_eq!(
            trial_of_key(key).expect("valid"),
            TrialKey::new(StudyId::new(7), TrialId::new(3))
        );
        assert!(trial_key(StudyId::new(7), TrialId::new(4)).expect("in range") > key);
        assert_eq!(after_in_study(StudyId::new(7), -1), TrialId::new(0));
        assert_eq!(after_in_study(StudyId::new(7), key), TrialId::new(3));
        assert_eq!(after_in_study(StudyId::new(6), key), TrialId::new(i64::MAX));
        assert!(trial_of_key(0).is_err());
        assert!(trial_of_key(7).is_err());
        assert_eq!(
            included_in_study(
                StudyId::new(7),
                &[
                    key,
                    trial_key(StudyId::new(8), TrialId::new(1)).expect("ok")
                ]
            ),
            vec![TrialId::new(3)]
        );
    }

    #[test]
    fn a_trial_survives_the_trip_through_its_message_and_back() {
        let at = DateTime::parse_from_rfc3339("2026-12-05T13:10:00.123456+00:00")
            .expect("a time")
            .with_timezone(&Utc);
        let trial = OptunaTrial {
            study_id: StudyId::new(2),
            id: TrialId::new(5),
            state: OptunaState::Complete,
            values: Some(vec![0.5, -1.25]),
            started_at: Some(at),
            completed_at: Some(at),
            params: BTreeMap::from([("x".into(), 0.25)]),
            distributions: BTreeMap::from([(
                "x".into(),
                serde_json::json!({"name": "FloatDistribution",
                    "attributes": {"low": 0.0, "high": 1.0, "step": null, "log": false}}),
            )]),
            user_attrs: BTreeMap::from([("note".into(), serde_json::json!("hi"))]),
            system_attrs: BTreeMap::from([("k".into(), serde_json::json!([1, 2.5]))]),
            intermediate_values: BTreeMap::from([(0, 1.0), (3, 0.5)]),
        };
        let message = trial_message(trial.clone()).expect("a message");
        assert_eq!(message.number, 4);
        assert_eq!(message.datetime_start, "2026-12-05T13:10:00.123456+00:00");
        let back = template_of(message).expect("a template");
        assert_eq!(
            OptunaTrial {
                study_id: StudyId::new(2),
                id: TrialId::new(5),
                ..back
            },
            trial
        );
    }
}
