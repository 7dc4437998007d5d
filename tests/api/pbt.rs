//! Population-based training over ask/tell: the clients keep the checkpoints, so a segment
//! that must start from another trial's checkpoint names it (`lineage.copying_from`); the
//! client copies it and says so (`checkpoint_copied`) before it trains on.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestApp, routes};
use crate::support::{app, suggest};

on_both_backends!(
    ask_tell_clients_copy_the_checkpoint_their_segment_starts_from,
    a_client_that_never_reports_its_copy_holds_up_no_parent,
);

/// A client's checkpoint of one trial: the epochs it holds, the model state `w`, and which
/// trial trained the last of them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Checkpoint {
    epochs: u64,
    w: f64,
    by: i64,
}

/// One segment as the client trained it.
#[derive(Debug, Clone, Copy)]
struct Segment {
    from: u64,
    to: u64,
    lr: f64,
    start: Checkpoint,
    end: Checkpoint,
}

/// `w` falls by a factor per epoch that depends on `lr` (best at 0.3), as `tests/jobs/pbt.rs`'s
/// trainer does.
fn train(start: Checkpoint, trial: i64, lr: f64, to: u64) -> Checkpoint {
    let factor = 1.0 - 0.5 * (-(lr / 0.3).ln().powi(2) / 2.0).exp();
    let mut state = start;
    for epoch in start.epochs + 1..=to {
        state = Checkpoint {
            epochs: epoch,
            w: state.w * factor,
            by: trial,
        };
    }
    state
}

fn pbt_spec() -> Value {
    json!({
        "name": "pbt-ask-tell",
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "lr", "type": "double", "min": 0.001, "max": 1, "scale": "log"}],
        "max_trials": 4,
        "parallel_trials": 2,
        "seed": 5,
        "fidelity": {"argument": "epochs", "min": 2, "max": 6},
        "scheduler": "pbt",
        "pbt": {"quantile_fraction": 0.25, "resample_probability": 0}
    })
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

/// A population of 4 trained by one client over ask/tell, copying checkpoints as told (and
/// reporting each copy when `report_copies`); checks each segment's start and the lineage.
async fn run_population(backend: &str, report_copies: bool) {
    let app = app(backend).await;
    let id = app.create_study(pbt_spec()).await;
    let mut checkpoints: BTreeMap<i64, Checkpoint> = BTreeMap::new();
    let mut segments: BTreeMap<i64, Vec<Segment>> = BTreeMap::new();
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
            segments.entry(trial).or_default().push(Segment {
                from: start.epochs,
                to: budget,
                lr,
                start,
                end,
            });
            let path = routes::trial_complete(id, trial);
            post_ok(&app, &path, json!({"metrics": {"loss": end.w}})).await;
        }
    }
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], 4, "{study}");
    assert_eq!(segments.len(), 4, "the population, no more: {segments:?}");
    for (trial, ss) in &segments {
        let ranges: Vec<(u64, u64)> = ss.iter().map(|s| (s.from, s.to)).collect();
        assert_eq!(ranges, [(0, 2), (2, 4), (4, 6)], "trial {trial}");
    }
    // At each segment's end the worst copies the best, as it was at that end; the others go
    // on from their own checkpoints with their own values.
    let mut expected_copies = Vec::new();
    for (segment, end) in [(0, 2), (1, 4)] {
        let mut ranked: Vec<(f64, i64)> = segments
            .iter()
            .map(|(t, ss)| (ss[segment].end.w, *t))
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (best, worst) = (ranked[0].1, ranked[3].1);
        expected_copies.push((worst, best, end));
        for (trial, ss) in &segments {
            let next = &ss[segment + 1];
            if *trial == worst {
                let parent = &segments[&best][segment];
                assert_eq!(
                    next.start, parent.end,
                    "epoch {end}: trial {trial} starts from {best}'s checkpoint"
                );
                let ratio = next.lr / parent.lr;
                assert!(
                    (ratio - 0.8).abs() < 1e-9 || (ratio - 1.2).abs() < 1e-9 || next.lr == 1.0,
                    "epoch {end}: lr {} explored from the parent's {}",
                    next.lr,
                    parent.lr
                );
            } else {
                assert_eq!(next.start, ss[segment].end, "epoch {end}: trial {trial}");
                assert_eq!(next.lr, ss[segment].lr, "trial {trial} keeps its values");
            }
        }
    }
    assert_eq!(
        copies, expected_copies,
        "each copy told once, at its segment's end"
    );
    // The lineage records each copy with the values the client was given.
    let trials = app.get(&routes::trials(id)).await.body;
    for (worst, best, end) in expected_copies {
        let t = trials["trials"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["id"] == worst))
            .expect("trial");
        let from_parent = t["lineage"]["segments"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["from_budget"] == end))
            .unwrap_or_else(|| panic!("epoch {end}: no segment in {t}"));
        assert_eq!(from_parent["parent"], best, "{t}");
        let segment = if end == 2 { 1 } else { 2 };
        assert_eq!(
            from_parent["parameters"]["lr"].as_f64(),
            Some(segments[&worst][segment].lr),
            "{t}"
        );
    }
}
