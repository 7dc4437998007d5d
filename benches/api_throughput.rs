//! API throughput on PostgreSQL (DESIGN §6): `suggest` + `complete` cycles with the random
//! algorithm against one study, from 1, 8 and 32 concurrent clients, then a study grown to
//! 100,000 trials at 32 clients to show throughput stays flat. The server runs in this
//! process (`App::build` on 127.0.0.1:0) on a fresh database with default, durable commits.
//!
//! Then a team's server with many studies (issue 16): the same cycles with each client bound
//! to one study (client `i` on study `i % studies`), on one replica and on two (real
//! `augur serve --no-dispatch` processes on the same database; as behind a balancer, a
//! client's suggest reaches one replica and its complete the other; each replica sends a
//! busy study's changes to the one that owns it unless `AUGUR_BENCH_FORWARD=0`, and names
//! the owner in its answers, which the clients follow unless `AUGUR_BENCH_FOLLOW=0`), each
//! row on a fresh database; and 100
//! `gp_bandit` studies at once, timing each `suggest` alone and counting the suggestions
//! that missed the study's time budget and fell back to quasi-random points.
//!
//! `cargo bench --bench api_throughput` (release). Sizes, for a quick run:
//! - `AUGUR_BENCH_CLIENTS` (default `1,8,32`, empty skips): client counts of the table;
//! - `AUGUR_BENCH_SECS` (default 10): seconds per row of the one-study and many-studies tables;
//! - `AUGUR_BENCH_GROWTH_TRIALS` (default 100000, 0 skips): trials of the growth run;
//! - `AUGUR_BENCH_WINDOW` (default 10000): trials per row of the growth table;
//! - `AUGUR_BENCH_GROWTH_CLIENTS` (default 32);
//! - `AUGUR_BENCH_MAX_SECS` (default 600): the growth run and the GP row stop here whatever
//!   their size;
//! - `AUGUR_BENCH_MANY` (default `1x32x1,100x64x1,1x32x2,100x64x2`, empty skips): rows of the
//!   many-studies table as `studies x clients x replicas`;
//! - `AUGUR_BENCH_FORWARD` (default 1; 0: off): replicas of a row route each study's changes
//!   to one of them (`--replica-url`);
//! - `AUGUR_BENCH_IN_PROCESS` (default 0; 1: on): replica 0 of the many-studies rows is the
//!   server in this process, beside the clients (the GP row's always is); off, every replica
//!   is a process of its own, as deployed, so one replica and two pay the same switches
//!   between the clients' process and a server's;
//! - `AUGUR_BENCH_FOLLOW` (default 1; 0: off): clients send a study's next changes to the
//!   replica an answer names as its owner (`augur-study-replica`), as Augur's clients do;
//!   off, they stay where the balancer sent them and every change of a busy study that
//!   reaches the other replica is forwarded;
//! - `AUGUR_BENCH_REPLICA_LANES`: `--commit-lanes` of each replica in rows with more than
//!   one; by default the machine's cores split between them (at least 1 each), as the README
//!   advises for replicas sharing a machine; `default`: the server's own default (one per
//!   core, at least 2, each);
//! - `AUGUR_BENCH_GP_STUDIES` (default 100, 0 skips): studies of the GP row;
//! - `AUGUR_BENCH_GP_CLIENTS_PER_STUDY` (default 4, the studies' `parallel_trials`);
//! - `AUGUR_BENCH_GP_TRIALS` (default 30): `max_trials` of each GP study;
//! - `AUGUR_TEST_POSTGRES_URL`: the admin URL (see scripts/start-postgres.sh).
//!
//! The many-studies and GP rows alone, short: `AUGUR_BENCH_CLIENTS= AUGUR_BENCH_GROWTH_TRIALS=0
//! AUGUR_BENCH_SECS=3 AUGUR_BENCH_MANY=100x64x2 AUGUR_BENCH_GP_STUDIES=10 cargo bench --bench
//! api_throughput`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use augur::{App, ServerConfig};
use serde_json::{Value, json};
use tokio::sync::Mutex;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// A comma-separated list; set but empty, none.
fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

