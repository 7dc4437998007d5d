//! Worker pools over the API (issue 31), on SQLite and PostgreSQL: a pool study's spec is
//! validated with errors that name the field, the server's own dispatcher leaves pool
//! studies alone, `GET /v1/pools` and `GET /v1/pools/{pool}` show workers, queue and
//! utilisation, and a slot's lease is a long poll that a freed slot answers at once, with a
//! token that reports to the leased trial alone. (`tests/jobs/pools.rs` runs real workers.)

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{self, TestApp, routes};

on_both_backends!(
    a_pool_spec_is_refused_with_the_field_named,
    pools_show_workers_queue_and_usage_and_the_dispatcher_leaves_them_alone,
    a_waiting_lease_is_answered_when_a_slot_frees,
);

fn pool_spec(pool: Value, parallel: i64) -> Value {
    let mut spec = common::x_spec("pooled", ("loss", "minimize"), 4, parallel, 1);
    spec["trial_job"] = json!({"executor": "pool", "pool": pool, "command": ["sh", "train.sh"]});
    spec
}

/// Each bad pool spec answers 400 naming its field; nothing is created.
async fn a_pool_spec_is_refused_with_the_field_named(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let without_pool = {
        let mut spec = pool_spec(json!("p"), 1);
        spec["trial_job"]
            .as_object_mut()
            .expect("job")
            .remove("pool");
        spec
    };
    let weight = |w: Value| {
        let mut spec = pool_spec(json!("p"), 1);
        spec["trial_job"]["pool_weight"] = w;
        spec
    };
    let local_with_pool = {
        let mut spec = pool_spec(json!("p"), 1);
        spec["trial_job"]["executor"] = json!("local");
        spec
    };
    let unknown = {
        let mut spec = pool_spec(json!("p"), 1);
        spec["trial_job"]["pool_size"] = json!(3);
        spec
    };
    let cases = [
        (without_pool, "trial_job.pool", "executor: pool needs"),
        (
            pool_spec(json!(""), 1),
            "trial_job.pool",
            "executor: pool needs",
        ),
        (
            pool_spec(json!("a b"), 1),
            "trial_job.pool",
            "must name a pool",
        ),
        (
            pool_spec(json!("x".repeat(65)), 1),
            "trial_job.pool",
            "must name a pool",
        ),
        (weight(json!(0)), "trial_job.pool_weight", "above 0"),
        (weight(json!(5000)), "trial_job.pool_weight", "at most 1000"),
        (local_with_pool, "trial_job", "apply to executor: pool only"),
        (unknown, "trial_job.pool_size", "unknown field"),
    ];
    for (spec, field, says) in cases {
        let r = app.post("/v1/studies", spec.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{spec}: {}", r.body);
        assert_eq!(r.body["error"]["field"], field, "{spec}: {}", r.body);
        let message = r.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{spec}: {message}");
    }
    let studies = app.get("/v1/studies").await.body;
    assert_eq!(
        studies["studies"],
        json!([]),
        "nothing was created: {studies}"
    );
    // A good one keeps its pool fields as written.
    let mut spec = pool_spec(json!("gpu-a100.x"), 2);
    spec["trial_job"]["pool_weight"] = json!(2.5);
    let id = app.create_study(spec).await;
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["spec"]["trial_job"]["executor"], "pool", "{study}");
    assert_eq!(study["spec"]["trial_job"]["pool"], "gpu-a100.x", "{study}");
    assert_eq!(study["spec"]["trial_job"]["pool_weight"], 2.5, "{study}");
}

async fn put_worker(app: &TestApp, pool: &str, worker: &str, body: Value) -> common::Response {
    app.call(Method::PUT, &routes::pool_worker(pool, worker), Some(body))
        .await
}

async fn lease(app: &TestApp, pool: &str, worker: &str, slot: u32, wait: f64) -> common::Response {
    app.post(
        &routes::pool_worker_lease(pool, worker),
        json!({"slot": slot, "wait_secs": wait}),
    )
    .await
}

