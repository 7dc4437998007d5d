//! Persistence: the only code that speaks SQL. One [`Store`] interface, implemented for
//! PostgreSQL and SQLite from the same SQL (see `sql.rs`), proven equal by the conformance
//! suite in `tests/api/store.rs`.

mod postgres;
mod records;
mod sql;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

pub use postgres::PostgresStore;
pub use records::{
    AuditEntry, AuditRecord, ChangeCursor, DeliveryProgress, DeliveryRecord, NewDelivery,
    PoolUsageRecord, PoolWorkerRecord, PoolWorkerReport, ReplicaRecord, StudyRecord, TokenRecord,
    TrialRecord, TrialToken,
};
pub use sqlite::SqliteStore;

use crate::model::{
    Measurement, Role, StudyId, StudySpec, StudyState, TrialCounts, TrialId, TrialKey, TrialPoint,
    TrialState,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is going away (a restart, a failover, a pool with
    /// no connection to give): the same request may succeed in a moment. Whether a write in
    /// flight was committed is unknown.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The connection broke after a change was sent: the database may have applied it (or
    /// may yet: a statement waiting for a lock runs on without its client), so whether it
    /// was is unknown. Only the single-statement changes that clients ask for directly say
    /// this ([`StoreError::after_sending`]); a transaction's statements before its commit
    /// are rolled back with it and stay `Unavailable`.
    #[error("connection lost after a change was sent: {0}")]
    Lost(String),
    #[error("database error: {0}")]
    Database(sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored document no longer parses: a bug or a hand edit, never user input.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_outage(&e) {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Database(e)
        }
    }
}

impl StoreError {
    /// An error of a change that was handed to a connection: a connection that broke
    /// (rather than a database that answered with an error) leaves its outcome unknown.
    pub fn after_sending(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed => StoreError::Lost(e.to_string()),
            other => other.into(),
        }
    }

    /// Whether the database refused a row because a unique key already holds its value.
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

/// Whether an error says the database is out of reach for now, rather than that the request
/// was wrong: the connection broke or could not be made, the pool had none to give, the
/// server is shutting down, starting up or full (PostgreSQL's SQLSTATE class 08, 57P01-03,
/// 53300), or SQLite's lock stayed taken past its busy timeout (SQLITE_BUSY, 5).
fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(code.as_ref(), "57P01" | "57P02" | "57P03" | "53300" | "5")
        }),
        _ => false,
    }
}

/// Open the store a URL names (`sqlite://augur.db`, `sqlite::memory:`, `postgres://…`) and
/// apply its migrations.
pub async fn connect(url: &str) -> StoreResult<std::sync::Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(std::sync::Arc::new(PostgresStore::connect(url).await?))
    } else if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(SqliteStore::connect(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_string()))
    }
}

/// One connection pool's use: connections open, and of those idle (not lent out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUse {
    /// `reads` (request handlers), `commits` (study transactions) or `answers` (reads
    /// for the answers of committed changes).
    pub pool: &'static str,
    pub open: u32,
    pub idle: usize,
}

impl PoolUse {
    pub fn of<DB: sqlx::Database>(pool: &'static str, of: &sqlx::Pool<DB>) -> Self {
        Self {
            pool,
            open: of.size(),
            idle: of.num_idle(),
        }
    }
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `postgres` or `sqlite`.
    fn backend(&self) -> &'static str;
    /// The connection pools' use right now, for `/metrics`.
    fn connections(&self) -> Vec<PoolUse>;
    async fn ping(&self) -> StoreResult<()>;

