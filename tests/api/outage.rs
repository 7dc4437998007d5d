//! A database outage under load: PostgreSQL stopped and started again (down 12 s) while 16
//! ask/tell clients, a dispatched study and an `augur worker` keep a real `augur serve`
//! busy. Requests meanwhile
//! are answered `503` with `Retry-After` and code `unavailable` (or, for a change caught in
//! its commit, `500` with code `unanswered`), never another `5xx`; `/readyz` turns
//! not-ready and back; no acknowledged completion is lost; every study completes, the
//! dispatched one without a failed trial.
//!
//! The PostgreSQL is a throwaway cluster of the test's own (initdb in a temp dir, a port of
//! its own), so restarting it disturbs nobody else's tests on the shared server.

use crate::common::{self, Relay, routes};
use crate::support::{worker_command, worker_log};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
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
    /// 500s with code `unanswered` (counted in `statuses` too).
    unanswered: usize,
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
                // A change caught in its commit: sent again, as a client would these
                // (suggest with a client id hands out the same trials; complete answers 409).
                if status == StatusCode::INTERNAL_SERVER_ERROR
                    && body["error"]["code"] == "unanswered"
                {
                    s.unanswered += 1;
                    drop(s);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
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
            &routes::suggest(study),
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
            &routes::trial_complete(study, trial),
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
    common::x_spec(name, ("accuracy", "maximize"), max_trials, parallel, 3)
}

async fn study_state(http: &reqwest::Client, base: &str, study: i64) -> Value {
    http.get(format!("{base}{}", routes::study(study)))
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
    let worker = common::KillOnDrop(
        worker_command(
            &base,
            pulled,
            2,
            "outage",
            &work.path().join("pulled"),
            &script,
        )
        .stderr(Stdio::inherit())
        .spawn()
        .expect("worker"),
    );

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
    let worker_status = worker.wait().await;
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
        !seen
            .statuses
            .iter()
            .any(|(s, n)| *s >= 500 && *s != 503 && !(*s == 500 && *n == seen.unanswered)),
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
        let mut path = format!(
            "{base}{}?state=completed&page_size=1000",
            routes::trials(ask_tell)
        );
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

/// A change committed just before the database went out of reach is answered `500` with
/// code `unanswered`, never `503`: a client sends a request answered 503 again (it says
/// nothing was done), and a completion sent again is refused (409), a trial added again is
/// added twice. The outage is made on the shared server: the app connects as a role of its
/// own, whose connections are cut and then limited to one, which the completion's commit
/// takes; reading the trial back after the commit finds no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_committed_before_an_outage_is_not_answered_503() {
    use sqlx::Connection;
    let db = common::postgres_db().await;
    let mut admin = sqlx::PgConnection::connect(&db.url).await.expect("admin");
    let role = format!("{}_app", db.url.rsplit('/').next().expect("database name"));
    let run = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
    run(format!("CREATE ROLE {role} LOGIN PASSWORD 'app'"))
        .execute(&mut admin)
        .await
        .expect("create role");
    run(format!("GRANT ALL ON SCHEMA public TO {role}"))
        .execute(&mut admin)
        .await
        .expect("grant");
    let _drop_role = DropRole(role.clone());
    let (_, host_and_db) = db.url.split_once('@').expect("user@host in the URL");
    let app_url = format!("postgres://{role}:app@{host_and_db}");
    // No dispatcher: nothing but this test's requests may take the one connection.
    let app = common::spawn_app_configured(db, |c| {
        c.database_url = app_url;
        c.dispatch = false;
    })
    .await;

    let (study, trial) = app
        .study_with_active_trial(common::spec("random", 10, 1))
        .await;

    // Cut the app's connections; from now on it may hold one.
    run(format!("ALTER ROLE {role} CONNECTION LIMIT 1"))
        .execute(&mut admin)
        .await
        .expect("limit");
    let cut =
        format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'");
    run(cut).execute(&mut admin).await.expect("terminate");
    let count = format!("SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'");
    eventually_count(&app.db.url, count, 0).await;

    let answer = app
        .post(
            &routes::trial_complete(study, trial),
            json!({"metrics": {"accuracy": 0.9}}),
        )
        .await;
    let state: String =
        sqlx::query_scalar("SELECT state FROM trials WHERE study_id = $1 AND id = $2")
            .bind(study)
            .bind(trial)
            .fetch_one(&mut admin)
            .await
            .expect("trial row");
    assert_eq!(state, "completed", "the commit went through");
    assert_unanswered(&answer, "was applied");

    // Connections back: the trial reads as completed, and sending the completion again is
    // refused, as a client reading the 500 is told to expect.
    run(format!("ALTER ROLE {role} CONNECTION LIMIT -1"))
        .execute(&mut admin)
        .await
        .expect("unlimit");
    let read = app.get(&routes::trial(study, trial)).await;
    assert_eq!(read.body["state"], "completed", "{:?}", read.body);
    let again = app
        .post(
            &routes::trial_complete(study, trial),
            json!({"metrics": {"accuracy": 0.9}}),
        )
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{:?}", again.body);
}

