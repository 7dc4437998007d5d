//! Worker pools (issue 31): real `augur worker --pool` processes share one pool between ten
//! studies. Every trial's process records when it started and ended in one events file;
//! the test reads the caps, the fair share and exactly-once from those records and from
//! the server, with one worker SIGKILLed mid-trial and another joining late.

use crate::common::{self, routes};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A trainer that takes 0.4 s: it records its start and end (`start|end STUDY TRIAL PID
/// NANOS`, one append each), and prints its loss in between. A trainer whose worker died
/// is killed by SIGPIPE at its print (its stdout was the worker's pipe), before its end.
const TRAINER: &str = r#"#!/bin/sh
x=${1#--x=}
echo "start $AUGUR_STUDY_ID $AUGUR_TRIAL_ID $$ $(date +%s%N)" >> "$POOL_EVENTS"
sleep 0.4
echo "loss=$x"
echo "end $AUGUR_STUDY_ID $AUGUR_TRIAL_ID $$ $(date +%s%N)" >> "$POOL_EVENTS"
"#;

const STUDIES: usize = 10;
const TRIALS_PER_STUDY: usize = 20;
const CAP: usize = 2;

fn pool_worker(base: &str, id: &str, slots: usize, dir: &Path) -> common::KillOnDrop {
    let child = Command::new(common::augur_bin())
        .args(["worker", "--url", base, "--pool", "shared"])
        .args(["--slots", &slots.to_string(), "--client-id", id])
        .args(["--job-commands", "sh"])
        .arg("--output-dir")
        .arg(dir.join("runs"))
        .arg("--env")
        .arg(format!("POOL_EVENTS={}", dir.join("events.log").display()))
        .env_remove("AUGUR_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn pool worker");
    common::KillOnDrop(child)
}

pub fn pool_spec(name: &str, pool: &str, trainer: &Path, max_trials: usize) -> Value {
    let mut spec = common::x_spec(name, ("loss", "minimize"), max_trials as i64, CAP as i64, 1);
    spec["trial_lease_secs"] = json!(3);
    spec["trial_job"] = json!({
        "executor": "pool",
        "pool": pool,
        "command": ["sh", trainer.display().to_string()],
        "max_retries": 2,
    });
    spec
}

/// One trainer process's record.
#[derive(Debug, Clone)]
struct Run {
    study: i64,
    trial: i64,
    start: i64,
    /// `None`: it never ended by itself (its worker was killed).
    end: Option<i64>,
}

fn read_runs(path: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: BTreeMap<i64, Run> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, study, trial, pid, at] = f[..] else {
            panic!("bad event line {line:?}")
        };
        let (study, trial, pid, at): (i64, i64, i64, i64) = (
            study.parse().expect("study"),
            trial.parse().expect("trial"),
            pid.parse().expect("pid"),
            at.parse().expect("nanos"),
        );
        match kind {
            "start" => {
                runs.insert(
                    pid,
                    Run {
                        study,
                        trial,
                        start: at,
                        end: None,
                    },
                );
            }
            "end" => runs.get_mut(&pid).expect("start before end").end = Some(at),
            other => panic!("bad event {other}"),
        }
    }
    runs.into_values().collect()
}

