//! One conformance suite for every `Store` and `StudyTx` operation, run against a real
//! SQLite file and a real PostgreSQL database: both backends must behave the same.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use augur::model::TrialPoint;
use augur::model::{
    Measurement, Role, StudyId, StudySpec, StudyState, TrialId, TrialKey, TrialState,
};
use augur::store::{
    AuditEntry, ChangeCursor, DeliveryProgress, NewDelivery, Store, StudiesTx, StudyLock, StudyTx,
    TrialRecord, TrialToken,
};
use augur_optimizer::Value;
use chrono::{DateTime, Duration, Utc};

on_both_backends!(store:
    studies_insert_get_list_filter_delete,
    study_transaction_inserts_updates_and_commits,
    dropped_transaction_rolls_back,
    measurements_upsert_by_step_and_range,
    counts_best_and_paging,
    tokens_insert_find_delete_count,
    deleting_a_study_cascades,
    trial_points_are_the_records_light_view,
    attempts_and_runner_leases,
    role_tokens_list_touch_and_expire,
    studies_remember_who_created_them,
    audit_entries_are_kept_in_order_and_outlive_their_study,
    one_transaction_changes_several_studies,
    a_paused_trial_keeps_its_budget_and_is_counted,
    notification_deliveries_record_their_attempts_and_go_with_their_study,
    optuna_names_are_taken_once_by_concurrent_creates,
    the_first_trial_attr_of_a_name_is_the_lowest_trials,
);

fn spec(name: &str) -> StudySpec {
    serde_json::from_value(common::x_spec(name, ("acc", "maximize"), 10, 3, 1)).expect("spec")
}

/// Times as the backends store them (microseconds), so round-trips compare equal.
fn now() -> DateTime<Utc> {
    let t = Utc::now();
    DateTime::from_timestamp_micros(t.timestamp_micros()).expect("time")
}

/// A transaction on a study that exists.
async fn begin(store: &dyn Store, study_id: StudyId) -> Box<dyn StudyTx> {
    store
        .begin_study(study_id)
        .await
        .expect("begin")
        .expect("study exists")
}

fn trial(study_id: StudyId, id: i64, state: TrialState, x: f64) -> TrialRecord {
    TrialRecord {
        study_id,
        id: TrialId::new(id),
        state,
        parameters: [("x".to_string(), Value::Float(x))].into(),
        client_id: Some(format!("c{id}")),
        final_measurement: None,
        objective: None,
        infeasible_reason: None,
        fail_reason: None,
        early_stopped: false,
        excluded: false,
        lease_expires_at: Some(now() + Duration::seconds(60)),
        created_at: now(),
        started_at: Some(now()),
        completed_at: None,
        change_seq: 0,
        attempts: 0,
        budget: None,
        lineage: None,
    }
}

fn completed(mut t: TrialRecord, acc: f64) -> TrialRecord {
    t.state = TrialState::Completed;
    t.final_measurement = Some(Measurement {
        step: 3,
        elapsed_secs: Some(1.5),
        metrics: [("acc".to_string(), acc)].into(),
    });
    t.objective = Some(acc);
    t.completed_at = Some(now());
    t.lease_expires_at = None;
    t
}

async fn insert(store: &dyn Store, study: StudyId, trials: &[TrialRecord]) {
    let mut tx = begin(store, study).await;
    let mut s = tx.study().clone();
    s.next_trial_id = TrialId::new(s.next_trial_id.get() + trials.len() as i64);
    for t in trials {
        s.trial_counts.moved(None, t.state);
    }
    tx.insert_trials(trials).await.expect("insert trials");
    tx.update_study(&s).await.expect("update study");
    tx.commit().await.expect("commit");
}

async fn studies_insert_get_list_filter_delete(store: Arc<dyn Store>) {
    store.ping().await.expect("ping");
    let a = store
        .insert_study(&spec("Alpha net"), None, now())
        .await
        .expect("insert");
    let b = store
        .insert_study(&spec("beta_100%"), None, now())
        .await
        .expect("insert");
    assert_eq!(a.state, StudyState::Active);
    assert_eq!(a.next_trial_id, TrialId::new(1));
    assert_eq!(a.spec, spec("Alpha net"));
    assert!(b.id > a.id);
    assert_eq!(store.get_study(a.id).await.expect("get"), Some(a.clone()));
    assert_eq!(
        store.get_study(StudyId::new(9999)).await.expect("get"),
        None
    );

    let all = store
        .list_studies(None, None, StudyId::new(0), 10)
        .await
        .expect("list");
    assert_eq!(
        all.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![a.id, b.id]
    );
    let after = store
        .list_studies(None, None, a.id, 10)
        .await
        .expect("list");
    assert_eq!(after.len(), 1);
    assert_eq!(
        store
            .list_studies(None, None, StudyId::new(0), 1)
            .await
            .expect("list")
            .len(),
        1
    );
    let by_name = store
        .list_studies(None, Some("ALPHA"), StudyId::new(0), 10)
        .await
        .expect("list");
    assert_eq!(
        by_name.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![a.id],
        "case-insensitive"
    );
    let literal = store
        .list_studies(None, Some("0%"), StudyId::new(0), 10)
        .await
        .expect("list");
    assert_eq!(
        literal.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![b.id],
        "% is literal"
    );
    assert!(
        store
            .list_studies(None, Some("_"), StudyId::new(0), 10)
            .await
            .expect("list")
            .iter()
            .all(|s| s.name.contains('_'))
    );
    assert!(
        store
            .list_studies(Some(StudyState::Stopped), None, StudyId::new(0), 10)
            .await
            .expect("list")
            .is_empty()
    );

    assert!(store.delete_study(a.id).await.expect("delete"));
    assert!(!store.delete_study(a.id).await.expect("delete twice"));
    assert_eq!(store.get_study(a.id).await.expect("get"), None);
}

