//! Notes, tags and user attributes of studies and trials (issue 27, item 10), as users of
//! optuna-dashboard and W&B expect them: set through PATCH, read back with the study or
//! trial, kept across a restart of the server (they are stored, not cached), refused with a
//! field-named 400 when malformed, and allowed to the right callers only: the study's creator
//! or an admin for notes and tags, also the trial's own token for its user attributes. On
//! SQLite and PostgreSQL.

use crate::common::{self, routes};
use crate::support::{self, call_as, owned_study_with_trial, token};

use reqwest::{Method, StatusCode};
use serde_json::json;

on_both_backends!(
    notes_tags_and_user_attrs_are_kept_and_read_back,
    who_may_annotate_and_what_is_refused,
);

const ADMIN: &str = "annotations-admin-token";

async fn notes_tags_and_user_attrs_are_kept_and_read_back(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let study = app.create_study(common::spec("random", 10, 2)).await;
    let (_, trial) = {
        let s = app
            .post(
                &routes::suggest(study),
                json!({"count": 1, "client_id": "w"}),
            )
            .await;
        (study, s.body["trials"][0]["id"].as_i64().expect("trial"))
    };
    let trial_path = routes::trial(study, trial);

    // A study's note and tags, set once it has finished too (a PATCH of only them).
    let r = app
        .call(
            Method::PATCH,
            &routes::study(study),
            Some(json!({"note": "baseline with the old loader", "tags": ["baseline", " v2 ", "baseline"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["note"], json!("baseline with the old loader"));
    assert_eq!(
        r.body["tags"],
        json!(["baseline", "v2"]),
        "trimmed, once each"
    );

    // A list of studies carries each one's own (read for the page at once).
    let plain = app.create_study(common::spec("random", 5, 1)).await;
    let listed = app.get("/v1/studies").await;
    let tags_of = |id: i64| {
        listed.body["studies"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["id"] == json!(id)))
            .map(|s| s["tags"].clone())
    };
    assert_eq!(
        tags_of(study),
        Some(json!(["baseline", "v2"])),
        "{}",
        listed.body
    );
    assert_eq!(
        tags_of(plain),
        Some(serde_json::Value::Null),
        "{}",
        listed.body
    );

    // A trial's user attributes merge; null removes one; note and tags replace.
    for body in [
        json!({"user_attrs": {"train_loss": 0.31, "gpu": "a100", "gone": true}}),
        json!({"user_attrs": {"gone": null, "epochs_run": 12}, "note": "diverged at epoch 9", "tags": ["unstable"]}),
    ] {
        let r = app.call(Method::PATCH, &trial_path, Some(body)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let r = app.get(&trial_path).await;
    assert_eq!(
        r.body["user_attrs"],
        json!({"train_loss": 0.31, "gpu": "a100", "epochs_run": 12})
    );
    assert_eq!(r.body["note"], json!("diverged at epoch 9"));
    assert_eq!(r.body["tags"], json!(["unstable"]));
    // The trial still runs (annotations change nothing else) and completes as usual.
    assert_eq!(r.body["state"], json!("active"));
    let done = app
        .post(
            &format!("{trial_path}/complete"),
            json!({"metrics": {"accuracy": 0.5}}),
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);

    // In the list of trials too; an empty note and an empty list remove them.
    let list = app.get(&routes::trials(study)).await;
    assert_eq!(list.body["trials"][0]["user_attrs"]["gpu"], json!("a100"));
    let r = app
        .call(
            Method::PATCH,
            &trial_path,
            Some(json!({"note": "", "tags": []})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.get("note").is_none() && r.body.get("tags").is_none(),
        "{}",
        r.body
    );
    assert_eq!(r.body["user_attrs"]["epochs_run"], json!(12));
    // The dashboard's table has the columns.
    let table = app.get(&routes::table(study)).await;
    assert_eq!(table.status, StatusCode::OK, "{}", table.body);
    assert_eq!(table.body["user_attrs"]["train_loss"], json!([0.31]));
    assert_eq!(table.body["tags"], json!([[]]));

    // Stored: a new server on the same database reads them back.
    let again = common::spawn_app(app.db).await;
    let s = again.get(&routes::study(study)).await;
    assert_eq!(s.body["tags"], json!(["baseline", "v2"]), "{}", s.body);
    let t = again.get(&trial_path).await;
    assert_eq!(t.body["user_attrs"]["train_loss"], json!(0.31));
}

async fn who_may_annotate_and_what_is_refused(backend: &str) {
    let app = support::team_app(backend, ADMIN).await;
    let alice = token(&app, "alice", "writer").await;
    let bob = token(&app, "bob", "writer").await;
    let (study, trial) = owned_study_with_trial(&app, &alice, "alice-worker").await;
    let trial_path = routes::trial(study, trial);
    let minted = call_as(
        &app,
        &alice,
        Method::POST,
        &format!("{trial_path}/token"),
        Some(json!({"client_id": "alice-worker"})),
    )
    .await;
    let trial_token = minted.body["token"].as_str().expect("token").to_string();

    // The trial's own token sets its user attributes, not its note, nor the study's.
    let own = call_as(
        &app,
        &trial_token,
        Method::PATCH,
        &trial_path,
        Some(json!({"user_attrs": {"peak_memory_gb": 3.5}})),
    )
    .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    let r = call_as(
        &app,
        &trial_token,
        Method::PATCH,
        &trial_path,
        Some(json!({"note": "mine"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["error"]["field"], json!("note"));
    let r = call_as(
        &app,
        &trial_token,
        Method::PATCH,
        &trial_path,
        Some(json!({"excluded": true})),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    // Another writer may do none of it, on the trial or the study.
    for (path, body) in [
        (trial_path.clone(), json!({"user_attrs": {"x": 1}})),
        (trial_path.clone(), json!({"tags": ["x"]})),
        (routes::study(study), json!({"note": "bob was here"})),
    ] {
        let r = call_as(&app, &bob, Method::PATCH, &path, Some(body)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {}", r.body);
    }
    // Malformed input names its field; nothing stored changes.
    for (body, field) in [
        (json!({"tags": ["ok", ""]}), "tags[1]"),
        (json!({"note": "x".repeat(10_001)}), "note"),
        (json!({"user_attrs": {"": 1}}), "user_attrs."),
        (json!({"tags": "not a list"}), "tags"),
        (json!({}), "excluded"),
    ] {
        let r = call_as(&app, &alice, Method::PATCH, &trial_path, Some(body.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert_eq!(r.body["error"]["field"], json!(field), "{body}: {}", r.body);
    }
    // At most 64 user attributes: the 65th is refused, and none of that request is kept.
    let many: serde_json::Map<String, serde_json::Value> =
        (0..63).map(|i| (format!("a{i}"), json!(i))).collect();
    let r = call_as(
        &app,
        &alice,
        Method::PATCH,
        &trial_path,
        Some(json!({"user_attrs": many})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = call_as(
        &app,
        &alice,
        Method::PATCH,
        &trial_path,
        Some(json!({"user_attrs": {"one_more": 1, "a0": "changed"}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["field"], json!("user_attrs"));
    let t = call_as(&app, &alice, Method::GET, &trial_path, None).await;
    let attrs = t.body["user_attrs"].as_object().expect("attrs");
    assert_eq!(attrs.len(), 64, "63 set by alice and the trial's own");
    assert_eq!(attrs["a0"], json!(0), "the refused request changed nothing");
    // A person's note enters the audit trail; user attributes, like measurements, do not.
    let r = call_as(
        &app,
        &alice,
        Method::PATCH,
        &trial_path,
        Some(json!({"note": "look"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let audit = call_as(&app, ADMIN, Method::GET, "/v1/audit?page_size=1000", None).await;
    let actions: Vec<&str> = audit.body["events"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        actions.iter().filter(|a| **a == "trial.annotate").count(),
        1,
        "{actions:?}"
    );
}
