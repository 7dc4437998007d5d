//! Augur on several hosts (`scripts/test-cluster.sh`, run as root): PostgreSQL on node3, two
//! `augur serve` replicas on node1 and node2, ask/tell clients on node4, every link through a
//! relay on its receiving node. Each test makes one fault while the clients work, records
//! every request and answer, checks the invariants on that history as Jepsen would (cap,
//! budget, no acknowledged completion lost, no trial held twice, each ended once), and prints a report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, KillOnDrop, NodePostgres, NodeRuntime, Relay, TestCluster, routes};

mod history;
use history::{
    AVOID_FOR, Answer, Check, Client, Fault, History, Op, Studied, check, check_answers,
    check_study, followed_owner, rate, report,
};

const ADMIN: &str = "multi-node-admin-token";
/// Where each replica listens, and its relay (the port the others and clients use).
const SERVE_PORT: u16 = 8080;
const RELAYED_SERVE_PORT: u16 = 18080;
const PG_PORT: u16 = 5432;
const RELAYED_PG_PORT: u16 = 15432;
const REPLICA_NODES: [&str; 2] = ["node1", "node2"];

/// The cluster with PostgreSQL, two replicas and the relays running. Fields drop in order:
/// clients and relays first, then the replicas, PostgreSQL, and the nodes.
struct Deployment {
    clients: NodeRuntime,
    relays: Vec<Relay>,
    /// node3's first.
    _relay_nodes: Vec<NodeRuntime>,
    _replicas: Vec<KillOnDrop>,
    _pg: NodePostgres,
    cluster: TestCluster,
    /// The replicas' URLs as clients and the other replica reach them (through the relays).
    bases: Arc<Vec<String>>,
}

impl Deployment {
    async fn start() -> Deployment {
        // node5: a worker host (the workers' test).
        let cluster = TestCluster::up(5);
        let pg = NodePostgres::start(&cluster, "node3", PG_PORT);
        let node3 = cluster.runtime("node3", 1);
        let pg_addr = cluster.addr("node3");
        let pg_relay = node3
            .run(Relay::start_on(
                format!("{pg_addr}:{RELAYED_PG_PORT}"),
                format!("{pg_addr}:{PG_PORT}"),
            ))
            .await;
        let database_url = pg
            .url
            .replace(&format!(":{PG_PORT}/"), &format!(":{}/", pg_relay.port));
        let (mut relays, mut relay_nodes, mut replicas, mut bases) =
            (vec![pg_relay], vec![node3], Vec::new(), Vec::new());
        let clients = cluster.runtime("node4", 2);
        for node in REPLICA_NODES {
            let addr = cluster.addr(node);
            let runtime = cluster.runtime(node, 1);
            relays.push(
                runtime
                    .run(Relay::start_on(
                        format!("{addr}:{RELAYED_SERVE_PORT}"),
                        format!("{addr}:{SERVE_PORT}"),
                    ))
                    .await,
            );
            relay_nodes.push(runtime);
            let base = format!("http://{addr}:{RELAYED_SERVE_PORT}");
            let child = cluster
                .command(node, common::augur_bin())
                .args(["serve", "--database-url", &database_url])
                .args(["--listen", &format!("{addr}:{SERVE_PORT}")])
                .args(["--no-dispatch", "--token", ADMIN, "--replica-url", &base])
                .env("AUGUR_LOG", "warn")
                .env_remove("AUGUR_TOKEN")
                .stdout(std::process::Stdio::null())
                .stderr(cluster.log(&format!("{node}-augur.log")))
                .spawn()
                .expect("augur serve");
            replicas.push(KillOnDrop(child));
            // One at a time: the first applies the migrations.
            let ready = base.clone();
            clients
                .run(async move {
                    common::eventually("replica ready", Duration::from_secs(30), || {
                        let url = format!("{ready}/readyz");
                        async move {
                            match common::http().get(&url).send().await {
                                Ok(r) if r.status().is_success() => Ok(()),
                                other => Err(format!("{other:?}")),
                            }
                        }
                    })
                    .await
                })
                .await;
            bases.push(base);
        }
        let all: Vec<String> = bases.clone();
        clients
            .run(async move {
                let refs: Vec<&str> = all.iter().map(String::as_str).collect();
                common::until_replicas_live(&refs, Some(ADMIN), 2.0).await;
            })
            .await;
        Deployment {
            clients,
            relays,
            _relay_nodes: relay_nodes,
            _replicas: replicas,
            _pg: pg,
            cluster,
            bases: Arc::new(bases),
        }
    }