async fn study_transaction_inserts_updates_and_commits(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("tx"), None, now())
        .await
        .expect("insert");
    assert!(
        store
            .begin_study(StudyId::new(424242))
            .await
            .expect("begin")
            .is_none(),
        "no such study"
    );
    let t1 = trial(study.id, 1, TrialState::Active, 0.1);
    let t2 = trial(study.id, 2, TrialState::Requested, 0.2);
    let t3 = completed(trial(study.id, 3, TrialState::Active, 0.3), 0.9);
    insert(&*store, study.id, &[t1.clone(), t2.clone(), t3.clone()]).await;

    let mut tx = begin(&*store, study.id).await;
    assert_eq!(tx.study().next_trial_id, TrialId::new(4));
    let unfinished = tx.unfinished_trials().await.expect("unfinished");
    assert_eq!(unfinished, vec![t1.clone(), t2.clone()]);
    assert_eq!(
        tx.trials_by_id(&[TrialId::new(3), TrialId::new(99)])
            .await
            .expect("by id"),
        vec![t3.clone()]
    );
    assert_eq!(tx.count_failed().await.expect("failed"), 0);
    let mut failed = t1.clone();
    failed.state = TrialState::Failed;
    failed.fail_reason = Some("boom".into());
    failed.lease_expires_at = None;
    let mut excluded = t3.clone();
    excluded.excluded = true;
    tx.update_trials(&[failed.clone(), excluded.clone()])
        .await
        .expect("update");
    assert_eq!(
        tx.count_failed().await.expect("failed"),
        1,
        "reads see the transaction's writes"
    );
    let mut s = tx.study().clone();
    s.state = StudyState::Failed;
    s.state_reason = Some("why".into());
    s.spec.max_trials = 20;
    s.updated_at = now();
    tx.update_study(&s).await.expect("update study");
    tx.commit().await.expect("commit");

    assert_eq!(
        store
            .get_trial(study.id, TrialId::new(1))
            .await
            .expect("get"),
        Some(failed)
    );
    assert_eq!(
        store
            .get_trial(study.id, TrialId::new(3))
            .await
            .expect("get"),
        Some(excluded)
    );
    assert_eq!(store.get_study(study.id).await.expect("get"), Some(s));
    store
        .set_designer_state(study.id, &serde_json::json!({"lengthscales": [0.5]}))
        .await
        .expect("designer state");
    let reread = store
        .get_study(study.id)
        .await
        .expect("get")
        .expect("study");
    assert_eq!(
        reread.designer_state,
        Some(serde_json::json!({"lengthscales": [0.5]}))
    );
}

async fn dropped_transaction_rolls_back(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("rollback"), None, now())
        .await
        .expect("insert");
    {
        let mut tx = begin(&*store, study.id).await;
        tx.insert_trials(&[trial(study.id, 1, TrialState::Active, 0.5)])
            .await
            .expect("insert");
        // dropped without commit
    }
    assert_eq!(
        store
            .get_trial(study.id, TrialId::new(1))
            .await
            .expect("get"),
        None
    );
    assert_eq!(store.all_trials(study.id).await.expect("all"), vec![]);
}

async fn measurements_upsert_by_step_and_range(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("m"), None, now())
        .await
        .expect("insert");
    insert(
        &*store,
        study.id,
        &[1, 2, 3].map(|i| trial(study.id, i, TrialState::Active, 0.1)),
    )
    .await;
    let m = |step: i64, acc: f64| Measurement {
        step,
        elapsed_secs: Some(step as f64),
        metrics: BTreeMap::from([("acc".to_string(), acc)]),
    };
    let mut tx = begin(&*store, study.id).await;
    tx.upsert_measurements(
        &[
            (TrialId::new(1), m(1, 0.1)),
            (TrialId::new(1), m(2, 0.2)),
            (TrialId::new(2), m(1, 0.3)),
            (TrialId::new(3), m(5, 0.4)),
        ],
        now(),
    )
    .await
    .expect("upsert");
    tx.upsert_measurements(&[(TrialId::new(1), m(2, 0.25))], now())
        .await
        .expect("replace");
    assert_eq!(
        tx.measurements(TrialId::new(1)).await.expect("read"),
        vec![m(1, 0.1), m(2, 0.25)]
    );
    tx.commit().await.expect("commit");
    let range = store
        .measurements(study.id, TrialId::new(1), TrialId::new(2))
        .await
        .expect("range");
    assert_eq!(
        range,
        vec![
            (TrialId::new(1), m(1, 0.1)),
            (TrialId::new(1), m(2, 0.25)),
            (TrialId::new(2), m(1, 0.3))
        ]
    );
    assert_eq!(
        store
            .measurements(study.id, TrialId::new(3), TrialId::new(3))
            .await
            .expect("one"),
        vec![(TrialId::new(3), m(5, 0.4))]
    );
}

