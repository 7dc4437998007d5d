//! Black-box tests of the HTTP API against a real server, each run on a real SQLite file and
//! a real PostgreSQL database.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{TestApp, db, spawn_app, spec};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Each named async fn `name(backend)` becomes `name::sqlite` and `name::postgres` tests.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name("sqlite").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name("postgres").await
            }
        }
    )*};
}

on_both_backends!(
    study_lifecycle_create_get_list_patch_stop_delete,
    suggest_never_exceeds_cap_or_budget_and_completes_study,
    client_id_gets_its_unfinished_trials_back,
    expired_lease_returns_trial_to_requested_with_same_parameters,
    measurements_and_completion_paths,
    measurement_selection_best_picks_best_step,
    max_failed_trials_fails_study_and_raising_it_reopens,
    raising_max_trials_reopens_completed_study,
    added_trials_prior_results_and_requested_first,
    excluded_trial_is_not_best_and_not_given_to_optimizer,
    pareto_set_for_two_metrics,
    median_rule_stops_a_bad_trial,
    bad_inputs_are_rejected_with_field_and_change_nothing,
    conditional_parameters_only_when_parent_matches,
    quasi_random_and_grid_designers_through_the_service,
    paging_through_trials_and_studies,
    metrics_endpoint_reports_requests_and_trials,
);

async fn app(backend: &str) -> TestApp {
    spawn_app(db(backend).await).await
}

async fn suggest(app: &TestApp, study: i64, count: i64, client: Option<&str>) -> Value {
    let mut body = json!({"count": count});
    if let Some(c) = client {
        body["client_id"] = json!(c);
    }
    let r = app
        .post(&format!("/v1/studies/{study}/suggest"), body)
        .await;
    assert_eq!(r.status, StatusCode::OK, "suggest: {}", r.body);
    r.body
}

fn ids(trials: &Value) -> Vec<i64> {
    trials
        .as_array()
        .expect("array")
        .iter()
        .map(|t| t["id"].as_i64().expect("id"))
        .collect()
}

async fn complete(app: &TestApp, study: i64, trial: i64, accuracy: f64) -> Value {
    let r = app
        .post(
            &format!("/v1/studies/{study}/trials/{trial}/complete"),
            json!({"metrics": {"accuracy": accuracy}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.body);
    r.body
}

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

    let got = app.get(&format!("/v1/studies/{id}")).await;
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
            &format!("/v1/studies/{id}"),
            Some(json!({"max_trials": 20, "parallel_trials": 3})),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["spec"]["max_trials"], 20);
    assert_eq!(patched.body["spec"]["parallel_trials"], 3);

    let stopped = app.post(&format!("/v1/studies/{id}/stop"), json!({})).await;
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
            &format!("/v1/studies/{id}"),
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

    let deleted = app
        .call(Method::DELETE, &format!("/v1/studies/{id}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&format!("/v1/studies/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.call(Method::DELETE, &format!("/v1/studies/{id}"), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

async fn suggest_never_exceeds_cap_or_budget_and_completes_study(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 5, 2)).await;
    let first = suggest(&app, id, 5, None).await;
    assert_eq!(
        ids(&first["trials"]),
        vec![1, 2],
        "the cap of 2 limits a request for 5"
    );
    let full = suggest(&app, id, 1, None).await;
    assert_eq!(full["trials"], json!([]));
    assert_eq!(full["retry_after_secs"], 1);
    assert_eq!(full["study_state"], "active");

    complete(&app, id, 1, 0.5).await;
    let next = suggest(&app, id, 5, None).await;
    assert_eq!(ids(&next["trials"]), vec![3]);
    complete(&app, id, 2, 0.6).await;
    complete(&app, id, 3, 0.7).await;
    assert_eq!(ids(&suggest(&app, id, 5, None).await["trials"]), vec![4, 5]);
    let spent = suggest(&app, id, 1, None).await;
    assert_eq!(spent["trials"], json!([]), "budget of 5 is spent");
    assert_eq!(spent["study_state"], "active", "two trials still run");
    complete(&app, id, 4, 0.9).await;
    complete(&app, id, 5, 0.1).await;
    let done = suggest(&app, id, 1, None).await;
    assert_eq!(done["study_state"], "completed");
    assert!(done.get("retry_after_secs").is_none());
    let study = app.get(&format!("/v1/studies/{id}")).await.body;
    assert_eq!(study["state"], "completed");
    assert_eq!(study["trial_counts"]["completed"], 5);
    assert_eq!(study["trial_counts"]["total"], 5);
    assert_eq!(study["best_trial"]["id"], 4);
}

async fn client_id_gets_its_unfinished_trials_back(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 3)).await;
    let a = suggest(&app, id, 2, Some("worker-a")).await;
    assert_eq!(ids(&a["trials"]), vec![1, 2]);
    let again = suggest(&app, id, 2, Some("worker-a")).await;
    assert_eq!(
        ids(&again["trials"]),
        vec![1, 2],
        "a restarted worker resumes its trials"
    );
    assert_eq!(
        again["trials"][0]["parameters"],
        a["trials"][0]["parameters"]
    );
    let b = suggest(&app, id, 2, Some("worker-b")).await;
    assert_eq!(
        ids(&b["trials"]),
        vec![3],
        "only one slot is left for another worker"
    );
    assert_eq!(b["trials"][0]["client_id"], "worker-b");
}

