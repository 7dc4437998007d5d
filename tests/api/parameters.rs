//! A study's search space grows while it runs (`POST /v1/studies/{study}/parameters`, issue
//! 27 item 5: Optuna's define-by-run spaces): a new child is suggested only where its
//! parent's value activates it, trials stored before still load and teach the GP, a running
//! trial takes the new parameter's value, concurrent additions all land, and every bad
//! request is a 4xx naming its field. On SQLite and PostgreSQL.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{TestApp, routes};
use crate::support::{app, call_as, suggest, token};

on_both_backends!(
    a_child_is_suggested_only_where_its_parent_activates_it,
    a_running_trial_takes_the_new_parameter_and_old_trials_still_load,
    the_gp_learns_from_trials_before_and_after_the_space_grew,
    concurrent_additions_under_other_parent_values_all_land,
    bad_additions_get_a_4xx_naming_the_field,
    only_the_creator_or_an_admin_grows_a_space,
);

/// A study of `lr` and `optimizer`, the metric `loss`.
fn optimizer_spec(algorithm: &str, max_trials: i64, parallel: i64) -> Value {
    json!({
        "name": format!("grow-{algorithm}"),
        "algorithm": algorithm,
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [
            {"id": "lr", "type": "double", "min": 0.001, "max": 1, "scale": "log"},
            {"id": "optimizer", "type": "categorical", "values": ["sgd", "adam", "rmsprop"]},
        ],
        "max_trials": max_trials,
        "parallel_trials": parallel,
        "seed": 11,
        // Generous: the GP test's suggestions must come from fits, never from the fallback.
        "suggestion_time_budget_secs": 60,
    })
}

fn momentum(parent_values: Value) -> Value {
    json!({
        "parameter": {"id": "momentum", "type": "double", "min": 0, "max": 1},
        "parent": {"id": "optimizer", "values": parent_values},
    })
}

async fn grow(app: &TestApp, study: i64, body: Value) -> Value {
    let r = app.post(&routes::parameters(study), body).await;
    assert_eq!(r.status, StatusCode::OK, "grow: {}", r.body);
    r.body
}

async fn finish(app: &TestApp, study: i64, trial: &Value, loss: f64) {
    let path = routes::trial_complete(study, &trial["id"]);
    let r = app.post(&path, json!({"metrics": {"loss": loss}})).await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.body);
}

/// Suggest and complete `n` trials one at a time, each with `loss(parameters)`; the trials.
async fn run(app: &TestApp, study: i64, n: usize, loss: impl Fn(&Value) -> f64) -> Vec<Value> {
    let mut done = Vec::new();
    for _ in 0..n {
        let answer = suggest(app, study, 1, None).await;
        let trial = answer["trials"][0].clone();
        assert!(trial.is_object(), "no trial: {answer}");
        finish(app, study, &trial, loss(&trial["parameters"])).await;
        done.push(trial);
    }
    done
}

