//! Shared test helpers: real databases (a fresh PostgreSQL database or SQLite file per test),
//! the server on port 0 in-process or as a real `augur` process, and a small JSON client.
#![allow(
    dead_code,
    unused_macros,
    reason = "each test binary uses a different part of these helpers"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use augur::{App, ServerConfig};

/// Each named async fn becomes two tests, `name::sqlite` and `name::postgres`: called with
/// the backend's name (`on_both_backends!(a, b)`), or with a connected store on a fresh
/// database of that backend (`on_both_backends!(store: a, b)`).
macro_rules! on_both_backends {
    (store: $($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                let db = $crate::common::sqlite_db();
                super::$name(augur::store::connect(&db.url).await.expect("sqlite store")).await
            }
            #[tokio::test]
            async fn postgres() {
                let db = $crate::common::postgres_db().await;
                super::$name(augur::store::connect(&db.url).await.expect("postgres store")).await
            }
        }
    )*};
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name("sqlite").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name("postgres").await
            }
        }
    )*};
}
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// An HTTP client for the tests (reqwest asks for the process's TLS provider: `augur`
/// installs ring's, as its CLI does).
pub fn http() -> reqwest::Client {
    http_builder().build().expect("HTTP client")
}

pub fn http_builder() -> reqwest::ClientBuilder {
    augur::serve::install_tls_provider();
    reqwest::Client::builder()
}

/// Admin URL of the test PostgreSQL (see scripts/start-postgres.sh).
pub fn postgres_admin_url() -> String {
    std::env::var("AUGUR_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/postgres".to_string())
}

/// A database that lives as long as this value (SQLite: a file in a temp dir).
pub struct TestDb {
    pub url: String,
    pub backend: &'static str,
    _dir: Option<tempfile::TempDir>,
    /// A PostgreSQL database to drop when the test is done.
    pg_name: Option<String>,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            admin_sql_from_drop(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

/// Run `sql` on the PostgreSQL admin connection, best effort, from a `Drop` (synchronous,
/// and maybe inside a runtime: on a thread with its own).
pub fn admin_sql_from_drop(sql: String) {
    let _ = std::thread::spawn(move || {
        use sqlx::Connection;
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await;
            }
        });
    })
    .join();
}

pub fn sqlite_db() -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("augur.db").display());
    TestDb {
        url,
        backend: "sqlite",
        _dir: Some(dir),
        pg_name: None,
    }
}

/// A new, empty PostgreSQL database. Fails loudly if PostgreSQL is not running: run the
/// README's test command, which starts it.
pub async fn postgres_db() -> TestDb {
    use sqlx::Connection;
    let admin = postgres_admin_url();
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {admin} is not reachable ({e}); run scripts/test.sh")
        });
    let name = format!("augur_test_{}", uuid_like());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create test database");
    let base = admin
        .rsplit_once('/')
        .map_or(admin.as_str(), |(b, _)| b)
        .to_string();
    TestDb {
        url: format!("{base}/{name}"),
        backend: "postgres",
        _dir: None,
        pg_name: Some(name),
    }
}

pub async fn db(backend: &str) -> TestDb {
    match backend {
        "postgres" => postgres_db().await,
        _ => sqlite_db(),
    }
}