async fn expired_lease_returns_trial_to_requested_with_same_parameters(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 10, 1);
    s["trial_lease_secs"] = json!(1);
    let id = app.create_study(s).await;
    let a = suggest(&app, id, 1, Some("a")).await;
    let params = a["trials"][0]["parameters"].clone();
    assert_eq!(
        suggest(&app, id, 1, Some("b")).await["trials"],
        json!([]),
        "cap full while leased"
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let b = suggest(&app, id, 1, Some("b")).await;
    assert_eq!(
        ids(&b["trials"]),
        vec![1],
        "the expired trial goes to the next worker"
    );
    assert_eq!(b["trials"][0]["parameters"], params);
    assert_eq!(b["trials"][0]["client_id"], "b");
    let hb = app
        .post(&format!("/v1/studies/{id}/trials/1/heartbeat"), json!({}))
        .await;
    assert_eq!(hb.status, StatusCode::OK);
    // The first worker lost it: its late report still lands on the trial (same parameters),
    // but asking again gives it nothing new while the cap is full.
    assert_eq!(suggest(&app, id, 1, Some("a")).await["trials"], json!([]));
}

async fn measurements_and_completion_paths(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 4)).await;
    suggest(&app, id, 4, None).await;
    let m = |step: i64, acc: f64| json!({"step": step, "elapsed_secs": 1.5, "metrics": {"accuracy": acc}});
    for (step, acc) in [(1, 0.3), (2, 0.6), (3, 0.5)] {
        let r = app
            .post(
                &format!("/v1/studies/{id}/trials/1/measurements"),
                m(step, acc),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    // A second report at a step replaces the first.
    app.post(
        &format!("/v1/studies/{id}/trials/1/measurements"),
        m(3, 0.55),
    )
    .await;
    let t1 = app.get(&format!("/v1/studies/{id}/trials/1")).await.body;
    assert_eq!(t1["measurements"].as_array().map(Vec::len), Some(3));
    assert_eq!(t1["measurements"][2]["metrics"]["accuracy"], 0.55);

    // Empty body: the last measurement becomes final.
    let r = app
        .call(
            Method::POST,
            &format!("/v1/studies/{id}/trials/1/complete"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["state"], "completed");
    assert_eq!(r.body["final_measurement"]["step"], 3);
    assert_eq!(r.body["final_measurement"]["metrics"]["accuracy"], 0.55);

    let done = complete(&app, id, 2, 0.8).await;
    assert_eq!(done["final_measurement"]["metrics"]["accuracy"], 0.8);
    let inf = app
        .post(
            &format!("/v1/studies/{id}/trials/3/complete"),
            json!({"infeasible_reason": "diverged"}),
        )
        .await;
    assert_eq!(inf.body["state"], "infeasible");
    assert_eq!(inf.body["infeasible_reason"], "diverged");
    let failed = app
        .post(
            &format!("/v1/studies/{id}/trials/4/fail"),
            json!({"reason": "OOM"}),
        )
        .await;
    assert_eq!(failed.body["state"], "failed");
    assert_eq!(failed.body["fail_reason"], "OOM");

    for (path, body) in [
        ("trials/2/complete", json!({"metrics": {"accuracy": 1.0}})),
        ("trials/2/measurements", m(9, 0.1)),
        ("trials/4/fail", json!({})),
        ("trials/3/heartbeat", json!({})),
    ] {
        let r = app.post(&format!("/v1/studies/{id}/{path}"), body).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{path}: {}", r.body);
        assert_eq!(r.body["error"]["code"], "failed_precondition");
    }
    let best = app
        .get(&format!("/v1/studies/{id}/optimal_trials"))
        .await
        .body;
    assert_eq!(ids(&best["trials"]), vec![2]);
    let counts = &app.get(&format!("/v1/studies/{id}")).await.body["trial_counts"];
    assert_eq!(
        (
            counts["completed"].as_i64(),
            counts["infeasible"].as_i64(),
            counts["failed"].as_i64()
        ),
        (Some(2), Some(1), Some(1))
    );
}

async fn measurement_selection_best_picks_best_step(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 5, 1);
    s["measurement_selection"] = json!("best");
    let id = app.create_study(s).await;
    suggest(&app, id, 1, None).await;
    for (step, acc) in [(1, 0.3), (2, 0.9), (3, 0.5)] {
        app.post(
            &format!("/v1/studies/{id}/trials/1/measurements"),
            json!({"step": step, "metrics": {"accuracy": acc}}),
        )
        .await;
    }
    let r = app
        .post(&format!("/v1/studies/{id}/trials/1/complete"), json!({}))
        .await;
    assert_eq!(r.body["final_measurement"]["step"], 2, "{}", r.body);
    // Without any measurement there is nothing to select.
    suggest(&app, id, 1, None).await;
    let none = app
        .post(&format!("/v1/studies/{id}/trials/2/complete"), json!({}))
        .await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    assert_eq!(none.body["error"]["field"], "metrics");
    assert_eq!(
        app.get(&format!("/v1/studies/{id}/trials/2")).await.body["state"],
        "active"
    );
}

async fn max_failed_trials_fails_study_and_raising_it_reopens(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 10, 2);
    s["max_failed_trials"] = json!(2);
    let id = app.create_study(s).await;
    suggest(&app, id, 2, None).await;
    app.post(
        &format!("/v1/studies/{id}/trials/1/fail"),
        json!({"reason": "x"}),
    )
    .await;
    assert_eq!(
        app.get(&format!("/v1/studies/{id}")).await.body["state"],
        "active"
    );
    app.post(
        &format!("/v1/studies/{id}/trials/2/fail"),
        json!({"reason": "y"}),
    )
    .await;
    let study = app.get(&format!("/v1/studies/{id}")).await.body;
    assert_eq!(study["state"], "failed");
    assert!(
        study["state_reason"]
            .as_str()
            .is_some_and(|r| r.contains("2 trials failed"))
    );
    assert_eq!(suggest(&app, id, 1, None).await["study_state"], "failed");
    let reopened = app
        .call(
            Method::PATCH,
            &format!("/v1/studies/{id}"),
            Some(json!({"max_failed_trials": 5})),
        )
        .await;
    assert_eq!(reopened.body["state"], "active", "{}", reopened.body);
    assert_eq!(ids(&suggest(&app, id, 1, None).await["trials"]), vec![3]);
}

