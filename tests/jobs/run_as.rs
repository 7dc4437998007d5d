//! `augur serve --run-jobs-as USER`: local jobs run as another user of the machine, for real
//! (the test creates the user with `useradd` when it is missing: it runs as root here). The
//! job cannot read the SQLite database (which holds the token store), even in a directory
//! anyone may enter; it can write what the trial contract gives it (model directory, the
//! hypertune file), and its metrics reach the study.

use crate::common::{self, routes};

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use augur::{App, ServerConfig};
use serde_json::json;

pub(crate) const USER: &str = "augur-trial-test";

/// The test user's uid, made if missing. Made under a lock: test processes that start at
/// once (and two `useradd`s racing on a fresh machine) once left the uid a test looked up
/// different from the one its job then ran as.
pub(crate) fn test_user() -> u32 {
    let status = Command::new("flock")
        .args([
            "/tmp/augur-trial-test-user.lock",
            "sh",
            "-c",
            &format!(
                "id -u {USER} >/dev/null 2>&1 || \
                 useradd --system --no-create-home --shell /usr/sbin/nologin {USER}"
            ),
        ])
        .status()
        .expect("flock and useradd (the tests run as root)");
    assert!(status.success(), "useradd {USER}");
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
    let spec = json!({
        "name": "as-another-user", "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 1, "seed": 1,
        "trial_job": {"command": ["/bin/sh", "-c", script], "output_dir": "runs"}
    });
    let id = create_study(&base, None, spec).await;
    let study = wait_ended(&base, None, id).await;
    let model = common::study_dir(&runs, 1).join("1/model");
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
        &std::fs::metadata(common::study_dir(&runs, 1).join("1/job.log")).expect("log"),
    );
    assert_eq!(log_owner, nix::unistd::getuid().as_raw());
}

/// A server running jobs as the test user, with its database and trial directories in a
/// directory anyone may enter; returns its URL and that directory.
async fn run_as_server() -> (String, tempfile::TempDir) {
    test_user();
    let dir = tempfile::tempdir().expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut config = ServerConfig::new(
        format!("sqlite://{}", dir.path().join("augur.db").display()),
        "127.0.0.1:0".parse().expect("addr"),
    );
    config.run_jobs_as = Some(USER.into());
    config.base_dir = Some(dir.path().to_path_buf());
    let app = App::build(config).await.expect("server");
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run());
    (base, dir)
}

/// Create a study of one trial running `script` with `/bin/sh` in `output_dir`, wait for it
/// to end, and return it.
async fn run_one_trial(base: &str, script: &str, output_dir: &str) -> serde_json::Value {
    run_one_trial_laid_out(base, script, output_dir, "study").await
}

/// [`run_one_trial`] with the study's `output_layout`.
async fn run_one_trial_laid_out(
    base: &str,
    script: &str,
    output_dir: &str,
    layout: &str,
) -> serde_json::Value {
    let spec = one_trial_spec(
        "loss",
        Some(json!({
            "command": ["/bin/sh", "-c", script],
            "output_dir": output_dir,
            "output_layout": layout
        })),
    );
    let id = create_study(base, None, spec).await;
    wait_ended(base, None, id).await
}

