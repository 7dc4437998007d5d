//! A dispatched trial's artifacts (issue 27, item 10): the files its job wrote in its model
//! and checkpoint directories are listed and downloaded through the API, as the dashboard's
//! trial page shows them; a link the job planted (to a file of the server's, or out of the
//! directory) is neither listed nor followed, and a path that climbs out is refused.

use crate::common::{self, routes};

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn a_trials_model_files_are_listed_and_downloaded_and_links_are_not_followed() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let runs = tempfile::tempdir().expect("runs");
    let secret = runs.path().join("server-secret");
    std::fs::write(&secret, "the server's").expect("secret");
    let script = format!(
        r#"mkdir -p "$AIP_MODEL_DIR/export/1" &&
printf 'weights' > "$AIP_MODEL_DIR/export/1/saved_model.pb" &&
printf '{{"lr": 1}}' > "$AIP_MODEL_DIR/config.json" &&
printf 'step 3' > "$AIP_CHECKPOINT_DIR/ckpt-3" &&
ln -s {secret} "$AIP_MODEL_DIR/link" &&
ln -s / "$AIP_MODEL_DIR/root" &&
echo accuracy=0.5"#,
        secret = secret.display()
    );
    let mut spec = common::spec("random", 1, 1);
    spec["trial_job"] = json!({
        "command": ["/bin/sh", "-c", script],
        "output_dir": runs.path().display().to_string(),
    });
    let study = app.create_study(spec).await;
    app.wait_for_state(study, "completed", Duration::from_secs(60))
        .await;
    let base = routes::trial_artifacts(study, 1);

    let listed = app.get(&base).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let paths: Vec<&str> = listed.body["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        ["config.json", "export/1/saved_model.pb"],
        "no links"
    );
    assert_eq!(listed.body["files"][1]["size"], json!(7));
    assert_eq!(listed.body["truncated"], json!(false));
    assert!(
        listed.body["directory"]
            .as_str()
            .is_some_and(|d| d.ends_with("/1/model")),
        "{}",
        listed.body
    );
    let checkpoints = app.get(&format!("{base}?root=checkpoints")).await;
    assert_eq!(checkpoints.body["files"][0]["path"], json!("ckpt-3"));

    let download = |path: &str| {
        let url = format!("{}{base}/content?path={}", app.base, urlencode(path));
        let http = app.http.clone();
        async move { http.get(url).send().await.expect("download") }
    };
    let r = download("export/1/saved_model.pb").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=\"saved_model.pb\""
    );
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert_eq!(r.text().await.expect("body"), "weights");

    for (path, status) in [
        ("link", StatusCode::CONFLICT),
        ("root/etc/hostname", StatusCode::CONFLICT),
        ("../job.log", StatusCode::BAD_REQUEST),
        ("/etc/hostname", StatusCode::BAD_REQUEST),
        ("nothing-here", StatusCode::NOT_FOUND),
    ] {
        let r = download(path).await;
        assert_eq!(r.status(), status, "{path}");
        let body: serde_json::Value = r.json().await.expect("json error");
        assert!(body["error"]["message"].is_string(), "{path}: {body}");
        if status == StatusCode::BAD_REQUEST {
            assert_eq!(body["error"]["field"], json!("path"), "{path}: {body}");
        }
    }
    let bad = app.get(&format!("{base}?root=home")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);

    // A pulled study keeps no files on the server: said plainly.
    let pulled = app.create_study(common::spec("random", 1, 1)).await;
    app.post(
        &routes::suggest(pulled),
        json!({"count": 1, "client_id": "w"}),
    )
    .await;
    let none = app.get(&routes::trial_artifacts(pulled, 1)).await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "{}", none.body);
    assert!(
        none.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no trial_job")),
        "{}",
        none.body
    );
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
