//! The parallelism cap and the trial budget under real concurrency: many clients hammering
//! one study through `suggest` and `complete`, on two `augur serve` replicas sharing one
//! PostgreSQL database (and, second, one server on a SQLite file), while a monitor reads the
//! database directly and records the most unfinished trials it ever saw committed.

use crate::common::{self, routes};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use common::{ServerProcess, free_port};

/// The whole run gives up after this long.
const DEADLINE: Duration = Duration::from_secs(180);
/// Upper bound on requests one client sends, so that a stuck study cannot spin forever.
const MAX_REQUESTS_PER_CLIENT: usize = 20_000;

/// How hard a run hammers: `clients` workers, client `n` on study `n % studies`.
#[derive(Clone, Copy)]
struct Load {
    studies: usize,
    clients: usize,
    parallel: i64,
    max_trials: i64,
}

/// One study, 64 clients: the cap under the most contention.
const ONE_STUDY: Load = Load {
    studies: 1,
    clients: 64,
    parallel: 4,
    max_trials: 400,
};

/// A team's server: 100 studies at once, three clients each, so that commands of many
/// studies share transactions.
const MANY_STUDIES: Load = Load {
    studies: 100,
    clients: 300,
    parallel: 2,
    max_trials: 20,
};

/// The most unfinished trials of any one study, by study.
const UNFINISHED_SQL: &str = "SELECT study_id, count(*) FROM trials \
     WHERE state IN ('requested','active','stopping') GROUP BY study_id";

/// How the monitor reads the database behind the servers.
enum Monitor {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl Monitor {
    /// The most unfinished trials any one study has now.
    async fn most_unfinished(&self) -> Result<i64, sqlx::Error> {
        let rows: Vec<(i64, i64)> = match self {
            Monitor::Postgres(pool) => sqlx::query_as(UNFINISHED_SQL).fetch_all(pool).await?,
            Monitor::Sqlite(pool) => sqlx::query_as(UNFINISHED_SQL).fetch_all(pool).await?,
        };
        Ok(rows.iter().map(|(_, n)| *n).max().unwrap_or(0))
    }