fn spec(max_trials: u64) -> Value {
    json!({
        "name": "throughput",
        "algorithm": "random",
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [
            {"id": "lr", "type": "double", "min": 0.0001, "max": 1.0, "scale": "log"},
            {"id": "layers", "type": "integer", "min": 1, "max": 8},
            {"id": "batch", "type": "discrete", "values": [16, 32, 64, 128]},
            {"id": "kernel", "type": "categorical", "values": ["rbf", "poly"]}
        ],
        "max_trials": max_trials,
        "parallel_trials": 64,
        "seed": 1
    })
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Result<Value, String> {
    Ok(post_named(http, url, body).await?.0)
}

/// POST, and the replica the answer names as the study's owner (`augur-study-replica`).
async fn post_named(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
) -> Result<(Value, Option<String>), String> {
    let response = http
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    let status = response.status();
    let owner = response
        .headers()
        .get(augur::model::request::STUDY_REPLICA_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("POST {url}: body: {e}"))?;
    if status.is_success() {
        Ok((body, owner))
    } else {
        Err(format!("POST {url}: {status}: {body}"))
    }
}

/// What a client reports for a trial: from the count of trials completed so far and the
/// trial's parameters.
type Objective = fn(u64, &Value) -> Result<f64, String>;

/// Spread over [0, 1) by the golden ratio: the random algorithm has nothing to learn.
fn spread_accuracy(n: u64, _parameters: &Value) -> Result<f64, String> {
    Ok((n as f64 * 0.618_033_988_7).fract())
}

/// A smooth hill over the learning rate (log scale) and depth, highest (0.95) at lr 0.01 and
/// 4 layers, so that the GP has something to model; batch and kernel do not matter.
fn smooth_accuracy(_n: u64, parameters: &Value) -> Result<f64, String> {
    let number = |id: &str| {
        parameters[id]
            .as_f64()
            .ok_or_else(|| format!("trial parameters without {id}: {parameters}"))
    };
    let (lr, layers) = (number("lr")?, number("layers")?);
    Ok(0.95 - 0.05 * (lr.log10() + 2.0).powi(2) - 0.01 * (layers - 4.0).powi(2))
}

/// Whether replica 0 of the many-studies rows is the server in this process (the clients'),
/// not a process of its own.
static IN_PROCESS: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| env_or("AUGUR_BENCH_IN_PROCESS", 0u8) != 0);

/// Whether clients send a study's changes to the replica an answer names as its owner.
static FOLLOW_OWNER: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| env_or("AUGUR_BENCH_FOLLOW", 1u8) != 0);

/// A study's URLs at the replica `owner` (a base URL) instead.
fn move_to(study_urls: &mut [String], owner: &str) {
    for url in study_urls {
        if let Some(at) = url.find("/v1/studies/") {
            *url = format!("{}{}", owner.trim_end_matches('/'), &url[at..]);
        }
    }
}

/// One cycle: suggest one trial and complete it with `objective`, through the study's first
/// URL and its last (two replicas behind a balancer: each request may reach either); when
/// an answer names the study's owner, both move there (as with Augur's clients) unless
/// `AUGUR_BENCH_FOLLOW=0`. The trial's id (numbered per study from 1) and how long the suggest that
/// handed it out took; `None` when the study is completed.
async fn cycle(
    http: &reqwest::Client,
    study_urls: &mut [String],
    client: &str,
    n: u64,
    objective: Objective,
) -> Result<Option<(i64, Duration)>, String> {
    let request = json!({"count": 1, "client_id": client});
    // Near the end of a study the budget is spent while other clients' trials still run:
    // the answer is then "ask again", until they complete.
    let mut answer = Value::Null;
    let mut suggested_in = Duration::ZERO;
    let follow = *FOLLOW_OWNER;
    let Some(suggest_url) = study_urls.first().cloned() else {
        return Err("a client without a study URL".into());
    };
    for _ in 0..10_000 {
        let asked = Instant::now();
        let owner;
        (answer, owner) = post_named(http, &format!("{suggest_url}/suggest"), &request).await?;
        suggested_in = asked.elapsed();
        if let Some(owner) = owner.filter(|_| follow) {
            move_to(study_urls, &owner);
        }
        let waiting = answer["trials"].as_array().is_some_and(|t| t.is_empty())
            && answer["study_state"] == "active";
        if !waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Some(trial) = answer["trials"].as_array().and_then(|t| t.first()) else {
        if answer["study_state"] == "completed" {
            return Ok(None);
        }
        return Err(format!(
            "no trial and study {}: {answer}",
            answer["study_state"]
        ));
    };
    let id = trial["id"].as_i64().ok_or("trial without id")?;
    let accuracy = objective(n, &trial["parameters"])?;
    let complete_url = study_urls.last().cloned().unwrap_or(suggest_url);
    let (_, owner) = post_named(
        http,
        &format!("{complete_url}/trials/{id}/complete"),
        &json!({"metrics": {"accuracy": accuracy}}),
    )
    .await?;
    if let Some(owner) = owner.filter(|_| follow) {
        move_to(study_urls, &owner);
    }
    Ok(Some((id, suggested_in)))
}

/// Sum and count of a Prometheus summary/histogram in the server's `/metrics`.
async fn metric_sum_count(http: &reqwest::Client, base: &str, name: &str) -> (f64, f64) {
    let Ok(response) = http.get(format!("{base}/metrics")).send().await else {
        return (0.0, 0.0);
    };
    let text = response.text().await.unwrap_or_default();
    let value = |suffix: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}_{suffix}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("sum"), value("count"))
}

/// A counter's samples summed by the value of `label`, from the server's `/metrics`.
async fn metric_counter_by(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    label: &str,
) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    let Ok(response) = http.get(format!("{base}/metrics")).send().await else {
        return by;
    };
    let text = response.text().await.unwrap_or_default();
    let key = format!("{label}=\"");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let value = rest
            .split_once(&key)
            .and_then(|(_, v)| v.split_once('"'))
            .map(|(v, _)| v.to_string());
        let count = line.rsplit(' ').next().and_then(|c| c.parse::<f64>().ok());
        if let (Some(value), Some(count)) = (value, count) {
            *by.entry(value).or_default() += count;
        }
    }
    by
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What the clients of one run record.
struct Run {
    completed: AtomicU64,
    stop: AtomicBool,
    /// (completed count when the cycle ended, its latency).
    latencies: Mutex<Vec<(u64, Duration)>>,
    /// (trial id, how long the suggest that handed it out took): the cycle's first half.
    suggest_latencies: Mutex<Vec<(i64, Duration)>>,
    errors: Mutex<Vec<String>>,
}

