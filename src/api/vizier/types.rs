//! The request bodies of `google.cloud.aiplatform.v1.VizierService`, as proto3 JSON
//! (written from the published `vizier_service.proto` and `study.proto`): camelCase (the
//! proto's own snake_case names accepted too), int64 and int32 as numbers or strings, and
//! output-only fields a client echoes back ignored.

use serde::{Deserialize, Deserializer};
use serde_json::Value as Json;

/// An integer as proto3 JSON writes it: a number, or (int64 always) a string.
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match Option::<Json>::deserialize(d)? {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom("must be a whole number")),
        Some(Json::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a whole number"))),
        Some(_) => Err(serde::de::Error::custom("must be a whole number")),
    }
}

/// A double as proto3 JSON writes it: a number, or a string (`"NaN"`, `"Infinity"`, `"0.5"`).
fn double<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Option::<Json>::deserialize(d)? {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Number(n)) => Ok(n.as_f64()),
        Some(Json::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a number"))),
        Some(_) => Err(serde::de::Error::custom("must be a number")),
    }
}

/// `Study`, as CreateStudy's body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StudyInput {
    #[serde(default, alias = "display_name")]
    pub display_name: Option<String>,
    #[serde(default, alias = "study_spec")]
    pub study_spec: Option<Json>,
}

/// LookupStudyRequest.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LookupStudyRequest {
    #[serde(default, alias = "display_name")]
    pub display_name: Option<String>,
}

/// SuggestTrialsRequest (`contexts` is not used: Augur's designers take none).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SuggestTrialsRequest {
    #[serde(default, alias = "suggestion_count", deserialize_with = "int")]
    pub suggestion_count: Option<i64>,
    #[serde(default, alias = "client_id")]
    pub client_id: Option<String>,
}

/// `Measurement.Metric`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricInput {
    #[serde(default, alias = "metric_id")]
    pub metric_id: Option<String>,
    #[serde(default, deserialize_with = "double")]
    pub value: Option<f64>,
}

/// `Measurement`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeasurementInput {
    #[serde(default, alias = "elapsed_duration")]
    pub elapsed_duration: Option<String>,
    #[serde(default, alias = "step_count", deserialize_with = "int")]
    pub step_count: Option<i64>,
    #[serde(default)]
    pub metrics: Vec<MetricInput>,
}

/// `Trial.Parameter`: its value a `google.protobuf.Value`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParameterInput {
    #[serde(default, alias = "parameter_id")]
    pub parameter_id: Option<String>,
    #[serde(default)]
    pub value: Option<Json>,
}

/// `Trial`, as CreateTrial's body: its parameters, and a final measurement for a trial that
/// was already run.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialInput {
    #[serde(default)]
    pub parameters: Vec<ParameterInput>,
    #[serde(default, alias = "final_measurement")]
    pub final_measurement: Option<MeasurementInput>,
}

/// AddTrialMeasurementRequest.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddTrialMeasurementRequest {
    pub measurement: Option<MeasurementInput>,
}

/// CompleteTrialRequest.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompleteTrialRequest {
    #[serde(default, alias = "final_measurement")]
    pub final_measurement: Option<MeasurementInput>,
    #[serde(default, alias = "trial_infeasible")]
    pub trial_infeasible: bool,
    #[serde(default, alias = "infeasible_reason")]
    pub infeasible_reason: Option<String>,
}

/// The paging of ListStudies and ListTrials, from the query (unknown parameters such as
/// `$alt` are the protocol's, not errors).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PageQuery {
    #[serde(default, alias = "page_size", deserialize_with = "int")]
    pub page_size: Option<i64>,
    #[serde(default, alias = "page_token")]
    pub page_token: Option<String>,
}

impl PageQuery {
    /// The page size asked for; proto3's 0 (unset) is the server's default.
    pub fn size(&self) -> Option<i64> {
        self.page_size.filter(|n| *n != 0)
    }
}
