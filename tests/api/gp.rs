//! The default algorithm (GP bandit) through the service: ask/tell workers with
//! `parallel_trials: 5` converge on a known function, far better than random search.

use crate::common::{self, routes};

use common::TestApp;
use serde_json::json;

/// Branin on x1 in [-5, 10], x2 in [0, 15]; minimum 0.397887.
fn branin(x1: f64, x2: f64) -> f64 {
    let pi = std::f64::consts::PI;
    let (a, b, c, r, s, t) = (
        1.0,
        5.1 / (4.0 * pi * pi),
        5.0 / pi,
        6.0,
        10.0,
        1.0 / (8.0 * pi),
    );
    a * (x2 - b * x1 * x1 + c * x1 - r).powi(2) + s * (1.0 - t) * x1.cos() + s
}

/// Run a Branin study to its end with batches of 5 suggested before any is told; return
/// the best value found.
async fn run_branin(app: &TestApp, algorithm: &str, seed: u64, trials: i64) -> f64 {
    let id = app
        .create_study(json!({
            "name": format!("branin-{algorithm}-{seed}"),
            "algorithm": algorithm,
            "metrics": [{"id": "value", "goal": "minimize"}],
            "parameters": [
                {"id": "x1", "type": "double", "min": -5, "max": 10},
                {"id": "x2", "type": "double", "min": 0, "max": 15}
            ],
            "max_trials": trials, "parallel_trials": 5, "seed": seed
        }))
        .await;
    loop {
        let batch = app
            .post(&routes::suggest(id), json!({"count": 5}))
            .await
            .body;
        let trials = batch["trials"].as_array().cloned().unwrap_or_default();
        if trials.is_empty() {
            assert_eq!(batch["study_state"], "completed", "{batch}");
            break;
        }
        for t in trials {
            let p = &t["parameters"];
            let value = branin(p["x1"].as_f64().expect("x1"), p["x2"].as_f64().expect("x2"));
            let path = routes::trial_complete(id, &t["id"]);
            let r = app.post(&path, json!({"metrics": {"value": value}})).await;
            assert_eq!(r.status, reqwest::StatusCode::OK, "{}", r.body);
        }
    }
    let best = app.get(&routes::study(id)).await.body;
    best["best_trial"]["final_measurement"]["metrics"]["value"]
        .as_f64()
        .expect("best value")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gp_bandit_by_ask_tell_in_batches_of_five_converges_on_branin() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut gp = Vec::new();
    let mut random = Vec::new();
    for seed in 0..3 {
        gp.push(run_branin(&app, "gp_bandit", seed, 30).await - 0.397887);
        random.push(run_branin(&app, "random", seed, 30).await - 0.397887);
    }
    gp.sort_by(f64::total_cmp);
    random.sort_by(f64::total_cmp);
    // Median simple regret after 30 trials (6 batches of 5).
    assert!(gp[1] < 0.1, "GP regret {gp:?}");
    assert!(gp[1] < random[1], "GP {gp:?} vs random {random:?}");
}

/// A Branin study with `history` finished trials spread over the box (x1 on a grid, x2 on
/// a permutation of it), the given suggestion budget and cap.
async fn branin_study_with_history(
    app: &TestApp,
    name: &str,
    budget_secs: f64,
    parallel: i64,
    history: u32,
) -> i64 {
    let id = app
        .create_study(json!({
            "name": name,
            "metrics": [{"id": "value", "goal": "minimize"}],
            "parameters": [
                {"id": "x1", "type": "double", "min": -5, "max": 10},
                {"id": "x2", "type": "double", "min": 0, "max": 15}
            ],
            "max_trials": 1000, "parallel_trials": parallel, "seed": 5,
            "suggestion_time_budget_secs": budget_secs
        }))
        .await;
    let n = f64::from(history);
    for i in 0..history {
        let (x1, x2) = (
            -5.0 + 15.0 * f64::from(i) / n,
            15.0 * f64::from((i * 37) % history) / n,
        );
        let body = json!({"parameters": {"x1": x1, "x2": x2}, "final_measurement": {"metrics": {"value": branin(x1, x2)}}});
        let r = app.post(&routes::trials(id), body).await;
        assert_eq!(r.status, reqwest::StatusCode::CREATED, "{}", r.body);
    }
    id
}

