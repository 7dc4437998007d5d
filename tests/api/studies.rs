//! Studies over HTTP: their lifecycle, budgets changed live, several metrics, every
//! designer, paging, and what `/metrics` reports.

use std::collections::BTreeSet;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{routes, spec};
use crate::support::{app, complete, ids, suggest};

on_both_backends!(
    study_lifecycle_create_get_list_patch_stop_delete,
    max_failed_trials_fails_study_which_resumes_only_when_asked,
    raising_max_trials_reopens_completed_study,
    pareto_set_for_two_metrics,
    quasi_random_suggests_distinct_points,
    an_exhausted_grid_completes_its_study,
    trial_pages_hold_every_trial_once_in_order,
    the_state_filter_lists_only_trials_in_that_state,
    four_studies_at_two_a_page_are_two_pages,
    metrics_endpoint_reports_requests_and_trials,
);

async fn study_lifecycle_create_get_list_patch_stop_delete(backend: &str) {
    let app = app(backend).await;
    let r = app.post("/v1/studies", spec("random", 10, 2)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["id"].as_i64().expect("id");
    assert_eq!(r.body["state"], "active");
    assert_eq!(r.body["spec"]["seed"], 7);
    assert_eq!(
        r.body["spec"]["measurement_selection"], "last",
        "defaults are filled in"
    );
    assert_eq!(
        r.body["spec"]["parameters"][1]["max"], 8,
        "integer bounds stay integers"
    );

    let no_seed = {
        let mut s = spec("random", 3, 1);
        s.as_object_mut().expect("object").remove("seed");
        s["name"] = json!("other study");
        app.post("/v1/studies", s).await
    };
    assert!(
        no_seed.body["spec"]["seed"].is_u64(),
        "a seed is chosen and stored"
    );

    let got = app.get(&routes::study(id)).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body["trial_counts"]["total"], 0);
    assert_eq!(got.body["best_trial"], Value::Null);

    let listed = app.get("/v1/studies?state=active").await;
    assert_eq!(listed.body["studies"].as_array().map(Vec::len), Some(2));
    let by_name = app.get("/v1/studies?name=OTHER").await;
    assert_eq!(
        ids(&by_name.body["studies"]),
        vec![no_seed.body["id"].as_i64().expect("id")]
    );

    let patched = app
        .call(
            Method::PATCH,
            &routes::study(id),
            Some(json!({"max_trials": 20, "parallel_trials": 3})),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["spec"]["max_trials"], 20);
    assert_eq!(patched.body["spec"]["parallel_trials"], 3);

    let stopped = app.post(&routes::stop(id), json!({})).await;
    assert_eq!(stopped.body["state"], "stopped");
    let after = suggest(&app, id, 1, None).await;
    assert_eq!(after["trials"], json!([]));
    assert_eq!(after["study_state"], "stopped");
    assert!(
        after.get("retry_after_secs").is_none(),
        "a stopped study says no retry"
    );
    let patch_stopped = app
        .call(
            Method::PATCH,
            &routes::study(id),
            Some(json!({"max_trials": 30})),
        )
        .await;
    assert_eq!(patch_stopped.status, StatusCode::CONFLICT);
    assert_eq!(
        app.get("/v1/studies?state=stopped").await.body["studies"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    let deleted = app.call(Method::DELETE, &routes::study(id), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&routes::study(id)).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.call(Method::DELETE, &routes::study(id), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

async fn max_failed_trials_fails_study_which_resumes_only_when_asked(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 10, 2);
    s["max_failed_trials"] = json!(2);
    let id = app.create_study(s).await;
    suggest(&app, id, 2, None).await;
    app.post(&routes::trial_fail(id, 1), json!({"reason": "x"}))
        .await;
    assert_eq!(app.get(&routes::study(id)).await.body["state"], "active");
    app.post(&routes::trial_fail(id, 2), json!({"reason": "y"}))
        .await;
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "failed");
    assert!(
        study["state_reason"]
            .as_str()
            .is_some_and(|r| r.contains("2 trials failed"))
    );
    assert_eq!(suggest(&app, id, 1, None).await["study_state"], "failed");
    // Resuming needs room for more failures; a PATCH that makes it does not resume alone.
    let resume_path = routes::resume(id);
    let refused = app.post(&resume_path, json!({})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_failed_trials")),
        "{}",
        refused.body
    );
    let patched = app
        .call(
            Method::PATCH,
            &routes::study(id),
            Some(json!({"max_failed_trials": 5})),
        )
        .await;
    assert_eq!(patched.body["state"], "failed", "{}", patched.body);
    let resumed = app.post(&resume_path, json!({})).await;
    assert_eq!(resumed.status, StatusCode::OK, "{}", resumed.body);
    assert_eq!(resumed.body["state"], "active", "{}", resumed.body);
    assert_eq!(ids(&suggest(&app, id, 1, None).await["trials"]), vec![3]);
    // A stopped study does not resume.
    app.post(&routes::stop(id), json!({})).await;
    assert_eq!(
        app.post(&resume_path, json!({})).await.status,
        StatusCode::CONFLICT
    );
}

async fn raising_max_trials_reopens_completed_study(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 1, 1)).await;
    suggest(&app, id, 1, None).await;
    complete(&app, id, 1, 0.5).await;
    assert_eq!(app.get(&routes::study(id)).await.body["state"], "completed");
    let r = app
        .call(
            Method::PATCH,
            &routes::study(id),
            Some(json!({"max_trials": 2})),
        )
        .await;
    assert_eq!(r.body["state"], "active");
    assert_eq!(ids(&suggest(&app, id, 1, None).await["trials"]), vec![2]);
}

