//! Study-level stopping (`study_stopping`, Vertex's `studyStoppingConfig`): a study that
//! stops making progress ends before `max_trials`, with the reason recorded; the running
//! trials finish first unless `should_stop_asap`; `min_num_trials` holds the rule back; bad
//! values are named, in Augur's spec and in a Vertex job.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, TestApp, routes};
use crate::support::{app, ids, suggest};

on_both_backends!(
    a_study_stops_after_that_many_trials_without_progress,
    min_num_trials_holds_the_rule_back_until_that_many_completed,
    running_trials_finish_first_unless_should_stop_asap,
    max_num_trials_is_a_budget_whose_trials_all_finish,
    bad_study_stopping_values_are_named_in_augurs_and_vertexs_terms,
);

fn stopping_spec(name: &str, parallel: i64, stopping: Value) -> Value {
    let mut spec = common::x_spec(name, ("loss", "minimize"), 50, parallel, 3);
    spec["study_stopping"] = stopping;
    spec
}

async fn complete(app: &TestApp, study: i64, trial: i64, loss: f64) -> Value {
    let r = app
        .post(
            &routes::trial_complete(study, trial),
            json!({"metrics": {"loss": loss}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.body);
    r.body
}

/// One trial at a time: ask for it, complete it with `loss`; the study as it is then.
async fn run_one(app: &TestApp, study: i64, loss: f64) -> Value {
    let s = suggest(app, study, 1, Some("w")).await;
    let trial = ids(&s["trials"])
        .first()
        .copied()
        .unwrap_or_else(|| panic!("a trial to run: {s}"));
    complete(app, study, trial, loss).await;
    app.get(&routes::study(study)).await.body
}

async fn a_study_stops_after_that_many_trials_without_progress(backend: &str) {
    let app = app(backend).await;
    let id = app
        .create_study(stopping_spec(
            "no-progress",
            1,
            json!({"max_num_trials_no_progress": 3}),
        ))
        .await;
    // 0.4 is the best; 0.6, 0.45 and 0.7 make none: the third of them ends the study.
    for loss in [0.5, 0.4, 0.6, 0.45] {
        let study = run_one(&app, id, loss).await;
        assert_eq!(study["state"], "active", "{study}");
    }
    let study = run_one(&app, id, 0.7).await;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], 5, "{study}");
    let reason = study["state_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("max_num_trials_no_progress: 3"),
        "the reason is recorded: {study}"
    );
    let after = suggest(&app, id, 1, Some("w")).await;
    assert!(ids(&after["trials"]).is_empty(), "no trial after: {after}");
}

async fn min_num_trials_holds_the_rule_back_until_that_many_completed(backend: &str) {
    let app = app(backend).await;
    let id = app
        .create_study(stopping_spec(
            "min-trials",
            1,
            json!({"min_num_trials": 4, "max_num_trials_no_progress": 1}),
        ))
        .await;
    // Trial 2 already makes no progress, but only 2 have completed: the study goes on.
    for loss in [0.5, 0.9, 0.8] {
        let study = run_one(&app, id, loss).await;
        assert_eq!(study["state"], "active", "{study}");
    }
    let study = run_one(&app, id, 0.7).await;
    assert_eq!(study["state"], "completed", "at 4 completed: {study}");
    assert_eq!(study["trial_counts"]["completed"], 4);
}