/// A pool exists once a study or a worker names it. Its view has the worker's slots and
/// GPUs, the studies' pending demand (the queue), and busy and idle slot-seconds; the
/// server's dispatcher starts none of a pool study's trials; a lease hands one out with a
/// token that reports to it, and the queue shrinks.
async fn pools_show_workers_queue_and_usage_and_the_dispatcher_leaves_them_alone(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    assert_eq!(app.get("/v1/pools").await.body, json!({"pools": []}));
    let id = app.create_study(pool_spec(json!("shape"), 2)).await;
    // The dispatcher runs local studies at once; a pool study waits for its workers.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(
        study["trial_counts"]["total"], 0,
        "the server ran a pool trial: {study}"
    );

    let pools = app.get("/v1/pools").await.body;
    assert_eq!(pools["pools"][0]["name"], "shape", "{pools}");
    assert_eq!(pools["pools"][0]["workers"], 0, "{pools}");
    assert_eq!(pools["pools"][0]["queue_length"], 2, "{pools}");
    assert_eq!(pools["pools"][0]["studies_waiting"], 1, "{pools}");

    let report = json!({"host": "gpu-node-1", "slots": 4, "gpus": ["0", "1"], "busy": 0});
    let r = put_worker(&app, "shape", "w1", report).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    for (bad, field) in [
        (json!({"host": "h", "slots": 0}), "slots"),
        (json!({"host": "h", "slots": 2, "busy": 3}), "busy"),
        (json!({"host": "", "slots": 2}), "host"),
    ] {
        let r = put_worker(&app, "shape", "w1", bad.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
        assert_eq!(r.body["error"]["field"], field, "{bad}: {}", r.body);
    }
    let r = put_worker(
        &app,
        "shape",
        "w1",
        json!({"host": "h", "slots": 1, "cores": 8}),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "unknown field: {}",
        r.body
    );
    let r = put_worker(&app, "no pool", "w1", json!({"host": "h", "slots": 1})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);

    let got = lease(&app, "shape", "w1", 0, 0.0).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    let leased = &got.body["lease"];
    assert_eq!(leased["study_id"], id, "{leased}");
    assert_eq!(leased["trial"]["client_id"], "w1/0", "{leased}");
    assert_eq!(leased["trial"]["state"], "active", "{leased}");
    let trial = leased["trial"]["id"].as_i64().expect("trial");
    let token = leased["token"].as_str().expect("token").to_string();
    // The same slot asking again gets the trial it holds back.
    let again = lease(&app, "shape", "w1", 0, 0.0).await;
    assert_eq!(again.body["lease"]["trial"]["id"], trial, "{}", again.body);
    let r = lease(&app, "shape", "w1", 0, 31.0).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "wait_secs", "{}", r.body);

    let busy = json!({"host": "gpu-node-1", "slots": 4, "gpus": ["0", "1"], "busy": 1});
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        put_worker(&app, "shape", "w1", busy).await.status,
        StatusCode::NO_CONTENT
    );
    let pool = app.get(&routes::pool("shape")).await.body;
    assert_eq!(pool["name"], "shape", "{pool}");
    assert_eq!(pool["workers"], 1, "{pool}");
    assert_eq!(pool["slots"], 4, "{pool}");
    assert_eq!(pool["busy_slots"], 1, "{pool}");
    assert_eq!(pool["idle_slots"], 3, "{pool}");
    assert_eq!(pool["queue_length"], 1, "one trial runs, one waits: {pool}");
    let worker = &pool["worker_list"][0];
    assert_eq!(worker["id"], "w1", "{worker}");
    assert_eq!(worker["host"], "gpu-node-1", "{worker}");
    assert_eq!(worker["gpus"], json!(["0", "1"]), "{worker}");
    assert_eq!(worker["live"], true, "{worker}");
    assert!(worker["last_seen_at"].is_string(), "{worker}");
    // The 0.3 s before this report were 4 idle slots (busy 0 then).
    let idle = worker["idle_slot_secs"].as_f64().expect("idle");
    assert!(idle > 0.5 && idle < 30.0, "{worker}");
    assert_eq!(pool["study_list"][0]["study_id"], id, "{pool}");
    assert_eq!(pool["study_list"][0]["running"], 1, "{pool}");
    assert_eq!(pool["study_list"][0]["pending"], 1, "{pool}");
    let usage = pool["usage"].as_array().expect("usage");
    assert!(!usage.is_empty(), "{pool}");
    assert!(usage[0]["minute"].is_string() && usage[0]["idle_slot_secs"].as_f64() > Some(0.0));

    // The lease's token reports to its trial, and to nothing else.
    let own = common::call(
        &app.http,
        &app.base,
        Some(&token),
        Method::POST,
        &routes::trial_complete(id, trial),
        Some(json!({"metrics": {"loss": 0.5}})),
    )
    .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    let pool = app.get(&routes::pool("shape")).await.body;
    assert_eq!(pool["queue_length"], 2, "the slot is free again: {pool}");

    // The dashboard's pools page: its shell, and the module that draws it from the above.
    let page = app
        .http
        .get(format!("{}/pools", app.base))
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), StatusCode::OK);
    assert!(
        page.text()
            .await
            .expect("html")
            .contains(r#"data-page="pools""#)
    );
    let module = app
        .http
        .get(format!("{}/dashboard/js/pools.js", app.base))
        .send()
        .await
        .expect("js");
    assert_eq!(module.status(), StatusCode::OK);
    assert!(module.text().await.expect("js").contains("/v1/pools/"));
}