async fn pareto_set_for_two_metrics(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 10, 5);
    s["metrics"] =
        json!([{"id": "accuracy", "goal": "maximize"}, {"id": "latency", "goal": "minimize"}]);
    let id = app.create_study(s).await;
    suggest(&app, id, 5, None).await;
    for (t, acc, lat) in [
        (1, 0.8, 20.0),
        (2, 0.85, 15.0),
        (3, 0.9, 30.0),
        (4, 0.7, 5.0),
        (5, 0.6, 40.0),
    ] {
        let r = app
            .post(
                &routes::trial_complete(id, t),
                json!({"metrics": {"accuracy": acc, "latency": lat}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let front = app.get(&routes::optimal_trials(id)).await.body;
    assert_eq!(ids(&front["trials"]), vec![2, 3, 4]);
    let missing = app.post(&routes::trials(id), json!({"parameters": {"lr": 0.1, "layers": 1, "batch": 16, "kernel": "rbf"}, "final_measurement": {"metrics": {"accuracy": 0.5}}})).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.body["error"]["field"],
        "final_measurement.metrics.latency"
    );
}

async fn quasi_random_suggests_distinct_points(backend: &str) {
    let app = app(backend).await;
    let qid = app.create_study(spec("quasi_random", 16, 16)).await;
    let q = suggest(&app, qid, 16, None).await;
    let distinct: BTreeSet<String> = q["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .map(|t| t["parameters"].to_string())
        .collect();
    assert_eq!(distinct.len(), 16);
}

async fn an_exhausted_grid_completes_its_study(backend: &str) {
    let app = app(backend).await;
    let grid = json!({
        "name": "grid", "algorithm": "grid",
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [
            {"id": "layers", "type": "integer", "min": 1, "max": 3},
            {"id": "opt", "type": "categorical", "values": ["sgd", "adam"]}
        ],
        "max_trials": 100, "parallel_trials": 10
    });
    let gid = app.create_study(grid).await;
    let g = suggest(&app, gid, 10, None).await;
    let points: BTreeSet<String> = g["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .map(|t| t["parameters"].to_string())
        .collect();
    assert_eq!(points.len(), 6, "a 3x2 grid has 6 points: {points:?}");
    for t in ids(&g["trials"]) {
        complete(&app, gid, t, 0.5).await;
    }
    let study = app.get(&routes::study(gid)).await.body;
    assert_eq!(
        study["state"], "completed",
        "an exhausted grid completes the study"
    );
    assert_eq!(study["trial_counts"]["total"], 6);
}

/// A study with 25 suggested trials, 1 to 25.
async fn study_with_25_trials(backend: &str) -> (crate::common::TestApp, i64) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 25, 25)).await;
    suggest(&app, id, 25, None).await;
    (app, id)
}

async fn trial_pages_hold_every_trial_once_in_order(backend: &str) {
    let (app, id) = study_with_25_trials(backend).await;
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let path = match &token {
            Some(t) => format!("{}?page_size=10&page_token={t}", routes::trials(id)),
            None => format!("{}?page_size=10", routes::trials(id)),
        };
        let page = app.get(&path).await.body;
        seen.extend(ids(&page["trials"]));
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, (1..=25).collect::<Vec<_>>());
}

