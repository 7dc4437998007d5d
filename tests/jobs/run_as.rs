//! `augur serve --run-jobs-as USER`: local jobs run as another user of the machine, for real
//! (the test creates the user with `useradd` when it is missing: it runs as root here). The
//! job cannot read the SQLite database (which holds the token store), even in a directory
//! anyone may enter; it can write what the trial contract gives it (model directory, the
//! hypertune file), and its metrics reach the study.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use augur::{App, ServerConfig};
use serde_json::json;

pub(crate) const USER: &str = "augur-trial-test";

/// The test user's uid, made if missing.
pub(crate) fn test_user() -> u32 {
    if nix::unistd::User::from_name(USER).ok().flatten().is_none() {
        let status = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])
            .status()
            .expect("useradd (the tests run as root)");
        // Another test process may have made it meanwhile.
        assert!(
            status.success() || nix::unistd::User::from_name(USER).ok().flatten().is_some(),
            "useradd {USER}"
        );
    }
    nix::unistd::User::from_name(USER)
        .expect("user database")
        .expect("the test user")
        .uid
        .as_raw()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_as_another_user_cannot_read_the_database() {
    let uid = test_user();
    let dir = tempfile::tempdir().expect("dir");
    // Anyone may enter these: only the database file's own mode keeps it private.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let db_path = dir.path().join("augur.db");
    let runs = dir.path().join("runs");
    std::fs::create_dir(&runs).expect("runs");
    std::fs::set_permissions(&runs, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let mut config = ServerConfig::new(
        format!("sqlite://{}", db_path.display()),
        "127.0.0.1:0".parse().expect("addr"),
    );
    config.run_jobs_as = Some(USER.into());
    config.base_dir = Some(dir.path().to_path_buf());
    let app = App::build(config).await.expect("server");
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run());

    let mode = std::fs::metadata(&db_path)
        .expect("db")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the database file is the server's alone");
    let script = format!(
        "id -u > \"$AIP_MODEL_DIR/uid\"; \
         if cat '{db}' > /dev/null 2>&1; then echo read > \"$AIP_MODEL_DIR/db\"; \
         else echo refused > \"$AIP_MODEL_DIR/db\"; fi; \
         echo \"$HOME\" > \"$AIP_MODEL_DIR/home\"; \
         echo '{{\"loss\": \"0.25\", \"global_step\": \"1\"}}' > \"$CLOUD_ML_HP_METRIC_FILE\"",
        db = db_path.display()
    );
    let http = common::http();
    let spec = json!({
        "name": "as-another-user", "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 1, "seed": 1,
        "trial_job": {"command": ["/bin/sh", "-c", script], "output_dir": "runs"}
    });
    let created = common::call(
        &http,
        &base,
        None,
        reqwest::Method::POST,
        "/v1/studies",
        Some(spec),
    )
    .await;
    assert_eq!(
        created.status,
        reqwest::StatusCode::CREATED,
        "{}",
        created.body
    );
    let id = created.body["id"].as_i64().expect("id");
    let study = common::eventually("the study ends", Duration::from_secs(60), || {
        let (http, base) = (&http, &base);
        async move {
            let s = common::call(
                http,
                base,
                None,
                reqwest::Method::GET,
                &format!("/v1/studies/{id}"),
                None,
            )
            .await
            .body;
            if s["state"] == "active" {
                Err(s.to_string())
            } else {
                Ok(s)
            }
        }
    })
    .await;
    let model = runs.join("1/model");
    let read = |name: &str| {
        std::fs::read_to_string(model.join(name))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(read("uid"), uid.to_string(), "the job ran as {USER}");
    assert_eq!(read("db"), "refused", "the job read the database");
    assert_ne!(
        read("home"),
        std::env::var("HOME").unwrap_or_default(),
        "the job got the server's HOME"
    );
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(
        study["best_trial"]["final_measurement"]["metrics"]["loss"], 0.25,
        "the hypertune file the job wrote reached the study: {study}"
    );
    // The job's log stays the server's: the job cannot rewrite what the service serves.
    let log_owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(runs.join("1/job.log")).expect("log"),
    );
    assert_eq!(log_owner, nix::unistd::getuid().as_raw());
}
