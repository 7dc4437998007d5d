//! Multi-fidelity studies over ask/tell: a pulled worker gets trials at the lowest rung, a
//! completion pauses them, and later suggestions resume the same trial at the next budget
//! (ASHA's promotions) or stop it at its rung when nothing is left.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, TestApp, routes};
use crate::support::{app, ids, suggest};

on_both_backends!(
    ask_tell_workers_get_promotions_as_the_same_trial_at_a_larger_budget,
    hyperband_starts_brackets_at_different_rungs_and_halves_each_when_it_is_whole,
    a_stopped_study_ends_its_paused_trials_at_their_rung,
    a_study_starts_no_attempt_past_its_max_budget_and_then_ends,
    a_raised_max_budget_lets_promotions_that_did_not_fit_go_on,
    in_process_trainers_that_train_on_are_stopped_at_rungs_as_asha_would,
);

fn asha_spec() -> Value {
    let mut spec = common::x_spec("asha", ("loss", "minimize"), 3, 3, 5);
    spec["fidelity"] = json!({"argument": "epochs", "min": 1, "max": 9, "reduction_factor": 3});
    spec["scheduler"] = json!("asha");
    spec
}

async fn report(app: &TestApp, study: i64, trial: i64, loss: f64) -> Value {
    let r = app
        .post(
            &routes::trial_complete(study, trial),
            json!({"metrics": {"loss": loss}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.body);
    r.body
}

async fn ask_tell_workers_get_promotions_as_the_same_trial_at_a_larger_budget(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(asha_spec()).await;
    let first = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&first["trials"]), vec![1, 2, 3]);
    assert!(
        first["trials"]
            .as_array()
            .expect("trials")
            .iter()
            .all(|t| t["budget"] == 1
                && t["parameters"].get("epochs").is_none()
                && t.get("resume").is_none()),
        "new trials start at the lowest rung; the budget is no parameter: {first}"
    );
    // A completion below the full budget pauses the trial: no slot held, no best yet.
    for (trial, loss) in [(1, 0.5), (2, 0.2), (3, 0.9)] {
        let t = report(&app, id, trial, loss).await;
        assert_eq!(t["state"], "paused", "{t}");
    }
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["trial_counts"]["paused"], 3, "{study}");
    assert_eq!(study["state"], "active");
    assert_eq!(
        (
            &study["best_trial"]["id"],
            &study["best_trial"]["provisional"]
        ),
        (&json!(2), &json!(true)),
        "no trial at the full budget: the best at 1 epoch, marked provisional: {study}"
    );
    let optimal = app.get(&routes::optimal_trials(id)).await.body;
    assert_eq!(optimal["trials"][0]["id"], 2, "{optimal}");
    assert_eq!(optimal["trials"][0]["provisional"], true, "{optimal}");

    // The top third of rung 1 (trial 2) goes on to 3 epochs: the same trial.
    let promoted = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&promoted["trials"]), vec![2], "{promoted}");
    assert_eq!(promoted["trials"][0]["budget"], 3);
    assert_eq!(promoted["trials"][0]["state"], "active");
    assert_eq!(
        promoted["trials"][0]["resume"], true,
        "a promotion goes on from the checkpoint: {promoted}"
    );
    report(&app, id, 2, 0.1).await;
    // Nothing else runs or may start: the best of rung 3 goes on to the full budget.
    let top = suggest(&app, id, 1, Some("w")).await;
    assert_eq!(ids(&top["trials"]), vec![2], "{top}");
    assert_eq!(top["trials"][0]["budget"], 9);
    assert_eq!(top["trials"][0]["resume"], true, "{top}");
    let done = report(&app, id, 2, 0.05).await;
    assert_eq!(
        done["state"], "completed",
        "at the full budget it completes: {done}"
    );
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["best_trial"]["id"], 2, "{study}");
    assert!(study["best_trial"].get("provisional").is_none(), "{study}");
    // Then the rest stop at their rung, and the study ends.
    let last = suggest(&app, id, 1, Some("w")).await;
    assert!(ids(&last["trials"]).is_empty(), "{last}");
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], 3);
    assert_eq!(study["best_trial"]["id"], 2);
    for trial in [1, 3] {
        let t = app.get(&routes::trial(id, trial)).await.body;
        assert_eq!(
            (
                t["state"].clone(),
                t["early_stopped"].clone(),
                t["budget"].clone()
            ),
            (json!("completed"), json!(true), json!(1)),
            "{t}"
        );
    }
    let steps: Vec<i64> = app.get(&routes::trial(id, 2)).await.body["measurements"]
        .as_array()
        .expect("measurements")
        .iter()
        .filter_map(|m| m["step"].as_i64())
        .collect();
    assert_eq!(steps, vec![1, 3, 9], "each rung's result at its step");
}

