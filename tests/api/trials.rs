//! Trials over HTTP: measurements and every way to complete, measurement selection,
//! exclusion, early stopping, and the change cursor of live views.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::{self, routes, spawn_app, spec};
use crate::support::{app, complete, ids, suggest};

on_both_backends!(
    measurements_and_completion_paths,
    measurement_selection_best_picks_best_step,
    excluded_trial_is_not_best_and_not_given_to_optimizer,
    median_rule_stops_a_bad_trial,
    early_stopping_reads_the_metric_it_names,
    changes_cursor_returns_only_what_changed,
    trial_counts_follow_every_transition,
);

async fn measurements_and_completion_paths(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 4)).await;
    suggest(&app, id, 4, None).await;
    let m = |step: i64, acc: f64| json!({"step": step, "elapsed_secs": 1.5, "metrics": {"accuracy": acc}});
    for (step, acc) in [(1, 0.3), (2, 0.6), (3, 0.5)] {
        let r = app
            .post(&routes::trial_measurements(id, 1), m(step, acc))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    // A second report at a step replaces the first.
    app.post(&routes::trial_measurements(id, 1), m(3, 0.55))
        .await;
    let t1 = app.get(&routes::trial(id, 1)).await.body;
    assert_eq!(t1["measurements"].as_array().map(Vec::len), Some(3));
    assert_eq!(t1["measurements"][2]["metrics"]["accuracy"], 0.55);

    // Empty body: the last measurement becomes final.
    let r = app
        .call(Method::POST, &routes::trial_complete(id, 1), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["state"], "completed");
    assert_eq!(r.body["final_measurement"]["step"], 3);
    assert_eq!(r.body["final_measurement"]["metrics"]["accuracy"], 0.55);

    let done = complete(&app, id, 2, 0.8).await;
    assert_eq!(done["final_measurement"]["metrics"]["accuracy"], 0.8);
    let inf = app
        .post(
            &routes::trial_complete(id, 3),
            json!({"infeasible_reason": "diverged"}),
        )
        .await;
    assert_eq!(inf.body["state"], "infeasible");
    assert_eq!(inf.body["infeasible_reason"], "diverged");
    let failed = app
        .post(&routes::trial_fail(id, 4), json!({"reason": "OOM"}))
        .await;
    assert_eq!(failed.body["state"], "failed");
    assert_eq!(failed.body["fail_reason"], "OOM");

    for (path, body) in [
        (
            routes::trial_complete(id, 2),
            json!({"metrics": {"accuracy": 1.0}}),
        ),
        (routes::trial_measurements(id, 2), m(9, 0.1)),
        (routes::trial_fail(id, 4), json!({})),
        (routes::trial_heartbeat(id, 3), json!({})),
    ] {
        let r = app.post(&path, body).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{path}: {}", r.body);
        assert_eq!(r.body["error"]["code"], "failed_precondition");
    }
    let best = app.get(&routes::optimal_trials(id)).await.body;
    assert_eq!(ids(&best["trials"]), vec![2]);
    let counts = &app.get(&routes::study(id)).await.body["trial_counts"];
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
            &routes::trial_measurements(id, 1),
            json!({"step": step, "metrics": {"accuracy": acc}}),
        )
        .await;
    }
    let r = app.post(&routes::trial_complete(id, 1), json!({})).await;
    assert_eq!(r.body["final_measurement"]["step"], 2, "{}", r.body);
    // Without any measurement there is nothing to select.
    suggest(&app, id, 1, None).await;
    let none = app.post(&routes::trial_complete(id, 2), json!({})).await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    assert_eq!(none.body["error"]["field"], "metrics");
    assert_eq!(app.get(&routes::trial(id, 2)).await.body["state"], "active");
}

async fn excluded_trial_is_not_best_and_not_given_to_optimizer(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 5, 2)).await;
    suggest(&app, id, 2, None).await;
    complete(&app, id, 1, 0.99).await;
    complete(&app, id, 2, 0.5).await;
    assert_eq!(
        app.get(&routes::study(id)).await.body["best_trial"]["id"],
        1
    );
    let r = app
        .call(
            Method::PATCH,
            &routes::trial(id, 1),
            Some(json!({"excluded": true})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["excluded"], true);
    assert_eq!(r.body["state"], "completed", "kept, not deleted");
    assert_eq!(
        app.get(&routes::study(id)).await.body["best_trial"]["id"],
        2
    );
    assert_eq!(
        ids(&app.get(&routes::optimal_trials(id)).await.body["trials"]),
        vec![2]
    );
    app.call(
        Method::PATCH,
        &routes::trial(id, 1),
        Some(json!({"excluded": false})),
    )
    .await;
    assert_eq!(
        app.get(&routes::study(id)).await.body["best_trial"]["id"],
        1
    );
}

