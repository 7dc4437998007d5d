//! Bad input of every kind is answered with the right status and the offending field, and
//! changes nothing stored.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{TestApp, routes, spec};
use crate::support::{app, suggest};

on_both_backends!(
    bad_study_specs_name_their_field_and_create_nothing,
    bad_trial_requests_and_queries_name_their_field_and_change_nothing,
    unknown_ids_and_routes_are_404,
    a_body_that_is_not_small_json_is_refused,
);

/// A study whose state is compared before and after the bad requests.
async fn snapshot(app: &TestApp, id: i64) -> (Value, Value) {
    let mut study = app.get(&routes::study(id)).await.body;
    study.as_object_mut().map(|o| o.remove("updated_at"));
    (study, app.get(&routes::trials(id)).await.body)
}

/// A study with one trial and a measurement, and what it looks like before bad requests.
async fn fixture(backend: &str) -> (TestApp, i64, (Value, Value), usize) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 2)).await;
    suggest(&app, id, 1, None).await;
    app.post(
        &routes::trial_measurements(id, 1),
        json!({"step": 1, "metrics": {"accuracy": 0.4}}),
    )
    .await;
    let before = snapshot(&app, id).await;
    let studies = study_count(&app).await;
    (app, id, before, studies)
}

async fn study_count(app: &TestApp) -> usize {
    app.get("/v1/studies").await.body["studies"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Each case is answered with its status, `invalid_argument` and its field.
async fn assert_invalid(
    app: &TestApp,
    cases: Vec<(Method, String, Option<Value>, StatusCode, &str)>,
) {
    for (method, path, body, status, field) in cases {
        let r = app.call(method.clone(), &path, body.clone()).await;
        assert_eq!(r.status, status, "{method} {path} {body:?}: {}", r.body);
        assert_eq!(
            r.body["error"]["code"], "invalid_argument",
            "{method} {path}"
        );
        assert_eq!(
            r.body["error"]["field"], field,
            "{method} {path} {body:?}: {}",
            r.body
        );
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
}

/// A spec like the fixture's with `patch`'s fields replaced.
fn spec_with(patch: Value) -> Value {
    let mut s = spec("random", 10, 2);
    if let (Some(o), Some(p)) = (s.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            o.insert(k.clone(), v.clone());
        }
    }
    s
}

/// A patch making a PBT study run by a local job, with these `pbt` settings.
fn pbt(settings: Value) -> Value {
    json!({
        "scheduler": "pbt",
        "fidelity": {"argument": "epochs", "min": 1, "max": 9},
        "pbt": settings,
        "trial_job": {"command": ["train"]}
    })
}

fn spec_with_parameter(p: Value) -> Value {
    spec_with(json!({"parameters": [p]}))
}

async fn bad_study_specs_name_their_field_and_create_nothing(backend: &str) {
    let (app, id, before, studies) = fixture(backend).await;
    let with = spec_with;
    let param = spec_with_parameter;
    let cases: Vec<(Method, String, Option<Value>, StatusCode, &str)> = vec![
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(
                json!({"id": "x", "type": "double", "min": 2, "max": 1}),
            )),
            StatusCode::BAD_REQUEST,
            "parameters[0].min",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(
                json!({"id": "x", "type": "double", "min": 0, "max": 1, "scale": "log"}),
            )),
            StatusCode::BAD_REQUEST,
            "parameters[0].min",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(
                json!({"id": "x", "type": "categorical", "values": []}),
            )),
            StatusCode::BAD_REQUEST,
            "parameters[0].values",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(
                json!({"id": "x", "type": "discrete", "values": [1, 3, 2]}),
            )),
            StatusCode::BAD_REQUEST,
            "parameters[0].values[2]",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(
                json!({"id": "x", "type": "integer", "min": 1.5, "max": 4}),
            )),
            StatusCode::BAD_REQUEST,
            "parameters[0].min",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(
                json!({"id": "x", "type": "double", "min": 0, "max": 1, "colour": "red"}),
            )),
            StatusCode::BAD_REQUEST,
            "parameters[0].colour",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(json!({"id": "x", "type": "tensor"}))),
            StatusCode::BAD_REQUEST,
            "parameters[0].type",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"parameters": [
            {"id": "x", "type": "double", "min": 0, "max": 1}, {"id": "x", "type": "double", "min": 0, "max": 1}]}))),
            StatusCode::BAD_REQUEST,
            "parameters[1].id",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(param(
                json!({"id": "k", "type": "categorical", "values": ["a"],
            "children": [{"when": ["b"], "parameters": [{"id": "y", "type": "double", "min": 0, "max": 1}]}]}),
            )),
            StatusCode::BAD_REQUEST,
            "parameters[0].children[0].when[0]",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"parallel_trials": 0}))),
            StatusCode::BAD_REQUEST,
            "parallel_trials",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"max_trials": -3}))),
            StatusCode::BAD_REQUEST,
            "max_trials",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"metrics": []}))),
            StatusCode::BAD_REQUEST,
            "metrics",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"metrics": [{"id": "a", "goal": "maximize"}, {"id": "a", "goal": "minimize"}]}),
            )),
            StatusCode::BAD_REQUEST,
            "metrics[1].id",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"algorithm": "magic"}))),
            StatusCode::BAD_REQUEST,
            "algorithm",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"unknown_knob": 1}))),
            StatusCode::BAD_REQUEST,
            "unknown_knob",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"early_stopping": {"rule": "median", "sigmas": 2}}),
            )),
            StatusCode::BAD_REQUEST,
            "early_stopping.sigmas",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"early_stopping": {"rule": "median", "metric": "not_a_metric"}}),
            )),
            StatusCode::BAD_REQUEST,
            "early_stopping.metric",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"fidelity": {"argument": "epochs", "min": 9, "max": 3, "reduction_factor": 3}}),
            )),
            StatusCode::BAD_REQUEST,
            "fidelity.max",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"fidelity": {"argument": "epochs", "min": 0, "max": 3, "reduction_factor": 3}}),
            )),
            StatusCode::BAD_REQUEST,
            "fidelity.min",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"fidelity": {"argument": "epochs", "min": 1, "max": 27, "reduction_factor": 1.5}}),
            )),
            StatusCode::BAD_REQUEST,
            "fidelity.reduction_factor",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"fidelity": {"argument": "lr", "min": 1, "max": 9}}),
            )),
            StatusCode::BAD_REQUEST,
            "fidelity.argument",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({
                "scheduler": "asha",
                "fidelity": {"argument": "epochs", "min": 1, "max": 9},
                "trial_job": {"executor": "kubernetes", "image": "trainer:1", "command": ["train"]}
            }))),
            StatusCode::BAD_REQUEST,
            "trial_job.kubernetes.output_volume",
        ),
        // PBT copies checkpoints on the pods' volume: not in an object store.
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({
                "scheduler": "pbt",
                "fidelity": {"argument": "epochs", "min": 1, "max": 9},
                "trial_job": {"executor": "kubernetes", "image": "trainer:1", "command": ["train"],
                    "output_dir": "gs://bucket/runs",
                    "kubernetes": {"output_volume": "object_store"}}
            }))),
            StatusCode::BAD_REQUEST,
            "trial_job.kubernetes.output_volume",
        ),
        // An executor's options given to another: refused as the spec is read, at the job
        // (the message names the option).
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"trial_job": {"executor": "local", "command": ["train"],
                                           "slurm": {"partition": "gpu"}}}),
            )),
            StatusCode::BAD_REQUEST,
            "trial_job",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"trial_job": {"executor": "slurm", "command": ["train"],
                                           "kubernetes": {"namespace": "ml"}}}),
            )),
            StatusCode::BAD_REQUEST,
            "trial_job",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"trial_job": {"executor": "local", "command": ["train"],
                                           "image": "trainer:1"}}),
            )),
            StatusCode::BAD_REQUEST,
            "trial_job",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"scheduler": "asha"}))),
            StatusCode::BAD_REQUEST,
            "scheduler",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"max_budget": 100}))),
            StatusCode::BAD_REQUEST,
            "max_budget",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"scheduler": "asha", "max_budget": 0.5,
                "fidelity": {"argument": "epochs", "min": 1, "max": 9}}))),
            StatusCode::BAD_REQUEST,
            "max_budget",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(json!({"pbt": {"population": 4}}))),
            StatusCode::BAD_REQUEST,
            "pbt",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(pbt(json!({"population": 1})))),
            StatusCode::BAD_REQUEST,
            "pbt.population",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(pbt(json!({"quantile_fraction": 0.6})))),
            StatusCode::BAD_REQUEST,
            "pbt.quantile_fraction",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(pbt(json!({"perturbation_interval": 9})))),
            StatusCode::BAD_REQUEST,
            "pbt.perturbation_interval",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(pbt(json!({"resample_probability": 2})))),
            StatusCode::BAD_REQUEST,
            "pbt.resample_probability",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with({
                let mut spec = pbt(json!({}));
                spec["parameters"] = json!([{"id": "opt", "type": "categorical",
                    "values": ["sgd", "adam"], "children": [{"when": ["sgd"],
                    "parameters": [{"id": "momentum", "type": "double", "min": 0, "max": 1}]}]}]);
                spec
            })),
            StatusCode::BAD_REQUEST,
            "parameters[0]",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(with(
                json!({"scheduler": "asha", "fidelity": {"argument": "epochs", "min": 1, "max": 9}, "early_stopping": {"rule": "median"}}),
            )),
            StatusCode::BAD_REQUEST,
            "early_stopping",
        ),
        (
            Method::POST,
            "/v1/studies".into(),
            Some(json!("not an object")),
            StatusCode::BAD_REQUEST,
            "body",
        ),
    ];
    assert_invalid(&app, cases).await;
    assert_eq!(snapshot(&app, id).await, before, "nothing stored changed");
    assert_eq!(study_count(&app).await, studies, "no study created");
}

