//! The dispatcher's runners failing over between machines: two `augur serve` replicas on
//! node1 and node2, both dispatching, over one PostgreSQL on node3 (`scripts/test-cluster.sh`).
//! The node running a study's trials loses power mid-study; the other replica takes the
//! study's runner once its lease lapses and finishes the study, running again the trials that
//! were running on the lost node, every trial completed once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, KillOnDrop, NodePostgres, NodeRuntime, TestCluster, routes};

const ADMIN: &str = "runner-failover-admin-token";
const PG_PORT: u16 = 5432;

/// Each trial logs its start (trial, host) and end to `$EVENTS`, trains 2 s, reports `loss`.
const TRAINER_SH: &str = r#"
echo "start $AUGUR_TRIAL_ID $(hostname)" >> "$EVENTS"
sleep 2
echo "end $AUGUR_TRIAL_ID $(hostname)" >> "$EVENTS"
echo "loss=0.$AUGUR_TRIAL_ID"
"#;

/// (event, trial, host) lines of `$EVENTS`.
fn events(path: &std::path::Path) -> Vec<(String, i64, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let (what, trial, host) = (words.next()?, words.next()?, words.next()?);
            Some((what.to_string(), trial.parse().ok()?, host.to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_fails_over_to_the_other_replica_when_its_node_is_lost() {
    const TRIALS: i64 = 8;
    let cluster = TestCluster::up(3);
    let pg = NodePostgres::start(&cluster, "node3", PG_PORT);
    let (dir, script, events_file) = test_dir(&cluster, "runner-failover", TRAINER_SH);
    let (_replicas, bases, clients, id) =
        deploy(&cluster, &pg, &dir, &script, &events_file, TRIALS).await;
    // Once three trials have started, the node running them goes.
    let lost = common::eventually("three trials started", Duration::from_secs(60), || async {
        let started: Vec<_> = events(&events_file)
            .into_iter()
            .filter(|e| e.0 == "start")
            .collect();
        match started.get(2) {
            Some(e) => Ok(e.2.clone()),
            None => Err(format!("{started:?}")),
        }
    })
    .await;
    let survivor = if lost == "node1" { "node2" } else { "node1" };
    cluster.kill_node(&lost);
    let killed_at = Instant::now();
    let running_when_lost: Vec<i64> = {
        let all = events(&events_file);
        all.iter()
            .filter(|(what, trial, _)| {
                what == "start" && !all.iter().any(|e| e.0 == "end" && e.1 == *trial)
            })
            .map(|e| e.1)
            .collect()
    };
    let taken_over =
        common::eventually("the survivor runs a trial", Duration::from_secs(60), || {
            let events_file = events_file.clone();
            async move {
                if events(&events_file)
                    .iter()
                    .any(|e| e.0 == "start" && e.2 == survivor)
                {
                    Ok(killed_at.elapsed())
                } else {
                    Err("none yet".to_string())
                }
            }
        })
        .await;
    let base = bases[if survivor == "node1" { 0 } else { 1 }].clone();
    let (study, trials) = wait_ended(&clients, base, id).await;
    let log = events(&events_file);
    println!(
        "\n== runner failover: {lost} lost with trials {running_when_lost:?} running; \
         {survivor} ran a trial {:.1} s later (runner lease 15 s) ==\n{log:?}",
        taken_over.as_secs_f64()
    );
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], TRIALS, "{study}");
    assert_eq!(study["trial_counts"]["total"], TRIALS, "{study}");
    for t in trials["trials"].as_array().expect("trials") {
        let trial = t["id"].as_i64().expect("id");
        let ends: Vec<_> = log
            .iter()
            .filter(|e| e.0 == "end" && e.1 == trial)
            .collect();
        assert!(!ends.is_empty(), "trial {trial} ran to its end: {log:?}");
        assert_eq!(t["state"], "completed", "{t}");
    }
    for trial in &running_when_lost {
        assert!(
            log.iter()
                .any(|e| e.0 == "end" && e.1 == *trial && e.2 == survivor),
            "trial {trial}, running on {lost}, ran again on {survivor}: {log:?}"
        );
    }
    assert!(
        cluster
            .processes_on(survivor, &script.display().to_string())
            .is_empty(),
        "a job outlived the study on {survivor}"
    );
}

/// A fresh directory for one test, with its trainer script and its events file.
fn test_dir(
    cluster: &TestCluster,
    name: &str,
    trainer: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dir = cluster.dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let script = dir.join("trainer.sh");
    std::fs::write(&script, trainer).expect("script");
    let events = dir.join("events.txt");
    (dir, script, events)
}

/// Two dispatching replicas on node1 and node2 over `pg`, and a study of `trials` trials of
/// `script`, two at a time, made from node3: the replicas, their URLs, node3's runtime and
/// the study's id.
async fn deploy(
    cluster: &TestCluster,
    pg: &NodePostgres,
    dir: &std::path::Path,
    script: &std::path::Path,
    events_file: &std::path::Path,
    trials: i64,
) -> (Vec<KillOnDrop>, Vec<String>, NodeRuntime, i64) {
    let mut replicas = Vec::new();
    let mut bases = Vec::new();
    for node in ["node1", "node2"] {
        let addr = cluster.addr(node);
        let base = format!("http://{addr}:8080");
        replicas.push(KillOnDrop(
            cluster
                .command(node, common::augur_bin())
                .args(["serve", "--database-url", &pg.url])
                .args(["--listen", &format!("{addr}:8080"), "--token", ADMIN])
                .args(["--replica-url", &base])
                .env("AUGUR_LOG", "warn")
                .env_remove("AUGUR_TOKEN")
                .stdout(std::process::Stdio::null())
                .stderr(cluster.log(&format!(
                    "{}-{node}.log",
                    dir.display().to_string().replace('/', "_")
                )))
                .spawn()
                .expect("augur serve"),
        ));
        bases.push(base);
    }
    let clients = cluster.runtime("node3", 1);
    let spec = json!({
        "name": "failover", "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": trials, "parallel_trials": 2, "seed": 3,
        "trial_job": {
            "command": ["/bin/sh", script.display().to_string()],
            "env": {"EVENTS": events_file.display().to_string()},
            "output_dir": dir.join("runs").display().to_string()
        }
    });
    let made = bases.clone();
    let id = clients
        .run(async move {
            for base in &made {
                common::eventually("replica ready", Duration::from_secs(30), || async {
                    match common::http().get(format!("{base}/readyz")).send().await {
                        Ok(r) if r.status().is_success() => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await;
            }
            let created = common::call(
                &common::http(),
                &made[0],
                Some(ADMIN),
                reqwest::Method::POST,
                "/v1/studies",
                Some(spec),
            )
            .await;
            assert_eq!(created.status, 201, "{}", created.body);
            created.body["id"].as_i64().expect("id")
        })
        .await;
    (replicas, bases, clients, id)
}

/// The node on which the study's first two trials started (both on one: its runner's).
async fn two_started_on_one_node(events_file: &std::path::Path) -> String {
    common::eventually("two trials started", Duration::from_secs(60), || async {
        let started: Vec<_> = events(events_file)
            .into_iter()
            .filter(|e| e.0 == "start")
            .collect();
        match started.as_slice() {
            [a, b, ..] if a.2 == b.2 => Ok(a.2.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Once two trials have started on `node` (the one that took the study over).
async fn two_started_on(events_file: &std::path::Path, node: &str) {
    common::eventually(
        "the survivor runs both",
        Duration::from_secs(60),
        || async {
            let on_node = events(events_file)
                .iter()
                .filter(|e| e.0 == "start" && e.2 == node)
                .count();
            if on_node >= 2 {
                Ok(())
            } else {
                Err(format!("{on_node}"))
            }
        },
    )
    .await;
}

/// The study, once it has ended, and its trials, read from `base` on `clients`.
async fn wait_ended(clients: &NodeRuntime, base: String, id: i64) -> (Value, Value) {
    clients
        .run(async move {
            let http = common::http();
            let get = |path: String| {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    common::call(&http, &base, Some(ADMIN), reqwest::Method::GET, &path, None)
                        .await
                        .body
                }
            };
            let study = common::eventually(
                "the study completes",
                Duration::from_secs(180),
                || async move {
                    let s = get(routes::study(id)).await;
                    match s["state"].as_str() {
                        Some("active") | None => Err(format!("{s}")),
                        Some(_) => Ok(s),
                    }
                },
            )
            .await;
            (study, get(routes::trials(id)).await)
        })
        .await
}

/// Trains 20 one-second epochs, reporting each, logging start, end, or being stopped (SIGTERM)
/// with the time to `$EVENTS`.
const LONG_TRAINER_SH: &str = r#"
log() { echo "$1 $AUGUR_TRIAL_ID $(hostname) $(date +%s.%N)" >> "$EVENTS"; }
trap 'log stopped; exit 143' TERM
log start
for epoch in $(seq 1 20); do
  sleep 1
  echo "epoch=$epoch loss=0.$AUGUR_TRIAL_ID"
done
log end
"#;

/// The node running the study's trials is cut from PostgreSQL and from the other replica
/// (its processes go on). It cannot renew its runner lease, so before the lease lapses it
/// should stop its jobs; the other replica then takes the study and runs them again. No trial
/// ever runs on both nodes at once (from the events' times), each completes once, and after
/// the link heals nothing of the study is left on either node.
///
/// Its first run showed the gap this closes: the cut runner went on with its jobs (its
/// measurement reports waiting out the outage kept it from hearing any stop), the survivor's
/// clean-up of the leftover jobs killed them (the test cluster's nodes share one PID
/// namespace), and the healed runner recorded that failure for the trials the survivor was
/// running: both ended failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_cut_from_the_database_stops_its_jobs_before_another_takes_them() {
    let cluster = TestCluster::up(3);
    let pg = NodePostgres::start(&cluster, "node3", PG_PORT);
    let (dir, script, events_file) = test_dir(&cluster, "runner-cut", LONG_TRAINER_SH);
    let (_replicas, bases, clients, id) =
        deploy(&cluster, &pg, &dir, &script, &events_file, 2).await;
    let timed = |path: &std::path::Path| -> Vec<(String, i64, String, f64)> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                Some((
                    w.first()?.to_string(),
                    w.get(1)?.parse().ok()?,
                    w.get(2)?.to_string(),
                    w.get(3)?.parse().ok()?,
                ))
            })
            .collect()
    };
    let cut = two_started_on_one_node(&events_file).await;
    let survivor = if cut == "node1" { "node2" } else { "node1" };
    cluster.cut(&cut, "node3");
    cluster.cut(&cut, survivor);
    two_started_on(&events_file, survivor).await;
    cluster.heal(&cut, "node3");
    cluster.heal(&cut, survivor);
    let base = bases[if survivor == "node1" { 0 } else { 1 }].clone();
    let (study, _trials) = wait_ended(&clients, base, id).await;
    let log = timed(&events_file);
    println!("\n== runner cut: {cut} cut from PostgreSQL and {survivor} ==\n{log:?}");
    assert_eq!(study["trial_counts"]["completed"], 2, "{study}");
    // Each run of a trial: from its start to its end or stop (still running: to now).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    for trial in [1, 2] {
        let runs: Vec<(String, f64, f64)> = log
            .iter()
            .filter(|e| e.0 == "start" && e.1 == trial)
            .map(|s| {
                let until = log
                    .iter()
                    .filter(|e| e.0 != "start" && e.1 == trial && e.2 == s.2 && e.3 >= s.3)
                    .map(|e| e.3)
                    .fold(f64::INFINITY, f64::min);
                (s.2.clone(), s.3, until.min(now))
            })
            .collect();
        for a in &runs {
            for b in &runs {
                assert!(
                    a.0 == b.0 || a.2 <= b.1 || b.2 <= a.1,
                    "trial {trial} ran on {} and {} at once: {runs:?}",
                    a.0,
                    b.0
                );
            }
        }
    }
    let script = script.display().to_string();
    for node in ["node1", "node2"] {
        assert!(
            cluster.processes_on(node, &script).is_empty(),
            "a job outlived the study on {node}"
        );
    }
}

/// The first run of each trial trains 4 s, a later run 20 s; each reports `loss` as the node's
/// number and the trial's (`loss=2.1`: node2, trial 1), so the value says who ran it.
const FROZEN_TRAINER_SH: &str = r#"
node=$(hostname | tr -dc 0-9)
echo "start $AUGUR_TRIAL_ID $(hostname)" >> "$EVENTS"
if [ -e "$EVENTS.$AUGUR_TRIAL_ID" ]; then sleep 20; else touch "$EVENTS.$AUGUR_TRIAL_ID"; sleep 4; fi
echo "end $AUGUR_TRIAL_ID $(hostname)" >> "$EVENTS"
echo "loss=$node.$AUGUR_TRIAL_ID"
"#;

/// The replica running a study's trials freezes (SIGSTOP, as a stopped VM or a long GC pause
/// does) for longer than its runner lease; its jobs end meanwhile. The other replica takes
/// the study and runs the trials again; then the frozen one wakes with its jobs' outcomes in
/// hand. Those are stale: the study's batch refuses what a dispatcher reports for a study
/// whose runner lease it no longer holds, so each trial ends once, with the value of the run
/// of the replica that held the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_runner_that_wakes_after_losing_its_lease_records_nothing() {
    let cluster = TestCluster::up(3);
    let pg = NodePostgres::start(&cluster, "node3", PG_PORT);
    let (dir, script, events_file) = test_dir(&cluster, "runner-frozen", FROZEN_TRAINER_SH);
    let (_replicas, bases, clients, id) =
        deploy(&cluster, &pg, &dir, &script, &events_file, 2).await;
    let frozen = two_started_on_one_node(&events_file).await;
    let survivor = if frozen == "node1" { "node2" } else { "node1" };
    let server = cluster.processes_on(&frozen, "serve");
    assert!(!server.is_empty(), "augur serve on {frozen}");
    let signal = |signal| {
        for pid in &server {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), signal);
        }
    };
    signal(nix::sys::signal::Signal::SIGSTOP);
    two_started_on(&events_file, survivor).await;
    signal(nix::sys::signal::Signal::SIGCONT);
    let base = bases[if survivor == "node1" { 0 } else { 1 }].clone();
    let (study, trials) = wait_ended(&clients, base, id).await;
    let log = events(&events_file);
    println!(
        "\n== runner frozen: {frozen} stopped past its lease, {survivor} took over ==\n{log:?}\n{trials}"
    );
    assert_eq!(study["trial_counts"]["completed"], 2, "{study}");
    let node = |name: &str| {
        name.trim_start_matches("node")
            .parse::<f64>()
            .expect("node")
    };
    for t in trials["trials"].as_array().expect("trials") {
        let loss = t["final_measurement"]["metrics"]["loss"]
            .as_f64()
            .expect("loss");
        assert_eq!(
            loss.trunc(),
            node(survivor),
            "trial {} ended with the value of {frozen}'s stale run, not {survivor}'s: {t}",
            t["id"]
        );
    }
    let script = script.display().to_string();
    for node in ["node1", "node2"] {
        assert!(
            cluster.processes_on(node, &script).is_empty(),
            "a job outlived the study on {node}"
        );
    }
}