/// `early_stopping.metric` names the curve the rule reads: here the second metric, `loss`;
/// a trial as accurate as its peers but with a far worse loss stops, and one with a good
/// loss and a poor accuracy does not.
async fn early_stopping_reads_the_metric_it_names(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 20, 1);
    s["metrics"] = json!([
        {"id": "accuracy", "goal": "maximize"},
        {"id": "loss", "goal": "minimize"}
    ]);
    s["early_stopping"] = json!({"rule": "median", "min_completed_trials": 3, "metric": "loss"});
    let id = app.create_study(s).await;
    let report = |trial: i64, accuracy: f64, loss: f64| {
        let app = &app;
        async move {
            for step in 1..=3 {
                let r = app
                    .post(
                        &routes::trial_measurements(id, trial),
                        json!({"step": step, "metrics": {"accuracy": accuracy, "loss": loss}}),
                    )
                    .await;
                assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            }
        }
    };
    let verdict = |trial: i64| {
        let app = &app;
        async move { app.get(&routes::trial_should_stop(id, trial)).await.body["should_stop"].clone() }
    };
    for trial in 1..=3 {
        suggest(&app, id, 1, None).await;
        report(trial, 0.8, 0.2).await;
        app.post(&routes::trial_complete(id, trial), json!({}))
            .await;
    }
    suggest(&app, id, 1, None).await;
    report(4, 0.8, 3.0).await;
    assert_eq!(
        verdict(4).await,
        true,
        "its loss is far worse than its peers'"
    );
    app.post(&routes::trial_complete(id, 4), json!({})).await;
    suggest(&app, id, 1, None).await;
    report(5, 0.1, 0.1).await;
    assert_eq!(
        verdict(5).await,
        false,
        "a poor accuracy is not what the rule reads"
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
                &routes::trial_measurements(id, trial),
                json!({"step": step, "metrics": {"accuracy": acc}}),
            )
            .await;
        }
        let r = app
            .post(&routes::trial_should_stop(id, trial), json!({}))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body["should_stop"], false);
        app.post(&routes::trial_complete(id, trial), json!({}))
            .await;
    }
    suggest(&app, id, 1, None).await;
    for step in 1..=3 {
        app.post(
            &routes::trial_measurements(id, 4),
            json!({"step": step, "metrics": {"accuracy": 0.1}}),
        )
        .await;
    }
    // A GET reads the verdict and changes nothing (issue 10, finding 6: a GET moved the
    // trial to `stopping`, so a prefetch or a crawler could stop trials).
    let verdict = app.get(&routes::trial_should_stop(id, 4)).await;
    assert_eq!(verdict.status, StatusCode::OK, "{}", verdict.body);
    assert_eq!(verdict.body["should_stop"], true);
    assert_eq!(
        app.get(&routes::trial(id, 4)).await.body["state"],
        "active",
        "a GET changed the trial"
    );
    // The POST acts on it.
    let verdict = app.post(&routes::trial_should_stop(id, 4), json!({})).await;
    assert_eq!(verdict.status, StatusCode::OK, "{}", verdict.body);
    assert_eq!(verdict.body["should_stop"], true);
    assert_eq!(
        app.get(&routes::trial(id, 4)).await.body["state"],
        "stopping"
    );
    assert_counts_match_trials(&app, id).await;
    let done = app.post(&routes::trial_complete(id, 4), json!({})).await;
    assert_eq!(done.body["state"], "completed");
    assert_eq!(done.body["early_stopped"], true);
    // A good trial is not stopped.
    suggest(&app, id, 1, None).await;
    app.post(
        &routes::trial_measurements(id, 5),
        json!({"step": 3, "metrics": {"accuracy": 0.95}}),
    )
    .await;
    assert_eq!(
        app.get(&routes::trial_should_stop(id, 5)).await.body["should_stop"],
        false
    );
    assert_eq!(app.get(&routes::trial(id, 5)).await.body["state"], "active");
}

async fn changes_cursor_returns_only_what_changed(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 3)).await;
    let empty = app.get(&routes::changes(id)).await.body;
    assert_eq!(empty["trials"], json!([]));
    let start = empty["cursor"].as_str().expect("cursor").to_string();
    suggest(&app, id, 3, None).await;
    let first = app.get(&routes::changes_after(id, start)).await.body;
    assert_eq!(ids(&first["trials"]), vec![1, 2, 3]);
    let cursor = first["cursor"].as_str().expect("cursor").to_string();
    assert_eq!(
        app.get(&routes::changes_after(id, &cursor)).await.body["trials"],
        json!([])
    );
    app.post(
        &routes::trial_measurements(id, 2),
        json!({"step": 1, "metrics": {"accuracy": 0.3}}),
    )
    .await;
    complete(&app, id, 3, 0.5).await;
    let next = app.get(&routes::changes_after(id, &cursor)).await.body;
    assert_eq!(
        ids(&next["trials"]),
        vec![2, 3],
        "a measurement and a completion, nothing else"
    );
    assert_eq!(next["trials"][1]["state"], "completed");
    assert_eq!(next["trials"][0]["measurements"][0]["step"], 1);
    let paged = app
        .get(&format!("{}?page_size=2", routes::changes(id)))
        .await
        .body;
    assert_eq!(paged["has_more"], true);
    assert_eq!(paged["trials"].as_array().map(Vec::len), Some(2));
    let bad = app.get(&routes::changes_after(id, "yesterday")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.body["error"]["field"], "after");
}