async fn counts_best_and_paging(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("c"), None, now())
        .await
        .expect("insert");
    let other = store
        .insert_study(&spec("other"), None, now())
        .await
        .expect("insert");
    let mut best_excluded = completed(trial(study.id, 4, TrialState::Active, 0.4), 0.99);
    best_excluded.excluded = true;
    let trials = vec![
        completed(trial(study.id, 1, TrialState::Active, 0.1), 0.5),
        completed(trial(study.id, 2, TrialState::Active, 0.2), 0.7),
        trial(study.id, 3, TrialState::Active, 0.3),
        best_excluded,
        completed(trial(study.id, 5, TrialState::Active, 0.5), 0.1),
    ];
    insert(&*store, study.id, &trials).await;
    insert(
        &*store,
        other.id,
        &[trial(other.id, 1, TrialState::Requested, 0.9)],
    )
    .await;

    // The counts the transaction stored with the study row, summed over studies for /metrics.
    let counts = store
        .get_study(study.id)
        .await
        .expect("get")
        .expect("study")
        .trial_counts;
    assert_eq!((counts.completed, counts.active, counts.total), (4, 1, 5));
    let all = store.count_all_trials().await.expect("all counts");
    assert_eq!((all.total, all.completed, all.requested), (6, 4, 1));
    assert_eq!(
        store
            .best_trial(study.id, true)
            .await
            .expect("best")
            .map(|t| t.id),
        Some(TrialId::new(2)),
        "excluded trials are never best"
    );
    assert_eq!(
        store
            .best_trial(study.id, false)
            .await
            .expect("best")
            .map(|t| t.id),
        Some(TrialId::new(5))
    );
    assert_eq!(store.best_trial(other.id, true).await.expect("best"), None);

    let page = store
        .list_trials(study.id, None, TrialId::new(0), 2)
        .await
        .expect("page");
    assert_eq!(
        page.iter().map(|t| t.id.get()).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let next = store
        .list_trials(study.id, None, TrialId::new(2), 2)
        .await
        .expect("page");
    assert_eq!(
        next.iter().map(|t| t.id.get()).collect::<Vec<_>>(),
        vec![3, 4]
    );
    let active = store
        .list_trials(study.id, Some(TrialState::Active), TrialId::new(0), 10)
        .await
        .expect("filter");
    assert_eq!(
        active.iter().map(|t| t.id.get()).collect::<Vec<_>>(),
        vec![3]
    );
    assert_eq!(store.all_trials(study.id).await.expect("all"), trials);
}

async fn tokens_insert_find_delete_count(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("t"), None, now())
        .await
        .expect("insert");
    assert_eq!(store.count_tokens().await.expect("count"), 0);
    store
        .insert_token("ci", "hash-ci", None, now())
        .await
        .expect("insert");
    store
        .insert_token(
            "trial",
            "hash-trial",
            Some(TrialKey::new(study.id, TrialId::new(3))),
            now(),
        )
        .await
        .expect("insert");
    assert_eq!(
        store.count_tokens().await.expect("count"),
        1,
        "trial tokens do not close an open server"
    );
    let found = store
        .find_token("hash-trial")
        .await
        .expect("find")
        .expect("token");
    assert_eq!(found.scope, Some(TrialKey::new(study.id, TrialId::new(3))));
    assert_eq!(
        store
            .find_token("hash-ci")
            .await
            .expect("find")
            .map(|t| t.name),
        Some("ci".to_string())
    );
    assert_eq!(store.find_token("nope").await.expect("find"), None);
    assert!(
        store
            .insert_token("ci", "another", None, now())
            .await
            .is_err(),
        "names are unique"
    );
    store
        .replace_token(
            "trial",
            "hash-trial-2",
            Some(TrialKey::new(study.id, TrialId::new(4))),
            now(),
        )
        .await
        .expect("replace");
    assert_eq!(
        store.find_token("hash-trial").await.expect("find"),
        None,
        "the old token is gone"
    );
    let replaced = store
        .find_token("hash-trial-2")
        .await
        .expect("find")
        .expect("token");
    assert_eq!(
        replaced.scope,
        Some(TrialKey::new(study.id, TrialId::new(4)))
    );
    store
        .replace_token("fresh", "hash-fresh", None, now())
        .await
        .expect("insert by replace");
    assert!(store.delete_token("fresh").await.expect("delete"));
    assert!(store.delete_token("ci").await.expect("delete"));
    assert_eq!(store.count_tokens().await.expect("count"), 0);
}

async fn deleting_a_study_cascades(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("cascade"), None, now())
        .await
        .expect("insert");
    insert(
        &*store,
        study.id,
        &[trial(study.id, 1, TrialState::Active, 0.5)],
    )
    .await;
    let mut tx = begin(&*store, study.id).await;
    tx.upsert_measurements(
        &[(
            TrialId::new(1),
            Measurement {
                step: 1,
                elapsed_secs: None,
                metrics: BTreeMap::new(),
            },
        )],
        now(),
    )
    .await
    .expect("m");
    tx.commit().await.expect("commit");
    store
        .insert_token(
            "trial-token",
            "h",
            Some(TrialKey::new(study.id, TrialId::new(1))),
            now(),
        )
        .await
        .expect("token");
    assert!(store.delete_study(study.id).await.expect("delete"));
    assert_eq!(store.all_trials(study.id).await.expect("all"), vec![]);
    assert_eq!(
        store
            .measurements(study.id, TrialId::new(1), TrialId::new(1))
            .await
            .expect("m"),
        vec![]
    );
    assert_eq!(store.find_token("h").await.expect("token"), None);
}