/// Hyperband over rungs 1, 3, 9 (η 3): bracket 2 takes trials 1-9 at 1 epoch, bracket 1
/// trials 10-14 at 3 epochs. A bracket's rung is decided once all its trials are measured
/// there: then its top third goes on and the rest stop.
async fn hyperband_starts_brackets_at_different_rungs_and_halves_each_when_it_is_whole(
    backend: &str,
) {
    let app = app(backend).await;
    let mut spec = asha_spec();
    spec["scheduler"] = json!("hyperband");
    spec["max_trials"] = json!(12);
    spec["parallel_trials"] = json!(12);
    let id = app.create_study(spec).await;
    let handed = suggest(&app, id, 12, Some("w")).await;
    let budgets: Vec<i64> = handed["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .map(|t| t["budget"].as_i64().expect("budget"))
        .collect();
    assert_eq!(budgets, [vec![1; 9], vec![3; 3]].concat(), "{handed}");
    // Bracket 2's rung 1: nothing is decided until its ninth trial is measured.
    for trial in 1..=8 {
        report(&app, id, trial, trial as f64).await;
    }
    // (Another client: "w" still holds trials 9-12, which suggest would hand back to it.)
    assert!(ids(&suggest(&app, id, 3, Some("w2")).await["trials"]).is_empty());
    report(&app, id, 9, 0.5).await;
    let promoted = suggest(&app, id, 3, Some("w2")).await;
    assert_eq!(
        ids(&promoted["trials"]),
        vec![9, 1, 2],
        "the best first: {promoted}"
    );
    assert!(
        promoted["trials"]
            .as_array()
            .expect("trials")
            .iter()
            .all(|t| t["budget"] == 3)
    );
    for trial in 3..=8 {
        let t = app.get(&routes::trial(id, trial)).await.body;
        assert_eq!(
            (t["state"].clone(), t["budget"].clone()),
            (json!("completed"), json!(1)),
            "{t}"
        );
    }
}

/// A user stopping an ASHA study while trials wait at a rung ends them there (completed,
/// early-stopped, with what they measured): no trial is left paused in a study that ended.
async fn a_stopped_study_ends_its_paused_trials_at_their_rung(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(asha_spec()).await;
    suggest(&app, id, 3, Some("w")).await;
    report(&app, id, 1, 0.5).await;
    report(&app, id, 2, 0.2).await;
    let stopped = app.post(&routes::stop(id), json!({})).await;
    assert_eq!(stopped.status, StatusCode::OK, "{}", stopped.body);
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "stopped", "{study}");
    assert_eq!(study["trial_counts"]["paused"], 0, "{study}");
    for trial in [1, 2] {
        let t = app.get(&routes::trial(id, trial)).await.body;
        assert_eq!(
            (t["state"].clone(), t["early_stopped"].clone()),
            (json!("completed"), json!(true)),
            "{t}"
        );
        assert!(t["final_measurement"]["metrics"]["loss"].is_number(), "{t}");
    }
}