async fn all_trials(app: &TestApp, study: i64) -> Vec<Value> {
    let r = app.get(&routes::all_trials(study)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["trials"].as_array().cloned().unwrap_or_default()
}

fn optimizer(t: &Value) -> &str {
    t["parameters"]["optimizer"].as_str().unwrap_or("")
}

/// `momentum` added under `sgd` is in exactly the sgd trials suggested after; widened to
/// `rmsprop`, in exactly the sgd and rmsprop ones. The spec says where it is.
async fn a_child_is_suggested_only_where_its_parent_activates_it(backend: &str) {
    let app = app(backend).await;
    let study = app.create_study(optimizer_spec("random", 200, 1)).await;
    run(&app, study, 5, |_| 1.0).await;

    let grown = grow(&app, study, momentum(json!(["sgd"]))).await;
    assert_eq!(
        grown["spec"]["parameters"][1]["children"],
        json!([{"when": ["sgd"], "parameters": [{"id": "momentum", "type": "double", "min": 0, "max": 1}]}]),
    );
    let after = run(&app, study, 30, |_| 1.0).await;
    let with = |t: &Value| t["parameters"].get("momentum").is_some();
    assert!(
        after.iter().any(|t| optimizer(t) == "sgd"),
        "no sgd trial in 30"
    );
    for t in &after {
        assert_eq!(with(t), optimizer(t) == "sgd", "{t}");
    }

    let widened = grow(&app, study, momentum(json!(["rmsprop"]))).await;
    assert_eq!(
        widened["spec"]["parameters"][1]["children"][0]["when"],
        json!(["sgd", "rmsprop"])
    );
    let later = run(&app, study, 30, |_| 1.0).await;
    assert!(later.iter().any(|t| optimizer(t) == "rmsprop"));
    assert!(later.iter().any(|t| optimizer(t) == "adam"));
    for t in &later {
        assert_eq!(with(t), optimizer(t) != "adam", "{t}");
    }
    // Asking again for what is there changes nothing (not even the study's change time).
    let now = app.get(&routes::study(study)).await.body;
    let again = grow(&app, study, momentum(json!(["sgd", "rmsprop"]))).await;
    assert_eq!(again["spec"], widened["spec"]);
    assert_eq!(again["updated_at"], now["updated_at"]);
}

/// A trial handed out before the space grew takes the new parameter's value, keeps it
/// through completion, and the five from before the change load as they were.
async fn a_running_trial_takes_the_new_parameter_and_old_trials_still_load(backend: &str) {
    let app = app(backend).await;
    let study = app.create_study(optimizer_spec("random", 50, 2)).await;
    let before = run(&app, study, 5, |_| 2.0).await;
    // A running trial: two held, one of each kind of branch wanted below.
    let running = suggest(&app, study, 2, Some("w")).await["trials"]
        .as_array()
        .cloned()
        .expect("trials");
    let top = json!({"parameter": {"id": "dropout", "type": "double", "min": 0, "max": 0.5},
                     "trials": running.iter().map(|t| json!({"id": t["id"], "value": 0.25})).collect::<Vec<_>>()});
    grow(&app, study, top).await;
    for t in &running {
        let got = app.get(&routes::trial(study, &t["id"])).await.body;
        assert_eq!(got["parameters"]["dropout"], 0.25, "{got}");
        assert_eq!(got["state"], "active");
    }
    // The same value again is fine; another one is not (409 naming it).
    let same = json!({"parameter": {"id": "dropout", "type": "double", "min": 0, "max": 0.5},
                      "trials": [{"id": running[0]["id"], "value": 0.25}]});
    grow(&app, study, same).await;
    let other = json!({"parameter": {"id": "dropout", "type": "double", "min": 0, "max": 0.5},
                       "trials": [{"id": running[0]["id"], "value": 0.5}]});
    let r = app.post(&routes::parameters(study), other).await;
    assert_eq!(
        (r.status, r.body["error"]["field"].clone()),
        (StatusCode::CONFLICT, json!("trials[0].value")),
        "{}",
        r.body
    );
    for t in &running {
        finish(&app, study, t, 1.0).await;
    }

    let trials = all_trials(&app, study).await;
    assert_eq!(trials.len(), 7, "no trial lost");
    for (stored, old) in trials.iter().zip(&before) {
        assert_eq!(
            stored["parameters"], old["parameters"],
            "old trials as they were"
        );
        assert_eq!(stored["state"], "completed");
        assert!(stored["parameters"].get("dropout").is_none());
    }
    for t in &trials[5..] {
        assert_eq!(t["parameters"]["dropout"], 0.25);
        assert_eq!(t["state"], "completed");
    }
    // New trials have it, and old ones can still be added as prior results only with it.
    let next = suggest(&app, study, 1, None).await;
    assert!(
        next["trials"][0]["parameters"]["dropout"].is_number(),
        "{next}"
    );
    let lacking = app
        .post(
            &routes::trials(study),
            json!({"parameters": {"lr": 0.1, "optimizer": "adam"}, "final_measurement": {"metrics": {"loss": 1}}}),
        )
        .await;
    assert_eq!(lacking.status, StatusCode::BAD_REQUEST, "{}", lacking.body);
    assert_eq!(lacking.body["error"]["field"], "parameters.dropout");
}

/// The GP fits trials without the new parameters (five before the space grew) together
/// with trials that have them, and finds the new parameters' optimum: the best trial after
/// the change is on the sgd branch with momentum and dropout near their best values.
async fn the_gp_learns_from_trials_before_and_after_the_space_grew(backend: &str) {
    let app = app(backend).await;
    let study = app.create_study(optimizer_spec("gp_bandit", 60, 1)).await;
    // Best at lr 0.01, sgd with momentum 0.9, dropout 0.1; adam and rmsprop a constant worse.
    let loss = |p: &Value| {
        let lr = (p["lr"].as_f64().unwrap_or(1.0).log10() + 2.0).powi(2);
        let dropout = (p["dropout"].as_f64().unwrap_or(0.4) - 0.1).powi(2);
        let branch = match p["optimizer"].as_str() {
            Some("sgd") => (p["momentum"].as_f64().unwrap_or(0.0) - 0.9).powi(2),
            _ => 0.5,
        };
        lr + dropout + branch
    };
    run(&app, study, 8, loss).await;
    grow(&app, study, momentum(json!(["sgd"]))).await;
    grow(
        &app,
        study,
        json!({"parameter": {"id": "dropout", "type": "double", "min": 0, "max": 0.5}}),
    )
    .await;
    let after = run(&app, study, 30, loss).await;
    for t in &after {
        let p = &t["parameters"];
        assert!(p["dropout"].is_number(), "{t}");
        assert_eq!(p.get("momentum").is_some(), optimizer(t) == "sgd", "{t}");
    }
    let best = after
        .iter()
        .min_by(|a, b| loss(&a["parameters"]).total_cmp(&loss(&b["parameters"])))
        .expect("trials");
    let p = &best["parameters"];
    let best_loss = loss(p);
    assert!(
        best_loss < 0.05,
        "best after the change: {best} (loss {best_loss})"
    );
    assert_eq!(p["optimizer"], "sgd");
    // Every trial loads, the 8 old ones without the new parameters.
    let trials = all_trials(&app, study).await;
    assert_eq!(trials.len(), 38);
    assert!(
        trials[..8]
            .iter()
            .all(|t| t["parameters"].get("dropout").is_none())
    );
}

/// Widenings under other parent values sent at once all land (the union), and new
/// children sent at once are all kept: each is applied in the study's locked batch.
async fn concurrent_additions_under_other_parent_values_all_land(backend: &str) {
    let app = app(backend).await;
    let study = app.create_study(optimizer_spec("random", 10, 1)).await;
    let path = routes::parameters(study);
    let sends = ["sgd", "adam", "rmsprop"]
        .into_iter()
        .map(|v| app.post(&path, momentum(json!([v]))))
        .chain((0..4).map(|i| {
            app.post(
                &path,
                json!({"parameter": {"id": format!("extra{i}"), "type": "integer", "min": 0, "max": 9}}),
            )
        }));
    for r in futures::future::join_all(sends).await {
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let spec = app.get(&routes::study(study)).await.body["spec"].clone();
    let mut when: Vec<String> = spec["parameters"][1]["children"][0]["when"]
        .as_array()
        .expect("when")
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect();
    when.sort();
    assert_eq!(when, ["adam", "rmsprop", "sgd"]);
    assert_eq!(
        spec["parameters"][1]["children"].as_array().map(Vec::len),
        Some(1)
    );
    let mut ids: Vec<&str> = spec["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["extra0", "extra1", "extra2", "extra3", "lr", "optimizer"]
    );
}

/// Every bad request is refused with a 4xx whose body names the field, and changes nothing.
async fn bad_additions_get_a_4xx_naming_the_field(backend: &str) {
    let app = app(backend).await;
    let study = app.create_study(optimizer_spec("random", 10, 2)).await;
    grow(&app, study, momentum(json!(["sgd"]))).await;
    let held = suggest(&app, study, 2, Some("w")).await["trials"].clone();
    let (t1, t2) = (held[0]["id"].clone(), held[1]["id"].clone());
    finish(&app, study, &held[1], 1.0).await;
    let adam_trial = held[0]["parameters"]["optimizer"] != "sgd";
    let spec_before = app.get(&routes::study(study)).await.body["spec"].clone();
    let x = json!({"id": "x", "type": "double", "min": 0, "max": 1});
    let mut cases = vec![
        (json!({}), StatusCode::BAD_REQUEST, "body"), // "missing field `parameter`"
        (
            json!({"parameter": x, "color": 1}),
            StatusCode::BAD_REQUEST,
            "color",
        ),
        (
            json!({"parameter": {"id": "x", "type": "double", "min": 2, "max": 1}}),
            StatusCode::BAD_REQUEST,
            "parameter.min",
        ),
        (
            json!({"parameter": {"id": "x", "type": "sometimes"}}),
            StatusCode::BAD_REQUEST,
            "parameter.type",
        ),
        (
            json!({"parameter": x, "parent": {"id": "nope", "values": ["a"]}}),
            StatusCode::BAD_REQUEST,
            "parent.id",
        ),
        (
            json!({"parameter": x, "parent": {"id": "lr", "values": [0.1]}}),
            StatusCode::BAD_REQUEST,
            "parent.id",
        ),
        (
            json!({"parameter": x, "parent": {"id": "optimizer", "values": ["lamb"]}}),
            StatusCode::BAD_REQUEST,
            "parent.values[0]",
        ),
        (
            json!({"parameter": x, "parent": {"id": "optimizer"}}),
            StatusCode::BAD_REQUEST,
            "parent",
        ),
        (
            json!({"parameter": x, "trials": [{"id": 99, "value": 0.5}]}),
            StatusCode::BAD_REQUEST,
            "trials[0].id",
        ),
        (
            json!({"parameter": x, "trials": [{"id": t1, "value": 7}]}),
            StatusCode::BAD_REQUEST,
            "trials[0].value",
        ),
        (
            json!({"parameter": x, "trials": [{"id": t2, "value": 0.5}]}),
            StatusCode::CONFLICT,
            "trials[0].id",
        ),
        (
            json!({"parameter": {"id": "lr", "type": "double", "min": 0.001, "max": 2, "scale": "log"}}),
            StatusCode::CONFLICT,
            "parameter.max",
        ),
        (
            json!({"parameter": {"id": "momentum", "type": "double", "min": 0, "max": 1}}),
            StatusCode::CONFLICT,
            "parent.id",
        ),
        (
            json!({"parameter": {"id": "lr", "type": "double", "min": 0.001, "max": 1, "scale": "log"},
                "parent": {"id": "optimizer", "values": ["sgd"]}}),
            StatusCode::CONFLICT,
            "parent",
        ),
    ];
    if adam_trial {
        // momentum is not active in a trial off the sgd branch: no value to give.
        let mut body = momentum(json!(["sgd"]));
        body["trials"] = json!([{"id": t1, "value": 0.5}]);
        cases.push((body, StatusCode::BAD_REQUEST, "trials[0].id"));
    }
    let path = routes::parameters(study);
    for (body, status, field) in cases {
        let r = app.post(&path, body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        let named = r.body["error"]["field"].as_str().unwrap_or_default();
        assert!(
            named.starts_with(field),
            "{body}: field {named:?}, not {field:?}"
        );
    }
    let r = app
        .call(Method::POST, &path, Some(json!({"parameter": x, "trials": [{"id": t1, "value": 0.5}, {"id": t2, "value": 0.5}]})))
        .await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "a finished second trial refuses it all"
    );
    assert_eq!(
        app.get(&routes::study(study)).await.body["spec"],
        spec_before,
        "nothing changed"
    );
    let r = app
        .post("/v1/studies/999/parameters", json!({"parameter": x}))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);

    // A grid's points are numbered over its space; a stopped study no longer changes.
    let mut grid = optimizer_spec("grid", 10, 1);
    grid["parameters"][0] = json!({"id": "lr", "type": "discrete", "values": [0.01, 0.1]});
    let grid = app.create_study(grid).await;
    let r = app
        .post(&routes::parameters(grid), json!({"parameter": x}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("grid")
    );
    let r = app.post(&routes::stop(study), json!({})).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = app.post(&path, json!({"parameter": x})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
}

/// As for any change of a study: its creator or an admin; another writer gets 403.
async fn only_the_creator_or_an_admin_grows_a_space(backend: &str) {
    const ADMIN: &str = "grow-admin-token-0123456789";
    let app = crate::support::team_app(backend, ADMIN).await;
    let alice = token(&app, "alice", "writer").await;
    let bob = token(&app, "bob", "writer").await;
    let r = call_as(
        &app,
        &alice,
        Method::POST,
        "/v1/studies",
        Some(optimizer_spec("random", 5, 1)),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let study = r.body["id"].as_i64().expect("id");
    let path = routes::parameters(study);
    let body =
        |id: &str| Some(json!({"parameter": {"id": id, "type": "double", "min": 0, "max": 1}}));
    let r = call_as(&app, &bob, Method::POST, &path, body("b")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    for (who, id) in [(&alice, "a"), (&ADMIN.to_string(), "c")] {
        let r = call_as(&app, who, Method::POST, &path, body(id)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let spec = call_as(&app, &alice, Method::GET, &routes::study(study), None)
        .await
        .body["spec"]
        .clone();
    let ids: Vec<&str> = spec["parameters"]
        .as_array()
        .expect("ps")
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert_eq!(ids, ["lr", "optimizer", "a", "c"]);
}