    async fn trials(&self, study_id: i64) -> Vec<(i64, String)> {
        const SQL: &str = "SELECT id, state FROM trials WHERE study_id = $1 ORDER BY id";
        match self {
            Monitor::Postgres(pool) => sqlx::query_as(SQL)
                .bind(study_id)
                .fetch_all(pool)
                .await
                .expect("read trials"),
            Monitor::Sqlite(pool) => sqlx::query_as(SQL)
                .bind(study_id)
                .fetch_all(pool)
                .await
                .expect("read trials"),
        }
    }
}

/// What the clients saw, for the checks at the end.
#[derive(Default)]
struct Ledger {
    /// (study id, trial id) → how many times a suggest handed it out.
    handed: BTreeMap<(i64, i64), u32>,
    /// (study id, trial id) → how many completes were acknowledged with 200.
    completed: BTreeMap<(i64, i64), u32>,
    /// Unexpected answers, described.
    errors: Vec<String>,
}

/// POST `body` to `url` (`None`: GET it); an answer of 503 (the server overloaded: no
/// database connection within its timeout, so nothing was done) is sent again after the
/// Retry-After it asks for, as a real client does, up to a minute.
async fn send(
    http: &reqwest::Client,
    url: String,
    body: Option<&Value>,
) -> Result<(StatusCode, Value), String> {
    for _ in 0..60 {
        let request = match body {
            Some(body) => http.post(&url).json(body),
            None => http.get(&url),
        };
        let response = request.send().await.map_err(|e| {
            // The causes too: "error sending request" alone does not say what failed.
            let mut why = format!("{url}: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                why.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            why
        })?;
        let status = response.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        return Ok((status, body));
    }
    Err(format!("{url}: 503 for a minute"))
}

async fn post(
    http: &reqwest::Client,
    url: String,
    body: Value,
) -> Result<(StatusCode, Value), String> {
    send(http, url, Some(&body)).await
}

/// Whether an answer says a change was committed but its answer could not be read (500,
/// code `unanswered`: an overloaded server's read after the commit timed out).
fn unanswered(status: StatusCode, body: &Value) -> bool {
    status == StatusCode::INTERNAL_SERVER_ERROR && body["error"]["code"] == "unanswered"
}

/// One worker: suggest one trial, complete it, repeat until the study is completed.
async fn client(
    n: usize,
    base: String,
    study_id: i64,
    ledger: Arc<Mutex<Ledger>>,
    done: Arc<AtomicBool>,
) {
    let http = common::http();
    // Half the clients identify themselves, half do not: both paths must respect the cap.
    let mut request = json!({"count": 1});
    if n.is_multiple_of(2) {
        request["client_id"] = json!(format!("c{n}"));
    }
    for _ in 0..MAX_REQUESTS_PER_CLIENT {
        if done.load(Ordering::Relaxed) {
            return;
        }
        let (status, body) = match post(
            &http,
            format!("{base}{}", routes::suggest(study_id)),
            request.clone(),
        )
        .await
        {
            Ok(answer) => answer,
            Err(e) => {
                ledger.lock().await.errors.push(format!("client {n}: {e}"));
                return;
            }
        };
        if status != StatusCode::OK {
            ledger
                .lock()
                .await
                .errors
                .push(format!("client {n}: suggest answered {status}: {body}"));
            return;
        }
        let trials = body["trials"].as_array().cloned().unwrap_or_default();
        if trials.is_empty() {
            if body["study_state"] == "completed" {
                return;
            }
            // The cap is full: back off a little (not the advertised second, to keep load up).
            tokio::time::sleep(Duration::from_millis(2 + (n as u64 % 7))).await;
            continue;
        }
        for trial in trials {
            let Some(id) = trial["id"].as_i64() else {
                ledger
                    .lock()
                    .await
                    .errors
                    .push(format!("client {n}: trial without id: {trial}"));
                return;
            };
            *ledger
                .lock()
                .await
                .handed
                .entry((study_id, id))
                .or_default() += 1;
            let accuracy = (id as f64 * 0.618).fract();
            let url = format!("{base}{}", routes::trial_complete(study_id, id));
            let mut answer = post(&http, url, json!({"metrics": {"accuracy": accuracy}})).await;
            if let Ok((status, body)) = &answer
                && unanswered(*status, body)
            {
                // As the answer says: read the trial to see whether the completion was
                // applied (the ledger then checks it as any other).
                let trial = format!("{base}{}", routes::trial(study_id, id));
                answer = match send(&http, trial, None).await {
                    Ok((StatusCode::OK, t)) if t["state"] == "completed" => Ok((StatusCode::OK, t)),
                    Ok((status, t)) => Ok((status, json!({"read after unanswered": t}))),
                    Err(e) => Err(e),
                };
            }
            match answer {
                Ok((StatusCode::OK, _)) => {
                    *ledger
                        .lock()
                        .await
                        .completed
                        .entry((study_id, id))
                        .or_default() += 1
                }
                Ok((status, body)) => ledger.lock().await.errors.push(format!(
                    "client {n}: complete {id} answered {status}: {body}"
                )),
                Err(e) => {
                    ledger.lock().await.errors.push(format!("client {n}: {e}"));
                    return;
                }
            }
        }
    }
    ledger.lock().await.errors.push(format!(
        "client {n}: gave up after {MAX_REQUESTS_PER_CLIENT} requests"
    ));
}

/// Run `load`'s workers spread over `bases` against its studies until all complete, with a
/// monitor polling the database; then check the cap, the budget and every trial of each.
async fn hammer(bases: &[String], monitor: Monitor, load: Load) {
    let http = common::http();
    let spec = json!({
        "name": "concurrency",
        "algorithm": "random",
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [
            {"id": "lr", "type": "double", "min": 0.0001, "max": 1.0, "scale": "log"},
            {"id": "layers", "type": "integer", "min": 1, "max": 8},
            {"id": "kernel", "type": "categorical", "values": ["rbf", "poly"]}
        ],
        "max_trials": load.max_trials,
        "parallel_trials": load.parallel,
        "seed": 11
    });
    let mut study_ids = Vec::with_capacity(load.studies);
    for _ in 0..load.studies {
        let (status, study) = post(&http, format!("{}/v1/studies", bases[0]), spec.clone())
            .await
            .expect("create study");
        assert_eq!(status, StatusCode::CREATED, "create study: {study}");
        study_ids.push(study["id"].as_i64().expect("study id"));
    }

    let monitor = Arc::new(monitor);
    let done = Arc::new(AtomicBool::new(false));
    let max_seen = Arc::new(AtomicI64::new(0));
    let polls = Arc::new(AtomicI64::new(0));
    let monitor_task = {
        let (monitor, done, max_seen, polls) = (
            monitor.clone(),
            done.clone(),
            max_seen.clone(),
            polls.clone(),
        );
        tokio::spawn(async move {
            let deadline = Instant::now() + DEADLINE;
            while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                match monitor.most_unfinished().await {
                    Ok(n) => {
                        max_seen.fetch_max(n, Ordering::Relaxed);
                        polls.fetch_add(1, Ordering::Relaxed);
                    }
                    // SQLite may be briefly busy; the next poll will do.
                    Err(e) => eprintln!("monitor: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let started = Instant::now();
    let clients: Vec<_> = (0..load.clients)
        .map(|n| {
            // A study's clients take turns over the servers: every study meets both.
            let base = bases[(n / study_ids.len()) % bases.len()].clone();
            let study_id = study_ids[n % study_ids.len()];
            tokio::spawn(client(n, base, study_id, ledger.clone(), done.clone()))
        })
        .collect();
    let all = futures::future::join_all(clients);
    let finished = tokio::time::timeout(DEADLINE, all).await;
    done.store(true, Ordering::Relaxed);
    monitor_task.await.expect("monitor task");
    let Ok(finished) = finished else {
        // A client that stopped on an error leaves its trial unfinished, and its study can
        // then never complete: say what the clients were answered.
        panic!(
            "the studies did not complete within {DEADLINE:?} ({} polls); answers:\n{}",
            polls.load(Ordering::Relaxed),
            ledger.lock().await.errors.join("\n")
        )
    };
    for joined in finished {
        joined.expect("client task panicked");
    }
    eprintln!(
        "{} studies of {} trials by {} clients on {} server(s) in {:.1?}; monitor polled {} times, max unfinished {}",
        load.studies,
        load.max_trials,
        load.clients,
        bases.len(),
        started.elapsed(),
        polls.load(Ordering::Relaxed),
        max_seen.load(Ordering::Relaxed)
    );

    let ledger = ledger.lock().await;
    assert!(
        ledger.errors.is_empty(),
        "unexpected answers:\n{}",
        ledger.errors.join("\n")
    );
    assert!(polls.load(Ordering::Relaxed) > 10, "the monitor hardly ran");
    let max_seen = max_seen.load(Ordering::Relaxed);
    assert!(
        max_seen <= load.parallel,
        "{max_seen} unfinished trials of one study at once, cap {}",
        load.parallel
    );

    let expected: Vec<(i64, i64)> = study_ids
        .iter()
        .flat_map(|s| (1..=load.max_trials).map(move |t| (*s, t)))
        .collect();
    let handed_twice: Vec<_> = ledger.handed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        handed_twice.is_empty(),
        "trials handed out more than once: {handed_twice:?}"
    );
    assert_eq!(
        ledger.handed.keys().copied().collect::<Vec<_>>(),
        expected,
        "trials handed out"
    );
    let completed_twice: Vec<_> = ledger.completed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        completed_twice.is_empty(),
        "trials completed more than once: {completed_twice:?}"
    );
    assert_eq!(
        ledger.completed.keys().copied().collect::<Vec<_>>(),
        expected,
        "trials completed"
    );

    for &study_id in &study_ids {
        let stored = monitor.trials(study_id).await;
        assert_eq!(
            stored.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            (1..=load.max_trials).collect::<Vec<_>>(),
            "stored trial ids of study {study_id}"
        );
        let not_completed: Vec<_> = stored
            .iter()
            .filter(|(_, state)| state != "completed")
            .collect();
        assert!(
            not_completed.is_empty(),
            "trials of study {study_id} not completed: {not_completed:?}"
        );
        let response = http
            .get(format!(
                "{}{}",
                bases[bases.len() - 1],
                routes::study(study_id)
            ))
            .send()
            .await
            .expect("get study");
        assert_eq!(response.status(), StatusCode::OK);
        let study: Value = response.json().await.expect("study JSON");
        assert_eq!(study["state"], "completed", "study: {study}");
        // Counts kept by the batches, under contention, agree with the trials.
        assert_eq!(
            study["trial_counts"]["completed"],
            json!(load.max_trials),
            "{study}"
        );
        assert_eq!(study["trial_counts"]["total"], json!(load.max_trials));
    }
}

/// Two replicas on one PostgreSQL, started one after the other as a rolling deployment
/// would (the second once the first has migrated), and a monitor's pool.
/// With `routed`, each study's changes go to one of them (`--replica-url`); `more`: further
/// flags of both.
async fn two_replicas(
    db: &common::TestDb,
    routed: bool,
    more: &[&str],
) -> (ServerProcess, ServerProcess, Monitor) {
    let start = || {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let mut args = more.to_vec();
        if routed {
            args.extend(["--replica-url", url.as_str()]);
        }
        ServerProcess::start_with(&db.url, port, &args)
    };
    let first = start();
    first.wait_ready().await;
    let second = start();
    second.wait_ready().await;
    if routed {
        // Both must know of each other, or nothing is routed.
        common::eventually(
            "replicas see each other",
            Duration::from_secs(15),
            || async {
                for base in [&first.base, &second.base] {
                    if metric(base, "augur_replicas_live").await != 2.0 {
                        return Err(format!("{base} does not see two replicas yet"));
                    }
                }
                Ok(())
            },
        )
        .await;
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url)
        .await
        .expect("monitor connects");
    (first, second, Monitor::Postgres(pool))
}

/// Two replicas on one PostgreSQL never hand out more than `parallel_trials` at once nor
/// more than `max_trials` in all, and every trial is handed out and completed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_replicas_keep_the_cap_and_the_budget_under_64_clients() {
    let db = common::postgres_db().await;
    let (first, second, monitor) = two_replicas(&db, false, &[]).await;
    hammer(
        &[first.base.clone(), second.base.clone()],
        monitor,
        ONE_STUDY,
    )
    .await;
}

/// The same through replicas that route the study's changes to one of them: half the
/// clients' commands are forwarded, none is lost or served twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routed_replicas_keep_the_cap_and_the_budget_under_64_clients() {
    let db = common::postgres_db().await;
    let (first, second, monitor) = two_replicas(&db, true, &[]).await;
    let bases = [first.base.clone(), second.base.clone()];
    hammer(&bases, monitor, ONE_STUDY).await;
    assert_routed(&bases).await;
}

/// The same for 100 studies at once through two routing replicas: commands of many studies
/// share transactions on each replica, a study's clients are spread over both, and the
/// changes of a study whose commands overlap go to its owner. Each replica has one commit
/// lane (`--commit-lanes 1`, as for replicas sharing a machine), so a lane waiting for a
/// study the other replica holds has no second lane to go on with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routed_replicas_keep_every_cap_of_100_studies() {
    let db = common::postgres_db().await;
    let (first, second, monitor) = two_replicas(&db, true, &["--commit-lanes", "1"]).await;
    let bases = [first.base.clone(), second.base.clone()];
    hammer(&bases, monitor, MANY_STUDIES).await;
    assert_routed(&bases).await;
}

/// Requests were forwarded, and every forward reached its owner.
async fn assert_routed(bases: &[String]) {
    let mut forwarded = 0.0;
    for base in bases {
        forwarded += metric(
            base,
            "augur_forwarded_requests_total{outcome=\"forwarded\"}",
        )
        .await;
        for failed in ["served_here", "lost"] {
            let series = format!("augur_forwarded_requests_total{{outcome=\"{failed}\"}}");
            assert_eq!(metric(base, &series).await, 0.0, "{base}: {series}");
        }
    }
    assert!(forwarded > 0.0, "no request was forwarded");
}

async fn metric(base: &str, series: &str) -> f64 {
    common::metric_sample(base, None, series).await
}

/// A SQLite file behind one server process, and a read-only monitor on it.
async fn sqlite_server(db: &common::TestDb) -> (ServerProcess, Monitor) {
    let server = ServerProcess::start(&db.url, free_port());
    server.wait_ready().await;
    let options = db
        .url
        .parse::<sqlx::sqlite::SqliteConnectOptions>()
        .expect("SQLite URL")
        .read_only(true)
        .busy_timeout(Duration::from_secs(5));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("monitor opens the SQLite file");
    (server, Monitor::Sqlite(pool))
}

/// The same on a SQLite file behind one server process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_server_keeps_the_cap_and_the_budget_under_64_clients() {
    let db = common::sqlite_db();
    let (server, monitor) = sqlite_server(&db).await;
    hammer(std::slice::from_ref(&server.base), monitor, ONE_STUDY).await;
}

/// And for 100 studies on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_server_keeps_every_cap_of_100_studies() {
    let db = common::sqlite_db();
    let (server, monitor) = sqlite_server(&db).await;
    hammer(std::slice::from_ref(&server.base), monitor, MANY_STUDIES).await;
}