    /// The age of the oldest open transaction in PostgreSQL, sampled every 200 ms from node3
    /// until stopped.
    fn watch_transactions(&self) -> Watch {
        let url = self._pg.url.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let until = stop.clone();
        let task = self._relay_nodes[0].spawn(async move {
            use sqlx::Connection;
            let mut oldest: f64 = 0.0;
            let mut conn = sqlx::PgConnection::connect(&url)
                .await
                .expect("PostgreSQL on node3");
            while !until.load(Ordering::Relaxed) {
                let age: f64 = sqlx::query_scalar(
                    "SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0)::float8 \
                     FROM pg_stat_activity WHERE backend_type = 'client backend' \
                     AND pid <> pg_backend_pid() AND xact_start IS NOT NULL",
                )
                .fetch_one(&mut conn)
                .await
                .expect("pg_stat_activity");
                oldest = oldest.max(age);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            oldest
        });
        Watch { stop, task }
    }

    /// A study made through node1, from node4: its id.
    async fn create_study(&self, name: &str, max_trials: i64, cap: i64) -> i64 {
        self.create(common::x_spec(
            name,
            ("accuracy", "maximize"),
            max_trials,
            cap,
            7,
        ))
        .await
    }

    /// `spec` made through node1, from node4: its id.
    async fn create(&self, spec: Value) -> i64 {
        let base = self.bases[0].clone();
        self.clients
            .run(async move {
                let created = common::call(
                    &common::http(),
                    &base,
                    Some(ADMIN),
                    reqwest::Method::POST,
                    "/v1/studies",
                    Some(spec),
                )
                .await;
                assert_eq!(created.status, 201, "{}", created.body);
                created.body["id"].as_i64().expect("study id")
            })
            .await
    }

    /// Every trial of `study`, read from node4 through whichever replica answers.
    async fn final_trials(&self, study: i64) -> Vec<Value> {
        let bases = self.bases.clone();
        self.clients
            .run(async move {
                let http = common::http();
                let mut trials = Vec::new();
                let mut token: Option<String> = None;
                loop {
                    let mut path = routes::all_trials(study);
                    if let Some(t) = &token {
                        path.push_str(&format!("&page_token={t}"));
                    }
                    let page = common::call(
                        &http,
                        &bases[1],
                        Some(ADMIN),
                        reqwest::Method::GET,
                        &path,
                        None,
                    )
                    .await;
                    assert_eq!(page.status, 200, "{}", page.body);
                    trials.extend(page.body["trials"].as_array().cloned().unwrap_or_default());
                    match page.body["next_page_token"].as_str() {
                        Some(t) => token = Some(t.to_string()),
                        None => return trials,
                    }
                }
            })
            .await
    }
}

/// A running [`Deployment::watch_transactions`].
struct Watch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<f64>,
}

impl Watch {
    async fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("watch")
    }
}

