//! Bearer-token auth against a real server and database.

use crate::common::{self, routes};

use std::time::Duration;

use augur::model::{StudyId, TrialId, TrialKey};
use augur::{App, ServerConfig};
use reqwest::{Method, StatusCode};
use serde_json::json;

/// Paths and methods no route declares (404 and 405 to come) ask what any route would: a
/// token, and a writer's for a change. A reader's PUT is refused, not told "405".
#[tokio::test]
async fn undeclared_paths_and_methods_need_a_token_and_a_writer_to_change() {
    let app = common::spawn_app_with(common::sqlite_db(), Some("admin-token-undeclared")).await;
    let reader = crate::support::token(&app, "r", "reader").await;
    let writer = crate::support::token(&app, "w", "writer").await;
    let call = |token: Option<&str>, method: Method, path: &str| {
        let (app, token, path) = (&app, token.map(str::to_string), path.to_string());
        async move {
            common::call(&app.http, &app.base, token.as_deref(), method, &path, None)
                .await
                .status
        }
    };
    assert_eq!(
        call(None, Method::GET, "/v1/nothing").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(Some(&reader), Method::GET, "/v1/nothing").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(Some(&reader), Method::PUT, "/v1/studies").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(Some(&reader), Method::PUT, "/").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(Some(&writer), Method::PUT, "/v1/studies").await,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

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
    assert_eq!(rows[0].0, augur::service::hash_token("plain-text-token"));
}

#[tokio::test]
async fn a_trial_token_reports_only_to_its_own_trial() {
    let app = common::spawn_app_with(common::sqlite_db(), Some("admin")).await;
    let study = app.create_study(common::spec("random", 5, 2)).await;
    app.post(&routes::suggest(study), json!({"count": 2})).await;
    let store = augur::store::connect(&app.db.url).await.expect("store");
    store
        .insert_token(
            "trial-1",
            &augur::service::hash_token("trial-one"),
            Some(TrialKey::new(StudyId::new(study), TrialId::new(1))),
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
        routes::trial_measurements(study, 1),
        Some(json!({"step": 1, "metrics": {"accuracy": 0.2}})),
    )
    .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    for method in [Method::GET, Method::POST] {
        let r = as_trial(method.clone(), routes::trial_should_stop(study, 1), None).await;
        assert_eq!(r.status, StatusCode::OK, "{method} should_stop: {}", r.body);
    }
    // Its own trial's user attributes are its to set (`annotations.rs`), not its exclusion.
    for (method, path, body) in [
        (Method::POST, routes::trial_complete(study, 2), json!({})),
        (Method::POST, routes::suggest(study), json!({})),
        (Method::GET, "/v1/studies".to_string(), json!({})),
        (
            Method::PATCH,
            routes::trial(study, 1),
            json!({"excluded": true}),
        ),
        (
            Method::PATCH,
            routes::trial(study, 2),
            json!({"user_attrs": {"x": 1}}),
        ),
        (Method::DELETE, routes::study(study), json!({})),
    ] {
        let r = as_trial(method.clone(), path.clone(), Some(body)).await;
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "{method} {path}: {}",
            r.body
        );
    }
    let done = as_trial(
        Method::POST,
        routes::trial_complete(study, 1),
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

/// A request with a chosen `Host` and extra headers, to play what a browser would send.
async fn raw(
    app: &common::TestApp,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> common::Response {
    let mut request = app.http.request(method, format!("{}{path}", app.base));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(b) = body {
        request = request.body(b.to_string());
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let text = response.text().await.expect("body read");
    common::Response {
        status,
        body: serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    }
}

async fn study_count(app: &common::TestApp) -> usize {
    app.get("/v1/studies").await.body["studies"]
        .as_array()
        .map_or(0, Vec::len)
}

/// The probe's drive-by: `fetch(url, {mode: 'no-cors', method: 'POST', body: new Blob([json])})`
/// sends the JSON with no Content-Type (and a `text/plain` form sends it as text): neither
/// may be read as JSON, so no page can create a study.
#[tokio::test]
async fn a_json_body_without_a_json_content_type_is_refused_with_415() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = common::spec("random", 3, 1).to_string();
    for headers in [vec![], vec![("content-type", "text/plain;charset=UTF-8")]] {
        let r = raw(&app, Method::POST, "/v1/studies", &headers, Some(&spec)).await;
        assert_eq!(
            r.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{headers:?}: {}",
            r.body
        );
        assert_eq!(r.body["error"]["code"], "unsupported_media_type");
    }
    assert_eq!(study_count(&app).await, 0, "nothing may have been created");
    let json = [("content-type", "application/json")];
    let ok = raw(&app, Method::POST, "/v1/studies", &json, Some(&spec)).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);
    // A body-less command still needs no Content-Type (`curl -X POST …/stop`).
    let stop = raw(&app, Method::POST, &routes::stop(1), &[], None).await;
    assert_eq!(stop.status, StatusCode::OK, "{}", stop.body);
}

/// A page of another origin may not change anything, whatever it sends; the server's own
/// origin (the dashboard) may.
#[tokio::test]
async fn a_foreign_origin_cannot_change_anything() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let study = app.create_study(common::spec("random", 3, 1)).await;
    let spec = common::spec("random", 3, 1).to_string();
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let headers = [("content-type", "application/json"), ("origin", origin)];
        for (method, path, body) in [
            (Method::POST, "/v1/studies".to_string(), Some(spec.as_str())),
            (Method::POST, routes::stop(study), None),
            (Method::POST, routes::suggest(study), Some("{}")),
            (
                Method::PATCH,
                routes::study(study),
                Some(r#"{"max_trials": 9}"#),
            ),
            (Method::DELETE, routes::study(study), None),
        ] {
            let r = raw(&app, method.clone(), &path, &headers, body).await;
            assert_eq!(
                r.status,
                StatusCode::FORBIDDEN,
                "{origin} {method} {path}: {}",
                r.body
            );
            assert_eq!(r.body["error"]["code"], "permission_denied");
        }
    }
    let after = app.get(&routes::study(study)).await.body;
    assert_eq!(after["state"], "active", "{after}");
    assert_eq!(after["spec"]["max_trials"], 3);
    assert_eq!(
        after["trial_counts"]["total"].as_i64().unwrap_or(0),
        0,
        "{after}"
    );
    assert_eq!(study_count(&app).await, 1);
    // Reads are answered, with no CORS header that would let the page read them.
    let read = app
        .http
        .get(app.url("/v1/studies"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .expect("read");
    assert_eq!(read.status(), StatusCode::OK);
    assert!(read.headers().get("access-control-allow-origin").is_none());
    let own = format!("http://{}", app.addr);
    let headers = [
        ("content-type", "application/json"),
        ("origin", own.as_str()),
    ];
    let r = raw(&app, Method::POST, "/v1/studies", &headers, Some(&spec)).await;
    assert_eq!(r.status, StatusCode::CREATED, "same origin: {}", r.body);
}

/// DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 reaches the
/// server with `Host: evil.example`. An open server serves loopback names only; a server
/// with tokens serves any name (the attacker has no token).
#[tokio::test]
async fn an_open_server_answers_only_loopback_host_names() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let port = app.addr.port();
    for host in [
        "evil.example",
        "evil.example:80",
        "127.0.0.1.evil.example",
        "10.0.0.1",
    ] {
        for path in ["/v1/studies", "/", "/metrics"] {
            let r = raw(&app, Method::GET, path, &[("host", host)], None).await;
            assert_eq!(
                r.status,
                StatusCode::FORBIDDEN,
                "Host {host} {path}: {}",
                r.body
            );
        }
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_string(),
        format!("augur.localhost:{port}"),
    ] {
        let r = raw(&app, Method::GET, "/v1/studies", &[("host", &host)], None).await;
        assert_eq!(r.status, StatusCode::OK, "Host {host}: {}", r.body);
    }
    let health = raw(
        &app,
        Method::GET,
        "/healthz",
        &[("host", "evil.example")],
        None,
    )
    .await;
    assert_eq!(health.status, StatusCode::OK, "probes need no name");

    let guarded = common::spawn_app_with(common::sqlite_db(), Some("team-token")).await;
    let r = guarded
        .http
        .get(guarded.url("/v1/studies"))
        .header("host", "augur.team.example")
        .bearer_auth("team-token")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), StatusCode::OK);
}

