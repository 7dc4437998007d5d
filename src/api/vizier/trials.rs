//! Vizier's trials: suggest (a long-running operation answered done), create, get, list,
//! delete, measurements, complete, early-stopping checks, stop, optimal trials; and the
//! operations, recomputed from their names (`suggest.1-3_7`), so any replica answers them.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::Call;
use super::convert;
use super::error::VizierResult;
use super::studies::{page_error, renamed};
use super::types::{
    AddTrialMeasurementRequest, CompleteTrialRequest, PageQuery, SuggestTrialsRequest, TrialInput,
};
use crate::api::AppState;
use crate::api::auth::Actor;
use crate::api::error::ApiError;
use crate::api::extract::{ApiJson, ApiQuery, parse_body};
use crate::model::{ClientId, Step, StudyId, SuggestCount, Trial, TrialId, TrialState};
use crate::service::Completion;

/// The reason a trial deleted through Vizier fails with, if it was still running.
const DELETED: &str = "deleted through the Vizier API";
/// The operation of a trial's early-stopping check.
const CHECK_OPERATION: &str = "checkTrialEarlyStoppingState";

pub async fn suggest_trials(
    State(state): State<AppState>,
    Actor(actor): Actor,
    call: Call,
    ApiJson(request): ApiJson<SuggestTrialsRequest>,
) -> VizierResult<Json<Value>> {
    let study = call.study()?;
    let count = request
        .suggestion_count
        .ok_or_else(|| ApiError::invalid("suggestionCount", "is required"))?;
    let count =
        SuggestCount::try_from(count).map_err(|e| renamed(e.into(), "count", "suggestionCount"))?;
    let client_id = request
        .client_id
        .filter(|c| !c.is_empty())
        .map(ClientId::try_from)
        .transpose()
        .map_err(|e| renamed(e.into(), "client_id", "clientId"))?;
    let started = chrono::Utc::now();
    let out = state
        .service
        .suggest(&actor, study, count, client_id)
        .await?;
    let ids: Vec<TrialId> = out.trials.iter().map(|t| t.id).collect();
    let name = format!(
        "{}/operations/suggest.{}",
        call.study_name(study),
        encode_ids(&ids)
    );
    let response = suggest_response(&call, study, &out.trials, out.study_state, started);
    Ok(Json(done_operation(&name, response)))
}

fn suggest_response(
    call: &Call,
    study: StudyId,
    trials: &[Trial],
    study_state: crate::model::StudyState,
    started: chrono::DateTime<chrono::Utc>,
) -> Value {
    let study_name = call.study_name(study);
    json!({
        "@type": call.type_url("SuggestTrialsResponse"),
        "trials": trials.iter()
            .map(|t| convert::trial_to_vizier(t, &study_name, call.enc))
            .collect::<Vec<_>>(),
        "studyState": convert::study_state(study_state, call.enc),
        "startTime": convert::time(started),
        "endTime": convert::time(chrono::Utc::now()),
    })
}

fn done_operation(name: &str, response: Value) -> Value {
    json!({"name": name, "done": true, "response": response})
}

/// Trial ids as an operation name holds them: runs as `first-last`, joined by `_`.
fn encode_ids(ids: &[TrialId]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let mut runs: Vec<(TrialId, TrialId)> = Vec::new();
    for id in sorted {
        match runs.last_mut() {
            Some((_, last)) if last.next() == id => *last = id,
            _ => runs.push((id, id)),
        }
    }
    runs.iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// [`encode_ids`] read back; `None` for text it never writes (or a run too long to be one).
fn decode_ids(text: &str) -> Option<Vec<TrialId>> {
    let mut ids = Vec::new();
    if text.is_empty() {
        return Some(ids);
    }
    for run in text.split('_') {
        let (a, b) = match run.split_once('-') {
            Some((a, b)) => (a.parse::<i64>().ok()?, b.parse::<i64>().ok()?),
            None => {
                let id = run.parse().ok()?;
                (id, id)
            }
        };
        if a < 1 || b < a || b - a >= SuggestCount::MAX as i64 {
            return None;
        }
        ids.extend((a..=b).map(TrialId::new));
    }
    Some(ids)
}

pub async fn create_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    call: Call,
    ApiJson(input): ApiJson<TrialInput>,
) -> VizierResult<Json<Value>> {
    let study = call.study()?;
    let parameters = convert::assignment_from_vizier(&input)?;
    let final_metrics = match &input.final_measurement {
        Some(m) => Some(convert::measurement_from_vizier(m, "finalMeasurement")?.metrics),
        None => None,
    };
    let trial = state
        .service
        .add_trial(&actor, study, parameters, final_metrics)
        .await
        .map_err(|e| {
            renamed(
                e.into(),
                "final_measurement.metrics",
                "finalMeasurement.metrics",
            )
        })?;
    Ok(Json(convert::trial_to_vizier(
        &trial,
        &call.study_name(study),
        call.enc,
    )))
}