/// A random study of one trial (none may fail) whose metric is `metric`, with `job`.
fn one_trial_spec(metric: &str, job: Option<serde_json::Value>) -> serde_json::Value {
    let mut spec = json!({
        "name": "one-trial", "algorithm": "random",
        "metrics": [{"id": metric, "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 1, "max_failed_trials": 1, "seed": 1,
    });
    if let Some(job) = job {
        spec["trial_job"] = job;
    }
    spec
}

/// Create `spec` as `token` (or the open server's caller); its id.
async fn create_study(base: &str, token: Option<&str>, spec: serde_json::Value) -> i64 {
    let created = common::call(
        &common::http(),
        base,
        token,
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
    created.body["id"].as_i64().expect("id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cannot_make_the_server_write_or_serve_a_file_through_a_planted_link() {
    let (base, dir) = run_as_server().await;
    // A file only root may read or write: what the job is after.
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "TOPSECRET\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    // Study 1's job (the test user) plants, in the model directory it may write, the trial
    // directory of a later study whose output_dir is that model directory (in Vertex's
    // layout, `<output_dir>/<trial>`, whose names a job can tell): its job.log, job.handle
    // and replica logs are links to the secret.
    let plant = format!(
        "d=\"$AIP_MODEL_DIR/1\"; \
         mkdir -p \"$d/replicas\" && ln -s '{s}' \"$d/job.log\" && ln -s '{s}' \"$d/job.handle\" \
         && ln -s '{s}' \"$d/output.metrics\" && ln -s '{s}' \"$d/params.json\"; echo loss=1",
        s = secret.display()
    );
    let first = run_one_trial(&base, &plant, "runs/a").await;
    assert_eq!(first["state"], "completed", "{first}");
    let model_dir = common::study_dir(&dir.path().join("runs/a"), 1).join("1/model");
    assert!(
        model_dir.join("1/job.log").is_symlink(),
        "the job planted its link"
    );

    // Study 2 keeps its trials in study 1's model directory (an operator's mistake, or an
    // operator who is the attacker).
    let relative = model_dir.strip_prefix(dir.path()).expect("under the base");
    let second = run_one_trial_laid_out(
        &base,
        "echo loss=2",
        &relative.display().to_string(),
        "trial",
    )
    .await;

    let after = std::fs::read_to_string(&secret).expect("secret");
    assert_eq!(
        after, "TOPSECRET\n",
        "the server wrote through the job's link: {after:?}"
    );
    let http = common::http();
    let logs = common::call(
        &http,
        &base,
        None,
        reqwest::Method::GET,
        &routes::trial_logs(2, 1),
        None,
    )
    .await;
    assert!(
        !logs.body.to_string().contains("TOPSECRET"),
        "the server served the secret as a log: {}",
        logs.body
    );
    // The trial is refused with a reason that says why, not run through the links.
    let trial = common::call(
        &http,
        &base,
        None,
        reqwest::Method::GET,
        &routes::trial(2, 1),
        None,
    )
    .await
    .body;
    assert_eq!(trial["state"], "failed", "{trial}");
    let reason = trial["infeasible_reason"]
        .as_str()
        .or(trial["fail_reason"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        second.to_string().contains("not the server's") || reason.contains("not the server's"),
        "the refusal names the directory: {trial} {second}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn studies_that_share_an_output_dir_do_not_share_trial_directories() {
    let (base, _dir) = run_as_server().await;
    // Study 1's trial 1 leaves a checkpoint; study 2's trial 1, in the same output_dir,
    // must start from none.
    let first = run_one_trial(
        &base,
        "echo A > \"$AIP_CHECKPOINT_DIR/ckpt\"; echo loss=1",
        "runs/shared",
    )
    .await;
    assert_eq!(first["state"], "completed", "{first}");
    let second = run_one_trial(
        &base,
        "if [ -e \"$AIP_CHECKPOINT_DIR/ckpt\" ]; then echo loss=9; else echo loss=0; fi",
        "runs/shared",
    )
    .await;
    assert_eq!(second["state"], "completed", "{second}");
    assert_eq!(
        second["best_trial"]["final_measurement"]["metrics"]["loss"], 0.0,
        "study 2's trial 1 found study 1's checkpoint: {second}"
    );
}

/// The job's metric `leaked`: 1 when its parent's environment, read from /proc, holds an
/// `AUGUR_TOKEN`, 0 when it holds none or cannot be read.
const READ_PARENTS_TOKEN: &str = "if tr '\\0' '\\n' < /proc/$PPID/environ 2>/dev/null \
     | grep -q '^AUGUR_TOKEN='; then echo leaked=1; else echo leaked=0; fi";

/// A directory the test user owns (for a server or worker running as it).
fn users_dir() -> tempfile::TempDir {
    let uid = test_user();
    let dir = tempfile::tempdir().expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid_gid(uid))).expect("chown");
    dir
}

fn uid_gid(uid: u32) -> u32 {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .expect("user database")
        .expect("the test user")
        .gid
        .as_raw()
}

/// Wait for study `id` to end; the study.
async fn wait_ended(base: &str, token: Option<&str>, id: i64) -> serde_json::Value {
    let http = common::http();
    common::eventually("the study ends", Duration::from_secs(60), || {
        let http = &http;
        async move {
            let s = common::call(
                http,
                base,
                token,
                reqwest::Method::GET,
                &routes::study(id),
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
    .await
}

/// `augur ARGS` as the test user in `dir`, with `token` in its environment (as the README's
/// team setup has it); killed when dropped.
fn augur_as_test_user(args: &[&str], dir: &std::path::Path, token: &str) -> common::KillOnDrop {
    use std::os::unix::process::CommandExt;
    let uid = test_user();
    let child = Command::new(common::augur_bin())
        .args(args)
        .current_dir(dir)
        .env("AUGUR_TOKEN", token)
        .env("AUGUR_LOG", "warn")
        .uid(uid)
        .gid(uid_gid(uid))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("augur {args:?} as the test user: {e}"));
    common::KillOnDrop(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cannot_read_the_token_from_its_servers_or_workers_environment() {
    let token = "a-token-the-jobs-must-never-see-0123456789";
    // The server runs as the test user (no --run-jobs-as: its jobs run as that user too).
    let dir = users_dir();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let database = format!("sqlite://{}", dir.path().join("augur.db").display());
    let _server = augur_as_test_user(
        &["serve", "--listen", &listen, "--database-url", &database],
        dir.path(),
        token,
    );
    let base = format!("http://127.0.0.1:{port}");
    common::eventually("the server is ready", Duration::from_secs(30), || {
        let base = &base;
        async move {
            match common::http().get(format!("{base}/readyz")).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let job = json!({"command": ["/bin/sh", "-c", READ_PARENTS_TOKEN], "output_dir": "runs"});
    let id = create_study(&base, Some(token), one_trial_spec("leaked", Some(job))).await;
    let study = wait_ended(&base, Some(token), id).await;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(
        study["best_trial"]["final_measurement"]["metrics"]["leaked"], 0.0,
        "a dispatched job read AUGUR_TOKEN from its server's /proc/PID/environ: {study}"
    );

    // `augur worker` as the test user, its token in its environment: the same.
    let id = create_study(&base, Some(token), one_trial_spec("leaked", None)).await;
    let work = users_dir();
    let runs = work.path().join("runs").display().to_string();
    let study = id.to_string();
    let _worker = augur_as_test_user(
        &[
            "worker",
            "--url",
            &base,
            "--study",
            &study,
            "--output-dir",
            &runs,
            "--",
            "/bin/sh",
            "-c",
            READ_PARENTS_TOKEN,
        ],
        work.path(),
        token,
    );
    let study = wait_ended(&base, Some(token), id).await;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(
        study["best_trial"]["final_measurement"]["metrics"]["leaked"], 0.0,
        "a worker's job read AUGUR_TOKEN from the worker's /proc/PID/environ: {study}"
    );
}