/// One client per entry of `study_urls` (client `c` works on the study at `study_urls[c]`,
/// through one or two replicas' URLs of it), each looping over cycles until `stop` is set
/// or its study completes.
async fn run_clients(
    http: &reqwest::Client,
    study_urls: &[Vec<String>],
    objective: Objective,
    run: &Arc<Run>,
) {
    let tasks: Vec<_> = study_urls
        .iter()
        .enumerate()
        .map(|(c, urls)| {
            let (http, mut urls, run) = (http.clone(), urls.clone(), run.clone());
            tokio::spawn(async move {
                let client = format!("bench-{c}");
                let mut mine = Vec::new();
                let mut suggests = Vec::new();
                while !run.stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let n = run.completed.load(Ordering::Relaxed);
                    match cycle(&http, &mut urls, &client, n, objective).await {
                        Ok(Some(suggested)) => {
                            let done = run.completed.fetch_add(1, Ordering::Relaxed) + 1;
                            mine.push((done, started.elapsed()));
                            suggests.push(suggested);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            run.errors.lock().await.push(e);
                            break;
                        }
                    }
                }
                run.latencies.lock().await.extend(mine);
                run.suggest_latencies.lock().await.extend(suggests);
            })
        })
        .collect();
    for task in futures::future::join_all(tasks).await {
        task.expect("client task");
    }
}

fn new_run() -> Arc<Run> {
    Arc::new(Run {
        completed: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        latencies: Mutex::new(Vec::new()),
        suggest_latencies: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
    })
}

/// Set `run.stop` after `secs`; abort the returned task to cancel.
fn stop_after(run: &Arc<Run>, secs: f64) -> tokio::task::JoinHandle<()> {
    let run = run.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        run.stop.store(true, Ordering::Relaxed);
    })
}

/// Create a study from `spec` and return it.
async fn create_study_from(http: &reqwest::Client, base: &str, spec: &Value) -> Value {
    post(http, &format!("{base}/v1/studies"), spec)
        .await
        .expect("create study")
}

async fn create_study(http: &reqwest::Client, base: &str, max_trials: u64) -> String {
    let study = create_study_from(http, base, &spec(max_trials)).await;
    let id = study["id"].as_i64().expect("study id");
    format!("{base}/v1/studies/{id}")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    augur::serve::install_tls_provider();
    let levels: Vec<usize> = env_list("AUGUR_BENCH_CLIENTS", "1,8,32")
        .iter()
        .map(|c| {
            c.parse()
                .expect("AUGUR_BENCH_CLIENTS: comma-separated counts")
        })
        .collect();
    let growth_trials: u64 = env_or("AUGUR_BENCH_GROWTH_TRIALS", 100_000);
    if !levels.is_empty() || growth_trials > 0 {
        let db = runtime.block_on(common::postgres_db());
        runtime.block_on(bench(&db.url, &levels, growth_trials));
        runtime.block_on(drop_database(&db.url));
    }
    runtime.block_on(many_studies());
    runtime.block_on(gp_studies());
}

/// The bench's database holds up to 100,000+ trials: do not leave it behind.
async fn drop_database(url: &str) {
    use sqlx::Connection;
    let Some((_, name)) = url.rsplit_once('/') else {
        return;
    };
    let dropped = async {
        let mut admin = sqlx::PgConnection::connect(&common::postgres_admin_url()).await?;
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
    };
    if let Err(e) = dropped.await {
        eprintln!("could not drop the bench database {name}: {e}");
    }
}