/// Clients on the busy study: 8, or `AUGUR_CLUSTER_CLIENTS` (the issue's figures are for 32).
fn busy_clients() -> usize {
    std::env::var("AUGUR_CLUSTER_CLIENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8)
}

/// A run: a busy study (`busy_clients()` on a cap of 3, until told to stop) and, started when
/// the fault begins, a budget study (3 clients, cap 2, 40 trials, run to the end); `fault` is
/// made after `calm` seconds and its `heal` after `hold` more; the clients stop `after` the
/// heal.
struct Scenario {
    title: &'static str,
    request_timeout: Duration,
    calm: f64,
    hold: f64,
    after: f64,
}

struct Run {
    ops: Vec<Op>,
    checks: Vec<Check>,
    fault: Fault,
}

/// Run `scenario` on `deployment`: `fault` makes the fault and says what it did, `heal`
/// undoes it; both are given the history so far.
async fn run_scenario(
    deployment: &Deployment,
    scenario: &Scenario,
    fault: impl FnOnce(&[Op]) -> String,
    heal: impl FnOnce(),
) -> Run {
    let busy = Studied {
        id: deployment.create_study("busy", 1_000_000, 3).await,
        name: "busy",
        cap: 3,
        max_trials: 1_000_000,
        to_the_end: false,
    };
    let budget = Studied {
        id: deployment.create_study("budget", 40, 2).await,
        name: "budget",
        cap: 2,
        max_trials: 40,
        to_the_end: true,
    };
    let history = Arc::new(History {
        t0: Instant::now(),
        ops: Mutex::new(Vec::new()),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let client = |id: usize, study: i64| {
        let http = common::http_builder()
            .connect_timeout(Duration::from_secs(1))
            .timeout(scenario.request_timeout)
            .build()
            .expect("client");
        Client {
            id,
            study,
            http,
            bases: deployment.bases.clone(),
            home: id % 2,
            followed: None,
            avoid_until: vec![Instant::now(); 2],
            history: history.clone(),
        }
    };
    let mut running = Vec::new();
    let busy_clients = busy_clients();
    for id in 0..busy_clients {
        let worker = client(id, busy.id);
        running.push(
            deployment
                .clients
                .spawn(worker.run(Duration::from_millis(30), stop.clone())),
        );
    }
    tokio::time::sleep(Duration::from_secs_f64(scenario.calm)).await;
    let from = history.now();
    let what = fault(&history.ops());
    for id in busy_clients..busy_clients + 3 {
        let worker = client(id, budget.id);
        running.push(
            deployment
                .clients
                .spawn(worker.run(Duration::from_millis(100), Arc::new(AtomicBool::new(false)))),
        );
    }
    tokio::time::sleep(Duration::from_secs_f64(scenario.hold)).await;
    heal();
    let to = history.now();
    tokio::time::sleep(Duration::from_secs_f64(scenario.after)).await;
    stop.store(true, Ordering::Relaxed);
    for task in running {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("clients end within 2 minutes of the stop")
            .expect("client");
    }
    let ops = history.ops();
    let mut checks = vec![check_answers(&ops)];
    for study in [&busy, &budget] {
        let trials = deployment.final_trials(study.id).await;
        checks.extend(check_study(&ops, study, &trials));
    }
    Run {
        ops,
        checks,
        fault: Fault { what, from, to },
    }
}

/// The replica the clients follow (the busy study's owner) cut from PostgreSQL for twice its
/// replica lease (10 s): clients fall back to the other, which serves the study once the lease
/// has expired, whatever the cut replica's transactions held; healed, it serves at full rate
/// again within the lease; no invariant breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_from_postgres_breaks_no_invariant_and_its_studies_are_served() {
    let deployment = Deployment::start().await;
    let scenario = Scenario {
        title: "the followed replica cut from PostgreSQL (node3)",
        request_timeout: Duration::from_secs(3),
        calm: 4.0,
        hold: 20.0,
        after: 14.0,
    };
    let cluster = &deployment.cluster;
    let cut = Mutex::new("node1");
    let oldest = deployment.watch_transactions();
    let mut run = run_scenario(
        &deployment,
        &scenario,
        |ops| {
            let owner = REPLICA_NODES[followed_owner(ops)];
            cluster.cut(owner, "node3");
            *cut.lock().expect("cut") = owner;
            format!("cut {owner}–node3 ({owner}: the replica the clients follow)")
        },
        || cluster.heal(*cut.lock().expect("cut"), "node3"),
    )
    .await;
    // A transaction the cut replica had open holds its study's row lock until PostgreSQL
    // ends it: never past the replica lease, or the other replica could not take over.
    let oldest = oldest.stop().await;
    run.checks.push(check(
        "no transaction stays open for the replica lease (10 s) or longer",
        oldest < 10.0,
        format!("the oldest seen was open {oldest:.1} s"),
    ));
    // The lease expires within 10 s of the cut, and the other replica reads the live set
    // every 2 s: from then on it serves the study itself.
    let fault = &run.fault;
    let served = rate(&run.ops, fault.from + 14.0, fault.to);
    run.checks.push(check(
        "the other replica serves within 14 s of the cut",
        served > 0.0,
        format!("{served:.1} completions/s from 14 s after the cut to the heal"),
    ));
    // Healed, it takes its studies back (its lease renews on a new connection). Its lanes'
    // transactions caught in the cut were given up after their deadline, so none waits for
    // TCP's retransmission back-off: no second stall once the clients follow it again.
    let before = rate(&run.ops, fault.from - 3.0, fault.from);
    let (mut t, mut gaps) = (fault.to + 2.0, Vec::new());
    while t + 1.0 < fault.to + scenario.after {
        let r = rate(&run.ops, t, t + 1.0);
        if r < before / 2.0 {
            gaps.push(format!("{t:.1} s: {r:.0}/s"));
        }
        t += 0.5;
    }
    run.checks.push(check(
        "from 2 s after the heal on, never a second below half the rate before the cut",
        gaps.is_empty(),
        format!("before {before:.1}/s; below half: {gaps:?}"),
    ));
    report(scenario.title, &run.ops, &[run.fault], &run.checks, &[]);
}

/// The two replicas cut from each other while both reach PostgreSQL: each serves what it
/// cannot send on, and no invariant breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_cut_from_each_other_break_no_invariant() {
    let deployment = Deployment::start().await;
    let scenario = Scenario {
        title: "node1 and node2 cut from each other",
        request_timeout: Duration::from_secs(3),
        calm: 4.0,
        hold: 12.0,
        after: 6.0,
    };
    let cluster = &deployment.cluster;
    let run = run_scenario(
        &deployment,
        &scenario,
        |_| {
            cluster.cut("node1", "node2");
            "cut node1–node2".into()
        },
        || cluster.heal("node1", "node2"),
    )
    .await;
    report(scenario.title, &run.ops, &[run.fault], &run.checks, &[]);
}

/// The clients cut from the replica they follow fall back to the other and keep working,
/// and come back to the owner once healed; no invariant breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cut_from_the_owner_fall_back_and_come_back() {
    let deployment = Deployment::start().await;
    let scenario = Scenario {
        title: "the clients' node4 cut from the replica they follow",
        request_timeout: Duration::from_secs(3),
        calm: 4.0,
        hold: 10.0,
        after: 8.0,
    };
    let cluster = &deployment.cluster;
    let cut = Mutex::new(0);
    let mut run = run_scenario(
        &deployment,
        &scenario,
        |ops| {
            let owner = followed_owner(ops);
            cluster.cut("node4", REPLICA_NODES[owner]);
            *cut.lock().expect("cut") = owner;
            format!("cut node4–{}", REPLICA_NODES[owner])
        },
        || cluster.heal("node4", REPLICA_NODES[*cut.lock().expect("cut")]),
    )
    .await;
    let owner = *cut.lock().expect("cut");
    let (fault, ops) = (&run.fault, &run.ops);
    let served = |replica: usize, from: f64, to: f64| {
        ops.iter()
            .filter(|op| op.replica == replica && op.start >= from && op.end < to)
            .filter(|op| matches!(op.answer, Answer::Ok { .. }))
            .count()
    };
    // Once a client's first try of the owner failed (AVOID_FOR after it, it tries again).
    let during = served(1 - owner, fault.from + 1.0, fault.to);
    let back = served(
        owner,
        fault.to + AVOID_FOR.as_secs_f64() + 1.0,
        f64::INFINITY,
    );
    run.checks.push(check(
        "the clients fell back to the other replica during the cut",
        during > 0,
        format!(
            "{during} answers from {} during the cut",
            REPLICA_NODES[1 - owner]
        ),
    ));
    run.checks.push(check(
        "the clients came back to the owner after the heal",
        back > 0,
        format!("{back} answers from {} after it", REPLICA_NODES[owner]),
    ));
    report(scenario.title, &run.ops, &[run.fault], &run.checks, &[]);
}