async fn raising_max_trials_reopens_completed_study(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 1, 1)).await;
    suggest(&app, id, 1, None).await;
    complete(&app, id, 1, 0.5).await;
    assert_eq!(
        app.get(&format!("/v1/studies/{id}")).await.body["state"],
        "completed"
    );
    let r = app
        .call(
            Method::PATCH,
            &format!("/v1/studies/{id}"),
            Some(json!({"max_trials": 2})),
        )
        .await;
    assert_eq!(r.body["state"], "active");
    assert_eq!(ids(&suggest(&app, id, 1, None).await["trials"]), vec![2]);
}

async fn added_trials_prior_results_and_requested_first(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 4, 1)).await;
    let params = json!({"lr": 0.01, "layers": 3, "batch": 32, "kernel": "poly", "degree": 3});
    let prior = app
        .post(
            &format!("/v1/studies/{id}/trials"),
            json!({"parameters": params, "final_measurement": {"metrics": {"accuracy": 0.77}}}),
        )
        .await;
    assert_eq!(prior.status, StatusCode::CREATED, "{}", prior.body);
    assert_eq!(prior.body["state"], "completed");
    let queued_params = json!({"lr": 0.5, "layers": 1, "batch": 16, "kernel": "rbf"});
    let queued = app
        .post(
            &format!("/v1/studies/{id}/trials"),
            json!({"parameters": queued_params}),
        )
        .await;
    assert_eq!(queued.body["state"], "requested");
    let cap = app
        .post(
            &format!("/v1/studies/{id}/trials"),
            json!({"parameters": queued_params}),
        )
        .await;
    assert_eq!(
        cap.status,
        StatusCode::CONFLICT,
        "the cap of 1 holds for added trials too"
    );
    let s = suggest(&app, id, 1, Some("w")).await;
    assert_eq!(
        ids(&s["trials"]),
        vec![2],
        "the requested trial is handed out first"
    );
    assert_eq!(s["trials"][0]["parameters"], queued_params);
    assert_eq!(
        app.get(&format!("/v1/studies/{id}")).await.body["best_trial"]["id"],
        1
    );
}