fn uuid_like() -> String {
    let bytes: [u8; 8] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The server, in this process, on an ephemeral loopback port.
pub struct TestApp {
    pub addr: SocketAddr,
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
    pub db: TestDb,
}

pub async fn spawn_app(db: TestDb) -> TestApp {
    spawn_app_with(db, None).await
}

pub async fn spawn_app_with(db: TestDb, token: Option<&str>) -> TestApp {
    spawn_app_configured(db, |config| config.token = token.map(str::to_string)).await
}

/// The server in this process with its configuration changed by `configure`.
pub async fn spawn_app_configured(
    db: TestDb,
    configure: impl FnOnce(&mut ServerConfig),
) -> TestApp {
    let mut config = ServerConfig::new(db.url.clone(), "127.0.0.1:0".parse().expect("addr"));
    configure(&mut config);
    let token = config.token.clone();
    let app = App::build(config).await.expect("server starts");
    let addr = app.addr();
    tokio::spawn(app.run());
    TestApp {
        addr,
        base: format!("http://{addr}"),
        http: http(),
        token,
        db,
    }
}

pub struct Response {
    pub status: StatusCode,
    pub body: Value,
}

impl TestApp {
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        call(
            &self.http,
            &self.base,
            self.token.as_deref(),
            method,
            path,
            body,
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Response {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Response {
        self.call(Method::POST, path, Some(body)).await
    }

    /// Create a study and return its id; panics unless 201.
    pub async fn create_study(&self, spec: Value) -> i64 {
        let r = self.post("/v1/studies", spec).await;
        assert_eq!(r.status, StatusCode::CREATED, "create study: {}", r.body);
        r.body["id"].as_i64().expect("study id")
    }

    /// Create a study and suggest one trial of it: (study id, trial id).
    pub async fn study_with_active_trial(&self, spec: Value) -> (i64, i64) {
        let study = self.create_study(spec).await;
        let suggested = self
            .post(&format!("/v1/studies/{study}/suggest"), json!({"count": 1}))
            .await;
        assert_eq!(suggested.status, StatusCode::OK, "{:?}", suggested.body);
        let trial = suggested.body["trials"][0]["id"]
            .as_i64()
            .expect("trial id");
        (study, trial)
    }
}

/// Poll `check` every 50 ms until it gives `Ok`, failing after `limit` with `what` and the
/// last `Err` it gave (what was seen instead).
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) => assert!(
                start.elapsed() < limit,
                "{what} not within {limit:?}: {seen}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl TestApp {
    /// Wait until the study is in `want`; returns the study.
    pub async fn wait_for_state(&self, id: i64, want: &str, limit: Duration) -> Value {
        eventually(&format!("study {id} {want}"), limit, || async move {
            let s = self.get(&format!("/v1/studies/{id}")).await.body;
            if s["state"] == want {
                Ok(s)
            } else {
                Err(s.to_string())
            }
        })
        .await
    }

    /// Wait until `n` trials of the study have failed as cancelled by its stop.
    pub async fn wait_for_cancelled_trials(&self, id: i64, n: usize, limit: Duration) {
        let failed = eventually("trials cancelled by the stop", limit, || async move {
            let failed = self
                .get(&format!("/v1/studies/{id}/trials?state=failed"))
                .await
                .body;
            let count = failed["trials"].as_array().map_or(0, Vec::len);
            if count == n {
                Ok(failed)
            } else {
                Err(failed.to_string())
            }
        })
        .await;
        for t in failed["trials"].as_array().into_iter().flatten() {
            assert_eq!(t["fail_reason"], "cancelled: the study was stopped", "{t}");
        }
    }
}

pub async fn call(
    http: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Response {
    let mut request = http.request(method, format!("{base}{path}"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let text = response.text().await.expect("body read");
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Response { status, body }
}

/// A sample of a server's `/metrics`: the value of the line that starts with `series`
/// (name and labels), 0 while the server has no such line.
pub async fn metric_sample(base: &str, token: Option<&str>, series: &str) -> f64 {
    let mut request = http().get(format!("{base}/metrics"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let text = request
        .send()
        .await
        .expect("metrics answered")
        .text()
        .await
        .expect("metrics read");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Wait until every replica at `bases` sees `n` live replicas (`augur_replicas_live`; each
/// renews its lease and reads the others' every 2 s).
pub async fn until_replicas_live(bases: &[&str], token: Option<&str>, n: f64) {
    eventually(
        "replicas see each other",
        Duration::from_secs(15),
        || async {
            for base in bases {
                let live = metric_sample(base, token, "augur_replicas_live").await;
                if live != n {
                    return Err(format!("{base} sees {live} live replicas"));
                }
            }
            Ok(())
        },
    )
    .await;
}

/// A small spec with every parameter type and a conditional child.
pub fn spec(algorithm: &str, max_trials: i64, parallel_trials: i64) -> Value {
    json!({
        "name": format!("{algorithm}-test"),
        "algorithm": algorithm,
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [
            {"id": "lr", "type": "double", "min": 0.0001, "max": 1.0, "scale": "log"},
            {"id": "layers", "type": "integer", "min": 1, "max": 8},
            {"id": "batch", "type": "discrete", "values": [16, 32, 64, 128]},
            {"id": "kernel", "type": "categorical", "values": ["rbf", "poly"],
             "children": [{"when": ["poly"], "parameters": [{"id": "degree", "type": "integer", "min": 2, "max": 5}]}]}
        ],
        "max_trials": max_trials,
        "parallel_trials": parallel_trials,
        "seed": 7
    })
}

/// The smallest spec: random search over one double `x` in [0, 1], for tests about anything
/// but the search space; `metric` is `(id, goal)`. Change other fields with `spec["…"] = …`.
pub fn x_spec(
    name: &str,
    metric: (&str, &str),
    max_trials: i64,
    parallel_trials: i64,
    seed: i64,
) -> Value {
    json!({
        "name": name, "algorithm": "random",
        "metrics": [{"id": metric.0, "goal": metric.1}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": max_trials, "parallel_trials": parallel_trials, "seed": seed
    })
}

/// The `augur` binary that cargo built for these tests.
pub fn augur_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_augur"))
}

/// A real `augur serve` process; killed when dropped.
pub struct ServerProcess {
    pub child: Child,
    pub base: String,
}

impl ServerProcess {
    pub fn start(database_url: &str, port: u16) -> ServerProcess {
        Self::start_with(database_url, port, &[])
    }

    /// `augur serve` with more arguments (`--no-dispatch`, …).
    pub fn start_with(database_url: &str, port: u16, more: &[&str]) -> ServerProcess {
        let child = Command::new(augur_bin())
            .args([
                "serve",
                "--database-url",
                database_url,
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .args(more)
            .env("AUGUR_LOG", "warn")
            .env_remove("AUGUR_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn augur serve");
        ServerProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Wait until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        let http = http();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = http.get(format!("{}/readyz", self.base)).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("augur serve at {} did not become ready", self.base);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child process that is killed and reaped when dropped, so that a test that panics
/// leaves nothing running: a leftover process holding the test's inherited stderr would
/// also keep `cargo test | tee` (the test command) waiting for it.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// Wait for the process to end, on a blocking thread.
    pub async fn wait(mut self) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || self.0.wait())
            .await
            .expect("join")
            .expect("wait")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Both fail harmlessly once the process has been waited for.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Every process id in /proc.
pub fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process's state letter and process group, from `/proc/PID/stat` ("pid (comm) state
/// ppid pgrp …", where comm may hold spaces and parentheses); `None` once it is gone.
pub fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((
        fields.first()?.chars().next()?,
        fields.get(2)?.parse().ok()?,
    ))
}

/// Whether the process exists and is not a zombie (dead for a test's purposes).
pub fn alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// Live processes whose process group is `pgid`, or whose pid is `pgid`.
pub fn alive_in_group(pgid: i32) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|&pid| {
            proc_stat(pid)
                .is_some_and(|(state, group)| state != 'Z' && (pid == pgid || group == pgid))
        })
        .collect()
}

/// One number from PostgreSQL's statistics views (`sql` selects a single bigint), read once
/// every backend has reported what it did: an idle backend reports within 10 s
/// (PGSTAT_IDLE_INTERVAL), so a test measuring work done by the server's pool waits that long.
pub async fn settled_pg_counter(admin: &mut sqlx::PgConnection, sql: &'static str) -> i64 {
    tokio::time::sleep(Duration::from_millis(11_000)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *admin)
        .await
        .expect("clear the statistics snapshot");
    let (n,): (i64,) = sqlx::query_as(sql)
        .fetch_one(&mut *admin)
        .await
        .expect("statistics");
    n
}

/// A trial command (for `trial_job.command`) that writes its whole environment to
/// `<AIP_MODEL_DIR>/env.bin` (NUL-separated) and reports `loss=0.5`. A plain shell: a
/// language runtime's launcher (a pyenv shim) would add variables of its own.
pub fn env_dump_command() -> Value {
    json!([
        "/bin/sh",
        "-c",
        "env -0 > \"$AIP_MODEL_DIR/env.bin\"; echo loss=0.5"
    ])
}

/// The environment `env_dump_command` wrote under `model_dir`, once it is there.
pub fn read_job_env(model_dir: &std::path::Path) -> Result<serde_json::Map<String, Value>, String> {
    let bytes = std::fs::read(model_dir.join("env.bin")).map_err(|e| e.to_string())?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let entry = String::from_utf8_lossy(entry);
            let (k, v) = entry.split_once('=')?;
            Some((k.to_string(), Value::String(v.to_string())))
        })
        .collect())
}

/// A job's environment leaks nothing of the server's (DESIGN §4): every variable the job
/// shares, with the same value, with the environment the server was started from (this test
/// process's, plus `server_env`) is on the allow-list or in `extra` (the spec's `env`,
/// pass-through names). Variables a job's own shell sets for itself (PWD, SHLVL, …) are no
/// leak. Augur's own variables must be there.
pub fn assert_clean_job_env(
    env: &serde_json::Map<String, Value>,
    server_env: &[(&str, &str)],
    extra: &[&str],
) {
    const INHERITED: [&str; 10] = [
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    ];
    const SET_BY_SHELL: [&str; 5] = ["PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME"];
    let servers = |k: &str| {
        server_env
            .iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
            .or_else(|| std::env::var(k).ok())
    };
    for (key, value) in env {
        let shared = servers(key).is_some_and(|v| Some(v.as_str()) == value.as_str());
        let allowed = INHERITED.contains(&key.as_str())
            || key.starts_with("LC_")
            || SET_BY_SHELL.contains(&key.as_str())
            || extra.contains(&key.as_str());
        assert!(!shared || allowed, "the job saw the server's {key}={value}");
    }
    for (key, _) in server_env {
        assert!(
            extra.contains(key) || !env.contains_key(*key),
            "the job saw {key}"
        );
    }
    assert_augur_job_env(env);
}

/// The variables Augur sets for every job (DESIGN §4) are there.
pub fn assert_augur_job_env(env: &serde_json::Map<String, Value>) {
    for key in [
        "PATH",
        "AUGUR_URL",
        "AUGUR_STUDY_ID",
        "AUGUR_TRIAL_ID",
        "AUGUR_TRIAL_TOKEN",
        "CLOUD_ML_TRIAL_ID",
        "CLOUD_ML_HP_METRIC_FILE",
        "AIP_MODEL_DIR",
        "AIP_CHECKPOINT_DIR",
        "AIP_TENSORBOARD_LOG_DIR",
    ] {
        assert!(env.contains_key(key), "the job lacks {key}: {env:?}");
    }
}

/// Trial jobs alive whose command line mentions `marker`, counted by process group: each
/// job runs in its own group, and `python3` may be a shim that briefly forks helpers.
pub fn processes_with(marker: &str) -> usize {
    let groups: std::collections::BTreeSet<i32> = pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .filter_map(|pid| proc_stat(pid).filter(|(state, _)| *state != 'Z'))
        .map(|(_, group)| group)
        .collect();
    groups.len()
}

/// A Python with the real `cloudml-hypertune` from PyPI, in a venv made once per checkout (by
/// one test at a time: two making the venv at once break it).
pub fn python_with_hypertune() -> PathBuf {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv");
    let python = venv.join("bin/python3");
    let ready = Command::new(&python)
        .args(["-c", "import hypertune"])
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 -m venv");
        assert!(made.success(), "could not create {}", venv.display());
        let pip = Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "-q",
                "-r",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/examples/hypertune/requirements.txt"
                ),
            ])
            .status()
            .expect("pip");
        assert!(pip.success(), "pip install cloudml-hypertune failed");
    }
    python
}

/// The container engine of this machine's Podman as `scripts/podman-setup.sh` sets it up
/// (installing it and building the base image on first use), and the base image's name.
pub fn podman() -> (augur::dispatch::container::ContainerEngine, String) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/podman-setup.sh");
    let out = Command::new(&script)
        .output()
        .expect("run scripts/podman-setup.sh");
    assert!(
        out.status.success(),
        "scripts/podman-setup.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let value = |key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("podman-setup printed no {key}: {text}"))
            .to_string()
    };
    let words =
        |key: &str| -> Vec<String> { value(key).split_whitespace().map(str::to_string).collect() };
    let engine = augur::dispatch::container::ContainerEngine {
        program: "podman".into(),
        global_args: words("AUGUR_PODMAN_GLOBAL_ARGS"),
        run_args: words("AUGUR_PODMAN_RUN_ARGS"),
    };
    (engine, value("AUGUR_BASE_IMAGE"))
}

/// Study `id`'s directory in `runs` (`study-<id>-<created>`: `model::StudyKey`), found by
/// its prefix; a path that does not exist while the study has made none.
pub fn study_dir(runs: &Path, id: i64) -> PathBuf {
    let prefix = format!("study-{id}-");
    std::fs::read_dir(runs)
        .ok()
        .and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|name| name.starts_with(&prefix))
        })
        .map(|name| runs.join(name))
        .unwrap_or_else(|| runs.join(format!("study-{id}-not-made-yet")))
}
