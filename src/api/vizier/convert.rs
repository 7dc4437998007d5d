//! Vizier's resources from Augur's and back: a Vizier `StudySpec` read through the Vertex
//! spec import (`model::vertex`, one mapping for both), studies and trials written in proto3
//! JSON (enums by name or number as the caller asked, int64 as strings, RFC 3339 times).

use std::collections::BTreeMap;

use augur_optimizer::{Assignment, Value};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value as Json, json};

use super::types::{MeasurementInput, TrialInput};
use crate::api::error::ApiError;
use crate::model::{Measurement, Study, StudyId, StudySpec, StudyState, Trial, TrialState, vertex};

/// Vizier studies have no trial budget: this many trials, then the study completes (raise it
/// with `PATCH /v1/studies/{id}`).
pub const DEFAULT_MAX_TRIALS: i64 = 10_000;
/// Vizier has no cap on running trials; Augur keeps one for every study.
pub const DEFAULT_PARALLEL_TRIALS: i64 = 100;
/// Vizier workers send no heartbeats: a pending trial stays its worker's for a day (a worker
/// asking again with its clientId gets it back) before another may take it.
pub const TRIAL_LEASE_SECS: i64 = 24 * 3600;

/// Each enum field of Vizier's study messages, with its values' names and numbers
/// (`study.proto`); one table read both ways.
const ENUMS: [(&str, &[(&str, i64)]); 5] = [
    (
        "goal",
        &[
            ("GOAL_TYPE_UNSPECIFIED", 0),
            ("MAXIMIZE", 1),
            ("MINIMIZE", 2),
        ],
    ),
    (
        "scaleType",
        &[
            ("SCALE_TYPE_UNSPECIFIED", 0),
            ("UNIT_LINEAR_SCALE", 1),
            ("UNIT_LOG_SCALE", 2),
            ("UNIT_REVERSE_LOG_SCALE", 3),
        ],
    ),
    (
        "algorithm",
        &[
            ("ALGORITHM_UNSPECIFIED", 0),
            ("GRID_SEARCH", 2),
            ("RANDOM_SEARCH", 3),
        ],
    ),
    (
        "measurementSelectionType",
        &[
            ("MEASUREMENT_SELECTION_TYPE_UNSPECIFIED", 0),
            ("LAST_MEASUREMENT", 1),
            ("BEST_MEASUREMENT", 2),
        ],
    ),
    (
        "observationNoise",
        &[
            ("OBSERVATION_NOISE_UNSPECIFIED", 0),
            ("LOW", 1),
            ("HIGH", 2),
        ],
    ),
];

/// How the caller wants enums written: numbers when it asked `enum-encoding=int` (the SDK
/// always does), names otherwise, as proto3 JSON prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    pub int_enums: bool,
}

impl Encoding {
    fn enum_value(self, name: &str, number: i64) -> Json {
        if self.int_enums {
            json!(number)
        } else {
            json!(name)
        }
    }
}

/// Trial.State of a trial. Vizier has no failed state: a failed trial is infeasible, with
/// its failure as the reason. A paused (multi-fidelity) trial is still the worker's.
fn trial_state(state: TrialState) -> (&'static str, i64) {
    match state {
        TrialState::Requested => ("REQUESTED", 1),
        TrialState::Active | TrialState::Paused => ("ACTIVE", 2),
        TrialState::Stopping => ("STOPPING", 3),
        TrialState::Completed => ("SUCCEEDED", 4),
        TrialState::Infeasible | TrialState::Failed => ("INFEASIBLE", 5),
    }
}

/// Study.State: an active study takes trials; a stopped or failed one is inactive.
pub fn study_state(state: StudyState, enc: Encoding) -> Json {
    let (name, number) = match state {
        StudyState::Active => ("ACTIVE", 1),
        StudyState::Stopped | StudyState::Failed => ("INACTIVE", 2),
        StudyState::Completed => ("COMPLETED", 3),
    };
    enc.enum_value(name, number)
}