async fn bench(database_url: &str, levels: &[usize], growth_trials: u64) {
    let secs: f64 = env_or("AUGUR_BENCH_SECS", 10.0);
    let window: u64 = env_or("AUGUR_BENCH_WINDOW", 10_000).max(1);
    let growth_clients: usize = env_or("AUGUR_BENCH_GROWTH_CLIENTS", 32);
    let max_secs: f64 = env_or("AUGUR_BENCH_MAX_SECS", 600.0);

    let app = App::build(ServerConfig::new(
        database_url.to_string(),
        "127.0.0.1:0".parse().expect("addr"),
    ))
    .await
    .expect("server starts");
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run());
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");

    if !levels.is_empty() {
        println!(
            "API throughput on PostgreSQL, random algorithm, suggest+complete cycles, one study"
        );
        println!(
            "(parallel_trials 64, max_trials 100000, {secs} s per row; cores: CPU used by this"
        );
        println!("process, by PostgreSQL, and by anything else, which a figure depends on)\n");
        println!(
            "{:>7} {:>8} {:>10} {:>9} {:>9} {:>11} {:>9} {:>7} {:>6} {:>6} {:>6}",
            "clients",
            "trials",
            "trials/s",
            "p50 ms",
            "p99 ms",
            "mean batch",
            "batch ms",
            "locked",
            "ours",
            "pg",
            "other"
        );
    }
    let study_url = create_study(&http, &base, 100_000).await;
    for &clients in levels {
        let run = new_run();
        let (batch_sum, batch_count) =
            metric_sum_count(&http, &base, "augur_group_commit_batch_size").await;
        let (secs_sum, _) = metric_sum_count(&http, &base, "augur_group_commit_seconds").await;
        let started = Instant::now();
        let cpu_before = cpu_ticks(&[]);
        let stopper = stop_after(&run, secs);
        run_clients(
            &http,
            &vec![vec![study_url.clone()]; clients],
            spread_accuracy,
            &run,
        )
        .await;
        let elapsed = started.elapsed();
        let Cores {
            ours,
            postgres,
            other,
            ..
        } = cores_between(cpu_before, cpu_ticks(&[]));
        stopper.abort();
        let (sum, count) = metric_sum_count(&http, &base, "augur_group_commit_batch_size").await;
        let (secs_after, _) = metric_sum_count(&http, &base, "augur_group_commit_seconds").await;
        report_errors(&run).await;
        let mut latencies: Vec<Duration> =
            run.latencies.lock().await.iter().map(|(_, d)| *d).collect();
        latencies.sort();
        let done = run.completed.load(Ordering::Relaxed);
        let batch = if count > batch_count {
            (sum - batch_sum) / (count - batch_count)
        } else {
            0.0
        };
        // Mean time the study was locked per batch, and the share of the run it was locked:
        // near 100% means the batcher, not the HTTP side, is the bottleneck.
        let batches = (count - batch_count).max(1.0);
        let locked = secs_after - secs_sum;
        println!(
            "{clients:>7} {done:>8} {:>10.0} {:>9.2} {:>9.2} {batch:>11.1} {:>9.2} {:>6.0}% \
             {ours:>6.2} {postgres:>6.2} {other:>6.2}",
            done as f64 / elapsed.as_secs_f64(),
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.99)),
            locked / batches * 1e3,
            locked / elapsed.as_secs_f64() * 100.0,
        );
    }

    if growth_trials == 0 {
        return;
    }
    println!(
        "\nGrowth: one new study to {growth_trials} trials at {growth_clients} clients (stops after {max_secs} s)\n"
    );
    println!(
        "(cores: CPU used in the window by this process, by PostgreSQL, and by anything else)\n"
    );
    println!(
        "{:>17} {:>10} {:>9} {:>9} {:>7} {:>7} {:>7}",
        "trials", "trials/s", "p50 ms", "p99 ms", "ours", "pg", "other"
    );
    let study_url = create_study(&http, &base, growth_trials).await;
    let run = new_run();
    let started = Instant::now();
    let watcher = {
        let run = run.clone();
        tokio::spawn(async move {
            // Window boundaries: when each `window` trials had completed, and the CPU then.
            let mut marks = vec![(Duration::ZERO, cpu_ticks(&[]))];
            let mut next = window;
            while !run.stop.load(Ordering::Relaxed) && next <= growth_trials {
                if run.completed.load(Ordering::Relaxed) >= next {
                    marks.push((started.elapsed(), cpu_ticks(&[])));
                    next += window;
                    continue;
                }
                if started.elapsed().as_secs_f64() > max_secs {
                    run.stop.store(true, Ordering::Relaxed);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            marks
        })
    };
    run_clients(
        &http,
        &vec![vec![study_url]; growth_clients],
        spread_accuracy,
        &run,
    )
    .await;
    run.stop.store(true, Ordering::Relaxed);
    let mut marks = watcher.await.expect("watcher");
    let done = run.completed.load(Ordering::Relaxed);
    if !done.is_multiple_of(window) {
        marks.push((started.elapsed(), cpu_ticks(&[])));
    }
    report_errors(&run).await;
    let latencies = run.latencies.lock().await;
    for (w, pair) in marks.windows(2).enumerate() {
        let from = w as u64 * window;
        let to = ((w as u64 + 1) * window).min(done);
        let mut in_window: Vec<Duration> = latencies
            .iter()
            .filter(|(n, _)| *n > from && *n <= to)
            .map(|(_, d)| *d)
            .collect();
        in_window.sort();
        let rate = (to - from) as f64 / (pair[1].0 - pair[0].0).as_secs_f64();
        let Cores {
            ours,
            postgres,
            other,
            ..
        } = cores_between(pair[0].1, pair[1].1);
        println!(
            "{:>17} {rate:>10.0} {:>9.2} {:>9.2} {ours:>7.2} {postgres:>7.2} {other:>7.2}",
            format!("{}-{}", from + 1, to),
            ms(percentile(&in_window, 0.5)),
            ms(percentile(&in_window, 0.99)),
        );
    }
    println!(
        "\n{done} trials in {:.1} s: {:.0} trials/s overall",
        started.elapsed().as_secs_f64(),
        done as f64 / started.elapsed().as_secs_f64()
    );
}

/// The replicas of one row, on a database of their own: real `augur serve --no-dispatch`
/// processes (API-only replicas) on the same database, as deployed; with `in_process`,
/// replica 0 is the server in this process instead (built as the one-study table builds it),
/// which answers the clients beside it without a switch between processes.
struct Servers {
    /// Replica `r`'s base URL.
    bases: Vec<String>,
    /// Killed when dropped, on a panic too.
    children: Vec<common::ServerProcess>,
    /// The server in this process, if any.
    in_process: Option<InProcess>,
    /// Dropped (`WITH (FORCE)`) when this is dropped; `stop` drops it first, and says so if
    /// it cannot.
    db: common::TestDb,
}

/// A server running in this process: its stop signal and its task.
struct InProcess {
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), augur::app::AppError>>,
}

