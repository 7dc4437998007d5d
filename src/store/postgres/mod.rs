//! PostgreSQL: the store for several replicas. The study row is locked `FOR UPDATE` in every
//! study transaction, which serializes changes to one study across all service processes.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use sqlx::{FromRow, Row};

use super::sql::{impl_sql_store, trial_cols};

mod writes;

use writes::{StudyWrites, Time, write_studies};

pub struct PostgresStore {
    /// Reads and single statements: the request handlers' pool.
    pool: PgPool,
    /// Study transactions (the commit lanes, one connection each): their own pool, so that a
    /// lane never queues for a connection behind requests' reads. A lane that times out
    /// waiting fails every command of its batch with 503; a read, only its own request.
    commits: PgPool,
    /// Reads for the answers of committed changes ([`super::Store::answer_measurements`]).
    answers: PgPool,
}

/// Connections for reads per process.
const READ_CONNECTIONS: u32 = 32;
/// Connections for study transactions per process: one per commit lane (at most 8), opened
/// as the lanes first need them.
const COMMIT_CONNECTIONS: u32 = 8;
/// Connections per process for reading the answers of committed changes (a completion's
/// trial with its measurements), apart from the reads so that they never wait behind new
/// requests; opened as needed.
const ANSWER_CONNECTIONS: u32 = 4;
/// How long a request waits for a connection before it is answered 503.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// PostgreSQL ends a session that leaves its transaction idle this long. A replica cut from
/// the database mid-transaction goes silent, and its study's row lock would otherwise stay
/// held until TCP gave up (minutes; 27 s after a 20 s cut in `multi_node.rs`), stalling the
/// study on every replica; our transactions never wait on their client for seconds.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "5s";

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<Self, super::StoreError> {
        let options: PgConnectOptions = url.parse::<PgConnectOptions>()?.options([(
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT,
        )]);
        let pool = PgPoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await?;
        // Migrations take an advisory lock, so replicas starting together apply them once.
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        let commits = PgPoolOptions::new()
            .max_connections(COMMIT_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await?;
        let answers = PgPoolOptions::new()
            .max_connections(ANSWER_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            commits,
            answers,
        })
    }

    fn answer_pool(&self) -> &PgPool {
        &self.answers
    }

    fn pool_use(&self) -> Vec<super::PoolUse> {
        vec![
            super::PoolUse::of("reads", &self.pool),
            super::PoolUse::of("commits", &self.commits),
            super::PoolUse::of("answers", &self.answers),
        ]
    }
}

impl_sql_store!(PostgresStore, PostgresStudiesTx, sqlx::Postgres, "postgres");

// A study transaction costs round trips, and the study stays locked across all of them, so
// they bound one study's throughput. Four, whatever the batch size:
// 1. `BEGIN` and the row lock, as one simple query;
// 2. the study row and its unfinished trials, in one statement whose snapshot is taken after
//    the lock was granted (READ COMMITTED: every statement sees what committed before it), so
//    a batch always sees the batch before it, on any replica;
// 3. every write of the batch, as one statement (each column travels as an array that
//    `UNNEST` zips back into rows), sent at commit: nothing reads in between;
// 4. `COMMIT`.
// A transaction over several studies costs six, however many studies it holds: 1 and 2 for
// the first study; the others locked together (`SKIP LOCKED`) and read together (`prefetch`);
// every study's writes as one statement (`write_studies`); `COMMIT`.

