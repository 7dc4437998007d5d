//! Who may act on a study's trials (issue 26, findings 8 and 11), as an attacker with a
//! writer's token of their own would try it: a writer who did not create a study may not
//! pull its trials, add results, report to (or end) its trials, nor mint a token for a trial
//! another client holds; the trial's own token, the study's creator and an admin may, and
//! the trial-level changes that are not the study's routine reports enter the audit trail.
//! On SQLite and PostgreSQL.

use crate::common::{self, routes};
use crate::support::{self, call_as, owned_study_with_trial, token};

use reqwest::{Method, StatusCode};
use serde_json::json;

on_both_backends!(
    a_writer_cannot_end_or_poison_a_study_it_does_not_own,
    only_a_trials_holder_may_mint_its_token,
    trial_changes_enter_the_audit_trail,
);

const ADMIN: &str = "ownership-admin-token";

async fn team_app(backend: &str) -> common::TestApp {
    support::team_app(backend, ADMIN).await
}

/// The probe's attack: suggest + fail ×3 failed another's study, and completing its trial
/// with 1e300 made that the best trial. Every way in is refused with 403, for a writer and
/// for an operator (neither created the study), and the study is untouched.
async fn a_writer_cannot_end_or_poison_a_study_it_does_not_own(backend: &str) {
    let app = team_app(backend).await;
    let alice = token(&app, "alice", "writer").await;
    let bob = token(&app, "bob", "writer").await;
    let ops = token(&app, "ops", "operator").await;
    let (study, trial) = owned_study_with_trial(&app, &alice, "alice-worker").await;

    let poison = json!({"metrics": {"accuracy": 1e300}});
    let params = json!({"lr": 0.01, "layers": 2, "batch": 16, "kernel": "rbf"});
    let attacks = [
        (
            routes::suggest(study),
            json!({"count": 3, "client_id": "bob"}),
        ),
        (
            routes::trials(study),
            json!({"parameters": params, "final_measurement": poison}),
        ),
        (routes::trial_complete(study, trial), poison),
        (
            routes::trial_fail(study, trial),
            json!({"reason": "bob says so"}),
        ),
        (
            routes::trial_measurements(study, trial),
            json!({"step": 1, "metrics": {"accuracy": 1e300}}),
        ),
        (routes::trial_heartbeat(study, trial), json!({})),
        (routes::trial_should_stop(study, trial), json!({})),
    ];
    for other in [&bob, &ops] {
        for (path, body) in &attacks {
            let r = call_as(&app, other, Method::POST, path, Some(body.clone())).await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "POST {path}: {}", r.body);
            assert!(
                r.body["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("alice"),
                "the refusal names the study's creator: {}",
                r.body
            );
        }
    }
    let s = app.get(&routes::study(study)).await.body;
    assert_eq!(s["state"], "active", "{s}");
    assert!(s["best_trial"].is_null(), "{s}");
    assert_eq!(s["trial_counts"]["failed"], 0, "{s}");
    let t = app.get(&routes::trial(study, trial)).await.body;
    assert_eq!(t["state"], "active", "{t}");
    assert_eq!(t["measurements"], json!([]), "{t}");

    // The creator reports to its own study's trials; an admin to any.
    let r = call_as(
        &app,
        &alice,
        Method::POST,
        &routes::trial_heartbeat(study, trial),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .post(
            &routes::trial_complete(study, trial),
            json!({"metrics": {"accuracy": 0.5}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "an admin's: {}", r.body);
}

/// Finding 11: the `client_id` a trial was handed to is shown to every reader, so it proves
/// nothing: a writer who is not the trial's holder asking for its token with it would cut
/// the holder's trial off (its token replaced). Refused; the holder's token keeps working.
async fn only_a_trials_holder_may_mint_its_token(backend: &str) {
    let app = team_app(backend).await;
    let alice = token(&app, "alice", "writer").await;
    let bob = token(&app, "bob", "writer").await;
    let (study, trial) = owned_study_with_trial(&app, &alice, "alice-worker").await;
    let path = routes::trial_token(study, trial);
    let minted = call_as(
        &app,
        &alice,
        Method::POST,
        &path,
        Some(json!({"client_id": "alice-worker"})),
    )
    .await;
    assert_eq!(minted.status, StatusCode::CREATED, "{}", minted.body);
    let trial_token = minted.body["token"].as_str().expect("token").to_string();

    let seen = call_as(&app, &bob, Method::GET, &routes::trial(study, trial), None).await;
    let client = seen.body["client_id"].as_str().expect("client id");
    let r = call_as(
        &app,
        &bob,
        Method::POST,
        &path,
        Some(json!({"client_id": client})),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);

    let beat = call_as(
        &app,
        &trial_token,
        Method::POST,
        &routes::trial_heartbeat(study, trial),
        None,
    )
    .await;
    assert_eq!(
        beat.status,
        StatusCode::OK,
        "the holder is not cut off: {}",
        beat.body
    );
}

/// Trial-level changes name who made them: an admin's failure and completion of another's
/// trial, a token minted. The creator's and a trial token's own completions are the study's
/// routine reports, not audited.
async fn trial_changes_enter_the_audit_trail(backend: &str) {
    let app = team_app(backend).await;
    let alice = token(&app, "alice", "writer").await;
    let (study, first) = owned_study_with_trial(&app, &alice, "w1").await;
    let r = call_as(
        &app,
        &alice,
        Method::POST,
        &routes::trial_complete(study, first),
        Some(json!({"metrics": {"accuracy": 0.5}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // Alice pulls `count` trials as `client`: their ids.
    let pull = |count: i64, client: &'static str| {
        let (app, alice) = (&app, &alice);
        async move {
            let path = routes::suggest(study);
            let body = Some(json!({"count": count, "client_id": client}));
            let s = call_as(app, alice, Method::POST, &path, body).await;
            s.body["trials"]
                .as_array()
                .expect("trials")
                .iter()
                .map(|t| t["id"].as_i64().expect("trial"))
                .collect::<Vec<i64>>()
        }
    };
    let pulled = pull(2, "w2").await;
    let (second, third) = (pulled[0], pulled[1]);
    let r = app
        .post(&routes::trial_fail(study, second), json!({"reason": "oom"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let minted = call_as(
        &app,
        &alice,
        Method::POST,
        &routes::trial_token(study, third),
        Some(json!({"client_id": "w2"})),
    )
    .await;
    let trial_token = minted.body["token"].as_str().expect("token").to_string();
    let r = call_as(
        &app,
        &trial_token,
        Method::POST,
        &routes::trial_complete(study, third),
        Some(json!({"infeasible_reason": "diverged"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    // An admin completes a trial of alice's study: that one is audited.
    let fourth = pull(1, "w3").await[0];
    let r = app
        .post(
            &routes::trial_complete(study, fourth),
            json!({"metrics": {"accuracy": 0.25}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    let trail = app.get("/v1/audit?page_size=1000").await.body;
    let seen: Vec<(String, String, Option<i64>)> = trail["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["action"].as_str().unwrap_or("").starts_with("trial."))
        .map(|e| {
            (
                e["actor"].as_str().unwrap_or("").to_string(),
                e["action"].as_str().unwrap_or("").to_string(),
                e["trial_id"].as_i64(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("env".to_string(), "trial.fail".to_string(), Some(second)),
            ("alice".into(), "trial.token".into(), Some(third)),
            ("env".into(), "trial.complete".into(), Some(fourth)),
        ],
        "{trail}"
    );
}