pub fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A Vizier `StudySpec` (proto3 JSON, enums as names or numbers) as an Augur spec named
/// `display_name`, through the Vertex import; errors name Vizier's fields (`studySpec.…`).
pub fn spec_from_vizier(display_name: &str, study_spec: &Json) -> Result<StudySpec, ApiError> {
    let mut study_spec = study_spec.clone();
    enums_to_names(&mut study_spec);
    fill_zeros(&mut study_spec, "");
    let job = json!({
        "displayName": display_name,
        "maxTrialCount": DEFAULT_MAX_TRIALS,
        "parallelTrialCount": DEFAULT_PARALLEL_TRIALS,
        "studySpec": study_spec,
    });
    let imported = vertex::from_vertex(&job).map_err(|mut e| {
        // The import checks Augur's spec last, in Augur's names: say Vizier's.
        if e.field == "name" {
            e.field = "displayName".into();
        }
        ApiError::from(e)
    })?;
    for warning in &imported.warnings {
        tracing::info!(%warning, "Vizier study spec");
    }
    let mut spec = imported.spec;
    spec.trial_lease_secs = TRIAL_LEASE_SECS;
    Ok(spec)
}

/// Enum numbers as their names, wherever a field of [`ENUMS`] holds one; an unknown number
/// becomes its text, which the import refuses naming the field.
fn enums_to_names(doc: &mut Json) {
    match doc {
        Json::Object(map) => {
            for (key, value) in map.iter_mut() {
                if let (Some((_, values)), Some(n)) =
                    (ENUMS.iter().find(|(field, _)| field == key), value.as_i64())
                {
                    *value = match values.iter().find(|(_, number)| *number == n) {
                        Some((name, _)) => json!(name),
                        None => json!(n.to_string()),
                    };
                } else {
                    enums_to_names(value);
                }
            }
        }
        Json::Array(items) => items.iter_mut().for_each(enums_to_names),
        _ => {}
    }
}

/// Proto3 JSON leaves out a field that holds its zero: a bound of 0 (`add_float_param("x",
/// 0, 1)` sends no `minValue`) or a safety threshold of 0 is there, as 0, not missing.
fn fill_zeros(doc: &mut Json, parent: &str) {
    let zeros: &[&str] = match parent {
        "doubleValueSpec" | "integerValueSpec" => &["minValue", "maxValue"],
        "safetyConfig" => &["safetyThreshold"],
        _ => &[],
    };
    match doc {
        Json::Object(map) => {
            for key in zeros {
                map.entry(key.to_string()).or_insert(json!(0));
            }
            for (key, value) in map.iter_mut() {
                fill_zeros(value, key);
            }
        }
        Json::Array(items) => items.iter_mut().for_each(|item| fill_zeros(item, parent)),
        _ => {}
    }
}

/// An Augur spec as Vizier's `StudySpec`: the Vertex export's, with enums encoded as asked
/// and int64 fields as strings.
pub fn spec_to_vizier(spec: &StudySpec, enc: Encoding) -> Json {
    let mut doc = vertex::to_vertex(spec)
        .get_mut("studySpec")
        .map(Json::take)
        .unwrap_or_else(|| json!({}));
    encode(&mut doc, "", enc);
    doc
}

/// Names to numbers (when asked) and int64 values to strings, in place; `parent` is the key
/// that holds `doc`.
fn encode(doc: &mut Json, parent: &str, enc: Encoding) {
    match doc {
        Json::Object(map) => {
            for (key, value) in map.iter_mut() {
                let int64 = (parent == "integerValueSpec"
                    && matches!(key.as_str(), "minValue" | "maxValue"))
                    || (parent == "parentIntValues" && key == "values");
                if int64 {
                    stringify_ints(value);
                } else if let (Some((_, values)), Some(name)) =
                    (ENUMS.iter().find(|(field, _)| field == key), value.as_str())
                {
                    if let Some((name, number)) = values.iter().find(|(n, _)| *n == name) {
                        *value = enc.enum_value(name, *number);
                    }
                } else {
                    encode(value, key, enc);
                }
            }
        }
        Json::Array(items) => items.iter_mut().for_each(|item| encode(item, parent, enc)),
        _ => {}
    }
}

fn stringify_ints(value: &mut Json) {
    match value {
        Json::Number(n) => *value = json!(n.to_string()),
        Json::Array(items) => items.iter_mut().for_each(stringify_ints),
        _ => {}
    }
}

