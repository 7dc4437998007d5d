//! Augur on several hosts (`scripts/test-cluster.sh`, run as root): PostgreSQL on node3, two
//! `augur serve` replicas on node1 and node2, ask/tell clients on node4, every link through a
//! relay on its receiving node. Each test makes one fault while the clients work, records
//! every request and answer, checks the invariants on that history as Jepsen would (cap,
//! budget, no acknowledged completion lost, no trial held twice, each ended once), and prints a report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, KillOnDrop, NodePostgres, NodeRuntime, Relay, TestCluster};

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
        let base = self.bases[0].clone();
        let spec = common::x_spec(name, ("accuracy", "maximize"), max_trials, cap, 7);
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
                    let mut path = format!("/v1/studies/{study}/trials?page_size=1000");
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

/// What a client sent.
#[derive(Clone, Debug)]
enum Sent {
    Suggest,
    Complete { trial: i64, value: f64 },
}

/// What came back.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// 200: a suggest's trial ids and whether the study is done; a completion's ack.
    Ok { trials: Vec<i64>, study_done: bool },
    /// A 4xx: not done (409 for a completion of a trial already ended).
    Refused(u16, String),
    /// 503 or 429: not done, safe to send again.
    NotDone(u16),
    /// No answer, or 500 `unanswered`: it may or may not have been applied.
    Unknown(String),
    /// Any other 5xx: the service promises none.
    Broken(u16, String),
}

/// One request and its answer; times in seconds since the run began.
#[derive(Clone, Debug)]
struct Op {
    client: usize,
    study: i64,
    sent: Sent,
    replica: usize,
    start: f64,
    end: f64,
    answer: Answer,
    /// The replica the answer named as the study's owner.
    owner_named: Option<usize>,
}

struct History {
    t0: Instant,
    ops: Mutex<Vec<Op>>,
}

impl History {
    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("history").clone()
    }
}

/// The value a client reports for a trial: known in advance, so a lost or changed
/// completion shows in the final read.
fn value_of(study: i64, trial: i64) -> f64 {
    (study * 100_000 + trial) as f64 / 1e6
}

/// An ask/tell client, as `augur worker` behaves: it follows the owner an answer names,
/// falls back to the other replica when the one it sends to does not answer, and avoids
/// that one for a few seconds; a suggest or completion without a definite answer is sent
/// again (`client_id` gives back the trials it holds; a completion sent twice is refused).
struct Client {
    id: usize,
    study: i64,
    http: reqwest::Client,
    bases: Arc<Vec<String>>,
    home: usize,
    followed: Option<usize>,
    avoid_until: Vec<Instant>,
    history: Arc<History>,
}

/// How long a client avoids a replica that did not answer.
const AVOID_FOR: Duration = Duration::from_secs(3);

impl Client {
    fn target(&self) -> usize {
        let now = Instant::now();
        let usable = |r: usize| self.avoid_until[r] <= now;
        match self.followed {
            Some(f) if usable(f) => f,
            _ if usable(self.home) => self.home,
            _ if usable(1 - self.home) => 1 - self.home,
            // Both avoided: the one avoided longest ago.
            _ => (0..2).min_by_key(|&r| self.avoid_until[r]).unwrap_or(0),
        }
    }