/// Each study row of `$1` (columns prefixed `s_`) with each of its unfinished trials, or
/// alone (trial columns NULL) when it has none; by study. The study row lists its unfinished trials' ids
/// (`unfinished_ids`, kept by every batch), so they are fetched by primary key: the keys come
/// from behind an `OFFSET 0` fence, so that stale statistics (a study growing faster than
/// autovacuum analyzes) cannot make `study_id = $1` look like a one-row scan. Not through
/// an index on `state`: every completed trial leaves a dead entry there until VACUUM, which
/// the next batches cannot mark dead while new trials keep changing the same index page, so
/// each batch read one more heap page per completed trial (1,500 pages per batch at 40,000
/// trials, and a fall from ~3,600 to ~800 trials/s, until autovacuum came by).
const STUDIES_WITH_UNFINISHED: &str = "SELECT s.id AS s_id, s.name AS s_name, s.state AS s_state, \
     s.state_reason AS s_state_reason, s.spec AS s_spec, s.next_trial_id AS s_next_trial_id, \
     s.change_seq AS s_change_seq, s.designer_state AS s_designer_state, \
     s.created_by AS s_created_by, s.created_at AS s_created_at, s.updated_at AS s_updated_at, \
     s.n_requested AS s_n_requested, s.n_active AS s_n_active, s.n_stopping AS s_n_stopping, \
     s.n_completed AS s_n_completed, s.n_infeasible AS s_n_infeasible, s.n_failed AS s_n_failed, \
     s.n_paused AS s_n_paused, \
     t.study_id, t.id, t.state, t.parameters, t.client_id, t.final_measurement, t.objective, \
     t.infeasible_reason, t.fail_reason, t.early_stopped, t.excluded, t.lease_expires_at, \
     t.created_at, t.started_at, t.completed_at, t.change_seq, t.attempts, t.budget, t.lineage \
     FROM studies s LEFT JOIN LATERAL (\
     SELECT t.* FROM (SELECT s.id AS study_id, unnest(s.unfinished_ids) AS id OFFSET 0) AS u \
     JOIN trials t ON t.study_id = u.study_id AND t.id = u.id \
     WHERE t.state IN ('requested', 'active', 'stopping')) AS t ON TRUE \
     WHERE s.id = ANY($1) ORDER BY s.id, t.id";

/// Studies locked one by one in one transaction, which `BEGIN`s with the first lock.
pub struct PostgresStudiesTx {
    pool: PgPool,
    tx: Option<sqlx::Transaction<'static, sqlx::Postgres>>,
    /// What `prefetch` locked and read, for the `lock_study` calls that follow.
    prefetched: HashMap<StudyId, Prefetched>,
    /// Writes of the studies released so far, sent as one statement at commit.
    pending: Vec<StudyWrites>,
}

/// A study as `prefetch` found it.
enum Prefetched {
    Locked(Box<StudyRecord>, Vec<TrialRecord>),
    Busy,
    Missing,
}

impl PostgresStudiesTx {
    fn begin(store: &PostgresStore) -> Box<dyn StudiesTx> {
        Box::new(PostgresStudiesTx {
            pool: store.commits.clone(),
            tx: None,
            prefetched: HashMap::new(),
            pending: Vec::new(),
        })
    }

    fn back(
        pool: PgPool,
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        outer: (HashMap<StudyId, Prefetched>, Vec<StudyWrites>),
    ) -> Box<dyn StudiesTx> {
        let (prefetched, pending) = outer;
        Box::new(PostgresStudiesTx {
            pool,
            tx: Some(tx),
            prefetched,
            pending,
        })
    }
}

// Custom plans in a study transaction: a connection's cached generic plan is made once, for
// the table's size back then, and what was cheap on a tiny table (a scan of it, or of the
// whole study through `trials_study_change_idx`) stayed in the plan for every batch as the
// study grew. Planning each batch costs ~10-20% of peak throughput; `enable_seqscan = off`
// was cheaper but left the index scan possible.
const BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan";
const LOCK: &str = "SELECT 1 FROM studies WHERE id = $1 FOR UPDATE";
const TRY_LOCK: &str = "SELECT 1 FROM studies WHERE id = $1 FOR UPDATE SKIP LOCKED";
const EXISTS: &str = "SELECT 1 FROM studies WHERE id = $1";
const TRY_LOCK_MANY: &str =
    "SELECT id FROM studies WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED";
const EXISTING: &str = "SELECT id FROM studies WHERE id = ANY($1)";