on_both_backends!(one_studys_failure_is_its_own_in_a_shared_transaction);

/// Commands of many studies share a transaction; a study whose batch fails (here: its stored
/// spec no longer parses) fails alone, and the other studies' commands still commit.
async fn one_studys_failure_is_its_own_in_a_shared_transaction(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let broken = app.create_study(common::spec("random", 50, 50)).await;
    let mut others = Vec::new();
    for _ in 0..15 {
        others.push(app.create_study(common::spec("random", 50, 50)).await);
    }
    // Its fixed configuration is now cached, so its commands reach the commit lanes.
    let first = app
        .post(&routes::suggest(broken), json!({"count": 1}))
        .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let corrupt = "UPDATE studies SET spec = '{\"broken\": true}' WHERE id = $1";
    if backend == "postgres" {
        let pool = sqlx::PgPool::connect(&app.db.url).await.expect("connect");
        sqlx::query(corrupt)
            .bind(broken)
            .execute(&pool)
            .await
            .expect("corrupt");
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url).await.expect("open");
        sqlx::query(corrupt)
            .bind(broken)
            .execute(&pool)
            .await
            .expect("corrupt");
    }
    for _round in 0..3 {
        let asks = std::iter::once(broken)
            .chain(others.iter().copied())
            .flat_map(|study| std::iter::repeat_n(study, 3))
            .map(|study| {
                let app = &app;
                async move {
                    let r = app.post(&routes::suggest(study), json!({"count": 1})).await;
                    (study, r)
                }
            });
        for (study, r) in futures::future::join_all(asks).await {
            if study == broken {
                assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.body);
            } else {
                assert_eq!(r.status, StatusCode::OK, "study {study}: {}", r.body);
                assert_eq!(r.body["trials"].as_array().map(Vec::len), Some(1));
            }
        }
    }
}

