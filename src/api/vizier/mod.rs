//! Vertex AI's Vizier REST API (`google.cloud.aiplatform.v1.VizierService`, and `v1beta1`)
//! over Augur's service: a Vizier study is an Augur study, so the unchanged
//! `google-cloud-aiplatform` SDK tunes against `augur serve`. Kept out of `openapi.yaml`
//! (Augur's own API); every route still declares its access in the one table.

mod convert;
pub mod error;
mod studies;
mod trials;
mod types;

use std::collections::BTreeMap;

use axum::extract::{FromRequestParts, Path};
use axum::http::Method;
use axum::http::request::Parts;
use axum::routing::{get, post};

use super::access::{Access, AccessRouter};
use super::error::ApiError;
use super::extract::parse_id;
use crate::model::{Role, StudyId, TrialId};
pub use convert::{DEFAULT_MAX_TRIALS, DEFAULT_PARALLEL_TRIALS};
use convert::{Encoding, Place};
pub use error::{is_vizier_path, vertex_error_bodies};

/// The API versions served, each under `/{version}/projects/…`.
const VERSIONS: [&str; 2] = ["v1", "v1beta1"];
/// The generated clients' operations mixin asks under `/ui/` first (its first HTTP rule).
const OPERATION_PREFIXES: [&str; 3] = ["v1", "v1beta1", "ui"];

/// Every VizierService method and the operation paths the SDK polls, under both versions.
/// Reads (lookup, optimal trials, operations) need a reader; changes a writer, and the
/// service asks for the study's creator as on Augur's own API.
pub fn router() -> AccessRouter {
    let (read, write) = (Access::Role(Role::Reader), Access::Role(Role::Writer));
    let mut router = AccessRouter::new();
    for version in VERSIONS {
        let parent = format!("/{version}/projects/{{project}}/locations/{{location}}");
        let study = format!("{parent}/studies/{{study}}");
        let trial = format!("{study}/trials/{{trial}}");
        router = router
            .undocumented(
                &format!("{parent}/studies"),
                &[(Method::POST, write), (Method::GET, read)],
                post(studies::create_study).get(studies::list_studies),
            )
            .undocumented(
                &format!("{parent}/studies:lookup"),
                &[(Method::POST, read)],
                post(studies::lookup_study),
            )
            .undocumented(
                &study,
                &[(Method::GET, read), (Method::DELETE, write)],
                get(studies::get_study).delete(studies::delete_study),
            )
            .undocumented(
                &format!("{study}/trials"),
                &[(Method::POST, write), (Method::GET, read)],
                post(trials::create_trial).get(trials::list_trials),
            )
            .undocumented(
                &format!("{study}/trials:suggest"),
                &[(Method::POST, write)],
                post(trials::suggest_trials),
            )
            .undocumented(
                &format!("{study}/trials:listOptimalTrials"),
                &[(Method::POST, read)],
                post(trials::list_optimal_trials),
            )
            .undocumented(
                // `{trial}:addTrialMeasurement`, `:complete`, `:checkTrialEarlyStoppingState`
                // and `:stop` are POSTs to the trial's own path (`split_verb`).
                &trial,
                &[
                    (Method::GET, read),
                    (Method::DELETE, write),
                    (Method::POST, write),
                ],
                get(trials::get_trial)
                    .delete(trials::delete_trial)
                    .post(trials::trial_verb),
            );
    }
    for prefix in OPERATION_PREFIXES {
        let study =
            format!("/{prefix}/projects/{{project}}/locations/{{location}}/studies/{{study}}");
        // GET an operation; POST `{operation}:wait` or `:cancel` (of a done one).
        for owner in [study.clone(), format!("{study}/trials/{{trial}}")] {
            router = router.undocumented(
                &format!("{owner}/operations/{{operation}}"),
                &[(Method::GET, read), (Method::POST, read)],
                get(trials::get_operation).post(trials::operation_verb),
            );
        }
    }
    router
}

/// A path segment and the custom method after its last ':' (`7:complete`), as Google's
/// paths write `name:verb`; matchit routes the segment as one parameter.
fn split_verb(segment: &str) -> (&str, Option<&str>) {
    match segment.rsplit_once(':') {
        Some((name, verb)) => (name, Some(verb)),
        None => (segment, None),
    }
}

/// What every Vizier handler reads of its request: the API version, how to write enums,
/// and the resource the path names.
pub struct Call {
    /// `v1` or `v1beta1`: the package of the types an operation's response names.
    version: &'static str,
    enc: Encoding,
    params: BTreeMap<String, String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Call {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let version = if parts.uri.path().starts_with("/v1beta1/") {
            "v1beta1"
        } else {
            "v1"
        };
        // The SDK sends `?$alt=json;enum-encoding=int`.
        let int_enums = parts.uri.query().is_some_and(|q| {
            form_urlencoded::parse(q.as_bytes())
                .any(|(k, v)| k == "$alt" && v.contains("enum-encoding=int"))
        });
        let Path(params) = Path::<BTreeMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::NotFound(e.body_text()))?;
        Ok(Call {
            version,
            enc: Encoding { int_enums },
            params,
        })
    }
}

impl Call {
    fn param(&self, name: &str) -> &str {
        self.params.get(name).map_or("", String::as_str)
    }

    /// The project and location the path names.
    fn place(&self) -> Place<'_> {
        Place {
            project: self.param("project"),
            location: self.param("location"),
        }
    }

    fn study(&self) -> Result<StudyId, ApiError> {
        parse_id(self.param("study"), "study")
    }

    /// The trial the path names, and the method after it (`:complete`), if any.
    fn trial(&self) -> Result<(TrialId, Option<&str>), ApiError> {
        let (trial, verb) = split_verb(self.param("trial"));
        Ok((parse_id(trial, "trial")?, verb))
    }

    /// The operation the path names, and the method after it (`:wait`), if any.
    fn operation(&self) -> (&str, Option<&str>) {
        split_verb(self.param("operation"))
    }

    /// The study's resource name, under the path's project and location.
    fn study_name(&self, id: StudyId) -> String {
        convert::study_name(&self.place(), id)
    }

    /// `type.googleapis.com/google.cloud.aiplatform.v1.<message>`.
    fn type_url(&self, message: &str) -> String {
        format!(
            "type.googleapis.com/google.cloud.aiplatform.{}.{message}",
            self.version
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_is_split_from_the_last_colon_of_its_segment() {
        assert_eq!(split_verb("7:complete"), ("7", Some("complete")));
        assert_eq!(split_verb("7"), ("7", None));
        assert_eq!(split_verb("a:b:wait"), ("a:b", Some("wait")));
    }
}
