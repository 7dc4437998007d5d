//! Dispatch overhead (DESIGN §6: "a local trial starts within 50 ms of its slot freeing")
//! and the throughput of trivial trials, local executor, at `parallel_trials` 1, 8 and 32.
//!
//! Each trial is a tiny bash script that writes the wall-clock time when it starts and just
//! before it exits to `$AIP_MODEL_DIR/times` and prints `loss=1`. The overhead of a slot is
//! the time from a trial's exit to the start of the next trial process that took its slot
//! (matched in time order). The clock is bash's `$EPOCHREALTIME`, not `date`: two `date`
//! processes per trial cost more CPU than the dispatcher (perf: 62% of all samples at
//! `parallel_trials` 32), so the numbers were the jobs', not the service's. Trials/s is
//! counted from the first trial's start to the last one's exit; the study is polled only
//! every 50 ms, so that the bench's own requests do not compete with what it measures.
//!
//! At `parallel_trials` 32 on 2 cores the machine is saturated and the overhead is a
//! queueing time (≈ 32 / throughput): it falls only as the CPU per trial falls. Trial
//! directories and the database live in `$TMPDIR`; run it with `TMPDIR=/dev/shm` too, to
//! see the service apart from the disk. On ext4 without a journal (this machine's root) a
//! file or directory created within 60 s of deletions in its block group (360 s while the
//! deleted inodes' blocks are dirty) first scans past every such inode: creating a trial's
//! files then costs ~0.5-1 ms each instead of ~0.2. So each row's files are deleted only
//! after the last row, and runs on such a disk should be spaced ~6 minutes apart (here, at
//! `parallel_trials` 32: 32.5 ms 400 s after the previous run, 44.8 ms 10 s after it).
//!
//! The overhead is split, from the trials' own timestamps (`completed_at`, `created_at`) and
//! the script's, into: exit → trial completed (metrics and completion recorded) and
//! suggested → process started (token, directories, spawn), per trial at every
//! `parallel_trials`; and completed → next trial suggested (the runner's loop), which pairs
//! a trial with the next and so is shown at `parallel_trials` 1 only.
//!
//! `cargo bench --bench dispatch` (release). Environment:
//! - `AUGUR_BENCH_PARALLEL` (default `1,8,32`);
//! - `AUGUR_BENCH_TRIALS_PER_SLOT` (default 8, at least 40 trials per row);
//! - `AUGUR_BENCH_POSTGRES=1`: also on PostgreSQL (`AUGUR_TEST_POSTGRES_URL`, see
//!   scripts/start-postgres.sh);
//! - `AUGUR_BENCH_CLUSTER` (default `local`; `local,slurm` with a Slurm running, see
//!   scripts/start-slurm.sh): executors of the cluster row.
//!
//! The cluster row (DESIGN §4.1): trials of four replicas (a primary and three workers) one
//! after another; for each trial, the time from the previous trial's primary exiting (its
//! slot freed) to the last of its four replicas started. Each replica writes its start time;
//! the primary waits until all four have, so that none is stopped before it started.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TRIAL_SH: &str = r#"#!/bin/bash
s=$EPOCHREALTIME
echo "loss=1"
echo "$s $EPOCHREALTIME" > "${AIP_MODEL_DIR}times"
"#;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