/// The most of `intervals` that overlap at any moment.
fn max_overlap(intervals: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(a, b)| [(a, 1), (b, -1)])
        .collect();
    // An end and a start at the same instant do not overlap.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_studies_share_a_pool_fairly_within_their_caps_through_a_lost_worker() {
    let dir = tempfile::tempdir().expect("dir");
    let trainer = dir.path().join("trainer.sh");
    std::fs::write(&trainer, TRAINER).expect("trainer");
    let events = dir.path().join("events.log");
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut ids = Vec::new();
    for i in 0..STUDIES {
        let spec = pool_spec(&format!("pooled-{i}"), "shared", &trainer, TRIALS_PER_STUDY);
        ids.push(app.create_study(spec).await);
    }
    let started = Instant::now();
    let a = pool_worker(&app.base, "a", 4, dir.path());
    let b = pool_worker(&app.base, "b", 4, dir.path());
    let mut c = pool_worker(&app.base, "c", 4, dir.path());

    // The pool shows its three workers once they have reported.
    let pool = common::eventually("three live workers", Duration::from_secs(20), || async {
        let pool = app.get(&routes::pool("shared")).await.body;
        if pool["workers"] == 3 {
            Ok(pool)
        } else {
            Err(pool.to_string())
        }
    })
    .await;
    assert_eq!(pool["slots"], 12, "{pool}");
    assert_eq!(pool["studies"], STUDIES, "{pool}");

    // Kill c while it runs trials: wait for two of its trials to be running, then SIGKILL.
    let held_by_c = || async {
        let mut held = Vec::new();
        for &id in &ids {
            let trials = app.get(&routes::trials_in_state(id, "active")).await.body;
            for t in trials["trials"].as_array().cloned().unwrap_or_default() {
                if t["client_id"].as_str().is_some_and(|c| c.starts_with("c/")) {
                    held.push((id, t["id"].as_i64().expect("id")));
                }
            }
        }
        held
    };
    tokio::time::sleep(Duration::from_millis(4000)).await;
    common::eventually("c runs trials", Duration::from_secs(20), || async {
        let held = held_by_c().await;
        if held.len() >= 2 {
            Ok(())
        } else {
            Err(format!("{held:?}"))
        }
    })
    .await;
    let _ = c.0.kill();
    let _ = c.0.wait();
    let killed_at = now_nanos();
    // A completion c sent just before it died may still be on its way through the server:
    // it is c's own, not one of a dead worker. Once it has landed (well within 1 s), what c
    // still holds stays active until its lease runs out (3 s).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = held_by_c().await;
    assert!(!killed.is_empty(), "c died holding no trial");

    // A worker that joins late takes work at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let joined_at = now_nanos();
    let d = pool_worker(&app.base, "d", 4, dir.path());

    for &id in &ids {
        app.wait_for_state(id, "completed", Duration::from_secs(60))
            .await;
    }
    let elapsed = started.elapsed();

    // Every trial completed once, none failed; the killed ones counted one lost launch.
    let mut trial_of_d = false;
    for &id in &ids {
        let study = app.get(&routes::study(id)).await.body;
        assert_eq!(
            study["trial_counts"]["completed"], TRIALS_PER_STUDY,
            "{study}"
        );
        assert_eq!(study["trial_counts"]["failed"], 0, "{study}");
        let trials = app.get(&routes::trials(id)).await.body;
        for t in trials["trials"].as_array().expect("trials") {
            let trial = (id, t["id"].as_i64().expect("id"));
            let client = t["client_id"].as_str().expect("client");
            trial_of_d |= client.starts_with("d/");
            if killed.contains(&trial) {
                assert!(
                    !client.starts_with("c/"),
                    "the killed worker completed {trial:?}: {t}"
                );
                assert_eq!(t["attempts"], 1, "its lost launch is counted: {t}");
            }
        }
    }
    assert!(trial_of_d, "the worker that joined late ran trials");

    let runs = read_runs(&events);
    // Exactly once to completion: the server completed each trial once (a second
    // completion is refused), and one trainer ran to its end per trial, but for c's: a
    // trainer of c's may have ended just before c died, its end never reported, and then
    // the trial ran again elsewhere (at least once, as any worker that can die between its
    // trial's exit and its report).
    let mut ended: BTreeMap<(i64, i64), usize> = BTreeMap::new();
    let mut starts: BTreeMap<(i64, i64), usize> = BTreeMap::new();
    for run in &runs {
        *starts.entry((run.study, run.trial)).or_default() += 1;
        if run.end.is_some() {
            *ended.entry((run.study, run.trial)).or_default() += 1;
        }
    }
    assert_eq!(
        ended.len(),
        STUDIES * TRIALS_PER_STUDY,
        "every trial ran to its end"
    );
    let twice: Vec<_> = ended
        .iter()
        .filter(|(t, n)| **n > 1 && !killed.contains(t))
        .collect();
    assert!(twice.is_empty(), "trials ran twice to their end: {twice:?}");
    let reran = ended
        .iter()
        .filter(|(t, n)| **n > 1 && killed.contains(t))
        .count();
    eprintln!(
        "{} trials lost with c, {reran} of them had ended unreported",
        killed.len()
    );
    // c may have died between a lease and its trainer's start: such a trial starts once.
    let started_by_c: BTreeSet<(i64, i64)> = runs
        .iter()
        .filter(|r| killed.contains(&(r.study, r.trial)) && r.start < killed_at)
        .map(|r| (r.study, r.trial))
        .collect();
    for trial in &killed {
        let again = runs
            .iter()
            .filter(|r| (r.study, r.trial) == *trial && r.start > killed_at)
            .count();
        assert_eq!(again, 1, "{trial:?} was started again once after c died");
    }
    let restarted: BTreeSet<(i64, i64)> = starts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(restarted, started_by_c, "only c's trials ran twice");

    // The late worker's first trial started soon after it was spawned (binary start-up,
    // its report and its first lease).
    let first_on_d = common::eventually("d's trials", Duration::from_secs(5), || async {
        let mut first = None;
        for &id in &ids {
            let trials = app.get(&routes::trials(id)).await.body;
            for t in trials["trials"].as_array().cloned().unwrap_or_default() {
                if t["client_id"].as_str().is_some_and(|c| c.starts_with("d/")) {
                    let trial = (id, t["id"].as_i64().expect("id"));
                    let start = runs
                        .iter()
                        .filter(|r| (r.study, r.trial) == trial)
                        .map(|r| r.start)
                        .max();
                    first = first.min(start).or(start);
                }
            }
        }
        first.ok_or_else(|| "none yet".to_string())
    })
    .await;
    let d_wait = Duration::from_nanos((first_on_d - joined_at).max(0) as u64);
    assert!(
        d_wait < Duration::from_secs(5),
        "the late worker took its first trial {d_wait:?} after it started"
    );

    // Intervals each trial held a slot: to its end, or (killed) until it started again.
    let mut by_study: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for run in &runs {
        let end = run.end.unwrap_or_else(|| {
            runs.iter()
                .filter(|r| (r.study, r.trial) == (run.study, run.trial) && r.start > run.start)
                .map(|r| r.start)
                .min()
                .expect("a killed trial started again")
        });
        by_study
            .entry(run.study)
            .or_default()
            .push((run.start, end));
    }
    // No study above its cap at any moment.
    for (study, intervals) in &by_study {
        let most = max_overlap(intervals);
        assert!(
            most <= CAP,
            "study {study} ran {most} trials at once (cap {CAP})"
        );
    }
    // Fair share, while every study had trials left and before the kill: each study's
    // slot-seconds within ±20 % of the mean (equal weights: the fair share).
    let first_start = runs.iter().map(|r| r.start).min().expect("runs");
    let last_start_of = |s: i64| by_study[&s].iter().map(|i| i.0).max().expect("runs");
    let window_end = ids
        .iter()
        .map(|&s| last_start_of(s))
        .min()
        .expect("studies")
        .min(killed_at);
    let share: BTreeMap<i64, f64> = by_study
        .iter()
        .map(|(&s, intervals)| {
            let busy: i64 = intervals
                .iter()
                .map(|&(a, b)| (b.min(window_end) - a.max(first_start)).max(0))
                .sum();
            (s, busy as f64 / 1e9)
        })
        .collect();
    let mean = share.values().sum::<f64>() / share.len() as f64;
    let window = (window_end - first_start) as f64 / 1e9;
    eprintln!("fair-share window {window:.2} s, slot-seconds by study {share:?} (mean {mean:.2})");
    assert!(
        window > 1.0,
        "the fair-share window is too short to judge: {window:.2} s"
    );
    for (study, s) in &share {
        assert!(
            (s - mean).abs() <= 0.2 * mean,
            "study {study} had {s:.2} slot-seconds, the fair share is {mean:.2} (±20 %): {share:?}"
        );
    }

    // The pool's view: c gone (no report for 6 s), the others live and idle, busy and
    // idle slot-seconds counted; the same in /metrics.
    let pool = common::eventually("c gone, the rest idle", Duration::from_secs(15), || async {
        let pool = app.get(&routes::pool("shared")).await.body;
        if pool["workers"] == 3 && pool["workers_gone"] == 1 && pool["idle_slots"] == 12 {
            Ok(pool)
        } else {
            Err(pool.to_string())
        }
    })
    .await;
    let ids_seen: BTreeSet<&str> = pool["worker_list"]
        .as_array()
        .expect("workers")
        .iter()
        .filter_map(|w| w["id"].as_str())
        .collect();
    assert_eq!(ids_seen, ["a", "b", "c", "d"].into_iter().collect());
    assert!(
        pool["busy_slot_secs"].as_f64().expect("busy") > 0.0,
        "{pool}"
    );
    assert_eq!(pool["queue_length"], 0, "{pool}");
    let idle = "augur_pool_slots{pool=\"shared\",state=\"idle\"}";
    assert_eq!(common::metric_sample(&app.base, None, idle).await, 12.0);
    let queue = "augur_pool_queue_length{pool=\"shared\"}";
    assert_eq!(common::metric_sample(&app.base, None, queue).await, 0.0);

    drop((a, b, d));
    // Nothing left running: no trainer of this test (c's died with it, killed by its reapers).
    common::eventually("no trainer left", Duration::from_secs(5), || async {
        match common::processes_with(&trainer.display().to_string()) {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        }
    })
    .await;
    eprintln!("ten studies through the pool in {elapsed:?}");
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64
}