/// Two replicas starting at once on a fresh database, both configured with the same admin
/// token (a Deployment's pods), both start: registering the token is no race. (CI caught
/// one: PostgreSQL refused the slower upsert on the token hash's unique key, which the
/// upsert's arbiter, the name, does not cover; ~1 round in 50 under load, hence 30 rounds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_both_register_the_configured_token() {
    for round in 0..30 {
        let db = common::postgres_db().await;
        let start = || {
            let mut config =
                ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
            config.token = Some("team-admin".into());
            config.dispatch = false;
            App::build(config)
        };
        let (a, b) = tokio::join!(start(), start());
        assert!(
            a.is_ok() && b.is_ok(),
            "round {round}: {:?} / {:?}",
            a.err(),
            b.err()
        );
    }
}

/// The race above, made certain: another transaction holds a row with the configured
/// token's hash, uncommitted (as the other replica's upsert does, here under another name so
/// that the order is the test's). This replica's upsert waits on the hash's unique key, and
/// once that row commits PostgreSQL refuses it on that key, not on the upsert's arbiter;
/// the replica finds the token stored and starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_token_upsert_is_refused_on_the_hash_still_starts() {
    use sqlx::Connection;
    let db = common::postgres_db().await;
    augur::store::connect(&db.url).await.expect("migrated");
    let mut other = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query("BEGIN")
        .execute(&mut other)
        .await
        .expect("begin");
    sqlx::query(
        "INSERT INTO api_tokens (name, token_hash, created_at) VALUES ('other', $1, now())",
    )
    .bind(augur::service::hash_token("team-admin"))
    .execute(&mut other)
    .await
    .expect("insert");
    let mut config = ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.token = Some("team-admin".into());
    config.dispatch = false;
    let starting = tokio::spawn(App::build(config));
    let url = db.url.clone();
    common::eventually(
        "the upsert waits on the hash",
        Duration::from_secs(10),
        || {
            let url = url.clone();
            async move {
                let mut c = sqlx::PgConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&mut c)
                .await
                .map_err(|e| e.to_string())?;
                if waiting > 0 {
                    Ok(())
                } else {
                    Err("no waiter yet".into())
                }
            }
        },
    )
    .await;
    sqlx::query("COMMIT")
        .execute(&mut other)
        .await
        .expect("commit");
    let started = starting.await.expect("join");
    assert!(started.is_ok(), "{:?}", started.err());
}

