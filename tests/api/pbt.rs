//! Population-based training over ask/tell: the clients keep the checkpoints, so a segment
//! that must start from another trial's checkpoint names it (`lineage.copying_from`); the
//! client copies it and says so (`checkpoint_copied`) before it trains on.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::pbt::{self, Launch};
use crate::common::{TestApp, routes};
use crate::support::{app, suggest};

on_both_backends!(
    ask_tell_clients_copy_the_checkpoint_their_segment_starts_from,
    a_client_that_never_reports_its_copy_holds_up_no_parent,
    a_trial_that_fails_instead_of_copying_holds_up_no_parent,
);

/// A client's checkpoint of one trial: the epochs it holds, the model state `w`, and which
/// trial trained the last of them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Checkpoint {
    epochs: u64,
    w: f64,
    by: i64,
}

/// Train `trial` from `start` to epoch `to` at `lr`, as `tests/jobs/pbt.rs`'s trainer does.
fn train(start: Checkpoint, trial: i64, lr: f64, to: u64) -> Checkpoint {
    let mut state = start;
    for epoch in start.epochs + 1..=to {
        state = Checkpoint {
            epochs: epoch,
            w: state.w * pbt::decay(lr),
            by: trial,
        };
    }
    state
}

async fn post_ok(app: &TestApp, path: &str, body: Value) -> Value {
    let r = app.post(path, body).await;
    assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
    r.body
}

async fn ask_tell_clients_copy_the_checkpoint_their_segment_starts_from(backend: &str) {
    run_population(backend, true).await;
}

/// The copy's report is what lets the parent train on; a client that copies but never says
/// so ends its segment anyway, and that ends the wait.
async fn a_client_that_never_reports_its_copy_holds_up_no_parent(backend: &str) {
    run_population(backend, false).await;
}

/// The tests' population trained by one client over ask/tell, copying checkpoints as told
/// (and reporting each copy when `report_copies`), checked as the dispatched runs are.
async fn run_population(backend: &str, report_copies: bool) {
    let app = app(backend).await;
    let id = app.create_study(pbt::population_spec(Value::Null)).await;
    let mut checkpoints: BTreeMap<i64, Checkpoint> = BTreeMap::new();
    let mut launches: BTreeMap<i64, Vec<Launch>> = BTreeMap::new();
    let mut copies: Vec<(i64, i64, u64)> = Vec::new();
    for _round in 0..40 {
        let answer = suggest(&app, id, 2, Some("w")).await;
        let trials = answer["trials"].as_array().expect("trials").clone();
        if trials.is_empty() {
            let study = app.get(&routes::study(id)).await.body;
            if study["state"] == "completed" {
                break;
            }
            continue;
        }
        for t in trials {
            let trial = t["id"].as_i64().expect("id");
            let budget = t["budget"].as_u64().expect("a whole budget");
            let lr = t["parameters"]["lr"].as_f64().expect("lr");
            if let Some(parent) = t["lineage"]["copying_from"].as_i64() {
                let copied = *checkpoints
                    .get(&parent)
                    .unwrap_or_else(|| panic!("trial {trial} copies {parent}, never trained"));
                checkpoints.insert(trial, copied);
                copies.push((trial, parent, copied.epochs));
                if report_copies {
                    let path = routes::trial_checkpoint_copied(id, trial);
                    let after = post_ok(&app, &path, json!({})).await;
                    assert!(after["lineage"]["copying_from"].is_null(), "{after}");
                }
            }
            let start = checkpoints.get(&trial).copied().unwrap_or(Checkpoint {
                epochs: 0,
                w: 1.0,
                by: trial,
            });
            assert_eq!(
                t["resume"].as_bool().unwrap_or(false),
                start.epochs > 0,
                "a segment after the first resumes: {t}"
            );
            let end = train(start, trial, lr, budget);
            checkpoints.insert(trial, end);
            launches.entry(trial).or_default().push(Launch {
                from: start.epochs,
                to: budget,
                lr,
                w_from: start.w,
                w_to: end.w,
                origin: start.by,
            });
            let path = routes::trial_complete(id, trial);
            post_ok(&app, &path, json!({"metrics": {"loss": end.w}})).await;
        }
    }
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    let exploits = pbt::check_population(&app, id, &study, &launches).await;
    assert_eq!(
        copies, exploits,
        "each copy told once, at its segment's end"
    );
}

/// A trial told to copy that fails instead ends the wait too: the trial it was to copy from
/// trains on to the full budget, and the study ends.
async fn a_trial_that_fails_instead_of_copying_holds_up_no_parent(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(pbt::population_spec(Value::Null)).await;
    let mut trained: BTreeMap<i64, (u64, f64)> = BTreeMap::new();
    let mut failed = None;
    for _round in 0..40 {
        let answer = suggest(&app, id, 2, Some("w")).await;
        let trials = answer["trials"].as_array().expect("trials").clone();
        if trials.is_empty() {
            let study = app.get(&routes::study(id)).await.body;
            if study["state"] == "completed" {
                break;
            }
            continue;
        }
        for t in trials {
            let trial = t["id"].as_i64().expect("id");
            if let Some(parent) = t["lineage"]["copying_from"].as_i64()
                && failed.is_none()
            {
                failed = Some((trial, parent));
                let path = routes::trial_fail(id, trial);
                post_ok(&app, &path, json!({"reason": "the copy failed"})).await;
                continue;
            }
            let lr = t["parameters"]["lr"].as_f64().expect("lr");
            let budget = t["budget"].as_u64().expect("a whole budget");
            let (from, w) = trained.get(&trial).copied().unwrap_or((0, 1.0));
            let w = (from..budget).fold(w, |w, _| w * pbt::decay(lr));
            trained.insert(trial, (budget, w));
            let path = routes::trial_complete(id, trial);
            post_ok(&app, &path, json!({"metrics": {"loss": w}})).await;
        }
    }
    let (copier, parent) = failed.expect("a segment told to copy");
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "the study ends: {study}");
    assert_eq!(
        study["trial_counts"]["failed"], 1,
        "trial {copier}: {study}"
    );
    assert_eq!(
        trained[&parent].0, 6,
        "trial {parent}, whose copy failed, trained on to the full budget"
    );
}