/// A completion whose commit went through is answered with the trial even while every
/// read connection is taken by requests that wait: the answer's read is finishing work
/// already done, and must not queue behind new work (an overloaded server answered such
/// completions `500` `unanswered` after the read pool's 10 s wait, though they were
/// applied; the client then had to read the trial back). Here the reads wait on a lock the
/// test holds on the audit trail, which neither the commit nor the answer touches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_is_answered_while_every_read_connection_waits() {
    use sqlx::Connection;
    let db = common::postgres_db().await;
    let app = common::spawn_app_configured(db, |c| c.dispatch = false).await;
    let (study, trial) = app
        .study_with_active_trial(common::spec("random", 10, 1))
        .await;

    let mut admin = sqlx::PgConnection::connect(&app.db.url)
        .await
        .expect("admin");
    sqlx::query("BEGIN")
        .execute(&mut admin)
        .await
        .expect("begin");
    sqlx::query("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE")
        .execute(&mut admin)
        .await
        .expect("lock");
    // More waiting readers than the read pool has connections (32).
    let readers: Vec<_> = (0..40)
        .map(|_| {
            let (http, base) = (app.http.clone(), app.base.clone());
            tokio::spawn(async move {
                common::call(&http, &base, None, Method::GET, "/v1/audit", None).await
            })
        })
        .collect();
    let waiting = "SELECT LEAST(count(*), 32) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    eventually_count(&app.db.url, waiting.to_string(), 32).await;

    let answer = app
        .post(
            &routes::trial_complete(study, trial),
            json!({"metrics": {"accuracy": 0.9}}),
        )
        .await;
    sqlx::query("COMMIT")
        .execute(&mut admin)
        .await
        .expect("unlock");
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["state"], "completed", "{}", answer.body);
    assert_eq!(
        answer.body["final_measurement"]["metrics"]["accuracy"], 0.9,
        "{}",
        answer.body
    );
    // The readers were kept waiting, not failed: each is answered once the lock is gone,
    // or told 503 (nothing was done) if it never got a connection.
    for reader in readers {
        let r = reader.await.expect("reader task");
        assert!(
            r.status == StatusCode::OK || r.status == StatusCode::SERVICE_UNAVAILABLE,
            "{} {}",
            r.status,
            r.body
        );
    }
}

/// Drops a test's role once its database is gone (declared before the app, so dropped
/// after it, pass or fail).
struct DropRole(String);

impl Drop for DropRole {
    fn drop(&mut self) {
        common::admin_sql_from_drop(format!("DROP ROLE IF EXISTS {}", self.0));
    }
}