async fn the_state_filter_lists_only_trials_in_that_state(backend: &str) {
    let (app, id) = study_with_25_trials(backend).await;
    complete(&app, id, 7, 0.1).await;
    let completed = app
        .get(&routes::trials_in_state(id, "completed"))
        .await
        .body;
    assert_eq!(ids(&completed["trials"]), vec![7]);
}

async fn four_studies_at_two_a_page_are_two_pages(backend: &str) {
    let app = app(backend).await;
    for n in 0..4 {
        let mut s = spec("random", 1, 1);
        s["name"] = json!(format!("s{n}"));
        app.create_study(s).await;
    }
    let first = app.get("/v1/studies?page_size=2").await.body;
    assert_eq!(first["studies"].as_array().map(Vec::len), Some(2));
    let token = first["next_page_token"].as_str().expect("more pages");
    let second = app
        .get(&format!("/v1/studies?page_size=2&page_token={token}"))
        .await
        .body;
    assert_eq!(second["studies"].as_array().map(Vec::len), Some(2));
    assert!(second.get("next_page_token").is_none());
}

async fn metrics_endpoint_reports_requests_and_trials(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 5, 2)).await;
    suggest(&app, id, 2, None).await;
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .expect("sent")
        .text()
        .await
        .expect("text");
    assert!(text.contains("augur_http_requests_total"), "{text}");
    assert!(
        text.contains("route=\"/v1/studies/{study}/suggest\""),
        "{text}"
    );
    assert!(text.contains("augur_trials{state=\"active\"}"), "{text}");
    assert!(
        text.contains("augur_http_request_duration_seconds"),
        "{text}"
    );
    // This process's connection pools: PostgreSQL's commit lanes have their own; the suggest
    // above opened one of its connections, and the scrape's count a read connection.
    let pools: &[&str] = if backend == "postgres" {
        &["reads", "commits"]
    } else {
        &["reads"]
    };
    for pool in ["reads", "commits"] {
        let open: f64 = ["idle", "busy"]
            .iter()
            .map(|state| {
                let series = format!("augur_db_connections{{pool=\"{pool}\",state=\"{state}\"}} ");
                text.lines()
                    .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            })
            .sum();
        if pools.contains(&pool) {
            assert!(open >= 1.0, "{pool}: {open} connections open\n{text}");
        } else {
            assert!(!text.contains(&format!("pool=\"{pool}\"")), "{text}");
        }
    }
    // The answers' pool (PostgreSQL's only) is listed before it first opens a connection.
    assert_eq!(
        text.contains("augur_db_connections{pool=\"answers\",state=\"idle\"}"),
        backend == "postgres",
        "{text}"
    );
    let health = app.get("/healthz").await;
    assert_eq!(health.body["status"], "ok");
    assert_eq!(app.get("/readyz").await.status, StatusCode::OK);
}

/// A Vertex AI `HyperparameterTuningJob`, sent unchanged (the example file, as JSON), becomes
/// a study; what Augur ignores of it is named in `Warning` headers; a field Augur cannot
/// honour is a 400 naming it in Vertex's terms.
#[tokio::test]
async fn a_vertex_ai_tuning_job_creates_a_study_unchanged() {
    let app = app("sqlite").await;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/vertex/hp_tuning_job.yaml"
    ))
    .expect("example");
    let mut job: Value = yaml_serde::from_str(&text).expect("yaml");
    job["encryptionSpec"] = json!({"kmsKeyName": "k"});
    let response = app
        .http
        .post(app.url("/v1/studies"))
        .json(&job)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), StatusCode::CREATED);
    let warnings: Vec<String> = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("299 augur") && w.contains("encryptionSpec")),
        "{warnings:?}"
    );
    let study: Value = response.json().await.expect("study");
    let spec = &study["spec"];
    assert_eq!(spec["name"], "vertex-example");
    assert_eq!(spec["algorithm"], "gp_bandit");
    assert_eq!(spec["parallel_trials"], 2);
    assert_eq!(spec["parameters"][2]["children"][0]["when"], json!(["sgd"]));
    assert_eq!(spec["trial_job"]["executor"], "container");
    assert_eq!(spec["trial_job"]["worker_pools"][1]["replicas"], 2);
    assert_eq!(spec["trial_job"]["timeout_secs"], 3600);

    job["studySpec"]["parameters"][0]["scaleType"] = json!("UNIT_CUBIC_SCALE");
    let bad = app.post("/v1/studies", job).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert_eq!(
        bad.body["error"]["field"],
        "studySpec.parameters[0].scaleType"
    );
}