/// `should_stop` on a large study reads the curves of the latest completed trials only: its
/// cost must not grow with the study, since every running trial asks after every
/// measurement. Counted from PostgreSQL's statistics on the measurements table.
#[tokio::test]
async fn should_stop_reads_a_bounded_number_of_curves() {
    use augur::model::{Measurement, StudyId, TrialId, TrialState};
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
        let mut tx = store
            .begin_study(StudyId::new(id))
            .await
            .expect("begin")
            .expect("study");
        let mut study = tx.study().clone();
        let mut trials = Vec::new();
        let mut curves = Vec::new();
        for trial in first..first + 1_000 {
            let at = |step: i64| Measurement {
                step,
                elapsed_secs: None,
                metrics: [("accuracy".to_string(), 0.5 + 0.08 * step as f64)].into(),
            };
            curves.extend((1..=5).map(|step| (TrialId::new(trial), at(step))));
            trials.push(TrialRecord {
                study_id: StudyId::new(id),
                id: TrialId::new(trial),
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
                budget: None,
                lineage: None,
            });
        }
        tx.insert_trials(&trials).await.expect("insert");
        tx.upsert_measurements(&curves, now).await.expect("curves");
        study.next_trial_id = TrialId::new(first + 1_000);
        study.change_seq += 1;
        for t in &trials {
            study.trial_counts.moved(None, t.state);
        }
        tx.update_study(&study).await.expect("study");
        tx.commit().await.expect("commit");
    }
    suggest(&app, id, 1, None).await;
    let running = completed + 1;
    for step in 1..=3 {
        let r = app
            .post(
                &routes::trial_measurements(id, running),
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
    let verdict = app.get(&routes::trial_should_stop(id, running)).await;
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

/// The study's `trial_counts` (kept by each batch, not counted) against its trials' states.
async fn assert_counts_match_trials(app: &common::TestApp, study: i64) {
    let listed = app.get(&routes::all_trials(study)).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let mut counted = serde_json::Map::new();
    let trials = listed.body["trials"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for state in [
        "requested",
        "active",
        "stopping",
        "completed",
        "infeasible",
        "failed",
        "paused",
    ] {
        let n = trials.iter().filter(|t| t["state"] == state).count();
        counted.insert(state.into(), json!(n));
    }
    counted.insert("total".into(), json!(trials.len()));
    let study_body = app.get(&routes::study(study)).await.body;
    assert_eq!(
        study_body["trial_counts"],
        serde_json::Value::Object(counted),
        "stored counts vs the trials"
    );
    // The studies list shows the same counts.
    let list = app.get("/v1/studies?page_size=1000").await.body;
    let listed_study = list["studies"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["id"] == study))
        .cloned()
        .expect("study listed");
    assert_eq!(listed_study["trial_counts"], study_body["trial_counts"]);
}

/// Every way a trial changes state moves it between the study's counts.
async fn trial_counts_follow_every_transition(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 20, 6)).await;
    assert_counts_match_trials(&app, id).await;
    let handed = ids(&suggest(&app, id, 4, Some("w1")).await["trials"]);
    assert_eq!(handed, vec![1, 2, 3, 4]);
    assert_counts_match_trials(&app, id).await;
    complete(&app, id, 1, 0.5).await;
    let failed = app
        .post(
            &routes::trial_fail(id, 2),
            json!({"reason": "out of memory"}),
        )
        .await;
    assert_eq!(failed.status, StatusCode::OK, "{}", failed.body);
    let infeasible = app
        .post(
            &routes::trial_complete(id, 3),
            json!({"infeasible_reason": "diverged"}),
        )
        .await;
    assert_eq!(infeasible.status, StatusCode::OK, "{}", infeasible.body);
    assert_counts_match_trials(&app, id).await;
    // Added by hand: requested, and completed at once.
    let params = json!({"lr": 0.01, "layers": 2, "batch": 16, "kernel": "rbf"});
    let added = app
        .post(&routes::trials(id), json!({"parameters": params}))
        .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    let added_done = app
        .post(
            &routes::trials(id),
            json!({"parameters": params, "final_measurement": {"metrics": {"accuracy": 0.7}}}),
        )
        .await;
    assert_eq!(
        added_done.status,
        StatusCode::CREATED,
        "{}",
        added_done.body
    );
    assert_counts_match_trials(&app, id).await;
    // The requested trial is handed out (requested → active), a completed one excluded.
    suggest(&app, id, 1, Some("w2")).await;
    let excluded = app
        .call(
            Method::PATCH,
            &routes::trial(id, 1),
            Some(json!({"excluded": true})),
        )
        .await;
    assert_eq!(excluded.status, StatusCode::OK, "{}", excluded.body);
    assert_counts_match_trials(&app, id).await;
    let counts = app.get(&routes::study(id)).await.body["trial_counts"].clone();
    assert_eq!(
        counts,
        json!({"requested": 0, "active": 2, "stopping": 0, "completed": 2,
               "infeasible": 1, "failed": 1, "paused": 0, "total": 6})
    );
}