    /// A new active study; `created_by` names the token that created it.
    async fn insert_study(
        &self,
        spec: &StudySpec,
        created_by: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<StudyRecord>;
    async fn get_study(&self, study_id: StudyId) -> StoreResult<Option<StudyRecord>>;
    /// A new active Optuna study: `None`, and nothing inserted, when an Optuna study of
    /// `spec.name` exists (Optuna's names are unique, checked and taken in one statement).
    async fn insert_optuna_study(
        &self,
        spec: &StudySpec,
        created_by: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<StudyRecord>>;
    /// The Optuna study of that name.
    async fn optuna_study_id(&self, name: &str) -> StoreResult<Option<StudyId>>;
    /// The user attribute `name` of the study's first trial (by id) that has one.
    async fn first_trial_attr(
        &self,
        study_id: StudyId,
        name: &str,
    ) -> StoreResult<Option<serde_json::Value>>;

    /// Studies with id > `after_id`, by id, at most `limit`.
    async fn list_studies(
        &self,
        state: Option<StudyState>,
        name_contains: Option<&str>,
        after_id: StudyId,
        limit: i64,
    ) -> StoreResult<Vec<StudyRecord>>;
    /// Deletes the study with its trials, measurements and tokens. False if there was none.
    async fn delete_study(&self, study_id: StudyId) -> StoreResult<bool>;

    /// Counts over every study, for `/metrics`: the sum of the studies' `trial_counts`.
    async fn count_all_trials(&self) -> StoreResult<TrialCounts>;
    /// The completed, not excluded trial with the best first-metric value.
    async fn best_trial(
        &self,
        study_id: StudyId,
        maximize: bool,
    ) -> StoreResult<Option<TrialRecord>>;
    /// Trials with id > `after_id`, by id, at most `limit`, measurements not loaded.
    async fn list_trials(
        &self,
        study_id: StudyId,
        state: Option<TrialState>,
        after_id: TrialId,
        limit: i64,
    ) -> StoreResult<Vec<TrialRecord>>;
    async fn get_trial(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> StoreResult<Option<TrialRecord>>;
    /// Trials created or changed after the cursor `(change_seq, id)`, in that order.
    async fn changed_trials(
        &self,
        study_id: StudyId,
        after: ChangeCursor,
        limit: i64,
    ) -> StoreResult<Vec<TrialRecord>>;
    /// Every trial of the study (for designers, Pareto sets and exports).
    async fn all_trials(&self, study_id: StudyId) -> StoreResult<Vec<TrialRecord>>;
    /// The study's `limit` latest completed, not excluded trials, newest first.
    async fn latest_completed(
        &self,
        study_id: StudyId,
        limit: i64,
    ) -> StoreResult<Vec<TrialRecord>>;
    /// The dashboard's light view of the study's trials: all of them by id, or with
    /// `changed_after = Some(seq)` at most `limit` of those changed after `change_seq` seq.
    async fn trial_points(
        &self,
        study_id: StudyId,
        changed_after: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<TrialPoint>>;
    /// Measurements of trials `first..=last`, by trial then step.
    async fn measurements(
        &self,
        study_id: StudyId,
        first_trial: TrialId,
        last_trial: TrialId,
    ) -> StoreResult<Vec<(TrialId, Measurement)>>;
    /// [`Store::measurements`] for the answer to a change already committed: from a read
    /// connection if one is free, else from connections that new requests do not take:
    /// finishing work already done must not queue behind new work when the read
    /// connections are all taken (the answer would otherwise be lost, though the change
    /// was applied).
    async fn answer_measurements(
        &self,
        study_id: StudyId,
        first_trial: TrialId,
        last_trial: TrialId,
    ) -> StoreResult<Vec<(TrialId, Measurement)>>;
    async fn set_designer_state(
        &self,
        study_id: StudyId,
        state: &serde_json::Value,
    ) -> StoreResult<()>;

    /// The notes, tags and user attributes of trials `first..=last` of a study (trial 0:
    /// the study itself), by trial; trials with none are absent.
    async fn annotations(
        &self,
        study_id: StudyId,
        first: TrialId,
        last: TrialId,
    ) -> StoreResult<std::collections::BTreeMap<TrialId, crate::model::Annotations>>;
    /// The notes, tags and user attributes of studies `first..=last` themselves (their
    /// trial 0), by study: one read for a page of studies.
    async fn study_annotations(
        &self,
        first: StudyId,
        last: StudyId,
    ) -> StoreResult<std::collections::BTreeMap<StudyId, crate::model::Annotations>>;
    /// Apply a validated `update` to a trial's annotations (trial 0: the study's) in one
    /// transaction: `false`, and nothing changed, when it would leave more than
    /// `max_user_attrs` user attributes.
    async fn annotate(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        update: &crate::model::AnnotationUpdate,
        max_user_attrs: usize,
        now: DateTime<Utc>,
    ) -> StoreResult<bool>;

    /// Begin the one kind of transaction that changes studies: it locks each study it changes
    /// ([`StudiesTx::lock_study`]; row locks on PostgreSQL, the write lock on SQLite) until
    /// commit or drop. Nothing is sent to the database before the first lock.
    async fn begin_studies(&self) -> StoreResult<Box<dyn StudiesTx>>;

    /// A transaction on one study, waiting for its lock. `None` if the study does not exist.
    async fn begin_study(&self, study_id: StudyId) -> StoreResult<Option<Box<dyn StudyTx>>> {
        match self
            .begin_studies()
            .await?
            .lock_study(study_id, true)
            .await?
        {
            StudyLock::Locked(tx) => Ok(Some(tx)),
            StudyLock::Missing(_) | StudyLock::Busy(_) => Ok(None),
        }
    }

    async fn insert_token(
        &self,
        name: &str,
        token_hash: &str,
        scope: Option<TrialKey>,
        now: DateTime<Utc>,
    ) -> StoreResult<()>;
    async fn find_token(&self, token_hash: &str) -> StoreResult<Option<TokenRecord>>;
    /// A token of a person or program with a role. False (nothing stored) when the name is
    /// taken.
    async fn insert_role_token(
        &self,
        name: &str,
        token_hash: &str,
        role: Role,
        expires_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> StoreResult<bool>;
    /// Tokens not scoped to a trial, by name.
    async fn list_tokens(&self) -> StoreResult<Vec<TokenRecord>>;
    /// Record that the token was just used.
    async fn touch_token(&self, name: &str, now: DateTime<Utc>) -> StoreResult<()>;
    async fn insert_audit(&self, entry: &AuditEntry) -> StoreResult<()>;
    /// Audit entries with id > `after_id`, oldest first, at most `limit`.
    async fn list_audit(&self, after_id: i64, limit: i64) -> StoreResult<Vec<AuditRecord>>;
    /// Record a webhook call before its first attempt; its id.
    async fn insert_delivery(&self, delivery: &NewDelivery) -> StoreResult<i64>;
    /// Record how a webhook call went so far.
    async fn update_delivery(&self, id: i64, progress: &DeliveryProgress) -> StoreResult<()>;
    /// A study's webhook calls with id > `after_id`, oldest first, at most `limit`.
    async fn list_deliveries(
        &self,
        study_id: StudyId,
        after_id: i64,
        limit: i64,
    ) -> StoreResult<Vec<DeliveryRecord>>;
    async fn delete_token(&self, name: &str) -> StoreResult<bool>;
    /// Insert, or replace the token of the same name (one statement: a trial's token is
    /// renewed on every attempt).
    async fn replace_token(
        &self,
        name: &str,
        token_hash: &str,
        scope: Option<TrialKey>,
        now: DateTime<Utc>,
    ) -> StoreResult<()>;

    /// Take or renew the right to dispatch a study's trials until `now + ttl`. False while
    /// another owner's lease is unexpired.
    async fn claim_runner(
        &self,
        study_id: StudyId,
        owner: &str,
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> StoreResult<bool>;
    async fn release_runner(&self, study_id: StudyId, owner: &str) -> StoreResult<()>;
    /// Take or renew `replica`'s lease until `now + ttl`; the replicas whose leases are
    /// unexpired (this one among them), by id.
    async fn renew_replica(
        &self,
        replica: &ReplicaRecord,
        now: DateTime<Utc>,
        ttl: chrono::Duration,
    ) -> StoreResult<Vec<ReplicaRecord>>;
    /// Register or renew a pool worker (`augur worker --pool`) at `now_ms`: the slot-seconds
    /// since its last report (at most `max_gap_ms` of them) are added, busy and idle by the
    /// busy count it reported then, to its totals and to its pool's minute.
    async fn report_pool_worker(
        &self,
        report: &PoolWorkerReport,
        now_ms: i64,
        max_gap_ms: i64,
    ) -> StoreResult<()>;
    /// The workers of `pool` (of every pool with `None`), by pool and id.
    async fn list_pool_workers(&self, pool: Option<&str>) -> StoreResult<Vec<PoolWorkerRecord>>;
    /// `pool`'s busy and idle slot-seconds per minute since `since_ms`, oldest first.
    async fn list_pool_usage(&self, pool: &str, since_ms: i64)
    -> StoreResult<Vec<PoolUsageRecord>>;
    /// A replica leaving: the others stop routing to it at once.
    async fn remove_replica(&self, id: &str) -> StoreResult<()>;
    /// The secret replicas forward with: `candidate` if none was stored yet, else the stored one.
    async fn replica_secret(&self, candidate: &str) -> StoreResult<String>;
    /// Tokens not scoped to a trial: with none, a loopback server is open.
    async fn count_tokens(&self) -> StoreResult<i64>;
}

/// A transaction that changes several studies and commits them together: what lets one
/// durable commit (a disk flush) serve the commands of many studies. Dropping it without
/// `commit` rolls back.
#[async_trait]
pub trait StudiesTx: Send {
    /// Lock the study for the rest of the transaction and work on it; give the transaction
    /// back with [`StudyTx::release`]. With `wait` false, a study another transaction holds
    /// is `Busy` at once (PostgreSQL's `SKIP LOCKED`): a transaction that already holds locks
    /// must never wait for one, or two replicas could deadlock.
    async fn lock_study(self: Box<Self>, study_id: StudyId, wait: bool) -> StoreResult<StudyLock>;
    /// Lock (without waiting) and read these studies ahead, in as few statements as the
    /// backend can, for the `lock_study` calls that follow. A hint: a backend where a
    /// statement is cheap ignores it.
    async fn prefetch(&mut self, _study_ids: &[StudyId]) -> StoreResult<()> {
        Ok(())
    }
    /// Send the writes still held (PostgreSQL holds every released study's until here, to
    /// send them as one statement). An error here means nothing was committed; one from
    /// `commit` leaves that unknown.
    async fn send_writes(&mut self) -> StoreResult<()> {
        Ok(())
    }
    async fn commit(self: Box<Self>) -> StoreResult<()>;
}

/// What [`StudiesTx::lock_study`] got.
pub enum StudyLock {
    Locked(Box<dyn StudyTx>),
    /// No such study: the transaction, unchanged.
    Missing(Box<dyn StudiesTx>),
    /// Another transaction holds the study (only without `wait`).
    Busy(Box<dyn StudiesTx>),
}

/// A transaction on one locked study. Dropping it without `commit` rolls back.
#[async_trait]
pub trait StudyTx: Send {
    /// The study row as locked at the start of the transaction.
    fn study(&self) -> &StudyRecord;
    /// Trials in requested/active/stopping.
    async fn unfinished_trials(&mut self) -> StoreResult<Vec<TrialRecord>>;
    /// Trials paused at a rung (multi-fidelity), by id.
    async fn paused_trials(&mut self) -> StoreResult<Vec<TrialRecord>>;
    async fn trials_by_id(&mut self, ids: &[TrialId]) -> StoreResult<Vec<TrialRecord>>;
    /// `(id, objective, completed_at)` of the completed trials that rank (an objective, not
    /// excluded), in the order they completed: study-level stopping's input.
    async fn completed_objectives(&mut self) -> StoreResult<Vec<(TrialId, f64, DateTime<Utc>)>>;
    async fn count_failed(&mut self) -> StoreResult<u64>;
    /// The study's runner lease as this transaction sees it: `(owner, expires_at)`.
    async fn runner_lease(&mut self) -> StoreResult<Option<(String, DateTime<Utc>)>>;
    async fn measurements(&mut self, trial_id: TrialId) -> StoreResult<Vec<Measurement>>;
    async fn insert_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()>;
    /// Writes every mutable column of each trial.
    async fn update_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()>;
    /// Inserts, or replaces the measurement at the same (trial, step).
    async fn upsert_measurements(
        &mut self,
        rows: &[(TrialId, Measurement)],
        now: DateTime<Utc>,
    ) -> StoreResult<()>;
    /// Writes state, state_reason, spec, next_trial_id, change_seq, updated_at and
    /// trial_counts.
    async fn update_study(&mut self, study: &StudyRecord) -> StoreResult<()>;
    /// Delete the tokens scoped to these trials (they finished).
    async fn revoke_trial_tokens(&mut self, trial_ids: &[TrialId]) -> StoreResult<()>;
    /// Store (replace) trial-scoped tokens, each named after its trial; the trials must be
    /// written already (`insert_trials`/`update_trials` of this transaction).
    async fn replace_trial_tokens(
        &mut self,
        tokens: &[TrialToken],
        now: DateTime<Utc>,
    ) -> StoreResult<()>;
    /// Send the writes held so far and give the transaction back, the study still locked,
    /// for the next study of the batch.
    async fn release(self: Box<Self>) -> StoreResult<Box<dyn StudiesTx>>;
    async fn commit(self: Box<Self>) -> StoreResult<()>;
}