/// The dashboard's light read holds what the full records hold, and its change filter returns
/// exactly the trials written after a `change_seq`, in change order, up to the limit. Also the
/// latest completed trials, which the stopping rule reads.
async fn trial_points_are_the_records_light_view(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("points"), None, now())
        .await
        .expect("insert");
    let mut first = vec![
        trial(study.id, 1, TrialState::Active, 0.1),
        completed(trial(study.id, 2, TrialState::Active, 0.2), 0.75),
        completed(trial(study.id, 3, TrialState::Active, 0.3), 0.5),
        trial(study.id, 4, TrialState::Requested, 0.4),
    ];
    first[1].early_stopped = true;
    first[2].excluded = true;
    // Every kind of value, including a float that only round-trips exactly if parsed exactly.
    first[3].parameters = [
        ("x".to_string(), Value::Float(0.1 + 0.2)),
        ("n".to_string(), Value::Int(-7)),
        ("k".to_string(), Value::Str("poly".into())),
    ]
    .into();
    for t in &mut first {
        t.change_seq = 1;
    }
    insert(&*store, study.id, &first).await;

    let view = |t: &TrialRecord| TrialPoint {
        id: t.id,
        state: t.state,
        parameters: t.parameters.clone(),
        final_metrics: t.final_measurement.as_ref().map(|m| m.metrics.clone()),
        early_stopped: t.early_stopped,
        excluded: t.excluded,
        budget: t.budget,
    };
    let all = store.all_trials(study.id).await.expect("all");
    let points = store.trial_points(study.id, None, 0).await.expect("points");
    assert_eq!(points, all.iter().map(view).collect::<Vec<_>>());
    assert_eq!(points[3].parameters, first[3].parameters);
    assert_eq!(
        points[1].final_metrics,
        Some([("acc".to_string(), 0.75)].into())
    );

    // A second batch changes trial 4 and adds 5 and 6, at change_seq 2.
    let mut tx = begin(&*store, study.id).await;
    let mut later = completed(first[3].clone(), 0.9);
    later.change_seq = 2;
    tx.update_trials(std::slice::from_ref(&later))
        .await
        .expect("update");
    let mut added = vec![
        trial(study.id, 5, TrialState::Active, 0.5),
        trial(study.id, 6, TrialState::Active, 0.6),
    ];
    for t in &mut added {
        t.change_seq = 2;
    }
    tx.insert_trials(&added).await.expect("insert");
    let mut s = tx.study().clone();
    s.next_trial_id = TrialId::new(7);
    s.change_seq = 2;
    tx.update_study(&s).await.expect("update study");
    tx.commit().await.expect("commit");

    // The full records by the `(change_seq, id)` cursor, as `GET …/changes` pages them.
    let records = store
        .changed_trials(
            study.id,
            ChangeCursor {
                change_seq: 1,
                trial: TrialId::new(i64::MAX),
            },
            10,
        )
        .await
        .expect("changed records");
    assert_eq!(
        records,
        vec![later.clone(), added[0].clone(), added[1].clone()]
    );
    assert_eq!(
        store
            .changed_trials(
                study.id,
                ChangeCursor {
                    change_seq: 2,
                    trial: TrialId::new(5)
                },
                10
            )
            .await
            .expect("after trial 5"),
        vec![added[1].clone()]
    );
    let changed = store
        .trial_points(study.id, Some(1), 10)
        .await
        .expect("changed");
    assert_eq!(
        changed,
        vec![view(&later), view(&added[0]), view(&added[1])]
    );
    let limited = store
        .trial_points(study.id, Some(1), 2)
        .await
        .expect("limited");
    assert_eq!(limited, changed[..2]);
    assert!(
        store
            .trial_points(study.id, Some(2), 10)
            .await
            .expect("none")
            .is_empty()
    );
    // Completed and not excluded (trial 3 is excluded), newest first.
    assert_eq!(
        ids(store.latest_completed(study.id, 10).await.expect("trials")),
        [4, 2]
    );
    assert_eq!(
        ids(store.latest_completed(study.id, 1).await.expect("trials")),
        [4]
    );
    assert!(
        store
            .trial_points(StudyId::new(424242), None, 0)
            .await
            .expect("no study")
            .is_empty()
    );
}

/// A study that grows faster than autovacuum analyzes and vacuums the table: the statistics
/// still say it has almost no trials, each completed trial has left a dead row version, and
/// the connection may have cached plans made when the table was nearly empty.
/// Each batch on it (lock, read the unfinished trials, update one, commit) must still visit
/// only its own rows' pages, not the whole study's: that made PostgreSQL throughput fall ~4x
/// between 10,000 and 40,000 trials in the growth bench.
#[tokio::test]
async fn postgres_batches_stay_small_on_stale_statistics() {
    use sqlx::Connection;
    let db = common::postgres_db().await;
    let store = augur::store::connect(&db.url).await.expect("store");
    let mut admin = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    // The large study's first batches run while the table is nearly empty, so a connection
    // that caches plans caches ones made for a tiny table.
    let big = store
        .insert_study(&spec("big"), None, now())
        .await
        .expect("insert");
    let warm_up = 10i64;
    for id in 1..=warm_up {
        let mut tx = begin(&*store, big.id).await;
        tx.unfinished_trials().await.expect("unfinished");
        let running = trial(big.id, id, TrialState::Active, 0.5);
        tx.insert_trials(std::slice::from_ref(&running))
            .await
            .expect("insert");
        let mut s = tx.study().clone();
        s.next_trial_id = TrialId::new(id + 1);
        tx.update_study(&s).await.expect("study");
        tx.commit().await.expect("commit");
        let mut tx = begin(&*store, big.id).await;
        tx.unfinished_trials().await.expect("unfinished");
        tx.update_trials(&[completed(running, 0.5)])
            .await
            .expect("complete");
        tx.commit().await.expect("commit");
    }
    // Statistics taken while the table holds one small study besides; autovacuum kept out.
    let first = store
        .insert_study(&spec("first"), None, now())
        .await
        .expect("insert");
    let small: Vec<TrialRecord> = (1..=300)
        .map(|i| completed(trial(first.id, i, TrialState::Active, 0.5), 0.5))
        .collect();
    insert(&*store, first.id, &small).await;
    for sql in [
        "ANALYZE trials",
        "ALTER TABLE trials SET (autovacuum_enabled = off)",
    ] {
        sqlx::query(sql).execute(&mut admin).await.expect(sql);
    }
    // Then the large study grows, written in bulk as running trials and then completed, as a
    // live study is: each completed trial leaves a dead row version behind (VACUUM is off).
    let total = 20_000i64;
    let ids: Vec<i64> = (warm_up + 1..=total).collect();
    for chunk in ids.chunks(5_000) {
        let running: Vec<TrialRecord> = chunk
            .iter()
            .map(|&i| trial(big.id, i, TrialState::Active, 0.5))
            .collect();
        insert(&*store, big.id, &running).await;
    }
    for chunk in ids[..ids.len() - 20].chunks(5_000) {
        let mut tx = begin(&*store, big.id).await;
        let done: Vec<TrialRecord> = chunk
            .iter()
            .map(|&i| completed(trial(big.id, i, TrialState::Active, 0.5), 0.5))
            .collect();
        tx.update_trials(&done).await.expect("complete");
        tx.commit().await.expect("commit");
    }

    // Pages of `trials` and its indexes visited so far, dead rows included.
    const PAGES_READ: &str = "SELECT COALESCE(heap_blks_read + heap_blks_hit + idx_blks_read \
         + idx_blks_hit, 0) FROM pg_statio_user_tables WHERE relname = 'trials'";
    let before = common::settled_pg_counter(&mut admin, PAGES_READ).await;
    let batches = 20i64;
    for i in 0..batches {
        let mut tx = begin(&*store, big.id).await;
        let unfinished = tx.unfinished_trials().await.expect("unfinished");
        assert_eq!(unfinished.len() as i64, 20 - i);
        let done = completed(unfinished[0].clone(), 0.9);
        tx.update_trials(&[done]).await.expect("update");
        tx.commit().await.expect("commit");
    }
    let read = common::settled_pg_counter(&mut admin, PAGES_READ).await - before;
    println!("{batches} batches visited {read} pages of trials");
    assert!(
        read < batches * 100,
        "{batches} batches visited {read} pages of trials: a batch scans the study ({total} trials)"
    );
}

