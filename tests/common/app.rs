//! The server in this process on an ephemeral loopback port (`spawn_app` and its
//! variants), and `TestApp`'s shortcuts: JSON calls with its token, creating studies,
//! waiting for a study's state.

use std::net::SocketAddr;
use std::time::Duration;

use augur::{App, ServerConfig};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{Response, call, http};
use super::db::TestDb;
use super::routes;
use super::wait::eventually;

/// The server, in this process, on an ephemeral loopback port.
pub struct TestApp {
    pub addr: SocketAddr,
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
    pub db: TestDb,
}

pub async fn spawn_app(db: TestDb) -> TestApp {
    spawn_app_with(db, None).await
}

pub async fn spawn_app_with(db: TestDb, token: Option<&str>) -> TestApp {
    spawn_app_configured(db, |config| config.token = token.map(str::to_string)).await
}

/// The server in this process with its configuration changed by `configure`.
pub async fn spawn_app_configured(
    db: TestDb,
    configure: impl FnOnce(&mut ServerConfig),
) -> TestApp {
    let mut config = ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    configure(&mut config);
    let token = config.token.clone();
    let app = App::build(config).await.expect("server starts");
    let addr = app.addr();
    tokio::spawn(app.run());
    TestApp {
        addr,
        base: format!("http://{addr}"),
        http: http(),
        token,
        db,
    }
}

impl TestApp {
    /// The full URL of `path` on this server, for requests made without `call`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        call(
            &self.http,
            &self.base,
            self.token.as_deref(),
            method,
            path,
            body,
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Response {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Response {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Response {
        self.call(Method::PATCH, path, Some(body)).await
    }

    /// Create a study and return its id; panics unless 201.
    pub async fn create_study(&self, spec: Value) -> i64 {
        let r = self.post("/v1/studies", spec).await;
        assert_eq!(r.status, StatusCode::CREATED, "create study: {}", r.body);
        r.body["id"].as_i64().expect("study id")
    }

    /// Create a study and suggest one trial of it: (study id, trial id).
    pub async fn study_with_active_trial(&self, spec: Value) -> (i64, i64) {
        let study = self.create_study(spec).await;
        let suggested = self
            .post(&routes::suggest(study), json!({"count": 1}))
            .await;
        assert_eq!(suggested.status, StatusCode::OK, "{:?}", suggested.body);
        let trial = suggested.body["trials"][0]["id"]
            .as_i64()
            .expect("trial id");
        (study, trial)
    }

    /// Wait until the study is in `want`; returns the study.
    pub async fn wait_for_state(&self, id: i64, want: &str, limit: Duration) -> Value {
        eventually(&format!("study {id} {want}"), limit, || async move {
            let s = self.get(&routes::study(id)).await.body;
            if s["state"] == want {
                Ok(s)
            } else {
                Err(s.to_string())
            }
        })
        .await
    }

    /// Wait until `n` trials of the study have failed as cancelled by its stop.
    pub async fn wait_for_cancelled_trials(&self, id: i64, n: usize, limit: Duration) {
        let failed = eventually("trials cancelled by the stop", limit, || async move {
            let failed = self.get(&routes::trials_in_state(id, "failed")).await.body;
            let count = failed["trials"].as_array().map_or(0, Vec::len);
            if count == n {
                Ok(failed)
            } else {
                Err(failed.to_string())
            }
        })
        .await;
        for t in failed["trials"].as_array().into_iter().flatten() {
            assert_eq!(t["fail_reason"], "cancelled: the study was stopped", "{t}");
        }
    }
}