/// Every link (clients to replicas, replica to replica, replicas to PostgreSQL) 100 ms slower
/// each way (200 ms a round trip) and dropping 5% of its connections, opened and open,
/// through the relays: no invariant breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_lossy_links_break_no_invariant() {
    let deployment = Deployment::start().await;
    let scenario = Scenario {
        title: "every link +200 ms a round trip, 5% of connections dropped",
        request_timeout: Duration::from_secs(10),
        calm: 4.0,
        hold: 15.0,
        after: 6.0,
    };
    let relays = &deployment.relays;
    let run = run_scenario(
        &deployment,
        &scenario,
        |_| {
            for relay in relays {
                relay.set_faults(Duration::from_millis(100), 50);
            }
            "relays: 100 ms each way, 5% of connections dropped".into()
        },
        || {
            for relay in relays {
                relay.set_faults(Duration::ZERO, 0);
            }
        },
    )
    .await;
    let (connections, dropped) = relays.iter().fold((0, 0), |(c, d), relay| {
        (
            c + relay.faults.connections.load(Ordering::Relaxed),
            d + relay.faults.dropped.load(Ordering::Relaxed),
        )
    });
    let extra = [format!(
        "relays: {connections} connections, {dropped} dropped"
    )];
    report(scenario.title, &run.ops, &[run.fault], &run.checks, &extra);
}