fn token(study_id: StudyId, trial_id: i64, hash: &str) -> TrialToken {
    let trial_id = TrialId::new(trial_id);
    TrialToken {
        name: TrialToken::name(TrialKey::new(study_id, trial_id)),
        hash: hash.to_string(),
        trial_id,
    }
}

/// A trial's launch count is kept with it (written whole, like its other columns). Trial
/// tokens are written after their trials in the same transaction (on PostgreSQL they are
/// still held back then), replace the last of the same name, the last of a name in one call
/// winning, and are deleted by trial. A study's runner lease belongs to one owner until it expires or is released.
async fn attempts_and_runner_leases(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("dispatch"), None, now())
        .await
        .expect("insert");
    let mut tx = begin(&*store, study.id).await;
    let mut first = trial(study.id, 1, TrialState::Active, 0.5);
    first.attempts = 1;
    let second = trial(study.id, 2, TrialState::Active, 0.5);
    tx.insert_trials(&[first.clone(), second])
        .await
        .expect("insert");
    tx.replace_trial_tokens(
        &[
            token(study.id, 1, "h1"),
            token(study.id, 2, "h2"),
            token(study.id, 2, "h3"),
        ],
        now(),
    )
    .await
    .expect("tokens");
    tx.commit().await.expect("commit");
    let read = store
        .get_trial(study.id, TrialId::new(1))
        .await
        .expect("get");
    assert_eq!(read.map(|t| t.attempts), Some(1));
    let scope_of = |hash: &'static str| {
        let store = store.clone();
        async move { store.find_token(hash).await.expect("find").map(|t| t.scope) }
    };
    assert_eq!(
        scope_of("h1").await,
        Some(Some(TrialKey::new(study.id, TrialId::new(1))))
    );
    assert_eq!(scope_of("h2").await, None, "the last of a name wins");
    assert_eq!(
        scope_of("h3").await,
        Some(Some(TrialKey::new(study.id, TrialId::new(2))))
    );

    let mut tx = begin(&*store, study.id).await;
    let unfinished = tx.unfinished_trials().await.expect("unfinished");
    assert_eq!(
        unfinished.iter().map(|t| t.attempts).collect::<Vec<_>>(),
        [1, 0]
    );
    first.attempts = 2;
    tx.update_trials(&[first]).await.expect("update");
    tx.replace_trial_tokens(&[token(study.id, 1, "h4")], now())
        .await
        .expect("token");
    tx.commit().await.expect("commit");
    let read = store
        .get_trial(study.id, TrialId::new(1))
        .await
        .expect("get");
    assert_eq!(read.map(|t| t.attempts), Some(2));
    assert_eq!(scope_of("h1").await, None, "replaced");
    assert_eq!(
        scope_of("h4").await,
        Some(Some(TrialKey::new(study.id, TrialId::new(1))))
    );

    let mut tx = begin(&*store, study.id).await;
    tx.revoke_trial_tokens(&[TrialId::new(1)])
        .await
        .expect("revoke");
    tx.commit().await.expect("commit");
    assert_eq!(scope_of("h4").await, None, "revoked");
    assert_eq!(
        scope_of("h3").await,
        Some(Some(TrialKey::new(study.id, TrialId::new(2)))),
        "another trial's"
    );

    let t0 = now();
    let ttl = Duration::seconds(15);
    assert!(
        store
            .claim_runner(study.id, "a", t0, ttl)
            .await
            .expect("claim")
    );
    assert!(
        store
            .claim_runner(study.id, "a", t0, ttl)
            .await
            .expect("renew")
    );
    assert!(
        !store
            .claim_runner(study.id, "b", t0 + Duration::seconds(14), ttl)
            .await
            .expect("claim")
    );
    store
        .release_runner(study.id, "b")
        .await
        .expect("release by a non-owner");
    assert!(
        !store
            .claim_runner(study.id, "b", t0 + Duration::seconds(14), ttl)
            .await
            .expect("claim")
    );
    assert!(
        store
            .claim_runner(study.id, "b", t0 + Duration::seconds(16), ttl)
            .await
            .expect("expired")
    );
    store.release_runner(study.id, "b").await.expect("release");
    assert!(
        store
            .claim_runner(study.id, "a", t0 + Duration::seconds(17), ttl)
            .await
            .expect("released")
    );
}