/// A single-statement change (creating or deleting a study, creating or revoking a token)
/// sent when the database connection broke is answered `500` with code `unanswered`, not
/// `503`: PostgreSQL may still run the statement (here it does), and a client told 503
/// sends it again (a second study, a token name "taken" whose secret it never saw). Each
/// statement waits in a trigger (which runs once the whole statement and its commit were
/// sent; a table lock would stop it at parsing, before anything is sent) while the relay is
/// cut; the server's backend then takes the lock and commits without its client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_sent_as_the_connection_breaks_is_answered_unanswered() {
    let mut spec = common::spec("random", 5, 1);
    spec["name"] = json!("sent-as-the-connection-breaks");
    let cases = [
        (
            "BEFORE INSERT ON studies",
            Method::POST,
            "/v1/studies",
            Some(spec),
            "SELECT count(*) FROM studies WHERE name = 'sent-as-the-connection-breaks'",
        ),
        (
            "BEFORE DELETE ON studies",
            Method::DELETE,
            "/v1/studies/{study}",
            None,
            "SELECT 1 - count(*) FROM studies WHERE id = {study}",
        ),
        (
            "BEFORE INSERT ON api_tokens",
            Method::POST,
            "/v1/tokens",
            Some(json!({"name": "cut", "role": "reader"})),
            "SELECT count(*) FROM api_tokens WHERE name = 'cut'",
        ),
        (
            "BEFORE DELETE ON api_tokens",
            Method::DELETE,
            "/v1/tokens/kept",
            None,
            "SELECT 1 - count(*) FROM api_tokens WHERE name = 'kept'",
        ),
    ];
    for (trigger, method, path, body, applied) in cases {
        let mut relayed = Relayed::start().await;
        let study = relayed.app.create_study(common::spec("random", 5, 1)).await;
        relayed
            .admin_sql(
                "INSERT INTO api_tokens (name, token_hash, role, created_at) \
                 VALUES ('kept', 'not-a-real-hash', 'reader', now())",
            )
            .await;
        relayed
            .admin_sql(&format!(
                "CREATE TRIGGER wait_for_test {trigger} \
                 FOR EACH ROW EXECUTE FUNCTION wait_for_test()"
            ))
            .await;
        relayed.hold_lock().await;
        let path = path.replace("{study}", &study.to_string());
        let statement = if method == Method::POST {
            "INSERT INTO%"
        } else {
            "DELETE FROM%"
        };
        let answer = relayed.cut_during(statement, method, &path, body).await;
        relayed
            .eventually_one(applied.replace("{study}", &study.to_string()))
            .await;
        assert_unanswered(&answer, "unknown");
    }
}

/// A completion whose `COMMIT` was sent when the database connection broke is answered
/// `500` `unanswered` (its outcome unknown), and PostgreSQL commits it without its client:
/// the trial reads as completed and the completion sent again is refused. The commit waits
/// in a deferred trigger (run by `COMMIT`) while the relay is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_commit_is_cut_is_answered_unanswered() {
    let mut relayed = Relayed::start().await;
    let (study, trial) = relayed
        .app
        .study_with_active_trial(common::spec("random", 5, 1))
        .await;
    relayed
        .admin_sql(
            "CREATE CONSTRAINT TRIGGER wait_for_test AFTER INSERT OR UPDATE ON trials \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION wait_for_test()",
        )
        .await;
    relayed.hold_lock().await;
    let path = routes::trial_complete(study, trial);
    let answer = relayed
        .cut_during(
            "COMMIT%",
            Method::POST,
            &path,
            Some(json!({"metrics": {"accuracy": 0.9}})),
        )
        .await;
    relayed
        .eventually_one(format!(
            "SELECT count(*) FROM trials WHERE study_id = {study} AND id = {trial} \
             AND state = 'completed'"
        ))
        .await;
    assert_unanswered(&answer, "unknown");
    let again = relayed
        .app
        .post(&path, json!({"metrics": {"accuracy": 0.9}}))
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{:?}", again.body);
}

/// `augur worker` rides out a `500` `unanswered` deterministically: its trial's completion
/// is caught in its `COMMIT` (a deferred trigger waits while the relay is cut), PostgreSQL
/// commits it without the server, the worker sends it again, is told it is done (409), and
/// exits with its one-trial study complete: one trial, completed, no second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn augur_worker_sends_a_completion_again_after_unanswered_and_finishes() {
    let mut relayed = Relayed::start().await;
    let study = relayed.app.create_study(common::spec("random", 1, 1)).await;
    relayed
        .admin_sql(
            "CREATE CONSTRAINT TRIGGER wait_for_test AFTER UPDATE ON trials \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
             WHEN (NEW.state = 'completed') EXECUTE FUNCTION wait_for_test()",
        )
        .await;
    relayed.hold_lock().await;
    let work = tempfile::tempdir().expect("dir");
    let script = work.path().join("trial.sh");
    std::fs::write(&script, "echo accuracy=0.7\n").expect("script");
    let worker = worker_command(
        &relayed.app.base,
        study,
        1,
        "outage",
        &work.path().join("out"),
        &script,
    )
    .env("AUGUR_TOKEN", Relayed::TOKEN)
    .stderr(Stdio::piped())
    .spawn()
    .expect("worker");
    relayed.wait_for_lock("COMMIT%").await;
    relayed.relay.cut();
    relayed.release_lock().await;
    let log = worker_log(worker).await;
    assert!(
        log.contains("500 unanswered") && log.contains("trying again"),
        "the worker never met the 500 it was made to meet:\n{log}"
    );
    relayed
        .eventually_one(format!(
            "SELECT count(*) FROM trials WHERE study_id = {study} AND state = 'completed'"
        ))
        .await;
    relayed
        .eventually_one(format!(
            "SELECT count(*) FROM trials WHERE study_id = {study}"
        ))
        .await;
    let state = relayed.app.get(&routes::study(study)).await;
    assert_eq!(state.body["state"], "completed", "{:?}", state.body);
}