/// A trial deleted through Vizier is kept, excluded (Augur loses nothing it stored); Vizier
/// no longer sees it.
async fn visible_trial(
    state: &AppState,
    study: StudyId,
    trial: TrialId,
) -> Result<Trial, ApiError> {
    let found = state.service.get_trial(study, trial).await?;
    if found.excluded {
        return Err(ApiError::NotFound(format!(
            "trial {trial} of study {study} not found (deleted)"
        )));
    }
    Ok(found)
}

pub async fn get_trial(State(state): State<AppState>, call: Call) -> VizierResult<Json<Value>> {
    let study = call.study()?;
    let (trial, verb) = call.trial()?;
    if let Some(verb) = verb {
        return Err(no_such_method(verb).into());
    }
    let found = visible_trial(&state, study, trial).await?;
    Ok(Json(convert::trial_to_vizier(
        &found,
        &call.study_name(study),
        call.enc,
    )))
}

pub async fn list_trials(
    State(state): State<AppState>,
    call: Call,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> VizierResult<Json<Value>> {
    let study = call.study()?;
    let listed = state
        .service
        .list_trials(study, None, page.size(), page.page_token.as_deref())
        .await
        .map_err(|e| page_error(e.into()))?;
    let study_name = call.study_name(study);
    let trials: Vec<Value> = listed
        .items
        .iter()
        .filter(|t| !t.excluded)
        .map(|t| convert::trial_to_vizier(t, &study_name, call.enc))
        .collect();
    let mut out = json!({ "trials": trials });
    if let Some(token) = listed.next_page_token {
        out["nextPageToken"] = json!(token);
    }
    Ok(Json(out))
}

pub async fn delete_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    call: Call,
) -> VizierResult<Json<Value>> {
    let study = call.study()?;
    let (trial, verb) = call.trial()?;
    if let Some(verb) = verb {
        return Err(no_such_method(verb).into());
    }
    let found = visible_trial(&state, study, trial).await?;
    let unfinished = matches!(
        found.state,
        TrialState::Requested | TrialState::Active | TrialState::Stopping | TrialState::Paused
    );
    if unfinished {
        // Its slot is freed: a deleted trial no longer counts against the cap.
        state
            .service
            .fail_trial(&actor, study, trial, DELETED.to_string())
            .await?;
    }
    state
        .service
        .set_excluded(&actor, study, trial, true)
        .await?;
    Ok(Json(json!({})))
}

/// POST `trials/{trial}:<method>`.
pub async fn trial_verb(
    State(state): State<AppState>,
    Actor(actor): Actor,
    call: Call,
    ApiJson(body): ApiJson<Value>,
) -> VizierResult<Json<Value>> {
    let study = call.study()?;
    let (trial, verb) = call.trial()?;
    let service = &state.service;
    let changed = match verb {
        Some("addTrialMeasurement") => {
            let request: AddTrialMeasurementRequest = parse_body(body)?;
            let measurement = request
                .measurement
                .ok_or_else(|| ApiError::invalid("measurement", "is required"))?;
            let measurement = convert::measurement_from_vizier(&measurement, "measurement")?;
            service
                .add_measurement(&actor, study, trial, measurement)
                .await
                .map_err(|e| renamed(e.into(), "metrics", "measurement.metrics"))?
        }
        Some("complete") => {
            let request: CompleteTrialRequest = parse_body(body)?;
            let outcome = completion(request)?;
            service
                .complete_trial(&actor, study, trial, outcome)
                .await
                .map_err(|e| {
                    let e = renamed(e.into(), "metrics", "finalMeasurement.metrics");
                    renamed(e, "infeasible_reason", "infeasibleReason")
                })?
        }
        Some("stop") => service.stop_trial(&actor, study, trial).await?,
        Some(CHECK_OPERATION) => {
            let should_stop = service.ask_should_stop(&actor, study, trial).await?;
            return Ok(Json(check_operation(&call, study, trial, should_stop)));
        }
        Some(other) => return Err(no_such_method(other).into()),
        None => {
            return Err(ApiError::MethodNotAllowed.into());
        }
    };
    Ok(Json(convert::trial_to_vizier(
        &changed,
        &call.study_name(study),
        call.enc,
    )))
}