/// A model that misses the study's suggestion time budget never fails or delays the
/// request: it is answered with quasi-random points, and the fallback is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suggestion_over_its_time_budget_falls_back_to_quasi_random() {
    let app = common::spawn_app(common::sqlite_db()).await;
    // Enough history that the GP fit takes far longer than a millisecond.
    let id = branin_study_with_history(&app, "tight-budget", 0.001, 5, 40).await;
    let s = app.post(&routes::suggest(id), json!({"count": 5})).await;
    assert_eq!(s.status, reqwest::StatusCode::OK, "{}", s.body);
    assert_eq!(
        s.body["trials"].as_array().map(Vec::len),
        Some(5),
        "{}",
        s.body
    );
    let metrics = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("augur_suggestion_budget_exceeded_total"),
        "{metrics}"
    );
    let bad = app
        .post(
            "/v1/studies",
            json!({"name": "b", "metrics": [{"id": "v", "goal": "minimize"}],
            "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}], "max_trials": 1,
            "suggestion_time_budget_secs": 0}),
        )
        .await;
    assert_eq!(bad.body["error"]["field"], "suggestion_time_budget_secs");
}

/// Suggestions that wait for the study's previous one past their time budget (the design
/// lock) get quasi-random points chosen inside the study's batch: on time, and never the same
/// point twice, however many arrive together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suggestions_late_for_the_design_lock_get_distinct_points() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let id = branin_study_with_history(&app, "crowded", 0.02, 12, 40).await;
    let asks = (0..12).map(|c| {
        let app = &app;
        async move {
            app.post(
                &routes::suggest(id),
                json!({"count": 1, "client_id": format!("w{c}")}),
            )
            .await
        }
    });
    let mut points = Vec::new();
    for r in futures::future::join_all(asks).await {
        assert_eq!(r.status, reqwest::StatusCode::OK, "{}", r.body);
        let trial = &r.body["trials"][0];
        points.push(format!("{}", trial["parameters"]));
    }
    let distinct: std::collections::BTreeSet<_> = points.iter().collect();
    assert_eq!(distinct.len(), 12, "repeated points: {points:?}");
}

/// A suggestion that gets its turn with less time left than its study's last fit took
/// answers at once with quasi-random points (`stage="no_time_to_fit"` in `/metrics`)
/// instead of starting a fit that would be stopped at its deadline. Two suggestions arrive
/// together on a budget of about one and a half fits: the first fits, and the second, which
/// waited for it, has half a fit left. Timing on a shared machine varies, so up to four
/// fresh studies are tried; without the rule no attempt counts one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suggestion_left_less_time_than_the_last_fit_took_starts_no_fit() {
    const NO_TIME: &str = "augur_suggestion_budget_exceeded_total{stage=\"no_time_to_fit\"}";
    let app = common::spawn_app(common::sqlite_db()).await;
    let suggest = |id: i64, client: &'static str| {
        let app = &app;
        async move {
            let r = app
                .post(
                    &routes::suggest(id),
                    json!({"count": 1, "client_id": client}),
                )
                .await;
            assert_eq!(r.status, reqwest::StatusCode::OK, "{}", r.body);
            assert_eq!(
                r.body["trials"].as_array().map(Vec::len),
                Some(1),
                "{}",
                r.body
            );
        }
    };
    let mut seen = Vec::new();
    for attempt in 0..4 {
        // How long the first fit on this history takes here, with an ample budget.
        let calibration = branin_study_with_history(&app, "calibration", 60.0, 5, 150).await;
        let started = std::time::Instant::now();
        suggest(calibration, "c").await;
        let fit = started.elapsed().as_secs_f64();
        // The design gets nine tenths of the budget: 1.5 fits.
        let id = branin_study_with_history(&app, "tight", fit / 0.6, 5, 150).await;
        let before = common::metric_sample(&app.base, None, NO_TIME).await;
        futures::future::join(suggest(id, "a"), suggest(id, "b")).await;
        let after = common::metric_sample(&app.base, None, NO_TIME).await;
        seen.push((attempt, fit, after - before));
        if after > before {
            return;
        }
    }
    panic!("no suggestion skipped its fit (attempt, fit secs, counted): {seen:?}");
}