async fn role_tokens_list_touch_and_expire(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("r"), None, now())
        .await
        .expect("insert");
    let created = now();
    let expires = created + Duration::days(30);
    assert!(
        store
            .insert_role_token("reader-1", "h-r", Role::Reader, Some(expires), created)
            .await
            .expect("insert")
    );
    assert!(
        store
            .insert_role_token("ops", "h-o", Role::Operator, None, created)
            .await
            .expect("insert")
    );
    assert!(
        !store
            .insert_role_token("ops", "h-o2", Role::Admin, None, created)
            .await
            .expect("a taken name"),
        "names are unique: nothing stored"
    );
    assert_eq!(store.find_token("h-o2").await.expect("find"), None);
    // Tokens from before roles, and the configured one, are admins.
    store
        .insert_token("env", "h-env", None, created)
        .await
        .expect("insert");
    store
        .insert_token(
            "trial:1:1",
            "h-t",
            Some(TrialKey::new(study.id, TrialId::new(1))),
            created,
        )
        .await
        .expect("insert");
    let reader = store.find_token("h-r").await.expect("find").expect("token");
    assert_eq!(
        (
            reader.role,
            reader.expires_at,
            reader.created_at,
            reader.last_used_at
        ),
        (Role::Reader, Some(expires), created, None)
    );
    assert_eq!(
        store
            .find_token("h-env")
            .await
            .expect("find")
            .map(|t| t.role),
        Some(Role::Admin)
    );
    let listed: Vec<(String, Role)> = store
        .list_tokens()
        .await
        .expect("list")
        .into_iter()
        .map(|t| (t.name, t.role))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("env".to_string(), Role::Admin),
            ("ops".to_string(), Role::Operator),
            ("reader-1".to_string(), Role::Reader),
        ],
        "by name, trial tokens left out"
    );
    let used = now();
    store.touch_token("reader-1", used).await.expect("touch");
    assert_eq!(
        store
            .find_token("h-r")
            .await
            .expect("find")
            .and_then(|t| t.last_used_at),
        Some(used)
    );
    assert_eq!(store.count_tokens().await.expect("count"), 3);
}

async fn studies_remember_who_created_them(store: Arc<dyn Store>) {
    let mine = store
        .insert_study(&spec("mine"), Some("alice"), now())
        .await
        .expect("insert");
    let old = store
        .insert_study(&spec("old"), None, now())
        .await
        .expect("insert");
    assert_eq!(mine.created_by.as_deref(), Some("alice"));
    let read = store.get_study(mine.id).await.expect("get").expect("study");
    assert_eq!(read.created_by.as_deref(), Some("alice"));
    assert_eq!(
        store
            .get_study(old.id)
            .await
            .expect("get")
            .expect("study")
            .created_by,
        None
    );
    // The study transaction sees it too (PostgreSQL reads the row its own way).
    let tx = store
        .begin_study(mine.id)
        .await
        .expect("begin")
        .expect("study");
    assert_eq!(tx.study().created_by.as_deref(), Some("alice"));
    drop(tx);
    let listed = store
        .list_studies(None, None, StudyId::new(0), 10)
        .await
        .expect("list");
    assert_eq!(listed[0].created_by.as_deref(), Some("alice"));
}

async fn audit_entries_are_kept_in_order_and_outlive_their_study(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("a"), Some("alice"), now())
        .await
        .expect("insert");
    let entry = |action: &str, trial: Option<i64>| AuditEntry {
        at: now(),
        actor: "alice".into(),
        action: action.into(),
        study_id: Some(study.id),
        trial_id: trial.map(TrialId::new),
        detail: Some(format!("{action} detail")),
    };
    let written = [
        entry("study.create", None),
        entry("trial.add", Some(1)),
        entry("study.delete", None),
    ];
    for e in &written {
        store.insert_audit(e).await.expect("audit");
    }
    assert!(store.delete_study(study.id).await.expect("delete"));
    let all = store.list_audit(0, 10).await.expect("list");
    assert_eq!(
        all.iter().map(|r| r.entry.clone()).collect::<Vec<_>>(),
        written.to_vec()
    );
    assert!(all.windows(2).all(|w| w[0].id < w[1].id));
    let page = store.list_audit(all[0].id, 1).await.expect("page");
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].entry.action, "trial.add");
}

async fn notification_deliveries_record_their_attempts_and_go_with_their_study(
    store: Arc<dyn Store>,
) {
    let study = store
        .insert_study(&spec("hooked"), Some("alice"), now())
        .await
        .expect("insert");
    let other = store
        .insert_study(&spec("other"), Some("alice"), now())
        .await
        .expect("insert");
    let delivery = |study_id: StudyId, event: &str, trial_id: Option<i64>| NewDelivery {
        study_id,
        event: event.into(),
        trial_id: trial_id.map(TrialId::new),
        target: "study".into(),
        url: "https://hooks.example.com/a".into(),
        created_at: now(),
    };
    let failed = delivery(study.id, "trial_failed", Some(3));
    let first = store
        .insert_delivery(&failed)
        .await
        .expect("insert delivery");
    let second = store
        .insert_delivery(&delivery(study.id, "study_completed", None))
        .await
        .expect("insert delivery");
    store
        .insert_delivery(&delivery(other.id, "study_failed", None))
        .await
        .expect("insert delivery");
    assert!(first < second);
    let fresh = store.list_deliveries(study.id, 0, 10).await.expect("list");
    assert_eq!(fresh.len(), 2);
    assert_eq!(fresh[0].delivery, failed);
    assert_eq!(fresh[0].progress.state, "pending");
    assert_eq!(fresh[0].progress.attempts, 0);
    let progress = DeliveryProgress {
        state: "failed".into(),
        attempts: 5,
        last_status: Some(503),
        last_error: Some("answered 503 Service Unavailable".into()),
        updated_at: now(),
    };
    store
        .update_delivery(first, &progress)
        .await
        .expect("update");
    let listed = store.list_deliveries(study.id, 0, 10).await.expect("list");
    assert_eq!(listed[0].progress, progress);
    assert_eq!(listed[1].progress.state, "pending");
    let page = store
        .list_deliveries(study.id, first, 1)
        .await
        .expect("page");
    assert_eq!(page.iter().map(|d| d.id).collect::<Vec<_>>(), [second]);
    assert!(store.delete_study(study.id).await.expect("delete"));
    assert!(
        store
            .list_deliveries(study.id, 0, 10)
            .await
            .expect("list")
            .is_empty()
    );
    assert_eq!(
        store
            .list_deliveries(other.id, 0, 10)
            .await
            .expect("list")
            .len(),
        1
    );
}