/// `max_budget: 8` epochs on rungs 1, 3, 9: attempts start while they fit (a promotion from 1
/// to 3 costs 2), then no new configuration fits, the paused trials end at their rung and
/// the study completes with 6 of its 9 configurations, 8 epochs allocated.
async fn a_study_starts_no_attempt_past_its_max_budget_and_then_ends(backend: &str) {
    let app = app(backend).await;
    let mut spec = asha_spec();
    spec["max_trials"] = json!(9);
    spec["max_budget"] = json!(8);
    let id = app.create_study(spec).await;
    let first = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&first["trials"]), vec![1, 2, 3]);
    for (trial, loss) in [(1, 0.5), (2, 0.2), (3, 0.9)] {
        report(&app, id, trial, loss).await;
    }
    // 3 spent: trial 2 goes on to 3 epochs (2 more), two new ones start at 1.
    let second = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&second["trials"]), vec![2, 4, 5], "{second}");
    for (trial, loss) in [(2, 0.1), (4, 0.8), (5, 0.7)] {
        report(&app, id, trial, loss).await;
    }
    // 7 spent: one more epoch fits, one new configuration, not three.
    let third = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&third["trials"]), vec![6], "{third}");
    assert_eq!(third["trials"][0]["budget"], 1);
    report(&app, id, 6, 0.95).await;
    // 8 spent: nothing fits (trial 1's promotion would cost 2, trial 2's 6): the paused
    // trials end at their rung and the study is done.
    let last = suggest(&app, id, 3, Some("w")).await;
    assert!(ids(&last["trials"]).is_empty(), "{last}");
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], 6, "{study}");
    assert_eq!(study["trial_counts"]["paused"], 0, "{study}");
    let trials = app.get(&routes::trials(id)).await.body;
    let spent: f64 = trials["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .filter_map(|t| t["budget"].as_f64())
        .sum();
    assert_eq!(spent, 8.0, "{trials}");
    // None reached 9 epochs: the best is the best at 3, provisional.
    assert_eq!(study["best_trial"]["id"], 2, "{study}");
    assert_eq!(study["best_trial"]["provisional"], true, "{study}");
    // Raised, the completed study goes on with new configurations; the trials it ended at
    // their rung stay ended.
    let raised = app
        .call(
            reqwest::Method::PATCH,
            &routes::study(id),
            Some(json!({"max_budget": 10})),
        )
        .await;
    assert_eq!(raised.status, StatusCode::OK, "{}", raised.body);
    assert_eq!(raised.body["state"], "active", "{}", raised.body);
    let more = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&more["trials"]), vec![7, 8], "two epochs left: {more}");
    assert!(
        more["trials"]
            .as_array()
            .expect("trials")
            .iter()
            .all(|t| t["budget"] == 1),
        "{more}"
    );
}