/// `augur worker` on node5 and node4, reaching the replica on node1 by its host name with a
/// token. node5 cut from both replicas while it runs a trial: the trial goes back after its
/// lease (5 s) to the worker on node4, which completes it; once healed, node5's late
/// completion is refused, and every trial is completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_workers_trial_is_requeued_after_its_lease_and_completed_once() {
    const TRIALS: i64 = 6;
    let deployment = Deployment::start().await;
    let cluster = &deployment.cluster;
    let mut spec = common::x_spec("workers", ("accuracy", "maximize"), TRIALS, 2, 7);
    spec["trial_lease_secs"] = json!(5);
    let study = deployment.create(spec).await;
    let work = cluster.dir.join("workers");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("workers' directory");
    // By name: node5's /etc/hosts (the cluster's) says where node1 is.
    let url = format!("http://node1:{RELAYED_SERVE_PORT}");
    let worker = |node: &str, accuracy: f64, seconds: f64| {
        let script = work.join(format!("{node}.sh"));
        std::fs::write(
            &script,
            format!("sleep {seconds}\necho accuracy={accuracy}\n"),
        )
        .expect("script");
        let child = cluster
            .command(node, common::augur_bin())
            .args(["worker", "--url", &url, "--study", &study.to_string()])
            .args(["--slots", "1", "--client-id", node, "--output-dir"])
            .arg(work.join(node))
            .args(["--", "/bin/sh"])
            .arg(&script)
            .env("AUGUR_TOKEN", ADMIN)
            .env("AUGUR_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("augur worker");
        KillOnDrop(child)
    };
    let trials_now = || deployment.final_trials(study);
    let cut_worker = worker("node5", 0.1, 4.0);
    // Cut once node5 holds a trial.
    let held = common::eventually("node5 holds a trial", Duration::from_secs(30), || async {
        let trials = trials_now().await;
        trials
            .iter()
            .find(|t| t["state"] == "active" && t["client_id"] == "node5/0")
            .and_then(|t| t["id"].as_i64())
            .ok_or(format!("{trials:?}"))
    })
    .await;
    let cut_at = Instant::now();
    cluster.cut("node5", "node1");
    cluster.cut("node5", "node2");
    let other_worker = worker("node4", 0.2, 0.5);
    let requeued = common::eventually(
        "node5's trial completed by node4",
        Duration::from_secs(30),
        || async {
            let trials = trials_now().await;
            let trial = trials.iter().find(|t| t["id"] == held).cloned();
            match trial {
                Some(t) if t["state"] == "completed" => Ok(t),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let requeued_after = cut_at.elapsed();
    cluster.heal("node5", "node1");
    cluster.heal("node5", "node2");
    // Each worker's exit status and log, once it ends by itself.
    let logs = |mut worker: KillOnDrop| async move {
        tokio::time::timeout(
            Duration::from_secs(150),
            tokio::task::spawn_blocking(move || {
                let mut log = String::new();
                if let Some(mut stderr) = worker.0.stderr.take() {
                    use std::io::Read;
                    let _ = stderr.read_to_string(&mut log);
                }
                (worker.0.wait().expect("worker"), log)
            }),
        )
        .await
        .expect("the worker ends")
        .expect("join")
    };
    let (other_status, other_log) = logs(other_worker).await;
    let (cut_status, cut_log) = logs(cut_worker).await;
    // Both workers ended by themselves: no trainer of theirs is left on any node.
    let trainers_left = std::process::Command::new("pgrep")
        .args(["-f", &work.display().to_string()])
        .output()
        .expect("pgrep");
    assert!(
        trainers_left.stdout.is_empty(),
        "trainers left: {}",
        String::from_utf8_lossy(&trainers_left.stdout)
    );
    let trials = trials_now().await;
    let completed = trials.iter().filter(|t| t["state"] == "completed").count() as i64;
    println!(
        "\n== multi-node: a worker cut from the server ==\nnode5 held trial {held}; cut; \
         it was completed by node4 {:.1} s after the cut (lease 5 s) with accuracy {}; \
         {completed} of {TRIALS} completed\n-- node5's worker:\n{cut_log}-- node4's worker:\n{other_log}",
        requeued_after.as_secs_f64(),
        requeued["final_measurement"]["metrics"]["accuracy"]
    );
    assert!(other_status.success() && cut_status.success());
    assert_eq!(requeued["client_id"], "node4/0", "{requeued}");
    assert_eq!(requeued["final_measurement"]["metrics"]["accuracy"], 0.2);
    assert!(
        requeued_after >= Duration::from_secs(5),
        "requeued before its lease"
    );
    assert_eq!(completed, TRIALS, "{trials:?}");
    assert_eq!(trials.len() as i64, TRIALS);
}

/// One line of the pool test's trainer: what a trainer process did, where and when.
#[derive(Debug)]
struct TrainerEvent {
    kind: String,
    host: String,
    trial: i64,
    nanos: i64,
}

fn trainer_events(path: &std::path::Path) -> Vec<TrainerEvent> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [kind, host, trial, nanos] = f[..] else {
                return None;
            };
            Some(TrainerEvent {
                kind: kind.to_string(),
                host: host.to_string(),
                trial: trial.parse().ok()?,
                nanos: nanos.parse().ok()?,
            })
        })
        .collect()
}

