//! Multi-fidelity studies over ask/tell: a pulled worker gets trials at the lowest rung, a
//! completion pauses them, and later suggestions resume the same trial at the next budget
//! (ASHA's promotions) or stop it at its rung when nothing is left.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, TestApp};
use crate::support::{app, ids, suggest};

on_both_backends!(ask_tell_workers_get_promotions_as_the_same_trial_at_a_larger_budget,);

fn asha_spec() -> Value {
    let mut spec = common::x_spec("asha", ("loss", "minimize"), 3, 3, 5);
    spec["fidelity"] = json!({"argument": "epochs", "min": 1, "max": 9, "reduction_factor": 3});
    spec["scheduler"] = json!("asha");
    spec
}

async fn report(app: &TestApp, study: i64, trial: i64, loss: f64) -> Value {
    let r = app
        .post(
            &format!("/v1/studies/{study}/trials/{trial}/complete"),
            json!({"metrics": {"loss": loss}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "complete: {}", r.body);
    r.body
}

async fn ask_tell_workers_get_promotions_as_the_same_trial_at_a_larger_budget(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(asha_spec()).await;
    let first = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&first["trials"]), vec![1, 2, 3]);
    assert!(
        first["trials"]
            .as_array()
            .expect("trials")
            .iter()
            .all(|t| t["budget"] == 1 && t["parameters"].get("epochs").is_none()),
        "new trials start at the lowest rung; the budget is no parameter: {first}"
    );
    // A completion below the full budget pauses the trial: no slot held, no best yet.
    for (trial, loss) in [(1, 0.5), (2, 0.2), (3, 0.9)] {
        let t = report(&app, id, trial, loss).await;
        assert_eq!(t["state"], "paused", "{t}");
    }
    let study = app.get(&format!("/v1/studies/{id}")).await.body;
    assert_eq!(study["trial_counts"]["paused"], 3, "{study}");
    assert_eq!(study["state"], "active");
    assert!(
        study["best_trial"].is_null(),
        "no trial at the full budget: {study}"
    );

    // The top third of rung 1 (trial 2) goes on to 3 epochs: the same trial.
    let promoted = suggest(&app, id, 3, Some("w")).await;
    assert_eq!(ids(&promoted["trials"]), vec![2], "{promoted}");
    assert_eq!(promoted["trials"][0]["budget"], 3);
    assert_eq!(promoted["trials"][0]["state"], "active");
    report(&app, id, 2, 0.1).await;
    // Nothing else runs or may start: the best of rung 3 goes on to the full budget.
    let top = suggest(&app, id, 1, Some("w")).await;
    assert_eq!(ids(&top["trials"]), vec![2], "{top}");
    assert_eq!(top["trials"][0]["budget"], 9);
    let done = report(&app, id, 2, 0.05).await;
    assert_eq!(
        done["state"], "completed",
        "at the full budget it completes: {done}"
    );
    // Then the rest stop at their rung, and the study ends.
    let last = suggest(&app, id, 1, Some("w")).await;
    assert!(ids(&last["trials"]).is_empty(), "{last}");
    let study = app.get(&format!("/v1/studies/{id}")).await.body;
    assert_eq!(study["state"], "completed", "{study}");
    assert_eq!(study["trial_counts"]["completed"], 3);
    assert_eq!(study["best_trial"]["id"], 2);
    for trial in [1, 3] {
        let t = app
            .get(&format!("/v1/studies/{id}/trials/{trial}"))
            .await
            .body;
        assert_eq!(
            (
                t["state"].clone(),
                t["early_stopped"].clone(),
                t["budget"].clone()
            ),
            (json!("completed"), json!(true), json!(1)),
            "{t}"
        );
    }
    let steps: Vec<i64> = app.get(&format!("/v1/studies/{id}/trials/2")).await.body["measurements"]
        .as_array()
        .expect("measurements")
        .iter()
        .filter_map(|m| m["step"].as_i64())
        .collect();
    assert_eq!(steps, vec![1, 3, 9], "each rung's result at its step");
}
