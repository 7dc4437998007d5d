//! PostgreSQL: the store for several replicas. The study row is locked `FOR UPDATE` in every
//! study transaction, which serializes changes to one study across all service processes.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};

use super::sql::{impl_sql_store, study_cols};

pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<Self, super::StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await?;
        // Migrations take an advisory lock, so replicas starting together apply them once.
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        Ok(Self { pool })
    }
}

const LOCK_STUDY: &str = concat!(
    "SELECT ",
    study_cols!(),
    " FROM studies WHERE id = $1 FOR UPDATE"
);

impl_sql_store!(
    PostgresStore,
    PostgresStudyTx,
    sqlx::Postgres,
    "postgres",
    LOCK_STUDY,
    |s| s.pool.begin()
);