/// `projects/{project}/locations/{location}`: where a study was created (kept in its user
/// attributes), or where it is read from for a study made through Augur's own API.
pub struct Place<'a> {
    pub project: &'a str,
    pub location: &'a str,
}

/// The user attributes that keep a Vizier study's project and location.
pub const PROJECT_ATTR: &str = "vertex.project";
pub const LOCATION_ATTR: &str = "vertex.location";

/// Where a study was created through Vizier, as its user attributes keep it.
fn kept_place(study: &Study) -> Option<Place<'_>> {
    let attr = |key: &str| study.annotations.user_attrs.get(key).and_then(Json::as_str);
    Some(Place {
        project: attr(PROJECT_ATTR)?,
        location: attr(LOCATION_ATTR)?,
    })
}

/// Where a study lives: as kept, else where it was asked for.
pub fn study_place<'a>(study: &'a Study, asked: &Place<'a>) -> Place<'a> {
    kept_place(study).unwrap_or(Place {
        project: asked.project,
        location: asked.location,
    })
}

/// Whether a study was created through Vizier at this place.
pub fn is_at(study: &Study, place: &Place<'_>) -> bool {
    kept_place(study)
        .is_some_and(|kept| kept.project == place.project && kept.location == place.location)
}

pub fn study_name(place: &Place<'_>, id: StudyId) -> String {
    format!(
        "projects/{}/locations/{}/studies/{id}",
        place.project, place.location
    )
}

/// A study as Vizier's `Study`.
pub fn study_to_vizier(study: &Study, asked: &Place<'_>, enc: Encoding) -> Json {
    let place = study_place(study, asked);
    let mut out = json!({
        "name": study_name(&place, study.id),
        "displayName": study.name,
        "studySpec": spec_to_vizier(&study.spec, enc),
        "state": study_state(study.state, enc),
        "createTime": time(study.created_at),
    });
    if study.state != StudyState::Active
        && let Some(reason) = &study.state_reason
    {
        out["inactiveReason"] = json!(reason);
    }
    out
}

fn measurement_to_vizier(m: &Measurement) -> Json {
    let mut out = json!({
        "stepCount": m.step.to_string(),
        "metrics": m.metrics.iter()
            .map(|(id, value)| json!({"metricId": id, "value": value}))
            .collect::<Vec<_>>(),
    });
    if let Some(secs) = m.elapsed_secs {
        out["elapsedDuration"] = json!(format!("{secs}s"));
    }
    out
}

/// A trial as Vizier's `Trial`, named under `study_name`.
pub fn trial_to_vizier(trial: &Trial, study_name: &str, enc: Encoding) -> Json {
    let (name, number) = trial_state(trial.state);
    let mut out = json!({
        "name": format!("{study_name}/trials/{}", trial.id),
        "id": trial.id.to_string(),
        "state": enc.enum_value(name, number),
        "parameters": trial.parameters.iter()
            .map(|(id, v)| json!({"parameterId": id, "value": v}))
            .collect::<Vec<_>>(),
        "measurements": trial.measurements.iter().map(measurement_to_vizier).collect::<Vec<_>>(),
        "startTime": time(trial.started_at.unwrap_or(trial.created_at)),
    });
    if let Some(m) = &trial.final_measurement {
        out["finalMeasurement"] = measurement_to_vizier(m);
    }
    if let Some(t) = trial.completed_at {
        out["endTime"] = json!(time(t));
    }
    if let Some(c) = &trial.client_id {
        out["clientId"] = json!(c);
    }
    // A failed trial is infeasible to Vizier: its failure is the reason.
    let failure = trial
        .fail_reason
        .as_ref()
        .filter(|_| trial.state == TrialState::Failed);
    if let Some(r) = trial.infeasible_reason.as_ref().or(failure) {
        out["infeasibleReason"] = json!(r);
    }
    out
}