fn locked(lock: StudyLock) -> Box<dyn StudyTx> {
    match lock {
        StudyLock::Locked(tx) => tx,
        StudyLock::Missing(_) => panic!("study missing"),
        StudyLock::Busy(_) => panic!("study busy"),
    }
}

/// The ids of a study's trials.
async fn trial_ids(store: &dyn Store, study_id: StudyId) -> Vec<i64> {
    let all = store.all_trials(study_id).await.expect("all trials");
    all.iter().map(|t| t.id.get()).collect()
}

/// One transaction locks several studies, writes to each and commits them together, or rolls
/// all back; a study another transaction holds is `Busy` to a lock that may not wait.
async fn one_transaction_changes_several_studies(store: Arc<dyn Store>) {
    let a = store
        .insert_study(&spec("a"), None, now())
        .await
        .expect("a");
    let b = store
        .insert_study(&spec("b"), None, now())
        .await
        .expect("b");

    // Both written, one commit; a missing study leaves the transaction as it was.
    let tx = store.begin_studies().await.expect("begin");
    let mut on_a = locked(tx.lock_study(a.id, true).await.expect("lock a"));
    on_a.insert_trials(&[trial(a.id, 1, TrialState::Active, 0.1)])
        .await
        .expect("insert a");
    let tx = on_a.release().await.expect("release a");
    let tx: Box<dyn StudiesTx> = match tx
        .lock_study(StudyId::new(424242), false)
        .await
        .expect("lock")
    {
        StudyLock::Missing(tx) => tx,
        _ => panic!("study 424242 should be missing"),
    };
    let mut on_b = locked(tx.lock_study(b.id, false).await.expect("lock b"));
    assert_eq!(on_b.study().name, "b");
    on_b.insert_trials(&[trial(b.id, 1, TrialState::Requested, 0.2)])
        .await
        .expect("insert b");
    let tx = on_b.release().await.expect("release b");
    // Not visible before the commit.
    assert_eq!(trial_ids(&*store, a.id).await, Vec::<i64>::new());
    tx.commit().await.expect("commit");
    assert_eq!(trial_ids(&*store, a.id).await, vec![1]);
    assert_eq!(trial_ids(&*store, b.id).await, vec![1]);

    // Dropped: neither study changes.
    let tx = store.begin_studies().await.expect("begin");
    let mut on_a = locked(tx.lock_study(a.id, true).await.expect("lock a"));
    on_a.insert_trials(&[trial(a.id, 2, TrialState::Active, 0.3)])
        .await
        .expect("insert a");
    let tx = on_a.release().await.expect("release a");
    let mut on_b = locked(tx.lock_study(b.id, false).await.expect("lock b"));
    on_b.insert_trials(&[trial(b.id, 2, TrialState::Active, 0.4)])
        .await
        .expect("insert b");
    drop(on_b);
    assert_eq!(trial_ids(&*store, a.id).await, vec![1]);
    assert_eq!(trial_ids(&*store, b.id).await, vec![1]);

    // Locked and read ahead (`prefetch`): the same answers, with the unfinished trials.
    let tx = store.begin_studies().await.expect("begin");
    let mut tx = locked(tx.lock_study(a.id, true).await.expect("lock a"))
        .release()
        .await
        .expect("release a");
    tx.prefetch(&[StudyId::new(424242), b.id])
        .await
        .expect("prefetch");
    let tx: Box<dyn StudiesTx> = match tx
        .lock_study(StudyId::new(424242), false)
        .await
        .expect("lock")
    {
        StudyLock::Missing(tx) => tx,
        _ => panic!("study 424242 should be missing"),
    };
    let mut on_b = locked(tx.lock_study(b.id, false).await.expect("lock b"));
    assert_eq!(on_b.study().name, "b");
    let unfinished = on_b.unfinished_trials().await.expect("unfinished");
    assert_eq!(
        unfinished
            .iter()
            .map(|t| (t.id.get(), t.state))
            .collect::<Vec<_>>(),
        vec![(1, TrialState::Requested)]
    );
    on_b.commit().await.expect("commit");

    // An empty transaction commits.
    store
        .begin_studies()
        .await
        .expect("begin")
        .commit()
        .await
        .expect("empty commit");

    // Row locks: only PostgreSQL has them (SQLite's one write lock makes a second writer
    // wait at its start, never at a study).
    if store.backend() == "postgres" {
        let holder = store.begin_studies().await.expect("begin");
        let holder = locked(holder.lock_study(a.id, true).await.expect("lock a"));
        let other = store.begin_studies().await.expect("begin other");
        let other = locked(other.lock_study(b.id, true).await.expect("lock b"))
            .release()
            .await
            .expect("release b");
        let other = match other.lock_study(a.id, false).await.expect("try a") {
            StudyLock::Busy(tx) => tx,
            _ => panic!("study a should be busy while another transaction holds it"),
        };
        let mut other = other;
        other.prefetch(&[a.id]).await.expect("prefetch a");
        let other = match other.lock_study(a.id, false).await.expect("try a again") {
            StudyLock::Busy(tx) => tx,
            _ => panic!("study a should be busy to a prefetch too"),
        };
        other.commit().await.expect("commit other");
        holder.commit().await.expect("commit holder");
    }
}

