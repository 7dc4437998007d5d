//! Helpers of the API tests: a server per test on a fresh database, and the calls most
//! tests make.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestApp, db, spawn_app};

pub async fn app(backend: &str) -> TestApp {
    spawn_app(db(backend).await).await
}

pub async fn suggest(app: &TestApp, study: i64, count: i64, client: Option<&str>) -> Value {
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

pub fn ids(trials: &Value) -> Vec<i64> {
    trials
        .as_array()
        .expect("array")
        .iter()
        .map(|t| t["id"].as_i64().expect("id"))
        .collect()
}

pub async fn complete(app: &TestApp, study: i64, trial: i64, accuracy: f64) -> Value {
    let r = app
        .post(
            &format!("/v1/studies/{study}/trials/{trial}/complete"),
            json!({"metrics": {"accuracy": accuracy}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.body);
    r.body
}