async fn running_trials_finish_first_unless_should_stop_asap(backend: &str) {
    let app = app(backend).await;
    for asap in [false, true] {
        let id = app
            .create_study(stopping_spec(
                &format!("asap-{asap}"),
                2,
                json!({"max_num_trials_no_progress": 1, "should_stop_asap": asap}),
            ))
            .await;
        assert_eq!(ids(&suggest(&app, id, 1, Some("a")).await["trials"]), [1]);
        assert_eq!(ids(&suggest(&app, id, 1, Some("b")).await["trials"]), [2]);
        complete(&app, id, 1, 0.5).await;
        assert_eq!(ids(&suggest(&app, id, 1, Some("c")).await["trials"]), [3]);
        // Trial 3 makes no progress: the rule fires while trial 2 runs.
        complete(&app, id, 3, 0.9).await;
        let study = app.get(&routes::study(id)).await.body;
        let trial2 = app.get(&routes::trial(id, 2)).await.body;
        if asap {
            assert_eq!(study["state"], "completed", "at once: {study}");
            assert_eq!(trial2["state"], "stopping", "told to stop: {trial2}");
            let verdict = app.get(&routes::trial_should_stop(id, 2)).await.body;
            assert_eq!(verdict["should_stop"], true, "{verdict}");
        } else {
            assert_eq!(study["state"], "active", "trial 2 still runs: {study}");
            assert_eq!(trial2["state"], "active");
            let none = suggest(&app, id, 1, Some("v")).await;
            assert!(ids(&none["trials"]).is_empty(), "no new trial: {none}");
        }
        // Its result is still taken, and the study is over.
        complete(&app, id, 2, 0.95).await;
        let study = app.get(&routes::study(id)).await.body;
        assert_eq!(study["state"], "completed", "{study}");
        assert_eq!(study["trial_counts"]["completed"], 3, "{study}");
    }
}

async fn bad_study_stopping_values_are_named_in_augurs_and_vertexs_terms(backend: &str) {
    let app = app(backend).await;
    let cases = [
        (
            json!({"min_delta_change": -1}),
            "study_stopping.min_delta_change",
        ),
        (
            json!({"max_num_trials_no_progress": 0}),
            "study_stopping.max_num_trials_no_progress",
        ),
        (
            json!({"min_num_trials": 9, "max_num_trials": 3}),
            "study_stopping.min_num_trials",
        ),
        (json!({"max_trials_ever": 3}), "study_stopping"),
    ];
    for (stopping, field) in cases {
        let r = app
            .post("/v1/studies", stopping_spec("bad", 1, stopping.clone()))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{stopping}: {}", r.body);
        let named = r.body["error"]["field"].as_str().unwrap_or_default();
        assert!(named.starts_with(field), "{stopping}: {}", r.body);
    }
    let vertex = json!({
        "displayName": "vertex-bad",
        "maxTrialCount": 10,
        "studySpec": {
            "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
            "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}],
            "studyStoppingConfig": {"maximumRuntimeConstraint": {"maxDuration": "60s"}},
        },
    });
    let r = app.post("/v1/studies", vertex).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(
        r.body["error"]["field"], "studySpec.studyStoppingConfig.maximumRuntimeConstraint",
        "{}",
        r.body
    );
    let listed = app.get("/v1/studies").await.body;
    assert!(
        !listed.to_string().contains("\"bad\""),
        "nothing was created: {listed}"
    );
}

async fn max_num_trials_is_a_budget_whose_trials_all_finish(backend: &str) {
    let app = app(backend).await;
    let id = app
        .create_study(stopping_spec(
            "max-num-trials",
            3,
            json!({"max_num_trials": 2, "should_stop_asap": true}),
        ))
        .await;
    // One suggestion of three makes only the two the count allows.
    assert_eq!(
        ids(&suggest(&app, id, 3, Some("a")).await["trials"]),
        [1, 2]
    );
    let none = suggest(&app, id, 1, Some("b")).await;
    assert!(ids(&none["trials"]).is_empty(), "{none}");
    for trial in [1, 2] {
        let t = app.get(&routes::trial(id, trial)).await.body;
        assert_eq!(t["state"], "active", "not stopped, even asap: {t}");
    }
    complete(&app, id, 1, 0.3).await;
    complete(&app, id, 2, 0.2).await;
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], 2, "{study}");
    let reason = study["state_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("max_num_trials: 2"), "{study}");
}