async fn excluded_trial_is_not_best_and_not_given_to_optimizer(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 5, 2)).await;
    suggest(&app, id, 2, None).await;
    complete(&app, id, 1, 0.99).await;
    complete(&app, id, 2, 0.5).await;
    assert_eq!(
        app.get(&format!("/v1/studies/{id}")).await.body["best_trial"]["id"],
        1
    );
    let r = app
        .call(
            Method::PATCH,
            &format!("/v1/studies/{id}/trials/1"),
            Some(json!({"excluded": true})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["excluded"], true);
    assert_eq!(r.body["state"], "completed", "kept, not deleted");
    assert_eq!(
        app.get(&format!("/v1/studies/{id}")).await.body["best_trial"]["id"],
        2
    );
    assert_eq!(
        ids(&app
            .get(&format!("/v1/studies/{id}/optimal_trials"))
            .await
            .body["trials"]),
        vec![2]
    );
    app.call(
        Method::PATCH,
        &format!("/v1/studies/{id}/trials/1"),
        Some(json!({"excluded": false})),
    )
    .await;
    assert_eq!(
        app.get(&format!("/v1/studies/{id}")).await.body["best_trial"]["id"],
        1
    );
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
                &format!("/v1/studies/{id}/trials/{t}/complete"),
                json!({"metrics": {"accuracy": acc, "latency": lat}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let front = app
        .get(&format!("/v1/studies/{id}/optimal_trials"))
        .await
        .body;
    assert_eq!(ids(&front["trials"]), vec![2, 3, 4]);
    let missing = app.post(&format!("/v1/studies/{id}/trials"), json!({"parameters": {"lr": 0.1, "layers": 1, "batch": 16, "kernel": "rbf"}, "final_measurement": {"metrics": {"accuracy": 0.5}}})).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.body["error"]["field"],
        "final_measurement.metrics.latency"
    );
}

async fn median_rule_stops_a_bad_trial(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 20, 1);
    s["early_stopping"] = json!({"rule": "median", "min_completed_trials": 3});
    let id = app.create_study(s).await;
    // Three good trials with rising curves.
    for trial in 1..=3 {
        suggest(&app, id, 1, None).await;
        for step in 1..=5 {
            let acc = 0.5 + 0.08 * step as f64;
            app.post(
                &format!("/v1/studies/{id}/trials/{trial}/measurements"),
                json!({"step": step, "metrics": {"accuracy": acc}}),
            )
            .await;
        }
        let r = app
            .post(
                &format!("/v1/studies/{id}/trials/{trial}/should_stop"),
                json!({}),
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "should_stop is a GET"
        );
        app.post(
            &format!("/v1/studies/{id}/trials/{trial}/complete"),
            json!({}),
        )
        .await;
    }
    suggest(&app, id, 1, None).await;
    for step in 1..=3 {
        app.post(
            &format!("/v1/studies/{id}/trials/4/measurements"),
            json!({"step": step, "metrics": {"accuracy": 0.1}}),
        )
        .await;
    }
    let verdict = app
        .get(&format!("/v1/studies/{id}/trials/4/should_stop"))
        .await;
    assert_eq!(verdict.status, StatusCode::OK, "{}", verdict.body);
    assert_eq!(verdict.body["should_stop"], true);
    assert_eq!(
        app.get(&format!("/v1/studies/{id}/trials/4")).await.body["state"],
        "stopping"
    );
    let done = app
        .post(&format!("/v1/studies/{id}/trials/4/complete"), json!({}))
        .await;
    assert_eq!(done.body["state"], "completed");
    assert_eq!(done.body["early_stopped"], true);
    // A good trial is not stopped.
    suggest(&app, id, 1, None).await;
    app.post(
        &format!("/v1/studies/{id}/trials/5/measurements"),
        json!({"step": 3, "metrics": {"accuracy": 0.95}}),
    )
    .await;
    assert_eq!(
        app.get(&format!("/v1/studies/{id}/trials/5/should_stop"))
            .await
            .body["should_stop"],
        false
    );
    assert_eq!(
        app.get(&format!("/v1/studies/{id}/trials/5")).await.body["state"],
        "active"
    );
}

