//! Concurrent suggestions never repeat a point (issue 27): workers that ask a `gp_bandit`
//! study at the same moment each get a trial the others' are pending beside, in one server
//! on either backend and across two servers sharing one PostgreSQL.

use std::collections::BTreeMap;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{self, routes};

/// Workers asking at once, in each round.
const WORKERS: usize = 4;
/// Rounds: the initial design and then the GP's own suggestions.
const ROUNDS: usize = 7;

on_both_backends!(concurrent_single_suggestions_never_share_their_parameters);

/// A GP study of two doubles with room for every round's workers at once.
fn study() -> Value {
    json!({
        "name": "repeats",
        "algorithm": "gp_bandit",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [
            {"id": "x", "type": "double", "min": 0, "max": 1},
            {"id": "y", "type": "double", "min": 0, "max": 1}
        ],
        "max_trials": WORKERS * ROUNDS,
        "parallel_trials": WORKERS,
        "seed": 11
    })
}

async fn call(base: &str, method: Method, path: &str, body: Option<Value>) -> common::Response {
    common::call(&common::http(), base, None, method, path, body).await
}

/// Run the rounds: in each, `WORKERS` clients (worker `w` on server `w % bases.len()`) ask
/// for one trial at the same moment, then all of them report. Returns every trial.
async fn run_rounds(bases: &[String], study_id: i64) -> Vec<Value> {
    let suggest_path = routes::suggest(study_id);
    for round in 0..ROUNDS {
        let asks = (0..WORKERS).map(|w| {
            let base = bases[w % bases.len()].clone();
            let path = suggest_path.clone();
            async move {
                let body = json!({"count": 1, "client_id": format!("w{w}-r{round}")});
                call(&base, Method::POST, &path, Some(body)).await
            }
        });
        let answers = futures::future::join_all(asks).await;
        for answer in answers {
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            for trial in answer.body["trials"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let id = trial["id"].as_i64().expect("id");
                let (x, y) = (
                    trial["parameters"]["x"].as_f64().expect("x"),
                    trial["parameters"]["y"].as_f64().expect("y"),
                );
                let loss = (x - 0.3).powi(2) + (y - 0.6).powi(2);
                let done = call(
                    &bases[0],
                    Method::POST,
                    &routes::trial_complete(study_id, id),
                    Some(json!({"metrics": {"loss": loss}})),
                )
                .await;
                assert_eq!(done.status, StatusCode::OK, "{}", done.body);
            }
        }
    }
    let listed = call(&bases[0], Method::GET, &routes::all_trials(study_id), None).await;
    listed.body["trials"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Every pair of trials that share their parameters, by the parameters' JSON.
fn repeats(trials: &[Value]) -> Vec<(String, Vec<i64>)> {
    let mut by_point: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for t in trials {
        by_point
            .entry(t["parameters"].to_string())
            .or_default()
            .push(t["id"].as_i64().expect("id"));
    }
    by_point
        .into_iter()
        .filter(|(_, ids)| ids.len() > 1)
        .collect()
}

async fn concurrent_single_suggestions_never_share_their_parameters(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let id = app.create_study(study()).await;
    let trials = run_rounds(std::slice::from_ref(&app.base), id).await;
    assert_eq!(trials.len(), WORKERS * ROUNDS, "every worker got a trial");
    let repeated = repeats(&trials);
    assert!(
        repeated.is_empty(),
        "trials share their parameters: {repeated:?}"
    );
}

/// Two servers on one PostgreSQL (not routed: each designs for itself) and workers split
/// between them: a point designed before the other server's trial was handed out is
/// designed again, so no two trials share their parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_hand_out_the_same_point() {
    let first = common::spawn_app(common::postgres_db().await).await;
    let mut config =
        augur::ServerConfig::new(first.db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.dispatch = false;
    let second = augur::App::build(config).await.expect("second replica");
    let second_base = format!("http://{}", second.addr());
    tokio::spawn(second.run());
    let id = first.create_study(study()).await;
    let trials = run_rounds(&[first.base.clone(), second_base], id).await;
    assert_eq!(trials.len(), WORKERS * ROUNDS, "every worker got a trial");
    let repeated = repeats(&trials);
    assert!(
        repeated.is_empty(),
        "trials share their parameters: {repeated:?}"
    );
}
