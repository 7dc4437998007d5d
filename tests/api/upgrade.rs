//! Upgrades: what a newer `augur` makes of what an older one stored, on both backends.

use crate::common::{self, routes};

use augur::{App, ServerConfig};
use serde_json::{Value, json};

/// The migration that keeps older studies' trial directories where they are.
const OUTPUT_LAYOUT_MIGRATION: i64 = 20261203000001;

/// The migration that makes Optuna's study names unique.
const OPTUNA_STORAGE_MIGRATION: i64 = 20261207000002;

on_both_backends!(
    studies_from_before_the_per_study_layout_keep_their_trial_directories,
    optuna_studies_from_before_unique_names_keep_the_oldest_of_a_name,
);

/// Run one statement on the database at `url`; the rows it touched.
async fn run_sql(backend: &str, url: &str, sql: &'static str) -> u64 {
    match backend {
        "sqlite" => {
            let pool = sqlx::SqlitePool::connect(url).await.expect("sqlite");
            let done = sqlx::query(sql).execute(&pool).await.expect(sql);
            done.rows_affected()
        }
        _ => {
            let pool = sqlx::PgPool::connect(url).await.expect("postgres");
            let done = sqlx::query(sql).execute(&pool).await.expect(sql);
            done.rows_affected()
        }
    }
}

/// Undo the record of one migration, as if the database came from a binary older than it,
/// so that the next server to start applies it to what is stored.
async fn forget_migration(backend: &str, url: &str, version: i64) {
    let sql = "DELETE FROM _sqlx_migrations WHERE version = $1";
    let deleted = match backend {
        "sqlite" => {
            let pool = sqlx::SqlitePool::connect(url).await.expect("sqlite");
            sqlx::query(sql)
                .bind(version)
                .execute(&pool)
                .await
                .expect(sql)
                .rows_affected()
        }
        _ => {
            let pool = sqlx::PgPool::connect(url).await.expect("postgres");
            sqlx::query(sql)
                .bind(version)
                .execute(&pool)
                .await
                .expect(sql)
                .rows_affected()
        }
    };
    assert_eq!(deleted, 1, "migration {version} was applied");
}

async fn studies_from_before_the_per_study_layout_keep_their_trial_directories(backend: &str) {
    let db = common::db(backend).await;
    let url = db.url.clone();
    let app = common::spawn_app_configured(db, |c| c.dispatch = false).await;
    let with_job = |job: Value| {
        let mut spec = common::spec("random", 2, 1);
        spec["trial_job"] = job;
        spec
    };
    let old = app
        .create_study(with_job(
            json!({"command": ["true"], "output_dir": "runs/old"}),
        ))
        .await;
    let no_dir = app
        .create_study(with_job(json!({"command": ["true"]})))
        .await;
    forget_migration(backend, &url, OUTPUT_LAYOUT_MIGRATION).await;

    // The upgrade: a server of this version starts on the older database.
    let mut config = ServerConfig::new(url, "127.0.0.1:0".parse().expect("addr"));
    config.dispatch = false;
    let upgraded = App::build(config)
        .await
        .expect("the upgraded server starts");
    let base = format!("http://{}", upgraded.addr());
    tokio::spawn(upgraded.run());
    let http = common::http();
    let job_of = |id: i64| {
        let (http, base) = (&http, &base);
        async move {
            let path = routes::study(id);
            let study = common::call(http, base, None, reqwest::Method::GET, &path, None).await;
            study.body["spec"]["trial_job"].clone()
        }
    };
    assert_eq!(
        job_of(old).await["output_layout"],
        "trial",
        "a study with an output_dir keeps <output_dir>/<trial>"
    );
    assert_eq!(
        job_of(no_dir).await["output_layout"],
        "study_id",
        "a study without one keeps augur-runs/study-<id>/<trial>"
    );
    // New studies get the per-study layout, and may ask for the flat one.
    let create = |job: Value| {
        let (http, base) = (&http, &base);
        async move {
            let path = "/v1/studies";
            let spec = Some(with_job(job));
            common::call(http, base, None, reqwest::Method::POST, path, spec).await
        }
    };
    let new = create(json!({"command": ["true"], "output_dir": "runs/old"})).await;
    assert_eq!(new.status, reqwest::StatusCode::CREATED, "{}", new.body);
    assert!(
        new.body["spec"]["trial_job"].get("output_layout").is_none(),
        "{}",
        new.body
    );
    let flat =
        create(json!({"command": ["true"], "output_dir": "runs/flat", "output_layout": "trial"}))
            .await;
    assert_eq!(
        flat.body["spec"]["trial_job"]["output_layout"], "trial",
        "{}",
        flat.body
    );
    let bad = create(json!({"command": ["true"], "output_layout": "nested"})).await;
    assert_eq!(bad.status, reqwest::StatusCode::BAD_REQUEST, "{}", bad.body);
}

/// Before Optuna's names were unique, two processes could create one name at once: after the
/// upgrade the oldest Optuna study of a name is the one Optuna finds, the name stays taken,
/// and Augur's own studies of that name are no Optuna study.
async fn optuna_studies_from_before_unique_names_keep_the_oldest_of_a_name(backend: &str) {
    let db = common::db(backend).await;
    let store = augur::store::connect(&db.url).await.expect("store");
    let optuna = augur::service::optuna::optuna_spec("raced", &[false]).expect("spec");
    let plain: augur::model::StudySpec =
        serde_json::from_value(common::x_spec("raced", ("acc", "maximize"), 10, 3, 1))
            .expect("spec");
    let now = chrono::Utc::now();
    // As an older binary stored them: no Optuna name kept apart.
    store.insert_study(&plain, None, now).await.expect("study");
    let oldest = store.insert_study(&optuna, None, now).await.expect("study");
    store.insert_study(&optuna, None, now).await.expect("study");
    drop(store);
    for sql in [
        "DROP INDEX user_attrs_study_name_idx",
        "DROP INDEX studies_optuna_name_idx",
        "ALTER TABLE studies DROP COLUMN optuna_name",
    ] {
        run_sql(backend, &db.url, sql).await;
    }
    forget_migration(backend, &db.url, OPTUNA_STORAGE_MIGRATION).await;

    let store = augur::store::connect(&db.url).await.expect("the upgrade");
    assert_eq!(
        store.optuna_study_id("raced").await.expect("id"),
        Some(oldest.id)
    );
    let again = store.insert_optuna_study(&optuna, None, now).await;
    assert!(again.expect("insert").is_none(), "the name stays taken");
}