/// A study whose state is compared before and after the bad requests.
async fn snapshot(app: &TestApp, id: i64) -> (Value, Value) {
    let mut study = app.get(&format!("/v1/studies/{id}")).await.body;
    study.as_object_mut().map(|o| o.remove("updated_at"));
    (
        study,
        app.get(&format!("/v1/studies/{id}/trials")).await.body,
    )
}

async fn bad_inputs_are_rejected_with_field_and_change_nothing(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 2)).await;
    suggest(&app, id, 1, None).await;
    app.post(
        &format!("/v1/studies/{id}/trials/1/measurements"),
        json!({"step": 1, "metrics": {"accuracy": 0.4}}),
    )
    .await;
    let before = snapshot(&app, id).await;
    let studies_before = app.get("/v1/studies").await.body;

    let with = |patch: Value| {
        let mut s = spec("random", 10, 2);
        if let (Some(o), Some(p)) = (s.as_object_mut(), patch.as_object()) {
            for (k, v) in p {
                o.insert(k.clone(), v.clone());
            }
        }
        s
    };
    let param = |p: Value| with(json!({"parameters": [p]}));
    let study_path = format!("/v1/studies/{id}");
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
            Some(json!("not an object")),
            StatusCode::BAD_REQUEST,
            "body",
        ),
        (
            Method::PATCH,
            study_path.clone(),
            Some(json!({"parallel_trials": 0})),
            StatusCode::BAD_REQUEST,
            "parallel_trials",
        ),
        (
            Method::PATCH,
            study_path.clone(),
            Some(json!({"name": "renamed"})),
            StatusCode::BAD_REQUEST,
            "name",
        ),
        (
            Method::POST,
            format!("{study_path}/suggest"),
            Some(json!({"count": 0})),
            StatusCode::BAD_REQUEST,
            "count",
        ),
        (
            Method::POST,
            format!("{study_path}/suggest"),
            Some(json!({"count": "two"})),
            StatusCode::BAD_REQUEST,
            "count",
        ),
        (
            Method::POST,
            format!("{study_path}/suggest"),
            Some(json!({"client_id": ""})),
            StatusCode::BAD_REQUEST,
            "client_id",
        ),
        (
            Method::POST,
            format!("{study_path}/trials"),
            Some(json!({"parameters": {"lr": 5.0, "layers": 1, "batch": 16, "kernel": "rbf"}})),
            StatusCode::BAD_REQUEST,
            "parameters.lr",
        ),
        (
            Method::POST,
            format!("{study_path}/trials"),
            Some(
                json!({"parameters": {"lr": 0.1, "layers": 1, "batch": 16, "kernel": "rbf", "degree": 2}}),
            ),
            StatusCode::BAD_REQUEST,
            "parameters.degree",
        ),
        (
            Method::POST,
            format!("{study_path}/trials"),
            Some(json!({"parameters": {"lr": 0.1, "layers": 1, "batch": 16}})),
            StatusCode::BAD_REQUEST,
            "parameters.kernel",
        ),
        (
            Method::POST,
            format!("{study_path}/trials/1/measurements"),
            Some(json!({"step": -1, "metrics": {"accuracy": 0.1}})),
            StatusCode::BAD_REQUEST,
            "step",
        ),
        (
            Method::POST,
            format!("{study_path}/trials/1/measurements"),
            Some(json!({"step": 2, "metrics": {"loss": 0.1}})),
            StatusCode::BAD_REQUEST,
            "metrics.loss",
        ),
        (
            Method::POST,
            format!("{study_path}/trials/1/measurements"),
            Some(json!({"step": 2, "metrics": {}})),
            StatusCode::BAD_REQUEST,
            "metrics",
        ),
        (
            Method::POST,
            format!("{study_path}/trials/1/complete"),
            Some(json!({"metrics": {"accuracy": 0.5}, "infeasible_reason": "x"})),
            StatusCode::BAD_REQUEST,
            "infeasible_reason",
        ),
        (
            Method::POST,
            format!("{study_path}/trials/1/complete"),
            Some(json!({"metrics": {}})),
            StatusCode::BAD_REQUEST,
            "metrics.accuracy",
        ),
        (
            Method::POST,
            format!("{study_path}/trials/1/complete"),
            Some(json!({"infeasible_reason": "  "})),
            StatusCode::BAD_REQUEST,
            "infeasible_reason",
        ),
        (
            Method::GET,
            format!("{study_path}/trials?page_size=0"),
            None,
            StatusCode::BAD_REQUEST,
            "page_size",
        ),
        (
            Method::GET,
            format!("{study_path}/trials?page_token=abc"),
            None,
            StatusCode::BAD_REQUEST,
            "page_token",
        ),
        (
            Method::GET,
            format!("{study_path}/trials?state=sleeping"),
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
    let not_found: Vec<(Method, String)> = vec![
        (Method::GET, "/v1/studies/999".into()),
        (Method::GET, "/v1/studies/abc".into()),
        (Method::GET, format!("{study_path}/trials/99")),
        (Method::POST, format!("{study_path}/trials/99/complete")),
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
    let not_json = app
        .http
        .post(format!("{}/v1/studies", app.base))
        .header("content-type", "text/plain")
        .body("name: x")
        .send()
        .await
        .expect("sent");
    assert_eq!(not_json.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let huge = app
        .http
        .post(format!("{}/v1/studies", app.base))
        .header("content-type", "application/json")
        .body(format!("{{\"name\": \"{}\"}}", "x".repeat(2 * 1024 * 1024)))
        .send()
        .await
        .expect("sent");
    assert_eq!(huge.status(), StatusCode::PAYLOAD_TOO_LARGE);

    assert_eq!(snapshot(&app, id).await, before, "nothing stored changed");
    assert_eq!(
        app.get("/v1/studies").await.body["studies"]
            .as_array()
            .map(Vec::len),
        studies_before["studies"].as_array().map(Vec::len)
    );
}

async fn conditional_parameters_only_when_parent_matches(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 40, 40)).await;
    let s = suggest(&app, id, 40, None).await;
    let trials = s["trials"].as_array().expect("trials");
    assert_eq!(trials.len(), 40);
    let mut kernels = BTreeSet::new();
    for t in trials {
        let p = &t["parameters"];
        let kernel = p["kernel"].as_str().expect("kernel");
        kernels.insert(kernel.to_string());
        assert_eq!(p.get("degree").is_some(), kernel == "poly", "{p}");
        assert!(p["layers"].is_i64(), "integers are JSON integers: {p}");
        assert!([16, 32, 64, 128].contains(&p["batch"].as_i64().expect("batch")));
        let lr = p["lr"].as_f64().expect("lr");
        assert!((0.0001..=1.0).contains(&lr));
    }
    assert_eq!(kernels.len(), 2, "both branches are explored");
}