/// The study row of a `STUDIES_WITH_UNFINISHED` row (columns prefixed `s_`).
fn study_of(row: &sqlx::postgres::PgRow) -> StoreResult<StudyRecord> {
    StudyRow {
        id: row.try_get("s_id")?,
        name: row.try_get("s_name")?,
        state: row.try_get("s_state")?,
        state_reason: row.try_get("s_state_reason")?,
        spec: row.try_get("s_spec")?,
        next_trial_id: row.try_get("s_next_trial_id")?,
        change_seq: row.try_get("s_change_seq")?,
        designer_state: row.try_get("s_designer_state")?,
        created_by: row.try_get("s_created_by")?,
        created_at: row.try_get("s_created_at")?,
        updated_at: row.try_get("s_updated_at")?,
        n_requested: row.try_get("s_n_requested")?,
        n_active: row.try_get("s_n_active")?,
        n_stopping: row.try_get("s_n_stopping")?,
        n_completed: row.try_get("s_n_completed")?,
        n_infeasible: row.try_get("s_n_infeasible")?,
        n_failed: row.try_get("s_n_failed")?,
        n_paused: row.try_get("s_n_paused")?,
    }
    .try_into()
}

/// The unfinished trial of a `STUDIES_WITH_UNFINISHED` row, if it has one.
fn unfinished_of(row: &sqlx::postgres::PgRow) -> StoreResult<Option<TrialRecord>> {
    if row.try_get::<Option<i64>, _>("id")?.is_none() {
        return Ok(None);
    }
    Ok(Some(TrialRow::from_row(row)?.try_into()?))
}