impl Servers {
    async fn start(replicas: usize, in_process: bool) -> Servers {
        let db = common::postgres_db().await;
        // Replicas route each study's changes to one of them (`--replica-url`) unless
        // AUGUR_BENCH_FORWARD=0.
        let forward = replicas > 1 && env_or("AUGUR_BENCH_FORWARD", 1u8) != 0;
        let lanes = replica_lanes(replicas);
        let mut bases = Vec::new();
        let mut served = None;
        if in_process {
            let port = common::free_port();
            let mut config = ServerConfig::new(
                db.url.clone(),
                format!("127.0.0.1:{port}").parse().expect("addr"),
            );
            if forward {
                config.replica_url = Some(format!("http://127.0.0.1:{port}"));
            }
            if let Some(lanes) = &lanes {
                config.commit_lanes = Some(
                    lanes
                        .parse()
                        .unwrap_or_else(|_| panic!("AUGUR_BENCH_REPLICA_LANES={lanes:?}")),
                );
            }
            // Migrations run here, before any other replica opens the database.
            let app = App::build(config).await.expect("server starts");
            bases.push(format!("http://{}", app.addr()));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(app.run_until(async {
                let _ = stopped.await;
            }));
            served = Some(InProcess { stop, served: task });
        }
        let mut children = Vec::new();
        // One at a time: the first migrates the database before the next opens it.
        while bases.len() < replicas {
            let port = common::free_port();
            let url = format!("http://127.0.0.1:{port}");
            let mut args = vec!["--no-dispatch"];
            if forward {
                args.extend(["--replica-url", &url]);
            }
            if let Some(lanes) = &lanes {
                args.extend(["--commit-lanes", lanes]);
            }
            let child = common::ServerProcess::start_with(&db.url, port, &args);
            child.wait_ready().await;
            bases.push(child.base.clone());
            children.push(child);
        }
        if forward {
            // Before every replica sees the others, one that does not yet serves every study
            // itself and names no owner.
            let bases: Vec<&str> = bases.iter().map(String::as_str).collect();
            common::until_replicas_live(&bases, None, bases.len() as f64).await;
        }
        Servers {
            bases,
            children,
            in_process: served,
            db,
        }
    }

    fn child_pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.child.id()).collect()
    }

    /// Stop every replica, then drop the database.
    async fn stop(mut self) {
        for child in &mut self.children {
            child.kill();
        }
        if let Some(InProcess { stop, mut served }) = self.in_process.take() {
            let _ = stop.send(());
            match tokio::time::timeout(Duration::from_secs(10), &mut served).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => eprintln!("the server in this process failed: {e}"),
                Ok(Err(e)) => eprintln!("the server in this process panicked: {e}"),
                Err(_) => eprintln!("the server in this process did not stop within 10 s"),
            }
        }
        drop_database(&self.db.url).await;
    }
}

/// `--commit-lanes` of each replica of a row of `replicas` (`None`: the server's default).
fn replica_lanes(replicas: usize) -> Option<String> {
    if replicas < 2 {
        return None;
    }
    match std::env::var("AUGUR_BENCH_REPLICA_LANES") {
        Ok(lanes) if lanes == "default" => None,
        Ok(lanes) => Some(lanes),
        Err(_) => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Some((cores / replicas).max(1).to_string())
        }
    }
}

/// Every study a replica lists: (count, completed trials over all of them).
async fn studies_seen(http: &reqwest::Client, base: &str) -> (usize, u64) {
    let (mut studies, mut completed) = (0, 0);
    let mut page = String::new();
    loop {
        let url = format!("{base}/v1/studies?page_size=1000{page}");
        let list: Value = http
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("list studies")
            .json()
            .await
            .expect("study list");
        for study in list["studies"].as_array().expect("studies") {
            studies += 1;
            completed += study["trial_counts"]["completed"].as_u64().unwrap_or(0);
        }
        match list["next_page_token"].as_str() {
            Some(token) => page = format!("&page_token={token}"),
            None => return (studies, completed),
        }
    }
}

/// Requests committed and group commits so far, over all replicas.
async fn group_commit_batches(http: &reqwest::Client, bases: &[String]) -> (f64, f64) {
    let mut total = (0.0, 0.0);
    for base in bases {
        let (sum, count) = metric_sum_count(http, base, "augur_group_commit_batch_size").await;
        total = (total.0 + sum, total.1 + count);
    }
    total
}

