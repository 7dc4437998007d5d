//! Notifications (webhooks) with real parts: a receiver in this test (an axum server on a
//! free loopback port, which the server may reach only because `--notify-allow-hosts` lists
//! 127.0.0.1) that checks each body's HMAC signature with the secret; a receiver that
//! answers 500 first; receivers that refuse connections or never answer, against a study
//! that must finish as fast as without them; URLs a spec may not name; the secret never
//! shown; each call listed by `GET /v1/studies/{study}/notifications`. On SQLite and
//! PostgreSQL.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use hmac::{Hmac, KeyInit, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::common::eventually;
use crate::common::{self, TestApp, routes, spawn_app_configured};

on_both_backends!(
    events_reach_a_receiver_that_verifies_their_signature,
    a_receiver_answering_500_first_gets_the_retry,
    an_unreachable_receiver_does_not_slow_the_study,
    refused_urls_answer_400_naming_the_field,
    a_loopback_url_is_refused_at_send_time_by_a_server_that_does_not_allow_it,
    the_server_default_hears_of_studies_that_name_no_webhook,
    a_multi_objective_study_announces_each_trial_that_joins_the_pareto_front,
    a_patch_replaces_the_webhooks_of_a_running_study,
);

const SECRET: &str = "webhook-secret-of-the-test";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    signature: Option<String>,
    event: Option<String>,
    body: Vec<u8>,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    /// Answer 500 to this many requests first.
    fail_first: Arc<Mutex<usize>>,
}

impl Receiver {
    fn got(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> AxumStatus {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    r.got.lock().expect("lock").push(Received {
        signature: header("x-augur-signature"),
        event: header("x-augur-event"),
        body: body.to_vec(),
    });
    let mut fail = r.fail_first.lock().expect("lock");
    if *fail > 0 {
        *fail -= 1;
        return AxumStatus::INTERNAL_SERVER_ERROR;
    }
    AxumStatus::OK
}

/// A receiver on a free loopback port: its URL and what it got.
async fn receiver(fail_first: usize) -> (String, Receiver) {
    let state = Receiver::default();
    *state.fail_first.lock().expect("lock") = fail_first;
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), state)
}

/// A server that may call 127.0.0.1, retrying after 50 ms.
async fn app_allowing_loopback(backend: &str) -> TestApp {
    spawn_app_configured(common::db(backend).await, |c| {
        c.notify.allow_hosts = vec!["127.0.0.1".into()];
        c.notify.first_backoff = Duration::from_millis(50);
        c.notify.timeout = Duration::from_secs(30);
    })
    .await
}