struct Row {
    backend: &'static str,
    parallel: usize,
    trials: usize,
    /// First trial started → last trial exited.
    wall: Duration,
    /// Slot freed → next process started, seconds.
    overhead: Vec<f64>,
    /// For `parallel` 1: (exit → completed, completed → next suggested, suggested → started).
    /// Per trial: its exit → its completion recorded, and its suggestion → its process
    /// started (seconds).
    exit_to_completed: Vec<f64>,
    suggested_to_started: Vec<f64>,
    /// At `parallel_trials` 1 only: a trial completed → the next one suggested.
    completed_to_next: Vec<f64>,
    failed: usize,
    /// The row's trial directories and database, deleted only after every row ran (see the
    /// module doc).
    _files: (tempfile::TempDir, common::TestDb),
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(x: f64) -> String {
    format!("{:.1}", x * 1000.0)
}

fn timestamp(v: &Value) -> Option<f64> {
    let t = chrono::DateTime::parse_from_rfc3339(v.as_str()?).ok()?;
    Some(t.timestamp_micros() as f64 / 1e6)
}

/// Each slot freed by an exit is taken by the next start after it (the first `parallel`
/// starts take the initially free slots).
fn slot_overheads(mut times: Vec<(f64, f64)>, parallel: usize) -> Vec<f64> {
    let mut events: Vec<(f64, bool)> = Vec::with_capacity(times.len() * 2);
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (start, end) in &times {
        events.push((*start, true));
        events.push((*end, false));
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut initial = parallel;
    let mut freed: VecDeque<f64> = VecDeque::new();
    let mut out = Vec::new();
    for (t, is_start) in events {
        if !is_start {
            freed.push_back(t);
        } else if initial > 0 {
            initial -= 1;
        } else if let Some(at) = freed.pop_front() {
            out.push(t - at);
        }
    }
    out
}

async fn run_row(backend: &'static str, parallel: usize, trials: usize, script: &Path) -> Row {
    let db = common::db(backend).await;
    let app = common::spawn_app(db).await;
    let out = tempfile::tempdir().expect("temp dir");
    let spec = json!({
        "name": format!("dispatch-p{parallel}"),
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": trials,
        "parallel_trials": parallel,
        "seed": 1,
        "trial_job": {
            "command": [script.display().to_string()],
            "output_dir": out.path().display().to_string()
        }
    });
    let started = Instant::now();
    let id = app.create_study(spec).await;
    loop {
        let s = app.get(&format!("/v1/studies/{id}")).await.body;
        if s["state"] == "completed" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "study did not complete: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut listed: Vec<Value> = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut path = format!("/v1/studies/{id}/trials?page_size=1000");
        if let Some(t) = &token {
            path.push_str(&format!("&page_token={t}"));
        }
        let page = app.get(&path).await.body;
        listed.extend(page["trials"].as_array().cloned().unwrap_or_default());
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let failed = listed.iter().filter(|t| t["state"] != "completed").count();
    for t in listed.iter().filter(|t| t["state"] != "completed") {
        eprintln!("  trial {} {}: {}", t["id"], t["state"], t["fail_reason"]);
    }
    let mut times = Vec::new();
    let mut by_id = Vec::new();
    for t in &listed {
        let Some(n) = t["id"].as_i64() else { continue };
        let file = out.path().join(n.to_string()).join("model").join("times");
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let mut words = text
            .split_whitespace()
            .filter_map(|w| w.parse::<f64>().ok());
        if let (Some(s), Some(e)) = (words.next(), words.next()) {
            times.push((s, e));
            by_id.push((n, s, e, t.clone()));
        }
    }
    let (mut exit_to_completed, mut suggested_to_started) = (Vec::new(), Vec::new());
    for (_, start, exit, t) in &by_id {
        if let (Some(created), Some(completed)) =
            (timestamp(&t["created_at"]), timestamp(&t["completed_at"]))
        {
            exit_to_completed.push(completed - exit);
            suggested_to_started.push(start - created);
        }
    }
    let mut completed_to_next = Vec::new();
    if parallel == 1 {
        by_id.sort_by_key(|x| x.0);
        for pair in by_id.windows(2) {
            if let (Some(completed), Some(created)) = (
                timestamp(&pair[0].3["completed_at"]),
                timestamp(&pair[1].3["created_at"]),
            ) {
                completed_to_next.push(created - completed);
            }
        }
    }
    let first_start = times.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
    let last_exit = times.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
    let wall = Duration::from_secs_f64((last_exit - first_start).max(1e-3));
    let mut overhead = slot_overheads(times, parallel);
    overhead.sort_by(f64::total_cmp);
    Row {
        backend,
        parallel,
        trials: listed.len(),
        wall,
        overhead,
        exit_to_completed,
        suggested_to_started,
        completed_to_next,
        failed,
        _files: (out, app.db),
    }
}

/// One replica of the cluster row: records when it started; the primary waits for all four
/// to have started, then records its exit and reports.
const CLUSTER_SH: &str = r#"#!/bin/bash
s=$EPOCHREALTIME
echo "$s" > "${AIP_MODEL_DIR}start-${AUGUR_REPLICA}"
if [ "$AUGUR_REPLICA" = workerpool0-0 ]; then
  while [ "$(ls "${AIP_MODEL_DIR}" | grep -c '^start-')" -lt 4 ]; do sleep 0.002; done
  echo "loss=1"
  echo "$s $EPOCHREALTIME" > "${AIP_MODEL_DIR}times"
fi
"#;

/// Slot freed → all replicas of the next cluster started, per trial after the first (s).
async fn run_cluster_row(
    executor: &'static str,
    trials: usize,
    script: &Path,
) -> (Vec<f64>, usize) {
    let app = common::spawn_app(common::sqlite_db()).await;
    let out = tempfile::tempdir().expect("temp dir");
    let mut job = json!({
        "executor": executor,
        "command": [script.display().to_string()],
        "worker_pools": [{"replicas": 1}, {"replicas": 3}],
        "output_dir": out.path().display().to_string()
    });
    if executor == "slurm" {
        job["slurm"] = json!({"sbatch_args": ["--overcommit"]});
    }
    let spec = json!({
        "name": format!("cluster-{executor}"),
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": trials,
        "parallel_trials": 1,
        "seed": 1,
        "trial_job": job
    });
    let started = Instant::now();
    let id = app.create_study(spec).await;
    let study = loop {
        let s = app.get(&format!("/v1/studies/{id}")).await.body;
        if s["state"] == "completed" {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "study did not complete: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let failed = trials - study["trial_counts"]["completed"].as_u64().unwrap_or(0) as usize;
    let read = |trial: usize, file: &str| -> Option<f64> {
        let text =
            std::fs::read_to_string(out.path().join(format!("{trial}/model/{file}"))).ok()?;
        text.split_whitespace().last()?.parse().ok()
    };
    let mut gaps = Vec::new();
    for trial in 2..=trials {
        let freed = read(trial - 1, "times");
        let replicas = [
            "workerpool0-0",
            "workerpool1-0",
            "workerpool1-1",
            "workerpool1-2",
        ];
        let starts: Option<Vec<f64>> = replicas
            .iter()
            .map(|r| read(trial, &format!("start-{r}")))
            .collect();
        if let (Some(freed), Some(starts)) = (freed, starts) {
            gaps.push(starts.iter().copied().fold(f64::MIN, f64::max) - freed);
        }
    }
    gaps.sort_by(f64::total_cmp);
    (gaps, failed)
}

fn main() {
    let parallels: Vec<usize> = env_or::<String>("AUGUR_BENCH_PARALLEL", "1,8,32".into())
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    let per_slot: usize = env_or("AUGUR_BENCH_TRIALS_PER_SLOT", 8);
    let mut backends = vec!["sqlite"];
    if std::env::var("AUGUR_BENCH_POSTGRES").is_ok_and(|v| v == "1") {
        backends.push("postgres");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("trial.sh");
    std::fs::write(&script, TRIAL_SH).expect("write script");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();
    for backend in &backends {
        for &parallel in &parallels {
            let trials = (parallel * per_slot).max(40);
            eprintln!("running {trials} trials at parallel_trials {parallel} on {backend} …");
            rows.push(runtime.block_on(run_row(backend, parallel, trials, &script)));
        }
    }

    println!();
    println!(
        "dispatch overhead: slot freed (trial process exits) → next trial process started; local executor"
    );
    println!(
        "| backend  | parallel_trials | trials | failed | overhead median ms | p90 ms | max ms | trials/s |"
    );
    println!(
        "|----------|----------------:|-------:|-------:|-------------------:|-------:|-------:|---------:|"
    );
    for r in &rows {
        println!(
            "| {:<8} | {:>15} | {:>6} | {:>6} | {:>18} | {:>6} | {:>6} | {:>8.1} |",
            r.backend,
            r.parallel,
            r.trials,
            r.failed,
            ms(quantile(&r.overhead, 0.5)),
            ms(quantile(&r.overhead, 0.9)),
            ms(r.overhead.last().copied().unwrap_or(f64::NAN)),
            r.trials as f64 / r.wall.as_secs_f64(),
        );
    }
    println!();
    println!("where the time goes (medians, ms; from the trials' timestamps; the middle column");
    println!("pairs a trial with the next, so only at parallel_trials 1)");
    println!(
        "| backend  | parallel_trials | exit → trial completed | completed → next suggested | suggested → process started |"
    );
    println!(
        "|----------|----------------:|-----------------------:|---------------------------:|----------------------------:|"
    );
    for r in &rows {
        let med = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            if v.is_empty() {
                "–".to_string()
            } else {
                ms(quantile(&v, 0.5))
            }
        };
        println!(
            "| {:<8} | {:>15} | {:>22} | {:>26} | {:>27} |",
            r.backend,
            r.parallel,
            med(&r.exit_to_completed),
            med(&r.completed_to_next),
            med(&r.suggested_to_started)
        );
    }
    let cluster_script = dir.path().join("cluster.sh");
    std::fs::write(&cluster_script, CLUSTER_SH).expect("write script");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cluster_script, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let executors = env_or::<String>("AUGUR_BENCH_CLUSTER", "local".into());
    let mut cluster_rows = Vec::new();
    for executor in executors
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (executor, trials) = match executor {
            "slurm" => ("slurm", 12),
            _ => ("local", 30),
        };
        eprintln!("running {trials} four-replica cluster trials one at a time ({executor}) …");
        let (gaps, failed) = runtime.block_on(run_cluster_row(executor, trials, &cluster_script));
        cluster_rows.push((executor, trials, failed, gaps));
    }
    println!();
    println!("target (DESIGN §6): a local trial starts within 50 ms of its slot freeing");
    println!();
    println!(
        "clusters: slot freed (primary exits) → all 4 replicas of the next trial started; sqlite"
    );
    println!("| executor | trials | failed | median ms | p90 ms | max ms |");
    println!("|----------|-------:|-------:|----------:|-------:|-------:|");
    for (executor, trials, failed, gaps) in &cluster_rows {
        println!(
            "| {:<8} | {:>6} | {:>6} | {:>9} | {:>6} | {:>6} |",
            executor,
            trials,
            failed,
            ms(quantile(gaps, 0.5)),
            ms(quantile(gaps, 0.9)),
            ms(gaps.last().copied().unwrap_or(f64::NAN)),
        );
    }
}