async fn bad_trial_requests_and_queries_name_their_field_and_change_nothing(backend: &str) {
    let (app, id, before, studies) = fixture(backend).await;
    let cases: Vec<(Method, String, Option<Value>, StatusCode, &str)> = vec![
        (
            Method::PATCH,
            routes::study(id),
            Some(json!({"parallel_trials": 0})),
            StatusCode::BAD_REQUEST,
            "parallel_trials",
        ),
        (
            Method::PATCH,
            routes::study(id),
            Some(json!({"name": "renamed"})),
            StatusCode::BAD_REQUEST,
            "name",
        ),
        (
            Method::POST,
            routes::suggest(id),
            Some(json!({"count": 0})),
            StatusCode::BAD_REQUEST,
            "count",
        ),
        (
            Method::POST,
            routes::suggest(id),
            Some(json!({"count": "two"})),
            StatusCode::BAD_REQUEST,
            "count",
        ),
        (
            Method::POST,
            routes::suggest(id),
            Some(json!({"client_id": ""})),
            StatusCode::BAD_REQUEST,
            "client_id",
        ),
        (
            Method::POST,
            routes::trials(id),
            Some(json!({"parameters": {"lr": 5.0, "layers": 1, "batch": 16, "kernel": "rbf"}})),
            StatusCode::BAD_REQUEST,
            "parameters.lr",
        ),
        (
            Method::POST,
            routes::trials(id),
            Some(
                json!({"parameters": {"lr": 0.1, "layers": 1, "batch": 16, "kernel": "rbf", "degree": 2}}),
            ),
            StatusCode::BAD_REQUEST,
            "parameters.degree",
        ),
        (
            Method::POST,
            routes::trials(id),
            Some(json!({"parameters": {"lr": 0.1, "layers": 1, "batch": 16}})),
            StatusCode::BAD_REQUEST,
            "parameters.kernel",
        ),
        (
            Method::POST,
            routes::trial_measurements(id, 1),
            Some(json!({"step": -1, "metrics": {"accuracy": 0.1}})),
            StatusCode::BAD_REQUEST,
            "step",
        ),
        (
            Method::POST,
            routes::trial_measurements(id, 1),
            Some(json!({"step": 2, "metrics": {"loss": 0.1}})),
            StatusCode::BAD_REQUEST,
            "metrics.loss",
        ),
        (
            Method::POST,
            routes::trial_measurements(id, 1),
            Some(json!({"step": 2, "metrics": {}})),
            StatusCode::BAD_REQUEST,
            "metrics",
        ),
        (
            Method::POST,
            routes::trial_complete(id, 1),
            Some(json!({"metrics": {"accuracy": 0.5}, "infeasible_reason": "x"})),
            StatusCode::BAD_REQUEST,
            "infeasible_reason",
        ),
        (
            Method::POST,
            routes::trial_complete(id, 1),
            Some(json!({"metrics": {}})),
            StatusCode::BAD_REQUEST,
            "metrics.accuracy",
        ),
        (
            Method::POST,
            routes::trial_complete(id, 1),
            Some(json!({"infeasible_reason": "  "})),
            StatusCode::BAD_REQUEST,
            "infeasible_reason",
        ),
        (
            Method::GET,
            format!("{}?page_size=0", routes::trials(id)),
            None,
            StatusCode::BAD_REQUEST,
            "page_size",
        ),
        (
            Method::GET,
            format!("{}?page_token=abc", routes::trials(id)),
            None,
            StatusCode::BAD_REQUEST,
            "page_token",
        ),
        (
            Method::GET,
            routes::trials_in_state(id, "sleeping"),
            None,
            StatusCode::BAD_REQUEST,
            "state",
        ),
        (
            Method::GET,
            "/v1/studies?colour=red".into(),
            None,
            StatusCode::BAD_REQUEST,
            "colour",
        ),
    ];
    assert_invalid(&app, cases).await;
    assert_eq!(snapshot(&app, id).await, before, "nothing stored changed");
    assert_eq!(study_count(&app).await, studies);
}

