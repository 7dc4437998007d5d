//! `suggest`: the cap and the budget, workers resuming by `client_id`, leases, trials added
//! by hand handed out first, conditional parameters.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{routes, spec};
use crate::support::{app, complete, ids, suggest};

on_both_backends!(
    suggest_never_exceeds_cap_or_budget_and_completes_study,
    client_id_gets_its_unfinished_trials_back,
    expired_lease_returns_trial_to_requested_with_same_parameters,
    trials_handed_back_keep_their_measurements_beside_new_ones,
    added_trials_prior_results_and_requested_first,
    conditional_parameters_only_when_parent_matches,
);

async fn suggest_never_exceeds_cap_or_budget_and_completes_study(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 5, 2)).await;
    let first = suggest(&app, id, 5, None).await;
    assert_eq!(
        ids(&first["trials"]),
        vec![1, 2],
        "the cap of 2 limits a request for 5"
    );
    let full = suggest(&app, id, 1, None).await;
    assert_eq!(full["trials"], json!([]));
    assert_eq!(full["retry_after_secs"], 1);
    assert_eq!(full["study_state"], "active");

    complete(&app, id, 1, 0.5).await;
    let next = suggest(&app, id, 5, None).await;
    assert_eq!(ids(&next["trials"]), vec![3]);
    complete(&app, id, 2, 0.6).await;
    complete(&app, id, 3, 0.7).await;
    assert_eq!(ids(&suggest(&app, id, 5, None).await["trials"]), vec![4, 5]);
    let spent = suggest(&app, id, 1, None).await;
    assert_eq!(spent["trials"], json!([]), "budget of 5 is spent");
    assert_eq!(spent["study_state"], "active", "two trials still run");
    complete(&app, id, 4, 0.9).await;
    complete(&app, id, 5, 0.1).await;
    let done = suggest(&app, id, 1, None).await;
    assert_eq!(done["study_state"], "completed");
    assert!(done.get("retry_after_secs").is_none());
    let study = app.get(&routes::study(id)).await.body;
    assert_eq!(study["state"], "completed");
    assert_eq!(study["trial_counts"]["completed"], 5);
    assert_eq!(study["trial_counts"]["total"], 5);
    assert_eq!(study["best_trial"]["id"], 4);
}

async fn client_id_gets_its_unfinished_trials_back(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 10, 3)).await;
    let a = suggest(&app, id, 2, Some("worker-a")).await;
    assert_eq!(ids(&a["trials"]), vec![1, 2]);
    let again = suggest(&app, id, 2, Some("worker-a")).await;
    assert_eq!(
        ids(&again["trials"]),
        vec![1, 2],
        "a restarted worker resumes its trials"
    );
    assert_eq!(
        again["trials"][0]["parameters"],
        a["trials"][0]["parameters"]
    );
    let b = suggest(&app, id, 2, Some("worker-b")).await;
    assert_eq!(
        ids(&b["trials"]),
        vec![3],
        "only one slot is left for another worker"
    );
    assert_eq!(b["trials"][0]["client_id"], "worker-b");
}

async fn expired_lease_returns_trial_to_requested_with_same_parameters(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 10, 1);
    s["trial_lease_secs"] = json!(1);
    let id = app.create_study(s).await;
    let a = suggest(&app, id, 1, Some("a")).await;
    let params = a["trials"][0]["parameters"].clone();
    assert_eq!(
        suggest(&app, id, 1, Some("b")).await["trials"],
        json!([]),
        "cap full while leased"
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let b = suggest(&app, id, 1, Some("b")).await;
    assert_eq!(
        ids(&b["trials"]),
        vec![1],
        "the expired trial goes to the next worker"
    );
    assert_eq!(b["trials"][0]["parameters"], params);
    assert_eq!(b["trials"][0]["client_id"], "b");
    let hb = app.post(&routes::trial_heartbeat(id, 1), json!({})).await;
    assert_eq!(hb.status, StatusCode::OK);
    // The first worker lost it: its late report still lands on the trial (same parameters),
    // but asking again gives it nothing new while the cap is full.
    assert_eq!(suggest(&app, id, 1, Some("a")).await["trials"], json!([]));
}

