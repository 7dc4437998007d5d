//! The multi-node tests' history: ask/tell clients that record every request and answer
//! (`Client`, `Op`), the invariants checked on that history, and the report of a run.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::ADMIN;
use crate::common::routes;

/// What a client sent.
#[derive(Clone, Debug)]
pub enum Sent {
    Suggest,
    Complete { trial: i64, value: f64 },
}

/// What came back.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
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
pub struct Op {
    pub client: usize,
    pub study: i64,
    pub sent: Sent,
    pub replica: usize,
    pub start: f64,
    pub end: f64,
    pub answer: Answer,
    /// The replica the answer named as the study's owner.
    pub owner_named: Option<usize>,
}

pub struct History {
    pub t0: Instant,
    pub ops: Mutex<Vec<Op>>,
}

impl History {
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("history").clone()
    }
}

/// The value a client reports for a trial: known in advance, so a lost or changed
/// completion shows in the final read.
pub fn value_of(study: i64, trial: i64) -> f64 {
    (study * 100_000 + trial) as f64 / 1e6
}

/// An ask/tell client, as `augur worker` behaves: it follows the owner an answer names,
/// falls back to the other replica when the one it sends to does not answer, and avoids
/// that one for a few seconds; a suggest or completion without a definite answer is sent
/// again (`client_id` gives back the trials it holds; a completion sent twice is refused).
pub struct Client {
    pub id: usize,
    pub study: i64,
    pub http: reqwest::Client,
    pub bases: Arc<Vec<String>>,
    pub home: usize,
    pub followed: Option<usize>,
    pub avoid_until: Vec<Instant>,
    pub history: Arc<History>,
}

/// How long a client avoids a replica that did not answer.
pub const AVOID_FOR: Duration = Duration::from_secs(3);

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
                routes::suggest(self.study),
                json!({"count": 1, "client_id": format!("client-{}", self.id)}),
            ),
            Sent::Complete { trial, value } => (
                routes::trial_complete(self.study, trial),
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
    pub async fn run(mut self, train: Duration, stop: Arc<AtomicBool>) {
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
pub struct Studied {
    pub id: i64,
    pub name: &'static str,
    pub cap: usize,
    pub max_trials: usize,
    /// Its clients run until the budget is spent (not until told to stop).
    pub to_the_end: bool,
}

/// One invariant's verdict.
pub struct Check {
    pub name: String,
    pub held: bool,
    pub detail: String,
}

pub fn check(name: impl Into<String>, held: bool, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        held,
        detail: detail.into(),
    }
}

/// When each client held each trial: from the answer that handed it out to the first
/// completion sent (a lower bound on the time the server had it running for that client).
pub fn holds(ops: &[Op], study: i64) -> Vec<(usize, i64, f64, f64)> {
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
pub fn check_study(ops: &[Op], study: &Studied, trials: &[Value]) -> Vec<Check> {
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
pub fn check_answers(ops: &[Op]) -> Check {
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
pub struct Fault {
    pub what: String,
    pub from: f64,
    pub to: f64,
}

/// The replica the clients follow: the owner the answers named most often (or, when none was
/// named, the one that answered most).
pub fn followed_owner(ops: &[Op]) -> usize {
    let named = |r: usize| ops.iter().filter(|op| op.owner_named == Some(r)).count();
    let answered = |r: usize| {
        ops.iter()
            .filter(|op| op.replica == r && matches!(op.answer, Answer::Ok { .. }))
            .count()
    };
    (0..2).max_by_key(|&r| (named(r), answered(r))).unwrap_or(0)
}

/// Acknowledged completions per second in `[from, to)`.
pub fn rate(ops: &[Op], from: f64, to: f64) -> f64 {
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
pub fn recovery(ops: &[Op], fault: &Fault, before: f64, last: f64) -> Option<f64> {
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
pub fn report(title: &str, ops: &[Op], faults: &[Fault], checks: &[Check], extra: &[String]) {
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
        // One line per fault for `benches/multi_node.sh`'s table.
        out += &format!(
            "recovery-row | {title} | {:.0} s | {before:.1} | {during:.1} | {back} |\n",
            fault.to - fault.from
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

/// The checks themselves, on made-up histories: each invariant fails when it is broken.
mod the_checks {
    use super::*;

    /// `client` handed `trial` at `from` and completing it (acknowledged) at `to`.
    fn held(client: usize, trial: i64, from: f64, to: f64) -> [Op; 2] {
        let op = |sent, start, answer| Op {
            client,
            study: 1,
            sent,
            replica: 0,
            start,
            end: start + 0.01,
            answer,
            owner_named: None,
        };
        [
            op(
                Sent::Suggest,
                from - 0.01,
                Answer::Ok {
                    trials: vec![trial],
                    study_done: false,
                },
            ),
            op(
                Sent::Complete {
                    trial,
                    value: value_of(1, trial),
                },
                to,
                Answer::Ok {
                    trials: vec![],
                    study_done: false,
                },
            ),
        ]
    }

    fn completed(trial: i64) -> Value {
        json!({"id": trial, "state": "completed",
               "final_measurement": {"metrics": {"accuracy": value_of(1, trial)}}})
    }

    /// The names of the checks that failed.
    fn broken(ops: &[Op], trials: &[Value]) -> Vec<String> {
        let study = Studied {
            id: 1,
            name: "s",
            cap: 2,
            max_trials: 3,
            to_the_end: false,
        };
        check_study(ops, &study, trials)
            .into_iter()
            .filter(|c| !c.held)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn a_history_within_the_rules_breaks_nothing() {
        let ops: Vec<Op> = [
            held(0, 1, 0.0, 1.0),
            held(1, 2, 0.5, 1.5),
            held(0, 3, 1.2, 2.0),
        ]
        .concat();
        let trials = [completed(1), completed(2), completed(3)];
        assert_eq!(broken(&ops, &trials), Vec::<String>::new());
    }

    #[test]
    fn three_trials_held_at_once_break_a_cap_of_two() {
        let ops: Vec<Op> = [
            held(0, 1, 0.0, 1.0),
            held(1, 2, 0.1, 1.0),
            held(2, 3, 0.2, 1.0),
        ]
        .concat();
        let trials = [completed(1), completed(2), completed(3)];
        assert_eq!(broken(&ops, &trials), ["s: never above parallel_trials 2"]);
    }

    #[test]
    fn one_trial_held_by_two_clients_at_once_is_caught() {
        let mut ops: Vec<Op> = [held(0, 1, 0.0, 1.0), held(1, 1, 0.5, 1.5)].concat();
        // The second completion is refused (409), as the server would.
        ops[3].answer = Answer::Refused(409, "conflict".into());
        let found = broken(&ops, &[completed(1)]);
        assert!(
            found.contains(&"s: no trial held by two clients at once".to_string()),
            "{found:?}"
        );
    }

    #[test]
    fn an_acknowledged_completion_read_back_running_is_lost() {
        let ops = held(0, 1, 0.0, 1.0);
        let running = json!({"id": 1, "state": "active"});
        let found = broken(&ops, &[running]);
        assert!(
            found.contains(&"s: no acknowledged completion lost".to_string()),
            "{found:?}"
        );
    }

    #[test]
    fn more_trials_stored_than_max_trials_is_caught() {
        let ops = held(0, 1, 0.0, 1.0);
        let trials: Vec<Value> = (1..=4).map(completed).collect();
        let found = broken(&ops, &trials);
        assert!(
            found.contains(&"s: never above max_trials 3".to_string()),
            "{found:?}"
        );
    }
}