/// CompleteTrialRequest as Augur's completion: infeasible, with its final measurement, or
/// by the study's measurement selection.
fn completion(request: CompleteTrialRequest) -> Result<Completion, ApiError> {
    if request.trial_infeasible {
        let reason = request
            .infeasible_reason
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| "infeasible (no reason given)".to_string());
        return Ok(Completion::Infeasible(reason));
    }
    match request.final_measurement {
        Some(m) if !m.metrics.is_empty() => {
            let measurement = convert::measurement_from_vizier(&m, "finalMeasurement")?;
            let step = Step::try_from(measurement.step)
                .map_err(|e| renamed(e.into(), "step", "finalMeasurement.stepCount"))?;
            Ok(Completion::Metrics {
                metrics: measurement.metrics,
                step: m.step_count.map(|_| step),
            })
        }
        _ => Ok(Completion::Selected(Vec::new())),
    }
}

fn check_operation(call: &Call, study: StudyId, trial: TrialId, should_stop: bool) -> Value {
    let name = format!(
        "{}/trials/{trial}/operations/{CHECK_OPERATION}",
        call.study_name(study)
    );
    done_operation(
        &name,
        json!({
            "@type": call.type_url("CheckTrialEarlyStoppingStateResponse"),
            "shouldStop": should_stop,
        }),
    )
}

pub async fn list_optimal_trials(
    State(state): State<AppState>,
    call: Call,
) -> VizierResult<Json<Value>> {
    let study = call.study()?;
    let study_name = call.study_name(study);
    let trials = state.service.optimal_trials(study).await?;
    let optimal: Vec<Value> = trials
        .iter()
        .filter(|t| !t.excluded)
        .map(|t| convert::trial_to_vizier(t, &study_name, call.enc))
        .collect();
    Ok(Json(json!({ "optimalTrials": optimal })))
}

/// GET an operation: it was done when it was made, and is answered again from its name.
pub async fn get_operation(State(state): State<AppState>, call: Call) -> VizierResult<Json<Value>> {
    let (operation, verb) = call.operation();
    if let Some(verb) = verb {
        return Err(no_such_method(verb).into());
    }
    Ok(Json(operation_again(&state, &call, operation).await?))
}

/// POST `{operation}:wait` (it is done: the operation) or `:cancel` (too late: nothing).
pub async fn operation_verb(
    State(state): State<AppState>,
    call: Call,
) -> VizierResult<Json<Value>> {
    let (operation, verb) = call.operation();
    match verb {
        Some("wait") => Ok(Json(operation_again(&state, &call, operation).await?)),
        Some("cancel") => {
            operation_again(&state, &call, operation).await?;
            Ok(Json(json!({})))
        }
        Some(other) => Err(no_such_method(other).into()),
        None => Err(ApiError::MethodNotAllowed.into()),
    }
}

/// An operation read back from its name, changing nothing: a suggestion's trials as they
/// are now, or the early-stopping rule's verdict now.
async fn operation_again(
    state: &AppState,
    call: &Call,
    operation: &str,
) -> Result<Value, ApiError> {
    let study = call.study()?;
    let unknown = || ApiError::NotFound(format!("operation {operation:?} not found"));
    if call.params.contains_key("trial") {
        let (trial, _) = call.trial()?;
        if operation != CHECK_OPERATION {
            return Err(unknown());
        }
        let should_stop = state.service.stop_verdict(study, trial).await?;
        return Ok(check_operation(call, study, trial, should_stop));
    }
    let ids = operation
        .strip_prefix("suggest.")
        .and_then(decode_ids)
        .ok_or_else(unknown)?;
    let now = chrono::Utc::now();
    let found = state.service.get_study(study).await?;
    let mut trials = Vec::with_capacity(ids.len());
    for id in &ids {
        trials.push(state.service.get_trial(study, *id).await?);
    }
    let name = format!("{}/operations/{operation}", call.study_name(study));
    Ok(done_operation(
        &name,
        suggest_response(call, study, &trials, found.state, now),
    ))
}

fn no_such_method(verb: &str) -> ApiError {
    ApiError::NotFound(format!("no method {verb:?} here"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trial_ids_survive_an_operation_name() {
        for ids in [vec![], vec![4], vec![1, 2, 3, 7], vec![9, 3, 4, 10]] {
            let ids: Vec<TrialId> = ids.into_iter().map(TrialId::new).collect();
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            assert_eq!(decode_ids(&encode_ids(&ids)), Some(sorted), "{ids:?}");
        }
        assert_eq!(
            encode_ids(&[
                TrialId::new(1),
                TrialId::new(2),
                TrialId::new(3),
                TrialId::new(7)
            ]),
            "1-3_7"
        );
        assert_eq!(decode_ids("3-1"), None);
        assert_eq!(decode_ids("x"), None);
        assert_eq!(decode_ids("1-99999999999"), None);
    }
}