/// A metric with a `safety_threshold` constrains the study: the best trial (in the study's
/// view and in `optimal_trials`) is the best of the safe ones, and the objective is the
/// other metric even when the safety metric comes first.
#[tokio::test]
async fn safety_thresholds_keep_unsafe_trials_out_of_the_optimum() {
    let app = app("sqlite").await;
    let mut constrained = spec("random", 10, 2);
    constrained["metrics"] = json!([
        {"id": "memory_gb", "goal": "minimize", "safety_threshold": 8.0, "desired_min_safe_trials_fraction": 0.8},
        {"id": "accuracy", "goal": "maximize"}
    ]);
    let id = app.create_study(constrained).await;
    let params = json!({"lr": 0.01, "layers": 2, "batch": 32, "kernel": "rbf"});
    for (accuracy, memory) in [(0.80, 4.0), (0.95, 12.0), (0.85, 7.5), (0.99, 8.5)] {
        let r = app
            .post(
                &routes::trials(id),
                json!({"parameters": params, "final_measurement": {"metrics": {"accuracy": accuracy, "memory_gb": memory}}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let optimal = app.get(&routes::optimal_trials(id)).await.body;
    let trials = optimal["trials"].as_array().cloned().unwrap_or_default();
    assert_eq!(trials.len(), 1, "{optimal}");
    assert_eq!(
        trials[0]["id"], 3,
        "the best safe trial, not the best unsafe one: {optimal}"
    );
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["best_trial"]["id"], 3, "{study}");
    let bad = {
        let mut s = spec("random", 10, 2);
        s["metrics"][0]["desired_min_safe_trials_fraction"] = json!(0.5);
        app.post("/v1/studies", s).await
    };
    assert_eq!(
        bad.body["error"]["field"],
        "metrics[0].desired_min_safe_trials_fraction"
    );
}

/// A study with 8 completed trials, to warm-start a GP study from.
async fn prior_study(app: &crate::common::TestApp) -> i64 {
    let prior = app.create_study(spec("random", 20, 4)).await;
    for i in 0..8 {
        let lr = 0.0001 * 10f64.powf(i as f64 / 2.0);
        let r = app
            .post(
                &routes::trials(prior),
                json!({"parameters": {"lr": lr, "layers": 1 + i, "batch": 64, "kernel": "rbf"},
                       "final_measurement": {"metrics": {"accuracy": 1.0 - (lr.log10() + 2.0).abs() / 4.0}}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    prior
}

/// `prior_studies` names earlier studies to warm-start the GP from; each must exist.
#[tokio::test]
async fn prior_studies_must_exist() {
    let app = app("sqlite").await;
    let prior = prior_study(&app).await;
    let mut warm = spec("gp_bandit", 10, 1);
    warm["prior_studies"] = json!([prior, 999]);
    let missing = app.post("/v1/studies", warm).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.body["error"]["field"], "prior_studies[1]");
}

/// A study warm-started from a prior study suggests as any other: it keeps the prior's id in
/// its spec and counts only its own trials.
#[tokio::test]
async fn a_warm_started_study_suggests_as_any_other() {
    let app = app("sqlite").await;
    let prior = prior_study(&app).await;
    let mut warm = spec("gp_bandit", 10, 1);
    warm["prior_studies"] = json!([prior]);
    let id = app.create_study(warm).await;
    let s = suggest(&app, id, 1, None).await;
    assert_eq!(s["trials"].as_array().map(Vec::len), Some(1), "{s}");
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["spec"]["prior_studies"], json!([prior]));
    assert_eq!(
        study["trial_counts"]["total"], 1,
        "prior trials are not this study's"
    );
}

on_both_backends!(
    a_study_whose_first_trials_fail_alike_fails_saying_why,
    fail_fast_waits_for_identical_failures_before_any_completion,
    a_failed_trial_is_retried_with_its_parameters,
);

/// Fail `trials` of study `id` with `reason`.
async fn fail_all(app: &crate::common::TestApp, id: i64, trials: &[i64], reason: &str) {
    for t in trials {
        let r = app
            .post(&routes::trial_fail(id, t), json!({ "reason": reason }))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
}

/// `fail_fast_trials` (3 by default): the first three trials failing the same way, none
/// completed, fail the study with their reason; a PATCH reopens it for good.
async fn a_study_whose_first_trials_fail_alike_fails_saying_why(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 20, 3)).await;
    assert_eq!(
        app.get(&routes::study(id)).await.body["spec"]["fail_fast_trials"],
        3
    );
    suggest(&app, id, 3, None).await;
    fail_all(
        &app,
        id,
        &[1, 2],
        "could not start the job: pythno3: No such file",
    )
    .await;
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "active", "{study}");
    fail_all(
        &app,
        id,
        &[3],
        "could not start the job: pythno3: No such file",
    )
    .await;
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "failed", "{study}");
    let reason = study["state_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("first 3 trials all failed") && reason.contains("pythno3"),
        "{reason}"
    );
    assert!(reason.contains("augur study resume"), "{reason}");
    // Resumed, it is not failed again by the same three trials.
    let resumed = app.post(&routes::resume(id), json!({})).await;
    assert_eq!(resumed.body["state"], "active", "{}", resumed.body);
    assert_eq!(ids(&suggest(&app, id, 1, None).await["trials"]), vec![4]);
    fail_all(
        &app,
        id,
        &[4],
        "could not start the job: pythno3: No such file",
    )
    .await;
    assert_eq!(app.get(&routes::study(id)).await.body["state"], "active");
}

/// Different reasons, a completion first, or `fail_fast_trials: 0` leave the study running.
async fn fail_fast_waits_for_identical_failures_before_any_completion(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 20, 3)).await;
    suggest(&app, id, 3, None).await;
    fail_all(&app, id, &[1, 2], "exited with code 1").await;
    fail_all(&app, id, &[3], "timed out after 60 s").await;
    assert_eq!(app.get(&routes::study(id)).await.body["state"], "active");

    let id = app.create_study(spec("random", 20, 4)).await;
    suggest(&app, id, 4, None).await;
    complete(&app, id, 4, 0.5).await;
    fail_all(&app, id, &[1, 2, 3], "exited with code 1").await;
    assert_eq!(app.get(&routes::study(id)).await.body["state"], "active");

    let mut off = spec("random", 20, 3);
    off["fail_fast_trials"] = json!(0);
    let id = app.create_study(off).await;
    suggest(&app, id, 3, None).await;
    fail_all(&app, id, &[1, 2, 3], "exited with code 1").await;
    assert_eq!(app.get(&routes::study(id)).await.body["state"], "active");
    let mut bad = spec("random", 20, 3);
    bad["fail_fast_trials"] = json!(-1);
    let r = app.post("/v1/studies", bad).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "fail_fast_trials", "{}", r.body);
}