/// A cluster trial's replica: records its name and GPUs in the trial's model directory; the
/// primary waits for the other replica's record (replicas stop when the primary exits).
const CLUSTER_TRAINER: &str = r#"#!/bin/sh
echo "$CUDA_VISIBLE_DEVICES" > "$AIP_MODEL_DIR/replica-$AUGUR_REPLICA"
if [ "$AUGUR_REPLICA" = "workerpool0-0" ]; then
    for i in $(seq 100); do
        [ -e "$AIP_MODEL_DIR/replica-workerpool1-0" ] && break
        sleep 0.05
    done
    echo "loss=0.5"
else
    sleep 30
fi
"#;

/// A whole cluster (two replicas, one GPU each) runs on one pool worker, each replica with a
/// GPU of the worker's `--gpus` of its own; a study whose command the worker's
/// `--job-commands` do not allow has its trial failed by the worker, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_worker_runs_clusters_on_its_gpus_and_refuses_what_its_lists_forbid() {
    let dir = tempfile::tempdir().expect("dir");
    let trainer = dir.path().join("cluster.sh");
    std::fs::write(&trainer, CLUSTER_TRAINER).expect("trainer");
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut cluster = pool_spec("cluster", "gpus", &trainer, 2);
    cluster["parallel_trials"] = json!(1);
    cluster["trial_job"]["worker_pools"] = json!([{"replicas": 1}, {"replicas": 1}]);
    cluster["trial_job"]["resources"] = json!({"gpu": 1});
    let cluster = app.create_study(cluster).await;
    let mut forbidden = common::x_spec("forbidden", ("loss", "minimize"), 1, 1, 1);
    forbidden["trial_job"] = json!({"executor": "pool", "pool": "gpus", "command": ["true"]});
    let forbidden = app.create_study(forbidden).await;

    let _worker = common::KillOnDrop(
        Command::new(common::augur_bin())
            .args([
                "worker", "--url", &app.base, "--pool", "gpus", "--slots", "2",
            ])
            .args(["--client-id", "g", "--gpus", "0,1", "--job-commands", "sh"])
            .arg("--output-dir")
            .arg(dir.path().join("runs"))
            .env_remove("AUGUR_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn pool worker"),
    );
    app.wait_for_state(cluster, "completed", Duration::from_secs(60))
        .await;
    for trial in 1..=2 {
        let model =
            common::study_dir(&dir.path().join("runs"), cluster).join(format!("{trial}/model"));
        let gpus = |replica: &str| {
            std::fs::read_to_string(model.join(format!("replica-{replica}")))
                .expect("replica record")
                .trim()
                .to_string()
        };
        let (primary, worker) = (gpus("workerpool0-0"), gpus("workerpool1-0"));
        let mut seen = [primary.clone(), worker.clone()];
        seen.sort();
        assert_eq!(
            seen,
            ["0", "1"],
            "trial {trial}: each replica a GPU of its own"
        );
    }
    let refused = common::eventually(
        "the forbidden trial failed",
        Duration::from_secs(30),
        || async {
            let trial = app.get(&routes::trial(forbidden, 1)).await.body;
            if trial["state"] == "failed" {
                Ok(trial)
            } else {
                Err(trial.to_string())
            }
        },
    )
    .await;
    let reason = refused["fail_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("pool worker g") && reason.contains("--job-commands"),
        "{reason}"
    );
}
