//! Helpers of the API tests: a server per test on a fresh database, and the calls most
//! tests make.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Response, TestApp, call, db, routes, spawn_app, spawn_app_with};

pub async fn app(backend: &str) -> TestApp {
    spawn_app(db(backend).await).await
}

pub async fn suggest(app: &TestApp, study: i64, count: i64, client: Option<&str>) -> Value {
    let mut body = json!({"count": count});
    if let Some(c) = client {
        body["client_id"] = json!(c);
    }
    let r = app.post(&routes::suggest(study), body).await;
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
            &routes::trial_complete(study, trial),
            json!({"metrics": {"accuracy": accuracy}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.body);
    r.body
}

/// `augur worker` on `study` of the server at `base` as `client_id`, running `script` in
/// `slots` slots, without a token (set `AUGUR_TOKEN` on the command for one); stdout
/// discarded, stderr left to the caller.
pub fn worker_command(
    base: &str,
    study: i64,
    slots: usize,
    client_id: &str,
    output_dir: &std::path::Path,
    script: &std::path::Path,
) -> std::process::Command {
    let mut command = std::process::Command::new(crate::common::augur_bin());
    command
        .args(["worker", "--url", base, "--study", &study.to_string()])
        .args(["--slots", &slots.to_string(), "--client-id", client_id])
        .arg("--output-dir")
        .arg(output_dir)
        .args(["--", "/bin/sh"])
        .arg(script)
        .env_remove("AUGUR_TOKEN")
        .stdout(std::process::Stdio::null());
    command
}

/// Wait for a worker started with piped stderr to end; assert it succeeded and return its log.
pub async fn worker_log(worker: std::process::Child) -> String {
    let out = tokio::task::spawn_blocking(move || worker.wait_with_output())
        .await
        .expect("join")
        .expect("worker");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "worker: {:?}\n{log}", out.status);
    log
}

/// A server with the admin token `admin` configured, for tests of who may do what.
pub async fn team_app(backend: &str, admin: &str) -> TestApp {
    spawn_app_with(db(backend).await, Some(admin)).await
}

/// A new token of `role` named `name`, made through the API by the app's admin; its secret.
pub async fn token(app: &TestApp, name: &str, role: &str) -> String {
    let r = app
        .post("/v1/tokens", json!({"name": name, "role": role}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["token"].as_str().expect("token").to_string()
}

/// `method path` with `token`'s bearer.
pub async fn call_as(
    app: &TestApp,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Response {
    call(&app.http, &app.base, Some(token), method, path, body).await
}

/// A study `owner` created (at most 3 failed trials) and one trial of it that `owner`
/// pulled as `client`: (study, trial).
pub async fn owned_study_with_trial(app: &TestApp, owner: &str, client: &str) -> (i64, i64) {
    let mut spec = crate::common::spec("random", 20, 5);
    spec["max_failed_trials"] = json!(3);
    let r = call_as(app, owner, Method::POST, "/v1/studies", Some(spec)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let study = r.body["id"].as_i64().expect("id");
    let s = call_as(
        app,
        owner,
        Method::POST,
        &routes::suggest(study),
        Some(json!({"count": 1, "client_id": client})),
    )
    .await;
    assert_eq!(s.status, StatusCode::OK, "{}", s.body);
    (study, s.body["trials"][0]["id"].as_i64().expect("trial"))
}
