//! Bearer-token auth against a real server and database.

mod common;

use augur::{App, ServerConfig};
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn a_configured_token_is_required_and_health_stays_open() {
    let app = common::spawn_app_with(common::sqlite_db(), Some("s3cret-token")).await;
    let anonymous =
        common::call(&app.http, &app.base, None, Method::GET, "/v1/studies", None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.body["error"]["code"], "unauthenticated");
    let wrong = common::call(
        &app.http,
        &app.base,
        Some("nope"),
        Method::GET,
        "/v1/studies",
        None,
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.get("/v1/studies").await.status, StatusCode::OK);
    for open in ["/healthz", "/readyz"] {
        let r = common::call(&app.http, &app.base, None, Method::GET, open, None).await;
        assert_eq!(r.status, StatusCode::OK, "{open}");
    }
    let metrics = common::call(&app.http, &app.base, None, Method::GET, "/metrics", None).await;
    assert_eq!(metrics.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn tokens_are_stored_hashed() {
    let app = common::spawn_app_with(common::sqlite_db(), Some("plain-text-token")).await;
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&app.db.url)
        .await
        .expect("open sqlite");
    let rows: Vec<(String,)> = sqlx::query_as("SELECT token_hash FROM api_tokens")
        .fetch_all(&mut conn)
        .await
        .expect("tokens");
    assert_eq!(rows.len(), 1);
    assert_ne!(rows[0].0, "plain-text-token");
    assert_eq!(rows[0].0, augur::api::auth::hash_token("plain-text-token"));
}

#[tokio::test]
async fn a_trial_token_reports_only_to_its_own_trial() {
    let app = common::spawn_app_with(common::sqlite_db(), Some("admin")).await;
    let study = app.create_study(common::spec("random", 5, 2)).await;
    app.post(&format!("/v1/studies/{study}/suggest"), json!({"count": 2}))
        .await;
    let store = augur::store::connect(&app.db.url).await.expect("store");
    store
        .insert_token(
            "trial-1",
            &augur::api::auth::hash_token("trial-one"),
            Some((study, 1)),
            chrono::Utc::now(),
        )
        .await
        .expect("token");
    let as_trial = |method: Method, path: String, body: Option<serde_json::Value>| {
        let app = &app;
        async move { common::call(&app.http, &app.base, Some("trial-one"), method, &path, body).await }
    };
    let own = as_trial(
        Method::POST,
        format!("/v1/studies/{study}/trials/1/measurements"),
        Some(json!({"step": 1, "metrics": {"accuracy": 0.2}})),
    )
    .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    assert_eq!(
        as_trial(
            Method::GET,
            format!("/v1/studies/{study}/trials/1/should_stop"),
            None
        )
        .await
        .status,
        StatusCode::OK
    );
    for (method, path) in [
        (
            Method::POST,
            format!("/v1/studies/{study}/trials/2/complete"),
        ),
        (Method::POST, format!("/v1/studies/{study}/suggest")),
        (Method::GET, "/v1/studies".to_string()),
        (Method::PATCH, format!("/v1/studies/{study}/trials/1")),
        (Method::DELETE, format!("/v1/studies/{study}")),
    ] {
        let r = as_trial(method.clone(), path.clone(), Some(json!({}))).await;
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "{method} {path}: {}",
            r.body
        );
    }
    let done = as_trial(
        Method::POST,
        format!("/v1/studies/{study}/trials/1/complete"),
        Some(json!({})),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
}

#[tokio::test]
async fn an_open_server_must_bind_loopback() {
    let db = common::sqlite_db();
    let refused = App::build(ServerConfig::new(
        db.url.clone(),
        "0.0.0.0:0".parse().expect("addr"),
    ))
    .await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("without a token"), "{message}");
    let mut with_token = ServerConfig::new(db.url.clone(), "0.0.0.0:0".parse().expect("addr"));
    with_token.token = Some("t".into());
    let app = App::build(with_token)
        .await
        .expect("a token allows any address");
    assert!(!app.open);
}