fn hmac_hex(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn study_with_webhook(name: &str, url: &str, max_trials: i64, events: Value) -> Value {
    let mut spec = common::x_spec(name, ("loss", "minimize"), max_trials, max_trials, 3);
    spec["notifications"] = json!([{"url": url, "events": events, "secret": SECRET}]);
    spec
}

async fn deliveries(app: &TestApp, study: i64) -> Vec<Value> {
    let r = app.get(&routes::notifications(study)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["deliveries"].as_array().expect("deliveries").clone()
}

/// Suggest `n` trials (one call), returning their ids.
async fn suggest(app: &TestApp, study: i64, n: i64) -> Vec<i64> {
    let r = app.post(&routes::suggest(study), json!({"count": n})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .map(|t| t["id"].as_i64().expect("id"))
        .collect()
}

async fn complete(app: &TestApp, study: i64, trial: i64, loss: f64) {
    let r = app
        .post(
            &routes::trial_complete(study, trial),
            json!({"metrics": {"loss": loss}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

async fn fail(app: &TestApp, study: i64, trial: i64) {
    let r = app
        .post(
            &routes::trial_fail(study, trial),
            json!({"reason": "CUDA out of memory"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// A failed trial, two completions (the better one a new best, the worse one not) and the
/// study's completion each reach the receiver once, signed with the secret over the exact
/// body; GET shows the secret redacted and lists each call as delivered.
async fn events_reach_a_receiver_that_verifies_their_signature(backend: &str) {
    let app = app_allowing_loopback(backend).await;
    let (url, got) = receiver(0).await;
    let spec = study_with_webhook(
        "hooked",
        &url,
        3,
        json!([
            "study_completed",
            "study_failed",
            "trial_failed",
            "best_improved"
        ]),
    );
    let study = app.create_study(spec).await;
    let shown = app.get(&routes::study(study)).await.body;
    assert_eq!(
        shown["spec"]["notifications"][0]["secret"], "[redacted]",
        "{shown}"
    );
    assert_eq!(shown["spec"]["notifications"][0]["url"], url.as_str());
    assert!(!shown.to_string().contains(SECRET), "{shown}");

    let trials = suggest(&app, study, 3).await;
    fail(&app, study, trials[0]).await;
    complete(&app, study, trials[1], 0.5).await;
    // Worse than the best: no best_improved.
    complete(&app, study, trials[2], 0.9).await;
    app.wait_for_state(study, "completed", Duration::from_secs(10))
        .await;

    let received = eventually("three events received", Duration::from_secs(10), || async {
        let got = got.got();
        if got.len() >= 3 {
            Ok(got)
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    // Nothing more comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = if got.got().len() > received.len() {
        got.got()
    } else {
        received
    };
    let mut events: Vec<String> = received
        .iter()
        .map(|r| r.json()["event"].as_str().expect("event").to_string())
        .collect();
    events.sort();
    assert_eq!(events, ["best_improved", "study_completed", "trial_failed"]);
    for r in &received {
        let body = r.json();
        assert_eq!(
            r.signature.as_deref(),
            Some(hmac_hex(SECRET, &r.body).as_str()),
            "signature of {body}"
        );
        assert_eq!(r.event.as_deref(), body["event"].as_str());
        assert_eq!(body["study"]["id"], study);
        assert_eq!(body["study"]["name"], "hooked");
        assert!(
            body["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("Augur: ")),
            "{body}"
        );
        assert!(body["at"].is_string(), "{body}");
        match body["event"].as_str() {
            Some("trial_failed") => {
                assert_eq!(body["trial"]["id"], trials[0]);
                assert_eq!(body["trial"]["fail_reason"], "CUDA out of memory");
                assert!(body["trial"]["parameters"]["x"].is_number(), "{body}");
            }
            Some("best_improved") => {
                assert_eq!(body["trial"]["id"], trials[1]);
                assert_eq!(body["trial"]["final_measurement"]["metrics"]["loss"], 0.5);
            }
            _ => assert_eq!(body["study"]["state"], "completed", "{body}"),
        }
    }
    // A body signed with another secret does not verify.
    assert_ne!(
        received[0].signature.as_deref(),
        Some(hmac_hex("another secret", &received[0].body).as_str())
    );

    let listed = eventually("deliveries recorded", Duration::from_secs(5), || async {
        let list = deliveries(&app, study).await;
        if list.len() == 3 && list.iter().all(|d| d["state"] == "delivered") {
            Ok(list)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await;
    for d in &listed {
        assert_eq!(d["attempts"], 1, "{d}");
        assert_eq!(d["last_status"], 200, "{d}");
        assert_eq!(d["url"], url.as_str(), "{d}");
        assert_eq!(d["target"], "study", "{d}");
    }
}

/// With two objectives, `best_improved` is a trial that joined the Pareto front (the study's
/// `optimal_trials`): of four completions, the dominated one is not announced.
async fn a_multi_objective_study_announces_each_trial_that_joins_the_pareto_front(backend: &str) {
    let app = app_allowing_loopback(backend).await;
    let (url, got) = receiver(0).await;
    let mut spec = study_with_webhook("fronted", &url, 4, json!(["best_improved"]));
    spec["metrics"] = json!([
        {"id": "loss", "goal": "minimize"},
        {"id": "accuracy", "goal": "maximize"}
    ]);
    let study = app.create_study(spec).await;
    let trials = suggest(&app, study, 4).await;
    let announced = |n: usize| {
        let got = got.clone();
        async move {
            eventually("announcements", Duration::from_secs(10), || async {
                let ids: Vec<i64> = got
                    .got()
                    .iter()
                    .map(|r| r.json()["trial"]["id"].as_i64().expect("trial id"))
                    .collect();
                if ids.len() >= n {
                    Ok(ids)
                } else {
                    Err(format!("{ids:?}"))
                }
            })
            .await
        }
    };
    // (loss, accuracy): the first; one it dominates; one beside it on the front; one that
    // dominates both.
    let results = [(0.5, 0.5), (0.6, 0.4), (0.3, 0.3), (0.2, 0.9)];
    let mut expected = Vec::new();
    for (trial, (loss, accuracy)) in trials.iter().zip(results) {
        let r = app
            .post(
                &routes::trial_complete(study, trial),
                json!({"metrics": {"loss": loss, "accuracy": accuracy}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        if (loss, accuracy) != (0.6, 0.4) {
            expected.push(*trial);
            // Each read after its own completion: the front it joined, not a later one.
            assert_eq!(announced(expected.len()).await, expected);
        }
    }
    app.wait_for_state(study, "completed", Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(announced(expected.len()).await, expected, "nothing more");
    let front = app.get(&routes::optimal_trials(study)).await;
    assert_eq!(front.status, StatusCode::OK, "{}", front.body);
    let mut on_front: Vec<i64> = front.body["trials"]
        .as_array()
        .expect("optimal trials")
        .iter()
        .map(|t| t["id"].as_i64().expect("id"))
        .collect();
    on_front.sort();
    assert_eq!(on_front, [trials[3]], "the last dominates every other");
}

/// `PATCH {"notifications": […]}` replaces a running study's webhooks (checked as at
/// creation: a loopback URL this server may not call is refused naming the field, and the
/// study keeps its webhooks); the audit trail does not hold the new secret; `[]` removes them.
async fn a_patch_replaces_the_webhooks_of_a_running_study(backend: &str) {
    let app = app_allowing_loopback(backend).await;
    let (first_url, first) = receiver(0).await;
    let (second_url, second) = receiver(0).await;
    let spec = study_with_webhook("patched", &first_url, 3, json!(["trial_failed"]));
    let study = app.create_study(spec).await;
    let trials = suggest(&app, study, 3).await;
    fail(&app, study, trials[0]).await;

    let refused = app
        .patch(
            &routes::study(study),
            json!({"notifications": [{"url": "http://169.254.169.254/hook"}]}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert_eq!(refused.body["error"]["field"], "notifications[0].url");
    let patched = app
        .patch(
            &routes::study(study),
            json!({"notifications": [{
                "url": second_url, "events": ["trial_failed"], "secret": "a-new-secret-for-the-hook"
            }]}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(
        patched.body["spec"]["notifications"][0]["url"],
        second_url.as_str()
    );
    assert_eq!(
        patched.body["spec"]["notifications"][0]["secret"],
        "[redacted]"
    );
    fail(&app, study, trials[1]).await;
    let to_second = eventually(
        "the new webhook called",
        Duration::from_secs(10),
        || async {
            match second.got().as_slice() {
                [one] => Ok(one.clone()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(to_second.json()["trial"]["id"], trials[1]);
    assert_eq!(
        to_second.signature.as_deref(),
        Some(hmac_hex("a-new-secret-for-the-hook", &to_second.body).as_str())
    );
    let audit = app.get("/v1/audit?page_size=1000").await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    let updates: Vec<&Value> = audit.body["events"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["action"] == "study.update")
        .collect();
    assert!(
        updates.iter().any(|e| e["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&second_url))),
        "the change is audited: {updates:?}"
    );
    assert!(
        !audit.body.to_string().contains("a-new-secret-for-the-hook"),
        "{}",
        audit.body
    );

    let removed = app
        .patch(&routes::study(study), json!({"notifications": []}))
        .await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.body);
    fail(&app, study, trials[2]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let firsts: Vec<i64> = first
        .got()
        .iter()
        .map(|r| r.json()["trial"]["id"].as_i64().expect("trial"))
        .collect();
    assert_eq!(
        firsts,
        [trials[0]],
        "the first webhook heard only the first failure"
    );
    assert_eq!(second.got().len(), 1, "none after the removal");
}

/// A receiver that answers 500 to the first request gets the same signed body again, and
/// the delivery shows two attempts, delivered.
async fn a_receiver_answering_500_first_gets_the_retry(backend: &str) {
    let app = app_allowing_loopback(backend).await;
    let (url, got) = receiver(1).await;
    let study = app
        .create_study(study_with_webhook(
            "retried",
            &url,
            5,
            json!(["trial_failed"]),
        ))
        .await;
    let trial = suggest(&app, study, 1).await[0];
    fail(&app, study, trial).await;
    let delivery = eventually(
        "delivered on the second attempt",
        Duration::from_secs(10),
        || async {
            let list = deliveries(&app, study).await;
            match list.as_slice() {
                [d] if d["state"] == "delivered" => Ok(d.clone()),
                _ => Err(format!("{list:?}")),
            }
        },
    )
    .await;
    assert_eq!(delivery["attempts"], 2, "{delivery}");
    assert_eq!(delivery["last_status"], 200, "{delivery}");
    assert_eq!(delivery["event"], "trial_failed", "{delivery}");
    assert_eq!(delivery["trial_id"], trial, "{delivery}");
    let received = got.got();
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(received[0].body, received[1].body);
    for r in &received {
        assert_eq!(
            r.signature.as_deref(),
            Some(hmac_hex(SECRET, &r.body).as_str())
        );
    }
}

/// Run a study of `n` trials, each suggested, failed (a `trial_failed` event each) or
/// completed; how long it took.
async fn run_study(app: &TestApp, mut spec: Value, n: usize) -> (i64, Duration) {
    spec["max_trials"] = json!(n);
    let study = app.create_study(spec).await;
    let started = Instant::now();
    for i in 0..n {
        let trial = suggest(app, study, 1).await[0];
        if i % 2 == 0 {
            fail(app, study, trial).await;
        } else {
            complete(app, study, trial, 1.0 / (i as f64 + 1.0)).await;
        }
    }
    app.wait_for_state(study, "completed", Duration::from_secs(30))
        .await;
    (study, started.elapsed())
}

/// A receiver that never answers (it accepts and holds the connection) and one whose port
/// is closed: the study finishes about as fast as one without webhooks; the calls wait,
/// pending or failed, in the background.
async fn an_unreachable_receiver_does_not_slow_the_study(backend: &str) {
    // Retries after the study's run (the calls themselves are the test, not their
    // recording, which shares the database's cores with the study's requests).
    let app = spawn_app_configured(common::db(backend).await, |c| {
        c.notify.allow_hosts = vec!["127.0.0.1".into()];
        c.notify.first_backoff = Duration::from_secs(2);
        c.notify.timeout = Duration::from_secs(30);
    })
    .await;
    // Never answers: accepts connections and keeps them.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_url = format!("http://{}/hook", silent.local_addr().expect("addr"));
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = silent.accept().await {
            keep.lock().expect("lock").push(socket);
        }
    });
    // Refuses: a port bound and closed again.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let closed_url = format!("http://{}/hook", closed.local_addr().expect("addr"));
    drop(closed);

    let n = 20;
    let plain = common::x_spec("plain", ("loss", "minimize"), n as i64, 1, 3);
    // Warm up (connections, statements), then the run without webhooks.
    run_study(&app, plain.clone(), 4).await;
    let (_, without) = run_study(&app, plain, n).await;
    let mut hooked = common::x_spec("hooked", ("loss", "minimize"), n as i64, 1, 3);
    hooked["notifications"] = json!([
        {"url": silent_url, "secret": SECRET},
        {"url": closed_url},
    ]);
    let (study, with) = run_study(&app, hooked, n).await;
    eprintln!("{n} trials: {without:?} without webhooks, {with:?} with two unreachable ones");
    assert!(
        with <= without * 2 + Duration::from_millis(500),
        "with unreachable webhooks the study took {with:?}, without {without:?}"
    );
    // The calls were made, in the background: the silent one still waits for its answer,
    // the closed port's are retried and fail.
    let list = eventually("deliveries recorded", Duration::from_secs(10), || async {
        let list = deliveries(&app, study).await;
        let closed_tried = list
            .iter()
            .filter(|d| d["url"] == closed_url.as_str())
            .any(|d| d["attempts"].as_u64() >= Some(1));
        if list.len() >= 2 * (n / 2 + 1) && closed_tried {
            Ok(list)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await;
    assert!(
        list.iter()
            .filter(|d| d["url"] == silent_url.as_str())
            .all(|d| d["state"] == "pending"),
        "{list:?}"
    );
    assert!(
        !held.lock().expect("lock").is_empty(),
        "the silent receiver was called"
    );
    let closed_error = list
        .iter()
        .find(|d| d["url"] == closed_url.as_str() && d["attempts"].as_u64() >= Some(1))
        .and_then(|d| d["last_error"].as_str().map(str::to_string))
        .unwrap_or_default();
    assert!(!closed_error.is_empty(), "{list:?}");
}

/// URLs a spec may not name, each refused with 400 naming the field, nothing created: a
/// loopback or link-local address (the server does not allow them here), `localhost`, a
/// `file://` URL, an unknown field, an unknown event.
async fn refused_urls_answer_400_naming_the_field(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let cases = [
        (
            json!([{"url": "http://127.0.0.1:9/hook"}]),
            "notifications[0].url",
        ),
        (
            json!([{"url": "http://localhost:9/hook"}]),
            "notifications[0].url",
        ),
        (
            json!([{"url": "http://[::1]:9/hook"}]),
            "notifications[0].url",
        ),
        (
            json!([{"url": "https://hooks.example.com/a"}, {"url": "http://169.254.169.254/latest/meta-data/"}]),
            "notifications[1].url",
        ),
        (
            json!([{"url": "http://0.0.0.0:80/"}]),
            "notifications[0].url",
        ),
        (
            json!([{"url": "file:///etc/passwd"}]),
            "notifications[0].url",
        ),
        (
            json!([{"url": "https://hooks.example.com/a", "events": []}]),
            "notifications[0].events",
        ),
        (
            json!([{"url": "https://hooks.example.com/a", "secret": "[redacted]"}]),
            "notifications[0].secret",
        ),
    ];
    for (notifications, field) in cases {
        let mut spec = common::x_spec("refused", ("loss", "minimize"), 3, 1, 3);
        spec["notifications"] = notifications.clone();
        let r = app.post("/v1/studies", spec).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{notifications}: {}",
            r.body
        );
        assert_eq!(
            r.body["error"]["field"], field,
            "{notifications}: {}",
            r.body
        );
    }
    // Unknown fields and events are refused as the spec's are.
    for notifications in [
        json!([{"url": "https://hooks.example.com/a", "headers": {"x": "y"}}]),
        json!([{"url": "https://hooks.example.com/a", "events": ["trial_completed"]}]),
    ] {
        let mut spec = common::x_spec("refused", ("loss", "minimize"), 3, 1, 3);
        spec["notifications"] = notifications.clone();
        let r = app.post("/v1/studies", spec).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{notifications}: {}",
            r.body
        );
        let field = r.body["error"]["field"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            field.starts_with("notifications[0]"),
            "{notifications}: {}",
            r.body
        );
    }
    let listed = app.get("/v1/studies").await.body;
    assert_eq!(listed["studies"], json!([]), "{listed}");
    // A public https URL is accepted.
    let mut spec = common::x_spec("accepted", ("loss", "minimize"), 3, 1, 3);
    spec["notifications"] = json!([{"url": "https://hooks.example.com/a"}]);
    app.create_study(spec).await;
}

/// A study whose webhook a server allowed (127.0.0.1), changed through a server that does
/// not allow it: that server refuses to send (its check at send time), and the delivery says
/// why, failed at its first attempt.
async fn a_loopback_url_is_refused_at_send_time_by_a_server_that_does_not_allow_it(backend: &str) {
    let strict = spawn_app_configured(common::db(backend).await, |c| {
        c.notify.first_backoff = Duration::from_millis(50)
    })
    .await;
    // Another server on the same database, allowing 127.0.0.1, creates the study.
    let mut config =
        augur::ServerConfig::new(strict.db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    config.dispatch = false;
    config.notify.allow_hosts = vec!["127.0.0.1".into()];
    let allowing = augur::App::build(config).await.expect("server starts");
    let allowing_base = format!("http://{}", allowing.addr());
    tokio::spawn(allowing.run());
    let (url, got) = receiver(0).await;
    let spec = study_with_webhook("moved", &url, 3, json!(["trial_failed"]));
    let r = common::call(
        &strict.http,
        &allowing_base,
        None,
        reqwest::Method::POST,
        "/v1/studies",
        Some(spec),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let study = r.body["id"].as_i64().expect("id");
    let trial = suggest(&strict, study, 1).await[0];
    fail(&strict, study, trial).await;
    let delivery = eventually("refused", Duration::from_secs(10), || async {
        let list = deliveries(&strict, study).await;
        match list.as_slice() {
            [d] if d["state"] == "failed" => Ok(d.clone()),
            _ => Err(format!("{list:?}")),
        }
    })
    .await;
    assert_eq!(delivery["attempts"], 1, "{delivery}");
    let error = delivery["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("--notify-allow-hosts"), "{delivery}");
    assert!(got.got().is_empty(), "{:?}", got.got());
}

/// The server's default webhook (`--notify-url`, `--notify-events study_failed`,
/// `--notify-secret-file`) hears of a study that names none: it fails
/// (`max_failed_trials: 1`), and only that is sent, signed; its delivery shows the URL's
/// origin only (the path of a Slack webhook is its token).
async fn the_server_default_hears_of_studies_that_name_no_webhook(backend: &str) {
    let (url, got) = receiver(0).await;
    let app = spawn_app_configured(common::db(backend).await, |c| {
        c.notify.allow_hosts = vec!["127.0.0.1".into()];
        c.notify.url = Some(url.clone());
        c.notify.events = vec!["study_failed".into()];
        c.notify.secret = Some(SECRET.into());
    })
    .await;
    let mut spec = common::x_spec("failing", ("loss", "minimize"), 5, 1, 3);
    spec["max_failed_trials"] = json!(1);
    let study = app.create_study(spec).await;
    let trial = suggest(&app, study, 1).await[0];
    fail(&app, study, trial).await;
    app.wait_for_state(study, "failed", Duration::from_secs(10))
        .await;
    let delivery = eventually("delivered", Duration::from_secs(10), || async {
        let list = deliveries(&app, study).await;
        match list.as_slice() {
            [d] if d["state"] == "delivered" => Ok(d.clone()),
            _ => Err(format!("{list:?}")),
        }
    })
    .await;
    assert_eq!(delivery["target"], "server", "{delivery}");
    assert_eq!(delivery["event"], "study_failed", "{delivery}");
    let origin = url.trim_end_matches("/hook");
    assert_eq!(delivery["url"], origin, "{delivery}");
    let received = got.got();
    assert_eq!(received.len(), 1, "only study_failed: {received:?}");
    let body = received[0].json();
    assert_eq!(body["event"], "study_failed");
    assert_eq!(body["study"]["state"], "failed");
    assert!(
        body["study"]["state_reason"]
            .as_str()
            .is_some_and(|r| r.contains("max_failed_trials")),
        "{body}"
    );
    assert_eq!(
        received[0].signature.as_deref(),
        Some(hmac_hex(SECRET, &received[0].body).as_str())
    );
}
