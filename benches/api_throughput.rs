//! API throughput on PostgreSQL (DESIGN §6): `suggest` + `complete` cycles with the random
//! algorithm against one study, from 1, 8 and 32 concurrent clients, then a study grown to
//! 100,000 trials at 32 clients to show throughput stays flat. The server runs in this
//! process (`App::build` on 127.0.0.1:0) on a fresh database with default, durable commits.
//!
//! `cargo bench --bench api_throughput` (release). Sizes, for a quick run:
//! - `AUGUR_BENCH_CLIENTS` (default `1,8,32`): client counts of the table;
//! - `AUGUR_BENCH_SECS` (default 10): seconds per client count;
//! - `AUGUR_BENCH_GROWTH_TRIALS` (default 100000, 0 skips): trials of the growth run;
//! - `AUGUR_BENCH_WINDOW` (default 10000): trials per row of the growth table;
//! - `AUGUR_BENCH_GROWTH_CLIENTS` (default 32);
//! - `AUGUR_BENCH_MAX_SECS` (default 600): the growth run stops here whatever its size;
//! - `AUGUR_TEST_POSTGRES_URL`: the admin URL (see scripts/start-postgres.sh).

#[path = "../tests/common/mod.rs"]
mod common;

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
    let response = http
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("POST {url}: body: {e}"))?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("POST {url}: {status}: {body}"))
    }
}

/// One cycle: suggest one trial and complete it. `Ok(false)` when the study is completed.
async fn cycle(
    http: &reqwest::Client,
    study_url: &str,
    client: &str,
    n: u64,
) -> Result<bool, String> {
    let request = json!({"count": 1, "client_id": client});
    // Near the end of a study the budget is spent while other clients' trials still run:
    // the answer is then "ask again", until they complete.
    let mut answer = Value::Null;
    for _ in 0..10_000 {
        answer = post(http, &format!("{study_url}/suggest"), &request).await?;
        let waiting = answer["trials"].as_array().is_some_and(|t| t.is_empty())
            && answer["study_state"] == "active";
        if !waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Some(trial) = answer["trials"].as_array().and_then(|t| t.first()) else {
        if answer["study_state"] == "completed" {
            return Ok(false);
        }
        return Err(format!(
            "no trial and study {}: {answer}",
            answer["study_state"]
        ));
    };
    let id = trial["id"].as_i64().ok_or("trial without id")?;
    let accuracy = (n as f64 * 0.618_033_988_7).fract();
    post(
        http,
        &format!("{study_url}/trials/{id}/complete"),
        &json!({"metrics": {"accuracy": accuracy}}),
    )
    .await?;
    Ok(true)
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
    errors: Mutex<Vec<String>>,
}

/// `clients` loops of cycles on one study until `stop` is set or the study completes.
async fn run_clients(http: &reqwest::Client, study_url: &str, clients: usize, run: &Arc<Run>) {
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (http, study_url, run) = (http.clone(), study_url.to_string(), run.clone());
            tokio::spawn(async move {
                let client = format!("bench-{c}");
                let mut mine = Vec::new();
                while !run.stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let n = run.completed.load(Ordering::Relaxed);
                    match cycle(&http, &study_url, &client, n).await {
                        Ok(true) => {
                            let done = run.completed.fetch_add(1, Ordering::Relaxed) + 1;
                            mine.push((done, started.elapsed()));
                        }
                        Ok(false) => break,
                        Err(e) => {
                            run.errors.lock().await.push(e);
                            break;
                        }
                    }
                }
                run.latencies.lock().await.extend(mine);
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
        errors: Mutex::new(Vec::new()),
    })
}

async fn create_study(http: &reqwest::Client, base: &str, max_trials: u64) -> String {
    let study = post(http, &format!("{base}/v1/studies"), &spec(max_trials))
        .await
        .expect("create study");
    let id = study["id"].as_i64().expect("study id");
    format!("{base}/v1/studies/{id}")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let db = runtime.block_on(common::postgres_db());
    runtime.block_on(bench(&db.url));
    runtime.block_on(drop_database(&db.url));
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

async fn bench(database_url: &str) {
    let levels: Vec<usize> = env_or("AUGUR_BENCH_CLIENTS", "1,8,32".to_string())
        .split(',')
        .map(|c| {
            c.trim()
                .parse()
                .expect("AUGUR_BENCH_CLIENTS: comma-separated counts")
        })
        .collect();
    let secs: f64 = env_or("AUGUR_BENCH_SECS", 10.0);
    let growth_trials: u64 = env_or("AUGUR_BENCH_GROWTH_TRIALS", 100_000);
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
    augur::serve::install_tls_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");

    println!("API throughput on PostgreSQL, random algorithm, suggest+complete cycles, one study");
    println!("(parallel_trials 64, max_trials 100000, {secs} s per row; cores: CPU used by this");
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
    let study_url = create_study(&http, &base, 100_000).await;
    for clients in levels {
        let run = new_run();
        let (batch_sum, batch_count) =
            metric_sum_count(&http, &base, "augur_group_commit_batch_size").await;
        let (secs_sum, _) = metric_sum_count(&http, &base, "augur_group_commit_seconds").await;
        let started = Instant::now();
        let cpu_before = cpu_ticks();
        let stopper = {
            let run = run.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                run.stop.store(true, Ordering::Relaxed);
            })
        };
        run_clients(&http, &study_url, clients, &run).await;
        let elapsed = started.elapsed();
        let (ours, postgres, other) = cores_between(cpu_before, cpu_ticks());
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
            let mut marks = vec![(Duration::ZERO, cpu_ticks())];
            let mut next = window;
            while !run.stop.load(Ordering::Relaxed) && next <= growth_trials {
                if run.completed.load(Ordering::Relaxed) >= next {
                    marks.push((started.elapsed(), cpu_ticks()));
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
    run_clients(&http, &study_url, growth_clients, &run).await;
    run.stop.store(true, Ordering::Relaxed);
    let mut marks = watcher.await.expect("watcher");
    let done = run.completed.load(Ordering::Relaxed);
    if !done.is_multiple_of(window) {
        marks.push((started.elapsed(), cpu_ticks()));
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
        let (ours, postgres, other) = cores_between(pair[0].1, pair[1].1);
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

/// CPU time so far, in clock ticks (`/proc`, Linux): the machine's busy and total time over
/// all cores, this process's, and PostgreSQL's processes'. The growth table shows where the
/// two cores went in each window, so that a dip caused by something else running shows.
#[derive(Clone, Copy, Default)]
struct CpuTicks {
    busy: f64,
    total: f64,
    ours: f64,
    postgres: f64,
}

fn cpu_ticks() -> CpuTicks {
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

/// Cores used between two samples: (this process, PostgreSQL, everything else).
fn cores_between(a: CpuTicks, b: CpuTicks) -> (f64, f64, f64) {
    let cpus = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    let total = (b.total - a.total).max(1.0);
    let share = |d: f64| d.max(0.0) / total * cpus;
    let ours = share(b.ours - a.ours);
    let postgres = share(b.postgres - a.postgres);
    let busy = share(b.busy - a.busy);
    (ours, postgres, (busy - ours - postgres).max(0.0))
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