/// A lease that finds every study at its cap waits; a trial's completion answers it at
/// once (not at the next poll), with the next trial.
async fn a_waiting_lease_is_answered_when_a_slot_frees(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let id = app.create_study(pool_spec(json!("wait"), 1)).await;
    let first = lease(&app, "wait", "w", 0, 0.0).await.body;
    let trial = first["lease"]["trial"]["id"].as_i64().expect("trial");
    // The cap (1) is full: an empty answer after the wait.
    let started = Instant::now();
    let none = lease(&app, "wait", "w", 1, 0.3).await;
    assert_eq!(none.body, json!({"lease": null}), "{}", none.body);
    assert!(started.elapsed() >= Duration::from_millis(300));

    let waiting = {
        let (http, base) = (app.http.clone(), app.base.clone());
        tokio::spawn(async move {
            let body = json!({"slot": 1, "wait_secs": 20});
            let r = common::call(
                &http,
                &base,
                None,
                Method::POST,
                &routes::pool_worker_lease("wait", "w"),
                Some(body),
            )
            .await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A worker completes with the measurements it read at the trial's exit, in one request
    // (not with metrics besides: then they would not be chosen from).
    let path = routes::trial_complete(id, trial);
    let last =
        json!([{"step": 1, "metrics": {"loss": 2.0}}, {"step": 2, "metrics": {"loss": 1.5}}]);
    let both = app
        .post(
            &path,
            json!({"measurements": last, "metrics": {"loss": 1.0}}),
        )
        .await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST, "{}", both.body);
    assert_eq!(both.body["error"]["field"], "measurements", "{}", both.body);
    let done = app.post(&path, json!({"measurements": last})).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(
        done.body["measurements"].as_array().map(Vec::len),
        Some(2),
        "{}",
        done.body
    );
    assert_eq!(
        done.body["final_measurement"]["metrics"]["loss"], 1.5,
        "{}",
        done.body
    );
    let completed_at = Instant::now();
    let (next, answered_at) = waiting.await.expect("lease task");
    assert_eq!(
        next.body["lease"]["trial"]["id"],
        trial + 1,
        "{}",
        next.body
    );
    let waited = answered_at.saturating_duration_since(completed_at);
    assert!(
        waited < Duration::from_secs(2),
        "answered {waited:?} after the slot freed"
    );
}