#[async_trait::async_trait]
impl StudiesTx for PostgresStudiesTx {
    async fn lock_study(self: Box<Self>, study_id: StudyId, wait: bool) -> StoreResult<StudyLock> {
        let PostgresStudiesTx {
            pool,
            tx,
            mut prefetched,
            pending,
        } = *self;
        if let Some(found) = prefetched.remove(&study_id)
            && let Some(tx) = tx
        {
            let outer = (prefetched, pending);
            return Ok(match found {
                Prefetched::Locked(study, unfinished) => {
                    StudyLock::Locked(PostgresStudyTx::locked(pool, tx, outer, *study, unfinished))
                }
                Prefetched::Busy => StudyLock::Busy(Self::back(pool, tx, outer)),
                Prefetched::Missing => StudyLock::Missing(Self::back(pool, tx, outer)),
            });
        }
        let outer = (prefetched, pending);
        let mut tx = match tx {
            Some(mut tx) => {
                if wait {
                    sqlx::query(LOCK).bind(study_id).execute(&mut *tx).await?;
                } else if sqlx::query(TRY_LOCK)
                    .bind(study_id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .is_none()
                {
                    let exists = sqlx::query(EXISTS)
                        .bind(study_id)
                        .fetch_optional(&mut *tx)
                        .await?
                        .is_some();
                    let back = Self::back(pool, tx, outer);
                    return Ok(if exists {
                        StudyLock::Busy(back)
                    } else {
                        StudyLock::Missing(back)
                    });
                }
                tx
            }
            // The first lock rides with `BEGIN`: one round trip. (An integer formatted into
            // the SQL: nothing a client sends reaches this text.)
            None if wait => {
                let begin =
                    format!("{BEGIN}; SELECT 1 FROM studies WHERE id = {study_id} FOR UPDATE");
                pool.begin_with(sqlx::AssertSqlSafe(begin)).await?
            }
            None => {
                let tx = pool.begin_with(BEGIN).await?;
                return Self::back(pool, tx, outer)
                    .lock_study(study_id, false)
                    .await;
            }
        };
        let rows = sqlx::query(STUDIES_WITH_UNFINISHED)
            .bind(vec![study_id])
            .fetch_all(&mut *tx)
            .await?;
        let Some(first) = rows.first() else {
            return Ok(StudyLock::Missing(Self::back(pool, tx, outer)));
        };
        let study = study_of(first)?;
        let mut unfinished = Vec::new();
        for row in &rows {
            unfinished.extend(unfinished_of(row)?);
        }
        Ok(StudyLock::Locked(PostgresStudyTx::locked(
            pool, tx, outer, study, unfinished,
        )))
    }

    /// Two statements for all of them: lock those no other transaction holds, then read
    /// them with their unfinished trials (and a third to tell busy from missing, when some
    /// were skipped). Each study is read after its lock was granted, as in `lock_study`.
    async fn prefetch(&mut self, study_ids: &[StudyId]) -> StoreResult<()> {
        let wanted: Vec<StudyId> = study_ids
            .iter()
            .copied()
            .filter(|id| !self.prefetched.contains_key(id))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        if self.tx.is_none() {
            self.tx = Some(self.pool.begin_with(BEGIN).await?);
        }
        let Some(tx) = self.tx.as_mut() else {
            return Ok(());
        };
        let locked: Vec<StudyId> = sqlx::query_scalar(TRY_LOCK_MANY)
            .bind(&wanted)
            .fetch_all(&mut **tx)
            .await?;
        let skipped: Vec<StudyId> = wanted
            .iter()
            .copied()
            .filter(|id| !locked.contains(id))
            .collect();
        if !skipped.is_empty() {
            let existing: Vec<StudyId> = sqlx::query_scalar(EXISTING)
                .bind(&skipped)
                .fetch_all(&mut **tx)
                .await?;
            for id in skipped {
                let found = if existing.contains(&id) {
                    Prefetched::Busy
                } else {
                    Prefetched::Missing
                };
                self.prefetched.insert(id, found);
            }
        }
        if locked.is_empty() {
            return Ok(());
        }
        let rows = sqlx::query(STUDIES_WITH_UNFINISHED)
            .bind(&locked)
            .fetch_all(&mut **tx)
            .await?;
        let mut read: HashMap<StudyId, (StudyRecord, Vec<TrialRecord>)> = HashMap::new();
        for row in &rows {
            let id: StudyId = row.try_get("s_id")?;
            if let std::collections::hash_map::Entry::Vacant(entry) = read.entry(id) {
                entry.insert((study_of(row)?, Vec::new()));
            }
            if let (Some(trial), Some(entry)) = (unfinished_of(row)?, read.get_mut(&id)) {
                entry.1.push(trial);
            }
        }
        for id in locked {
            let found = match read.remove(&id) {
                Some((study, unfinished)) => Prefetched::Locked(Box::new(study), unfinished),
                None => Prefetched::Missing,
            };
            self.prefetched.insert(id, found);
        }
        Ok(())
    }

    async fn send_writes(&mut self) -> StoreResult<()> {
        if let Some(tx) = self.tx.as_mut() {
            write_studies(tx, &self.pending).await?;
            self.pending.clear();
        }
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> StoreResult<()> {
        self.send_writes().await?;
        if let Some(tx) = self.tx {
            tx.commit().await?;
        }
        Ok(())
    }
}

pub struct PostgresStudyTx {
    pool: PgPool,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// The transaction's other prefetched studies, handed back on `release`.
    prefetched: HashMap<StudyId, Prefetched>,
    /// Writes of the transaction's studies released before this one, sent at commit.
    pending: Vec<StudyWrites>,
    study: StudyRecord,
    /// Read with the study row; handed out by the first `unfinished_trials`.
    unfinished: Option<Vec<TrialRecord>>,
    /// The ids of the unfinished trials, as of the writes held so far.
    unfinished_ids: std::collections::BTreeSet<TrialId>,
    /// Writes held until `release` or `commit`.
    new_trials: Vec<TrialRecord>,
    changed_trials: Vec<TrialRecord>,
    measurements: Vec<(TrialId, Measurement)>,
    measured_at: Option<Time>,
    study_update: Option<StudyRecord>,
    /// Trials whose tokens to delete.
    revoked: Vec<TrialId>,
    /// Tokens to store (replace), and when.
    tokens: Vec<TrialToken>,
    tokens_at: Option<Time>,
}

impl PostgresStudyTx {
    /// The transaction on a study just locked and read.
    fn locked(
        pool: PgPool,
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        outer: (HashMap<StudyId, Prefetched>, Vec<StudyWrites>),
        study: StudyRecord,
        unfinished: Vec<TrialRecord>,
    ) -> Box<dyn StudyTx> {
        let unfinished_ids = unfinished.iter().map(|t| t.id).collect();
        let (prefetched, pending) = outer;
        Box::new(PostgresStudyTx {
            pool,
            tx,
            prefetched,
            pending,
            study,
            unfinished: Some(unfinished),
            unfinished_ids,
            new_trials: Vec::new(),
            changed_trials: Vec::new(),
            measurements: Vec::new(),
            measured_at: None,
            study_update: None,
            revoked: Vec::new(),
            tokens: Vec::new(),
            tokens_at: None,
        })
    }

    /// Sends the writes held so far, so that a read sees them (the service only reads before
    /// it writes, so this costs a round trip in the conformance suite, not in a batch).
    async fn flush(&mut self) -> StoreResult<()> {
        if let Some(writes) = self.take_writes()? {
            write_studies(&mut self.tx, std::slice::from_ref(&writes)).await?;
            self.unfinished = None;
        }
        Ok(())
    }

    fn has_writes(&self) -> bool {
        !self.new_trials.is_empty()
            || !self.changed_trials.is_empty()
            || !self.measurements.is_empty()
            || self.study_update.is_some()
            || !self.revoked.is_empty()
            || !self.tokens.is_empty()
    }

    /// The writes held so far, as one study's part of a statement; `None` without any.
    fn take_writes(&mut self) -> StoreResult<Option<StudyWrites>> {
        if !self.has_writes() {
            return Ok(None);
        }
        // One statement may not touch a row twice: of two measurements at one (trial, step)
        // the later wins, as it would row by row; of two tokens of one name, the later.
        let mut latest: std::collections::BTreeMap<(TrialId, i64), Measurement> =
            std::collections::BTreeMap::new();
        for (trial_id, m) in self.measurements.drain(..) {
            latest.insert((trial_id, m.step), m);
        }
        let mut tokens: std::collections::BTreeMap<String, TrialToken> =
            std::collections::BTreeMap::new();
        for t in self.tokens.drain(..) {
            tokens.insert(t.name.clone(), t);
        }
        for t in self.new_trials.iter().chain(&self.changed_trials) {
            if t.state.is_unfinished() {
                self.unfinished_ids.insert(t.id);
            } else {
                self.unfinished_ids.remove(&t.id);
            }
        }
        // Without an update from the service the study row is written back as it is (the
        // lock has kept it so), with its new list of unfinished trials.
        if let Some(update) = self.study_update.take() {
            self.study = update;
        }
        Ok(Some(StudyWrites {
            study: self.study.clone(),
            unfinished_ids: self.unfinished_ids.iter().copied().collect(),
            new_trials: std::mem::take(&mut self.new_trials),
            changed_trials: std::mem::take(&mut self.changed_trials),
            measurements: latest
                .into_iter()
                .map(|((trial_id, _), m)| (trial_id, m))
                .collect(),
            measured_at: self.measured_at.take().unwrap_or(self.study.updated_at),
            revoked: std::mem::take(&mut self.revoked),
            tokens: tokens.into_values().collect(),
            tokens_at: self.tokens_at.take().unwrap_or(self.study.updated_at),
        }))
    }
}

#[async_trait::async_trait]
impl StudyTx for PostgresStudyTx {
    fn study(&self) -> &StudyRecord {
        &self.study
    }

    async fn unfinished_trials(&mut self) -> StoreResult<Vec<TrialRecord>> {
        self.flush().await?;
        if let Some(trials) = self.unfinished.take() {
            return Ok(trials);
        }
        let ids: Vec<TrialId> = self.unfinished_ids.iter().copied().collect();
        let rows: Vec<TrialRow> = sqlx::query_as(TRIALS_BY_ID)
            .bind(self.study.id)
            .bind(ids)
            .fetch_all(&mut *self.tx)
            .await?;
        rows.into_iter().map(TrialRecord::try_from).collect()
    }

    async fn paused_trials(&mut self) -> StoreResult<Vec<TrialRecord>> {
        self.flush().await?;
        let rows: Vec<TrialRow> = sqlx::query_as(PAUSED_TRIALS)
            .bind(self.study.id)
            .fetch_all(&mut *self.tx)
            .await?;
        rows.into_iter().map(TrialRecord::try_from).collect()
    }

    async fn trials_by_id(&mut self, ids: &[TrialId]) -> StoreResult<Vec<TrialRecord>> {
        self.flush().await?;
        let rows: Vec<TrialRow> = sqlx::query_as(TRIALS_BY_ID)
            .bind(self.study.id)
            .bind(ids)
            .fetch_all(&mut *self.tx)
            .await?;
        rows.into_iter().map(TrialRecord::try_from).collect()
    }

    async fn completed_objectives(
        &mut self,
    ) -> StoreResult<Vec<(TrialId, f64, chrono::DateTime<chrono::Utc>)>> {
        self.flush().await?;
        Ok(sqlx::query_as(COMPLETED_OBJECTIVES)
            .bind(self.study.id)
            .fetch_all(&mut *self.tx)
            .await?)
    }

    async fn count_failed(&mut self) -> StoreResult<u64> {
        self.flush().await?;
        let (n,): (i64,) = sqlx::query_as(COUNT_FAILED)
            .bind(self.study.id)
            .fetch_one(&mut *self.tx)
            .await?;
        Ok(n.max(0) as u64)
    }

    async fn runner_lease(&mut self) -> StoreResult<Option<(String, Time)>> {
        Ok(sqlx::query_as(super::sql::RUNNER_LEASE)
            .bind(self.study.id)
            .fetch_optional(&mut *self.tx)
            .await?)
    }

    async fn measurements(&mut self, trial_id: TrialId) -> StoreResult<Vec<Measurement>> {
        self.flush().await?;
        let rows: Vec<MeasurementRow> = sqlx::query_as(MEASUREMENTS_RANGE)
            .bind(self.study.id)
            .bind(trial_id)
            .bind(trial_id)
            .fetch_all(&mut *self.tx)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| <(TrialId, Measurement)>::from(r).1)
            .collect())
    }