/// A 500 `unanswered` whose message `says` whether the change was applied or is unknown.
fn assert_unanswered(answer: &common::Response, says: &str) {
    assert_eq!(
        answer.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "a change that was applied answered as if nothing was done: {:?}",
        answer.body
    );
    assert_eq!(
        answer.body["error"]["code"], "unanswered",
        "{:?}",
        answer.body
    );
    let message = answer.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{message}");
}

/// An app (no dispatcher) whose database connections go through a [`Relay`], an admin
/// connection beside it, and a trigger function `wait_for_test()` that waits for the
/// advisory lock the admin connection takes with [`Relayed::hold_lock`].
struct Relayed {
    app: common::TestApp,
    relay: Relay,
    admin: sqlx::PgConnection,
}

impl Relayed {
    const LOCK: i64 = 4242;
    const TOKEN: &'static str = "relayed-admin-token";

    async fn start() -> Relayed {
        use sqlx::Connection;
        let db = common::postgres_db().await;
        let (credentials, rest) = db.url.split_once('@').expect("user@host in the URL");
        let (upstream, database) = rest.split_once('/').expect("host/database in the URL");
        let relay = Relay::start(upstream.to_string()).await;
        let app_url = format!("{credentials}@127.0.0.1:{}/{database}", relay.port);
        let admin = sqlx::PgConnection::connect(&db.url).await.expect("admin");
        // With a token: a test may add tokens, which closes an open server.
        let app = common::spawn_app_configured(db, |c| {
            c.database_url = app_url;
            c.dispatch = false;
            c.token = Some(Self::TOKEN.to_string());
        })
        .await;
        let mut relayed = Relayed { app, relay, admin };
        relayed
            .admin_sql(&format!(
                "CREATE FUNCTION wait_for_test() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN PERFORM pg_advisory_xact_lock({}); RETURN COALESCE(NEW, OLD); END $$",
                Self::LOCK
            ))
            .await;
        relayed
    }

    async fn admin_sql(&mut self, sql: &str) {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&mut self.admin)
            .await
            .expect(sql);
    }

    async fn hold_lock(&mut self) {
        self.admin_sql("BEGIN").await;
        self.admin_sql(&format!("SELECT pg_advisory_xact_lock({})", Self::LOCK))
            .await;
    }

    async fn release_lock(&mut self) {
        self.admin_sql("COMMIT").await;
    }

    /// `method path body` (with the lock held) until a statement like `statement` waits for
    /// the lock; then cut the connections, release the lock and give the answer.
    async fn cut_during(
        &mut self,
        statement: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> common::Response {
        let (http, base, token) = (
            common::http(),
            self.app.base.clone(),
            self.app.token.clone(),
        );
        let path = path.to_string();
        let request = tokio::spawn(async move {
            common::call(&http, &base, token.as_deref(), method, &path, body).await
        });
        self.wait_for_lock(statement).await;
        self.relay.cut();
        let answer = request.await.expect("request task");
        self.release_lock().await;
        answer
    }

    /// Until one statement like `query` waits for the test's lock in the test's database
    /// (other tests share the server).
    async fn wait_for_lock(&self, query: &str) {
        self.eventually_one(format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event = 'advisory' AND query ILIKE '{query}'"
        ))
        .await;
    }

    /// Until the count `sql` selects is 1.
    async fn eventually_one(&self, sql: String) {
        eventually_count(&self.app.db.url, sql, 1).await;
    }
}

/// Until the count `sql` selects (on a connection of its own to `url`) is `want`.
async fn eventually_count(url: &str, sql: String, want: i64) {
    use sqlx::Connection;
    common::eventually(&sql.clone(), Duration::from_secs(10), || {
        let (url, sql) = (url.to_string(), sql.clone());
        async move {
            let mut c = sqlx::PgConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(&mut c)
                .await
                .map_err(|e| e.to_string())?;
            if n == want {
                Ok(())
            } else {
                Err(format!("{n}"))
            }
        }
    })
    .await;
}