/// Issue 10, finding 7: a checked token was trusted for 30 s without asking the database,
/// so a finished trial's token kept reporting. Its trial's end evicts it at once in the
/// process that saw the end.
#[tokio::test]
async fn a_finished_trials_token_stops_working_at_once() {
    let app = common::spawn_app_with(common::sqlite_db(), Some("admin")).await;
    let study = app.create_study(common::spec("random", 5, 2)).await;
    app.post(&routes::suggest(study), json!({"count": 1})).await;
    let store = augur::store::connect(&app.db.url).await.expect("store");
    store
        .insert_token(
            "trial:probe",
            &augur::service::hash_token("trial-one"),
            Some(TrialKey::new(StudyId::new(study), TrialId::new(1))),
            chrono::Utc::now(),
        )
        .await
        .expect("token");
    let trial = routes::trial(study, 1);
    let as_trial = |method: Method, path: String| {
        let app = &app;
        async move { common::call(&app.http, &app.base, Some("trial-one"), method, &path, None).await }
    };
    // Checked once: now in the cache.
    assert_eq!(
        as_trial(Method::GET, trial.clone()).await.status,
        StatusCode::OK
    );
    let done = app
        .post(
            &format!("{trial}/complete"),
            json!({"metrics": {"accuracy": 0.5}}),
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let after = as_trial(Method::POST, format!("{trial}/heartbeat")).await;
    assert_eq!(
        after.status,
        StatusCode::UNAUTHORIZED,
        "the finished trial's token still works: {}",
        after.body
    );
}

/// Revocation through the API takes effect at once on the replica that revoked, and within
/// the documented bound (`augur::service::TOKEN_CACHE_TTL`) on another replica that had the
/// token cached.
async fn a_revoked_token_stops_working_on_every_replica(backend: &str) {
    let db = common::db(backend).await;
    let url = db.url.clone();
    let a = common::spawn_app_with(db, Some("admin")).await;
    let b = {
        let mut config = ServerConfig::new(url, "127.0.0.1:0".parse().expect("addr"));
        config.dispatch = false;
        let app = App::build(config).await.expect("second replica");
        let addr = app.addr();
        tokio::spawn(app.run());
        format!("http://{addr}")
    };
    let created = a
        .post("/v1/tokens", json!({"name": "ci", "role": "reader"}))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let token = created.body["token"].as_str().expect("token").to_string();
    for base in [&a.base, &b] {
        let r = common::call(
            &a.http,
            base,
            Some(&token),
            Method::GET,
            "/v1/studies",
            None,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{base}: {}", r.body);
    }
    let revoked = a.call(Method::DELETE, &routes::token("ci"), None).await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT, "{}", revoked.body);
    let here = common::call(
        &a.http,
        &a.base,
        Some(&token),
        Method::GET,
        "/v1/studies",
        None,
    )
    .await;
    assert_eq!(
        here.status,
        StatusCode::UNAUTHORIZED,
        "on the revoking replica"
    );
    let started = std::time::Instant::now();
    let bound = augur::service::TOKEN_CACHE_TTL + std::time::Duration::from_secs(1);
    common::eventually("revocation on the other replica", bound, || {
        let (http, token, b) = (&a.http, &token, &b);
        async move {
            let r = common::call(http, b, Some(token), Method::GET, "/v1/studies", None).await;
            if r.status == StatusCode::UNAUTHORIZED {
                Ok(())
            } else {
                Err(format!("{} after {:?}", r.status, started.elapsed()))
            }
        }
    })
    .await;
}

on_both_backends!(a_revoked_token_stops_working_on_every_replica);