/// `POST …/trials/{trial}/retry`: a failed trial is requested again with the same
/// parameters and handed out first; a completed one, a full cap or a failed study refuse.
async fn a_failed_trial_is_retried_with_its_parameters(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 2, 1);
    s["max_failed_trials"] = json!(2);
    let id = app.create_study(s).await;
    let retry = |trial: i64| routes::trial_retry(id, trial);
    let first = suggest(&app, id, 1, Some("w")).await["trials"][0].clone();
    // A running trial is not retried, and while it runs the cap is full anyway.
    let r = app.post(&retry(1), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    fail_all(&app, id, &[1], "node lost").await;
    let r = app.post(&retry(1), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["state"], "requested", "{}", r.body);
    assert!(
        r.body.get("fail_reason").is_none_or(Value::is_null),
        "{}",
        r.body
    );
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["trial_counts"]["failed"], 0, "{study}");
    assert_eq!(study["trial_counts"]["requested"], 1, "{study}");
    // The next suggestion hands it out again: same trial, same values.
    let again = suggest(&app, id, 1, Some("w2")).await["trials"][0].clone();
    assert_eq!(again["id"], 1, "{again}");
    assert_eq!(again["parameters"], first["parameters"]);
    complete(&app, id, 1, 0.5).await;
    let r = app.post(&retry(1), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    // A failed study is resumed first, explicitly.
    suggest(&app, id, 1, Some("w3")).await;
    fail_all(&app, id, &[2], "oom").await;
    let s = app.get(&routes::study(id)).await.body;
    assert_eq!(s["state"], "completed", "the budget is spent: {s}");
    // A completed study goes on for the retried trial.
    let r = app.post(&retry(2), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let s = app.get(&routes::study(id)).await.body;
    assert_eq!(s["state"], "active", "{s}");
}