/// A suggest reads the measurements of the trials it hands back (resumed by `client_id`, or
/// back from an expired lease), and not of those it creates: in one answer, both.
async fn trials_handed_back_keep_their_measurements_beside_new_ones(backend: &str) {
    let app = app(backend).await;
    let mut s = spec("random", 10, 2);
    s["trial_lease_secs"] = json!(1);
    let id = app.create_study(s).await;
    let a = suggest(&app, id, 1, Some("a")).await;
    assert_eq!(ids(&a["trials"]), vec![1]);
    assert_eq!(a["trials"][0]["measurements"], json!([]));
    let report = app
        .post(
            &routes::trial_measurements(id, 1),
            json!({"step": 3, "metrics": {"accuracy": 0.25}}),
        )
        .await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.body);
    let resumed = suggest(&app, id, 1, Some("a")).await;
    assert_eq!(ids(&resumed["trials"]), vec![1]);
    assert_eq!(resumed["trials"][0]["measurements"][0]["step"], 3);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Trial 1's lease expired: it goes first, with its measurement, then a new trial.
    let b = suggest(&app, id, 2, Some("b")).await;
    assert_eq!(ids(&b["trials"]), vec![1, 2]);
    let measured = b["trials"][0]["measurements"]
        .as_array()
        .expect("measurements");
    assert_eq!(measured.len(), 1, "{b}");
    assert_eq!(measured[0]["step"], 3);
    assert_eq!(measured[0]["metrics"]["accuracy"], 0.25);
    assert_eq!(b["trials"][1]["measurements"], json!([]));
}

async fn added_trials_prior_results_and_requested_first(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 4, 1)).await;
    let params = json!({"lr": 0.01, "layers": 3, "batch": 32, "kernel": "poly", "degree": 3});
    let prior = app
        .post(
            &routes::trials(id),
            json!({"parameters": params, "final_measurement": {"metrics": {"accuracy": 0.77}}}),
        )
        .await;
    assert_eq!(prior.status, StatusCode::CREATED, "{}", prior.body);
    assert_eq!(prior.body["state"], "completed");
    let queued_params = json!({"lr": 0.5, "layers": 1, "batch": 16, "kernel": "rbf"});
    let queued = app
        .post(&routes::trials(id), json!({"parameters": queued_params}))
        .await;
    assert_eq!(queued.body["state"], "requested");
    let cap = app
        .post(&routes::trials(id), json!({"parameters": queued_params}))
        .await;
    assert_eq!(
        cap.status,
        StatusCode::CONFLICT,
        "the cap of 1 holds for added trials too"
    );
    let s = suggest(&app, id, 1, Some("w")).await;
    assert_eq!(
        ids(&s["trials"]),
        vec![2],
        "the requested trial is handed out first"
    );
    assert_eq!(s["trials"][0]["parameters"], queued_params);
    assert_eq!(
        app.get(&routes::study(id)).await.body["best_trial"]["id"],
        1
    );
}

async fn conditional_parameters_only_when_parent_matches(backend: &str) {
    let app = app(backend).await;
    let id = app.create_study(spec("random", 40, 40)).await;
    let s = suggest(&app, id, 40, None).await;
    let trials = s["trials"].as_array().expect("trials");
    assert_eq!(trials.len(), 40);
    let mut kernels = BTreeSet::new();
    for t in trials {
        let p = &t["parameters"];
        let kernel = p["kernel"].as_str().expect("kernel");
        kernels.insert(kernel.to_string());
        assert_eq!(p.get("degree").is_some(), kernel == "poly", "{p}");
        assert!(p["layers"].is_i64(), "integers are JSON integers: {p}");
        assert!([16, 32, 64, 128].contains(&p["batch"].as_i64().expect("batch")));
        let lr = p["lr"].as_f64().expect("lr");
        assert!((0.0001..=1.0).contains(&lr));
    }
    assert_eq!(kernels.len(), 2, "both branches are explored");
}