async fn quasi_random_and_grid_designers_through_the_service(backend: &str) {
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
    let study = app.get(&format!("/v1/studies/{gid}")).await.body;
    assert_eq!(
        study["state"], "completed",
        "an exhausted grid completes the study"
    );
    assert_eq!(study["trial_counts"]["total"], 6);
}

async fn paging_through_trials_and_studies(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 25, 25)).await;
    suggest(&app, id, 25, None).await;
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let path = match &token {
            Some(t) => format!("/v1/studies/{id}/trials?page_size=10&page_token={t}"),
            None => format!("/v1/studies/{id}/trials?page_size=10"),
        };
        let page = app.get(&path).await.body;
        seen.extend(ids(&page["trials"]));
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, (1..=25).collect::<Vec<_>>());
    complete(&app, id, 7, 0.1).await;
    let completed = app
        .get(&format!("/v1/studies/{id}/trials?state=completed"))
        .await
        .body;
    assert_eq!(ids(&completed["trials"]), vec![7]);
    for n in 0..3 {
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
    let health = app.get("/healthz").await;
    assert_eq!(health.body["status"], "ok");
    assert_eq!(app.get("/readyz").await.status, StatusCode::OK);
}

on_both_backends!(changes_cursor_returns_only_what_changed);

async fn changes_cursor_returns_only_what_changed(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 3)).await;
    let empty = app.get(&format!("/v1/studies/{id}/changes")).await.body;
    assert_eq!(empty["trials"], json!([]));
    let start = empty["cursor"].as_str().expect("cursor").to_string();
    suggest(&app, id, 3, None).await;
    let first = app
        .get(&format!("/v1/studies/{id}/changes?after={start}"))
        .await
        .body;
    assert_eq!(ids(&first["trials"]), vec![1, 2, 3]);
    let cursor = first["cursor"].as_str().expect("cursor").to_string();
    assert_eq!(
        app.get(&format!("/v1/studies/{id}/changes?after={cursor}"))
            .await
            .body["trials"],
        json!([])
    );
    app.post(
        &format!("/v1/studies/{id}/trials/2/measurements"),
        json!({"step": 1, "metrics": {"accuracy": 0.3}}),
    )
    .await;
    complete(&app, id, 3, 0.5).await;
    let next = app
        .get(&format!("/v1/studies/{id}/changes?after={cursor}"))
        .await
        .body;
    assert_eq!(
        ids(&next["trials"]),
        vec![2, 3],
        "a measurement and a completion, nothing else"
    );
    assert_eq!(next["trials"][1]["state"], "completed");
    assert_eq!(next["trials"][0]["measurements"][0]["step"], 1);
    let paged = app
        .get(&format!("/v1/studies/{id}/changes?page_size=2"))
        .await
        .body;
    assert_eq!(paged["has_more"], true);
    assert_eq!(paged["trials"].as_array().map(Vec::len), Some(2));
    let bad = app
        .get(&format!("/v1/studies/{id}/changes?after=yesterday"))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.body["error"]["field"], "after");
}

