//! A database outage under load: PostgreSQL stopped and started again (down 12 s) while 16
//! ask/tell clients, a dispatched study and an `augur worker` keep a real `augur serve`
//! busy. Requests meanwhile
//! are answered `503` with `Retry-After` and code `unavailable`, never `500`; `/readyz` turns
//! not-ready and back; no acknowledged completion is lost; every study completes, the
//! dispatched one without a failed trial.
//!
//! The PostgreSQL is a throwaway cluster of the test's own (initdb in a temp dir, a port of
//! its own), so restarting it disturbs nobody else's tests on the shared server.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// A PostgreSQL cluster in a temp dir, run as the `postgres` user (initdb and pg_ctl refuse
/// root), stopped when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl Cluster {
    fn start() -> Cluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's binaries under /usr/lib/postgresql (scripts/start-postgres.sh installs them)")
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .filter(|p| p.join("pg_ctl").exists())
            .max()
            .expect("pg_ctl");
        let dir = tempfile::Builder::new()
            .prefix("augur-outage-pg")
            .tempdir()
            .expect("temp dir");
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(
            status.success(),
            "chown the cluster's directory to postgres"
        );
        let cluster = Cluster {
            dir,
            bin,
            port: common::free_port(),
        };
        cluster.as_postgres(
            "initdb",
            &["-D", &cluster.data(), "-A", "trust", "-U", "postgres", "-N"],
        );
        cluster.pg_ctl(&["start"]);
        cluster
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn as_postgres(&self, tool: &str, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        self.as_postgres_owned(tool, &args);
    }

    fn as_postgres_owned(&self, tool: &str, args: &[String]) {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(tool))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("runuser");
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl ACTION` on this cluster, waiting for it to finish.
    fn pg_ctl(&self, action: &[&str]) {
        let mut args: Vec<String> = vec![
            "-D".into(),
            self.data(),
            "-w".into(),
            "-t".into(),
            "60".into(),
            "-l".into(),
            self.dir.path().join("log").display().to_string(),
        ];
        args.extend(action.iter().map(|a| a.to_string()));
        if action.contains(&"start") || action.contains(&"restart") {
            args.push("-o".into());
            args.push(format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections=200",
                self.port,
                self.dir.path().display()
            ));
        }
        if action.contains(&"restart") || action.contains(&"stop") {
            args.extend(["-m".into(), "fast".into()]);
        }
        self.as_postgres_owned("pg_ctl", &args);
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

const ASK_TELL_TRIALS: i64 = 1500;
const CLIENTS: usize = 16;
/// Restart PostgreSQL once this many completions have been acknowledged: a few seconds in,
/// with every kind of client busy.
const RESTART_AFTER: usize = 300;
/// Each ask/tell client "trains" this long per trial.
const TRAIN: Duration = Duration::from_millis(20);
const DOWN_FOR: Duration = Duration::from_secs(12);
const DISPATCHED_TRIALS: i64 = 60;
const PULLED_TRIALS: i64 = 80;
const DEADLINE: Duration = Duration::from_secs(240);

/// Every answer the clients got, by status, and the acknowledged completions.
#[derive(Default)]
struct Seen {
    statuses: BTreeMap<u16, usize>,
    /// A 503 without `Retry-After` or without code `unavailable`.
    bad_503: Vec<String>,
    completed: BTreeSet<i64>,
    connection_errors: usize,
}

/// `POST path body`, again after a 503 (waiting `Retry-After`) or a dropped connection,
/// until another answer comes; every answer is recorded.
async fn post_until_answered(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: &Value,
    seen: &Mutex<Seen>,
) -> (StatusCode, Value) {
    loop {
        match http.post(format!("{base}{path}")).json(body).send().await {
            Ok(response) => {
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let body: Value = response.json().await.unwrap_or(Value::Null);
                let mut s = seen.lock().await;
                *s.statuses.entry(status.as_u16()).or_default() += 1;
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    if retry_after.is_none() || body["error"]["code"] != "unavailable" {
                        s.bad_503.push(body.to_string());
                    }
                    drop(s);
                    tokio::time::sleep(Duration::from_secs(retry_after.unwrap_or(1))).await;
                    continue;
                }
                return (status, body);
            }
            Err(_) => {
                seen.lock().await.connection_errors += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn ask_tell_client(
    http: reqwest::Client,
    base: String,
    study: i64,
    client: usize,
    seen: Arc<Mutex<Seen>>,
    done: Arc<AtomicUsize>,
) {
    let started = Instant::now();
    while started.elapsed() < DEADLINE {
        let (status, answer) = post_until_answered(
            &http,
            &base,
            &format!("/v1/studies/{study}/suggest"),
            &json!({"count": 1, "client_id": format!("c{client}")}),
            &seen,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "suggest: {answer}");
        tokio::time::sleep(TRAIN).await;
        let Some(trial) = answer["trials"][0]["id"].as_i64() else {
            if answer["study_state"] == "active" {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return;
        };
        let (status, answer) = post_until_answered(
            &http,
            &base,
            &format!("/v1/studies/{study}/trials/{trial}/complete"),
            &json!({"metrics": {"accuracy": (trial % 10) as f64 / 10.0}}),
            &seen,
        )
        .await;
        // 409: completed by this client's earlier attempt, whose answer was lost.
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "complete {trial}: {status} {answer}"
        );
        if status == StatusCode::OK {
            seen.lock().await.completed.insert(trial);
            done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn spec(name: &str, max_trials: i64, parallel: i64) -> Value {
    json!({
        "name": name, "algorithm": "random",
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": max_trials, "parallel_trials": parallel, "seed": 3
    })
}

async fn study_state(http: &reqwest::Client, base: &str, study: i64) -> Value {
    http.get(format!("{base}/v1/studies/{study}"))
        .send()
        .await
        .expect("get study")
        .json()
        .await
        .expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_under_load_answers_503_and_loses_nothing() {
    let cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .expect("join");
    let admin = cluster.url("postgres");
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&admin).await.expect("connect");
        sqlx::query("CREATE DATABASE augur")
            .execute(&mut conn)
            .await
            .expect("create database");
    }
    let work = tempfile::tempdir().expect("dir");
    let port = common::free_port();
    let server = common::ServerProcess::start(&cluster.url("augur"), port);
    server.wait_ready().await;
    let base = server.base.clone();
    let http = common::http();

    let create = |spec: Value| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .post(format!("{base}/v1/studies"))
                .json(&spec)
                .send()
                .await
                .expect("create");
            assert_eq!(r.status(), StatusCode::CREATED);
            r.json::<Value>().await.expect("json")["id"]
                .as_i64()
                .expect("id")
        }
    };
    let ask_tell = create(spec("ask-tell", ASK_TELL_TRIALS, 16)).await;
    let mut dispatched_spec = spec("dispatched", DISPATCHED_TRIALS, 3);
    dispatched_spec["trial_job"] = json!({
        "command": ["/bin/sh", "-c", "sleep 0.3; echo accuracy=0.5"],
        "output_dir": work.path().join("dispatched").display().to_string(),
        "max_retries": 0
    });
    let dispatched = create(dispatched_spec).await;
    let pulled = create(spec("pulled", PULLED_TRIALS, 2)).await;
    let script = work.path().join("trial.sh");
    std::fs::write(&script, "sleep 0.3\necho accuracy=0.7\n").expect("script");
    let mut worker = Command::new(common::augur_bin())
        .args(["worker", "--url", &base, "--study", &pulled.to_string()])
        .args(["--slots", "2", "--client-id", "outage", "--output-dir"])
        .arg(work.path().join("pulled"))
        .args(["--", "/bin/sh"])
        .arg(&script)
        .env_remove("AUGUR_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("worker");

    // Readiness, every 50 ms, until the end.
    let watching = Arc::new(AtomicBool::new(true));
    let readiness = {
        let (http, base, watching) = (http.clone(), base.clone(), watching.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while watching.load(Ordering::SeqCst) {
                let status = match http.get(format!("{base}/readyz")).send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 0,
                };
                if seen.last() != Some(&status) {
                    seen.push(status);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            seen
        })
    };

    let seen = Arc::new(Mutex::new(Seen::default()));
    let done = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..CLIENTS {
        clients.spawn(ask_tell_client(
            http.clone(),
            base.clone(),
            ask_tell,
            client,
            seen.clone(),
            done.clone(),
        ));
    }
    let started = Instant::now();
    while done.load(Ordering::SeqCst) < RESTART_AFTER {
        assert!(
            started.elapsed() < DEADLINE,
            "no progress before the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restarted_at = done.load(Ordering::SeqCst);
    let restart_began = started.elapsed();
    // Down for 12 s, as a restart with recovery or a failover can be: longer than the pool
    // waits for a connection (10 s), so every kind of client meets a 503 or a failed report,
    // not only a slow answer.
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.pg_ctl(&["stop"]);
        std::thread::sleep(DOWN_FOR);
        cluster.pg_ctl(&["start"]);
        cluster
    })
    .await
    .expect("restart");
    let restart_took = started.elapsed() - restart_began;
    while let Some(joined) = clients.join_next().await {
        joined.expect("client");
    }
    let worker_status = tokio::task::spawn_blocking(move || worker.wait())
        .await
        .expect("join")
        .expect("worker");
    let study = common::eventually("the dispatched study completes", DEADLINE, || {
        let (http, base) = (&http, &base);
        async move {
            let s = study_state(http, base, dispatched).await;
            if s["state"] == "completed" {
                Ok(s)
            } else {
                Err(s.to_string())
            }
        }
    })
    .await;
    watching.store(false, Ordering::SeqCst);
    let ready = readiness.await.expect("readiness");
    let seen = seen.lock().await;

    let statuses = format!("{:?}", seen.statuses);
    assert!(
        !seen.statuses.keys().any(|s| *s >= 500 && *s != 503),
        "answers by status {statuses} (restart after {restarted_at} completions)"
    );
    assert!(seen.bad_503.is_empty(), "{:?}", seen.bad_503);
    assert!(
        ready.contains(&503) && ready.last() == Some(&200),
        "/readyz went {ready:?}"
    );
    // Nothing acknowledged was lost, and the study finished exactly.
    let ask_tell_study = study_state(&http, &base, ask_tell).await;
    assert_eq!(ask_tell_study["state"], "completed", "{ask_tell_study}");
    assert_eq!(ask_tell_study["trial_counts"]["total"], ASK_TELL_TRIALS);
    let mut completed = BTreeSet::new();
    let mut token: Option<String> = None;
    loop {
        let mut path =
            format!("{base}/v1/studies/{ask_tell}/trials?state=completed&page_size=1000");
        if let Some(t) = &token {
            path.push_str(&format!("&page_token={t}"));
        }
        let page: Value = http
            .get(path)
            .send()
            .await
            .expect("trials")
            .json()
            .await
            .expect("json");
        for t in page["trials"].as_array().into_iter().flatten() {
            completed.insert(t["id"].as_i64().expect("id"));
        }
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let lost: Vec<&i64> = seen.completed.difference(&completed).collect();
    assert!(lost.is_empty(), "acknowledged, then lost: {lost:?}");
    // The dispatched study rode it out: no trial failed for the outage.
    assert_eq!(study["trial_counts"]["failed"], 0, "{study}");
    assert_eq!(
        study["trial_counts"]["completed"], DISPATCHED_TRIALS,
        "{study}"
    );
    // The worker retried with backoff and finished its study.
    assert!(worker_status.success(), "augur worker failed");
    let pulled_study = study_state(&http, &base, pulled).await;
    assert_eq!(pulled_study["state"], "completed", "{pulled_study}");
    assert_eq!(
        pulled_study["trial_counts"]["completed"], PULLED_TRIALS,
        "{pulled_study}"
    );
    eprintln!(
        "outage: restart at {restart_began:?} (after {restarted_at} completions) took \
         {restart_took:?}; answers {statuses}, {} dropped connections, readiness {ready:?}, \
         all done at {:?}",
        seen.connection_errors,
        started.elapsed()
    );
    drop(server);
    drop(cluster);
}
