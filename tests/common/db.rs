//! Real databases for tests: a fresh SQLite file or PostgreSQL database per test
//! (`TestDb`, dropped with it), `on_both_backends!` to run one test on each backend,
//! and PostgreSQL's statistics for tests that count the server's reads.

use std::time::Duration;

/// Each named async fn becomes two tests, `name::sqlite` and `name::postgres`: called with
/// the backend's name (`on_both_backends!(a, b)`), or with a connected store on a fresh
/// database of that backend (`on_both_backends!(store: a, b)`).
macro_rules! on_both_backends {
    (store: $($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                let db = $crate::common::sqlite_db();
                super::$name(augur::store::connect(&db.url).await.expect("sqlite store")).await
            }
            #[tokio::test]
            async fn postgres() {
                let db = $crate::common::postgres_db().await;
                super::$name(augur::store::connect(&db.url).await.expect("postgres store")).await
            }
        }
    )*};
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name("sqlite").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name("postgres").await
            }
        }
    )*};
}

/// Admin URL of the test PostgreSQL (see scripts/start-postgres.sh).
pub fn postgres_admin_url() -> String {
    std::env::var("AUGUR_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/postgres".to_string())
}

/// A database that lives as long as this value (SQLite: a file in a temp dir).
pub struct TestDb {
    pub url: String,
    pub backend: &'static str,
    _dir: Option<tempfile::TempDir>,
    /// A PostgreSQL database to drop when the test is done.
    pg_name: Option<String>,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            admin_sql_from_drop(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

/// Run `sql` on the PostgreSQL admin connection, best effort, from a `Drop` (synchronous,
/// and maybe inside a runtime: on a thread with its own).
pub fn admin_sql_from_drop(sql: String) {
    let _ = std::thread::spawn(move || {
        use sqlx::Connection;
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await;
            }
        });
    })
    .join();
}

pub fn sqlite_db() -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("augur.db").display());
    TestDb {
        url,
        backend: "sqlite",
        _dir: Some(dir),
        pg_name: None,
    }
}

/// A new, empty PostgreSQL database. Fails loudly if PostgreSQL is not running: run the
/// README's test command, which starts it.
pub async fn postgres_db() -> TestDb {
    use sqlx::Connection;
    let admin = postgres_admin_url();
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {admin} is not reachable ({e}); run scripts/test.sh")
        });
    let name = format!("augur_test_{}", uuid_like());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create test database");
    let base = admin
        .rsplit_once('/')
        .map_or(admin.as_str(), |(b, _)| b)
        .to_string();
    TestDb {
        url: format!("{base}/{name}"),
        backend: "postgres",
        _dir: None,
        pg_name: Some(name),
    }
}

pub async fn db(backend: &str) -> TestDb {
    match backend {
        "postgres" => postgres_db().await,
        _ => sqlite_db(),
    }
}

fn uuid_like() -> String {
    let bytes: [u8; 8] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One number from PostgreSQL's statistics views (`sql` selects a single bigint), read once
/// every backend has reported what it did: an idle backend reports within 10 s
/// (PGSTAT_IDLE_INTERVAL), so a test measuring work done by the server's pool waits that long.
pub async fn settled_pg_counter(admin: &mut sqlx::PgConnection, sql: &'static str) -> i64 {
    tokio::time::sleep(Duration::from_millis(11_000)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *admin)
        .await
        .expect("clear the statistics snapshot");
    let (n,): (i64,) = sqlx::query_as(sql)
        .fetch_one(&mut *admin)
        .await
        .expect("statistics");
    n
}