/// `should_stop` on a large study reads the curves of the latest completed trials only: its
/// cost must not grow with the study, since every running trial asks after every
/// measurement. Counted from PostgreSQL's statistics on the measurements table.
#[tokio::test]
async fn should_stop_reads_a_bounded_number_of_curves() {
    use augur::model::{Measurement, TrialState};
    use augur::store::TrialRecord;
    use sqlx::Connection;
    let app = spawn_app(common::postgres_db().await).await;
    let mut s = spec("random", 10_000, 1);
    s["early_stopping"] = json!({"rule": "median", "min_completed_trials": 3});
    let id = app.create_study(s).await;
    // 5,000 completed trials with five-step rising curves, written in bulk.
    let store = augur::store::connect(&app.db.url).await.expect("store");
    let now = chrono::Utc::now();
    let completed = 5_000i64;
    for first in (1..=completed).step_by(1_000) {
        let mut tx = store.begin_study(id).await.expect("begin").expect("study");
        let mut study = tx.study().clone();
        let mut trials = Vec::new();
        let mut curves = Vec::new();
        for trial in first..first + 1_000 {
            let at = |step: i64| Measurement {
                step,
                elapsed_secs: None,
                metrics: [("accuracy".to_string(), 0.5 + 0.08 * step as f64)].into(),
            };
            curves.extend((1..=5).map(|step| (trial, at(step))));
            trials.push(TrialRecord {
                study_id: id,
                id: trial,
                state: TrialState::Completed,
                parameters: [
                    ("lr".to_string(), augur_optimizer::Value::Float(0.01)),
                    ("layers".to_string(), augur_optimizer::Value::Int(2)),
                    ("batch".to_string(), augur_optimizer::Value::Int(32)),
                    (
                        "kernel".to_string(),
                        augur_optimizer::Value::Str("rbf".into()),
                    ),
                ]
                .into(),
                client_id: None,
                final_measurement: Some(at(5)),
                objective: Some(0.9),
                infeasible_reason: None,
                fail_reason: None,
                early_stopped: false,
                excluded: false,
                lease_expires_at: None,
                created_at: now,
                started_at: Some(now),
                completed_at: Some(now),
                change_seq: study.change_seq + 1,
                attempts: 0,
            });
        }
        tx.insert_trials(&trials).await.expect("insert");
        tx.upsert_measurements(&curves, now).await.expect("curves");
        study.next_trial_id = first + 1_000;
        study.change_seq += 1;
        tx.update_study(&study).await.expect("study");
        tx.commit().await.expect("commit");
    }
    suggest(&app, id, 1, None).await;
    let running = completed + 1;
    for step in 1..=3 {
        let r = app
            .post(
                &format!("/v1/studies/{id}/trials/{running}/measurements"),
                json!({"step": step, "metrics": {"accuracy": 0.1}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }

    let mut admin = sqlx::PgConnection::connect(&app.db.url)
        .await
        .expect("connect");
    const ROWS_READ: &str = "SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) \
         FROM pg_stat_user_tables WHERE relname = 'measurements'";
    let before = common::settled_pg_counter(&mut admin, ROWS_READ).await;
    let verdict = app
        .get(&format!("/v1/studies/{id}/trials/{running}/should_stop"))
        .await;
    let read = common::settled_pg_counter(&mut admin, ROWS_READ).await - before;
    assert_eq!(verdict.status, StatusCode::OK, "{}", verdict.body);
    assert_eq!(
        verdict.body["should_stop"], true,
        "a trial far below the rest"
    );
    assert!(
        read < 7_000,
        "should_stop read {read} measurements; the study holds {}",
        completed * 5
    );
}