/// `max_budget: 4` on rungs 1, 3, 9: after three trials at 1 epoch, trial 2's promotion (2
/// more) does not fit, one new trial does. Raised with PATCH to 10 while that trial runs,
/// the promotion fits and is the next suggestion. A bad value names the field.
async fn a_raised_max_budget_lets_promotions_that_did_not_fit_go_on(backend: &str) {
    let app = app(backend).await;
    let mut spec = asha_spec();
    spec["max_trials"] = json!(9);
    spec["max_budget"] = json!(4);
    let id = app.create_study(spec).await;
    let first = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&first["trials"]), vec![1, 2, 3]);
    for (trial, loss) in [(1, 0.5), (2, 0.2), (3, 0.9)] {
        report(&app, id, trial, loss).await;
    }
    let second = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&second["trials"]), vec![4], "one epoch left: {second}");
    let patch = |body: Value| {
        let app = &app;
        async move {
            app.call(reqwest::Method::PATCH, &routes::study(id), Some(body))
                .await
        }
    };
    for (bad, why) in [
        (json!(0.5), "below the first rung"),
        (json!(-3), "negative"),
    ] {
        let r = patch(json!({"max_budget": bad})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{why}: {}", r.body);
        assert_eq!(r.body["error"]["field"], "max_budget", "{why}: {}", r.body);
    }
    let raised = patch(json!({"max_budget": 10})).await;
    assert_eq!(raised.status, StatusCode::OK, "{}", raised.body);
    assert_eq!(raised.body["spec"]["max_budget"], 10.0, "{}", raised.body);
    report(&app, id, 4, 0.8).await;
    let third = suggest(&app, id, 3, Some("w")).await;
    let promoted = third["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .find(|t| t["id"] == 2)
        .unwrap_or_else(|| panic!("trial 2's promotion fits now: {third}"));
    assert_eq!(promoted["budget"], 3, "{third}");
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "active", "{study}");

    // Only a multi-fidelity study has a total budget.
    let plain = app
        .create_study(common::x_spec("plain", ("loss", "minimize"), 3, 3, 5))
        .await;
    let r = app
        .call(
            reqwest::Method::PATCH,
            &routes::study(plain),
            Some(json!({"max_budget": 10})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "max_budget", "{}", r.body);
}

/// Trainers that cannot pause (Optuna-style, in one process) ignore their budget, report
/// every epoch and ask `should_stop`: ASHA's stopping variant ranks each at the highest rung
/// it reached among every trial measured there (top ⌈n/η⌉ go on). Four trials report epoch
/// by epoch in turn: at 1 epoch only the best goes on; it trains alone to 9 and completes at
/// the full budget; the others end where they were stopped, not paused.
async fn in_process_trainers_that_train_on_are_stopped_at_rungs_as_asha_would(backend: &str) {
    let app = app(backend).await;
    let mut spec = asha_spec();
    spec["max_trials"] = json!(4);
    spec["parallel_trials"] = json!(4);
    let id = app.create_study(spec).await;
    let handed = suggest(&app, id, 4, Some("w")).await;
    assert_eq!(ids(&handed["trials"]), vec![1, 2, 3, 4]);
    let loss = |trial: i64, step: i64| 0.1 * trial as f64 + 1.0 / step as f64;
    let mut training: Vec<i64> = vec![1, 2, 3, 4];
    let mut answers = Vec::new();
    for step in 1..=9i64 {
        for &trial in &training.clone() {
            let r = app
                .post(
                    &routes::trial_measurements(id, trial),
                    json!({"step": step, "metrics": {"loss": loss(trial, step)}}),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            let stop = app
                .post(&routes::trial_should_stop(id, trial), json!({}))
                .await
                .body["should_stop"]
                == json!(true);
            answers.push((step, trial, stop));
            if stop {
                training.retain(|t| *t != trial);
                report(&app, id, trial, loss(trial, step)).await;
            }
        }
    }
    // At 1 epoch each is ranked among those measured so far: trial 1 (1 of 1) goes on, 2
    // (second of 2), 3 (third of 3) and 4 (fourth of 4, ⌈4/3⌉ = 2 go on) stop.
    let at_one: Vec<(i64, bool)> = answers
        .iter()
        .filter(|(s, _, _)| *s == 1)
        .map(|(_, t, stop)| (*t, *stop))
        .collect();
    assert_eq!(at_one, [(1, false), (2, true), (3, true), (4, true)]);
    assert!(
        answers
            .iter()
            .filter(|(_, t, _)| *t == 1)
            .all(|(_, _, stop)| !stop),
        "the best trains on to the full budget: {answers:?}"
    );
    let done = report(&app, id, 1, loss(1, 9)).await;
    assert_eq!(
        done["state"], "completed",
        "at 9 epochs it completes: {done}"
    );
    assert_eq!(done["budget"], 9, "{done}");
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["paused"], 0, "{study}");
    assert_eq!(study["best_trial"]["id"], 1, "{study}");
    assert!(study["best_trial"].get("provisional").is_none(), "{study}");
    for trial in 2..=4 {
        let t = app.get(&routes::trial(id, trial)).await.body;
        assert_eq!(
            (&t["state"], &t["early_stopped"], &t["budget"]),
            (&json!("completed"), &json!(true), &json!(1)),
            "{t}"
        );
    }
}