fn ids(trials: Vec<TrialRecord>) -> Vec<i64> {
    trials.iter().map(|t| t.id.get()).collect()
}

/// Multi-fidelity columns on both write paths (one study's transaction, and several studies'
/// in one, which PostgreSQL sends as one statement): a paused trial's budget and the study's
/// count of paused trials come back as written.
async fn a_paused_trial_keeps_its_budget_and_is_counted(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("rungs"), None, now())
        .await
        .expect("insert");
    let mut paused = trial(study.id, 1, TrialState::Paused, 0.1);
    paused.budget = Some(3.0);
    paused.lease_expires_at = None;
    insert(&*store, study.id, &[paused.clone()]).await;
    assert_eq!(
        store
            .get_trial(study.id, TrialId::new(1))
            .await
            .expect("get"),
        Some(paused.clone())
    );
    let counts = store
        .get_study(study.id)
        .await
        .expect("get")
        .expect("study")
        .trial_counts;
    assert_eq!((counts.paused, counts.total), (1, 1));

    // Promoted, in a transaction of several studies: active again at the next rung.
    let tx = store.begin_studies().await.expect("begin");
    let mut on = locked(tx.lock_study(study.id, true).await.expect("lock"));
    let mut promoted = paused.clone();
    promoted.state = TrialState::Active;
    promoted.budget = Some(9.0);
    let mut s = on.study().clone();
    s.trial_counts
        .moved(Some(TrialState::Paused), TrialState::Active);
    on.update_trials(&[promoted.clone()]).await.expect("update");
    let mut fresh = trial(study.id, 2, TrialState::Paused, 0.2);
    fresh.budget = Some(1.0);
    s.trial_counts.moved(None, TrialState::Paused);
    s.next_trial_id = s.next_trial_id.next();
    on.insert_trials(&[fresh.clone()]).await.expect("insert");
    on.update_study(&s).await.expect("update study");
    on.release()
        .await
        .expect("release")
        .commit()
        .await
        .expect("commit");
    assert_eq!(
        store
            .get_trial(study.id, TrialId::new(1))
            .await
            .expect("get"),
        Some(promoted)
    );
    assert_eq!(
        store
            .get_trial(study.id, TrialId::new(2))
            .await
            .expect("get"),
        Some(fresh)
    );
    let counts = store
        .get_study(study.id)
        .await
        .expect("get")
        .expect("study")
        .trial_counts;
    assert_eq!((counts.paused, counts.active, counts.total), (1, 1, 2));
    assert_eq!(store.count_all_trials().await.expect("count").paused, 1);
}

/// Optuna's study names are unique where Augur's are not: of 8 creates of one name at once
/// exactly one inserts; Augur's own studies of that name do not count; deleting the study
/// frees the name.
async fn optuna_names_are_taken_once_by_concurrent_creates(store: Arc<dyn Store>) {
    let name = format!("optuna-race-{}", store.backend());
    let optuna = augur::service::optuna::optuna_spec(&name, &[false]).expect("spec");
    let plain = store
        .insert_study(&spec(&name), None, now())
        .await
        .expect("an Augur study of that name");
    let created = futures::future::join_all((0..8).map(|_| {
        let (store, optuna) = (store.clone(), optuna.clone());
        async move { store.insert_optuna_study(&optuna, None, now()).await }
    }))
    .await;
    let ids: Vec<StudyId> = created
        .into_iter()
        .filter_map(|r| r.expect("insert or nothing"))
        .map(|s| s.id)
        .collect();
    assert_eq!(ids.len(), 1, "exactly one create wins: {ids:?}");
    assert_ne!(ids[0], plain.id);
    assert_eq!(
        store.optuna_study_id(&name).await.expect("id"),
        Some(ids[0])
    );
    assert_eq!(
        store.optuna_study_id("no-such-study").await.expect("id"),
        None
    );
    assert!(store.delete_study(ids[0]).await.expect("delete"));
    assert_eq!(store.optuna_study_id(&name).await.expect("id"), None);
    let again = store
        .insert_optuna_study(&optuna, None, now())
        .await
        .expect("insert")
        .expect("the name is free again");
    assert_eq!(
        store.optuna_study_id(&name).await.expect("id"),
        Some(again.id)
    );
}

/// `first_trial_attr` reads the attribute of the study's lowest trial holding it (Optuna's
/// reference distribution), never the study's own (trial 0).
async fn the_first_trial_attr_of_a_name_is_the_lowest_trials(store: Arc<dyn Store>) {
    let study = store
        .insert_study(&spec("first-attr"), None, now())
        .await
        .expect("study");
    let set = |trial_id: i64, value: serde_json::Value| {
        let store = store.clone();
        async move {
            let update = augur::model::AnnotationUpdate {
                user_attrs: Some(BTreeMap::from([("d".to_string(), value)])),
                ..Default::default()
            };
            assert!(
                store
                    .annotate(study.id, TrialId::new(trial_id), &update, 100, now())
                    .await
                    .expect("annotate")
            );
        }
    };
    assert_eq!(
        store.first_trial_attr(study.id, "d").await.expect("read"),
        None
    );
    set(0, serde_json::json!("study's own")).await;
    set(7, serde_json::json!({"n": 7})).await;
    set(3, serde_json::json!({"n": 3})).await;
    assert_eq!(
        store.first_trial_attr(study.id, "d").await.expect("read"),
        Some(serde_json::json!({"n": 3}))
    );
    assert_eq!(
        store.first_trial_attr(study.id, "e").await.expect("read"),
        None
    );
}
