//! SQLite: the embedded default. WAL mode and a busy timeout let readers run beside the one
//! writer; study transactions start with `BEGIN IMMEDIATE`, taking the write lock up front so
//! two of them never deadlock upgrading from read to write.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::sql::{impl_row_study_tx, impl_sql_store, study_cols};

pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    pub async fn connect(url: &str) -> Result<Self, super::StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a commit survives power loss, as acknowledged measurements must.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let in_memory = url.contains(":memory:");
        let pool = SqlitePoolOptions::new()
            // An in-memory database lives in one connection.
            .max_connections(if in_memory { 1 } else { 8 })
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await?;
        Ok(Self { pool })
    }
}

const LOCK_STUDY: &str = concat!("SELECT ", study_cols!(), " FROM studies WHERE id = $1");

impl_sql_store!(SqliteStore, SqliteStudyTx, sqlx::Sqlite, "sqlite");
impl_row_study_tx!(SqliteStore, SqliteStudyTx, sqlx::Sqlite, LOCK_STUDY, |s| s
    .pool
    .begin_with("BEGIN IMMEDIATE"));