/// A measurement sent by a worker, as Augur's: its step (0 when not given) and metrics.
pub fn measurement_from_vizier(m: &MeasurementInput, path: &str) -> Result<Measurement, ApiError> {
    let mut metrics = BTreeMap::new();
    for (i, metric) in m.metrics.iter().enumerate() {
        let id = metric
            .metric_id
            .clone()
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(format!("{path}.metrics[{i}].metricId"), "is required")
            })?;
        metrics.insert(id, metric.value.unwrap_or(0.0));
    }
    let elapsed_secs = match &m.elapsed_duration {
        None => None,
        Some(text) => Some(
            text.strip_suffix('s')
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("{path}.elapsedDuration"),
                        format!("{text:?} is not a duration such as \"3.5s\""),
                    )
                })?,
        ),
    };
    let step = m.step_count.unwrap_or(0);
    if step < 0 {
        return Err(ApiError::invalid(
            format!("{path}.stepCount"),
            "must be >= 0",
        ));
    }
    Ok(Measurement {
        step,
        elapsed_secs,
        metrics,
    })
}

/// The parameters of a trial a client creates, as Augur's assignment (its values checked
/// against the study's space by the service).
pub fn assignment_from_vizier(trial: &TrialInput) -> Result<Assignment, ApiError> {
    let mut out = Assignment::new();
    for (i, p) in trial.parameters.iter().enumerate() {
        let field = format!("parameters[{i}]");
        let id = p
            .parameter_id
            .clone()
            .filter(|id| !id.is_empty())
            .ok_or_else(|| ApiError::invalid(format!("{field}.parameterId"), "is required"))?;
        let value = match &p.value {
            Some(Json::String(s)) => Value::Str(s.clone()),
            Some(Json::Number(n)) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            _ => {
                return Err(ApiError::invalid(
                    format!("{field}.value"),
                    "must be a number or a string",
                ));
            }
        };
        out.insert(id, value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_numbers_read_as_names_and_are_written_back_as_asked() {
        let sent = json!({
            "metrics": [{"metricId": "acc", "goal": 1}],
            "parameters": [{"parameterId": "lr", "scaleType": 2,
                "doubleValueSpec": {"minValue": 0.001, "maxValue": 0.1}},
                {"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "4"}}],
            "algorithm": 3,
        });
        let spec = spec_from_vizier("probe", &sent).expect("a spec");
        assert_eq!(spec.name, "probe");
        assert_eq!(spec.max_trials, DEFAULT_MAX_TRIALS);
        let ints = spec_to_vizier(&spec, Encoding { int_enums: true });
        assert_eq!(ints["metrics"][0]["goal"], 1);
        assert_eq!(ints["parameters"][0]["scaleType"], 2);
        assert_eq!(ints["algorithm"], 3);
        assert_eq!(ints["parameters"][1]["integerValueSpec"]["maxValue"], "4");
        let names = spec_to_vizier(&spec, Encoding { int_enums: false });
        assert_eq!(names["metrics"][0]["goal"], "MAXIMIZE");
        assert_eq!(names["algorithm"], "RANDOM_SEARCH");
        // Read back, either way, the written spec is the same spec.
        assert_eq!(spec_from_vizier("probe", &ints).expect("again"), spec);
        assert_eq!(spec_from_vizier("probe", &names).expect("by name"), spec);
    }

    #[test]
    fn bounds_and_thresholds_left_out_are_proto3_zeros() {
        let sent = json!({
            "metrics": [{"metricId": "acc", "goal": 1, "safetyConfig": {}}],
            "parameters": [{"parameterId": "x", "doubleValueSpec": {"maxValue": 1.0}},
                {"parameterId": "n", "integerValueSpec": {"minValue": "-3"}}],
        });
        let spec = spec_from_vizier("zeros", &sent).expect("a spec");
        assert_eq!(
            (spec.parameters[0].min, spec.parameters[0].max),
            (Some(0.0), Some(1.0))
        );
        assert_eq!(
            (spec.parameters[1].min, spec.parameters[1].max),
            (Some(-3.0), Some(0.0))
        );
        assert_eq!(spec.metrics[0].safety_threshold, Some(0.0));
    }

    #[test]
    fn an_unknown_enum_number_is_refused_naming_its_field() {
        let sent = json!({"metrics": [{"metricId": "acc", "goal": 9}], "parameters": [
            {"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]});
        let ApiError::InvalidArgument { field, .. } =
            spec_from_vizier("probe", &sent).expect_err("refused")
        else {
            panic!("not a 400");
        };
        assert_eq!(field.as_deref(), Some("studySpec.metrics[0].goal"));
    }
}