    async fn insert_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()> {
        self.new_trials.extend_from_slice(trials);
        Ok(())
    }

    async fn update_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()> {
        // One statement sees none of its own changes: fold an update into a pending insert of
        // the same trial, and keep only the last update of a trial.
        for t in trials {
            if let Some(pending) = self.new_trials.iter_mut().find(|n| n.id == t.id) {
                let created_at = pending.created_at;
                *pending = t.clone();
                pending.created_at = created_at;
            } else if let Some(pending) = self.changed_trials.iter_mut().find(|c| c.id == t.id) {
                *pending = t.clone();
            } else {
                self.changed_trials.push(t.clone());
            }
        }
        Ok(())
    }

    async fn upsert_measurements(
        &mut self,
        rows: &[(TrialId, Measurement)],
        now: Time,
    ) -> StoreResult<()> {
        self.measurements.extend_from_slice(rows);
        self.measured_at = Some(now);
        Ok(())
    }

    async fn update_study(&mut self, study: &StudyRecord) -> StoreResult<()> {
        self.study_update = Some(study.clone());
        Ok(())
    }

    async fn revoke_trial_tokens(&mut self, trial_ids: &[TrialId]) -> StoreResult<()> {
        self.revoked.extend_from_slice(trial_ids);
        Ok(())
    }

    async fn replace_trial_tokens(&mut self, tokens: &[TrialToken], now: Time) -> StoreResult<()> {
        self.tokens.extend_from_slice(tokens);
        if !tokens.is_empty() {
            self.tokens_at = Some(now);
        }
        Ok(())
    }

    async fn release(mut self: Box<Self>) -> StoreResult<Box<dyn StudiesTx>> {
        if let Some(writes) = self.take_writes()? {
            self.pending.push(writes);
        }
        let PostgresStudyTx {
            pool,
            tx,
            prefetched,
            pending,
            ..
        } = *self;
        Ok(PostgresStudiesTx::back(pool, tx, (prefetched, pending)))
    }

    async fn commit(mut self: Box<Self>) -> StoreResult<()> {
        if let Some(writes) = self.take_writes()? {
            self.pending.push(writes);
        }
        write_studies(&mut self.tx, &self.pending).await?;
        self.tx.commit().await?;
        Ok(())
    }
}

/// Trials of the study by id, in one statement.
const TRIALS_BY_ID: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND id = ANY($2) ORDER BY id"
);
