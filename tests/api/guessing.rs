//! Guessing tokens, weak server tokens and cross-site posts without `Origin` (issue 26,
//! finding 12), tried as an attacker would against a real server on 127.0.0.1.

use crate::common;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

const TOKEN: &str = "guessing-admin-token";

/// Sends bad bearer tokens until refused with 429; the statuses seen, and the last answer's
/// `Retry-After`.
async fn guess_until_limited(app: &common::TestApp) -> (Vec<u16>, Option<u64>) {
    let mut seen = Vec::new();
    for i in 0..60 {
        let r = app
            .http
            .get(app.url("/v1/studies"))
            .bearer_auth(format!("guess-{i}"))
            .send()
            .await
            .expect("request");
        seen.push(r.status().as_u16());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            let wait = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            return (seen, wait);
        }
    }
    (seen, None)
}

/// One address guessing bearer tokens is answered 429 with Retry-After after a few tries,
/// and is then refused before any token of its is looked at (even a right one: else a
/// guess that hits would still be told so); another route (/healthz) is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bearer_tokens_from_one_address_are_answered_429() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(TOKEN)).await;
    let (seen, wait) = guess_until_limited(&app).await;
    assert_eq!(seen.last(), Some(&429), "never limited: {seen:?}");
    assert!(seen.len() >= 5, "a few mistakes are allowed: {seen:?}");
    assert!(wait.is_some_and(|w| w >= 1), "Retry-After: {wait:?}");
    let right = app.get("/v1/studies").await;
    assert_eq!(
        right.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        right.body
    );
    let health = app.http.get(format!("{}/healthz", app.base)).send().await;
    assert_eq!(health.expect("healthz").status(), StatusCode::OK);
}

/// The login form is no way around it: failed sign-ins are counted and limited the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_from_one_address_are_answered_429() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(TOKEN)).await;
    let client = common::http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let mut seen = Vec::new();
    let mut wait = None;
    for i in 0..60 {
        let r = client
            .post(format!("{}/login", app.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token=guess-{i}&next=/"))
            .send()
            .await
            .expect("login");
        seen.push(r.status().as_u16());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            wait = r.headers().get("retry-after").cloned();
            break;
        }
    }
    assert_eq!(seen.last(), Some(&429), "never limited: {seen:?}");
    assert!(seen[..seen.len() - 1].iter().all(|s| *s == 401), "{seen:?}");
    assert!(wait.is_some(), "no Retry-After");
    // Bearer guesses from the same address are now refused too.
    let (after, _) = guess_until_limited(&app).await;
    assert_eq!(after, vec![429], "{after:?}");
}

/// A browser that sends no `Origin` but says the request comes from another site
/// (`Sec-Fetch-Site: cross-site`, or `same-site`: a sibling subdomain or port) is refused
/// like a foreign `Origin`; the server's own pages (`same-origin`) and users (`none`) pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_from_another_site_without_origin_is_refused() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let create_from = |site: &'static str| {
        let app = &app;
        async move {
            app.http
                .post(app.url("/v1/studies"))
                .header("sec-fetch-site", site)
                .json(&common::spec("random", 2, 1))
                .send()
                .await
                .expect("post")
                .status()
        }
    };
    for site in ["cross-site", "same-site"] {
        assert_eq!(create_from(site).await, StatusCode::FORBIDDEN, "{site}");
    }
    let listed = app.get("/v1/studies").await.body;
    assert_eq!(listed["studies"], json!([]), "{listed}");
    for site in ["same-origin", "none"] {
        assert_eq!(create_from(site).await, StatusCode::CREATED, "{site}");
    }
}

/// `augur serve --token x` (or `AUGUR_TOKEN=x`) would make a guessable admin token: the
/// server refuses to start, saying how long a token must be.
#[tokio::test]
async fn a_short_server_token_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}", dir.path().join("augur.db").display());
    for (flag, env) in [(Some("x"), None), (None, Some("fifteen-chars-x"))] {
        let mut command = std::process::Command::new(common::augur_bin());
        command
            .args(["serve", "--database-url", &db, "--listen", "127.0.0.1:0"])
            .env_remove("AUGUR_TOKEN");
        if let Some(token) = flag {
            command.args(["--token", token]);
        }
        if let Some(token) = env {
            command.env("AUGUR_TOKEN", token);
        }
        let mut child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("augur serve");
        let exited = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(status) = child.try_wait().expect("wait") {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let Ok(status) = exited else {
            let _ = child.kill();
            panic!("the server started with a short token ({flag:?} {env:?})");
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
            .expect("stderr");
        assert!(!status.success(), "{stderr}");
        assert!(
            stderr.contains("token") && stderr.contains("16"),
            "the error says why: {stderr}"
        );
    }
}