/// One row of the many-studies table, `studies x clients x replicas`.
fn parse_many_row(row: &str) -> (usize, usize, usize) {
    let sizes: Vec<usize> = row
        .split('x')
        .map(|n| n.trim().parse().ok().filter(|&n: &usize| n > 0))
        .collect::<Option<_>>()
        .unwrap_or_else(|| panic!("AUGUR_BENCH_MANY: {row:?} is not STUDIESxCLIENTSxREPLICAS"));
    match sizes[..] {
        [studies, clients, replicas] => (studies, clients, replicas),
        _ => panic!("AUGUR_BENCH_MANY: {row:?} is not STUDIESxCLIENTSxREPLICAS"),
    }
}

/// A team's server: suggest+complete cycles with each client bound to one study, on one
/// replica or several sharing the database.
async fn many_studies() {
    let rows: Vec<(usize, usize, usize)> =
        env_list("AUGUR_BENCH_MANY", "1x32x1,100x64x1,1x32x2,100x64x2")
            .iter()
            .map(|row| parse_many_row(row))
            .collect();
    if rows.is_empty() {
        return;
    }
    let secs: f64 = env_or("AUGUR_BENCH_SECS", 10.0);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");
    let routing = match (env_or("AUGUR_BENCH_FORWARD", 1u8) != 0, *FOLLOW_OWNER) {
        (true, true) => {
            "each replica sends a study's changes to the replica that owns it, and the clients \
             follow the owner it names"
        }
        (true, false) => {
            "each replica sends a study's changes to the replica that owns it; the clients \
             stay where they are sent (AUGUR_BENCH_FOLLOW=0)"
        }
        (false, _) => "no routing between replicas (AUGUR_BENCH_FORWARD=0)",
    };
    let (servers, ours, others) = if *IN_PROCESS {
        (
            "replica 0 in this process, the others `augur serve --no-dispatch` processes",
            "(clients and replica 0)",
            "the other replicas",
        )
    } else {
        (
            "each replica an `augur serve --no-dispatch` process",
            "(the clients)",
            "the replicas",
        )
    };
    println!("\nMany studies: random algorithm, suggest+complete cycles, client i on study");
    println!("i % studies, its suggests to replica i % replicas and its completes to the next");
    println!("({servers} on");
    let lanes = match std::env::var("AUGUR_BENCH_REPLICA_LANES") {
        Ok(n) if n == "default" => {
            "commit lanes: the server's default, one per core, at least 2".to_string()
        }
        Ok(n) => format!("{n} commit lane(s) per replica where there are several"),
        Err(_) => "commit lanes: the server's default for one replica, the cores split between \
                   several (--commit-lanes)"
            .to_string(),
    };
    println!("the same database; {routing}; {lanes}); a fresh database per");
    println!("row, parallel_trials 64, {secs} s per row. Mean batch: requests (suggests and");
    println!("completes) per group commit, over all replicas. Cores: CPU used by this process");
    println!("{ours}, by {others}, by PostgreSQL and by anything else.\n");
    println!(
        "{:>7} {:>7} {:>8} {:>8} {:>10} {:>9} {:>9} {:>11} {:>6} {:>7} {:>6} {:>6}",
        "studies",
        "clients",
        "replicas",
        "trials",
        "trials/s",
        "p50 ms",
        "p99 ms",
        "mean batch",
        "ours",
        "others",
        "pg",
        "other"
    );
    for (studies, clients, replicas) in rows {
        let servers = Servers::start(replicas, *IN_PROCESS).await;
        let mut ids = Vec::with_capacity(studies);
        for i in 0..studies {
            let mut spec = spec(100_000);
            spec["name"] = json!(format!("many-{i}"));
            let study = create_study_from(&http, &servers.bases[0], &spec).await;
            ids.push(study["id"].as_i64().expect("study id"));
        }
        // Every replica must serve the same studies: the clients of replica 1 work on the
        // studies replica 0 created, through the shared database.
        for base in &servers.bases {
            let (seen, _) = studies_seen(&http, base).await;
            assert_eq!(seen, studies, "studies listed by the replica at {base}");
        }
        // As through a balancer: a client's suggest reaches replica c % replicas and its
        // complete the next one, so every study's commands reach every replica.
        let study_urls: Vec<Vec<String>> = (0..clients)
            .map(|c| {
                (0..replicas.min(2))
                    .map(|k| {
                        let base = &servers.bases[(c + k) % replicas];
                        format!("{base}/v1/studies/{}", ids[c % studies])
                    })
                    .collect()
            })
            .collect();
        let batch_before = group_commit_batches(&http, &servers.bases).await;
        let run = new_run();
        let children = servers.child_pids();
        let started = Instant::now();
        let cpu_before = cpu_ticks(&children);
        let stopper = stop_after(&run, secs);
        run_clients(&http, &study_urls, spread_accuracy, &run).await;
        let elapsed = started.elapsed();
        let Cores {
            ours,
            children: others,
            postgres,
            other,
        } = cores_between(cpu_before, cpu_ticks(&children));
        stopper.abort();
        let batch_after = group_commit_batches(&http, &servers.bases).await;
        report_errors(&run).await;
        let done = run.completed.load(Ordering::Relaxed);
        // What the clients completed is what every replica reads back from the database.
        for base in &servers.bases {
            let (_, completed) = studies_seen(&http, base).await;
            if completed != done {
                eprintln!("the replica at {base} counts {completed} completed trials, not {done}");
            }
        }
        servers.stop().await;
        let mut latencies: Vec<Duration> =
            run.latencies.lock().await.iter().map(|(_, d)| *d).collect();
        latencies.sort();
        let batches = batch_after.1 - batch_before.1;
        let batch = if batches > 0.0 {
            (batch_after.0 - batch_before.0) / batches
        } else {
            0.0
        };
        println!(
            "{studies:>7} {clients:>7} {replicas:>8} {done:>8} {:>10.0} {:>9.2} {:>9.2} \
             {batch:>11.1} {ours:>6.2} {others:>7.2} {postgres:>6.2} {other:>6.2}",
            done as f64 / elapsed.as_secs_f64(),
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.99)),
        );
    }
}