/// The same when a study's writes fail at the database (here a trigger refuses its
/// measurements): on PostgreSQL every study's writes go as one statement at the end, and a
/// refusal there must still be the one study's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_study_whose_writes_fail_fails_alone_on_postgres() {
    let app = common::spawn_app(common::postgres_db().await).await;
    let mut studies = Vec::new();
    for _ in 0..16 {
        let id = app.create_study(common::spec("random", 50, 50)).await;
        let r = app.post(&routes::suggest(id), json!({"count": 1})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        studies.push(id);
    }
    let broken = studies[0];
    let pool = sqlx::PgPool::connect(&app.db.url).await.expect("connect");
    let refuse = format!(
        "CREATE FUNCTION refuse_study() RETURNS trigger AS $$ BEGIN \
         IF NEW.study_id = {broken} THEN RAISE EXCEPTION 'refused by the test'; END IF; \
         RETURN NEW; END $$ LANGUAGE plpgsql"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(refuse))
        .execute(&pool)
        .await
        .expect("function");
    sqlx::raw_sql(
        "CREATE TRIGGER refuse_study BEFORE INSERT ON measurements \
         FOR EACH ROW EXECUTE FUNCTION refuse_study()",
    )
    .execute(&pool)
    .await
    .expect("trigger");
    // Many reports in flight at once, so that the broken study's share transactions with
    // the others'.
    for round in 0..3 {
        let reports = studies
            .iter()
            .flat_map(|&study| (0..5).map(move |k| (study, round * 10 + k)));
        let reports = reports.map(|(study, step)| {
            let app = &app;
            async move {
                let r = app
                    .post(
                        &routes::trial_measurements(study, 1),
                        json!({"step": step, "metrics": {"accuracy": 0.5}}),
                    )
                    .await;
                (study, r)
            }
        });
        for (study, r) in futures::future::join_all(reports).await {
            if study == broken {
                assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.body);
            } else {
                assert_eq!(r.status, StatusCode::OK, "study {study}: {}", r.body);
            }
        }
    }
}