    async fn send(&mut self, sent: Sent) -> Answer {
        let replica = self.target();
        let base = &self.bases[replica];
        let (path, body) = match &sent {
            Sent::Suggest => (
                format!("/v1/studies/{}/suggest", self.study),
                json!({"count": 1, "client_id": format!("client-{}", self.id)}),
            ),
            Sent::Complete { trial, value } => (
                format!("/v1/studies/{}/trials/{trial}/complete", self.study),
                json!({"metrics": {"accuracy": value}}),
            ),
        };
        let start = self.history.now();
        let result = self
            .http
            .post(format!("{base}{path}"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await;
        let mut owner_named = None;
        let answer = match result {
            Err(e) => Answer::Unknown(format!("no answer: {e}")),
            Ok(response) => {
                let status = response.status().as_u16();
                owner_named = response
                    .headers()
                    .get(augur::model::request::STUDY_REPLICA_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|named| self.bases.iter().position(|b| b == named));
                match response.text().await {
                    Err(e) => Answer::Unknown(format!("answer cut: {e}")),
                    Ok(text) => {
                        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                        let code = body["error"]["code"].as_str().unwrap_or("").to_string();
                        match status {
                            200 => Answer::Ok {
                                trials: body["trials"]
                                    .as_array()
                                    .map(|ts| ts.iter().filter_map(|t| t["id"].as_i64()).collect())
                                    .unwrap_or_default(),
                                study_done: body["study_state"] == "completed",
                            },
                            429 | 503 => Answer::NotDone(status),
                            500 if code == "unanswered" => Answer::Unknown("500 unanswered".into()),
                            400..=499 => Answer::Refused(status, code),
                            _ => Answer::Broken(status, text),
                        }
                    }
                }
            }
        };
        let end = self.history.now();
        if matches!(&answer, Answer::Unknown(why) if why.starts_with("no answer")) {
            self.avoid_until[replica] = Instant::now() + AVOID_FOR;
            if self.followed == Some(replica) {
                self.followed = None;
            }
        }
        if let Some(owner) = owner_named
            && self.avoid_until[owner] <= Instant::now()
        {
            self.followed = Some(owner);
        }
        self.history.ops.lock().expect("history").push(Op {
            client: self.id,
            study: self.study,
            sent,
            replica,
            start,
            end,
            answer: answer.clone(),
            owner_named,
        });
        answer
    }

    /// Ask, train, tell, until `stop` (finishing what it may hold) or the study is done.
    async fn run(mut self, train: Duration, stop: Arc<AtomicBool>) {
        // A suggest without a definite answer may have handed this client a trial: it asks
        // again before it leaves, to get it back and end it.
        let mut may_hold = false;
        loop {
            if stop.load(Ordering::Relaxed) && !may_hold {
                return;
            }
            match self.send(Sent::Suggest).await {
                Answer::Ok { trials, study_done } => {
                    may_hold = false;
                    if trials.is_empty() {
                        if study_done {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    for trial in trials {
                        tokio::time::sleep(train).await;
                        self.complete(trial).await;
                    }
                }
                Answer::Unknown(_) => may_hold = true,
                Answer::NotDone(_) | Answer::Broken(..) => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                // The checks report it.
                Answer::Refused(..) => return,
            }
        }
    }

    async fn complete(&mut self, trial: i64) {
        let value = value_of(self.study, trial);
        loop {
            match self.send(Sent::Complete { trial, value }).await {
                Answer::Ok { .. } | Answer::Refused(..) => return,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// A study under test and what the checks need to know of it.
struct Studied {
    id: i64,
    name: &'static str,
    cap: usize,
    max_trials: usize,
    /// Its clients run until the budget is spent (not until told to stop).
    to_the_end: bool,
}

/// One invariant's verdict.
struct Check {
    name: String,
    held: bool,
    detail: String,
}

fn check(name: impl Into<String>, held: bool, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        held,
        detail: detail.into(),
    }
}

/// When each client held each trial: from the answer that handed it out to the first
/// completion sent (a lower bound on the time the server had it running for that client).
fn holds(ops: &[Op], study: i64) -> Vec<(usize, i64, f64, f64)> {
    let mut open: std::collections::BTreeMap<(usize, i64), f64> = Default::default();
    let mut held = Vec::new();
    for op in ops.iter().filter(|op| op.study == study) {
        match (&op.sent, &op.answer) {
            (Sent::Suggest, Answer::Ok { trials, .. }) => {
                for &t in trials {
                    open.entry((op.client, t)).or_insert(op.end);
                }
            }
            (Sent::Complete { trial, .. }, _) => {
                if let Some(from) = open.remove(&(op.client, *trial)) {
                    held.push((op.client, *trial, from, op.start));
                }
            }
            _ => {}
        }
    }
    held.extend(
        open.into_iter()
            .map(|((client, trial), from)| (client, trial, from, f64::INFINITY)),
    );
    held
}

/// The invariants of one study, from the history and its trials read after the run.
fn check_study(ops: &[Op], study: &Studied, trials: &[Value]) -> Vec<Check> {
    let name = study.name;
    let mut checks = Vec::new();
    let mine: Vec<&Op> = ops.iter().filter(|op| op.study == study.id).collect();
    let held = holds(ops, study.id);
    // The cap: never more trials held at once than `parallel_trials`.
    let mut events: Vec<(f64, i32)> = held
        .iter()
        .flat_map(|&(_, _, from, to)| [(from, 1), (to, -1)])
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0, 0);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    checks.push(check(
        format!("{name}: never above parallel_trials {}", study.cap),
        most as usize <= study.cap,
        format!("at most {most} held at once"),
    ));
    // The budget.
    let handed: std::collections::BTreeSet<i64> = held.iter().map(|h| h.1).collect();
    checks.push(check(
        format!("{name}: never above max_trials {}", study.max_trials),
        trials.len() <= study.max_trials && handed.len() <= study.max_trials,
        format!(
            "{} trials stored, {} handed out",
            trials.len(),
            handed.len()
        ),
    ));
    // No trial held by two clients at once.
    let mut overlapping = Vec::new();
    for (i, a) in held.iter().enumerate() {
        for b in &held[i + 1..] {
            if a.1 == b.1 && a.0 != b.0 && a.2 < b.3 && b.2 < a.3 {
                overlapping.push(a.1);
            }
        }
    }
    checks.push(check(
        format!("{name}: no trial held by two clients at once"),
        overlapping.is_empty(),
        format!(
            "{} trials handed out; held twice: {overlapping:?}",
            handed.len()
        ),
    ));
    // Every acknowledged completion reads back completed, with its value.
    let stored: std::collections::BTreeMap<i64, &Value> = trials
        .iter()
        .filter_map(|t| Some((t["id"].as_i64()?, t)))
        .collect();
    let mut acked = 0;
    let mut lost = Vec::new();
    let mut acks: std::collections::BTreeMap<i64, usize> = Default::default();
    for op in &mine {
        if let (Sent::Complete { trial, value }, Answer::Ok { .. }) = (&op.sent, &op.answer) {
            acked += 1;
            *acks.entry(*trial).or_default() += 1;
            let read = stored.get(trial);
            let ok = read.is_some_and(|t| {
                t["state"] == "completed"
                    && t["final_measurement"]["metrics"]["accuracy"].as_f64() == Some(*value)
            });
            if !ok {
                lost.push(*trial);
            }
        }
    }
    checks.push(check(
        format!("{name}: no acknowledged completion lost"),
        lost.is_empty(),
        format!("{acked} acknowledged; lost or changed: {lost:?}"),
    ));
    // Each trial ended once: one acknowledgement at most, a 409 only for a completion sent
    // again after an unknown outcome, and every trial stored ended (none left running).
    let twice: Vec<i64> = acks
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(t, _)| *t)
        .collect();
    let mut unexplained = Vec::new();
    let mut refused = Vec::new();
    for (i, op) in mine.iter().enumerate() {
        match (&op.sent, &op.answer) {
            (Sent::Complete { trial, .. }, Answer::Refused(409, _)) => {
                let sent_before = mine[..i].iter().any(|o| {
                    o.client == op.client
                        && matches!(o.sent, Sent::Complete { trial: t, .. } if t == *trial)
                        && matches!(o.answer, Answer::Unknown(_))
                });
                if !sent_before {
                    unexplained.push(*trial);
                }
            }
            (_, Answer::Refused(status, code)) => refused.push(format!("{status} {code}")),
            _ => {}
        }
    }
    let unended: Vec<i64> = trials
        .iter()
        .filter(|t| t["state"] != "completed")
        .filter_map(|t| t["id"].as_i64())
        .collect();
    checks.push(check(
        format!("{name}: every trial ended exactly once"),
        twice.is_empty() && unexplained.is_empty() && unended.is_empty(),
        format!(
            "{} stored; acknowledged twice: {twice:?}; 409 without an earlier try: \
             {unexplained:?}; not ended: {unended:?}",
            trials.len()
        ),
    ));
    checks.push(check(
        format!("{name}: refused only as a repeat"),
        refused.is_empty(),
        format!("other refusals: {refused:?}"),
    ));
    if study.to_the_end {
        let completed = trials.iter().filter(|t| t["state"] == "completed").count();
        checks.push(check(
            format!("{name}: the budget is spent"),
            completed == study.max_trials,
            format!("{completed} of {} completed", study.max_trials),
        ));
    }
    checks
}

/// Checks of the whole history: no 5xx but 503 and 500 `unanswered`.
fn check_answers(ops: &[Op]) -> Check {
    let broken: Vec<String> = ops
        .iter()
        .filter_map(|op| match &op.answer {
            Answer::Broken(status, body) => Some(format!("{status} {body}")),
            _ => None,
        })
        .collect();
    check(
        "no 5xx but 503 and 500 unanswered",
        broken.is_empty(),
        format!("{} requests; others: {broken:?}", ops.len()),
    )
}

/// A fault injected during a run, with when it began and ended (seconds since the start).
struct Fault {
    what: String,
    from: f64,
    to: f64,
}

/// The replica the clients follow: the owner the answers named most often (or, when none was
/// named, the one that answered most).
fn followed_owner(ops: &[Op]) -> usize {
    let named = |r: usize| ops.iter().filter(|op| op.owner_named == Some(r)).count();
    let answered = |r: usize| {
        ops.iter()
            .filter(|op| op.replica == r && matches!(op.answer, Answer::Ok { .. }))
            .count()
    };
    (0..2).max_by_key(|&r| (named(r), answered(r))).unwrap_or(0)
}

/// Acknowledged completions per second in `[from, to)`.
fn rate(ops: &[Op], from: f64, to: f64) -> f64 {
    let n = ops
        .iter()
        .filter(|op| {
            matches!(op.sent, Sent::Complete { .. }) && matches!(op.answer, Answer::Ok { .. })
        })
        .filter(|op| op.end >= from && op.end < to)
        .count();
    if to > from {
        n as f64 / (to - from)
    } else {
        0.0
    }
}

/// Seconds from the fault's end until a one-second window reaches 90% of the rate before it.
fn recovery(ops: &[Op], fault: &Fault, before: f64, last: f64) -> Option<f64> {
    let mut t = fault.to;
    while t + 1.0 <= last {
        if rate(ops, t, t + 1.0) >= 0.9 * before {
            return Some(t - fault.to);
        }
        t += 0.1;
    }
    None
}

/// Print the run's report; fail if a check did not hold.
fn report(title: &str, ops: &[Op], faults: &[Fault], checks: &[Check], extra: &[String]) {
    let count = |f: &dyn Fn(&Answer) -> bool| ops.iter().filter(|op| f(&op.answer)).count();
    let last = ops.iter().map(|op| op.end).fold(0.0, f64::max);
    let mut out = format!("\n== multi-node: {title} ==\n");
    out += &format!(
        "requests: {} (ok {}, refused {}, 503/429 {}, unknown outcome {}, other 5xx {}); to node1 {}, node2 {}; run {last:.1} s\n",
        ops.len(),
        count(&|a| matches!(a, Answer::Ok { .. })),
        count(&|a| matches!(a, Answer::Refused(..))),
        count(&|a| matches!(a, Answer::NotDone(_))),
        count(&|a| matches!(a, Answer::Unknown(_))),
        count(&|a| matches!(a, Answer::Broken(..))),
        ops.iter().filter(|op| op.replica == 0).count(),
        ops.iter().filter(|op| op.replica == 1).count(),
    );
    for fault in faults {
        let before = rate(ops, (fault.from - 3.0).max(0.0), fault.from);
        let during = rate(ops, fault.from, fault.to);
        let back = recovery(ops, fault, before, last)
            .map_or("not within the run".to_string(), |s| format!("{s:.1} s"));
        out += &format!(
            "fault {:.1}–{:.1} s: {}; completions/s before {before:.1}, during {during:.1}; \
             recovery (healed → 90% of before) {back}\n",
            fault.from, fault.to, fault.what
        );
    }
    let seconds = last.ceil() as usize;
    let per_second: Vec<String> = (0..seconds)
        .map(|t| format!("{:.0}", rate(ops, t as f64, t as f64 + 1.0)))
        .collect();
    out += &format!(
        "acknowledged completions per second: {}\n",
        per_second.join(" ")
    );
    for line in extra {
        out += &format!("{line}\n");
    }
    for c in checks {
        out += &format!(
            "  [{}] {} ({})\n",
            if c.held { "ok" } else { "FAILED" },
            c.name,
            c.detail
        );
    }
    println!("{out}");
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.held)
        .map(|c| c.name.as_str())
        .collect();
    assert!(failed.is_empty(), "invariants broken: {failed:?}\n{out}");
}

/// A run: a busy study (8 clients on a cap of 3, until told to stop) and, started when the
/// fault begins, a budget study (3 clients, cap 2, 40 trials, run to the end); `fault` is
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
    for id in 0..8 {
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
    for id in 8..11 {
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
/// has expired, whatever the cut replica's transactions held; no invariant breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_from_postgres_breaks_no_invariant_and_its_studies_are_served() {
    let deployment = Deployment::start().await;
    let scenario = Scenario {
        title: "the followed replica cut from PostgreSQL (node3)",
        request_timeout: Duration::from_secs(3),
        calm: 4.0,
        hold: 20.0,
        after: 6.0,
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
    let base = deployment.bases[0].clone();
    let study: i64 = deployment
        .clients
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
        .await;
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