/// A `gp_bandit` study of the GP row.
fn gp_spec(i: usize, max_trials: u64, parallel_trials: usize) -> Value {
    let mut spec = spec(max_trials);
    spec["name"] = json!(format!("gp-{i}"));
    spec["algorithm"] = json!("gp_bandit");
    spec["parallel_trials"] = json!(parallel_trials);
    spec["seed"] = json!(i);
    spec
}

/// Many `gp_bandit` studies at once on one replica: how long a `suggest` takes when the
/// server designs for 100 studies side by side, and how many suggestions miss the time
/// budget.
async fn gp_studies() {
    let studies: usize = env_or("AUGUR_BENCH_GP_STUDIES", 100);
    if studies == 0 {
        return;
    }
    // 4 clients per study, as many as its parallel_trials: every study as busy as its spec
    // allows, 400 clients for 100 studies. Not too heavy for a 2-core machine: the 3,000
    // trials took 15-20 s there (2026-11-30), so there was no reason to ask for fewer.
    let per_study: usize = env_or("AUGUR_BENCH_GP_CLIENTS_PER_STUDY", 4).max(1);
    let max_trials: u64 = env_or("AUGUR_BENCH_GP_TRIALS", 30);
    let max_secs: f64 = env_or("AUGUR_BENCH_MAX_SECS", 600.0);
    let clients = studies * per_study;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");
    let servers = Servers::start(1, true).await;
    let base = servers.bases[0].clone();
    let mut ids = Vec::with_capacity(studies);
    let mut budget = Value::Null;
    for i in 0..studies {
        let study = create_study_from(&http, &base, &gp_spec(i, max_trials, per_study)).await;
        budget = study["spec"]["suggestion_time_budget_secs"].clone();
        ids.push(study["id"].as_i64().expect("study id"));
    }
    let study_urls: Vec<Vec<String>> = (0..clients)
        .map(|c| vec![format!("{base}/v1/studies/{}", ids[c % studies])])
        .collect();
    // A study's first trials are the designer's quasi-random initial design; the GP takes
    // over once that many have completed (the service runs gp_bandit with the optimizer's
    // default config), so with trials running in parallel a few more may be quasi-random.
    let initial = augur_optimizer::GpBanditConfig::default()
        .initial_trials(spec(0)["parameters"].as_array().map_or(0, Vec::len));
    const FALLBACKS: &str = "augur_suggestion_budget_exceeded_total";
    let fallbacks_before = metric_counter_by(&http, &base, FALLBACKS, "stage").await;
    let run = new_run();
    let started = Instant::now();
    let cpu_before = cpu_ticks(&[]);
    let stopper = stop_after(&run, max_secs);
    run_clients(&http, &study_urls, smooth_accuracy, &run).await;
    let elapsed = started.elapsed();
    let Cores {
        ours,
        postgres,
        other,
        ..
    } = cores_between(cpu_before, cpu_ticks(&[]));
    stopper.abort();
    let mut fallbacks_by_stage = metric_counter_by(&http, &base, FALLBACKS, "stage").await;
    for (stage, before) in &fallbacks_before {
        if let Some(n) = fallbacks_by_stage.get_mut(stage) {
            *n -= before;
        }
    }
    let fallbacks: f64 = fallbacks_by_stage.values().sum();
    report_errors(&run).await;
    let (_, completed) = studies_seen(&http, &base).await;
    servers.stop().await;
    let done = run.completed.load(Ordering::Relaxed);
    let wanted = studies as u64 * max_trials;
    if done < wanted {
        eprintln!(
            "the GP row ended with {done} of {wanted} trials (the server counts {completed}): \
             a client error above, or AUGUR_BENCH_MAX_SECS ({max_secs} s)"
        );
    }

    println!(
        "\nGP bandit: {studies} studies at once, {per_study} clients each ({clients} in all), \
         parallel_trials {per_study},"
    );
    println!(
        "max_trials {max_trials}, on one replica (this process). Suggestion time budget: \
         {budget} s (the"
    );
    println!("spec's default suggestion_time_budget_secs); it runs from the suggest's arrival and");
    println!(
        "bounds the waits for the design lock and a core and the fit, less a reserve for the commit."
    );
    println!("Fallbacks: suggestions past the budget, answered with quasi-random points (the");
    println!("server's counter augur_suggestion_budget_exceeded_total). Cores: CPU used by this");
    println!("process (clients and server), by PostgreSQL and by anything else.\n");
    println!(
        "{:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:>6} {:>6} {:>6}",
        "studies", "clients", "trials", "secs", "trials/s", "fallbacks", "ours", "pg", "other"
    );
    println!(
        "{studies:>7} {clients:>7} {done:>7} {:>7.1} {:>8.1} {fallbacks:>9.0} {ours:>6.2} \
         {postgres:>6.2} {other:>6.2}",
        elapsed.as_secs_f64(),
        done as f64 / elapsed.as_secs_f64(),
    );
    let stages: Vec<String> = fallbacks_by_stage
        .iter()
        .map(|(stage, n)| format!("{stage} {n:.0}"))
        .collect();
    println!(
        "fallbacks by where the budget ran out: {}\n",
        if stages.is_empty() {
            "none".to_string()
        } else {
            stages.join(", ")
        }
    );
    println!(
        "Suggest latency (each suggest that handed out a trial, alone). The GP takes over once \
         {initial} trials"
    );
    println!(
        "of a study have completed: with {per_study} at once, trials up to {} may still be \
         quasi-random.\n",
        initial + per_study - 1
    );
    println!(
        "{:<32} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "suggestions", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    let suggests = run.suggest_latencies.lock().await;
    let initial = initial as i64;
    let rows = [
        ("all".to_string(), 1..=i64::MAX),
        (format!("initial design (trials 1-{initial})"), 1..=initial),
        (
            format!("later (trials {}-{max_trials})", initial + 1),
            initial + 1..=i64::MAX,
        ),
    ];
    for (label, ids) in rows {
        let mut latencies: Vec<Duration> = suggests
            .iter()
            .filter(|(id, _)| ids.contains(id))
            .map(|(_, d)| *d)
            .collect();
        latencies.sort();
        println!(
            "{label:<32} {:>8} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
            latencies.len(),
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.9)),
            ms(percentile(&latencies, 0.99)),
            ms(latencies.last().copied().unwrap_or_default()),
        );
    }
}