/// `augur worker --pool` on node5 and node4, the trials' directories on the nodes' shared
/// file system. node5 is cut from both replicas while its trainer runs (one that would go on
/// for 20 s): node5's worker stops the trainer before its lease (5 s) can run out, so the
/// trial, requeued to node4, never has two trainers in its directory at once; node4
/// completes it, every trial is completed once, and once healed no trainer is left on node5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_pool_worker_stops_its_trainer_before_its_trial_is_requeued() {
    const TRIALS: i64 = 4;
    const LEASE_SECS: u64 = 5;
    let deployment = Deployment::start().await;
    let cluster = &deployment.cluster;
    let work = cluster.dir.join("pool-workers");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("workers' directory");
    let events = work.join("events.log");
    let trainer = work.join("trainer.sh");
    std::fs::write(
        &trainer,
        format!(
            r#"ev={events}
h=$(hostname)
echo "start $h $AUGUR_TRIAL_ID $(date +%s%N)" >> "$ev"
if [ "$h" = node5 ]; then
  i=0
  while [ $i -lt 100 ]; do
    echo "alive $h $AUGUR_TRIAL_ID $(date +%s%N)" >> "$ev"
    sleep 0.2
    i=$((i + 1))
  done
  echo accuracy=0.1
else
  sleep 0.5
  echo accuracy=0.2
fi
"#,
            events = events.display()
        ),
    )
    .expect("trainer");
    let mut spec = common::x_spec("pool-cut", ("accuracy", "maximize"), TRIALS, 2, 7);
    spec["trial_lease_secs"] = json!(LEASE_SECS);
    spec["trial_job"] = json!({
        "executor": "pool",
        "pool": "cut",
        "command": ["sh", trainer.display().to_string()],
        "output_dir": work.join("runs").display().to_string(),
        "max_retries": 2,
    });
    let study = deployment.create(spec).await;
    let url = format!("http://node1:{RELAYED_SERVE_PORT}");
    let worker = |node: &str| {
        let child = cluster
            .command(node, common::augur_bin())
            .args(["worker", "--url", &url, "--pool", "cut", "--slots", "1"])
            .args(["--client-id", node, "--job-commands", "sh"])
            .env("AUGUR_TOKEN", ADMIN)
            .env("AUGUR_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(cluster.log(&format!("{node}-pool-worker.log")))
            .spawn()
            .expect("augur worker --pool");
        KillOnDrop(child)
    };
    let trials_now = || deployment.final_trials(study);
    let cut_worker = worker("node5");
    let held = common::eventually("node5 trains a trial", Duration::from_secs(30), || async {
        trainer_events(&events)
            .iter()
            .find(|e| e.kind == "alive" && e.host == "node5")
            .map(|e| e.trial)
            .ok_or_else(|| "no trainer on node5 yet".to_string())
    })
    .await;
    let cut_at = Instant::now();
    cluster.cut("node5", "node1");
    cluster.cut("node5", "node2");
    let other_worker = worker("node4");
    let completed = common::eventually(
        "every trial completed by node4",
        Duration::from_secs(60),
        || async {
            let trials = trials_now().await;
            let done = trials.iter().filter(|t| t["state"] == "completed").count() as i64;
            if done == TRIALS {
                Ok(trials)
            } else {
                Err(format!("{done} of {TRIALS} completed: {trials:?}"))
            }
        },
    )
    .await;
    let done_after = cut_at.elapsed();
    cluster.heal("node5", "node1");
    cluster.heal("node5", "node2");
    // Healed: node5's worker reaches the server again and finds nothing left to run.
    tokio::time::sleep(Duration::from_secs(LEASE_SECS)).await;
    let trainers_left = std::process::Command::new("pgrep")
        .args(["-f", &trainer.display().to_string()])
        .output()
        .expect("pgrep");
    drop(other_worker);
    drop(cut_worker);
    let all = trainer_events(&events);
    let last_alive_on_node5 = all
        .iter()
        .filter(|e| e.host == "node5" && e.trial == held)
        .map(|e| e.nanos)
        .max()
        .expect("node5's events");
    let started_on_node4 = all
        .iter()
        .filter(|e| e.kind == "start" && e.host == "node4" && e.trial == held)
        .map(|e| e.nanos)
        .min();
    let trial = completed
        .iter()
        .find(|t| t["id"] == held)
        .cloned()
        .expect("the held trial");
    println!(
        "\n== multi-node: a pool worker cut from the server ==\nnode5 trained trial {held}; cut; \
         node5's trainer last wrote {:.2} s after the cut, node4 started it {:.2} s after; \
         every trial completed {:.1} s after the cut (lease {LEASE_SECS} s)",
        (last_alive_on_node5 - cut_nanos(cut_at)) as f64 / 1e9,
        started_on_node4.map_or(f64::NAN, |s| (s - cut_nanos(cut_at)) as f64 / 1e9),
        done_after.as_secs_f64(),
    );
    assert_eq!(trial["client_id"], "node4/0", "{trial}");
    assert_eq!(trial["final_measurement"]["metrics"]["accuracy"], 0.2);
    let started_on_node4 = started_on_node4.expect("node4 ran the held trial");
    assert!(
        last_alive_on_node5 < started_on_node4,
        "node5's trainer of trial {held} still ran when node4 started it"
    );
    assert!(
        trainers_left.stdout.is_empty(),
        "trainers left after healing: {}",
        String::from_utf8_lossy(&trainers_left.stdout)
    );
    assert_eq!(completed.len() as i64, TRIALS, "{completed:?}");
}

/// `cut_at` on the trainers' clock (nanoseconds since the epoch).
fn cut_nanos(cut_at: Instant) -> i64 {
    let since = cut_at.elapsed();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64;
    now - since.as_nanos() as i64
}
