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
        let file = options.get_filename().to_path_buf();
        let pool = SqlitePoolOptions::new()
            // An in-memory database lives in one connection.
            .max_connections(if in_memory { 1 } else { 8 })
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await?;
        if !in_memory {
            owner_only(&file);
        }
        Ok(Self { pool })
    }

    /// Answers read from the one pool: in WAL mode no read waits on a lock, so a read
    /// connection is soon free again.
    fn answer_pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// One pool: SQLite's one writer needs no lane of its own.
    fn pool_use(&self) -> Vec<super::PoolUse> {
        vec![super::PoolUse::of("reads", &self.pool)]
    }
}

/// The database file (and its WAL and shared-memory files) readable and writable by the
/// server's user alone: it holds the token store, and jobs (`--run-jobs-as`) or other users
/// of the machine must not read it.
fn owner_only(file: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut paths = vec![file.to_path_buf()];
    for suffix in ["-wal", "-shm"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        paths.push(name.into());
    }
    for path in paths {
        if path.exists()
            && let Err(error) =
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        {
            tracing::warn!(path = %path.display(), %error, "could not make the database file private");
        }
    }
}

const LOCK_STUDY: &str = concat!("SELECT ", study_cols!(), " FROM studies WHERE id = $1");

impl_sql_store!(SqliteStore, SqliteStudiesTx, sqlx::Sqlite, "sqlite");
impl_row_study_tx!(
    SqliteStore,
    SqliteStudiesTx,
    SqliteStudyTx,
    sqlx::Sqlite,
    LOCK_STUDY,
    |pool| pool.begin_with("BEGIN IMMEDIATE")
);