/// CPU time so far, in clock ticks (`/proc`, Linux): the machine's busy and total time over
/// all cores, this process's, the `children` processes' (other replicas), and PostgreSQL's
/// processes'. The tables show where the two cores went in each row or window, so that a
/// dip caused by something else running shows.
#[derive(Clone, Copy, Default)]
struct CpuTicks {
    busy: f64,
    total: f64,
    ours: f64,
    children: f64,
    postgres: f64,
}

fn cpu_ticks(children: &[u32]) -> CpuTicks {
    let fields = |text: &str| -> Vec<f64> {
        text.split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect()
    };
    // utime + stime: fields 14 and 15, counted after the `(comm)` that may hold spaces.
    let process = |stat: &str| -> f64 {
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let f: Vec<&str> = after.split_whitespace().collect();
        let get = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        get(11) + get(12)
    };
    let mut out = CpuTicks::default();
    if let Ok(stat) = std::fs::read_to_string("/proc/stat")
        && let Some(line) = stat.lines().next()
    {
        let v = fields(line.trim_start_matches("cpu"));
        out.total = v.iter().take(8).sum();
        out.busy = out.total - v.get(3).unwrap_or(&0.0) - v.get(4).unwrap_or(&0.0);
    }
    out.ours = std::fs::read_to_string("/proc/self/stat").map_or(0.0, |s| process(&s));
    for pid in children {
        out.children +=
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(0.0, |s| process(&s));
    }
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let path = entry.path();
            let is_postgres =
                std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == "postgres");
            if is_postgres && let Ok(stat) = std::fs::read_to_string(path.join("stat")) {
                out.postgres += process(&stat);
            }
        }
    }
    out
}

/// Cores used between two samples.
struct Cores {
    /// This process: the clients and the server in it.
    ours: f64,
    /// The other replicas' processes.
    children: f64,
    postgres: f64,
    /// Everything else on the machine.
    other: f64,
}

fn cores_between(a: CpuTicks, b: CpuTicks) -> Cores {
    let cpus = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    let total = (b.total - a.total).max(1.0);
    let share = |d: f64| d.max(0.0) / total * cpus;
    let ours = share(b.ours - a.ours);
    let children = share(b.children - a.children);
    let postgres = share(b.postgres - a.postgres);
    let busy = share(b.busy - a.busy);
    Cores {
        ours,
        children,
        postgres,
        other: (busy - ours - children - postgres).max(0.0),
    }
}

async fn report_errors(run: &Run) {
    let errors = run.errors.lock().await;
    if let Some(first) = errors.first() {
        eprintln!(
            "{} client(s) stopped on an error; first: {first}",
            errors.len()
        );
    }
}