async fn unknown_ids_and_routes_are_404(backend: &str) {
    let (app, id, before, studies) = fixture(backend).await;
    let not_found: Vec<(Method, String)> = vec![
        (Method::GET, "/v1/studies/999".into()),
        (Method::GET, "/v1/studies/abc".into()),
        (Method::GET, routes::trial(id, 99)),
        (Method::POST, routes::trial_complete(id, 99)),
        (Method::POST, "/v1/studies/999/suggest".into()),
        (Method::GET, "/v1/nothing-here".into()),
    ];
    for (method, path) in not_found {
        let r = app.call(method.clone(), &path, Some(json!({}))).await;
        assert_eq!(
            r.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {}",
            r.body
        );
        assert_eq!(r.body["error"]["code"], "not_found");
    }
    assert_eq!(snapshot(&app, id).await, before, "nothing stored changed");
    assert_eq!(study_count(&app).await, studies);
}

async fn a_body_that_is_not_small_json_is_refused(backend: &str) {
    let (app, id, before, studies) = fixture(backend).await;
    let not_json = app
        .http
        .post(app.url("/v1/studies"))
        .header("content-type", "text/plain")
        .body("name: x")
        .send()
        .await
        .expect("sent");
    assert_eq!(not_json.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Its own client: the server answers 413 without reading the body and drops the
    // connection, which a pooled client could otherwise pick for the next request.
    let huge = crate::common::http()
        .post(app.url("/v1/studies"))
        .header("content-type", "application/json")
        .body(format!("{{\"name\": \"{}\"}}", "x".repeat(2 * 1024 * 1024)))
        .send()
        .await
        .expect("sent");
    assert_eq!(huge.status(), StatusCode::PAYLOAD_TOO_LARGE);

    assert_eq!(snapshot(&app, id).await, before, "nothing stored changed");
    assert_eq!(study_count(&app).await, studies);
}
